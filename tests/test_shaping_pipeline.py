"""The one shaping step (``shape_rollouts``) every host runs, and the engine's answers to bad input
(docs/reference/length-penalties.md §2, docs/reference/length-coefficient.md §3).

- The step equals its parts applied by hand (penalties, coefficient on binary groups, totals, group
  advantages, keep mask), for TRL's and verl's normalizations, on random batches.
- Its numbers do not depend on the process's torch thread count.
- Per-prompt metadata is parsed once per prompt (``MetadataCache``); a malformed entry is warned once and
  counted on every step.
- Bad input: config keys (NaN, infinities, fractions, booleans, dependent keys), group ids that are not
  integers, absurd lengths, unhashable agents are named errors; metadata given as numpy or tensor numbers
  is valid; a channel name other than total/reasoning/answer, negative or absurd profiled lengths and
  integers beyond float range are ignored, warned about and counted; a group with a missing correctness
  reward is counted apart from non-binary ones; the coefficient skips non-binary groups (a reward model's
  score) with a warning and a metric and leaves them the host's normalization.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.shaping_strategies import config_dict, shaping_batch
from trl_length_plugin.shaping import (
    GroupNormalization,
    LengthConfigError,
    LengthShapingConfig,
    MetadataCache,
    RolloutBatch,
    apply_length_coefficient,
    apply_length_penalties,
    group_advantages,
    load_shaping_config,
    nonzero_std_keep_mask,
    shape_rollouts,
)
from trl_length_plugin.shaping import metadata as metadata_module
from trl_length_plugin.shaping.normalization import TRL_NORMALIZATION
from trl_length_plugin.shaping.schedule import coeff_at

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VERL = GroupNormalization(std_eps=1e-6, single_row_stats=(0.0, 1.0))
BAND = {"profile_band": {"total": {"a": 4, "b": 12, "f": 0.5}}}


def quiet():
    logging.getLogger("trl_length_plugin").setLevel(logging.ERROR)


def by_hand(batch: RolloutBatch, config: LengthShapingConfig, normalization, weight: float):
    """The step's parts, composed here: (shaped, advantages, keep)."""
    raw = batch.rewards.double()
    shaped = raw.clone()
    if config.penalties_on:
        shaped = apply_length_penalties(batch, config.penalties).rewards.double()
    groups = {}
    for row, gid in enumerate(batch.layout.gid.tolist()):
        groups.setdefault(gid, []).append(row)
    binary = torch.ones_like(raw, dtype=torch.bool)
    multi = batch.multi_component
    for rows in groups.values():
        values = raw[rows]
        ok = not torch.isnan(values).any() and all(min(abs(v), abs(v - 1)) <= 1e-6 for v in values.tolist())
        ok = ok and (multi is None or not bool(multi[rows].any()))
        binary[rows] = ok
    if config.coefficient_on:
        correctness = raw.masked_fill(~binary, math.nan)
        shaped = apply_length_coefficient(
            shaped, batch.loss_lengths, batch.layout, config.length_penalty_coeff,
            config.length_penalty_min_tokens, correctness,
        ).rewards.double()  # fmt: skip
    base = raw if batch.base_rewards is None else batch.base_rewards
    totals = base + weight * (shaped - raw).nan_to_num(0.0)
    advantages = None
    if config.coefficient_on:
        advantages = group_advantages(
            totals, raw, batch.layout, normalization.scale_by_std, normalization.std_eps,
            std_scope=normalization.std_scope, single_row_stats=normalization.single_row_stats,
            plain_rows=~binary,
        )  # fmt: skip
    keep = nonzero_std_keep_mask(totals, raw, batch.layout, base) if config.drop_zero_std_groups else None
    return shaped, advantages, keep


