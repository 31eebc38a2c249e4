"""Hand-computed values for every example of ``length-penalties.md`` and each algorithm's edge cases
(docs/reference/length-penalties.md §2)."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from trl_length_plugin.shaping import (
    METRIC_KEYS,
    LengthPenaltyConfig,
    RolloutBatch,
    apply_length_penalties,
    format_group_record,
    log_group_records,
)

DOCUMENT_PROFILE = {
    "profiled_rewards": [1, 1, 0, 1, 0, 1, 1, 1],
    "profiled_output_lengths": [18342, 17110, 32768, 19004, 28991, 16820, 17455, 18101],
}


def shape(rewards, totals, default=None, *, reasoning=None, groups=None, config=None, **batch):
    """Shape one group (or ``groups``); ``totals`` are answer lengths unless ``reasoning`` is given."""
    answer = totals if reasoning is None else [t - r for t, r in zip(totals, reasoning, strict=True)]
    reasoning = [0] * len(totals) if reasoning is None else reasoning
    config = LengthPenaltyConfig.model_validate({"verbose": True, "default": default or {}, **(config or {})})
    groups = [0] * len(rewards) if groups is None else groups
    return apply_length_penalties(RolloutBatch(rewards, groups, reasoning, answer, **batch), config)


def approx(values):
    return pytest.approx(values, abs=1e-12)


# -- 1. shortest bonus (§2.7) ---------------------------------------------------------------------------
def test_shortest_total_bonus_document_example():
    result = shape([1, 1, 0, 1], [10, 5, 1, 20], {"total_bonus": 0.1})
    assert result.rewards.tolist() == approx([1, 1.1, 0, 1])  # the wrong 1-token rollout never competes


def test_bonus_ties_go_to_the_lowest_row_index():
    assert shape([1, 1, 1], [5, 5, 9], {"total_bonus": 0.1}).rewards.tolist() == approx([1.1, 1, 1])


def test_bonus_skips_empty_channels_and_needs_two_positives():
    result = shape([1, 1, 1], [5, 8, 9], {"reasoning_bonus": 0.1}, reasoning=[0, 3, 7])
    assert result.rewards.tolist() == approx([1, 1.1, 1])
    assert shape([1, 0, 0], [5, 8, 9], {"total_bonus": 0.1}).rewards.tolist() == [1, 0, 0]


def test_bonus_needs_the_top_threshold_with_the_running_adjusted_reward():
    """Positives [1, 1 - 5e-7]: top_percentile 0.5 puts the threshold at 1.0 (index max(0, int(2 * 0.5) - 1)),
    so the shorter, slightly lower rollout gets nothing; top_percentile 1.0 lowers it to 1 - 5e-7."""
    low = 1 - 5e-7
    result = shape([1.0, low], [9, 4], {"total_bonus": 0.1, "top_percentile": 0.5})
    assert result.rewards.tolist() == approx([1.0, low])
    result = shape([1.0, low], [9, 4], {"total_bonus": 0.1, "top_percentile": 1.0})
    assert result.rewards.tolist() == approx([1.0, low + 0.1])
    # One rollout may win several channels; each check uses the reward plus the bonuses before it.
    result = shape([1, 1], [4, 9], {"reasoning_bonus": 0.1, "answer_bonus": 0.2}, reasoning=[1, 5])
    assert result.rewards.tolist() == approx([1.3, 1])


# -- 2. longest top-scorer penalty (§2.7) ---------------------------------------------------------------
def test_longest_total_penalty_document_example_with_tie():
    result = shape([1, 1, 0, 1], [10, 30, 50, 30], {"longest_total_penalty": 0.1, "top_percentile": 0.5})
    assert result.rewards.tolist() == approx([1, 0.9, 0, 1])  # rows 1 and 3 tie: the lowest index loses


def test_longest_penalty_needs_two_non_empty_top_scorers():
    assert shape([1, 1, 0], [0, 5, 9], {"longest_total_penalty": 0.1}).rewards.tolist() == [1, 1, 0]


def test_longest_penalty_only_among_top_scorers():
    """Positives [1, 1, 1 - 5e-7] at top_percentile 0.5: threshold 1.0, the longest (row 2) is no top scorer."""
    low = 1 - 5e-7
    result = shape([1, 1, low], [5, 8, 50], {"longest_total_penalty": 0.1})
    assert result.rewards.tolist() == approx([1, 0.9, low])


# -- 3. group relative-length scaling (§2.8) ------------------------------------------------------------
def test_group_relative_document_formula():
    result = shape([1, 1, 1, 0], [10, 20, 40, 5], {"group_total_length_penalty_coeff": 0.1})
    # raw weights 1, 2/3, 0; mean 5/9
    assert result.rewards.tolist() == approx([1 + 0.1 * 4 / 9, 1 + 0.1 / 9, 1 - 0.1 * 5 / 9, 0])


def test_group_relative_edge_cases():
    assert shape([1, 1], [7, 7], {"group_total_length_penalty_coeff": 0.1}).rewards.tolist() == [1, 1]
    result = shape([1, 1], [4, 10], {"group_reasoning_length_penalty_coeff": 0.1}, reasoning=[0, 10])
    assert result.rewards.tolist() == approx([1.05, 0.95])  # an empty channel still takes part
    assert shape([1, 0], [4, 10], {"group_total_length_penalty_coeff": 0.1}).rewards.tolist() == [1, 0]


# -- 4. zMAD (§2.9) -------------------------------------------------------------------------------------
def test_zmad_flags_long_outliers_only():
    zmad = {"total_zmad_threshold": 2.5, "total_zmad_penalty": 0.1}
    result = shape([1] * 6, [100, 102, 98, 101, 200, 10], zmad)
    # median 100.5 (even count), MAD 2; z(200) = 0.6745 * 99.5 / 2 > 2.5; the short 10 is not penalized
    assert result.rewards.tolist() == approx([1, 1, 1, 1, 0.9, 1])


def test_zmad_edge_cases():
    zmad = {"total_zmad_threshold": 2.5, "total_zmad_penalty": 0.1}
    assert shape([1] * 4, [100, 100, 100, 300], zmad).rewards.tolist() == [1] * 4  # MAD == 0
    floor = shape([1] * 5, [1000, 1001, 1002, 999, 1010], zmad)  # MAD / median = 1 / 1001 < 0.015
    assert floor.rewards.tolist() == [1] * 5
    exact = 0.6745 * 3.0  # median 11, MAD 1: z(14) equals the threshold, which must be exceeded
    strict = {"total_zmad_threshold": exact, "total_zmad_penalty": 0.1}
    assert shape([1] * 4, [10, 10, 12, 14], strict).rewards.tolist() == [1] * 4
    lower = {"total_zmad_threshold": 2.0, "total_zmad_penalty": 0.1}
    assert shape([1] * 4, [10, 10, 12, 14], lower).rewards.tolist() == approx([1, 1, 1, 0.9])
    assert shape([1, 0, 0], [10, 900, 5], zmad).rewards.tolist() == [1, 0, 0]  # fewer than two positives


# -- 5. profiled length threshold (§2.10) ---------------------------------------------------------------
def test_profiled_penalty_document_metadata():
    """Passing profiled lengths of the document: mean 17805.33, sample std 823.33, threshold 18628.66."""
    config = {"profiled_length_penalty": 0.1, "profiled_length_n_std": 1.0, "profiled_length_min_samples": 2}
    result = shape([1, 1, 0, 1], [18000, 18700, 25000, 18628], config, metadata=[DOCUMENT_PROFILE] * 4)
    group = result.groups[0]
    assert group.profiled_threshold == pytest.approx(18628.66, abs=0.01)
    assert result.rewards.tolist() == approx([1, 0.9, 0, 1])
    assert group.terms["profiled"] == approx(
        [0, -0.1, -0.1, 0]
    )  # the wrong row is penalized too (then clamped)


def test_profiled_penalty_edge_cases():
    config = {"profiled_length_penalty": 0.1, "profiled_length_min_samples": 2}
    few = {"profiled_rewards": [1, 0, 0], "profiled_output_lengths": [10, 20, 30]}
    assert shape([1, 1], [50, 60], config, metadata=[few] * 2).rewards.tolist() == [1, 1]
    one = {**config, "profiled_length_min_samples": 1}  # one sample: std 0, threshold = the sample
    assert shape([1, 1], [9, 10], one, metadata=[few] * 2).rewards.tolist() == approx([1, 0.9])
    # Not added where the other additive adjustments are negative (row 1 already lost the longest penalty).
    both = {**one, "longest_total_penalty": 0.2}
    assert shape([1, 1], [10, 12], both, metadata=[few] * 2).rewards.tolist() == approx([0.9, 0.8])


# -- 6. profile-band multiplier (§2.12) -----------------------------------------------------------------
def test_band_document_example():
    band = {"profile_band": {"total": {"a": 10000, "b": 15000, "f": 0.9}}}
    result = shape(
        [1, 1, 1, 0], [9000, 12500, 20000, 20000], {"profile_band_total": True}, metadata=[band] * 4
    )
    assert result.rewards.tolist() == approx([1, 0.95, 0.9, 0])


def test_global_band_defaults_are_enabled_implicitly():
    config = {"profile_band": {"enabled": True, "defaults": {"total": {"a": 10000, "b": 20000, "f": 0.5}}}}
    assert shape([1, 1], [15000, 5000], config=config).rewards.tolist() == approx([0.75, 1])


def test_band_order_precedence_and_only_positive_rewards():
    band = {"a": 10, "b": 20, "f": 0.5}
    config = {"profile_band": {"enabled": True, "defaults": {"total": band, "reasoning": band}}}
    # Row band replaces the default total channel only; reasoning still falls back to the default.
    meta = {"profile_band": {"total": {"a": 0, "b": 40, "f": 0.0}}}
    result = shape([1, 1, 0], [20, 4, 30], reasoning=[15, 0, 30], config=config, metadata=[meta] * 3)
    assert result.rewards.tolist() == approx([0.5 * 0.75, 0.9, 0])
    # After the clamp: a rollout wiped to 0 stays 0 whatever the band.
    wiped = shape([1, 1], [25, 30], {"longest_total_penalty": 1.0}, config=config)
    assert wiped.rewards.tolist() == approx([0.5, 0])  # total 25 >= b: multiplier f


def test_override_can_disable_a_default_channel_and_default_flag_wins():
    band = {"a": 10, "b": 20, "f": 0.5}
    config = {
        "profile_band": {"enabled": True, "defaults": {"total": band}},
        "agent_overrides": {"plain": {"profile_band_total": False}},
    }
    result = shape(
        [1, 1, 1, 1],
        [15, 15, 15, 15],
        groups=[0, 0, 1, 1],
        agents=["x", "x", "plain", "plain"],
        config=config,
    )
    assert result.rewards.tolist() == approx([0.75, 0.75, 1, 1])
    flagged = shape(
        [1, 1], [15, 15], {"profile_band_total": False}, config={"profile_band": config["profile_band"]}
    )
    assert flagged.rewards.tolist() == [1, 1]


def test_malformed_row_band_is_ignored_with_one_warning_and_counted(caplog):
    config = {"profile_band": {"enabled": True, "defaults": {"total": {"a": 10, "b": 20, "f": 0.5}}}}
    bad = {"profile_band": {"total": {"a": 30, "b": 20, "f": 0.5}}}  # b <= a
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        result = shape([1, 1, 1, 1], [15, 15, 15, 15], groups=[0, 0, 1, 1], metadata=[bad] * 4, config=config)
    assert result.rewards.tolist() == approx([0.75] * 4)  # the global default still applies
    assert result.metrics["length_penalty/invalid_metadata_frac"] == 1.0
    assert len([r for r in caplog.records if "malformed total" in r.getMessage()]) == 1


# -- 7. profile gate (§2.13) ----------------------------------------------------------------------------
GATED = {
    "group_total_length_penalty_coeff": 0.1,
    "group_length_penalty_profile_gate": True,
    "group_length_penalty_profile_gate_channel": "total",
    "group_length_penalty_profile_gate_field": "a",
    "group_length_penalty_profile_gate_positive_only": True,
}


@pytest.mark.parametrize(
    ("limit", "rewards", "positive_only", "reason", "shaped"),
    [
        (14, [1, 1, 0], True, "mean_gt_limit", [1.05, 0.95, 0]),  # mean of positives 15 > 14
        (15, [1, 1, 0], True, "mean_le_limit", [1, 1, 0]),
        (17, [1, 1, 0], False, "mean_gt_limit", [1.05, 0.95, 0]),  # mean of all rows 18.33 > 17
        (None, [1, 1, 0], True, "missing_profile_limit", [1, 1, 0]),
        (1, [0, 0, 0], True, "no_lengths", [0, 0, 0]),
    ],
)
def test_profile_gate(limit, rewards, positive_only, reason, shaped):
    config = {**GATED, "group_length_penalty_profile_gate_positive_only": positive_only}
    metadata = None if limit is None else [{"profile_band": {"total": {"a": limit, "b": 100, "f": 0.5}}}] * 3
    result = shape(rewards, [10, 20, 25], config, metadata=metadata)
    assert result.groups[0].gate["reason"] == reason
    assert result.rewards.tolist() == approx(shaped)


def test_closed_gate_zeroes_only_group_relative_scaling():
    metadata = [{"profile_band": {"total": {"a": 100, "b": 200, "f": 0.5}}}] * 2
    result = shape([1, 1], [10, 20], {**GATED, "total_bonus": 0.1}, metadata=metadata)
    assert result.groups[0].gate["reason"] == "mean_le_limit"
    assert result.rewards.tolist() == approx([1.1, 1])


# -- 8. pass-rate penalty (§2.11) -----------------------------------------------------------------------
def test_pass_rate_penalty():
    result = shape([1, 1, 0, 0], [100, 50, 300, 10], {"pass_rate_length_penalty_weight": 0.2})
    assert result.rewards.tolist() == approx([0.9, 0.95, 0, 0])  # the longest correct loses exactly w * rho
    single = shape([1, 0, 0, 0], [40, 5, 5, 5], {"pass_rate_length_penalty_weight": 0.2})
    assert single.rewards.tolist() == approx([0.95, 0, 0, 0])  # no two-positives rule
    empty = shape([1, 1], [0, 0], {"pass_rate_length_penalty_weight": 0.2})
    assert empty.rewards.tolist() == [1, 1]  # l_max = 0


# -- clamp, binary check, agents, metrics (§2.3, §2.4, §2.6, §2.15) --------------------------------------
def test_clamp_at_zero_and_wiped_metric():
    config = {"longest_total_penalty": 0.6, "pass_rate_length_penalty_weight": 1.0}
    result = shape([1, 1], [10, 20], config)
    assert result.rewards.tolist() == approx([0.5, 0.0])  # 1 - 0.6 - 1.0 clamps to 0, never negative
    assert result.metrics["length_penalty/wiped_correct_frac"] == 0.5


def test_non_binary_groups_are_untouched_with_one_warning_per_agent(caplog):
    rewards = [1, 0.5, 1, 1, math.nan, 1, 1 - 4e-7, 1e-7]
    agents = ["a", "a", "a", "a", "b", "b", "c", "c"]
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        result = shape(
            rewards,
            [5, 9, 5, 9, 5, 9, 5, 9],
            {"total_bonus": 0.1},
            groups=[0, 0, 1, 1, 2, 2, 3, 3],
            agents=agents,
        )
        shape(
            rewards,
            [5, 9, 5, 9, 5, 9, 5, 9],
            {"total_bonus": 0.1},
            groups=[0, 0, 1, 1, 2, 2, 3, 3],
            agents=agents,
        )
    out = result.rewards.tolist()
    assert out[:2] == [1, 0.5] and out[2:4] == approx([1.1, 1]) and out[5] == 1 and math.isnan(out[4])
    assert out[6:] == approx([1 - 4e-7 + 0.1, 1e-7])  # within 1e-6 of 0/1 is binary; 1e-7 is positive
    assert result.metrics["length_penalty/skipped_non_binary_frac"] == 0.25  # group 0 (graded 0.5)
    assert result.metrics["length_penalty/pct_unscorable"] == 0.25  # group 2 (a missing reward)
    messages = [r.getMessage() for r in caplog.records if "non-binary" in r.getMessage()]
    assert len(messages) == 2  # agent a, once per config instance (two configs here)
    missing = [r.getMessage() for r in caplog.records if "missing correctness" in r.getMessage()]
    assert len(missing) == 2 and all("'b'" in m for m in missing)
    assert [g.status for g in result.groups] == ["non_binary", "shaped", "missing", "shaped"]


def test_multi_component_groups_are_skipped():
    result = shape(
        [1, 1, 1, 1], [5, 9, 5, 9], {"total_bonus": 0.1}, groups=[0, 0, 1, 1], multi_component=[0, 1, 0, 0]
    )
    assert result.rewards.tolist() == approx([1, 1, 1.1, 1])


def test_disabled_agent_is_skipped_silently_before_the_binary_check(caplog):
    config = {
        "agent_overrides": {"genrm": {"enabled": False}, "math": {"group_total_length_penalty_coeff": 0.1}}
    }
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        result = shape(
            [0.7, 0.2, 1, 1],
            [5, 9, 10, 20],
            groups=[0, 0, 1, 1],
            agents=["genrm", "genrm", "math", "math"],
            config=config,
        )
    assert result.rewards.tolist() == approx([0.7, 0.2, 1.05, 0.95])
    assert not caplog.records
    assert [g.status for g in result.groups] == ["disabled", "shaped"]


def test_agent_of_a_group_is_its_first_row():
    config = {"agent_overrides": {"off": {"enabled": False}}}
    result = shape(
        [1, 1, 1, 1],
        [5, 9, 5, 9],
        {"total_bonus": 0.1},
        groups=[0, 1, 0, 1],
        agents=["off", "x", "x", "off"],
        config=config,
    )
    assert result.rewards.tolist() == approx([1, 1.1, 1, 1])


def test_metrics_by_hand():
    # group 0 mixed (bonus to row 0), group 1 all wrong, group 2 all correct and skipped (0.5 is graded)
    rewards = [1, 1, 0, 0, 0, 0, 1, 0.5]
    result = shape(rewards, [5, 9, 7, 3, 4, 4, 1, 1], {"total_bonus": 0.1}, groups=[0, 0, 0, 1, 1, 1, 2, 2])
    assert set(result.metrics) == set(METRIC_KEYS)
    assert result.metrics == pytest.approx(
        {
            "length_penalty/env_reward_mean": 3.5 / 8,
            "length_penalty/reward_delta_mean": 0.1 / 8,
            "length_penalty/wiped_correct_frac": 0.0,
            "length_penalty/adjusted_frac": 1 / 8,
            "length_penalty/skipped_non_binary_frac": 2 / 8,
            "length_penalty/invalid_metadata_frac": 0.0,
            "length_penalty/pct_all_wrong": 3 / 8,
            "length_penalty/pct_all_correct": 2 / 8,
            "length_penalty/pct_mixed": 3 / 8,
            "length_penalty/pct_unscorable": 0.0,
        }
    )


def test_nothing_enabled_gives_no_metrics_and_the_input():
    rewards = torch.tensor([1.0, 0.0])
    config = LengthPenaltyConfig.model_validate({"default": {"enabled": False, "total_bonus": 0.1}})
    result = apply_length_penalties(RolloutBatch(rewards, [0, 0], [1, 2], [3, 4]), config)
    assert result.metrics == {} and torch.equal(result.rewards, rewards) and result.groups == []


def test_verbose_records_and_log(caplog):
    result = shape(
        [1, 1, 0],
        [10, 20, 5],
        {**GATED, "total_bonus": 0.1},
        metadata=[{"profile_band": {"total": {"a": 1, "b": 9, "f": 0.5}}}] * 3,
    )
    record = result.groups[0]
    assert record.rows == [0, 1, 2] and record.agent == "default" and record.status == "shaped"
    assert record.terms["total_bonus"] == approx([0.1, 0, 0])
    assert record.terms["group_total"] == approx([0.05, -0.05, 0])
    text = format_group_record(record)
    assert "reason=mean_gt_limit" in text and "total_bonus=+0.1000" in text
    with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
        log_group_records(result.groups)
        log_group_records(result.groups, is_main_process=False)
    assert [r.getMessage() for r in caplog.records] == [text]
    quiet = apply_length_penalties(
        RolloutBatch([1, 1], [0, 0], [1, 2], [1, 2]),
        LengthPenaltyConfig.model_validate({"default": {"total_bonus": 0.1}}),
    )
    assert quiet.groups == []


def test_metadata_conversion_paths_agree():
    """A batch of plain numbers converts in bulk (struct/numpy); one malformed entry sends the whole batch
    through the per-entry parsers. Both give each well-formed group the same bands and profile."""
    from trl_length_plugin.shaping.metadata import merge_group_metadata, parse_prompt_metadata

    def group_metadata(entries):
        return merge_group_metadata(parse_prompt_metadata(entries), {}, len(entries))

    good = [
        {
            "profiled_rewards": [1, 0, 1, 1][: 2 + g % 3],
            "profiled_output_lengths": [40 + g, 17, 3 * g, 25][: 2 + g % 3],
            "profile_band": {"total": {"a": 10 + g, "b": 30.5, "f": 0.5}, "answer": None},
        }
        for g in range(6)
    ] + [None, {"profiled_rewards": (1, 1), "profiled_output_lengths": (2**53, 8)}]
    malformed = {"profiled_rewards": [1], "profiled_output_lengths": ["seven"], "profile_band": {"total": 3}}
    bulk = group_metadata(good)
    per_entry = group_metadata([*good, malformed])
    exact = dict(rtol=0, atol=0, equal_nan=True)
    for name in ("profiled_count", "profiled_sum", "profiled_sum_sq"):
        torch.testing.assert_close(getattr(per_entry, name)[:-1], getattr(bulk, name), **exact)
    for channel in ("total", "reasoning", "answer"):
        torch.testing.assert_close(per_entry.bands[channel][:-1], bulk.bands[channel], **exact)
    assert bulk.profiled_count.tolist() == [1, 2, 3, 1, 2, 3, 0, 2]
    assert bulk.profiled_sum.tolist() == [40, 44, 73, 43, 56, 85, 0, 2.0**53 + 8]
    assert bulk.bands["total"][:, 0].tolist()[:6] == [10, 11, 12, 13, 14, 15]
    assert per_entry.invalid["profiled"].tolist() == [False] * 8 + [True]
    assert per_entry.invalid["total"].tolist() == [False] * 8 + [True]


def test_layout_splits_batches_into_buckets_of_at_most_chunk_slots(monkeypatch):
    """Large batches run bucket by bucket (``groups.CHUNK_SLOTS``); the result does not depend on it."""
    from trl_length_plugin.shaping import groups as layout_module

    uniform = [g for g in range(10) for _ in range(4)]
    ragged = [0, 1, 1, 2, 2, 2, 3, 0, 4, 4, 4, 4, 4]
    config = {"group_total_length_penalty_coeff": 0.2, "total_zmad_threshold": 0.5, "total_zmad_penalty": 0.1}
    expected = {}
    for name, groups in (("uniform", uniform), ("ragged", ragged)):
        rewards = [float(i % 3 != 0) for i in range(len(groups))]
        totals = [(7 * i) % 11 + 1 for i in range(len(groups))]
        expected[name] = shape(rewards, totals, config, groups=groups).rewards
        monkeypatch.setattr(layout_module, "CHUNK_SLOTS", 8)
        layout = layout_module.GroupLayout(groups)
        assert all(bucket.width * len(bucket.groups) <= 8 for bucket in layout.buckets)
        assert sorted(torch.cat([bucket.groups for bucket in layout.buckets]).tolist()) == sorted(set(groups))
        assert torch.equal(shape(rewards, totals, config, groups=groups).rewards, expected[name])
        monkeypatch.undo()
    assert len(layout_module.GroupLayout(uniform).buckets) == 1
