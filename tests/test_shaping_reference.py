"""The vectorized engine agrees with the per-group float64 loop reference to 1e-9 on random batches.

Covers ragged and non-adjacent groups, ties, empty channels, all-wrong/all-right and single-positive
groups, missing and malformed metadata, non-binary groups and every config key (docs/reference/length-penalties.md §2-3).
"""

from __future__ import annotations

import logging
import math
from unittest import mock

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.shaping_reference import (
    reference_advantages,
    reference_coefficient,
    reference_keep,
    reference_penalties,
)
from tests.shaping_strategies import config_dict, shaping_batch, wild_metadata_entry
from trl_length_plugin.shaping import (
    LengthPenaltyConfig,
    RolloutBatch,
    apply_length_coefficient,
    apply_length_penalties,
    group_advantages,
    nonzero_std_keep_mask,
)
from trl_length_plugin.shaping import groups as group_layout

TOLERANCE = 1e-9
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
# small bucket sizes split even these batches into many buckets (views and scattered alike)
chunk_slots = st.sampled_from([group_layout.CHUNK_SLOTS, group_layout.CHUNK_SLOTS, 1, 4, 16])


def buckets_of(slots):
    return mock.patch.object(group_layout, "CHUNK_SLOTS", slots)


def assert_close(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert (math.isnan(a) and math.isnan(e)) or abs(a - e) <= TOLERANCE, (actual, expected)


def assert_matches_reference(batch, cfg, slots, truncated=None):
    """The engine's shaped rewards, metrics and (verbose) per-term values of shaped groups against the float64
    reference on ``batch`` (``shaping_batch``'s tuple); returns the engine's result and the reference's
    per-group info for further checks."""
    rewards, group_index, reasoning, answer, agents, metadata, multi = batch
    with buckets_of(slots):
        result = apply_length_penalties(
            RolloutBatch(
                rewards, group_index, reasoning, answer, agents, metadata, multi, truncated=truncated
            ),
            cfg,
        )
    expected, metrics, info = reference_penalties(
        rewards, group_index, reasoning, answer, cfg, agents, metadata, multi, truncated
    )
    assert_close(result.rewards.tolist(), expected)
    assert set(result.metrics) == set(metrics)
    for key, value in metrics.items():
        assert_close([result.metrics[key]], [value])
    if cfg.verbose and cfg.any_enabled:
        for record in result.groups:
            if record.status == "shaped":
                for name, values in info[record.group]["terms"].items():
                    assert_close(record.terms[name], values)
    return result, info


@settings(SETTINGS, max_examples=2000)
@given(batch=shaping_batch(), config=config_dict(), slots=chunk_slots)
def test_penalties_match_reference(batch, config, slots):
    logging.getLogger("trl_length_plugin").setLevel(logging.ERROR)
    cfg = LengthPenaltyConfig.model_validate(config)
    result, info = assert_matches_reference(batch, cfg, slots)
    if cfg.verbose and cfg.any_enabled:
        assert [record.group for record in result.groups] == list(info)
        for record in result.groups:
            expected_info = info[record.group]
            assert record.status == expected_info["status"]
            if record.status != "shaped":
                continue
            reason = record.gate["reason"] if record.gate else "disabled"
            assert reason == expected_info["gate_reason"]
            if expected_info["profiled_threshold"] is not None:
                assert_close([record.profiled_threshold], [expected_info["profiled_threshold"]])


@settings(SETTINGS, max_examples=800)
@given(
    batch=shaping_batch(),
    coeff=st.sampled_from([0.0, 0.5, 1.0, 3.0]),
    min_tokens=st.sampled_from([0, 1, 5, 30]),
    separate_correctness=st.booleans(),
    slots=chunk_slots,
)
def test_coefficient_matches_reference(batch, coeff, min_tokens, separate_correctness, slots):
    rewards, group_index, reasoning, _, _, _, _ = batch
    correctness = [1.0 if r == 1.0 else 0.0 for r in rewards] if separate_correctness else None
    with buckets_of(slots):
        result = apply_length_coefficient(rewards, reasoning, group_index, coeff, min_tokens, correctness)
    shaped, multipliers = reference_coefficient(
        rewards, reasoning, group_index, coeff, min_tokens, correctness
    )
    assert_close(result.rewards.tolist(), shaped)
    assert_close(result.multipliers.tolist(), multipliers)
    assert_close(result.reward_reductions.tolist(), [r - s for r, s in zip(rewards, shaped, strict=True)])


@settings(SETTINGS, max_examples=800)
@given(
    batch=shaping_batch(),
    coeff=st.sampled_from([0.5, 1.0]),
    scale_by_std=st.booleans(),
    std_eps=st.sampled_from([1e-4, 1e-6]),
    std_scope=st.sampled_from(["group", "batch"]),
    single_row_stats=st.sampled_from([None, (0.0, 1.0)]),
    slots=chunk_slots,
)
def test_normalization_matches_reference(
    batch, coeff, scale_by_std, std_eps, std_scope, single_row_stats, slots
):
    rewards, group_index, reasoning, _, _, _, _ = batch
    with buckets_of(slots):
        shaped = apply_length_coefficient(rewards, reasoning, group_index, coeff).rewards.tolist()
        advantages = group_advantages(
            shaped,
            rewards,
            group_index,
            scale_by_std,
            std_eps,
            std_scope=std_scope,
            single_row_stats=single_row_stats,
        )
        keep = nonzero_std_keep_mask(shaped, rewards, group_index)
        # a host's other reward terms (spread or not) judge the groups without a correct row
        unshaped = [r + length % 2 for r, length in zip(rewards, reasoning, strict=True)]
        judged = nonzero_std_keep_mask(shaped, rewards, group_index, unshaped)
    expected = reference_advantages(
        shaped, rewards, group_index, scale_by_std, std_eps, std_scope, single_row_stats
    )
    assert_close(advantages.tolist(), expected)
    assert keep.tolist() == reference_keep(shaped, rewards, group_index)
    assert judged.tolist() == reference_keep(shaped, rewards, group_index, unshaped)


def test_float32_batch_matches_reference():
    """A float32 batch is shaped in float64 and returned as float32 (one rounding of the reference)."""
    rewards = torch.tensor([1, 1, 0, 1, 0, 1, 1, 1], dtype=torch.float32)
    lengths = [5, 9, 3, 30, 7, 7, 12, 2]
    cfg = LengthPenaltyConfig.model_validate(
        {"default": {"group_total_length_penalty_coeff": 0.3, "total_bonus": 0.1}}
    )
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    result = apply_length_penalties(RolloutBatch(rewards, groups, lengths, [0] * 8), cfg)
    expected, _, _ = reference_penalties(rewards.tolist(), groups, lengths, [0] * 8, cfg)
    assert result.rewards.dtype == torch.float32
    assert torch.equal(result.rewards, torch.tensor(expected, dtype=torch.float64).float())


@settings(SETTINGS, max_examples=600)
@given(
    batch=shaping_batch(shared_metadata=True),
    config=config_dict(),
    entries=st.lists(wild_metadata_entry(), min_size=1, max_size=6),
    reads=st.booleans(),
)
def test_arbitrary_metadata_objects_match_reference(batch, config, entries, reads):
    """Any per-row metadata object (numpy/tensor numbers, wrong channel names, negative or absurd lengths,
    garbage): no exception, the reference's rewards and metrics (the invalid-metadata fraction counts what
    was ignored), and the groups with well-formed metadata shaped as without the garbage."""
    logging.getLogger("trl_length_plugin").setLevel(logging.ERROR)
    rewards, group_index, reasoning, answer, agents, _, multi = batch
    keys = list(dict.fromkeys(group_index))
    per_group = {key: entries[i % len(entries)] for i, key in enumerate(keys)}
    metadata = [per_group[key] for key in group_index]
    if reads:  # the default agent reads every part of the metadata
        config = {**config, "default": {**config["default"], "profiled_length_penalty": 0.2}}
        config["default"].update(
            profile_band_total=True, group_length_penalty_profile_gate=True, enabled=True
        )
        config["default"]["group_total_length_penalty_coeff"] = 0.1
    cfg = LengthPenaltyConfig.model_validate(config)
    result = apply_length_penalties(
        RolloutBatch(rewards, group_index, reasoning, answer, agents, metadata, multi), cfg
    )
    expected, metrics, _ = reference_penalties(
        rewards, group_index, reasoning, answer, cfg, agents, metadata, multi
    )
    assert_close(result.rewards.tolist(), expected)
    assert set(result.metrics) == set(metrics)
    for key, value in metrics.items():
        assert_close([result.metrics[key]], [value])
