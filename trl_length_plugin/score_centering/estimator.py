"""Score centering: the per-token correction C of ``score-centering.md`` (docs/reference/score-centering.md §5.1).

At each generated position the sampler's top-k head H (ids and logprobs q, captured from vLLM) and the
trainer's logprobs p at the same ids give

    rho = (1 - sum_H q) / max(1 - sum_H p, 1e-6)
    C   = sum_H stop_gradient(m(v) - alpha * p(v)) * log p(v)

and the loss adds ``A * C``. The head mass m and tail coefficient alpha depend on the importance-sampling
mode (the table of the document); only log p carries gradients; the head is never renormalized to one.

Conventions the document leaves open (docs/reference/score-centering.md §5.1 keeps its formulas; these fill the gaps):

* Head slots whose sampler logprob is not finite (``-inf``: filtered out by top-k/top-p under sampler
  replay) carry no coefficient and count in neither head sum.
* Masked positions (``token_mask`` false) are neutralized before exponentiation: their slots are treated
  as empty, so their C, head masses and gradients are exactly zero whatever the inputs hold there.
* A sampler head mass above 1 (the capture checks allow up to 1.0001, float rounding) leaves no sampler
  tail: the numerator of rho is clamped at 0.
* Under sampler replay p is the trainer's distribution renormalized over the sampler's kept set, the head
  holds all of it, and rho = 0: the coefficients are the table's with rho = 0 (no tail).
* Bounds are inclusive: a ratio r is "in bounds" when lo <= r <= hi.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch

ImportanceSamplingMode = Literal["off", "is", "tis", "icepop", "adaptive-ppo-clip"]
IMPORTANCE_SAMPLING_MODES: tuple[str, ...] = ("off", "is", "tis", "icepop", "adaptive-ppo-clip")
BOUNDED_MODES: tuple[str, ...] = ("tis", "icepop", "adaptive-ppo-clip")
RHO_DENOMINATOR_FLOOR = 1e-6
#: the keys of :func:`score_centering_token_metrics` and :func:`score_centering_metrics` (§5.6)
METRIC_KEYS: tuple[str, ...] = (
    "score_centering/head_mass",
    "score_centering/train_head_mass",
    "score_centering/rho_mean",
    "score_centering/correction_abs_mean",
)


class ScoreCenteringTerm(NamedTuple):
    """Per-token outputs of :func:`compute_score_centering_term` (both shaped like ``token_mask``)."""

    correction: torch.Tensor
    """C, differentiable through the policy logprobs only; zero at masked positions."""
    sampler_head_mass: torch.Tensor
    """sum_H q, detached; zero at masked positions."""


class _Head(NamedTuple):
    """The head of every position, with masked positions and non-finite sampler slots neutralized."""

    log_p: torch.Tensor  # [..., K] policy logprobs (differentiable), 0 on empty slots
    p: torch.Tensor  # [..., K] detached policy probabilities, 0 on empty slots
    q: torch.Tensor  # [..., K] sampler probabilities, 0 on empty slots
    slots: torch.Tensor  # [..., K] bool, the slots that belong to the head
    rho: torch.Tensor  # [...] tail scale, 0 under replay


def _head(
    policy_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    sampler_replay: bool,
) -> _Head:
    if policy_logprobs.shape != sampler_logprobs.shape:
        raise ValueError(
            f"policy logprobs {tuple(policy_logprobs.shape)} and sampler logprobs "
            f"{tuple(sampler_logprobs.shape)} must have the same [..., K] shape"
        )
    if tuple(token_mask.shape) != tuple(policy_logprobs.shape[:-1]):
        raise ValueError(
            f"token_mask {tuple(token_mask.shape)} must match the leading dims {tuple(policy_logprobs.shape[:-1])}"
        )
    dtype = torch.promote_types(policy_logprobs.dtype, torch.float32)
    slots = token_mask.bool().unsqueeze(-1) & torch.isfinite(sampler_logprobs)
    # Neutralize before exponentiation: empty slots hold exp(-inf) = 0 and log p = 0, so no NaN/inf reaches
    # either the value or the gradient (torch.where sends a zero gradient to the unselected branch).
    log_p = torch.where(slots, policy_logprobs.to(dtype), 0.0)
    p = torch.where(slots, log_p.detach(), -math.inf).exp()
    q = torch.where(slots, sampler_logprobs.to(device=log_p.device, dtype=dtype), -math.inf).exp()
    if sampler_replay:
        rho = torch.zeros_like(p[..., 0])
    else:
        tail_q = (1.0 - q.sum(-1)).clamp(min=0.0)
        rho = tail_q / (1.0 - p.sum(-1)).clamp(min=RHO_DENOMINATOR_FLOOR)
    return _Head(log_p=log_p, p=p, q=q, slots=slots, rho=rho)


def _clamp(x: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    return torch.minimum(torch.maximum(x, low), high)


def _in_bounds(ratio: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    return (ratio >= lo) & (ratio <= hi)


def _adaptive_kept(
    ratio: torch.Tensor, advantages: torch.Tensor, lo: float, hi_plus_k: float, outer: float
) -> torch.Tensor:
    """adaptive-ppo-clip's filter: r <= o, and r >= lo for A < 0, r <= hi + k for A > 0 (A = 0: r <= o only)."""
    by_sign = torch.where(advantages < 0, ratio >= lo, torch.where(advantages > 0, ratio <= hi_plus_k, True))
    return (ratio <= outer) & by_sign


