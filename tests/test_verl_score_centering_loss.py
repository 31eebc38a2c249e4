"""The score-centering actor loss through verl 0.9.1's real call sites (docs/reference/score-centering.md
§5.1, §5.5-§5.7): the logits processor the engine calls on the packed micro-batch, verl's worker
``ppo_loss`` with ``loss_mode=score_centering`` (the registered wrapper around the base loss), verl's
``agg_loss`` normalization and its rollout-correction weights.

The logits are a float64 leaf standing in for the model (the engine's forward on a real model is in
test_verl_score_centering_actor.py); every verl part is real. References are computed independently, per
row from full log-softmaxes in padded layout: values and gradients, each mode with three base losses, the
micro-batch and data-parallel splits, the metrics and the adaptive-ppo-clip counts.
"""

from __future__ import annotations

import math

import pytest
import torch

verl = pytest.importorskip("verl")

from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights  # noqa: E402

from tests.verl_score_centering_helpers import (  # noqa: E402
    MODES,
    make_rollouts,
    micro_batch,
    packed_logits,
    reference_layout,
    reference_loss,
    settings_and_actor,
)
from trl_length_plugin.score_centering.estimator import METRIC_KEYS  # noqa: E402
from verl_adapter.score_centering.config import BASE_LOSS_AGGREGATION  # noqa: E402
from verl_adapter.score_centering.loss import (  # noqa: E402
    CLIPPED,
    CORRECTION,
    POSITIVE,
    head_outputs,
    score_centering_ppo_loss,
)

