"""The length coefficient (docs/reference/length-coefficient.md §3.1-3.2), its group normalization and filter (§3.3) and the
per-rollout ``Length penalty:`` log line (§3.4), with hand-computed values.

Host parity of the normalization (TRL's and verl's own advantage code) is tested by the adapters.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

from trl_length_plugin.shaping import (
    GroupLayout,
    apply_length_coefficient,
    group_advantages,
    length_penalty_lines,
    length_penalty_summary,
    log_length_coefficient,
    nonzero_std_keep_mask,
)
from trl_length_plugin.shaping.log import length_penalty_records, records_summary


def test_document_example_doubling_the_reference_halves_the_reward():
    """c = 1 and L = 2 * L_ref give 0.5 (§3.1)."""
    result = apply_length_coefficient([1.0, 1.0, 0.0], [100, 200, 50], [0, 0, 0], coeff=1.0)
    assert result.rewards.tolist() == [1.0, 0.5, 0.0]
    assert result.multipliers.tolist() == [1.0, 0.5, 1.0]  # incorrect rows keep multiplier 1
    assert result.reward_reductions.tolist() == [0.0, 0.5, 0.0]


def test_reference_length_is_the_shortest_correct_with_floor_and_at_least_one():
    # Group 0: L_min = 10 among raw == 1.0 (the wrong 5-token rollout does not count), m = 20 -> L_ref 20.
    # Group 1: L_min = 0 -> L_ref = max(0, 0, 1) = 1 with m = 0.
    rewards = [1.0, 1.0, 0.0, 1.0, 1.0]
    lengths = [10, 30, 5, 0, 3]
    groups = [5, 5, 5, 2, 2]
    floored = apply_length_coefficient(rewards, lengths, groups, coeff=0.5, min_tokens=20)
    assert floored.multipliers.tolist() == [1.0, 1 / (1 + 0.5 * 10 / 20), 1.0, 1.0, 1.0]
    plain = apply_length_coefficient(rewards, lengths, groups, coeff=0.5)
    assert plain.multipliers.tolist() == [1.0, 1 / (1 + 0.5 * 20 / 10), 1.0, 1.0, 1 / (1 + 0.5 * 2 / 1)]


def test_only_raw_reward_exactly_one_is_correct():
    result = apply_length_coefficient([0.9999, 1.0, 1.0], [5, 10, 40], [0, 0, 0], coeff=1.0)
    assert result.multipliers.tolist() == [1.0, 1.0, 1 / (1 + 30 / 10)]


def test_groups_are_independent_and_need_not_be_adjacent():
    result = apply_length_coefficient([1.0, 1.0, 1.0, 1.0], [10, 100, 20, 10], [7, 3, 7, 3], coeff=1.0)
    assert result.multipliers.tolist() == [1.0, 1 / (1 + 90 / 10), 1 / (1 + 10 / 10), 1.0]


def test_zero_coefficient_changes_nothing_bit_for_bit():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.25], dtype=torch.float32)
    result = apply_length_coefficient(rewards, [1, 500, 3, 9], [0, 0, 0, 0], coeff=0.0)
    assert torch.equal(result.rewards, rewards) and result.rewards.dtype == torch.float32
    assert torch.equal(result.multipliers, torch.ones(4))


def test_penalty_result_is_multiplied_where_raw_reward_is_one():
    """§3.5: group penalties first, then the coefficient on rows whose raw reward is exactly 1.0."""
    shaped = [1.1, 0.8, 0.0]
    result = apply_length_coefficient(shaped, [10, 20, 5], [0, 0, 0], coeff=1.0, correctness=[1.0, 1.0, 0.0])
    assert result.rewards.tolist() == [1.1, 0.4, 0.0]
    assert result.raw_rewards.tolist() == shaped


def test_accepts_a_ready_group_layout():
    layout = GroupLayout([0, 0, 1, 1])
    result = apply_length_coefficient([1.0, 1.0, 1.0, 0.0], [2, 4, 8, 1], layout, coeff=1.0)
    assert result.multipliers.tolist() == [1.0, 0.5, 1.0, 1.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"coeff": -0.1}, "length_penalty_coeff"),
        ({"coeff": math.nan}, "length_penalty_coeff"),
        ({"coeff": 1.0, "min_tokens": -1}, "length_penalty_min_tokens"),
        ({"coeff": 1.0, "lengths": [1, -2]}, "lengths"),
        ({"coeff": 1.0, "lengths": [1]}, "lengths"),
        ({"coeff": 1.0, "correctness": [1.0]}, "correctness"),
        ({"coeff": 1.0, "group_index": [0]}, "group_index"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, message):
    arguments = {"rewards": [1.0, 1.0], "lengths": [1, 2], "group_index": [0, 0], **kwargs}
    with pytest.raises(ValueError, match=message):
        apply_length_coefficient(**arguments)


def trl_mixed(values, eps=1e-4):
    """TRL's per-group normalization of a mixed group: (r - mean) / (unbiased std + 1e-4)."""
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return [(v - mean) / (std + eps) for v in values]