def _coefficients(
    head: _Head,
    mode: str,
    is_bounds: tuple[float, float] | None,
    advantages: torch.Tensor | None,
    outer_bound: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Head mass m [..., K] and tail coefficient alpha [...] of the document's table."""
    p, q, rho = head.p, head.q, head.rho
    if mode == "off":
        return q, rho
    if mode == "is":
        return p, torch.ones_like(rho)
    lo, hi = is_bounds
    if mode == "tis":
        return _clamp(p, lo * q, hi * q), _clamp(torch.ones_like(rho), lo * rho, hi * rho)
    # icepop and adaptive-ppo-clip filter the head ratio p/q and the tail ratio 1/rho (inf when rho = 0).
    ratio = torch.where(head.slots, p / torch.where(head.slots, q, 1.0), 0.0)
    inverse_rho = torch.where(rho > 0, 1.0 / rho, math.inf)
    if mode == "icepop":
        head_kept, tail_kept = _in_bounds(ratio, lo, hi), _in_bounds(inverse_rho, lo, hi)
    else:
        a = advantages.to(device=p.device)
        head_kept = _adaptive_kept(ratio, a.unsqueeze(-1), lo, hi, outer_bound)
        tail_kept = _adaptive_kept(inverse_rho, a, lo, hi, outer_bound)
    return torch.where(head_kept, p, 0.0), tail_kept.to(p.dtype)


def _check_mode_arguments(
    mode: str,
    is_bounds: tuple[float, float] | None,
    token_mask: torch.Tensor,
    advantages: torch.Tensor | None,
    outer_bound: float | None,
) -> None:
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"importance_sampling_mode must be one of {IMPORTANCE_SAMPLING_MODES}, got {mode!r}")
    if mode in BOUNDED_MODES:
        if is_bounds is None or len(is_bounds) != 2:
            raise ValueError(f"importance_sampling_mode={mode!r} needs is_bounds=(lo, hi)")
        lo, hi = is_bounds
        if not (0 <= lo <= hi) or not math.isfinite(hi):
            raise ValueError(f"is_bounds must satisfy 0 <= lo <= hi < inf, got {is_bounds}")
    if mode == "adaptive-ppo-clip":
        if advantages is None or outer_bound is None:
            raise ValueError(
                "importance_sampling_mode='adaptive-ppo-clip' needs adaptive_ppo_clip_advantages and "
                "adaptive_ppo_clip_outer_bound"
            )
        try:
            broadcast = torch.broadcast_shapes(advantages.shape, token_mask.shape)
        except RuntimeError:
            broadcast = None
        if broadcast != token_mask.shape:
            raise ValueError(
                f"adaptive_ppo_clip_advantages {tuple(advantages.shape)} must broadcast to token_mask "
                f"{tuple(token_mask.shape)} (e.g. [B, T] or [B, 1])"
            )


def _correction(
    head: _Head,
    mode: str,
    is_bounds: tuple[float, float] | None,
    advantages: torch.Tensor | None,
    outer_bound: float | None,
) -> torch.Tensor:
    """C at every position from its head (the table's coefficients, detached, times log p)."""
    head_mass, alpha = _coefficients(head, mode, is_bounds, advantages, outer_bound)
    # Untruncated IS: m = p and alpha = 1, so m - alpha * p is exactly 0.0 in floating point and C == 0.
    coefficient = torch.where(head.slots, head_mass - alpha.unsqueeze(-1) * head.p, 0.0)
    return (coefficient.detach() * head.log_p).sum(-1)


