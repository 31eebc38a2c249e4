"""The loss of bench/bench_score_centering_training.py against a float64 loop over tokens written from the
table of docs/reference/score-centering.md §5.5 (values and gradients), and its table of paired differences."""

import math

import pytest
import torch

from bench import bench_score_centering_training as bench


def reference_loss(logits, sampler_logprobs, tokens, mask, advantages, arm, k):
    """Token-mean of -A w(r) log p(y) (+ A C), one position at a time, C from the table (§5.5)."""
    total, count = 0.0, 0
    log_p_all = logits.log_softmax(-1)
    for b in range(tokens.shape[0]):
        for t in range(tokens.shape[1]):
            if not mask[b, t]:
                continue
            log_p, log_q, y, a = log_p_all[b, t], sampler_logprobs[b, t], tokens[b, t], advantages[b]
            r = math.exp(log_p[y].item() - log_q[y].item())
            if arm.mode == "off":
                w = 1.0
            elif arm.mode == "tis":
                w = min(max(r, arm.bounds[0]), arm.bounds[1])
            else:
                w = r if arm.bounds[0] <= r <= arm.bounds[1] else 0.0
            term = -a * w * log_p[y]
            if arm.centering:
                head = sorted(range(len(log_q)), key=lambda v: -log_q[v].item())[:k]
                q = {v: math.exp(log_q[v].item()) for v in head}
                p = {v: math.exp(log_p[v].item()) for v in head}
                rho = max(1 - sum(q.values()), 0.0) / max(1 - sum(p.values()), 1e-6)
                correction = 0.0
                for v in head:
                    if arm.mode == "off":
                        m, alpha = q[v], rho
                    elif arm.mode == "tis":
                        lo, hi = arm.bounds
                        m, alpha = min(max(p[v], lo * q[v]), hi * q[v]), min(max(1.0, lo * rho), hi * rho)
                    else:
                        lo, hi = arm.bounds
                        m = p[v] if lo <= p[v] / q[v] <= hi else 0.0
                        alpha = 1.0 if rho > 0 and lo <= 1 / rho <= hi else 0.0
                    correction = correction + (m - alpha * p[v]) * log_p[v]
                term = term + a * correction
            total, count = total + term, count + 1
    return total / count


@pytest.mark.parametrize("arm", bench.ARMS, ids=lambda arm: arm.name)
def test_arm_loss_matches_the_loop_reference_with_gradients(arm):
    generator = torch.Generator().manual_seed(3)
    batch, width, vocab, k = 3, 4, 12, 5
    logits = torch.randn(batch, width, vocab, generator=generator, dtype=torch.float64)
    sampler_logits = logits + 0.7 * torch.randn(batch, width, vocab, generator=generator, dtype=torch.float64)
    sampler_logprobs = sampler_logits.log_softmax(-1)
    tokens = torch.randint(0, vocab, (batch, width), generator=generator)
    mask = torch.tensor([[True, True, True, False], [True, True, False, False], [True, True, True, True]])
    advantages = torch.tensor([1.3, -0.4, 0.0], dtype=torch.float64)

    mine = logits.clone().requires_grad_(True)
    loss, ratio = bench.arm_loss(mine.log_softmax(-1), sampler_logprobs, tokens, mask, advantages, arm, k)
    loss.backward()
    theirs = logits.clone().requires_grad_(True)
    expected = reference_loss(theirs, sampler_logprobs, tokens, mask, advantages, arm, k)
    expected.backward()

    torch.testing.assert_close(loss, expected.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-10, atol=1e-12)
    log_p = logits.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    log_q = sampler_logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(ratio, torch.where(mask, (log_p - log_q).exp(), 0.0))


def test_centering_changes_the_gradient_only_where_the_sampler_differs():
    """On-policy (sampler = trainer) the correction's gradient is exactly that of a constant: with the head
    covering the vocabulary, C = sum_v (q - rho p) log p with rho = 0 and q = p, whose gradient is
    sum_v p grad log p = 0, so the centered and plain losses have one gradient."""
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 3, 6, generator=generator, dtype=torch.float64)
    tokens = torch.randint(0, 6, (2, 3), generator=generator)
    mask = torch.ones(2, 3, dtype=torch.bool)
    advantages = torch.tensor([0.8, -1.1], dtype=torch.float64)
    grads = []
    for arm in (bench.ARMS[0], bench.ARMS[3]):
        mine = logits.clone().requires_grad_(True)
        loss, _ = bench.arm_loss(
            mine.log_softmax(-1), logits.log_softmax(-1), tokens, mask, advantages, arm, k=6
        )
        loss.backward()
        grads.append(mine.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-12)


def test_group_advantages_are_trls_scale():
    rewards = torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 1] + [1.0] * 8)
    advantages = bench.group_advantages(rewards)
    std = torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 1]).std()
    torch.testing.assert_close(advantages[:8], (rewards[:8] - 0.25) / (std + 1e-4))
    assert advantages[8:].abs().max() == 0


def record(arm: str, seed: int, accuracy: float, length: float, kl: float) -> dict:
    curve = [dict(step=1, accuracy=accuracy, ratio_std=0.1, sampler_kl=0.01)]
    return dict(
        arm=arm,
        seed=seed,
        eval=dict(accuracy=accuracy, length=length, kl_to_warm=kl),
        train=dict(ratio_std=0.1, ratio_outside=0.01, sampler_kl=0.001),
        curve=curve,
    )


def test_tables_pair_each_arm_with_no_correction_and_each_centered_arm_with_its_base(tmp_path):
    names = [arm.name for arm in bench.ARMS]
    records = [
        record(name, seed, 0.5 + 0.01 * i + 0.001 * seed, 25.0 - i, 0.002)
        for i, name in enumerate(names)
        for seed in range(5)
    ]
    table = bench.tables(records, list(bench.ARMS))
    assert (
        "| centering tis − no correction | 5 | +4.00 [+4.00, +4.00] | -4.00 [-4.00, -4.00] | +0.00" in table
    )
    assert "| centering tis − tis | 5 | +3.00 [+3.00, +3.00]" in table
    assert "| centering icepop − icepop | 5 |" in table
    assert table.count(" − ") == len(names) - 1 + 2  # vs no correction, then two more centering pairs
    assert bench.plot(records, list(bench.ARMS), tmp_path / "curves.png").stat().st_size > 0
