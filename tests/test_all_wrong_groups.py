"""An all-wrong group never trains on length (issue 42, class 1; docs/reference/length-coefficient.md §3.3).

A per-rollout term (the overlong punishment, the cosine reward, LCPO-Exact) gives the rollouts of a group with
no correct answer rewards that differ by length. The zero-std filter judged those shaped rewards, kept the
group, and GRPO gave its shortest wrong answer a positive advantage (the "phantom gradient" of verl-recipe
#125). The filter now judges such a group without the length terms (the correctness, and a host's other reward
terms): dropped, as DAPO's accuracy filter drops it. All-correct groups keep the shaped range rule (their
spread is what the length coefficient trains on), mixed groups the shaped rule. Through the core, the offline
CLI (``trl-length preview``) and a property over every term; TRL's trainer and verl's filter in
tests/test_trl_shaping.py and tests/test_verl_filter.py.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.shaping_strategies import every_term_config, ordered_groups
from trl_length_plugin.shaping import LengthShapingConfig, RolloutBatch, shape_rollouts
from trl_length_plugin.shaping.normalization import TRL_NORMALIZATION
from trl_length_plugin.tools import commands

# (rewards, total lengths) of three groups: all wrong, all correct, mixed; lengths run into each term
REWARDS = [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0]
LENGTHS = [10, 30, 45, 60, 10, 30, 45, 60, 10, 30, 45, 60]
GROUPS = [0] * 4 + [1] * 4 + [2] * 4
TERMS = {
    "overlong": {"overlong_max_length": 48, "overlong_buffer": 24},
    "cosine": {"cosine_max_length": 60},
    "lcpo_exact": {"target_length": "exact", "target_length_alpha": 0.01},
}
TARGET = [{"target_length": 20}] * len(REWARDS)


def shaped(block: dict, coeff: float = 0.0, base_rewards=None, truncated=None):
    batch = RolloutBatch(
        REWARDS,
        GROUPS,
        answer_lengths=LENGTHS,
        metadata=TARGET,
        loss_lengths=LENGTHS,
        base_rewards=base_rewards,
        truncated=truncated,
    )
    config = LengthShapingConfig(
        length_penalty={"default": block}, length_penalty_coeff=coeff, drop_zero_std_groups=True
    )
    return shape_rollouts(batch, config, TRL_NORMALIZATION)


@pytest.mark.parametrize("term", list(TERMS))
def test_an_all_wrong_group_is_dropped_whatever_the_per_rollout_term(term):
    result = shaped(TERMS[term])
    wrong = result.totals[:4]
    assert len(set(wrong.tolist())) > 1  # the term spread the wrong rollouts by length ...
    assert result.keep.tolist() == [False] * 4 + [True] * 8  # ... and the filter drops them anyway
    assert result.metrics["length_penalty/zero_std_filtered_frac"] == pytest.approx(1 / 3)


def test_all_correct_groups_keep_their_shaped_range_rule():
    """An all-correct group of equal lengths has no spread and is dropped; the coefficient's spread keeps it."""
    plain = shaped({"total_bonus": 0.0, "enabled": True})
    assert plain.keep.tolist() == [False] * 8 + [True] * 4
    coefficient = shaped({"enabled": False}, coeff=1.0)
    assert coefficient.keep.tolist() == [False] * 4 + [True] * 8
    assert coefficient.advantages[:4].tolist() == [0.0] * 4  # all-wrong: no advantage (§3.3)


def test_an_all_wrong_group_is_judged_on_the_hosts_other_rewards():
    """TRL's total holds its other reward columns (a format reward): their spread in a group with no correct
    answer is a signal the length terms did not make, so it keeps the group."""
    fmt = torch.tensor([0.0, 0.5, 0.0, 0.5] + [0.0] * 8, dtype=torch.float64)
    result = shaped(TERMS["overlong"], base_rewards=torch.tensor(REWARDS, dtype=torch.float64) + fmt)
    assert result.keep.tolist() == [True] * 12
    equal = shaped(TERMS["overlong"], base_rewards=torch.tensor(REWARDS, dtype=torch.float64) + 0.5)
    assert equal.keep.tolist() == [False] * 4 + [True] * 8