def compute_score_centering_term(
    policy_logprobs_at_sampler_topk: torch.Tensor,
    *,
    sampler_topk_logprobs: torch.Tensor,
    importance_sampling_mode: ImportanceSamplingMode,
    is_bounds: tuple[float, float] | None,
    token_mask: torch.Tensor,
    sampler_replay: bool,
    adaptive_ppo_clip_advantages: torch.Tensor | None = None,
    adaptive_ppo_clip_outer_bound: float | None = None,
) -> ScoreCenteringTerm:
    """Per-token score-centering correction C and sampler head mass (docs/reference/score-centering.md §5.1).

    Args:
        policy_logprobs_at_sampler_topk: ``[..., K]`` trainer logprobs at the sampler's head ids, normalized
            over the full vocabulary (or over the sampler's kept set under replay); differentiable.
        sampler_topk_logprobs: ``[..., K]`` the sampler's logprobs at those ids (``-inf`` = filtered out).
        importance_sampling_mode: ``"off"``, ``"is"`` (untruncated token-level IS), ``"tis"``, ``"icepop"``
            or ``"adaptive-ppo-clip"``.
        is_bounds: ``(lo, hi)`` for the bounded modes (ignored otherwise). For adaptive-ppo-clip pass
            ``(lo, hi + k)``: the upper bound the controller set for this step, offset k included.
        token_mask: ``[...]`` positions that enter the loss; the others give exactly zero.
        sampler_replay: p is renormalized over the kept set and the head holds all of it (rho = 0).
        adaptive_ppo_clip_advantages: token advantages A broadcastable to ``token_mask`` (only the sign is used).
        adaptive_ppo_clip_outer_bound: the outer bound o of adaptive-ppo-clip.

    Returns:
        ``ScoreCenteringTerm(correction, sampler_head_mass)``, each shaped like ``token_mask``. The loss adds
        ``A * correction`` with the base loss's masks and normalization (docs/reference/score-centering.md §5.5).
    """
    _check_mode_arguments(
        importance_sampling_mode,
        is_bounds,
        token_mask,
        adaptive_ppo_clip_advantages,
        adaptive_ppo_clip_outer_bound,
    )
    head = _head(policy_logprobs_at_sampler_topk, sampler_topk_logprobs, token_mask, sampler_replay)
    correction = _correction(
        head, importance_sampling_mode, is_bounds, adaptive_ppo_clip_advantages, adaptive_ppo_clip_outer_bound
    )
    return ScoreCenteringTerm(correction=correction, sampler_head_mass=head.q.sum(-1))


def sampled_token_weights(
    ratio: torch.Tensor,
    importance_sampling_mode: ImportanceSamplingMode,
    is_bounds: tuple[float, float] | None = None,
    advantages: torch.Tensor | None = None,
    outer_bound: float | None = None,
) -> torch.Tensor:
    """The base loss's importance weight of each sampled token for a mode (reference §5.1, §5.7): the
    ratio r = p(y) / q(y) itself (``"is"``), clamped into the bounds (``"tis"``), zeroed outside them
    (``"icepop"``), or zeroed where adaptive-ppo-clip's filter rejects it for the sign of A
    (``"adaptive-ppo-clip"``, ``is_bounds`` = (lo, hi + k)); ``"off"``: 1."""
    _check_mode_arguments(importance_sampling_mode, is_bounds, ratio, advantages, outer_bound)
    if importance_sampling_mode == "off":
        return torch.ones_like(ratio)
    if importance_sampling_mode == "is":
        return ratio
    lo, hi = is_bounds
    if importance_sampling_mode == "tis":
        return ratio.clamp(lo, hi)
    if importance_sampling_mode == "icepop":
        return torch.where(_in_bounds(ratio, lo, hi), ratio, 0.0)
    kept = _adaptive_kept(ratio, advantages.to(ratio.device), lo, hi, outer_bound)
    return torch.where(kept, ratio, 0.0)


def sampled_token_weights_from_logprobs(
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    importance_sampling_mode: ImportanceSamplingMode,
    is_bounds: tuple[float, float] | None = None,
    advantages: torch.Tensor | None = None,
    outer_bound: float | None = None,
) -> torch.Tensor:
    """:func:`sampled_token_weights` of the ratio r = exp(old - sampler) of each sampled token, the weights a
    host lacks for ``"is"`` and ``"adaptive-ppo-clip"`` (reference §5.5, §5.7); zero outside ``token_mask``
    (whatever the logprobs hold there)."""
    mask = token_mask.bool()
    ratio = torch.where(mask, old_logprobs - sampler_logprobs, 0.0).exp()
    weights = sampled_token_weights(ratio, importance_sampling_mode, is_bounds, advantages, outer_bound)
    return torch.where(mask, weights, 0.0)


