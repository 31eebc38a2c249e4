"""What score centering does to the expected gradient, by enumeration (docs/reference/score-centering.md §5.1).

At one generated position with trainer logits z (p = softmax z, or over the sampler's kept set under
replay), sampler distribution q, and a token-independent advantage A, the sampled-token term of the loss
has the logit-space gradient ``-A w(y) (e_y - p)`` for y ~ q, with w the mode's sampled-token weight
(``sampled_token_weights`` of the ratio p(y) / q(y)). On-policy its expectation is zero; under a mismatch it
is not, and the correction A * C, whose gradient does not depend on y, is meant to cancel it: exactly when
the head covers q's support, approximately otherwise (the tail modelled as rho p).

Per position this module computes, exactly, as V-vectors (sign of the objective, A = 1):

    base       = E_{y~q}[w(y) (e_y - p)]            the expected sampled-token term
    correction = grad_z C                            C from the shipped ``compute_score_centering_term``
    total      = base - correction                   target: 0

and the variance ``E||w(y)(e_y - p)||^2 - ||base||^2``, which the correction leaves unchanged (it adds the
same vector whatever y is). The trainer's head logprobs come from the shipped
``policy_logprobs_at_sampler_topk`` (identity projection, so its hidden-state gradient is the logit
gradient) and C from ``compute_score_centering_term``: the measurement is of the shipped code. Float64
in, float64 out.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from trl_length_plugin.score_centering.estimator import (
    compute_score_centering_term,
    sampled_token_weights,
    score_centering_token_metrics,
)
from trl_length_plugin.score_centering.topk_logprobs import policy_logprobs_at_sampler_topk


class ModeSpec(NamedTuple):
    """One importance-sampling mode as the loss runs it: bounds, and for adaptive-ppo-clip the sign of A."""

    name: str
    mode: str
    is_bounds: tuple[float, float] | None = None
    advantage_sign: float = 1.0
    outer_bound: float | None = None


class PositionEffect(NamedTuple):
    """Exact per-position expectations (``[T, V]`` vectors, ``[T]`` scalars), float64."""

    base: torch.Tensor
    correction: torch.Tensor
    total: torch.Tensor
    variance: torch.Tensor
    head_mass: torch.Tensor
    train_head_mass: torch.Tensor
    rho: torch.Tensor
    correction_abs: torch.Tensor


def sampler_logprobs(
    logits: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """The sampler's processed logprobs ``[T, V]`` as vLLM samples them: temperature, then top-k, then top-p
    (the smallest most-likely set whose mass reaches top_p), keeping exactly top_k ids, renormalized over the kept set; ``-inf``
    outside it."""
    z = logits.to(torch.float64) / temperature
    if top_k > 0:  # exactly top_k ids, ties broken by topk's order (low-precision logits tie)
        kept = torch.zeros_like(z, dtype=torch.bool).scatter(-1, z.topk(top_k, dim=-1).indices, True)
        z = z.masked_fill(~kept, -math.inf)
    if top_p < 1.0:
        sorted_z, order = z.sort(dim=-1, descending=True)
        mass_before = sorted_z.softmax(-1).cumsum(-1) - sorted_z.softmax(-1)
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, -math.inf)
    return z.log_softmax(-1)


def sampler_head(log_q: torch.Tensor, num_candidates: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The head vLLM reports at each position: the K most likely ids of the processed distribution and their
    logprobs (``-inf`` for slots past the kept set)."""
    values, ids = log_q.topk(num_candidates, dim=-1)
    return ids, values


def _expected_base_term(p: torch.Tensor, q: torch.Tensor, weights: torch.Tensor):
    """E_q[w (e_y - p)] and E_q[||w (e_y - p)||^2] per position, in closed form over the vocabulary."""
    qw = torch.where(q > 0, q * weights, 0.0)
    base = qw - qw.sum(-1, keepdim=True) * p
    squared_norm = 1.0 - 2.0 * p + (p * p).sum(-1, keepdim=True)  # ||e_v - p||^2
    second_moment = (torch.where(q > 0, q * weights * weights, 0.0) * squared_norm).sum(-1)
    return base, second_moment