@SETTINGS
@given(
    batch=shaping_batch(),
    penalties=config_dict(),
    coeff=st.sampled_from([0.0, 0.5, 2.0]),
    drop=st.booleans(),
    normalization=st.sampled_from([GroupNormalization(), GroupNormalization(std_scope="batch"), VERL]),
    weight=st.sampled_from([1.0, 0.5]),
)
def test_step_equals_its_parts(batch, penalties, coeff, drop, normalization, weight):
    quiet()
    rewards, group_index, reasoning, answer, agents, metadata, multi = batch
    lengths = [r + a for r, a in zip(reasoning, answer, strict=True)]
    rollouts = RolloutBatch(
        rewards, group_index, reasoning, answer, agents, metadata, multi, loss_lengths=lengths
    )
    config = LengthShapingConfig(
        length_penalty=penalties, length_penalty_coeff=coeff, drop_zero_std_groups=drop
    )
    result = shape_rollouts(rollouts, config, normalization, shaping_weight=weight)
    shaped, advantages, keep = by_hand(rollouts, config, normalization, weight)
    torch.testing.assert_close(result.rewards, shaped, rtol=0, atol=1e-12, equal_nan=True)
    if advantages is None:
        assert result.advantages is None
    else:
        torch.testing.assert_close(result.advantages, advantages, rtol=0, atol=1e-12)
    assert (result.keep is None) == (keep is None) and (keep is None or torch.equal(result.keep, keep))


def test_numbers_do_not_depend_on_the_thread_count():
    """The engine runs on one intra-op thread (reference §2.6): the same bits at 1 and 2 threads, and the
    process's setting is restored. (torch's own setter: an in-process vLLM CPU engine of an earlier test
    replaces ``torch.set_num_threads`` with a no-op.)"""
    set_threads = torch._C.set_num_threads
    quiet()
    generator = torch.Generator().manual_seed(0)
    rows = 4096
    batch_args = dict(
        rewards=(torch.rand(rows, generator=generator) < 0.6).double(),
        group_index=torch.arange(rows) // 8,
        reasoning_lengths=torch.randint(0, 400, (rows,), generator=generator),
        answer_lengths=torch.randint(0, 50, (rows,), generator=generator),
        loss_lengths=torch.randint(1, 450, (rows,), generator=generator),
    )
    config = LengthShapingConfig(
        length_penalty={"default": {"group_total_length_penalty_coeff": 0.1, "total_zmad_threshold": 1.0,
                                    "total_zmad_penalty": 0.1}},
        length_penalty_coeff=0.5,
        drop_zero_std_groups=True,
    )  # fmt: skip
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            set_threads(threads)
            results.append(shape_rollouts(RolloutBatch(**batch_args), config, TRL_NORMALIZATION))
            assert torch.get_num_threads() == threads
    finally:
        set_threads(before)
    one, two = results
    assert torch.equal(one.advantages, two.advantages) and torch.equal(one.rewards, two.rewards)


def test_metadata_is_parsed_once_per_prompt_and_a_malformed_entry_warned_once(monkeypatch, caplog):
    calls = []
    parse = metadata_module.parse_prompt_metadata
    monkeypatch.setattr(
        metadata_module, "parse_prompt_metadata", lambda entries: calls.append(len(entries)) or parse(entries)
    )
    cache = MetadataCache()
    entries = {0: BAND, 1: {"profile_band": {"total": {"a": 9, "b": 3, "f": 0.5}}}}  # prompt 1: b <= a
    config = LengthShapingConfig(length_penalty={"default": {"profile_band_total": True}})
    rewards, lengths = [1, 1, 1, 1], [2, 20, 2, 20]
    fractions = []
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        for _ in range(3):  # three steps, the same two prompts
            prompts = cache.lookup([0, 1], lambda new: [entries[key] for key in new])
            batch = RolloutBatch(rewards, [0, 0, 1, 1], [0] * 4, lengths, metadata=prompts)
            result = shape_rollouts(batch, config, TRL_NORMALIZATION)
            fractions.append(result.metrics["length_penalty/invalid_metadata_frac"])
    assert calls == [2] and cache.parsed == 2  # parsed at first sight only
    assert fractions == [0.5, 0.5, 0.5]  # counted on every step
    assert result.rewards.tolist() == [1.0, 0.5, 1.0, 1.0]  # prompt 0 banded, prompt 1's band ignored
    warnings = [r.getMessage() for r in caplog.records if "malformed total" in r.getMessage()]
    assert len(warnings) == 1


