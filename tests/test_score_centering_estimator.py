"""compute_score_centering_term against the table of score-centering.md (docs/reference/score-centering.md §5.1).

The reference below is written separately, loop by loop in float64 from the document's table; it returns C,
the head mass and the stop-gradient coefficients m(v) - alpha p(v), which are exactly dC / d log p(v).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_length_plugin.score_centering import ScoreCenteringPlanBase, estimator
from trl_length_plugin.score_centering.estimator import (
    compute_score_centering_term,
    score_centering_metrics,
    score_centering_outputs,
    score_centering_token_metrics,
)
from trl_length_plugin.score_centering.topk_logprobs import policy_logprobs_at_sampler_topk

MODES = ("off", "is", "tis", "icepop", "adaptive-ppo-clip")
BOUNDS = (0.8, 1.25)
OUTER = 1.6


def reference_position(lp, lq, mode, bounds, replay, advantage, outer):
    """C, sampler head mass and per-slot coefficients of one position, from the document's table."""
    slots = [k for k in range(len(lq)) if math.isfinite(lq[k])]
    p = {k: math.exp(lp[k]) for k in slots}
    q = {k: math.exp(lq[k]) for k in slots}
    head_q, head_p = sum(q.values()), sum(p.values())
    rho = 0.0 if replay else max(1.0 - head_q, 0.0) / max(1.0 - head_p, 1e-6)
    lo, hi = bounds if bounds is not None else (None, None)

    def adaptive_keeps(r):
        if r > outer:
            return False
        if advantage < 0:
            return r >= lo
        if advantage > 0:
            return r <= hi
        return True

    inverse_rho = 1.0 / rho if rho > 0 else math.inf
    head_mass = {}
    for k in slots:
        ratio = p[k] / q[k]
        if mode == "off":
            head_mass[k] = q[k]
        elif mode == "is":
            head_mass[k] = p[k]
        elif mode == "tis":
            head_mass[k] = min(max(p[k], lo * q[k]), hi * q[k])
        elif mode == "icepop":
            head_mass[k] = p[k] if lo <= ratio <= hi else 0.0
        else:
            head_mass[k] = p[k] if adaptive_keeps(ratio) else 0.0
    if mode == "off":
        alpha = rho
    elif mode == "is":
        alpha = 1.0
    elif mode == "tis":
        alpha = min(max(1.0, lo * rho), hi * rho)
    elif mode == "icepop":
        alpha = 1.0 if lo <= inverse_rho <= hi else 0.0
    else:
        alpha = 1.0 if adaptive_keeps(inverse_rho) else 0.0
    coefficients = [0.0] * len(lq)
    correction = 0.0
    for k in slots:
        coefficients[k] = head_mass[k] - alpha * p[k]
        correction += coefficients[k] * lp[k]
    return correction, head_q, coefficients


def reference(lp, lq, mask, mode, bounds, replay, advantages=None, outer=None):
    rows, cols = mask.shape
    correction = torch.zeros(rows, cols, dtype=torch.float64)
    head_mass = torch.zeros(rows, cols, dtype=torch.float64)
    grad = torch.zeros(lp.shape, dtype=torch.float64)
    for b in range(rows):
        for t in range(cols):
            if not mask[b, t]:
                continue
            advantage = 0.0 if advantages is None else float(advantages[b, t])
            c, m, coefficients = reference_position(
                lp[b, t].tolist(), lq[b, t].tolist(), mode, bounds, replay, advantage, outer
            )
            correction[b, t], head_mass[b, t] = c, m
            grad[b, t] = torch.tensor(coefficients, dtype=torch.float64)
    return correction, head_mass, grad


