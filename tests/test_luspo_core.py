"""Core LUSPO loss (docs/reference/luspo.md §4.1): values, gradients, split invariance, against a float64 loop reference."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_length_plugin.losses.luspo import luspo_loss


def reference_loss(log_prob, old_log_prob, advantages, mask, low, high, num_sequences, per_length=True):
    """Obviously correct float64 loop: (1/N) sum_i w_i l_i, w_i = |y_i| (LUSPO) or 1 (GSPO).

    s_i carries its full gradient here (exp of the mean log-ratio), unlike the core's per-token form.
    """
    total = torch.zeros((), dtype=torch.float64)
    for i in range(log_prob.shape[0]):
        tokens = [t for t in range(log_prob.shape[1]) if mask[i, t]]
        if not tokens:
            continue
        log_ratio = sum(log_prob[i, t] - old_log_prob[i, t] for t in tokens) / len(tokens)
        s = torch.exp(log_ratio)
        a = float(advantages[i])
        l_i = -torch.minimum(s * a, torch.clamp(s, 1 - low, 1 + high) * a)
        total = total + (len(tokens) if per_length else 1) * l_i
    return total / num_sequences


def random_batch(batch, length, seed, spread=0.05):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=g, dtype=torch.float64) * 3
    log_prob = (old + spread * torch.randn(batch, length, generator=g, dtype=torch.float64)).requires_grad_()
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    advantages = torch.randn(batch, generator=g, dtype=torch.float64)
    return log_prob, old, advantages, mask


def grad_of(loss, tensor):
    return torch.autograd.grad(loss, tensor)[0]


def test_hand_computed_value_and_metrics():
    # seq 0: s = 1, A = 2, |y| = 3 -> l = -2, |y| l = -6
    # seq 1: s = 2, A = -1, |y| = 2, clip(2) = 1.5 -> l = -min(-2, -1.5) = 2, |y| l = 4 (unclipped branch)
    # seq 2: s = 2, A = +1, |y| = 1 -> l = -min(2, 1.5) = -1.5 (clipped high), |y| l = -1.5
    ln2 = math.log(2.0)
    old = torch.zeros(3, 3, dtype=torch.float64)
    log_prob = torch.tensor([[0.0, 0.0, 0.0], [ln2, ln2, 9.0], [ln2, 7.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    advantages = torch.tensor([2.0, -1.0, 1.0], dtype=torch.float64)
    loss, metrics = luspo_loss(log_prob, old, advantages, mask, 0.5, 0.5)
    assert loss.item() == pytest.approx((-6 + 4 - 1.5) / 3, abs=1e-12)
    assert metrics["luspo/clip_frac_high"].item() == pytest.approx(1 / 3)
    assert metrics["luspo/clip_frac_low"].item() == 0.0
    assert metrics["luspo/seq_ratio_mean"].item() == pytest.approx((1 + 2 + 2) / 3)
    loss4, _ = luspo_loss(log_prob, old, advantages, mask, 0.5, 0.5, num_sequences=4)
    assert loss4.item() == pytest.approx((-6 + 4 - 1.5) / 4, abs=1e-12)


def test_low_clip_metric_and_zero_gradient_below_range():
    # s = 0.5 < 1 - 0.2 with A < 0: the clipped branch -A * 0.8 wins, no gradient
    old = torch.zeros(1, 2, dtype=torch.float64)
    log_prob = torch.full((1, 2), math.log(0.5), dtype=torch.float64, requires_grad=True)
    loss, metrics = luspo_loss(
        log_prob, old, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 2), 0.2, 0.2
    )
    assert loss.item() == pytest.approx(2 * 0.8)
    assert metrics["luspo/clip_frac_low"].item() == 1.0
    assert torch.count_nonzero(grad_of(loss, log_prob)) == 0


def test_per_token_gradient_is_s_times_advantage_unclipped():
    """d loss / d log pi_t = -s_i A_i / N on every valid token; GSPO's is that divided by |y_i|."""
    log_prob, old, advantages, mask = random_batch(6, 7, seed=1, spread=0.01)
    n = 6
    loss, _ = luspo_loss(log_prob, old, advantages, mask, 10.0, 10.0)  # range wide enough: nothing clipped
    grad = grad_of(loss, log_prob)
    lengths = mask.sum(-1)
    s = torch.exp(((log_prob - old) * mask).sum(-1) / lengths).detach()
    expected = (-s * advantages / n).unsqueeze(-1) * mask
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-14)

    gspo = grad_of(reference_loss(log_prob, old, advantages, mask, 10.0, 10.0, n, per_length=False), log_prob)
    torch.testing.assert_close(gspo, expected / lengths.unsqueeze(-1), rtol=1e-12, atol=1e-14)


