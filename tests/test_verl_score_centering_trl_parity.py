"""TRL parity (docs/reference/score-centering.md §5.5, §5.8): the same rollout tensors give the same per-token
correction C and the same ``A * C`` loss term, values and gradients, through the TRL path and through verl's
policy loss, for each mode and each of verl's three aggregations with its TRL counterpart.

- The equivalent keys resolve to the same mode, bounds and outer bound in both hosts (``resolve_plan`` of a
  TRL config, ``resolve_settings`` of verl's Hydra config).
- verl: the logits processor verl's engine calls (``head_outputs``) on the packed micro-batch, and the worker
  loss through verl's real ``ppo_loss`` with ``loss_mode=score_centering``, minus the same loss with C zeroed:
  the difference is verl's ``A * C`` term.
- TRL: ``ScoreCenteringMixin._centering_loss``, the term TRL's ``_compute_loss`` adds, on the same rows in TRL's
  layout (completion-aligned ``[B, T, K]`` heads padded with -inf, completion and tool masks, advantages
  ``[B]``), its trainer logprobs at the ids being the full log-softmax gather of the same float64 logits.
  A TRL step needs a colocated vLLM engine and a whole trainer (tests/test_trl_score_centering.py runs them,
  slow), so here the mixin runs on a small host object that holds only the trainer state ``_centering_loss``
  reads: loss type, one accumulation step, one process, an accelerator whose gather and reduce are the
  identity (the one stand-in of this file).
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("trl")

from tests.trl_length_helpers import sc_config  # noqa: E402
from tests.verl_score_centering_helpers import (  # noqa: E402
    MODES,
    make_rollouts,
    micro_batch,
    settings_and_actor,
)
from trl_length_plugin.score_centering import (  # noqa: E402
    AdaptiveClipController,
    ScoreCenteringConfig,
    ScoreCenteringRun,
)
from trl_length_plugin.trl_integration.score_centering import ScoreCenteringMixin, _CenteringStep  # noqa: E402
from trl_length_plugin.trl_integration.score_centering_plan import resolve_plan  # noqa: E402
from verl_adapter.score_centering.loss import CORRECTION, score_centering_ppo_loss  # noqa: E402

V, K = 23, 4
PROMPT_LENS, RESPONSE_LENS = [3, 2, 4, 2], [5, 1, 3, 4]
ADAPTIVE_K = 0.05
#: verl's loss_agg_mode -> the TRL loss_type that aggregates the same way (one micro-batch, one process)
AGGREGATIONS = {"token-mean": "bnpo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum": "luspo"}
#: verl's MODES as TRL keys (the same thresholds: tis [0, 1.5], icepop [0.8, 1.25], adaptive eps 0.2)
TRL_MODES = {
    "off": dict(vllm_importance_sampling_correction=False),
    "is": dict(vllm_importance_sampling_mode="token_truncate", score_centering_importance_sampling="is"),
    "tis": dict(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=1.5),
    "icepop": dict(
        vllm_importance_sampling_mode="token_mask",
        vllm_importance_sampling_clip_min=0.8,
        vllm_importance_sampling_clip_max=1.25,
    ),
    "adaptive-ppo-clip": dict(
        vllm_importance_sampling_mode="token_truncate",
        score_centering_importance_sampling="adaptive-ppo-clip",
        force_on_policy_ratio=True,
    ),
}


class TRLHost(ScoreCenteringMixin):
    """The trainer state ``_centering_loss`` reads, for one micro-batch on one process."""

    def __init__(self, plan, loss_type, topk, logps):
        self.loss_type = loss_type
        self._centering = _CenteringStep(topk=topk, logps=logps)
        self.top_entropy_quantile, self.off_policy_mask_threshold = 1.0, None
        self.model = SimpleNamespace(training=True)
        self.current_gradient_accumulation_steps, self.max_completion_length = 1, max(RESPONSE_LENS)
        self.args = SimpleNamespace(steps_per_generation=1)
        self.accelerator = SimpleNamespace(
            num_processes=1, gather=lambda x: x, reduce=lambda x, reduction: x, sync_gradients=False
        )
        self._metrics = {"train": defaultdict(list)}
        controller = None
        if plan.mode == "adaptive-ppo-clip":
            controller = AdaptiveClipController(ADAPTIVE_K, target=0.1, delta=0.01, k_min=0.0, k_max=1.0)
        self._score_run = ScoreCenteringRun(ScoreCenteringConfig(), plan, controller)


def trl_inputs(rollouts):
    """TRL's layout of the rows: completion-aligned, padded to the longest completion."""
    width, b = max(RESPONSE_LENS), len(rollouts)
    ids = torch.zeros(b, width, K, dtype=torch.int64)
    logprobs = torch.full((b, width, K), -torch.inf)
    completion_mask = torch.zeros(b, width, dtype=torch.int64)
    tool_mask = torch.ones(b, width, dtype=torch.int64)
    sampling = torch.zeros(b, width, dtype=torch.float64)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS, strict=True)):
        ids[i, :r] = rollouts.sampler_ids[i][p:].long()
        logprobs[i, :r] = rollouts.sampler_logprobs[i][p:]
        completion_mask[i, :r] = 1
        tool_mask[i, :r] = rollouts.response_mask[i]
        sampling[i, :r] = rollouts.rollout_log_probs[i]
    advantages = torch.stack([a[0] for a in rollouts.advantages])
    return {
        "sampler_topk_ids": ids,
        "sampler_topk_logprobs": logprobs,
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": advantages,
        "sampling_per_token_logps": sampling,
        "num_items_in_batch": (completion_mask * tool_mask).sum(),
    }