def make_heads(seed, rows=3, cols=7, vocab=40, k=6, replay=False, dtype=torch.float64):
    """Random trainer/sampler heads: the sampler is a perturbed copy of the policy, so ratios straddle bounds."""
    g = torch.Generator().manual_seed(seed)
    policy_logits = torch.randn(rows, cols, vocab, generator=g, dtype=torch.float64) * 2
    sampler_logits = policy_logits + torch.randn(rows, cols, vocab, generator=g, dtype=torch.float64) * 0.3
    ids = sampler_logits.argsort(-1, descending=True)[..., :k]
    if replay:
        kept = torch.rand(rows, cols, k, generator=g) < 0.75
        kept[..., 0] = True
        lp = torch.where(kept, policy_logits.gather(-1, ids), -math.inf)
        lq = torch.where(kept, sampler_logits.gather(-1, ids), -math.inf)
        lp, lq = lp - lp.logsumexp(-1, keepdim=True), lq - lq.logsumexp(-1, keepdim=True)
    else:
        lp = policy_logits.log_softmax(-1).gather(-1, ids)
        lq = sampler_logits.log_softmax(-1).gather(-1, ids)
    mask = torch.rand(rows, cols, generator=g) < 0.8
    advantages = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    advantages[0, :2] = 0.0
    return lp.to(dtype), lq.to(dtype), mask, advantages


def run(lp, lq, mask, mode, replay, advantages):
    return compute_score_centering_term(
        lp,
        sampler_topk_logprobs=lq,
        importance_sampling_mode=mode,
        is_bounds=BOUNDS if mode in ("tis", "icepop", "adaptive-ppo-clip") else None,
        token_mask=mask,
        sampler_replay=replay,
        adaptive_ppo_clip_advantages=advantages,
        adaptive_ppo_clip_outer_bound=OUTER,
    )


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_loop_reference_values_and_gradients(mode, replay, seed):
    lp, lq, mask, advantages = make_heads(seed, replay=replay)
    lp.requires_grad_(True)
    out = run(lp, lq, mask, mode, replay, advantages)
    bounds = BOUNDS if mode != "off" and mode != "is" else None
    ref_c, ref_mass, ref_grad = reference(lp.detach(), lq, mask, mode, bounds, replay, advantages, OUTER)
    torch.testing.assert_close(out.correction, ref_c, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.sampler_head_mass, ref_mass, rtol=1e-12, atol=1e-12)
    (grad,) = torch.autograd.grad(out.correction.sum(), lp)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)


def test_float32_inputs_match_reference():
    lp, lq, mask, advantages = make_heads(5, dtype=torch.float32)
    out = run(lp, lq, mask, "tis", False, advantages)
    assert out.correction.dtype == torch.float32
    ref_c, _, _ = reference(lp.double(), lq.double(), mask, "tis", BOUNDS, False)
    torch.testing.assert_close(out.correction.double(), ref_c, rtol=1e-5, atol=1e-6)


# Hand-computed: q = (0.5, 0.25), p = (0.4, 0.4); sum q = 0.75, sum p = 0.8, rho = 0.25 / 0.2 = 1.25;
# ratios p/q = (0.8, 1.6), 1/rho = 0.8.
HAND = [
    # off: m = q, alpha = rho -> (0.5 - 0.5, 0.25 - 0.5)
    ("off", None, 1.0, None, (0.0, -0.25)),
    # tis [0.9, 1.1]: m = (clamp(.4,.45,.55), clamp(.4,.225,.275)) = (.45,.275); alpha = clamp(1,1.125,1.375)
    ("tis", (0.9, 1.1), 1.0, None, (0.0, 0.275 - 1.125 * 0.4)),
    # icepop [0.7, 1.3]: ratio 0.8 kept, 1.6 dropped; 1/rho = 0.8 kept -> alpha = 1
    ("icepop", (0.7, 1.3), 1.0, None, (0.0, -0.4)),
    # icepop [0.9, 1.1]: nothing kept, alpha = 0
    ("icepop", (0.9, 1.1), 1.0, None, (0.0, 0.0)),
    # adaptive-ppo-clip, lo 0.7, hi + k 1.3, o 2: A > 0 drops 1.6 (> 1.3); 1/rho = 0.8 kept
    ("adaptive-ppo-clip", (0.7, 1.3), 1.0, 2.0, (0.0, -0.4)),
    # A < 0 keeps 1.6 (>= 0.7 and <= o): m = p, alpha = 1
    ("adaptive-ppo-clip", (0.7, 1.3), -1.0, 2.0, (0.0, 0.0)),
    # A = 0: held to o only, both kept
    ("adaptive-ppo-clip", (0.7, 1.3), 0.0, 2.0, (0.0, 0.0)),
    # A < 0 with o = 1.5: 1.6 > o dropped
    ("adaptive-ppo-clip", (0.7, 1.3), -1.0, 1.5, (0.0, -0.4)),
    ("is", None, 1.0, None, (0.0, 0.0)),
]


