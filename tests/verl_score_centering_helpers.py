"""Shared pieces of the verl score-centering tests.

- Rollout rows as verl 0.9.1's V1 trainer hands them to the actor: TransferQueue fields as nested jagged
  tensors (``input_ids`` and the token-aligned ``sampler_topk_*`` over prompt + response, the response
  fields over the response), with the engine's global numbers (``dp_size``, ``batch_num_tokens``,
  ``global_batch_size``) and the trainer's flags as non-tensor data.
- The actor config the workers build, from verl's own Hydra config.
- An independent reference: each row's response positions taken from the logits row that predicts them
  (no packing, no roll), as padded ``[B, R, ...]`` tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tensordict import TensorDict
from verl.trainer.ppo import core_algos
from verl.utils import tensordict_utils as tu

from tests.verl_length_helpers import compose_verl
from trl_length_plugin.score_centering.estimator import compute_score_centering_term
from verl_adapter.score_centering.config import resolve_settings
from verl_adapter.score_centering.loss import HOOK_FLAGS
from verl_adapter.score_centering.trainer import worker_actor_config

#: a config that passes the TaskRunner checks (the vocabulary check skips a model path it cannot read)
BASE_OVERRIDES = [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.model.path=/nonexistent/model",
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.n=2",
    "+score_centering=true",
    "+score_centering_top_k=4",
]
#: the importance-sampling modes, each with what selects it in verl's config
MODES = {
    "off": [],
    "is": ["+score_centering_importance_sampling=is"],
    "tis": [
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=1.5",
    ],
    "icepop": [
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold='0.8_1.25'",
    ],
    "adaptive-ppo-clip": [
        "+score_centering_importance_sampling=adaptive-ppo-clip",
        "+force_on_policy_ratio=true",
    ],
}


def with_overrides(overrides: list[str], base: list[str] = BASE_OVERRIDES) -> list[str]:
    """``base`` with ``overrides`` appended; an override of a key ``base`` sets replaces that entry."""
    keys = {override.split("=", 1)[0].lstrip("+~") for override in overrides}
    return [o for o in base if o.split("=", 1)[0].lstrip("+") not in keys] + overrides


def composed(overrides: list[str]):
    return compose_verl(with_overrides(overrides))


def settings_and_actor(overrides: list[str]):
    """The resolved settings and the workers' actor config (``loss_mode=score_centering``)."""
    config = composed(overrides)
    return resolve_settings(config), worker_actor_config(config), config


