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


def test_per_channel_quantization_by_hand_and_against_a_loop():
    from bench.samplers import quantize_per_channel

    weight = torch.tensor([[7.0, -3.5, 1.2, 0.0], [0.0, 0.0, 0.0, 0.0], [0.5, 0.25, -0.1, 0.3]])
    quantized = quantize_per_channel(weight, 4)  # 7 levels a side: row 0's scale is 1, row 2's 0.5 / 7
    assert quantized[0].tolist() == [7.0, -4.0, 1.0, 0.0]  # -3.5 rounds half to even
    assert quantized[1].tolist() == [0.0] * 4  # an all-zero row stays zero
    torch.manual_seed(0)
    weight = torch.randn(6, 9, dtype=torch.float64)
    for bits in (4, 8):
        top = 2 ** (bits - 1) - 1
        quantized = quantize_per_channel(weight, bits)
        for row in range(6):
            scale = max(abs(v) for v in weight[row].tolist()) / top
            for col in range(9):
                level = round(weight[row, col].item() / scale)
                assert quantized[row, col].item() == pytest.approx(
                    max(-top, min(top, level)) * scale, abs=1e-12
                )
        assert (quantized - weight).abs().max() <= weight.abs().amax(1).max() / top / 2 + 1e-12
        assert (
            torch.equal(quantize_per_channel(quantized, bits), quantized) or bits == 8
        )  # idempotent at 4 bits