def test_metadata_cache_is_bounded():
    cache = MetadataCache(max_prompts=3)
    for start in range(0, 12, 2):
        cache.lookup([start, start + 1], lambda new: [BAND] * len(new))
        assert len(cache) <= 3
    assert cache.parsed == 12


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"length_penalty_coeff": math.nan}, "length_penalty_coeff: Input should be a finite number"),
        ({"length_penalty_coeff": math.inf}, "length_penalty_coeff: Input should be a finite number"),
        ({"length_penalty_coeff": True}, "length_penalty_coeff: expected a number, got a boolean"),
        ({"length_penalty_coeff": [1, 2]}, "length_penalty_coeff: Input should be a valid number"),
        ({"length_penalty_coeff": 1, "length_penalty_min_tokens": 2.5}, "length_penalty_min_tokens:"),
        ({"length_penalty_coeff": 1, "length_penalty_min_tokens": math.nan}, "length_penalty_min_tokens:"),
        ({"length_penalty_coeff_warmup_steps": 3}, "length_penalty_coeff_warmup_steps: needs length_penalty_coeff"),
        ({"length_penalty_min_tokens": 3}, "length_penalty_min_tokens: needs length_penalty_coeff"),
        ({"length_penalty": {"default": {"total_bonus": math.nan}}}, "length_penalty.default.total_bonus:"),
        ({"length_penalty": {"default": {"total_bonus": True}}}, "length_penalty.default.total_bonus:"),
        ({"length_penalty": {"default": {"profiled_length_min_samples": 1.5}}}, "profiled_length_min_samples:"),
        ({"length_penalty": {"profile_band": {"defaults": {"total": {"a": 1, "b": math.inf, "f": 1}}}}},
         "length_penalty.profile_band.defaults.total.b:"),
        ({"reasoning_tags": ["<t>", "</t>"], "length_penalty": {"reasoning_tags": ["<a>", "</a>"]}},
         "reasoning_tags: ['<t>', '</t>'] disagrees"),
        ({"length_penalty_cof": 1}, "length_penalty_cof: unknown key (did you mean 'length_penalty_coeff'?)"),
        ({"length_penalty": {"default": {"group_relativ_length_penalty_coeff": 1}}},
         "length_penalty.default.group_relativ_length_penalty_coeff: unknown key (did you mean"),
        ({"length_penalty": {"agent_overrides": {"math": {"Total_Bonus": 1}}}},
         "length_penalty.agent_overrides.math.Total_Bonus: unknown key (did you mean 'total_bonus'?)"),
        ({"length_penalty": {"profile_band": {"defaults": {"totl": {"a": 1, "b": 2, "f": 1}}}}},
         "length_penalty.profile_band.defaults.totl: unknown key (did you mean 'total'?)"),
        ({"length_penalty": {"profile_band": {"defaults": {"total": {"a": -5, "b": 2, "f": 1}}}}},
         "length_penalty.profile_band.defaults.total.a: Input should be greater than or equal to 0"),
        ({"length_penalty": {"profile_band": {"defaults": {"total": {"a": 10, "b": 5, "f": 1}}}}},
         "length_penalty.profile_band.defaults.total: profile band needs b > a, got a=10.0, b=5.0"),
    ],
)  # fmt: skip
def test_bad_keys_are_one_line_errors_naming_the_key(values, key):
    with pytest.raises(LengthConfigError) as info:
        load_shaping_config(values)
    assert key in str(info.value) and "\n" not in str(info.value)


def test_warmup_raises_the_coefficient_linearly():
    config = LengthShapingConfig(length_penalty_coeff=2.0, length_penalty_coeff_warmup_steps=4)
    assert [coeff_at(config, step) for step in range(6)] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.0]


