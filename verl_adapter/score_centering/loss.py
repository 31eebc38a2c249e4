"""Score centering in verl's actor (docs/reference/score-centering.md §5.1, §5.4-§5.7): the worker loss and
the registered policy loss ``score_centering``.

The trainer installs :func:`score_centering_ppo_loss` as the actor's loss function (``set_loss_fn``) and
marks each update's micro-batches with verl's top-k logits hook (``distillation_use_topk``,
``distillation_only``). verl's FSDP engine then calls the function twice per micro-batch:

1. as the logits processor, on the temperature-scaled logits of the packed micro-batch (after the Ulysses
   slice): the trainer's logprobs of the sampled token and at the sampler's K ids in one op
   (``logprobs_at_ids``: a chunked log-softmax, no probability tensor kept), the correction C and the §5.6 values
   per token from one head computation (the plan's ``outputs``). Every output is per token, so verl
   gathers it over sequence-parallel ranks and unpacks it exactly as it does ``log_probs``; the sampled
   token's logprob *is* ``log_probs``. The sampler fields are token-aligned (row j holds the head of token j,
   zero outside the generated tokens) and rolled by one like verl's labels;
2. as the loss: verl's own ``ppo_loss`` with ``policy_loss.loss_mode=score_centering``, whose registered
   function runs the configured base loss (vanilla, sapo, cispo, ...) with verl's ``rollout_is_weights``, or
   the plugin's own weights under ``is``/``adaptive-ppo-clip``, and adds ``A * C`` aggregated like the base
   (its ``loss_agg_mode``, verl's global token and sequence counts). The §5.6 metrics and the
   adaptive-ppo-clip counts are global means (``AggregationType.SUM`` over micro-batches of
   ``sum / batch_num_tokens * dp_size``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from verl.trainer.ppo import core_algos
from verl.utils import tensordict_utils as tu
from verl.utils.metric import AggregationType, Metric
from verl.utils.ulysses import get_ulysses_sequence_parallel_world_size, slice_input_tensor
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import no_padding_2_padding

from trl_length_plugin.score_centering import METRIC_KEYS, logprobs_at_ids
from verl_adapter.score_centering.config import LOSS_MODE, MANAGER_CLASS, ScoreCenteringSettings

#: the token-aligned rollout fields (``[prompt + response, K]`` per row)
SAMPLER_IDS, SAMPLER_LOGPROBS = "sampler_topk_ids", "sampler_topk_logprobs"
#: the hook's per-token outputs besides ``log_probs``
CORRECTION = "score_centering/correction"
#: what the trainer puts on each update's micro-batches
ADAPTIVE_K = "score_centering_adaptive_k"
HOOK_FLAGS = {"distillation_use_topk": True, "distillation_only": True}
#: the adaptive-ppo-clip counts, global means the trainer turns into f (their ratio)
CLIPPED, POSITIVE = "score_centering/_adaptive_clipped", "score_centering/_adaptive_positive"


@dataclass
class _MicroBatch:
    """What the registered policy loss needs beyond ``ppo_loss``'s arguments, padded like them."""

    settings: ScoreCenteringSettings
    correction: torch.Tensor
    rollout_log_probs: torch.Tensor
    adaptive_k: float


_CURRENT: ContextVar[_MicroBatch | None] = ContextVar("score_centering_micro_batch", default=None)


@contextmanager
def _micro_batch(inputs: _MicroBatch) -> Iterator[None]:
    token = _CURRENT.set(inputs)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def _packed_response(data, name: str) -> torch.Tensor:
    """A response-level field ``[R_i]`` at its tokens' places in the packed stream ``[sum S_i]`` (0 elsewhere)."""
    values = data[name].values()
    response_lens = data["responses"].offsets().diff()
    starts = data["input_ids"].offsets()[:-1] + data["prompts"].offsets().diff()
    first = torch.repeat_interleave(starts - (response_lens.cumsum(0) - response_lens), response_lens)
    packed = values.new_zeros(data["input_ids"].values().shape[0])
    packed[first + torch.arange(values.shape[0], device=values.device)] = values
    return packed


def _local(packed: torch.Tensor) -> torch.Tensor:
    """Row j -> row j + 1 over the packed stream (verl's label roll), then this rank's Ulysses slice."""
    rolled = torch.roll(packed, shifts=-1, dims=0)
    if get_ulysses_sequence_parallel_world_size() == 1:
        return rolled
    return slice_input_tensor(rolled.unsqueeze(0), dim=1).squeeze(0)


def _adaptive_k(data, settings: ScoreCenteringSettings) -> float:
    """The controller's k the trainer put on the micro-batch (adaptive-ppo-clip; 0 otherwise)."""
    if not settings.uses_controller:
        return 0.0
    k = tu.get_non_tensor_data(data, ADAPTIVE_K, None)
    if k is None:
        raise RuntimeError(
            f"score centering adaptive-ppo-clip: the micro-batch lacks {ADAPTIVE_K}; the update must come from "
            "the score-centering trainer (verl_adapter.score_centering.trainer)"
        )
    return float(k)


