"""The toy terms of docs/write-a-term.md at work: run by ``tests/test_write_a_term.py`` in fresh interpreters
where one toy term (``tests/toy_terms``) registered through the ``trl_length_plugin.terms`` entry point before the
config was built; the cases of the other toy terms skip there. Not collected by the suite itself."""

from __future__ import annotations

import logging
import math

import pytest
from pydantic import ValidationError

from trl_length_plugin.shaping import (
    LengthPenaltyConfig,
    LengthPenaltyParams,
    MetadataCache,
    PromptColumn,
    RolloutBatch,
    apply_length_penalties,
    format_group_record,
    load_shaping_config,
    metadata_columns,
    metadata_entries,
    parse_prompt_metadata,
    register_term,
    shape_rollouts,
)
from trl_length_plugin.shaping.normalization import TRL_NORMALIZATION
from trl_length_plugin.shaping.terms import terms


def registered(name: str) -> None:
    """Skip the case unless the toy term ``name`` is registered in this interpreter."""
    if name not in {term.name for term in terms()}:
        pytest.skip(f"{name} is registered in another interpreter")


@pytest.fixture
def toy_term():
    registered("toy_tax")


@pytest.fixture
def budget_term():
    registered("toy_budget")


@pytest.fixture
def window_term():
    registered("toy_window")


def batch(**extra) -> RolloutBatch:
    """One group of three: two correct rows of total length 10 and 20, a wrong one of 30."""
    import torch

    rewards = torch.tensor([1.0, 1.0, 0.0])
    reasoning = torch.tensor([4.0, 5.0, 6.0])
    answer = torch.tensor([6.0, 15.0, 24.0])
    return RolloutBatch(rewards, torch.zeros(3, dtype=torch.long), reasoning, answer, **extra)


def batch_of_two(**extra) -> RolloutBatch:
    import torch

    one = batch()
    return RolloutBatch(
        one.rewards.repeat(2),
        torch.tensor([0, 0, 0, 1, 1, 1]),
        one.reasoning_lengths.repeat(2),
        one.answer_lengths.repeat(2),
        **extra,
    )


def budget_batch(budgets) -> RolloutBatch:
    """Two groups of three (total lengths 10, 20, 30; the last row wrong), one budget entry per prompt."""
    rows = [{"toy_budget": budget} for budget in budgets for _ in range(3)]
    return batch_of_two(metadata=rows)


# -- the toy tax: each correct row loses toy_tax per unit of its total length --------------------------------
def test_a_toy_term_runs_with_its_key(toy_term):
    config = LengthPenaltyConfig.model_validate({"verbose": True, "default": {"toy_tax": 0.01}})
    result = apply_length_penalties(batch(), config)
    assert result.rewards.tolist() == pytest.approx([0.9, 0.8, 0.0])
    assert result.metrics["length_penalty/toy_tax_mean"] == pytest.approx((-0.1 - 0.2) / 3)
    (record,) = result.groups
    assert record.terms["toy_tax"] == pytest.approx([-0.1, -0.2, 0.0])
    assert result.trace.changes["toy_tax"].tolist() == pytest.approx([-0.1, -0.2, 0.0])


def test_a_toy_term_adds_after_the_terms_before_it(toy_term):
    """Order 10 follows the pass-rate penalty (6): its adjustment joins the sum before the clamp (§2.6)."""
    config = load_shaping_config(
        {"length_penalty": {"default": {"toy_tax": 0.01, "pass_rate_length_penalty_weight": 0.5}}}
    )
    rewards = shape_rollouts(batch(), config, TRL_NORMALIZATION).rewards
    pass_rate = [-0.5 * (2 / 3) * 10 / 20, -0.5 * (2 / 3) * 20 / 20, 0.0]
    assert rewards.tolist() == pytest.approx([1 + pass_rate[0] - 0.1, max(0.0, 1 + pass_rate[1] - 0.2), 0.0])
    assert [term.name for term in terms("additive")][-2:] == ["pass_rate", "toy_tax"]


def test_a_toy_key_is_validated_like_the_others(toy_term):
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        LengthPenaltyConfig.model_validate({"default": {"toy_tax": -1}})
    assert LengthPenaltyParams.model_fields["toy_tax"].description.startswith("the loss per unit")


def test_a_term_registers_once_and_owns_its_keys(toy_term):
    from toy_terms.tax import PARAMETERS, toy_tax

    with pytest.raises(ValueError, match="registered twice"):
        register_term("toy_tax", kind="additive", order=11, parameters={}, switches=())(toy_tax)
    with pytest.raises(ValueError, match="belongs to another term"):
        register_term("toy_tax_2", kind="additive", order=11, parameters=PARAMETERS, switches=())(toy_tax)