def test_a_group_made_all_wrong_by_truncation_is_dropped():
    """``truncation: incorrect`` zeroes the truncated correct rows before the filter judges: the mixed group
    (rows 8 and 10 correct) has only row 8 untruncated, the all-correct group none; the group whose last
    correct row was truncated is judged as all-wrong."""
    truncated = [False, False, False, True] + [False] * 4 + [True, False, True, False]
    result = shaped({**TERMS["overlong"], "truncation": "incorrect"}, truncated=truncated)
    assert result.correctness[8:].tolist() == [0.0] * 4
    assert result.keep.tolist() == [False] * 4 + [True] * 4 + [False] * 4


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=ordered_groups(), config=every_term_config(), coeff=st.sampled_from([0.0, 1.0]))
def test_no_group_without_a_correct_rollout_survives_on_length(data, config, coeff):
    """Over every term and the coefficient: a binary group with no correct rollout (after ``truncation:
    incorrect``) is always dropped."""
    logging.getLogger("trl_length_plugin").setLevel(logging.ERROR)
    rewards, group_index, reasoning, answer, agents, metadata, truncated, totals = data
    batch = RolloutBatch(
        rewards, group_index, reasoning, answer, agents, metadata, loss_lengths=totals, truncated=truncated
    )
    shaping = LengthShapingConfig(
        length_penalty=config, length_penalty_coeff=coeff, drop_zero_std_groups=True
    )
    result = shape_rollouts(batch, shaping, TRL_NORMALIZATION)
    gid = batch.layout.gid
    for g in range(batch.layout.num_groups):
        rows = gid == g
        correctness = result.correctness[rows]
        if bool(((correctness == 0) | (correctness == 1)).all()) and not bool((correctness > 0).any()):
            assert not bool(result.keep[rows].any())


def test_preview_drops_the_all_wrong_group(tmp_path, capsys):
    """``trl-length preview`` (the offline CLI) with the trainer's filter and the overlong punishment: the
    all-wrong group's rows are written with ``keep: false`` and the report counts one dropped group."""
    rollouts, out = tmp_path / "r.jsonl", tmp_path / "shaped.jsonl"
    with rollouts.open("w") as sink:
        for reward, length, group in zip(REWARDS, LENGTHS, GROUPS, strict=True):
            row = {"prompt_id": f"p{group}", "reasoning_tokens": 0, "answer_tokens": length, "reward": reward}
            sink.write(json.dumps(row) + "\n")
    block = json.dumps({"default": TERMS["overlong"]})
    argv = ["preview", str(rollouts), "--length_penalty", block, "--drop_zero_std_groups", "true"]
    commands.main([*argv, "--output", str(out), "--png", str(tmp_path / "p.png")])
    stdout = capsys.readouterr().out
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["keep"] for row in written] == [False] * 4 + [True] * 8
    assert len({row["shaped_reward"] for row in written[:4]}) > 1
    assert "zero-std filter: 1 groups dropped" in stdout


def wrong_then_mixed(question, group, member):
    """Group 0 of each batch: all wrong, 0 to 9 fillers (lengths into the overlong buffer); group 1: mixed."""
    return [(3 * member, False), (member, member % 2 == 0)][group % 2]


def test_trl_drops_the_all_wrong_group_from_the_loss(random_model_dir, tmp_path):
    """The real ``GRPOTrainer`` step (deterministic ``rollout_func``) with ``drop_zero_std_groups`` and the
    overlong punishment: TRL's own advantages give the all-wrong group's shortest rollout a positive
    advantage (its shaped rewards differ by length), and the filter takes the group out of the loss."""
    from tests.trl_length_helpers import RecordingTrainer, deterministic_rollout, tiny_config
    from trl_length_plugin.embedded import correctness_reward, load_tokenizer, make_task_dataset

    tokenizer = load_tokenizer(random_model_dir)
    args = tiny_config(
        tmp_path,
        drop_zero_std_groups=True,
        length_penalty={"default": {"overlong_max_length": 24, "overlong_buffer": 12}},
    )
    trainer = RecordingTrainer(
        model=str(random_model_dir),
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=make_task_dataset(8),
        processing_class=tokenizer,
        rollout_func=deterministic_rollout(tokenizer, 4, wrong_then_mixed),
    )
    trainer.train()
    (record,) = trainer.records
    correctness, penalty = record.rewards_per_func[:4, 0], record.rewards_per_func[:4, 1]
    assert correctness.tolist() == [0.0] * 4 and len(set(penalty.tolist())) > 1
    assert float(record.output["advantages"][0]) > 0  # the phantom gradient TRL would train on
    loss_mask = record.output["completion_mask"] * record.output["tool_mask"]
    assert loss_mask[:4].sum() == 0 and bool((loss_mask[4:].sum(1) > 0).all())
    assert trainer.state.log_history[0]["length_penalty/zero_std_filtered_frac"] == pytest.approx(0.5)
