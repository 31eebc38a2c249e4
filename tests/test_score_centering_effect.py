"""The exact gradient measurement of score centering (bench/score_centering_effect.py, docs/score-centering.md
"What the correction does to the gradient") against a float64 loop reference written from the table of
docs/reference/score-centering.md §5.1 on hand-made logits over a 6-token vocabulary:

- the enumerated expectations (the sampled-token term, the correction's gradient, their difference, the
  variance, the metrics) equal the reference's in every mode, with and without sampler replay;
- the bias is zero where the reference says the correction is exact: the head covers q's support (top-k
  sampling under replay with K >= the kept set; K = V), or the sampler's tail is exactly rho times the
  trainer's; and non-zero with the correction off or the head short under a mismatch.
"""

from __future__ import annotations

import math

import pytest
import torch

from bench.score_centering_effect import (
    ModeSpec,
    mean_kl,
    position_effect,
    sampler_logprobs,
    summarize,
)

TRAINER = torch.tensor(
    [[2.0, 1.1, 0.3, -0.4, -1.2, -2.5], [0.1, 1.7, -0.6, 0.9, -1.9, 0.4], [-1.0, 0.2, 2.6, 0.5, -0.3, 1.4]],
    dtype=torch.float64,
)
SAMPLER = TRAINER + torch.tensor(  # a mismatch large enough that every bounded mode clips somewhere
    [[0.6, -0.9, 0.5, 1.3, -0.2, 0.4], [-0.8, 0.3, 1.1, -1.4, 0.2, 0.9], [0.4, -1.1, -0.3, 0.7, 1.6, -0.5]],
    dtype=torch.float64,
)
SPECS = [
    ModeSpec("off", "off"),
    ModeSpec("is", "is"),
    ModeSpec("tis", "tis", (0.0, 1.5)),
    ModeSpec("icepop", "icepop", (0.5, 2.0)),
    ModeSpec("adaptive A>0", "adaptive-ppo-clip", (0.8, 1.28), 1.0, 3.0),
    ModeSpec("adaptive A<0", "adaptive-ppo-clip", (0.8, 1.28), -1.0, 3.0),
]


def _kept(r: float, spec: ModeSpec) -> bool:
    lo, hi = spec.is_bounds
    if spec.mode == "icepop":
        return lo <= r <= hi
    by_sign = r >= lo if spec.advantage_sign < 0 else r <= hi
    return r <= spec.outer_bound and by_sign


def _weight(r: float, spec: ModeSpec) -> float:
    """The base loss's sampled-token weight for ratio r (reference §5.1, §5.5)."""
    if spec.mode == "off":
        return 1.0
    if spec.mode == "is":
        return r
    if spec.mode == "tis":
        return min(max(r, spec.is_bounds[0]), spec.is_bounds[1])
    return r if _kept(r, spec) else 0.0


def _coefficients(p: list[float], q: list[float], head: list[int], rho: float, spec: ModeSpec) -> dict:
    """m(v) - alpha p(v) for v in the head, from the reference table."""
    out = {}
    for v in head:
        if spec.mode == "off":
            m, alpha = q[v], rho
        elif spec.mode == "is":
            m, alpha = p[v], 1.0
        elif spec.mode == "tis":
            lo, hi = spec.is_bounds
            m, alpha = min(max(p[v], lo * q[v]), hi * q[v]), min(max(1.0, lo * rho), hi * rho)
        else:
            m = p[v] if _kept(p[v] / q[v], spec) else 0.0
            alpha = 1.0 if rho > 0 and _kept(1.0 / rho, spec) else 0.0
        out[v] = m - alpha * p[v]
    return out


def reference(trainer, sampler_log_q, num_candidates: int, spec: ModeSpec, replay: bool):
    """Per position: (base, correction, total, variance, head mass, train head mass, rho), python floats."""
    rows = []
    for z, log_q in zip(trainer.tolist(), sampler_log_q.tolist(), strict=True):
        vocab = range(len(z))
        kept = [v for v in vocab if log_q[v] > -math.inf] if replay else list(vocab)
        normalizer = math.log(sum(math.exp(z[v]) for v in kept))
        p = [math.exp(z[v] - normalizer) if v in kept else 0.0 for v in vocab]
        q = [math.exp(x) for x in log_q]
        head = sorted(vocab, key=lambda v: -log_q[v])[:num_candidates]
        head = [v for v in head if q[v] > 0]
        head_q, head_p = sum(q[v] for v in head), sum(p[v] for v in head)
        rho = 0.0 if replay else max(1.0 - head_q, 0.0) / max(1.0 - head_p, 1e-6)

        def score(v, p=p, vocab=vocab):  # grad_z log p(v) = e_v - p
            return [(1.0 if u == v else 0.0) - p[u] for u in vocab]

        base, second = [0.0] * len(z), 0.0
        for v in vocab:
            if q[v] > 0:
                w = _weight(p[v] / q[v], spec)
                base = [b + q[v] * w * g for b, g in zip(base, score(v), strict=True)]
                second += q[v] * w * w * sum(g * g for g in score(v))
        correction = [0.0] * len(z)
        for v, c in _coefficients(p, q, head, rho, spec).items():
            correction = [a + c * g for a, g in zip(correction, score(v), strict=True)]
        total = [b - c for b, c in zip(base, correction, strict=True)]
        rows.append((base, correction, total, second - sum(b * b for b in base), head_q, head_p, rho))
    return rows


