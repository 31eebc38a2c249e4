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
* Each tail, 1 - sum_H, is computed from the head's logprobs in float64 (-expm1 of their logsumexp), not by
  subtracting a float32 sum of probabilities from 1, which cancels where the head holds nearly all the mass.
* Under sampler replay p is the trainer's distribution renormalized over the sampler's kept set, the head
  holds all of it, and rho = 0: the coefficients are the table's with rho = 0 (no tail).
* Bounds are inclusive: a ratio r is "in bounds" when lo <= r <= hi.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from trl_length_plugin.score_centering.modes import Head, Window, get_mode

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
    detached: Head  # detached p, sampler q, the slots and rho, as the modes read them


def _tail(head_logprobs: torch.Tensor) -> torch.Tensor:
    """1 - sum_H exp(l), the mass outside the head, as -expm1(logsumexp l) in float64: where the head holds nearly
    all the mass, 1 - sum_H p in the logprobs' float32 cancels to a few ulps of 1 (issue 42); an empty head gives 1."""
    return -torch.expm1(torch.logsumexp(head_logprobs.double(), -1))


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
        tail_q = _tail(torch.where(slots, sampler_logprobs.to(log_p.device), -math.inf)).clamp(min=0.0)
        tail_p = _tail(torch.where(slots, log_p.detach(), -math.inf))
        rho = (tail_q / tail_p.clamp(min=RHO_DENOMINATOR_FLOOR)).to(dtype)
    return _Head(log_p=log_p, detached=Head(p=p, q=q, slots=slots, rho=rho))


def _window(
    mode: str,
    is_bounds: tuple[float, float] | None,
    token_mask: torch.Tensor,
    advantages: torch.Tensor | None,
    outer_bound: float | None,
) -> Window:
    """What the registered mode reads besides the head at this step, its arguments checked."""
    spec = get_mode(mode)
    if spec.bounds != "none":
        if is_bounds is None or len(is_bounds) != 2:
            raise ValueError(f"importance_sampling_mode={mode!r} needs is_bounds=(lo, hi)")
        lo, hi = is_bounds
        if not (0 <= lo <= hi) or not math.isfinite(hi):
            raise ValueError(f"is_bounds must satisfy 0 <= lo <= hi < inf, got {is_bounds}")
    if spec.controller:
        if advantages is None or outer_bound is None:
            raise ValueError(
                f"importance_sampling_mode={mode!r} needs adaptive_ppo_clip_advantages and "
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
    return Window(is_bounds, advantages, outer_bound)


def _correction(heads: _Head, mode: str, window: Window) -> torch.Tensor:
    """C at every position from its head (the mode's coefficients, detached, times log p)."""
    head_mass, alpha = get_mode(mode).coefficients(heads.detached, window)
    # Untruncated IS: m = p and alpha = 1, so m - alpha * p is exactly 0.0 in floating point and C == 0.
    coefficient = torch.where(heads.detached.slots, head_mass - alpha.unsqueeze(-1) * heads.detached.p, 0.0)
    return (coefficient.detach() * heads.log_p).sum(-1)


def compute_score_centering_term(
    policy_logprobs_at_sampler_topk: torch.Tensor,
    *,
    sampler_topk_logprobs: torch.Tensor,
    importance_sampling_mode: str,
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
    window = _window(
        importance_sampling_mode,
        is_bounds,
        token_mask,
        adaptive_ppo_clip_advantages,
        adaptive_ppo_clip_outer_bound,
    )
    heads = _head(policy_logprobs_at_sampler_topk, sampler_topk_logprobs, token_mask, sampler_replay)
    correction = _correction(heads, importance_sampling_mode, window)
    return ScoreCenteringTerm(correction=correction, sampler_head_mass=heads.detached.q.sum(-1))


def sampled_token_weights(
    ratio: torch.Tensor,
    importance_sampling_mode: str,
    is_bounds: tuple[float, float] | None = None,
    advantages: torch.Tensor | None = None,
    outer_bound: float | None = None,
) -> torch.Tensor:
    """The base loss's importance weight of each sampled token for a mode (reference §5.1, §5.7): the
    ratio r = p(y) / q(y) itself (``"is"``), clamped into the bounds (``"tis"``), zeroed outside them
    (``"icepop"``), or zeroed where adaptive-ppo-clip's filter rejects it for the sign of A
    (``"adaptive-ppo-clip"``, ``is_bounds`` = (lo, hi + k)); ``"off"``: 1."""
    window = _window(importance_sampling_mode, is_bounds, ratio, advantages, outer_bound)
    return get_mode(importance_sampling_mode).weights(ratio, window)


def sampled_token_weights_from_logprobs(
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    importance_sampling_mode: str,
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
        heads = _head(policy_logprobs_at_sampler_topk, sampler_topk_logprobs, token_mask, sampler_replay)
        return _token_metrics(heads.detached, correction, token_mask)


def _token_metrics(head: Head, correction: torch.Tensor, token_mask: torch.Tensor) -> dict[str, torch.Tensor]:
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
    (``plan.ScoreCenteringPlanBase``) at the controller's offset ``k`` (docs/reference/score-centering.md
    §5.1, §5.6, §5.7): the head is computed once for both. ``advantages`` (broadcast to ``token_mask``) are
    read only under adaptive-ppo-clip."""
    advantages = advantages.expand_as(token_mask) if plan.uses_controller else None
    window = _window(plan.mode, plan.bounds_at(k), token_mask, advantages, plan.outer_bound)
    heads = _head(policy_logprobs_at_sampler_topk, sampler_topk_logprobs, token_mask, sampler_replay)
    correction = _correction(heads, plan.mode, window)
    return ScoreCenteringOutputs(correction, _token_metrics(heads.detached, correction, token_mask))