def test_group_advantages_per_group_kind():
    """All-correct: shaped - mean, no std; mixed: host normalization on shaped; all-wrong: 0 (§3.3)."""
    shaped = [1.0, 0.5, 0.25, 0.8, 0.0, 0.0, 0.0, 0.0]
    raw = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    mixed_shaped, mixed_raw = [0.5, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0]
    groups = [0] * 4 + [1] * 4 + [2] * 4
    advantages = group_advantages(shaped + mixed_shaped, raw + mixed_raw, groups).tolist()
    mean = (1.0 + 0.5 + 0.25 + 0.8) / 4
    assert advantages[:4] == pytest.approx([v - mean for v in shaped[:4]], abs=1e-15)
    assert advantages[4:8] == [0.0] * 4
    assert advantages[8:] == pytest.approx(trl_mixed(mixed_shaped), abs=1e-12)
    unscaled = group_advantages(mixed_shaped, mixed_raw, [0] * 4, scale_by_std=False).tolist()
    assert unscaled == pytest.approx([0.125, -0.375, 0.625, -0.375], abs=1e-15)


def test_batch_std_scope_and_nan_rows():
    shaped = [1.0, 0.0, 0.5, math.nan, 1.0, 0.0]
    raw = [1.0, 0.0, 1.0, math.nan, 1.0, 0.0]
    groups = [0, 0, 0, 0, 1, 1]
    finite = [1.0, 0.0, 0.5, 1.0, 0.0]
    mean = sum(finite) / 5
    std = math.sqrt(sum((v - mean) ** 2 for v in finite) / 4)
    advantages = group_advantages(shaped, raw, groups, std_scope="batch").tolist()
    assert advantages[:3] == pytest.approx([(v - 0.5) / (std + 1e-4) for v in (1.0, 0.0, 0.5)], abs=1e-12)
    assert advantages[3] == 0.0  # an unscorable row leaves the statistics and gets 0 (TRL's nan_to_num)
    assert advantages[4:] == pytest.approx([0.5 / (std + 1e-4), -0.5 / (std + 1e-4)], abs=1e-12)


def test_single_row_groups_trl_and_verl():
    """A graded single-row group: TRL's std is undefined (advantage 0); verl uses mean 0, std 1."""
    assert group_advantages([0.5], [0.5], [0]).tolist() == [0.0]
    verl = group_advantages([0.5], [0.5], [0], std_eps=1e-6, single_row_stats=(0.0, 1.0)).tolist()
    assert verl == [0.5 / (1 + 1e-6)]
    assert group_advantages([1.0], [1.0], [0], single_row_stats=(0.0, 1.0)).tolist() == [0.0]  # all-correct


def test_advantages_keep_the_dtype():
    shaped = torch.tensor([1.0, 0.0], dtype=torch.float32)
    assert group_advantages(shaped, [1.0, 0.0], [0, 0]).dtype == torch.float32


def test_keep_mask():
    """All-correct groups need a shaped range above 1e-6, mixed ones shaped rewards not all equal, and a group
    with no correct row unshaped rewards not all equal (§3.3): group 4's shaped spread (a per-rollout term's)
    does not keep it; group 5's spread before shaping (another reward term of the host) does."""
    shaped = [1.0, 1 - 2e-6, 1.0, 1 - 5e-7, 0.5, 0.5, 0.0, 0.0, 0.0, 0.1, -0.5, 0.2]
    raw = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    groups = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    keep = nonzero_std_keep_mask(shaped, raw, groups).tolist()
    assert keep == [True, True, False, False, False, False, False, False, False, False, False, False]
    unshaped = [*raw[:10], 0.0, 0.3]
    keep = nonzero_std_keep_mask(shaped, raw, groups, unshaped).tolist()
    assert keep == [True, True, False, False, False, False, False, False, False, False, True, True]