V, K = 23, 4
PROMPT_LENS, RESPONSE_LENS = [3, 2, 4, 2], [5, 1, 3, 4]
BASES = {
    "vanilla": [],
    "cispo": ["actor_rollout_ref.actor.policy_loss.loss_mode=cispo", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum"],
    "sapo": ["actor_rollout_ref.actor.policy_loss.loss_mode=sapo"],  # its own seq-mean-token-mean
}  # fmt: skip


def verl_weights(rollouts, overrides):
    """What verl's advantage step stores as ``rollout_is_weights`` for the mode (None when it stores none)."""
    threshold = {"tis": 1.5, "icepop": "0.8_1.25"}.get(
        next((m for m, o in MODES.items() if o == overrides), None)
    )
    if threshold is None:
        return None
    pad = lambda values: torch.nn.utils.rnn.pad_sequence(values, batch_first=True)  # noqa: E731
    mask = pad(rollouts.response_mask)
    weights, _ = compute_rollout_correction_weights(
        pad(rollouts.old_log_probs) - pad(rollouts.rollout_log_probs), mask, rollout_is="token",
        rollout_is_threshold=threshold,
    )  # fmt: skip
    return [row[: len(r)] for row, r in zip(weights, rollouts.responses, strict=True)]


def sapo_gate_at_ratio_one(advantages, config):
    """SAPO's per-token loss at ratio 1: -A * sigmoid(0) * 4 / tau, tau by the sign of A."""
    tau = torch.where(
        advantages > 0,
        torch.tensor(config.tau_pos, dtype=torch.float64),
        torch.tensor(config.tau_neg, dtype=torch.float64),
    )
    return -advantages * 2.0 / tau


def engine_output(data, logits, settings):
    """What verl's engine does with the hook: call it on (1, tokens, V) logits, nest every output by sequence."""
    outputs = head_outputs(logits.unsqueeze(0), data, settings)
    offsets = data["input_ids"].offsets()
    return {
        key: torch.nested.nested_tensor_from_jagged(value.squeeze(0), offsets)
        for key, value in outputs.items()
    }


def run(settings, actor, rollouts, logits, shards, weights=None, adaptive_k=None, dp_size=1):
    """Losses summed over each rank's micro-batches, gradients averaged over ranks (verl's FSDP engine)."""
    grads, total, metrics = torch.zeros_like(logits), 0.0, []
    for rank in shards:
        rank_grad = torch.zeros_like(logits)
        for rows in rank:
            leaf = packed_logits(rollouts, rows, logits).detach().requires_grad_(True)
            data = micro_batch(
                rollouts, rows, dp_size=dp_size, rollout_is_weights=weights, adaptive_k=adaptive_k
            )
            loss, step = score_centering_ppo_loss(
                actor, settings, model_output=engine_output(data, leaf, settings), data=data
            )
            loss.backward()
            total += loss.item() / dp_size
            metrics.append(step)
            starts = [0, *torch.tensor(rollouts.lengths).cumsum(0).tolist()]
            offset = 0
            for i in rows:
                n = starts[i + 1] - starts[i]
                rank_grad[starts[i] : starts[i + 1]] += leaf.grad[offset : offset + n]
                offset += n
        grads += rank_grad / dp_size
    return total, grads, metrics


def reference(settings, actor, rollouts, logits, weights=None, k=0.0):
    """``reference_loss`` on a float64 leaf: the loss, its gradient, C and the padded layout."""
    leaf = logits.detach().requires_grad_(True)
    loss, term, ref = reference_loss(settings, actor, rollouts, leaf, weights, k)
    loss.backward()
    return loss.item(), leaf.grad, term, ref


@pytest.mark.parametrize("base", list(BASES))
@pytest.mark.parametrize("mode", list(MODES))
def test_each_mode_and_base_loss_equals_the_reference(mode, base):
    """Values and gradients through verl's call site equal the per-row float64 reference."""
    settings, actor, _ = settings_and_actor(MODES[mode] + BASES[base])
    assert (settings.mode, settings.base_loss_mode) == (mode, base)
    rollouts = make_rollouts(PROMPT_LENS, RESPONSE_LENS, V, K, seed=1)
    logits = (
        torch.randn(sum(rollouts.lengths), V, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        * 2
    )
    weights = verl_weights(rollouts, MODES[mode])
    k = 0.1 if mode == "adaptive-ppo-clip" else None
    loss, grads, _ = run(settings, actor, rollouts, logits, [[[0, 1, 2, 3]]], weights, adaptive_k=k)
    ref_loss, ref_grads, term, _ = reference(settings, actor, rollouts, logits, weights, k or 0.0)
    assert loss == pytest.approx(ref_loss, rel=1e-10, abs=1e-12)
    torch.testing.assert_close(grads, ref_grads, rtol=1e-9, atol=1e-12)
    if mode == "is":
        assert not term.correction.any()
    elif mode == "off":
        assert term.correction.abs().sum() > 0


def test_hand_computed_off_mode_on_one_token():
    """One generated token, K = 1, token-mean vanilla with equal old and current logprobs (ratio 1):
    loss = -A + A * C with C = (q - rho p) log p, rho = (1 - q) / (1 - p)."""
    settings, actor, _ = settings_and_actor([])
    rollouts = make_rollouts([1], [1], 3, 1, seed=0)
    rollouts.prompts[0], rollouts.responses[0] = torch.tensor([0]), torch.tensor([2])
    rollouts.sampler_ids[0] = torch.tensor([[0], [1]], dtype=torch.int32)
    rollouts.sampler_logprobs[0] = torch.tensor([[0.0], [math.log(0.5)]])
    logits = torch.tensor([[0.0, math.log(2.0), 0.0], [5.0, 5.0, 5.0]], dtype=torch.float64)  # row 0 predicts
    p, q = 0.5, 0.5
    rollouts.old_log_probs[0] = torch.tensor([math.log(0.25)], dtype=torch.float64)  # p(token 2) = 1 / 4
    rollouts.rollout_log_probs[0] = rollouts.old_log_probs[0].clone()
    rollouts.advantages[0] = torch.tensor([2.0], dtype=torch.float64)
    rho = (1 - q) / (1 - p)
    correction = (q - rho * p) * math.log(p)
    loss, _, _ = run(settings, actor, rollouts, logits, [[[0]]])
    assert correction == 0.0 and loss == pytest.approx(-2.0)
    rollouts.sampler_logprobs[0] = torch.tensor([[0.0], [math.log(0.8)]])
    q = math.exp(rollouts.sampler_logprobs[0][1, 0].item())  # 0.8 as the float32 capture holds it
    rho = (1 - q) / (1 - p)
    correction = (q - rho * p) * math.log(p)
    loss, grads, _ = run(settings, actor, rollouts, logits, [[[0]]])
    assert loss == pytest.approx(-2.0 + 2.0 * correction, rel=1e-12)
    # d/dz_j of A * (m - alpha p) log p_1 at z: A (q - rho p) (onehot(1) - p_row), plus the base -A dlog p_2
    p_row = torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64)
    expected = 2.0 * (q - rho * p) * (torch.tensor([0.0, 1.0, 0.0]) - p_row) - 2.0 * (
        torch.tensor([0.0, 0.0, 1.0]) - p_row
    )
    torch.testing.assert_close(grads[0], expected.double())
    assert not grads[1].any()


def test_micro_batch_and_data_parallel_splits_match_the_full_batch():
    """verl's global normalization makes the sum of micro-batch losses (and the DP-averaged gradient) the
    full batch's, for A * C too; the metrics' SUM shares add up to the full batch's means."""
    for base in ("vanilla", "cispo"):
        settings, actor, _ = settings_and_actor(MODES["tis"] + BASES[base])
        rollouts = make_rollouts(PROMPT_LENS, RESPONSE_LENS, V, K, seed=3)
        logits = torch.randn(
            sum(rollouts.lengths), V, dtype=torch.float64, generator=torch.Generator().manual_seed(4)
        )
        weights = verl_weights(rollouts, MODES["tis"])
        full_loss, full, full_metrics = run(settings, actor, rollouts, logits, [[[0, 1, 2, 3]]], weights)
        micro_loss, micro, micro_metrics = run(
            settings, actor, rollouts, logits, [[[0, 2], [1], [3]]], weights
        )
        dp_loss, dp, dp_metrics = run(
            settings, actor, rollouts, logits, [[[3], [0]], [[1], [2]]], weights, dp_size=2
        )
        assert micro_loss == pytest.approx(full_loss, rel=1e-10) and dp_loss == pytest.approx(
            full_loss, rel=1e-10
        )
        torch.testing.assert_close(micro, full, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(dp, full, rtol=1e-9, atol=1e-12)
        for key in METRIC_KEYS:
            whole = full_metrics[0][key].aggregate()
            assert sum(m[key].aggregate() for m in micro_metrics) == pytest.approx(whole, rel=1e-9)
            assert sum(m[key].aggregate() for m in dp_metrics) / 2 == pytest.approx(whole, rel=1e-9)


def test_metrics_are_the_core_means_over_the_batch():
    settings, actor, _ = settings_and_actor(MODES["icepop"])
    rollouts = make_rollouts(PROMPT_LENS, RESPONSE_LENS, V, K, seed=5)
    logits = torch.randn(
        sum(rollouts.lengths), V, dtype=torch.float64, generator=torch.Generator().manual_seed(6)
    )
    weights = verl_weights(rollouts, MODES["icepop"])
    _, _, metrics = run(settings, actor, rollouts, logits, [[[0, 1, 2, 3]]], weights)
    _, _, term, ref = reference(settings, actor, rollouts, logits, weights)
    mask = ref["mask"]
    p, q = ref["head"].detach().exp(), ref["sampler"].exp()
    rho = (1 - q.sum(-1)).clamp(min=0) / (1 - p.sum(-1)).clamp(min=1e-6)
    expected = {
        "score_centering/head_mass": q.sum(-1),
        "score_centering/train_head_mass": p.sum(-1),
        "score_centering/rho_mean": rho,
        "score_centering/correction_abs_mean": term.correction.detach().abs(),
    }
    for key, values in expected.items():
        assert metrics[0][key].aggregate() == pytest.approx(float(values[mask].mean()), rel=1e-6)
    assert 0 < metrics[0]["score_centering/head_mass"].aggregate() <= 1.0001


def test_adaptive_counts_are_the_global_clipped_fraction():
    """The SUM shares of (clipped, positive) give f = tokens with A > 0 above hi + k over tokens with A > 0,
    with r = current / rollout (detached), over the whole batch across micro-batches."""
    settings, actor, _ = settings_and_actor(MODES["adaptive-ppo-clip"])
    rollouts = make_rollouts(PROMPT_LENS, RESPONSE_LENS, V, K, seed=7)
    logits = torch.randn(
        sum(rollouts.lengths), V, dtype=torch.float64, generator=torch.Generator().manual_seed(8)
    )
    k = 0.05
    _, _, metrics = run(settings, actor, rollouts, logits, [[[0, 3], [1, 2]]], adaptive_k=k)
    ref = reference_layout(rollouts, logits)
    ratio = (ref["sampled"] - ref["rollout"]).exp()
    positive = ref["mask"] & (ref["advantages"] > 0)
    clipped = positive & (ratio > settings.bounds[1] + k)
    f = sum(m[CLIPPED].aggregate() for m in metrics) / sum(m[POSITIVE].aggregate() for m in metrics)
    assert positive.any() and f == pytest.approx(float(clipped.sum() / positive.sum()), rel=1e-9)


@pytest.mark.parametrize(
    ("name", "per_token"),
    [
        ("vanilla", lambda a, lp, cfg: -a),
        ("sapo", lambda a, lp, cfg: sapo_gate_at_ratio_one(a, cfg)),
        ("gpg", lambda a, lp, cfg: -lp * a),
    ],
)
def test_aggregation_table_is_each_base_losss_own(name, per_token):
    """At ratio 1 each base's per-token loss is known; verl's loss equals agg_loss of it with the mode
    BASE_LOSS_AGGREGATION names (the actor's loss_agg_mode where None), so A * C is aggregated the same way."""
    _, actor, _ = settings_and_actor([f"actor_rollout_ref.actor.policy_loss.loss_mode={name}"])
    g = torch.Generator().manual_seed(9)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    advantages = torch.randn(3, 1, generator=g, dtype=torch.float64).expand(3, 4) * mask
    log_prob = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        actor.global_batch_info.update(
            dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=3, loss_scale_factor=None
        )
        loss, _ = core_algos.get_policy_loss_fn(name)(
            old_log_prob=log_prob, log_prob=log_prob, advantages=advantages, response_mask=mask,
            loss_agg_mode=agg, config=actor, rollout_is_weights=None,
        )  # fmt: skip
        expected = core_algos.agg_loss(
            per_token(advantages, log_prob, actor),
            mask,
            BASE_LOSS_AGGREGATION[name] or agg,
            **actor.global_batch_info,
        )
        assert loss.item() == pytest.approx(expected.item(), rel=1e-10)


def test_the_registered_loss_and_the_loss_refuse_to_run_unwired():
    settings, actor, _ = settings_and_actor([])
    with pytest.raises(RuntimeError, match="loss_mode=score_centering runs only inside"):
        core_algos.get_policy_loss_fn("score_centering")(
            old_log_prob=torch.zeros(1, 1), log_prob=torch.zeros(1, 1), advantages=torch.zeros(1, 1),
            response_mask=torch.ones(1, 1, dtype=torch.bool), config=actor,
        )  # fmt: skip
    rollouts = make_rollouts([2], [2], V, K)
    data = micro_batch(rollouts, [0])
    output = {
        "log_probs": torch.nested.nested_tensor_from_jagged(torch.zeros(4), data["input_ids"].offsets())
    }
    with pytest.raises(RuntimeError, match="did not run the top-k hook"):
        score_centering_ppo_loss(actor, settings, model_output=output, data=data)
    assert CORRECTION not in output


def test_a_micro_batch_without_k_or_the_sampler_fields_fails_naming_who_provides_them():
    """Under adaptive-ppo-clip the trainer puts k on every update's micro-batches, and the plugin's agent-loop
    manager the sampler fields on every row: without them the hook refuses in one line."""
    settings, _, _ = settings_and_actor(MODES["adaptive-ppo-clip"])
    rollouts = make_rollouts(PROMPT_LENS, RESPONSE_LENS, V, K, seed=1)
    logits = packed_logits(rollouts, [0, 1], torch.randn(sum(rollouts.lengths), V, dtype=torch.float64))
    data = micro_batch(rollouts, [0, 1])
    with pytest.raises(RuntimeError, match="lacks score_centering_adaptive_k; .* score-centering trainer"):
        head_outputs(logits.unsqueeze(0), data, settings)
    del data["sampler_topk_ids"]
    with pytest.raises(RuntimeError, match=r"lacks sampler_topk_ids; .*ScoreCenteringAgentLoopManager$"):
        head_outputs(logits.unsqueeze(0), data, settings)