@pytest.mark.parametrize(("mode", "bounds", "advantage", "outer", "coefficients"), HAND)
def test_hand_computed_coefficients(mode, bounds, advantage, outer, coefficients):
    lp = torch.tensor([[[math.log(0.4), math.log(0.4)]]], dtype=torch.float64, requires_grad=True)
    lq = torch.tensor([[[math.log(0.5), math.log(0.25)]]], dtype=torch.float64)
    out = compute_score_centering_term(
        lp,
        sampler_topk_logprobs=lq,
        importance_sampling_mode=mode,
        is_bounds=bounds,
        token_mask=torch.ones(1, 1, dtype=torch.bool),
        sampler_replay=False,
        adaptive_ppo_clip_advantages=torch.tensor([[advantage]]),
        adaptive_ppo_clip_outer_bound=outer,
    )
    expected = sum(c * math.log(0.4) for c in coefficients)
    assert out.correction.item() == pytest.approx(expected, abs=1e-12)
    assert out.sampler_head_mass.item() == pytest.approx(0.75, abs=1e-15)
    (grad,) = torch.autograd.grad(out.correction.sum(), lp)
    assert grad.flatten().tolist() == pytest.approx(list(coefficients), abs=1e-12)


@pytest.mark.parametrize("replay", [False, True])
def test_untruncated_is_is_exactly_zero(replay):
    lp, lq, mask, advantages = make_heads(3, replay=replay, dtype=torch.float32)
    lp.requires_grad_(True)
    out = run(lp, lq, mask, "is", replay, advantages)
    assert torch.equal(out.correction, torch.zeros_like(out.correction))
    (grad,) = torch.autograd.grad(out.correction.sum(), lp)
    assert torch.equal(grad, torch.zeros_like(grad))


def _mode_weight(mode, ratio, advantage):
    """The importance weight each mode's base loss gives the sampled token (the same filters as the table)."""
    lo, hi = BOUNDS
    if mode == "off":
        return 1.0
    if mode == "is":
        return ratio
    if mode == "tis":
        return min(max(ratio, lo), hi)
    if mode == "icepop":
        return ratio if lo <= ratio <= hi else 0.0
    keep = ratio <= OUTER and (ratio >= lo if advantage < 0 else ratio <= hi if advantage > 0 else True)
    return ratio if keep else 0.0