@pytest.mark.parametrize(
    "group_index",
    [
        torch.tensor([0.0, 0.5, 1.0]),  # would be truncated to 0, 0, 1
        np.array([0.0, math.nan, math.nan]),  # NaN ids would merge
        [0, 1.5, 2],
        [0, None, 1],
        [True, False, True],
        ["a", "a", "b"],
    ],
)
def test_group_ids_must_be_integers(group_index):
    with pytest.raises(ValueError, match="group_index must be integers"):
        RolloutBatch([1, 0, 1], group_index, [1, 2, 3], [1, 2, 3])


def test_integer_group_ids_of_any_dtype():
    for ids in (np.array([7, 7, 3], dtype=np.int16), torch.tensor([7, 7, 3], dtype=torch.int32), [7, 7, 3]):
        assert RolloutBatch([1, 0, 1], ids, [1, 2, 3], [1, 2, 3]).layout.gid.tolist() == [0, 0, 1]
    assert RolloutBatch([1, 0], [2**70, 2**70], [1, 2], [1, 2]).layout.num_groups == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"answer_lengths": [2.0**60, 1, 1]}, "answer_lengths must be finite, >= 0 and at most 2\\*\\*53"),
        ({"answer_lengths": [-1, 1, 1]}, "answer_lengths must be finite"),
        ({"loss_lengths": [math.inf, 1, 1]}, "loss_lengths must be finite"),
        ({"agents": [["a"], "b", "b"]}, "agents must be names"),
        ({"rewards": ["x", 1, 1]}, "rewards must be numbers"),
    ],
)
def test_malformed_batch_structure_is_a_named_error(kwargs, message):
    args = {
        "rewards": [1, 0, 1],
        "group_index": [0, 0, 1],
        "reasoning_lengths": [1, 2, 3],
        "answer_lengths": [1, 2, 3],
    }
    with pytest.raises(ValueError, match=message):
        RolloutBatch(**{**args, **kwargs})


BAND_CONFIG = {
    "default": {"profile_band_total": True, "profiled_length_penalty": 0.25, "profiled_length_n_std": 0.0}
}


def shape_one_group(meta):
    """One all-correct group of lengths 2 and 20 with ``meta`` on both rows."""
    batch = RolloutBatch([1, 1], [0, 0], [0, 0], [2, 20], metadata=[meta, meta])
    return apply_length_penalties(batch, BAND_CONFIG)


@pytest.mark.parametrize(
    "meta",
    [
        {"profile_band": {"total": {"a": np.int64(4), "b": np.float32(12.0), "f": torch.tensor(0.5)}}},
        {"profile_band": {"total": {"a": np.array(4), "b": 12, "f": 0.5}}},
        {"profile_band": {"total": {"a": 4, "b": 12, "f": 0.5}}, "profiled_rewards": np.array([1, 1]),
         "profiled_output_lengths": torch.tensor([5, 15])},
        {"profile_band": {"total": {"a": 4, "b": 12, "f": 0.5}}, "profiled_rewards": (True, np.bool_(True)),
         "profiled_output_lengths": [np.int32(5), np.float64(15)]},
    ],
)  # fmt: skip
def test_numpy_and_tensor_numbers_are_valid_metadata(meta):
    result = shape_one_group(meta)
    assert result.metrics["length_penalty/invalid_metadata_frac"] == 0.0
    threshold_hit = "profiled_rewards" in meta  # mean 10 + 0 * std: the row of length 20 loses 0.25
    assert result.rewards.tolist() == [1.0, (0.75 if threshold_hit else 1.0) * 0.5]


