"""docs/write-a-term.md: a term registered from outside the package runs in the §2.6 order with its own
key, its outputs in the verbose records and its metric in the metrics, and leaves when unregistered
(docs/reference/length-penalties.md §2.6, §2.15); a term with a per-prompt column of its own gets it through
every host's row builder, the run's cache and the engine (§2.14)."""

from __future__ import annotations

import logging
import math
import pkgutil

import pytest
import torch
from pydantic import ValidationError

from trl_length_plugin.shaping import (
    LengthPenaltyConfig,
    LengthPenaltyParams,
    RolloutBatch,
    apply_length_penalties,
    load_shaping_config,
    shape_rollouts,
)
from trl_length_plugin.shaping import terms as terms_package
from trl_length_plugin.shaping.fields import NonNegative
from trl_length_plugin.shaping.metadata import MetadataCache, parse_prompt_metadata
from trl_length_plugin.shaping.normalization import TRL_NORMALIZATION
from trl_length_plugin.shaping.records import format_group_record
from trl_length_plugin.shaping.rows import metadata_entries
from trl_length_plugin.shaping.terms import (
    Parameter,
    PromptColumn,
    metadata_columns,
    register_term,
    terms,
    unregister_term,
)
from trl_length_plugin.trl_integration.rollouts import LocalRollouts, RowMetadata

# -- the toy term: each correct row loses toy_tax per unit of its total length -----------------------------
PARAMETERS = {"toy_tax": Parameter(NonNegative, 0.0, "the loss per unit of total length of a correct row")}


def toy_metrics(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"length_penalty/toy_tax_mean": values["toy_tax"].double()}


def toy_tax(view, inputs):
    return {"toy_tax": view.lengths["total"] * -view.p("toy_tax") * view.positive}


@pytest.fixture
def toy_term():
    """The toy term registered for one test; removed afterwards, so the other tests never see its key."""
    register_term(
        "toy_tax",
        kind="additive",
        order=10,
        parameters=PARAMETERS,
        switches=("toy_tax",),
        metrics=toy_metrics,
    )(toy_tax)
    yield
    unregister_term("toy_tax")


def batch(**extra) -> RolloutBatch:
    """One group of three: two correct rows of total length 10 and 20, a wrong one of 30."""
    rewards = torch.tensor([1.0, 1.0, 0.0])
    reasoning = torch.tensor([4.0, 5.0, 6.0])
    answer = torch.tensor([6.0, 15.0, 24.0])
    return RolloutBatch(rewards, torch.zeros(3, dtype=torch.long), reasoning, answer, **extra)


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


def test_an_unregistered_key_is_unknown():
    assert "toy_tax" not in LengthPenaltyParams.model_fields
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        LengthPenaltyConfig.model_validate({"default": {"toy_tax": 0.01}})


def test_a_term_registers_once_and_owns_its_keys(toy_term):
    with pytest.raises(ValueError, match="registered twice"):
        register_term("toy_tax", kind="additive", order=11, parameters={}, switches=())(toy_tax)
    with pytest.raises(ValueError, match="belongs to another term"):
        register_term("toy_tax_2", kind="additive", order=11, parameters=PARAMETERS, switches=())(toy_tax)


def test_every_module_of_the_package_is_a_term():
    """The registry finds the modules itself: one term per module, none listed by hand."""
    modules = {module.name for module in pkgutil.iter_modules(terms_package.__path__)}
    assert {term.compute.__module__.rsplit(".", 1)[-1] for term in terms()} == modules
    assert len(terms()) == len(modules) == 12


# -- a term with per-prompt data of its own: each correct row beyond its prompt's budget loses a penalty -----
BUDGET_PARAMETERS = {
    "toy_budget_penalty": Parameter(NonNegative, 0.0, "the loss of a correct row over budget")
}