# -- the toy budget: a term with per-prompt data of its own ----------------------------------------------------
def test_a_term_reads_its_own_prompt_column(budget_term, caplog):
    config = load_shaping_config({"length_penalty": {"default": {"toy_budget_penalty": 0.5}}})
    assert config.length_penalty.uses_metadata and "toy_budget" in metadata_columns()
    result = shape_rollouts(budget_batch([15, 25]), config, TRL_NORMALIZATION)
    assert result.rewards.tolist() == [1.0, 0.5, 0.0, 1.0, 1.0, 0.0]  # 20 > 15; nothing exceeds 25
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):  # a trainer may have set the level
        malformed = shape_rollouts(budget_batch(["ten", None]), config, TRL_NORMALIZATION)
    assert malformed.rewards.tolist() == [1.0, 1.0, 0.0] * 2  # no budget: no penalty, and nothing raised
    assert malformed.metrics["length_penalty/invalid_metadata_frac"] == pytest.approx(0.5)
    assert "malformed toy_budget metadata" in caplog.text


def test_the_hosts_row_builders_and_the_cache_carry_a_term_column(budget_term):
    """verl's and TRL's row builders read the column (top level, else ``extra_info``); the run's cache parses
    each prompt once; TRL's gather codec carries the parsed values."""
    from trl_length_plugin.trl_integration.rollouts import LocalRollouts, RowMetadata

    entries = metadata_entries({"toy_budget": [15, None]}, 2, [None, {"toy_budget": 25}])  # verl's call
    assert [entry["toy_budget"] for entry in entries] == [15, 25]
    trl_rows = LocalRollouts.from_inputs(["a", "b"], [{"toy_budget": 15}, {"toy_budget": None}], "agent")
    assert trl_rows.metadata[0]["toy_budget"] == 15 and trl_rows.metadata[1] is None
    cache = MetadataCache()
    table = cache.lookup(["a", "b", "a"], lambda new: [{"toy_budget": 15}, {"toy_budget": -1}])
    assert table.columns["toy_budget"][:, 0].tolist()[::2] == [15.0, 15.0] and table.invalid[1, -1]
    codec = RowMetadata(cache)
    gathered = RowMetadata.from_columns(codec.local_columns([{"toy_budget": 25}, {"toy_budget": "x"}]))
    assert gathered.columns["toy_budget"][0].tolist() == [25.0] and gathered.invalid[:, -1].tolist() == [
        False,
        True,
    ]


def test_a_term_column_is_read_by_preview_and_its_parser_never_stops_the_shaping(budget_term):
    """``trl-length preview`` reads the column from a rollout row; a parser's own error (here a KeyError) and
    a row that is not a mapping flag the entry instead of raising (§2.14)."""
    from trl_length_plugin.offline.preview import _metadata
    from trl_length_plugin.offline.rollouts import Rollout

    rollout = Rollout(0, "p", 1.0, "text", None, None, None, {"prompt": "p", "toy_budget": 12})
    assert _metadata(rollout, None)["toy_budget"] == 12
    strict = PromptColumn("toy_budget", lambda value: value["tokens"], "docs/write-a-term.md")
    values, bad = strict.read([{"tokens": 3}, {"other": 1}, None, "not a row"], malformed="not a row")
    assert values[:, 0].tolist()[:1] == [3.0] and bad.tolist() == [False, True, False, True]
    table = parse_prompt_metadata([{"toy_budget": 9}, "not a mapping", None])
    assert table.columns["toy_budget"][0].tolist() == [9.0] and table.invalid[:, -1].tolist() == [
        False,
        True,
        False,
    ]


# -- the toy window: a two-number column and a term's own record line --------------------------------------------
def test_a_wide_column_and_a_terms_own_record_line(window_term, caplog):
    """A two-number column (a window per prompt) and the term's ``record``: its line in the verbose record,
    its entry as an attribute."""
    config = LengthPenaltyConfig.model_validate({"verbose": True, "default": {"toy_window_on": True}})
    result = apply_length_penalties(batch_of_two(metadata=[{"toy_window": [4, 9]}] * 3 + [None] * 3), config)
    first, second = result.groups
    assert first.toy_window == {"low": 4.0, "high": 9.0} and first.gate is None
    assert format_group_record(first).splitlines()[1] == "  toy_window low=4.0 high=9.0"
    assert math.isnan(second.toy_window["low"])
