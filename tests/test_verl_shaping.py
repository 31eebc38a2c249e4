"""verl length shaping (docs/reference/length-penalties.md §2-3) inside verl 0.9.1's real V1 trainer and advantage code path.

Real: verl's Hydra config and trainer registry (the trainer ``TaskRunnerV1`` builds for ``trainer_mode=sync``),
TransferQueue on a local Ray, the replay buffer sampling whole ``uid`` groups, verl's batch padding
(``upsample_batch_to_divisible_size``), ``PPOTrainer._compute_advantage`` with verl's advantage dispatch, GRPO
(``compute_grpo_outcome_advantage``) and the registered ``length_grpo``, and the engine. Not run here: rollout
generation and reward scoring (vLLM and the reward loop: rollouts are put into TransferQueue as
``AgentLoopWorkerTQ`` puts them, with fixed token ids and scores) and the actor update on FSDP workers (GPU).

Equality with the TRL integration: for the same rollouts the TRL side makes the same engine calls
(``measure_lengths`` on the completion text in each agent's unit, ``apply_length_penalties`` on the groups,
``apply_length_coefficient(shaped, loss-mask lengths, groups, coeff, min_tokens, correctness=raw)``), so the shaped
rewards are the same; ``test_same_shaped_rewards_as_the_trl_integration`` checks it directly with the TRL
integration's own functions. Advantages differ only by each host's GRPO constants (TRL std epsilon 1e-4, verl 1e-6
and verl's one-row groups), which ``group_advantages`` takes as arguments.
"""

from __future__ import annotations

import itertools
import logging
import math

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pad_sequence
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size

from tests.verl_length_helpers import (
    Rollout,
    clear,
    make_trainer,
    put_rollouts,
    read,
)
from trl_length_plugin.shaping import (
    LengthPenaltyConfig,
    RolloutBatch,
    apply_length_coefficient,
    apply_length_penalties,
    group_advantages,
    load_length_penalty_config,
    load_shaping_config,
    measure_lengths,
    shape_rollouts,
)
from trl_length_plugin.shaping.normalization import TRL_NORMALIZATION

PENALTY_YAML = """\
verbose: true
default:
  enabled: true
  group_total_length_penalty_coeff: 0.2
  longest_total_penalty: 0.1
  total_zmad_threshold: 1.0
  total_zmad_penalty: 0.05
  profiled_length_penalty: 0.3
  pass_rate_length_penalty_weight: 0.1
  profile_band_total: true
agent_overrides:
  math_chars:
    length_type: chars
    reasoning_bonus: 0.1
    group_reasoning_length_penalty_coeff: 0.1
"""
COEFF, MIN_TOKENS = 0.5, 3


def words(n: int) -> str:
    return "The answer is 42." + " step" * n


def rollouts() -> list[Rollout]:
    """Six ragged groups: mixed, all-correct, all-wrong, multi-component, single-row, with tool tokens;
    metadata as top-level columns, under ``extra_info``, and both (the top-level column wins, §2.14)."""
    band_top = {"profile_band": {"total": {"a": 10.0, "b": 40.0, "f": 0.5}}}
    band_nested = {"profile_band": {"total": {"a": 1.0, "b": 2.0, "f": 0.1}}, "index": 3}
    g1 = [
        Rollout("g1", r, words(n), columns=band_top, extra_info=band_nested)
        for r, n in zip([1.0, 1.0, 0.0, 1.0, 1.0], [2, 9, 5, 14, 30], strict=True)
    ]
    g2 = [
        Rollout("g2", 1.0, words(2), reasoning="r" * n, data_source="math_chars",
                extra_info={"profile_band": {"total": {"a": 20.0, "b": 80.0, "f": 0.6}}})
        for n in [5, 40, 12]
    ]  # fmt: skip
    g3 = [Rollout("g3", 0.0, words(n)) for n in [3, 8]]
    g4 = [Rollout("g4", r, words(n)) for r, n in zip([1.0, 0.0, 1.0, 1.0], [1, 4, 20, 6], strict=True)]
    g4[2].early_score = 0.25  # a score on two tokens: multi-component, the group stays untouched (§2.4)
    g5 = [Rollout("g5", 1.0, words(7))]
    profiled = {"profiled_rewards": [1, 1, 1, 0], "profiled_output_lengths": [5, 7, 9, 50]}
    g6 = [
        Rollout("g6", 1.0, words(n), reasoning="think " * n, tool=tool, extra_info=profiled)
        for n, tool in [(1, ""), (4, "TOOL OUTPUT " * 6), (2, "")]
    ]
    return g1 + g2 + g3 + g4 + g5 + g6