def score_centering_token_metrics(
    policy_logprobs_at_sampler_topk: torch.Tensor,
    *,
    sampler_topk_logprobs: torch.Tensor,
    correction: torch.Tensor,
    token_mask: torch.Tensor,
    sampler_replay: bool,
) -> dict[str, torch.Tensor]:
    """The values behind the metrics of docs/reference/score-centering.md §5.6 at every position (shaped like
    ``token_mask``, detached, 0 at masked positions): for hosts that normalize over a batch they split
    (verl's global token count). Keys as :func:`score_centering_metrics`."""
    with torch.no_grad():
        head = _head(policy_logprobs_at_sampler_topk, sampler_topk_logprobs, token_mask, sampler_replay)
        return _token_metrics(head, correction, token_mask)


def _token_metrics(
    head: _Head, correction: torch.Tensor, token_mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The §5.6 values at every position from its head, detached, 0 at masked positions."""
    with torch.no_grad():
        mask = token_mask.bool()
        values = (head.q.sum(-1), head.p.sum(-1), head.rho, correction.detach().abs())
        return {key: torch.where(mask, value, 0.0) for key, value in zip(METRIC_KEYS, values, strict=True)}


def score_centering_metrics(
    policy_logprobs_at_sampler_topk: torch.Tensor,
    *,
    sampler_topk_logprobs: torch.Tensor,
    correction: torch.Tensor,
    token_mask: torch.Tensor,
    sampler_replay: bool,
) -> dict[str, torch.Tensor]:
    """The metrics of docs/reference/score-centering.md §5.6 as detached means over the unmasked positions of this batch.

    Keys: ``score_centering/head_mass`` (sampler, sum_H q), ``score_centering/train_head_mass`` (sum_H p),
    ``score_centering/rho_mean`` and ``score_centering/correction_abs_mean``. No unmasked position gives 0.
    """
    values = score_centering_token_metrics(
        policy_logprobs_at_sampler_topk,
        sampler_topk_logprobs=sampler_topk_logprobs,
        correction=correction,
        token_mask=token_mask,
        sampler_replay=sampler_replay,
    )
    return batch_means(values, token_mask)


def batch_means(token_metrics: dict[str, torch.Tensor], token_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-position values (0 at masked positions) as means over the unmasked positions (none: 0)."""
    count = token_mask.bool().sum().clamp(min=1)
    return {key: value.sum() / count for key, value in token_metrics.items()}


class ScoreCenteringOutputs(NamedTuple):
    """What one micro-batch's loss needs (:func:`score_centering_outputs`), from one head computation."""

    correction: torch.Tensor
    """C per position, as :func:`compute_score_centering_term`."""
    token_metrics: dict[str, torch.Tensor]
    """The §5.6 values per position, as :func:`score_centering_token_metrics`."""


def score_centering_outputs(
    plan,
    k: float,
    policy_logprobs_at_sampler_topk: torch.Tensor,
    *,
    sampler_topk_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    advantages: torch.Tensor | None,
    sampler_replay: bool,
) -> ScoreCenteringOutputs:
    """C and the §5.6 values of a host's micro-batch under its resolved ``plan``
    (``config.ScoreCenteringPlanBase``) at the controller's offset ``k`` (docs/reference/score-centering.md
    §5.1, §5.6, §5.7): the head is computed once for both. ``advantages`` (broadcast to ``token_mask``) are
    read only under adaptive-ppo-clip."""
    adaptive = plan.mode == "adaptive-ppo-clip"
    advantages = advantages.expand_as(token_mask) if adaptive else None
    _check_mode_arguments(plan.mode, plan.bounds_at(k), token_mask, advantages, plan.outer_bound)
    head = _head(policy_logprobs_at_sampler_topk, sampler_topk_logprobs, token_mask, sampler_replay)
    correction = _correction(head, plan.mode, plan.bounds_at(k), advantages, plan.outer_bound)
    return ScoreCenteringOutputs(correction, _token_metrics(head, correction, token_mask))


def plan_sampled_token_weights(
    plan,
    k: float,
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    advantages: torch.Tensor,
) -> torch.Tensor:
    """:func:`sampled_token_weights_from_logprobs` under a host's resolved ``plan`` at the controller's offset
    ``k``: the weights the plugin writes for ``is`` and ``adaptive-ppo-clip`` (reference §5.5, §5.7)."""
    return sampled_token_weights_from_logprobs(
        old_logprobs,
        sampler_logprobs,
        token_mask,
        plan.mode,
        plan.bounds_at(k),
        advantages,
        plan.outer_bound,
    )