def nested(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


@dataclass
class Rollouts:
    """Rows of one batch: prompt and response tokens, masks and the per-token fields verl stores."""

    prompts: list[torch.Tensor]
    responses: list[torch.Tensor]
    response_mask: list[torch.Tensor]
    advantages: list[torch.Tensor]
    old_log_probs: list[torch.Tensor]
    rollout_log_probs: list[torch.Tensor]
    sampler_ids: list[torch.Tensor]  # token-aligned [P + R, K], zero outside the generated tokens
    sampler_logprobs: list[torch.Tensor]

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def lengths(self) -> list[int]:
        return [len(p) + len(r) for p, r in zip(self.prompts, self.responses, strict=True)]


def make_rollouts(
    prompt_lens, response_lens, vocab: int, top_k: int, seed: int = 0, dtype=torch.float64
) -> Rollouts:
    """Random rows: one tool token (mask 0) in each response of three or more tokens, sampler heads with a
    mass in (0.5, 1), advantages of both signs, old and rollout logprobs near each other."""
    g = torch.Generator().manual_seed(seed)
    out = Rollouts([], [], [], [], [], [], [], [])
    for p, r in zip(prompt_lens, response_lens, strict=True):
        out.prompts.append(torch.randint(0, vocab, (p,), generator=g))
        out.responses.append(torch.randint(0, vocab, (r,), generator=g))
        mask = torch.ones(r, dtype=torch.int64)
        if r >= 3:
            mask[1] = 0
        out.response_mask.append(mask)
        out.advantages.append(torch.randn(1, generator=g, dtype=dtype).expand(r) * mask)
        old = -torch.rand(r, generator=g, dtype=dtype) * 3
        out.old_log_probs.append(old)
        out.rollout_log_probs.append((old + 0.3 * torch.randn(r, generator=g, dtype=dtype)) * mask)
        ids = torch.zeros(p + r, top_k, dtype=torch.int32)
        logprobs = torch.zeros(p + r, top_k, dtype=torch.float32)
        for t in range(r):
            if mask[t]:
                ids[p + t] = torch.randperm(vocab, generator=g)[:top_k].to(torch.int32)
                mass = 0.5 + 0.5 * torch.rand(1, generator=g)
                share = torch.rand(top_k, generator=g) + 0.05
                logprobs[p + t] = (share / share.sum() * mass).log()
        out.sampler_ids.append(ids)
        out.sampler_logprobs.append(logprobs)
    return out


def micro_batch(
    rollouts: Rollouts,
    rows: list[int],
    *,
    dp_size: int = 1,
    batch_num_tokens: int | None = None,
    global_batch_size: int | None = None,
    rollout_is_weights: list[torch.Tensor] | None = None,
    adaptive_k: float | None = None,
) -> TensorDict:
    """The rows as one actor micro-batch (nested jagged fields, non-tensor globals and trainer flags)."""
    pick = lambda values: [values[i] for i in rows]  # noqa: E731
    full = [torch.cat([rollouts.prompts[i], rollouts.responses[i]]) for i in rows]
    fields = {
        "input_ids": nested(full),
        "position_ids": nested([torch.arange(len(x)) for x in full]),
        "prompts": nested(pick(rollouts.prompts)),
        "responses": nested(pick(rollouts.responses)),
        "response_mask": nested(pick(rollouts.response_mask)),
        "loss_mask": nested(pick(rollouts.response_mask)),
        "advantages": nested(pick(rollouts.advantages)),
        "old_log_probs": nested(pick(rollouts.old_log_probs)),
        "rollout_log_probs": nested(pick(rollouts.rollout_log_probs)),
        "sampler_topk_ids": nested(pick(rollouts.sampler_ids)),
        "sampler_topk_logprobs": nested(pick(rollouts.sampler_logprobs)),
    }
    if rollout_is_weights is not None:
        fields["rollout_is_weights"] = nested(pick(rollout_is_weights))
    data = TensorDict(fields, batch_size=[len(rows)])
    total_tokens = int(sum(rollouts.response_mask[i].sum() for i in range(len(rollouts))))
    tu.assign_non_tensor(
        data,
        dp_size=dp_size,
        batch_num_tokens=total_tokens if batch_num_tokens is None else batch_num_tokens,
        global_batch_size=len(rollouts) if global_batch_size is None else global_batch_size,
        **HOOK_FLAGS,
    )
    if adaptive_k is not None:
        tu.assign_non_tensor(data, score_centering_adaptive_k=adaptive_k)
    return data


def packed_logits(rollouts: Rollouts, rows: list[int], logits: torch.Tensor) -> torch.Tensor:
    """The rows' slice of a ``[sum S, V]`` logits table laid out over all rows in order."""
    starts = [0, *torch.tensor(rollouts.lengths).cumsum(0).tolist()]
    return torch.cat([logits[starts[i] : starts[i + 1]] for i in rows])


def reference_layout(rollouts: Rollouts, logits: torch.Tensor):
    """Padded ``[B, R]`` sampled logprobs and ``[B, R, K]`` head logprobs from full log-softmaxes, with the
    padded sampler heads, masks and fields (row i, response position t: logits row start_i + P_i + t - 1)."""
    starts = [0, *torch.tensor(rollouts.lengths).cumsum(0).tolist()]
    width, k = max(len(r) for r in rollouts.responses), rollouts.sampler_ids[0].shape[1]
    b = len(rollouts)
    sampled = torch.zeros(b, width, dtype=logits.dtype)
    head = torch.zeros(b, width, k, dtype=logits.dtype)
    sampler = torch.full((b, width, k), -math.inf)
    mask = torch.zeros(b, width, dtype=torch.bool)
    for i in range(b):
        p, r = len(rollouts.prompts[i]), len(rollouts.responses[i])
        logprobs = logits[starts[i] + p - 1 : starts[i] + p + r - 1].log_softmax(-1)
        sampled[i, :r] = logprobs.gather(1, rollouts.responses[i].unsqueeze(1)).squeeze(1)
        head[i, :r] = logprobs.gather(1, rollouts.sampler_ids[i][p:].long())
        sampler[i, :r] = rollouts.sampler_logprobs[i][p:]
        mask[i, :r] = rollouts.response_mask[i].bool()

    def pad(values):
        return torch.nn.utils.rnn.pad_sequence(values, batch_first=True)

    return {
        "sampled": sampled,
        "head": head,
        "sampler": sampler,
        "mask": mask,
        "advantages": pad(rollouts.advantages),
        "old": pad(rollouts.old_log_probs),
        "rollout": pad(rollouts.rollout_log_probs),
    }


def reference_loss(settings, actor, rollouts, logits, weights=None, k=0.0):
    """Base loss (verl's own function on padded tensors, with the mode's sampled-token weights) plus the
    core's C aggregated by hand: token-mean sum / tokens, seq-mean-token-sum sum / sequences,
    seq-mean-token-mean the mean over sequences of each sequence's token mean. ``logits [sum S, V]`` over
    the rows in order (row j predicts token j + 1 of its sequence); returns (loss, C, the padded layout)."""
    ref = reference_layout(rollouts, logits)
    mask, advantages = ref["mask"], ref["advantages"]
    bounds = settings.bounds
    if settings.mode == "adaptive-ppo-clip":
        bounds = (bounds[0], bounds[1] + k)
    ratio = torch.where(mask, ref["old"] - ref["rollout"], 0.0).exp()
    if settings.mode == "is":
        token_weights = ratio * mask
    elif settings.mode == "adaptive-ppo-clip":
        lo, hi = bounds
        kept = (ratio <= settings.outer_bound) & torch.where(advantages < 0, ratio >= lo, ratio <= hi)
        token_weights = torch.where(kept & mask, ratio, 0.0)
    else:
        token_weights = (
            None if weights is None else torch.nn.utils.rnn.pad_sequence(weights, batch_first=True)
        )
    actor.global_batch_info.update(
        dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=len(rollouts), loss_scale_factor=None
    )
    old = ref["sampled"].detach() if settings.force_on_policy else ref["old"]
    base, _ = core_algos.get_policy_loss_fn(settings.base_loss_mode)(
        old_log_prob=old,
        log_prob=ref["sampled"],
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode=actor.loss_agg_mode,
        config=actor,
        rollout_is_weights=token_weights,
    )
    term = compute_score_centering_term(
        ref["head"],
        sampler_topk_logprobs=ref["sampler"],
        importance_sampling_mode=settings.mode,
        is_bounds=bounds,
        token_mask=mask,
        sampler_replay=False,
        adaptive_ppo_clip_advantages=advantages if settings.mode == "adaptive-ppo-clip" else None,
        adaptive_ppo_clip_outer_bound=settings.outer_bound,
    )
    per_token = advantages * term.correction * mask
    aggregation = settings.aggregation(actor.loss_agg_mode)
    if aggregation == "token-mean":
        centering = per_token.sum() / mask.sum()
    elif aggregation == "seq-mean-token-sum":
        centering = per_token.sum() / len(rollouts)
    else:
        centering = (per_token.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    return base + centering, term, ref