def test_clipped_sequences_get_no_gradient():
    log_prob, old, advantages, mask = random_batch(8, 5, seed=2, spread=0.5)
    low, high = 2e-3, 2.5e-3
    loss, _ = luspo_loss(log_prob, old, advantages, mask, low, high)
    grad = grad_of(loss, log_prob)
    s = torch.exp(((log_prob - old) * mask).sum(-1) / mask.sum(-1)).detach()
    clipped = ((s > 1 + high) & (advantages > 0)) | ((s < 1 - low) & (advantages < 0))
    assert clipped.any() and (~clipped).any()
    assert torch.count_nonzero(grad[clipped]) == 0
    expected = (-s * advantages / 8).unsqueeze(-1) * mask
    torch.testing.assert_close(grad[~clipped], expected[~clipped], rtol=1e-12, atol=1e-14)


def test_token_weights_act_on_their_own_token():
    """Per-token weights (verl rollout_is_weights) multiply each token's term, as in verl's GSPO."""
    log_prob, old, advantages, mask = random_batch(4, 6, seed=3, spread=0.01)
    weights = torch.rand(4, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 0.5
    loss, _ = luspo_loss(log_prob, old, advantages, mask, 10.0, 10.0, token_weights=weights)
    s = torch.exp(((log_prob - old) * mask).sum(-1) / mask.sum(-1)).detach()
    value = ((-s * advantages).unsqueeze(-1) * weights * mask).sum() / 4
    assert loss.item() == pytest.approx(value.item(), rel=1e-12)
    expected = (-s * advantages / 4).unsqueeze(-1) * weights * mask
    torch.testing.assert_close(grad_of(loss, log_prob), expected, rtol=1e-12, atol=1e-14)


def test_per_token_advantages_equal_per_sequence_advantages():
    log_prob, old, advantages, mask = random_batch(5, 4, seed=4, spread=0.3)
    a, _ = luspo_loss(log_prob, old, advantages, mask, 0.1, 0.2)
    b, _ = luspo_loss(log_prob, old, advantages.unsqueeze(-1).expand(5, 4), mask, 0.1, 0.2)
    assert a.item() == pytest.approx(b.item(), rel=1e-12)


def test_empty_rows_count_in_default_denominator_only():
    log_prob, old, advantages, mask = random_batch(3, 4, seed=5)
    mask = mask.clone()
    mask[1] = False
    loss, metrics = luspo_loss(log_prob, old, advantages, mask, 0.2, 0.2)
    ref = reference_loss(log_prob, old, advantages, mask, 0.2, 0.2, 3)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)
    assert torch.isfinite(metrics["luspo/seq_ratio_mean"])


@pytest.mark.parametrize("count", [0, -1, float("inf"), float("nan")])
def test_rejects_a_sequence_count_that_is_not_finite_and_positive(count):
    """Issue 42: ``num_sequences=inf`` gave a loss of 0 and no gradient, silently."""
    log_prob, old, advantages, mask = random_batch(2, 3, seed=6)
    with pytest.raises(ValueError, match=r"num_sequences must be a finite number above 0, got"):
        luspo_loss(log_prob, old, advantages, mask, 0.2, 0.2, num_sequences=count)


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 6),
    length=st.integers(1, 6),
    seed=st.integers(0, 10_000),
    spread=st.sampled_from([1e-3, 0.05, 0.5]),
    low=st.sampled_from([2e-3, 0.2]),
    high=st.sampled_from([2.5e-3, 0.28]),
    num_sequences=st.sampled_from([None, 1, 7.5]),
)
def test_matches_float64_loop_reference(batch, length, seed, spread, low, high, num_sequences):
    log_prob, old, advantages, mask = random_batch(batch, length, seed, spread)
    loss, _ = luspo_loss(log_prob, old, advantages, mask, low, high, num_sequences=num_sequences)
    ref = reference_loss(log_prob, old, advantages, mask, low, high, num_sequences or batch)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-10, abs=1e-12)
    torch.testing.assert_close(grad_of(loss, log_prob), grad_of(ref, log_prob), rtol=1e-9, atol=1e-12)