@pytest.mark.parametrize(
    ("meta", "key"),
    [
        ({"profile_band": {"Total": {"a": 4, "b": 12, "f": 0.5}}}, "channel_name"),
        ({"profiled_rewards": [1, 1], "profiled_output_lengths": [-5, 15]}, "profiled"),
        ({"profiled_rewards": [1, 1], "profiled_output_lengths": [2**60, 15]}, "profiled"),
        ({"profiled_rewards": [1, 1], "profiled_output_lengths": [10**400, 15]}, "profiled"),
        ({"profiled_rewards": [1, "1"], "profiled_output_lengths": [5, 15]}, "profiled"),
        ({"profile_band": {"total": {"a": 10**400, "b": 12, "f": 0.5}}}, "total"),
        ({"profile_band": {"total": {"a": -(2.0**60), "b": 12, "f": 0.5}}}, "total"),
        ({"profile_band": np.array([1, 2, 3])}, "total"),
        ({"profiled_rewards": np.zeros((2, 2)), "profiled_output_lengths": [5, 15]}, "profiled"),
    ],
)
def test_malformed_metadata_is_ignored_warned_and_counted(meta, key, caplog):
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        result = shape_one_group(meta)
    assert result.metrics["length_penalty/invalid_metadata_frac"] == 1.0
    assert result.rewards.tolist() == [1.0, 1.0]  # nothing of the malformed part applies
    assert any(f"malformed {key} metadata" in r.getMessage() for r in caplog.records)


def test_numpy_array_entries_do_not_crash():
    """A whole entry that is a numpy array (ambiguous truth value) is malformed, not a crash."""
    batch = RolloutBatch([1, 1], [0, 0], [0, 0], [2, 20], metadata=[np.array([1, 2]), np.array([1, 2])])
    assert apply_length_penalties(batch, BAND_CONFIG).metrics["length_penalty/invalid_metadata_frac"] == 1.0


def test_missing_rewards_are_counted_apart_from_non_binary(caplog):
    rewards = [1, math.nan, 1, 0.5, 1, 0]
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        result = apply_length_penalties(
            RolloutBatch(rewards, [0, 0, 1, 1, 2, 2], [0] * 6, [3, 9, 3, 9, 3, 9]),
            {"verbose": True, "default": {"total_bonus": 0.1}},
        )
    metrics = result.metrics
    assert metrics["length_penalty/pct_unscorable"] == pytest.approx(1 / 3)
    assert metrics["length_penalty/skipped_non_binary_frac"] == pytest.approx(1 / 3)
    assert (
        metrics["length_penalty/pct_mixed"] == pytest.approx(1 / 3)
        and metrics["length_penalty/pct_all_wrong"] == 0
    )
    assert [group.status for group in result.groups] == ["missing", "non_binary", "shaped"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("missing correctness reward" in m for m in messages)
    assert any("non-binary" in m for m in messages)


def test_coefficient_skips_a_reward_models_scores_and_keeps_the_host_normalization(caplog):
    """A continuous score (all <= 0 in group 0) would get zero advantages through §3.3's all-wrong rule;
    the coefficient skips such groups with one warning and a metric, and they get the host's (TRL's)
    normalization (reference §3.1)."""
    rewards = [-0.5, -1.5, -0.25, 1, 0, 1]
    batch = RolloutBatch(rewards, [0, 0, 0, 1, 1, 1], loss_lengths=[5, 9, 7, 5, 9, 20])
    config = LengthShapingConfig(length_penalty_coeff=1.0)
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        result = shape_rollouts(batch, config, TRL_NORMALIZATION)
        shape_rollouts(batch, config, TRL_NORMALIZATION)
    assert result.host_rows.tolist() == [True] * 3 + [False] * 3
    assert result.rewards[:3].tolist() == rewards[:3]  # untouched
    assert result.metrics["length_penalty/coeff_skipped_frac"] == 0.5
    scores = torch.tensor(rewards[:3], dtype=torch.float64)
    trl = (scores - scores.mean()) / (scores.std() + 1e-4)
    torch.testing.assert_close(result.advantages[:3], trl)
    assert result.advantages[3:].abs().sum() > 0  # the binary group is shaped and normalized
    assert (
        sum(
            "length_penalty_coeff: groups with a missing or non-binary" in r.getMessage()
            for r in caplog.records
        )
        == 1
    )