def metadata(rollout: Rollout) -> dict | None:
    """§2.14 as the test reads it: a top-level column wins over the same key under ``extra_info``."""
    keys = ("profiled_rewards", "profiled_output_lengths", "profile_band")
    merged = {key: rollout.columns.get(key, rollout.extra_info.get(key)) for key in keys}
    return merged if any(v is not None for v in merged.values()) else None


def engine_expectation(items: list[Rollout], tokenizer, config: LengthPenaltyConfig | None, coeff: float):
    """Raw rewards, shaped rewards and metrics from direct engine calls on the rollouts' own data."""
    raw = torch.tensor([r.reward for r in items], dtype=torch.float64)
    uids = np.unique([r.uid for r in items], return_inverse=True)[1]
    shaped, metrics = raw, {}
    if config is not None:
        agents = [r.data_source for r in items]
        units = [config.for_agent(agent).length_type for agent in agents]
        lengths = measure_lengths([r.text for r in items], units, tokenizer, config.reasoning_tags)
        batch = RolloutBatch(
            raw, uids, lengths.reasoning, lengths.answer, agents, [metadata(r) for r in items],
            multi_component=[r.early_score != 0 for r in items],
        )  # fmt: skip
        result = apply_length_penalties(batch, config)
        shaped, metrics = result.rewards, dict(result.metrics)
    if coeff:
        skipped = {r.uid for r in items if r.early_score}
        correctness = [math.nan if r.uid in skipped else r.reward for r in items]
        loss_lengths = [sum(r.response(tokenizer)[1]) for r in items]
        result = apply_length_coefficient(shaped, loss_lengths, uids, coeff, MIN_TOKENS, correctness)
        shaped = result.rewards
        metrics["length_penalty/coeff_penalized_frac"] = float((result.multipliers < 1).double().mean())
    return raw, shaped.double(), metrics


@pytest.fixture
def penalty_file(tmp_path):
    path = tmp_path / "length_penalty.yaml"
    path.write_text(PENALTY_YAML)
    return path


def run_advantage_step(trainer, items, tokenizer, groups: int, pad_to: int = 8):
    """Put, sample (verl's replay buffer), pad (verl), then the trainer's ``_compute_advantage``.

    Returns the batch, the TransferQueue rows it reads back, each batch row's rollout index (None for
    padding) and the metrics dict."""
    clear()
    keys = put_rollouts(items, tokenizer)
    batch, _ = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=groups)
    batch = upsample_batch_to_divisible_size(batch, pad_to, tokenizer.eos_token_id)
    metrics: dict = {}
    batch = trainer._compute_advantage(batch, metrics)
    fields = ["uid", "rm_scores", "token_level_rewards", "advantages", "response_mask"]
    position = {key: i for i, key in enumerate(keys)}
    return batch, read(batch.keys, batch.partition_id, fields), [position.get(k) for k in batch.keys], metrics