def toy_budget_value(value):
    """A budget is a positive number of tokens (a bool, a string or a non-positive number is malformed)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"not a budget: {value!r}")
    return float(value)


def toy_budget_prepare(params, meta):
    return {"budget": meta.columns["toy_budget"][:, 0]}


def toy_budget(view, inputs):
    over = view.positive & (view.lengths["total"] > inputs.prepared["budget"])
    return {"toy_budget": -view.p("toy_budget_penalty") * over}


def register_budget_term() -> None:
    register_term(
        "toy_budget",
        kind="additive",
        order=11,
        parameters=BUDGET_PARAMETERS,
        switches=("toy_budget_penalty",),
        columns=(PromptColumn("toy_budget", toy_budget_value, "docs/write-a-term.md"),),
        prepare=toy_budget_prepare,
    )(toy_budget)


@pytest.fixture
def budget_term():
    register_budget_term()
    yield
    unregister_term("toy_budget")


def budget_batch(budgets) -> RolloutBatch:
    """Two groups of three (total lengths 10, 20, 30; the last row wrong), one budget entry per prompt."""
    rows = [{"toy_budget": budget} for budget in budgets for _ in range(3)]
    return batch_of_two(metadata=rows)


def batch_of_two(**extra) -> RolloutBatch:
    one = batch()
    return RolloutBatch(
        one.rewards.repeat(2),
        torch.tensor([0, 0, 0, 1, 1, 1]),
        one.reasoning_lengths.repeat(2),
        one.answer_lengths.repeat(2),
        **extra,
    )


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


def test_an_unregistered_column_is_not_read():
    assert "toy_budget" not in metadata_columns()
    with pytest.raises(ValueError, match="must be new dataset column names"):
        register_term(
            "toy_band",
            kind="additive",
            order=12,
            parameters={},
            switches=(),
            columns=(PromptColumn("profile_band", toy_budget_value, "§2.12"),),
        )(toy_budget)


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


def test_a_cache_started_before_a_term_registers_starts_afresh():
    """The run's cache holds the columns of the terms registered when it began: registering a term with a
    column (or removing it) empties it, so no cached row lacks or misplaces a column."""
    cache = MetadataCache()
    cache.lookup(["a"], lambda new: [{"target_length": 5}])
    register_budget_term()
    try:
        table = cache.lookup(["a", "b"], lambda new: [{"target_length": 5, "toy_budget": 7}] * len(new))
        assert table.columns["toy_budget"][:, 0].tolist() == [7.0, 7.0] and cache.parsed == 3
    finally:
        unregister_term("toy_budget")
    assert cache.lookup(["a"], lambda new: [{"target_length": 6}]).target.tolist() == [6.0]


def test_a_wide_column_and_a_terms_own_record_line(caplog):
    """A two-number column (a window per prompt) and the term's ``record``: its line in the verbose record,
    its entry as an attribute."""

    def window_prepare(params, meta):
        return {"window": meta.columns["toy_window"]}

    def window(view, inputs):
        return {"toy_window": torch.zeros_like(view.rewards)}

    def window_record(params, values, shaped):
        return {"toy_window": {"low": values["window"][0], "high": values["window"][1]}}

    register_term(
        "toy_window",
        kind="additive",
        order=12,
        parameters={"toy_window_on": Parameter(bool, False, "record each group's window")},
        switches=("toy_window_on",),
        columns=(PromptColumn("toy_window", lambda value: value, "docs/write-a-term.md", width=2),),
        prepare=window_prepare,
        record=window_record,
    )(window)
    try:
        config = LengthPenaltyConfig.model_validate({"verbose": True, "default": {"toy_window_on": True}})
        result = apply_length_penalties(
            batch_of_two(metadata=[{"toy_window": [4, 9]}] * 3 + [None] * 3), config
        )
        first, second = result.groups
        assert first.toy_window == {"low": 4.0, "high": 9.0} and first.gate is None
        assert format_group_record(first).splitlines()[1] == "  toy_window low=4.0 high=9.0"
        assert math.isnan(second.toy_window["low"])
    finally:
        unregister_term("toy_window")