def head_outputs(logits: torch.Tensor, data, settings: ScoreCenteringSettings) -> dict[str, torch.Tensor]:
    """The logits processor: ``log_probs``, C and the §5.6 values, each ``(1, tokens on this rank)``."""
    logits = logits.squeeze(0)
    missing = [name for name in (SAMPLER_IDS, SAMPLER_LOGPROBS) if name not in data]
    if missing:
        raise RuntimeError(
            f"score centering: the micro-batch lacks {missing[0]}; the rollout must come from {MANAGER_CLASS}"
        )
    labels = _local(data["input_ids"].values())
    ids = _local(data[SAMPLER_IDS].values()).long()
    sampler = _local(data[SAMPLER_LOGPROBS].values())
    mask = _local(_packed_response(data, "response_mask")).bool()
    if not labels.shape[0] == ids.shape[0] == logits.shape[0]:
        raise RuntimeError(
            f"score centering: {ids.shape[0]} sampler rows and {labels.shape[0]} labels for {logits.shape[0]} "
            "logit rows on this rank (verl's packing or sequence-parallel slicing changed)"
        )
    # verl's rule for its own log-softmax: the gradient goes into the logits unless entropy (or sum pi^2)
    # reads them in the backward too
    shared = any(
        tu.get_non_tensor_data(data, key, False) for key in ("calculate_entropy", "calculate_sum_pi_squared")
    )
    logprobs = logprobs_at_ids(logits, torch.cat([labels.unsqueeze(1), ids], 1), inplace_backward=not shared)
    adaptive = settings.uses_controller
    centering = settings.outputs(
        _adaptive_k(data, settings),
        logprobs[:, 1:],
        sampler_topk_logprobs=sampler,
        token_mask=mask,
        advantages=_local(_packed_response(data, "advantages")) if adaptive else None,
    )
    outputs = {"log_probs": logprobs[:, 0], CORRECTION: centering.correction, **centering.token_metrics}
    return {key: value.unsqueeze(0) for key, value in outputs.items()}


def _share(total: torch.Tensor, data) -> Metric:
    """A micro-batch's share of a global mean over the update's tokens (verl sums the shares, then
    averages over data-parallel ranks)."""
    return Metric(AggregationType.SUM, total.item() / max(data["batch_num_tokens"], 1) * data["dp_size"])


def score_centering_ppo_loss(
    config,
    settings: ScoreCenteringSettings,
    model_output=None,
    data=None,
    dp_group=None,
    student_logits=None,
):
    """The actor's loss function: the logits processor when verl passes ``student_logits``, else
    ``ppo_loss`` with ``loss_mode=score_centering`` plus the §5.6 metrics (and adaptive-ppo-clip counts)."""
    if student_logits is not None:
        return head_outputs(student_logits, data, settings)
    if CORRECTION not in model_output:
        raise RuntimeError(
            "score centering: the actor's forward did not run the top-k hook (the micro-batch lacks "
            "distillation_use_topk); the update must come from the score-centering trainer"
        )
    mask = data["response_mask"].to_padded_tensor(0).bool()
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    rollout = data["rollout_log_probs"].to_padded_tensor(0.0)
    k = _adaptive_k(data, settings)
    inputs = _MicroBatch(settings, no_padding_2_padding(model_output[CORRECTION], data), rollout, k)
    with _micro_batch(inputs):
        loss, metrics = ppo_loss(config, model_output, data, dp_group)
    for key in METRIC_KEYS:
        metrics[key] = _share(
            torch.where(mask, no_padding_2_padding(model_output[key], data), 0.0).sum(), data
        )
    if settings.uses_controller:
        advantages = data["advantages"].to_padded_tensor(0.0)
        clipped, positive = settings.clip_counts(k, log_prob, rollout, advantages, mask)
        metrics[CLIPPED], metrics[POSITIVE] = _share(clipped, data), _share(positive, data)
    return loss, metrics


@core_algos.register_policy_loss(LOSS_MODE)
def compute_policy_loss_score_centering(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights=None,
):
    """The configured base policy loss plus ``A * C``, aggregated as the base aggregates (reference §5.5)."""
    inputs = _CURRENT.get()
    if inputs is None:
        raise RuntimeError(
            f"policy_loss.loss_mode={LOSS_MODE} runs only inside verl_adapter's score-centering actor loss "
            "(set +score_centering=true; keep your own policy_loss.loss_mode)"
        )
    settings = inputs.settings
    if settings.writes_weights:
        if rollout_is_weights is not None:
            raise RuntimeError(
                f"score centering {settings.mode}: verl also computed rollout_is_weights; "
                "set algorithm.rollout_correction.rollout_is=null"
            )
        rollout_is_weights = settings.sampled_token_weights(  # the ratio old / sampler, verl's convention
            inputs.adaptive_k, old_log_prob, inputs.rollout_log_probs, response_mask, advantages
        )
    base = core_algos.get_policy_loss_fn(settings.base_loss_mode)
    loss, metrics = base(
        old_log_prob=log_prob.detach() if settings.force_on_policy else old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=rollout_is_weights,
    )
    centering = core_algos.agg_loss(
        loss_mat=advantages * inputs.correction,
        loss_mask=response_mask,
        loss_agg_mode=settings.aggregation(loss_agg_mode),
        **config.global_batch_info,
    )
    return loss + centering, metrics