class TinyPolicy(torch.nn.Module):
    """A token-level policy small enough to differentiate exactly in float64."""

    def __init__(self, vocab=11, hidden=5):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab, hidden, dtype=torch.float64)
        self.head = torch.nn.Linear(hidden, vocab, dtype=torch.float64)

    def log_prob(self, tokens):
        logits = self.head(torch.tanh(self.embed(tokens)))
        return torch.log_softmax(logits, -1).gather(-1, tokens.roll(-1, dims=1).unsqueeze(-1)).squeeze(-1)


def split_batch():
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 11, (8, 9), generator=g)
    lengths = torch.tensor([9, 1, 4, 7, 2, 9, 5, 3])
    mask = torch.arange(9).unsqueeze(0) < lengths.unsqueeze(1)
    policy = TinyPolicy()
    with torch.no_grad():
        old = policy.log_prob(tokens) + 0.003 * torch.randn(8, 9, generator=g, dtype=torch.float64)
    advantages = torch.randn(8, generator=g, dtype=torch.float64)
    return policy, tokens, old, advantages, mask


def accumulated_gradient(policy, tokens, old, advantages, mask, rows, num_sequences):
    """Sum of the gradients of the micro-batches ``rows`` (lists of row indices), like gradient accumulation."""
    policy.zero_grad()
    for idx in rows:
        idx = torch.tensor(idx)
        loss, _ = luspo_loss(
            policy.log_prob(tokens[idx]), old[idx], advantages[idx], mask[idx], 2e-3, 2.5e-3, num_sequences
        )
        loss.backward()
    return [p.grad.clone() for p in policy.parameters()]


@pytest.mark.parametrize("micro_batches", [1, 2, 4])
def test_micro_batch_split_invariance(micro_batches):
    policy, tokens, old, advantages, mask = split_batch()
    full = accumulated_gradient(policy, tokens, old, advantages, mask, [list(range(8))], 8)
    rows = [list(r) for r in torch.arange(8).chunk(micro_batches)]
    split = accumulated_gradient(policy, tokens, old, advantages, mask, rows, 8)
    for a, b in zip(full, split, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert any(g.abs().max() > 1e-3 for g in full)


def test_data_parallel_split_invariance():
    """Two simulated ranks, each with its own micro-batches and N_seq / dp_size, gradients averaged (as DDP/FSDP)."""
    policy, tokens, old, advantages, mask = split_batch()
    full = accumulated_gradient(policy, tokens, old, advantages, mask, [list(range(8))], 8)
    dp_size = 2
    rank0 = accumulated_gradient(policy, tokens, old, advantages, mask, [[5, 0, 3], [7]], 8 / dp_size)
    rank1 = accumulated_gradient(policy, tokens, old, advantages, mask, [[1, 2], [4, 6]], 8 / dp_size)
    for a, b, c in zip(full, rank0, rank1, strict=True):
        torch.testing.assert_close(a, (b + c) / dp_size, rtol=0, atol=1e-6)


def test_core_imports_without_hosts():
    """docs/reference/product.md §1.2: the core needs only torch (trl, verl, transformers blocked from importing)."""
    code = (
        "import sys\n"
        "for name in ('trl', 'verl', 'transformers', 'vllm'): sys.modules[name] = None\n"
        "from trl_length_plugin.losses.luspo import luspo_loss\n"
        "from trl_length_plugin.losses import luspo_loss as again\n"
        "assert luspo_loss is again\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