def position_effect(
    trainer_logits: torch.Tensor,
    sampler_log_q: torch.Tensor,
    *,
    num_candidates: int,
    spec: ModeSpec,
    sampler_replay: bool,
) -> PositionEffect:
    """Exact expected gradients of the sampled-token term with and without the correction at each position.

    ``trainer_logits [T, V]`` (float64), ``sampler_log_q [T, V]`` the sampler's processed logprobs
    (:func:`sampler_logprobs`). Under ``sampler_replay`` the kept set (finite ``sampler_log_q``) must fit in
    the head of ``num_candidates`` (the setup check of docs/reference/score-centering.md §5.5).
    """
    z = trainer_logits.detach().to(torch.float64).requires_grad_(True)
    log_q = sampler_log_q.to(torch.float64)
    if sampler_replay and int(torch.isfinite(log_q).sum(-1).max()) > num_candidates:
        raise ValueError(f"under sampler replay the kept set must fit in the head (K = {num_candidates})")
    head_ids, head_log_q = sampler_head(log_q, num_candidates)
    vocab = z.shape[-1]
    policy = policy_logprobs_at_sampler_topk(
        z,
        torch.eye(vocab, dtype=torch.float64),
        sampled_ids=head_ids[:, 0],
        sampler_topk_ids=head_ids,
        sampler_topk_logprobs=head_log_q,
        sampler_replay=sampler_replay,
    )
    mask = torch.ones(z.shape[0], dtype=torch.bool)
    advantages = torch.full((z.shape[0],), spec.advantage_sign, dtype=torch.float64)
    term = compute_score_centering_term(
        policy.topk,
        sampler_topk_logprobs=head_log_q,
        importance_sampling_mode=spec.mode,
        is_bounds=spec.is_bounds,
        token_mask=mask,
        sampler_replay=sampler_replay,
        adaptive_ppo_clip_advantages=advantages if spec.mode == "adaptive-ppo-clip" else None,
        adaptive_ppo_clip_outer_bound=spec.outer_bound,
    )
    (correction,) = torch.autograd.grad(term.correction.sum(), z, allow_unused=True)
    correction = torch.zeros_like(z) if correction is None else correction  # `is`: C carries no gradient
    with torch.no_grad():
        kept = torch.isfinite(log_q) if sampler_replay else torch.ones_like(log_q, dtype=torch.bool)
        p = z.detach().masked_fill(~kept, -math.inf).softmax(-1)
        q = log_q.exp()
        ratio = torch.where(q > 0, p / torch.where(q > 0, q, 1.0), 0.0)
        weights = sampled_token_weights(
            ratio, spec.mode, spec.is_bounds, advantages.unsqueeze(-1), spec.outer_bound
        )
        base, second_moment = _expected_base_term(p, q, weights)
        metrics = score_centering_token_metrics(
            policy.topk.detach(),
            sampler_topk_logprobs=head_log_q,
            correction=term.correction,
            token_mask=mask,
            sampler_replay=sampler_replay,
        )
    values = list(metrics.values())
    return PositionEffect(
        base=base,
        correction=correction,
        total=base - correction,
        variance=second_moment - (base * base).sum(-1),
        head_mass=values[0],
        train_head_mass=values[1],
        rho=values[2],
        correction_abs=values[3],
    )


class EffectSummary(NamedTuple):
    """Means over positions of :class:`PositionEffect` (the table's row)."""

    bias: float  # mean ||total||, with the correction
    base_bias: float  # mean ||base||, without it
    relative_bias: float  # bias / base_bias (nan when the base term has no expected gradient)
    variance: float  # mean trace of the covariance, the same with and without the correction
    head_mass: float
    train_head_mass: float
    rho: float
    correction_abs: float


def summarize(effect: PositionEffect) -> EffectSummary:
    """Mean per-position norms and metrics; relative bias = mean ||total|| / mean ||base||."""
    bias = float(effect.total.norm(dim=-1).mean())
    base_bias = float(effect.base.norm(dim=-1).mean())
    return EffectSummary(
        bias=bias,
        base_bias=base_bias,
        relative_bias=bias / base_bias if base_bias > 1e-12 else math.nan,
        variance=float(effect.variance.mean()),
        head_mass=float(effect.head_mass.mean()),
        train_head_mass=float(effect.train_head_mass.mean()),
        rho=float(effect.rho.mean()),
        correction_abs=float(effect.correction_abs.mean()),
    )


def mean_kl(sampler_log_q: torch.Tensor, trainer_logits: torch.Tensor, sampler_replay: bool) -> float:
    """Mean over positions of KL(q || p), p over the kept set under replay: the measured mismatch."""
    log_q = sampler_log_q.to(torch.float64)
    kept = torch.isfinite(log_q) if sampler_replay else torch.ones_like(log_q, dtype=torch.bool)
    log_p = trainer_logits.to(torch.float64).masked_fill(~kept, -math.inf).log_softmax(-1)
    q = log_q.exp()
    return float(torch.where(q > 0, q * (log_q - log_p), 0.0).sum(-1).mean())