@pytest.mark.parametrize("advantage", [1.5, -0.7])
@pytest.mark.parametrize("mode", MODES)
def test_replay_with_full_head_cancels_the_sampler_expected_score(mode, advantage):
    """With replay and a head holding the whole kept set, grad(A * C) = A * E_{y~q}[w(y) grad log p(y)].

    That is minus the sampler-expected gradient of the base term -A w(y) log p(y): the correction centers
    it exactly. The expectation is computed by enumerating the vocabulary of a small categorical policy.
    """
    vocab = 7
    kept_ids = [5, 1, 3, 0]  # the sampler's kept set S
    theta = torch.tensor([0.3, -1.1, 0.8, 0.2, -0.4, 1.3, 0.05], dtype=torch.float64, requires_grad=True)
    sampler_logits = torch.tensor([0.1, -0.9, 0.5, 0.6, -0.2, 1.0, 0.4], dtype=torch.float64)
    kept = torch.zeros(vocab, dtype=torch.bool)
    kept[kept_ids] = True

    def kept_logprobs(logits):
        return torch.where(kept, logits, -math.inf).log_softmax(-1)

    head = torch.tensor(kept_ids + [2])  # one slot the sampler filtered out
    sampler_head = kept_logprobs(sampler_logits)[head]
    out = compute_score_centering_term(
        kept_logprobs(theta)[head].view(1, 1, -1),
        sampler_topk_logprobs=sampler_head.view(1, 1, -1),
        importance_sampling_mode=mode,
        is_bounds=BOUNDS if mode in ("tis", "icepop", "adaptive-ppo-clip") else None,
        token_mask=torch.ones(1, 1, dtype=torch.bool),
        sampler_replay=True,
        adaptive_ppo_clip_advantages=torch.tensor([[advantage]]),
        adaptive_ppo_clip_outer_bound=OUTER,
    )
    (grad,) = torch.autograd.grad(advantage * out.correction.sum(), theta)

    expected = torch.zeros(vocab, dtype=torch.float64)
    q = kept_logprobs(sampler_logits).exp()
    for y in range(vocab):
        if q[y] == 0:
            continue
        log_p = kept_logprobs(theta)[y]
        (score,) = torch.autograd.grad(log_p, theta)
        weight = _mode_weight(mode, float(log_p.detach().exp() / q[y]), advantage)
        expected += float(q[y]) * weight * score
    torch.testing.assert_close(grad, advantage * expected, rtol=1e-10, atol=1e-12)


def test_masked_positions_are_neutralized_before_exponentiation():
    lp, lq, mask, advantages = make_heads(7)
    garbage_lp, garbage_lq = lp.clone(), lq.clone()
    garbage_lp[~mask] = math.inf
    garbage_lq[~mask] = math.nan
    garbage_lp.requires_grad_(True)
    for mode in MODES:
        out = run(garbage_lp, garbage_lq, mask, mode, False, advantages)
        clean = run(lp, lq, mask, mode, False, advantages)
        assert torch.equal(out.correction, clean.correction)
        assert torch.all(out.correction[~mask] == 0) and torch.all(out.sampler_head_mass[~mask] == 0)
        (grad,) = torch.autograd.grad(out.correction.sum(), garbage_lp)
        assert torch.isfinite(grad).all() and torch.all(grad[~mask] == 0)


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_minus_inf_slots_carry_nothing(mode, replay):
    """A -inf sampler slot (filtered out) equals dropping the slot, whatever the policy holds there."""
    lp, lq, mask, advantages = make_heads(11, replay=replay, k=5)
    padded_lp = torch.cat([lp, torch.full_like(lp[..., :1], -math.inf)], -1).requires_grad_(True)
    padded_lq = torch.cat([lq, torch.full_like(lq[..., :1], -math.inf)], -1)
    out = run(padded_lp, padded_lq, mask, mode, replay, advantages)
    assert torch.equal(out.correction, run(lp, lq, mask, mode, replay, advantages).correction)
    (grad,) = torch.autograd.grad(out.correction.sum(), padded_lp)
    assert torch.isfinite(grad).all() and torch.all(grad[..., -1] == 0)