CASES = [  # (sampling filter, replay, K)
    ({}, False, 1),
    ({}, False, 3),
    ({}, False, 6),
    ({"top_k": 3}, True, 3),
    ({"top_k": 3}, True, 5),
    ({"top_p": 0.7}, True, 6),
]


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
@pytest.mark.parametrize("sampling, replay, k", CASES)
def test_enumeration_matches_the_float64_loop_reference(spec, sampling, replay, k):
    log_q = sampler_logprobs(SAMPLER, **sampling)
    effect = position_effect(TRAINER, log_q, num_candidates=k, spec=spec, sampler_replay=replay)
    expected = reference(TRAINER, log_q, k, spec, replay)
    for name, index in (("base", 0), ("correction", 1), ("total", 2)):
        want = torch.tensor([row[index] for row in expected], dtype=torch.float64)
        torch.testing.assert_close(getattr(effect, name), want, rtol=0, atol=1e-12, msg=name)
    for name, index in (("variance", 3), ("head_mass", 4), ("train_head_mass", 5), ("rho", 6)):
        want = torch.tensor([row[index] for row in expected], dtype=torch.float64)
        # rho: a head of the whole vocabulary leaves tails of float64 rounding (1e-16) over the floor 1e-6
        atol = 1e-9 if name == "rho" else 1e-12
        torch.testing.assert_close(getattr(effect, name), want, rtol=1e-12, atol=atol, msg=name)


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    log_q = sampler_logprobs(SAMPLER, top_p=0.7)
    for row, logits in zip(log_q, SAMPLER, strict=True):
        probs = logits.softmax(-1).sort(descending=True).values
        size = int((probs.cumsum(0) < 0.7).sum()) + 1
        assert int(torch.isfinite(row).sum()) == size
        assert float(row.exp().sum()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
@pytest.mark.parametrize(
    "sampling, replay, k", [({"top_k": 3}, True, 3), ({"top_k": 3}, True, 6), ({}, False, 6)]
)
def test_bias_is_zero_where_the_head_covers_the_samplers_support(spec, sampling, replay, k):
    """Top-k sampling under replay with K >= the kept set, or K = V: the correction is exact in every mode."""
    log_q = sampler_logprobs(SAMPLER, **sampling)
    summary = summarize(position_effect(TRAINER, log_q, num_candidates=k, spec=spec, sampler_replay=replay))
    assert summary.bias < 1e-14
    if spec.mode == "off":  # what it cancels is not small: the mismatch's own expected gradient
        assert summary.base_bias > 0.1
        assert summary.head_mass == pytest.approx(1.0, abs=1e-12)


def test_bias_is_zero_when_the_samplers_tail_is_rho_times_the_trainers():
    """K < V, IS off: exact when the sampler's tail is exactly the trainer's scaled by rho (the modelled tail)."""
    p = TRAINER[:1].softmax(-1)
    q = p.clone()
    q[0, :2] = torch.tensor(
        [0.2, 0.5], dtype=torch.float64
    )  # the head (the two most likely under q) disagrees with p
    q[0, 2:] = p[0, 2:] * (0.3 / float(p[0, 2:].sum()))  # the tail is p's, rescaled
    effect = position_effect(TRAINER[:1], q.log(), num_candidates=2, spec=SPECS[0], sampler_replay=False)
    summary = summarize(effect)
    assert summary.bias < 1e-14 and summary.base_bias > 0.1
    assert summary.rho == pytest.approx(0.3 / float(p[0, 2:].sum()), rel=1e-12)


def test_bias_with_a_short_head_under_a_mismatch():
    """IS off under the mismatch: the uncorrected term keeps E_q[grad log p] = q - p; a short head corrects it
    only partly; untruncated IS needs no correction (its base term is already unbiased, C = 0)."""
    log_q = sampler_logprobs(SAMPLER)
    off = [summarize(position_effect(TRAINER, log_q, num_candidates=k, spec=SPECS[0], sampler_replay=False))
           for k in (1, 3, 6)]  # fmt: skip
    want = (log_q.exp() - TRAINER.softmax(-1)).norm(dim=-1).mean()
    assert off[0].base_bias == pytest.approx(float(want), rel=1e-12)
    assert off[0].bias > 0.05 and off[1].bias > 0.01
    assert off[0].bias < off[0].base_bias and off[2].bias < 1e-14
    untruncated = summarize(
        position_effect(TRAINER, log_q, num_candidates=3, spec=SPECS[1], sampler_replay=False)
    )
    assert untruncated.base_bias < 1e-15 and untruncated.bias < 1e-15 and untruncated.correction_abs == 0.0


def test_the_correction_leaves_the_variance_unchanged_and_kl_is_measured():
    """C's gradient is the same vector whatever token is drawn, so the variance depends on the mode only."""
    log_q = sampler_logprobs(SAMPLER)
    tis = [summarize(position_effect(TRAINER, log_q, num_candidates=k, spec=SPECS[2], sampler_replay=False))
           for k in (1, 6)]  # fmt: skip
    assert tis[0].bias != pytest.approx(tis[1].bias)
    assert tis[0].variance == pytest.approx(tis[1].variance, rel=1e-12) and tis[0].variance > 0.1
    kl = (log_q.exp() * (log_q - TRAINER.log_softmax(-1))).sum(-1).mean()
    assert mean_kl(log_q, TRAINER, sampler_replay=False) == pytest.approx(float(kl), rel=1e-12)


def test_replay_needs_the_kept_set_in_the_head():
    with pytest.raises(ValueError, match="kept set must fit"):
        position_effect(
            TRAINER, sampler_logprobs(SAMPLER, top_k=4), num_candidates=3, spec=SPECS[0], sampler_replay=True
        )


def test_top_k_keeps_exactly_k_ids_even_with_ties():
    tied = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.5, 2.0]], dtype=torch.float64)
    log_q = sampler_logprobs(tied, top_k=3)
    assert int(torch.isfinite(log_q).sum()) == 3 and bool(torch.isfinite(log_q[0, 1]))
    assert float(log_q.exp().sum()) == pytest.approx(1.0, abs=1e-12)