@pytest.mark.slow
def test_shaped_scores_and_advantages_equal_the_engine(store, tokenizer, penalty_file, caplog):
    """Group penalties + coefficient + ``length_grpo`` on shuffled ragged groups with padding rows."""
    items = rollouts()
    trainer = make_trainer(
        [
            f"+length_penalty={penalty_file}",
            f"+length_penalty_coeff={COEFF}",
            f"+length_penalty_min_tokens={MIN_TOKENS}",
            "algorithm.adv_estimator=length_grpo",
            "actor_rollout_ref.rollout.n=5",
        ],
        tokenizer,
    )
    with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
        batch, rows, index, metrics = run_advantage_step(trainer, items, tokenizer, groups=6)

    assert len(batch) == 24 and sum(i is not None for i in index) == len(items)  # verl padded 18 rows to 24
    uids = [uid for uid, i in zip(rows["uid"], index, strict=True) if i is not None]
    assert len(list(itertools.groupby(uids))) > len(set(uids))  # some groups are not contiguous

    config = load_length_penalty_config(penalty_file)
    raw, shaped, expected_metrics = engine_expectation(items, tokenizer, config, COEFF)
    group_ids = np.unique([r.uid for r in items], return_inverse=True)[1]
    advantages = group_advantages(shaped, raw, group_ids, True, 1e-6, single_row_stats=(0.0, 1.0))
    for i, score, reward, advantage, mask in zip(
        index, rows["rm_scores"], rows["token_level_rewards"], rows["advantages"], rows["response_mask"],
        strict=True,
    ):  # fmt: skip
        if i is None:  # verl's padding rows: never shaped, advantage 0
            assert float(reward.abs().sum()) == 0 and float(advantage.abs().sum()) == 0
            continue
        assert float(score.sum()) == float(raw[i])  # verl's raw score is restored
        assert float(reward.sum()) == pytest.approx(float(shaped[i]), abs=1e-6)
        if not items[i].early_score:
            assert float(reward[:-1].abs().sum()) == 0  # the shaped score sits on the last token
        assert torch.allclose(advantage.double(), float(advantages[i]) * mask.double(), atol=1e-5)

    g4 = [i for i, r in enumerate(items) if r.uid == "g4"]
    assert torch.equal(shaped[g4], raw[g4]) and not torch.equal(
        shaped, raw
    )  # multi-component group untouched
    for key, value in expected_metrics.items():
        assert metrics[key] == pytest.approx(value, abs=1e-12), key
    messages = [record.getMessage() for record in caplog.records]
    summaries = [m for m in messages if m.startswith("Length penalty:")]  # §3.4: one line, real rollouts only
    assert len(summaries) == 1
    assert summaries[0].startswith(f"Length penalty: step=1 coeff={COEFF:g} rollouts={len(items)} groups=6 ")
    assert sum(m.startswith("length_penalty group=") for m in messages) == 6  # verbose group records

    trainer.length_log_rollouts = True  # what +length_penalty_log_rollouts=true sets (test_verl_plugin.py)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
        run_advantage_step(trainer, items, tokenizer, groups=6)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Length penalty:")]
    assert len(lines) == len(items) and all(" session_id=step1/g" in line for line in lines)


@pytest.mark.slow
def test_group_penalties_feed_verls_own_grpo(store, tokenizer, penalty_file):
    """Penalties only, ``algorithm.adv_estimator=grpo``: verl's GRPO normalizes the engine's shaped scores."""
    items = rollouts()
    trainer = make_trainer([f"+length_penalty={penalty_file}", "algorithm.adv_estimator=grpo"], tokenizer)
    batch, rows, index, metrics = run_advantage_step(trainer, items, tokenizer, groups=6, pad_to=1)
    config = load_length_penalty_config(penalty_file)
    raw, shaped, expected_metrics = engine_expectation(items, tokenizer, config, 0)

    masks = pad_sequence(rows["response_mask"], batch_first=True).float()
    scores = torch.zeros_like(masks)
    scores[:, 0] = shaped[index].float()  # GRPO reads the sequence sum
    expected, _ = compute_grpo_outcome_advantage(scores, masks, np.array(rows["uid"], dtype=object))
    for advantage, want in zip(rows["advantages"], expected, strict=True):
        assert torch.allclose(advantage.float(), want[: advantage.numel()], atol=1e-5)
    assert "length_penalty/coeff" not in metrics
    assert {key: metrics[key] for key in expected_metrics} == pytest.approx(expected_metrics)