def test_gradcheck_through_trainer_logprobs():
    """gradcheck of C(hidden, weight) on a small vocabulary. IS off under replay has constant coefficients
    (m = q, alpha = 0), so the stop-gradient leaves C's true derivative unchanged and gradcheck applies; the
    other modes' gradients are checked against the reference coefficients above."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 5, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.stack([torch.randperm(11, generator=g)[:4] for _ in range(6)]).view(2, 3, 4)
    sampler = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    sampler[..., -1] = -math.inf
    sampler = sampler.log_softmax(-1)
    mask = torch.tensor([[True, True, False], [True, True, True]])

    def correction(h, w):
        lp = policy_logprobs_at_sampler_topk(
            h,
            w,
            sampled_ids=ids[..., 0],
            sampler_topk_ids=ids,
            sampler_topk_logprobs=sampler,
            sampler_replay=True,
            temperature=0.7,
        ).topk
        return compute_score_centering_term(
            lp,
            sampler_topk_logprobs=sampler,
            importance_sampling_mode="off",
            is_bounds=None,
            token_mask=mask,
            sampler_replay=True,
        ).correction

    assert torch.autograd.gradcheck(correction, (hidden, weight))


def test_metrics_are_masked_means():
    lp, lq, mask, advantages = make_heads(4)
    out = run(lp, lq, mask, "off", False, advantages)
    metrics = score_centering_metrics(
        lp, sampler_topk_logprobs=lq, correction=out.correction, token_mask=mask, sampler_replay=False
    )
    n = mask.sum()
    assert metrics["score_centering/head_mass"] == pytest.approx(float(out.sampler_head_mass[mask].sum() / n))
    assert metrics["score_centering/train_head_mass"] == pytest.approx(
        float(lp.exp().sum(-1)[mask].sum() / n)
    )
    rho = (1 - lq.exp().sum(-1)).clamp(min=0) / (1 - lp.exp().sum(-1)).clamp(min=1e-6)
    assert metrics["score_centering/rho_mean"] == pytest.approx(float(rho[mask].sum() / n))
    assert metrics["score_centering/correction_abs_mean"] == pytest.approx(
        float(out.correction.abs()[mask].mean())
    )
    per_token = score_centering_token_metrics(
        lp, sampler_topk_logprobs=lq, correction=out.correction, token_mask=mask, sampler_replay=False
    )
    assert sorted(per_token) == sorted(metrics)
    for key, values in per_token.items():  # per position, 0 where masked; their masked mean is the metric
        assert values.shape == mask.shape and not values[~mask].any()
        assert float(values.sum() / n) == pytest.approx(float(metrics[key]))
    torch.testing.assert_close(per_token["score_centering/rho_mean"][mask], rho[mask].to(torch.float64))


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_outputs_compute_the_head_once_and_equal_the_term_and_its_metrics(monkeypatch, mode, replay):
    """What a host's loss uses per micro-batch: C (values and gradients) and the §5.6 values of
    compute_score_centering_term and score_centering_token_metrics, from one head computation, under a plan
    whose adaptive-ppo-clip bounds carry the controller's offset k."""
    lp, lq, mask, advantages = make_heads(7, replay=replay)
    k = 0.05
    plan_bounds = (BOUNDS[0], BOUNDS[1] - k) if mode == "adaptive-ppo-clip" else BOUNDS
    bounds = plan_bounds if mode in ("tis", "icepop", "adaptive-ppo-clip") else None
    plan = ScoreCenteringPlanBase(6, mode, bounds, OUTER if mode == "adaptive-ppo-clip" else None, False)
    heads = []
    head = estimator._head
    monkeypatch.setattr(estimator, "_head", lambda *a: heads.append(1) or head(*a))
    leaf = lp.clone().requires_grad_(True)
    outputs = score_centering_outputs(
        plan, k, leaf, sampler_topk_logprobs=lq, token_mask=mask, advantages=advantages, sampler_replay=replay
    )
    assert len(heads) == 1
    monkeypatch.setattr(estimator, "_head", head)
    expected_leaf = lp.clone().requires_grad_(True)
    expected = run(expected_leaf, lq, mask, mode, replay, advantages)
    torch.testing.assert_close(outputs.correction, expected.correction, rtol=0, atol=0)
    outputs.correction.sum().backward()
    expected.correction.sum().backward()
    torch.testing.assert_close(leaf.grad, expected_leaf.grad, rtol=0, atol=0)
    metrics = score_centering_token_metrics(
        lp, sampler_topk_logprobs=lq, correction=expected.correction, token_mask=mask, sampler_replay=replay
    )
    assert sorted(outputs.token_metrics) == sorted(metrics)
    for key, values in metrics.items():
        torch.testing.assert_close(outputs.token_metrics[key], values, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("mode", "kwargs", "match"),
    [
        ("sis", {}, "importance_sampling_mode"),
        ("tis", {"is_bounds": None}, "is_bounds"),
        ("tis", {"is_bounds": (2.0, 1.0)}, "is_bounds"),
        ("adaptive-ppo-clip", {"is_bounds": (0.8, 1.2)}, "adaptive_ppo_clip"),
    ],
)
def test_bad_arguments_are_rejected(mode, kwargs, match):
    lp, lq, mask, _ = make_heads(0)
    with pytest.raises(ValueError, match=match):
        compute_score_centering_term(
            lp,
            sampler_topk_logprobs=lq,
            importance_sampling_mode=mode,
            token_mask=mask,
            sampler_replay=False,
            **{"is_bounds": None, **kwargs},
        )


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    k=st.integers(1, 8),
    sharpness=st.floats(0.1, 4.0),
)
def test_wide_bounds_reduce_truncated_modes_to_untruncated_is(seed, k, sharpness):
    """Invariant: bounds that keep every ratio make TIS and ICEPOP equal untruncated IS, so C = 0."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 4, 16, generator=g, dtype=torch.float64) * sharpness
    ids = logits.argsort(-1, descending=True)[..., :k]
    lp = logits.log_softmax(-1).gather(-1, ids)
    lq = (
        (logits + torch.randn(logits.shape, generator=g, dtype=torch.float64) * 0.2)
        .log_softmax(-1)
        .gather(-1, ids)
    )
    mask = torch.ones(2, 4, dtype=torch.bool)
    ratios = (lp - lq).exp()
    head_p, head_q = lp.exp().sum(-1), lq.exp().sum(-1)
    inverse_rho = (1 - head_p).clamp(min=1e-6) / (1 - head_q)
    lo = 0.5 * min(float(ratios.min()), float(inverse_rho.min()))
    hi = 2.0 * max(float(ratios.max()), float(inverse_rho.max()))
    for mode in ("tis", "icepop"):
        out = compute_score_centering_term(
            lp,
            sampler_topk_logprobs=lq,
            importance_sampling_mode=mode,
            is_bounds=(lo, hi),
            token_mask=mask,
            sampler_replay=False,
        )
        torch.testing.assert_close(out.correction, torch.zeros_like(out.correction), rtol=0, atol=1e-12)


def test_per_sequence_advantages_broadcast():
    lp, lq, mask, advantages = make_heads(9)
    per_sequence = advantages[:, :1]
    expanded = run(lp, lq, mask, "adaptive-ppo-clip", False, per_sequence.expand_as(mask))
    assert torch.equal(
        run(lp, lq, mask, "adaptive-ppo-clip", False, per_sequence).correction, expanded.correction
    )
    with pytest.raises(ValueError, match="broadcast"):
        run(lp, lq, mask, "adaptive-ppo-clip", False, advantages[:1, :3])


def test_the_tail_ratio_has_no_cancellation_where_the_head_holds_nearly_all_the_mass():
    """Issue 42: rho read 1 - sum_H p off a float32 sum, which cancels to a few ulps of 1 where one token holds
    nearly all the mass (the embedded model on-policy read rho_mean 0.63). The tails come from the head's
    X"""
    policy = torch.tensor([[[-1.3e-6, -30.0, -31.0]]], dtype=torch.float32)
    sampler = torch.tensor([[[-1.1e-6, -30.5, -31.0]]], dtype=torch.float32)

    def tail(row):
        return -math.expm1(math.log(math.fsum(math.exp(float(v)) for v in row)))

    exact = tail(sampler[0, 0]) / max(tail(policy[0, 0]), 1e-6)
    assert 0.8 < exact < 0.9
    metrics = estimator.score_centering_metrics(
        policy,
        sampler_topk_logprobs=sampler,
        correction=torch.zeros(1, 1),
        token_mask=torch.ones(1, 1, dtype=torch.bool),
        sampler_replay=False,
    )
    assert metrics["score_centering/rho_mean"].item() == pytest.approx(exact, rel=1e-6)  # a float32 result
    float32 = (1 - sampler.exp().sum(-1)) / (1 - policy.exp().sum(-1)).clamp(min=1e-6)
    assert abs(float32.item() / exact - 1) > 0.01  # what the old sum gave