def trainer_logprobs(logits, rollouts, inputs):
    """TRL's trainer logprobs at the heads' ids and of the sampled tokens, from full log-softmaxes."""
    starts = [0, *torch.tensor(rollouts.lengths).cumsum(0).tolist()]
    topk = torch.zeros(inputs["sampler_topk_ids"].shape, dtype=logits.dtype)
    sampled = torch.zeros(inputs["completion_mask"].shape, dtype=logits.dtype)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS, strict=True)):
        logprobs = logits[starts[i] + p - 1 : starts[i] + p + r - 1].log_softmax(-1)
        topk[i, :r] = logprobs.gather(1, inputs["sampler_topk_ids"][i, :r])
        sampled[i, :r] = logprobs.gather(1, rollouts.responses[i].unsqueeze(1)).squeeze(1)
    return topk, sampled


def verl_loss(actor, settings, rollouts, logits, adaptive_k):
    """verl's ``A * C`` term: its worker loss minus the same loss with C zeroed (the same base loss, with the
    mode's weights and ratio), and the hook's per-token C, padded ``[B, R]``."""
    from verl.workers.utils.padding import no_padding_2_padding

    from tests.test_verl_score_centering_loss import engine_output, verl_weights

    weights = verl_weights(rollouts, MODES[settings.mode])
    data = micro_batch(
        rollouts, list(range(len(rollouts))), rollout_is_weights=weights, adaptive_k=adaptive_k
    )
    output = engine_output(data, logits, settings)
    loss, _ = score_centering_ppo_loss(actor, settings, model_output=output, data=data)
    zeroed = {**output, CORRECTION: output[CORRECTION] * 0.0}
    base, _ = score_centering_ppo_loss(actor, settings, model_output=zeroed, data=data)
    return loss - base, no_padding_2_padding(output[CORRECTION], data)


@pytest.mark.parametrize("agg", list(AGGREGATIONS))
@pytest.mark.parametrize("mode", list(MODES))
def test_trl_and_verl_give_the_same_correction_and_centering_term(tmp_path, mode, agg):
    settings, actor, _ = settings_and_actor([*MODES[mode], f"actor_rollout_ref.actor.loss_agg_mode={agg}"])
    plan = resolve_plan(sc_config(tmp_path, score_centering_top_k=K, **TRL_MODES[mode]))
    assert (plan.mode, plan.bounds, plan.outer_bound) == (
        settings.mode,
        settings.bounds,
        settings.outer_bound,
    )

    rollouts = make_rollouts(PROMPT_LENS, RESPONSE_LENS, V, K, seed=1)
    logits = torch.randn(
        sum(rollouts.lengths), V, dtype=torch.float64, generator=torch.Generator().manual_seed(2)
    )
    adaptive_k = ADAPTIVE_K if mode == "adaptive-ppo-clip" else None

    verl_leaf = logits.clone().requires_grad_(True)
    verl_term, verl_correction = verl_loss(actor, settings, rollouts, verl_leaf, adaptive_k)
    verl_term.backward()

    inputs = trl_inputs(rollouts)
    trl_leaf = logits.clone().requires_grad_(True)
    topk, sampled = trainer_logprobs(trl_leaf, rollouts, inputs)
    seen = []
    compute = ScoreCenteringRun.outputs
    with pytest.MonkeyPatch.context() as patch:  # records the term TRL computes (a pass-through)
        patch.setattr(
            ScoreCenteringRun,
            "outputs",
            lambda *a, **kw: seen.append(compute(*a, **kw)) or seen[-1],
        )
        trl_term = TRLHost(plan, AGGREGATIONS[agg], topk, sampled.detach())._centering_loss(inputs)
    trl_term.backward()

    mask = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
    (term,) = seen
    torch.testing.assert_close(term.correction[mask], verl_correction[mask], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(trl_term, verl_term, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(trl_leaf.grad, verl_leaf.grad, rtol=1e-10, atol=1e-14)
    assert trl_term.abs() > 0 or mode == "is"
