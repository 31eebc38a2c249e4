"""The core's answers to bad input that issue 11's classes left open (docs/reference/length-penalties.md
§2.5, §2.12-2.13, docs/reference/length-coefficient.md §3.1, §3.3, docs/reference/product.md §1.4).

- Band bounds: a negative or inverted ``a`` / ``b`` in ``profile_band.defaults`` is a load-time error naming
  the key; in a prompt's ``profile_band`` it is ignored, warned once and counted (both parser paths).
- ``apply_length_coefficient``: ``coeff`` and ``min_tokens`` that are NaN, infinite, negative, strings or
  booleans are named errors; ``shape_rollouts``: a NaN or infinite ``shaping_weight`` is one.
- ``group_advantages``: an unknown ``std_scope`` is a named error with the closest scope.
- The profile gate or a band with no band source anywhere is warned once per run by the engine itself (so
  verl, which calls only the engine, says it too), with the rule TRL's setup warning uses.
- ``measure_lengths``: a completion that is not a string or a list of messages, and text with a lone
  surrogate, are named errors with the completion's index.
- A key written twice in one YAML mapping (a recipe, a length_penalty file) is refused, naming the key and
  both lines; a ``<<`` merge may still be overridden.
- A misspelt key at any depth of the length_penalty block gets the closest key of its level.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from trl_length_plugin.config_base import did_you_mean, read_yaml
from trl_length_plugin.shaping import (
    LengthConfigError,
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

BAND = {"default": {"profile_band_total": True}}
GATE = {"default": {"group_length_penalty_profile_gate": True, "group_total_length_penalty_coeff": 0.5}}


# -- band bounds -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("band", "message"),
    [
        ({"a": -1, "b": 10, "f": 0.5}, "length_penalty.profile_band.defaults.total.a: Input should be greater"),
        ({"a": -10, "b": -1, "f": 0.5}, "length_penalty.profile_band.defaults.total.a: Input should be greater"),
        ({"a": 10, "b": 10, "f": 0.5}, "length_penalty.profile_band.defaults.total: profile band needs b > a"),
        ({"a": 10, "b": 4, "f": 0.5}, "length_penalty.profile_band.defaults.total: profile band needs b > a"),
        ({"a": 0, "b": 2.0**54, "f": 0.5}, "length_penalty.profile_band.defaults.total.b: Input should be less"),
    ],
)  # fmt: skip
def test_bad_default_band_bounds_are_load_time_errors(band, message):
    block = {"profile_band": {"enabled": True, "defaults": {"total": band}}}
    with pytest.raises(LengthConfigError) as info:
        load_shaping_config({"length_penalty": block})
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_a_band_from_zero_is_valid():
    block = load_length_penalty_config(
        {"profile_band": {"enabled": True, "defaults": {"total": {"a": 0, "b": 8, "f": 0.5}}}}
    )
    assert block.global_bands["total"].a == 0.0


@pytest.mark.parametrize(
    "band",
    [
        {"a": -4, "b": 12, "f": 0.5},  # the bulk parser (plain dicts of plain numbers)
        {"a": -12, "b": -4, "f": 0.5},
        {"a": 12, "b": 4, "f": 0.5},
        {"a": np.int64(-4), "b": 12, "f": 0.5},  # the per-entry parser
        {"a": torch.tensor(12.0), "b": np.float32(4.0), "f": 0.5},
    ],
)
def test_bad_per_prompt_band_bounds_are_ignored_warned_and_counted(band, caplog):
    """Lengths 2 and 20 in one all-correct group: a valid band {a: 4, b: 12, f: 0.5} would halve the long
    row; the malformed one leaves both at 1, is warned about and counted."""
    batch = RolloutBatch([1, 1], [0, 0], [0, 0], [2, 20], metadata=[{"profile_band": {"total": band}}] * 2)
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        result = apply_length_penalties(batch, BAND)
    assert result.rewards.tolist() == [1.0, 1.0]
    assert result.metrics["length_penalty/invalid_metadata_frac"] == 1.0
    assert any("malformed total metadata" in r.getMessage() for r in caplog.records)
    valid = RolloutBatch(
        [1, 1],
        [0, 0],
        [0, 0],
        [2, 20],
        metadata=[{"profile_band": {"total": {"a": 4, "b": 12, "f": 0.5}}}] * 2,
    )
    assert apply_length_penalties(valid, BAND).rewards.tolist() == [1.0, 0.5]


# -- the coefficient's and the step's numbers ---------------------------------------------------------------
bad_numbers = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, "1", "nan", True, False, None, [1], np.float64("nan")]),
    st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False),
)


@given(value=bad_numbers)
def test_bad_min_tokens_and_coeff_are_named_errors(value):
    args = ([1.0, 0.0], [4, 8], [0, 0])
    with pytest.raises(ValueError, match="^length_penalty_min_tokens must be a finite number >= 0"):
        apply_length_coefficient(*args, coeff=0.5, min_tokens=value)
    with pytest.raises(ValueError, match="^length_penalty_coeff must be a finite number >= 0"):
        apply_length_coefficient(*args, coeff=value)


def test_numpy_and_tensor_scalars_are_numbers_for_the_coefficient():
    """Group [correct 4 tokens, correct 8 tokens], c = 0.5, floor 6: the long row gets 1 / (1 + 0.5 * 2 / 6)."""
    for coeff, floor in [(0.5, 6), (np.float32(0.5), np.int64(6)), (torch.tensor(0.5), torch.tensor(6))]:
        result = apply_length_coefficient([1.0, 1.0], [4, 8], [0, 0], coeff=coeff, min_tokens=floor)
        assert result.rewards.tolist() == [1.0, 1 / (1 + 0.5 * 2 / 6)]


@pytest.mark.parametrize("weight", [math.nan, math.inf, "1", True, None])
def test_a_non_finite_shaping_weight_is_a_named_error(weight):
    batch = RolloutBatch([1, 1], [0, 0], [0, 0], [2, 20], loss_lengths=[2, 20])
    config = load_shaping_config({"length_penalty_coeff": 1.0})
    with pytest.raises(ValueError, match="^shaping_weight must be a finite number, got"):
        shape_rollouts(batch, config, TRL_NORMALIZATION, shaping_weight=weight)
    totals = shape_rollouts(
        batch, config, TRL_NORMALIZATION, shaping_weight=0.5
    ).totals  # base 1 + 0.5 * (1/(1 + 9) - 1)
    assert totals.tolist() == [1.0, 1 + 0.5 * (1 / 10 - 1)]


@pytest.mark.parametrize(
    ("scope", "hint"),
    [("grup", " (did you mean 'group'?)"), ("Batch", " (did you mean 'batch'?)"), ("rows", "")],
)
def test_an_unknown_std_scope_is_a_named_error(scope, hint):
    with pytest.raises(ValueError) as info:
        group_advantages([1.0, 0.0], [1.0, 0.0], [0, 0], std_scope=scope)
    assert str(info.value) == f"std_scope: {scope!r} is not one of 'group', 'batch'{hint}"
    # a mixed group [1, 0]: mean 0.5, unbiased std sqrt(0.5)
    expected = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert group_advantages([1.0, 0.0], [1.0, 0.0], [0, 0]).tolist() == pytest.approx(
        [expected, -expected], rel=1e-12
    )


# -- no band source ----------------------------------------------------------------------------------------
NO_SOURCE = "is on but no prompt of the batch has a 'profile_band' and length_penalty.profile_band.defaults sets no band"


@pytest.mark.parametrize("block", [GATE, BAND])
def test_the_engine_warns_once_when_no_band_source_exists(block, caplog):
    config = load_shaping_config({"length_penalty": block})
    batch = RolloutBatch([1, 0, 1, 1], [0, 0, 1, 1], [0, 0, 0, 0], [5, 9, 3, 30])
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        for _ in range(3):
            result = shape_rollouts(batch, config, TRL_NORMALIZATION)
    warnings = [r.getMessage() for r in caplog.records if NO_SOURCE in r.getMessage()]
    key = next(iter(block["default"]))
    assert warnings == [
        f"length_penalty: {key} is on but no prompt of the batch has a 'profile_band' and length_penalty.profile_band.defaults sets no band: the gate stays closed and no band applies (docs/reference/length-penalties.md §2.12-2.13)"
    ]
    assert result.rewards.tolist() == [1.0, 0.0, 1.0, 1.0]  # closed gate, no band: nothing changes


@pytest.mark.parametrize(
    ("block", "metadata"),
    [
        (BAND, [{"profile_band": {"total": {"a": 4, "b": 12, "f": 0.5}}}, None]),  # one prompt has a band
        (BAND, [{"profile_band": {"total": {"a": 12, "b": 4, "f": 0.5}}}, None]),  # a malformed one: its own warning
        ({**BAND, "profile_band": {"enabled": True, "defaults": {"total": {"a": 4, "b": 12, "f": 0.5}}}}, None),
        ({"default": {"group_total_length_penalty_coeff": 0.5}}, None),  # nothing reads a band
    ],
)  # fmt: skip
def test_no_band_source_warning_when_a_band_exists_or_none_is_read(block, metadata, caplog):
    config = load_shaping_config({"length_penalty": block})
    rows = None if metadata is None else [metadata[0], metadata[0], metadata[1], metadata[1]]
    batch = RolloutBatch([1, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 0], [5, 20, 3, 30], metadata=rows)
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        shape_rollouts(batch, config, TRL_NORMALIZATION)
    assert not [r for r in caplog.records if "sets no band" in r.getMessage()]


# -- measuring lengths -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("completions", "message"),
    [
        (["ok", 5], "completions[1]: expected a string or a list of chat messages, got int"),
        ([None], "completions[0]: expected a string or a list of chat messages, got NoneType"),
        ([b"bytes"], "completions[0]: expected a string or a list of chat messages, got bytes"),
        ([{"role": "assistant", "content": "x"}], "completions[0]: expected a string or a list of chat messages, got dict"),
        ([["not a message"]], "completions[0]: a chat message must be a mapping, got str"),
        ([[{"role": "assistant", "content": 7}]], "completions[0]: a message's content must be a string or a list of parts, got int"),
        (["fine", "lone \ud800 surrogate"], "completions[1]: not valid Unicode text (it holds a lone surrogate)"),
        ([[{"role": "assistant", "content": "<think>\udfff</think>"}]], "completions[0]: not valid Unicode text"),
    ],
)  # fmt: skip
def test_measure_lengths_names_bad_completions(completions, message):
    with pytest.raises(ValueError) as info:
        measure_lengths(completions, "chars")
    assert str(info.value).startswith(message)


@given(text=st.text(), surrogate=st.integers(0xD800, 0xDFFF), at=st.integers(0, 50))
def test_a_lone_surrogate_anywhere_is_a_named_error(text, surrogate, at):
    position = min(at, len(text))
    bad = text[:position] + chr(surrogate) + text[position:]
    if "<" not in text:  # no reasoning tags: every character counts
        assert measure_lengths([text], "chars").total.tolist() == [len(text)]
    with pytest.raises(ValueError, match=r"^completions\[0\]: not valid Unicode text"):
        measure_lengths([bad], "chars")


def test_valid_non_ascii_text_is_measured():
    lengths = measure_lengths(["<think>héllo</think>wörld 😀"], "chars")
    assert (lengths.reasoning.tolist(), lengths.answer.tolist()) == ([5], [7])


# -- YAML and nested keys ----------------------------------------------------------------------------------
def test_a_duplicate_yaml_key_is_refused_naming_both_lines(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "length_penalty:\n  default:\n    total_bonus: 0.1\n    enabled: true\n    total_bonus: 0.2\n"
    )
    with pytest.raises(ValueError) as info:
        read_yaml(path)
    assert str(info.value) == f"{path}: key 'total_bonus' written twice (line 3 and line 5)"
    with pytest.raises(ValueError, match="key 'total_bonus' written twice"):
        load_length_penalty_config(str(path))
    path.write_text("base: &b {total_bonus: 0.1, enabled: true}\ndefault:\n  <<: *b\n  total_bonus: 0.3\n")
    assert read_yaml(path)["default"] == {"total_bonus": 0.3, "enabled": True}  # a merge may be overridden


def test_top_level_duplicates_are_refused_too(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("learning_rate: 1.0e-5\nmax_steps: 3\nlearning_rate: 2.0e-5\n")
    with pytest.raises(ValueError, match=r"key 'learning_rate' written twice \(line 1 and line 3\)$"):
        read_yaml(path)


@given(st.sampled_from(["total_bonus", "group_total_length_penalty_coeff", "profile_band_answer", "top_percentile"]),
       st.integers(0, 10**6))  # fmt: skip
def test_a_nested_typo_names_the_key_meant(key, seed):
    """Dropping one letter of a key (or changing its case) at the agent level gives that key back."""
    rng = np.random.default_rng(seed)
    i = int(rng.integers(len(key)))
    typo = key[:i] + key[i + 1 :] if seed % 2 else key.upper()
    for block, where in [
        ({"default": {typo: 1}}, "length_penalty.default"),
        ({"agent_overrides": {"math": {typo: 1}}}, "length_penalty.agent_overrides.math"),
    ]:
        with pytest.raises(LengthConfigError) as info:
            load_shaping_config({"length_penalty": block})
        assert str(info.value) == f"{where}.{typo}: unknown key (did you mean {key!r}?)"
    assert did_you_mean(typo, [key, "enabled"]) == f" (did you mean {key!r}?)"