@pytest.mark.slow
def test_same_shaped_rewards_as_the_trl_integration(store, tokenizer, penalty_file):
    """The TRL integration's own group-penalty functions and coefficient call give the same shaped rewards.

    TRL lays groups out as consecutive blocks of ``num_generations`` rows and reads metadata from top-level
    columns (docs/reference/length-penalties.md §2.2, §2.14), so these rollouts use equal groups and top-level metadata only.
    """
    trl_rollouts = pytest.importorskip("trl_length_plugin.trl_integration.rollouts")
    band = {"profile_band": {"total": {"a": 10.0, "b": 40.0, "f": 0.5}}}
    items = [
        Rollout(f"q{g}", r, words(n), reasoning="hm " * (n % 4), columns=band if g == 0 else {})
        for g, rewards in enumerate([[1, 1, 0, 1], [1, 1, 1, 1], [0, 1, 0, 0]])
        for r, n in zip(rewards, [3, 11, 6, 25], strict=True)
    ]
    trainer = make_trainer(
        [
            f"+length_penalty={penalty_file}",
            f"+length_penalty_coeff={COEFF}",
            f"+length_penalty_min_tokens={MIN_TOKENS}",
            "algorithm.adv_estimator=length_grpo",
        ],
        tokenizer,
    )
    _, rows, index, _ = run_advantage_step(trainer, items, tokenizer, groups=3, pad_to=1)
    verl_shaped = torch.tensor([float(r.sum()) for r in rows["token_level_rewards"]], dtype=torch.float64)

    shaping = load_shaping_config(
        {
            "length_penalty": str(penalty_file),
            "length_penalty_coeff": COEFF,
            "length_penalty_min_tokens": MIN_TOKENS,
        }
    )
    local = trl_rollouts.LocalRollouts.from_columns(
        [r.text for r in items],
        {
            "agent": [r.data_source for r in items],
            "profile_band": [r.columns.get("profile_band") for r in items],
        },
        agent_column="agent",
    )
    correctness = torch.tensor([r.reward for r in items], dtype=torch.float64)
    loss_lengths = torch.tensor([sum(r.response(tokenizer)[1]) for r in items], dtype=torch.float64)
    batch = trl_rollouts.gathered_batch(
        local,
        correctness,
        trl_rollouts.consecutive_groups(len(items), 4),
        shaping,
        tokenizer=tokenizer,
        loss_lengths=loss_lengths,
    )
    trl_shaped = shape_rollouts(
        batch, shaping, TRL_NORMALIZATION
    ).rewards  # the TRL adapter's own batch, the same core step
    assert torch.allclose(verl_shaped, trl_shaped[index].double(), atol=1e-6)


def test_multi_output_sessions_are_rejected():
    """An agent loop returning several outputs per session would need one length per session (docs/verl.md)."""
    from verl_adapter.length_shaping.rollouts import check_single_output_sessions

    check_single_output_sessions(["u_0_0", "u_10_0"])
    with pytest.raises(NotImplementedError, match="u_1_1"):
        check_single_output_sessions(["u_0_0", "u_1_1"])


@pytest.mark.slow
def test_a_gate_without_any_band_source_is_warned_once(store, tokenizer, tmp_path, caplog):
    """The engine's rule (as TRL's setup warning): the gate is on, no prompt carries a ``profile_band`` and
    no global band is set, so the gate stays closed; verl says so once per run (§2.12-2.13)."""
    path = tmp_path / "gate.yaml"
    path.write_text(
        "default:\n  group_total_length_penalty_coeff: 0.2\n  group_length_penalty_profile_gate: true\n"
    )
    trainer = make_trainer([f"+length_penalty={path}", "algorithm.adv_estimator=grpo"], tokenizer)
    items = [Rollout(uid, r, words(n)) for uid in ("g1", "g2") for r, n in [(1.0, 2), (1.0, 9), (0.0, 5)]]
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        for _ in range(2):
            _, rows, index, _ = run_advantage_step(trainer, items, tokenizer, groups=2, pad_to=1)
    warnings = [r.getMessage() for r in caplog.records if "sets no band" in r.getMessage()]
    assert warnings == [
        "length_penalty: group_length_penalty_profile_gate is on but no prompt of the batch has a 'profile_band' "
        "and length_penalty.profile_band.defaults sets no band: the gate stays closed and no band applies "
        "(docs/reference/length-penalties.md §2.12-2.13)"
    ]
    scores = [float(reward.sum()) for reward in rows["token_level_rewards"]]
    assert scores == [items[i].reward for i in index]  # the closed gate leaves every score as it was