def test_samplers_serve_the_trainer_weights_cast_or_quantized_and_a_tied_embedding_once():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bench.samplers import (
        Sampler,
        load_sampler_weights,
        make_sampler_model,
        parse_sampler,
        quantize_per_channel,
    )

    config = Qwen2Config(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    trainer = Qwen2ForCausalLM(config)
    state = trainer.state_dict()
    for precision in ("fp32", "bf16", "int8", "int4"):
        sampler = make_sampler_model(trainer, Sampler(precision, 0))
        load_sampler_weights(sampler, state, Sampler(precision, 0))
        served = sampler.model.embed_tokens.weight
        assert sampler.lm_head.weight is served  # still tied
        expected = {
            "fp32": state["model.embed_tokens.weight"],
            "bf16": state["model.embed_tokens.weight"].to(torch.bfloat16),
            "int8": quantize_per_channel(state["model.embed_tokens.weight"], 8),
            "int4": quantize_per_channel(state["model.embed_tokens.weight"], 4),
        }[precision]
        assert torch.equal(served, expected)
        up = sampler.model.layers[0].mlp.up_proj.weight
        assert up.dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
    assert trainer.model.embed_tokens.weight.dtype == torch.float32  # the trainer is left as it was
    assert parse_sampler("int4", 2).name == "int4, lag 2"
    for bad, lag in (("int3", 0), ("fp8", 0), ("int8", -1)):
        with pytest.raises(ValueError, match="--sampler|--lag"):
            parse_sampler(bad, lag)


def test_mismatch_figures_against_a_loop():
    torch.manual_seed(1)
    q = torch.randn(2, 3, 5, dtype=torch.float64).log_softmax(-1)
    p = (q + 0.3 * torch.randn(2, 3, 5, dtype=torch.float64)).log_softmax(-1)
    tokens = torch.tensor([[0, 4, 2], [1, 1, 3]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    figures = bench.mismatch(q, p, tokens, mask)
    kls, log_rs = [], []
    for b in range(2):
        for t in range(3):
            if mask[b, t]:
                kls.append(sum(math.exp(q[b, t, v]) * (q[b, t, v] - p[b, t, v]) for v in range(5)).item())
                log_rs.append((p[b, t, tokens[b, t]] - q[b, t, tokens[b, t]]).item())
    ratios = [math.exp(x) for x in log_rs]
    mean = sum(ratios) / len(ratios)
    std = math.sqrt(sum((r - mean) ** 2 for r in ratios) / (len(ratios) - 1))
    assert figures["sampler_kl"] == pytest.approx(sum(kls) / len(kls))
    assert figures["gap"] == pytest.approx(sum(map(abs, log_rs)) / len(log_rs))
    assert figures["ratio_std"] == pytest.approx(std)
    assert figures["ratio_outside"] == pytest.approx(sum(not 0.5 <= r <= 2 for r in ratios) / len(ratios))


def long_record(arm: str, seed: int, accuracies: list[float]) -> dict:
    evals = [
        dict(step=25 * (i + 1), accuracy=a, length=20.0, kl_to_warm=0.01) for i, a in enumerate(accuracies)
    ]
    return {
        **record(arm, seed, accuracies[-1], 20.0, 0.01),
        "evals": evals,
        "train": dict(ratio_std=0.1, ratio_outside=0.01, sampler_kl=0.001, gap=0.03),
        "settings": dict(task="reasoning", sampler="int4", lag=0, k=16, steps=100),
    }


def test_collapse_and_the_trajectory_table_by_hand(tmp_path):
    warm = dict(eval=dict(accuracy=0.45), model="m", weights="w")
    records = [
        long_record("no correction", 0, [0.6, 0.44, 0.3]),  # falls below the warm model's at step 50
        long_record("no correction", 1, [0.6, 0.7, 0.8]),
        long_record("centering tis", 0, [0.6, 0.7, 0.8]),
        long_record("centering tis", 1, [0.6, 0.7, 0.9]),
    ]
    assert [bench.collapse_step(r, 0.45) for r in records] == [50, None, None, None]
    assert bench.accuracy_area(records[0]) == pytest.approx(100 * (0.6 + 0.44 + 0.3) / 3)
    arms = [arm for arm in bench.ARMS if arm.name in ("no correction", "centering tis")]
    table = bench.trajectory_table(records, arms, warm)
    assert "| no correction | 2 | 57.3 | 1 of 2 | 50 | 0.0300 |" in table  # (44.67 + 70) / 2
    assert "| centering tis − no correction | 2 | +14.33 [+3.33, +25.33] | yes |" in table  # 25.33 and 3.33
    summary = bench.write_summary(records, warm, tmp_path / "summary.json")
    png = tmp_path / "curves.png"
    bench.main(["--from-summary", str(summary), "--png", str(png)])
    assert png.stat().st_size > 0
    doc = tmp_path / "doc.md"
    doc.write_text("# head\n<!-- summary.json: begin -->\nold\n<!-- summary.json: end -->\ntail\n")
    for _ in range(2):  # regenerating twice gives the same doc
        bench.main(["--from-summary", str(summary), "--png", str(png), "--doc", str(doc)])
        text = doc.read_text()
        assert "old" not in text and text.startswith("# head\n") and text.endswith("end -->\ntail\n")
        assert "_Generated from `summary.json` (4 runs)._" in text
        assert "| no correction | 2 | 57.3 | 1 of 2 | 50 | 0.0300 |" in text


def test_doc_option_is_checked_before_anything_runs(tmp_path, capsys):
    """``--doc`` without a summary, or naming a doc without the summary's block, is a one-line error at once."""
    with pytest.raises(SystemExit):
        bench.parse_args(["--doc", "docs/score-centering.md"])
    assert "--doc needs --summary or --from-summary" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--measure", "int4", "--summary", "s.json", "--doc", "docs/score-centering.md"])
    assert "--measure runs no grid" in capsys.readouterr().err
    doc = tmp_path / "doc.md"
    doc.write_text("no block\n")
    with pytest.raises(SystemExit, match="has no <!-- runs.json: begin -->"):
        bench.parse_args(["--summary", "x/runs.json", "--doc", str(doc)])


@pytest.mark.slow
def test_an_interrupted_run_resumes_to_the_same_record(tmp_path, monkeypatch):
    """A run stopped after its checkpoint resumes from it and ends as an uninterrupted run does."""
    arm = bench.ARMS[4]  # centering tis
    straight = bench.parse_args(
        ["--sampler", "int4", "--lag", "1", "--steps", "4", "--eval-every", "2", "--eval-samples", "1",
         "--checkpoint-every", "2", "--out", str(tmp_path / "a")]
    )  # fmt: skip
    expected = bench.train_run(arm, 0, straight)
    resumed = bench.parse_args(
        ["--sampler", "int4", "--lag", "1", "--steps", "4", "--eval-every", "2", "--eval-samples", "1",
         "--checkpoint-every", "2", "--out", str(tmp_path / "b")]
    )  # fmt: skip
    calls = []
    real_held_out = bench.held_out

    def stop_after_the_checkpoint(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the final evaluation, after the step-2 checkpoint
            raise KeyboardInterrupt
        return real_held_out(*args, **kwargs)

    monkeypatch.setattr(bench, "held_out", stop_after_the_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        bench.train_run(arm, 0, resumed)
    assert bench.checkpoint_path(tmp_path / "b", arm, 0).exists()
    monkeypatch.setattr(bench, "held_out", real_held_out)
    record = bench.train_run(arm, 0, resumed)
    assert not bench.checkpoint_path(tmp_path / "b", arm, 0).exists()
    assert record["curve"] == expected["curve"] and record["evals"] == expected["evals"]
