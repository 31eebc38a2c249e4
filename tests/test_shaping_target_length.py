"""The target-length reward, L1 / LCPO (docs/reference/length-penalties.md §2.20): hand-computed values of
both modes, the per-prompt ``target_length`` column (absent, malformed), its metrics, the float64 reference,
properties and load-time refusals."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.shaping_strategies import config_dict, shaping_batch
from tests.test_shaping_reference import SETTINGS, assert_matches_reference, chunk_slots
from trl_length_plugin.shaping import LengthPenaltyConfig, RolloutBatch, apply_length_penalties
from trl_length_plugin.shaping.config import LengthConfigError, load_shaping_config
from trl_length_plugin.shaping.metadata import MetadataCache, parse_prompt_metadata


def penalties(rewards, lengths, targets, groups=None, **params):
    groups = groups or [0] * len(rewards)
    metadata = [None if t is ... else {"target_length": t} for t in targets]
    batch = RolloutBatch(rewards, groups, answer_lengths=lengths, metadata=metadata)
    return apply_length_penalties(batch, {"default": params})


def test_exact_hand_values():
    result = penalties(
        [1, 1, 0, 1], [100, 200, 150, 120], [120] * 4, target_length="exact", target_length_alpha=0.001
    )
    # r - alpha * |n - t|, correct or not: a wrong rollout goes below 0
    assert result.rewards.tolist() == pytest.approx([0.98, 0.92, -0.03, 1.0], abs=1e-15)
    metrics = result.metrics
    assert metrics["length_penalty/target_frac"] == 1.0
    assert metrics["length_penalty/target_rel_error_mean"] == pytest.approx((1 / 6 + 2 / 3 + 1 / 4 + 0) / 4)
    assert metrics["length_penalty/target_ratio_mean"] == pytest.approx((100 + 200 + 150 + 120) / 120 / 4)
    assert metrics["length_penalty/target_within_tolerance_frac"] == 0.25  # only n = t within 10 %
    assert metrics["length_penalty/target_delta_mean"] == pytest.approx((-0.02 - 0.08 - 0.03) / 4)


def test_max_hand_values():
    result = penalties(
        [1, 1, 0, 1], [100, 200, 150, 120], [120] * 4, target_length="max", target_length_alpha=0.001
    )
    # correct: clip(alpha * (t - n) + 0.5, 0, 1); wrong: 0
    assert result.rewards.tolist() == pytest.approx([0.52, 0.42, 0.0, 0.5], abs=1e-15)
    paper = penalties([1, 1, 1, 1], [0, 1000, 2000, 3000], [1000] * 4, target_length="max")
    # the paper's alpha = 0.0003, delta = 0.5: 0.8 well under the budget, 0.5 at it, 0 from 5000/3 over it
    assert paper.rewards.tolist() == pytest.approx([0.8, 0.5, 0.2, 0.0], abs=1e-15)
    assert paper.metrics["length_penalty/wiped_correct_frac"] == 0.25
    full = penalties([1, 1], [0, 10], [2000] * 2, target_length="max", target_length_delta=1.0)
    assert full.rewards.tolist() == [1.0, 1.0]  # clipped at 1


def test_rows_without_a_target_are_left_unchanged_and_counted():
    result = penalties(
        [1, 0, 1, 1, 1, 0],
        [100, 50, 130, 90, 500, 40],
        [100, 100, 100, ..., None, None],
        groups=[0, 0, 0, 1, 2, 2],
        target_length="exact",
        target_length_alpha=0.01,
        target_length_tolerance=0.3,
    )
    assert result.rewards.tolist() == pytest.approx([1.0, -0.5, 0.7, 1.0, 1.0, 0.0], abs=1e-15)
    metrics = result.metrics
    assert metrics["length_penalty/target_frac"] == 0.5  # 3 of the 6 rows have a target
    assert metrics["length_penalty/target_rel_error_mean"] == pytest.approx((0 + 0.5 + 0.3) / 3)
    assert metrics["length_penalty/target_within_tolerance_frac"] == pytest.approx(2 / 3)  # 0.3 <= 0.3
    assert metrics["length_penalty/invalid_metadata_frac"] == 0.0


def test_reads_its_channel_and_its_agents():
    batch = RolloutBatch(
        [1, 1, 1, 1],
        [0, 0, 1, 1],
        reasoning_lengths=[80, 10, 80, 10],
        answer_lengths=[20, 50, 20, 50],
        agents=["math", "math", "code", "code"],
        metadata=[{"target_length": 50}] * 4,
    )
    math_ = {"target_length": "exact", "target_length_alpha": 0.01, "target_length_channel": "answer"}
    config = {"default": {}, "agent_overrides": {"math": math_, "code": {}}}
    result = apply_length_penalties(batch, config)
    assert result.rewards.tolist() == pytest.approx([0.7, 1.0, 1.0, 1.0], abs=1e-15)
    assert result.metrics["length_penalty/target_frac"] == 1.0  # over the math rows only


def test_runs_after_overlong_and_before_the_truncation_penalty():
    """Order of §2.6 step 3a: overlong (-0.5 at n = 42), then max scales the positive reward (0.5 by the
    budget 0.5), then the truncation penalty halves it."""
    batch = RolloutBatch(
        [1, 1], [0, 0], answer_lengths=[42, 10], metadata=[{"target_length": 42}] * 2, truncated=[True, False]
    )
    config = {
        "default": {
            "overlong_max_length": 48,
            "overlong_buffer": 12,
            "target_length": "max",
            "target_length_alpha": 0.01,
            "truncation": "penalty",
            "truncation_penalty_factor": 0.5,
        }
    }
    result = apply_length_penalties(batch, config)
    assert result.rewards.tolist() == pytest.approx([0.5 * 0.5 * 0.5, 0.82], abs=1e-15)


@pytest.mark.parametrize("bad", [-3, 0, 0.0, math.nan, math.inf, "120", True, [120], 2**60 * 2**10])
def test_a_malformed_target_is_ignored_warned_and_counted(bad, caplog):
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        result = penalties(
            [1, 0, 1, 1], [100, 50, 130, 90], [bad] * 3 + [100], groups=[0, 0, 0, 1], target_length="exact"
        )
    assert result.rewards.tolist() == pytest.approx([1.0, 0.0, 1.0, 1.0 - 0.0003 * 10], abs=1e-15)
    assert result.metrics["length_penalty/invalid_metadata_frac"] == 0.75
    assert result.metrics["length_penalty/target_frac"] == 0.25
    assert "malformed target_length metadata of agent 'default'" in caplog.text


def test_targets_parse_from_any_scalar_and_stay_in_the_cache():
    entries = [
        {"target_length": np.int64(64)},
        {"target_length": torch.tensor(32.5)},
        {"target_length": 16},
        {"profiled_rewards": [1]},
        None,
        "not a mapping",
        {"target_length": np.array([1, 2])},
    ]
    table = parse_prompt_metadata(entries)
    assert table.target[:3].tolist() == [64.0, 32.5, 16.0]
    assert all(math.isnan(x) for x in table.target[3:].tolist())
    assert table.invalid[:, -1].tolist() == [False, False, False, False, False, True, True]
    cache = MetadataCache()
    looked = cache.lookup(["b", "a", "b"], lambda new: [{"target_length": 7 if k == "a" else 9} for k in new])
    assert looked.target.tolist() == [9.0, 7.0, 9.0]
    assert cache.lookup(["a"], lambda new: pytest.fail("parsed twice")).target.tolist() == [7.0]


def test_metadata_is_read_only_when_an_agent_turns_the_term_on():
    block = LengthPenaltyConfig.model_validate({"default": {"target_length": "max"}})
    assert block.uses_metadata
    assert not LengthPenaltyConfig.model_validate({"default": {"target_length": "none"}}).uses_metadata
    result = penalties([1, 1], [10, 20], [-1, -1], longest_total_penalty=0.25)  # the term is off
    assert result.metrics["length_penalty/invalid_metadata_frac"] == 0.0
    assert "length_penalty/target_frac" not in result.metrics


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"target_length": "minimum"}, "length_penalty.default.target_length"),
        (
            {"target_length": "exact", "target_length_alpha": -1e-4},
            "length_penalty.default.target_length_alpha",
        ),
        (
            {"target_length": "exact", "target_length_alpha": math.nan},
            "length_penalty.default.target_length_alpha",
        ),
        (
            {"target_length": "exact", "target_length_alpha": math.inf},
            "length_penalty.default.target_length_alpha",
        ),
        (
            {"target_length": "exact", "target_length_alpha": True},
            "length_penalty.default.target_length_alpha",
        ),
        (
            {"target_length": "exact", "target_length_tolerance": 0},
            "length_penalty.default.target_length_tolerance",
        ),
        (
            {"target_length": "max", "target_length_tolerance": -0.1},
            "length_penalty.default.target_length_tolerance",
        ),
        ({"target_length": "max", "target_length_delta": 1.5}, "length_penalty.default.target_length_delta"),
        ({"target_length": "max", "target_length_delta": -0.5}, "length_penalty.default.target_length_delta"),
        (
            {"target_length": "exact", "target_length_delta": 0.4},
            "length_penalty.default.target_length_delta",
        ),
        ({"target_length_alpha": 0.001}, "length_penalty.default.target_length_alpha"),
        (
            {"target_length": "max", "target_length_channel": "all"},
            "length_penalty.default.target_length_channel",
        ),
    ],
)
def test_bad_values_are_refused_at_load_naming_the_key(params, key):
    with pytest.raises(LengthConfigError) as err:
        load_shaping_config({"length_penalty": {"default": params}})
    message = str(err.value)
    assert key in message and "\n" not in message


def test_an_override_is_checked_merged_with_default():
    block = {"default": {"target_length": "exact"}, "agent_overrides": {"math": {"target_length_delta": 0.2}}}
    with pytest.raises(LengthConfigError, match="agent_overrides.math.target_length_delta"):
        load_shaping_config({"length_penalty": block})
    block["agent_overrides"]["math"]["target_length"] = "max"
    config = load_shaping_config({"length_penalty": block}).length_penalty
    assert config.for_agent("math").target_length_delta == 0.2
    assert config.for_agent("math").target_length_alpha == 0.0003


@settings(deadline=None, max_examples=300)
@given(
    lengths=st.lists(st.integers(0, 5000), min_size=1, max_size=12),
    target=st.integers(1, 4000),
    alpha=st.sampled_from([0.0, 0.0003, 0.001, 0.05]),
    correct=st.booleans(),
)
def test_exact_is_maximal_at_the_target_and_falls_with_the_distance(lengths, target, alpha, correct):
    ordered = sorted(lengths, key=lambda n: abs(n - target))
    r = float(correct)
    values = penalties(
        [r] * len(ordered), ordered, [target] * len(ordered), target_length="exact", target_length_alpha=alpha
    ).rewards.tolist()
    assert all(v <= r for v in values)
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))
    assert all(v == r for n, v in zip(ordered, values, strict=True) if n == target)


@settings(deadline=None, max_examples=300)
@given(
    lengths=st.lists(st.integers(0, 5000), min_size=1, max_size=12),
    correct=st.lists(st.booleans(), min_size=12, max_size=12),
    target=st.integers(1, 4000),
    alpha=st.sampled_from([0.0003, 0.001, 0.05]),
    delta=st.sampled_from([0.0, 0.5, 1.0]),
)
def test_max_is_a_bounded_budget_never_rewarding_a_wrong_rollout(lengths, correct, target, alpha, delta):
    rewards = [float(c) for c in correct[: len(lengths)]]
    values = penalties(
        rewards,
        lengths,
        [target] * len(lengths),
        target_length="max",
        target_length_alpha=alpha,
        target_length_delta=delta,
    ).rewards.tolist()
    for r, n, v in zip(rewards, lengths, values, strict=True):
        assert 0 <= v <= r
        if r and n <= target - (1 - delta) / alpha:
            assert v >= 1.0 - 1e-12
        if r and n >= target + delta / alpha:
            assert v <= 1e-12
    pairs = sorted((n, v) for r, n, v in zip(rewards, lengths, values, strict=True) if r)
    assert all(a[1] >= b[1] for a, b in zip(pairs, pairs[1:], strict=False))


TARGETS = st.one_of(
    st.integers(1, 6000),
    st.floats(0.5, 6000.0),
    st.sampled_from([None, -5, 0, math.nan, math.inf, "12", True, np.float32(40.0), 2**70]),
)


@settings(SETTINGS, max_examples=600)
@given(
    batch=shaping_batch(),
    config=config_dict(),
    mode=st.sampled_from(["exact", "max"]),
    override_mode=st.sampled_from([None, "none", "exact", "max"]),
    alpha=st.sampled_from([0.0, 0.0003, 0.01, 0.2]),
    channel=st.sampled_from(["total", "reasoning", "answer"]),
    targets=st.lists(TARGETS, min_size=60, max_size=60),
    overlong=st.booleans(),
    slots=chunk_slots,
)
def test_target_length_matches_reference(
    batch, config, mode, override_mode, alpha, channel, targets, overlong, slots
):
    """The engine with the target-length term against the float64 reference (tests/shaping_reference.py),
    with the group terms, agents, overrides and metadata (bands, profiles) of the existing strategies."""
    logging.getLogger("trl_length_plugin").setLevel(logging.ERROR)
    rewards, group_index, reasoning, answer, agents, metadata, multi = batch
    term = {"target_length": mode}
    if override_mode != "none":  # else the keys are refused for the "none" agent (checked at load)
        term.update(target_length_alpha=alpha, target_length_channel=channel)
    if overlong:
        term.update(overlong_max_length=40, overlong_buffer=20)
    config["default"] = {**config["default"], **term}
    if override_mode is not None and (config.get("agent_overrides") or {}).get("math") is not None:
        config["agent_overrides"]["math"] = {
            **config["agent_overrides"]["math"],
            "target_length": override_mode,
        }
    metadata = [
        {**m, "target_length": t} if isinstance(m, dict) else m
        for m, t in zip(metadata or [{}] * len(rewards), targets, strict=False)
    ]
    cfg = LengthPenaltyConfig.model_validate(config)
    assert_matches_reference((rewards, group_index, reasoning, answer, agents, metadata, multi), cfg, slots)