def test_log_line(caplog):
    result = apply_length_coefficient([1.0, 1.0, 0.0, 1.0], [10, 20, 7, 5], [4, 4, 4, 9], coeff=1.0)
    with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
        log_length_coefficient(result, step=3)
    assert [r.getMessage() for r in caplog.records] == [
        "Length penalty: session_id=step3/group4 rollout_id=0 generated_tokens=10 multiplier=1.000000 "
        "reward_reduction=0.000000 raw_reward=1.000000 shaped_reward=1.000000",
        "Length penalty: session_id=step3/group4 rollout_id=1 generated_tokens=20 multiplier=0.500000 "
        "reward_reduction=0.500000 raw_reward=1.000000 shaped_reward=0.500000",
        "Length penalty: session_id=step3/group4 rollout_id=2 generated_tokens=7 multiplier=1.000000 "
        "reward_reduction=0.000000 raw_reward=0.000000 shaped_reward=0.000000",
        "Length penalty: session_id=step3/group9 rollout_id=0 generated_tokens=5 multiplier=1.000000 "
        "reward_reduction=0.000000 raw_reward=1.000000 shaped_reward=1.000000",
    ]
    assert all(r.levelno == logging.INFO and r.name == "trl_length_plugin" for r in caplog.records)


def test_log_line_session_ids_main_process_and_zero_coefficient(caplog):
    result = apply_length_coefficient([1.0, 1.0], [10, 30], [0, 0], coeff=1.0)
    lines = length_penalty_lines(result, session_ids=["s-a", "s-b"])
    assert lines[1].startswith(
        "Length penalty: session_id=s-b rollout_id=1 generated_tokens=30 multiplier=0.333333"
    )
    with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
        log_length_coefficient(result, is_main_process=False)
        log_length_coefficient(apply_length_coefficient([1.0, 1.0], [10, 30], [0, 0], coeff=0.0))
    assert not caplog.records


def test_empty_batch():
    assert apply_length_coefficient([], [], [], coeff=1.0).rewards.numel() == 0
    assert group_advantages([], [], []).numel() == 0
    assert nonzero_std_keep_mask([], [], []).dtype == torch.bool


def test_step_summary_line(caplog):
    """Without per-rollout lines, one summary of the step (§3.4): multipliers [1, 0.5, 1, 1], reductions
    [0, 0.5, 0, 0], lengths [10, 20, 7, 5] in 2 groups."""
    result = apply_length_coefficient([1.0, 1.0, 0.0, 1.0], [10, 20, 7, 5], [4, 4, 4, 9], coeff=1.0)
    with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
        log_length_coefficient(result, step=3, rollouts=False)
    assert [r.getMessage() for r in caplog.records] == [
        "Length penalty: step=3 coeff=1 rollouts=4 groups=2 penalized=1 generated_tokens_mean=10.5 "
        "multiplier_mean=0.875000 multiplier_min=0.500000 reward_reduction_mean=0.125000"
    ]
    assert length_penalty_summary(result) == caplog.records[0].getMessage().replace("step=3", "step=-")


def test_step_summary_of_records_shaped_in_parts():
    """verl shapes a step's groups in parts (as they finish): the summary of the parts' records is the
    summary of the whole step (groups counted by session id)."""
    whole = apply_length_coefficient([1.0, 1.0, 0.0, 1.0], [10, 20, 7, 5], [4, 4, 4, 9], coeff=1.0)
    first = apply_length_coefficient([1.0, 1.0, 0.0], [10, 20, 7], [4, 4, 4], coeff=1.0)
    second = apply_length_coefficient([1.0], [5], [9], coeff=1.0)
    records = length_penalty_records(first, 3, ["step3/a"] * 3) + length_penalty_records(
        second, 3, ["step3/b"]
    )
    assert records_summary(records, 1.0, 3) == length_penalty_summary(whole, 3)
    assert records_summary([], 0.5, 1) == (
        "Length penalty: step=1 coeff=0.5 rollouts=0 groups=0 penalized=0 generated_tokens_mean=0.0 "
        "multiplier_mean=0.000000 multiplier_min=1.000000 reward_reduction_mean=0.000000"
    )
