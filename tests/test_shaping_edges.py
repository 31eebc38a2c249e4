"""Numbers at the edges (issue 31, class 4; docs/reference/length-penalties.md §2.1, §2.5, §2.20,
docs/reference/product.md §1.4): every float key is finite and bounded so that its products cannot
overflow, and the extremes shape finite numbers; targets, prompt columns and a batch's truncation flags and
devices are checked with named errors."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from trl_length_plugin.config_base import unwrapped
from trl_length_plugin.shaping import (
    LengthConfigError,
    RolloutBatch,
    add_target_lengths,
    load_shaping_config,
    prompt_with_target,
    shape_rollouts,
)
from trl_length_plugin.shaping.config import LengthPenaltyParams, LengthShapingConfig
from trl_length_plugin.shaping.fields import MAX_LENGTH, MAX_WEIGHT
from trl_length_plugin.shaping.normalization import TRL_NORMALIZATION


def bounds(field) -> tuple[float | None, float | None]:
    """The (lower, upper) bound of a pydantic field, None where it has none."""
    low = next((getattr(m, name) for m in field.metadata for name in ("ge", "gt") if hasattr(m, name)), None)
    high = next((getattr(m, name) for m in field.metadata for name in ("le", "lt") if hasattr(m, name)), None)
    return low, high


FLOAT_KEYS = {
    **{f"length_penalty.default.{k}": f for k, f in LengthPenaltyParams.model_fields.items()},
    **dict(LengthShapingConfig.model_fields),
}
FLOAT_KEYS = {k: f for k, f in FLOAT_KEYS.items() if unwrapped(f.annotation) in (int, float)}


@pytest.mark.parametrize("key", sorted(FLOAT_KEYS))
def test_every_number_key_has_a_finite_documented_range(key):
    low, high = bounds(FLOAT_KEYS[key])
    assert high is not None and high <= max(MAX_WEIGHT, MAX_LENGTH), key
    assert low is None or low >= -MAX_WEIGHT, key


def as_config(key: str, value) -> dict:
    *path, name = key.split(".")
    config: dict = {}
    node = config
    for part in path:
        node = node.setdefault(part, {})
    node[name] = value
    return config


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("length_penalty.default.target_length_alpha", 1e308, "Input should be less than or equal to 1000000"),
        ("length_penalty.default.overlong_factor", 1e7, "Input should be less than or equal to 1000000"),
        ("length_penalty.default.cosine_min_value_wrong", -1e300, "Input should be greater than or equal to -1000000"),
        ("length_penalty.default.profiled_length_n_std", 1e300, "Input should be less than or equal to 1000000"),
        ("length_penalty.default.total_bonus", 2e6, "Input should be less than or equal to 1000000"),
        ("length_penalty.default.target_length_tolerance", 1e30, "Input should be less than or equal to 1000000"),
        ("length_penalty_coeff", 1e308, "Input should be less than or equal to 1000000"),
        ("length_penalty.default.overlong_max_length", 2**60, "Input should be less than or equal to 9007199254740992"),
        ("length_penalty.default.profiled_length_min_samples", 2**64, "Input should be less than or equal to 9007199254740992"),
        ("length_penalty_min_tokens", 10**30, "Input should be less than or equal to 9007199254740992"),
    ],
)  # fmt: skip
def test_a_number_beyond_its_range_is_refused_at_load_naming_the_key(key, value, message):
    with pytest.raises(LengthConfigError) as err:
        load_shaping_config(as_config(key, value))
    assert str(err.value).startswith(f"{key}: {message}"), str(err.value)


def extreme_config(sign: float) -> dict:
    """Every term on, every float key at the end of its range (``sign``: the upper or the lower end)."""
    default = {}
    for name, field in LengthPenaltyParams.model_fields.items():
        if unwrapped(field.annotation) is float:
            low, high = bounds(field)
            default[name] = low if sign < 0 and low == -MAX_WEIGHT else high
    default["top_percentile"] = 1.0
    default |= {
        "overlong_max_length": int(MAX_LENGTH),
        "overlong_buffer": int(MAX_LENGTH),
        "cosine_max_length": 1,
    }
    default |= {"target_length": "exact", "profile_band_total": True, "truncation": "penalty"}
    default.pop("target_length_delta")  # exact has no delta
    return {
        "length_penalty": {"default": default},
        "length_penalty_coeff": MAX_WEIGHT,
        "length_penalty_min_tokens": 1,
    }


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_keys_at_the_ends_of_their_ranges_shape_finite_numbers(sign, dtype):
    logging.getLogger("trl_length_plugin").setLevel(logging.ERROR)
    config = load_shaping_config(extreme_config(sign))
    lengths = [0.0, 1.0, MAX_LENGTH, 3.0, MAX_LENGTH, 0.0, 7.0, 2.0**40]
    batch = RolloutBatch(
        rewards=torch.tensor([1, 1, 1, 0, 1, 0, 1, 1], dtype=dtype),
        group_index=[0] * 4 + [1] * 4,
        reasoning_lengths=lengths[::-1],
        answer_lengths=lengths,
        loss_lengths=lengths,
        truncated=[True, False] * 4,
        metadata=[{"target_length": MAX_LENGTH, "profile_band": {"total": {"a": 0, "b": 1, "f": 0.5}}}] * 4
        + [{"target_length": 1}] * 4,
    )
    result = shape_rollouts(batch, config, TRL_NORMALIZATION)
    for numbers in (result.rewards, result.totals, result.advantages):
        assert torch.isfinite(numbers).all(), numbers
    assert torch.isfinite(result.rewards.to(dtype)).all()


# -- targets and the prompt column (docs/reference/length-penalties.md §2.20) ---------------------------------
@pytest.mark.parametrize("bad", [math.nan, math.inf, 0, -3, 0.0, True, "120", 2.0**60])
def test_prompt_with_target_refuses_what_add_target_lengths_refuses(bad):
    with pytest.raises(ValueError, match=r"^prompt_with_target: target_length must be") as err:
        prompt_with_target("Add 2 and 3.", bad)
    with pytest.raises(ValueError) as by_dataset:
        add_target_lengths([{"prompt": "Add 2 and 3."}], targets=[bad])
    assert str(err.value).removeprefix("prompt_with_target") == str(by_dataset.value).removeprefix("row 0")


def test_a_row_without_the_prompt_column_is_a_named_error():
    with pytest.raises(ValueError, match=r"^row 1: no 'prompt' column .* the row has 'question'"):
        add_target_lengths([{"prompt": "a"}, {"question": "b"}], (10, 20))
    with pytest.raises(ValueError, match=r"^row 0: no 'query' column"):
        add_target_lengths([{"prompt": "a"}], targets=[12], prompt_column="query")


def test_nothing_to_take_targets_from_is_an_error():
    import datasets

    rows = [{"prompt": "a"}, {"prompt": "b"}]
    for dataset in (rows, datasets.Dataset.from_list(rows)):
        with pytest.raises(ValueError, match="no target_length column to take targets from"):
            add_target_lengths(dataset)
    assert add_target_lengths([{"prompt": "a", "target_length": None}]) == [
        {"prompt": "a", "target_length": None}
    ]


# -- a batch's flags and devices (docs/reference/length-penalties.md §2.5) ----------------------------------
@pytest.mark.parametrize("name", ["truncated", "multi_component"])
@pytest.mark.parametrize(
    "flags",
    [[2, 0, 0, 1], [0.5, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 1.0], ["no", "yes", "no", "no"], [True, None, False, True],
     torch.tensor([1.0, 0, 0, 1]), np.array([2, 0, 0, 0]), [[True], [False, True], [True], [True]]],
)  # fmt: skip
def test_flags_that_are_not_booleans_are_refused(name, flags):
    with pytest.raises(ValueError, match=rf"^{name} must be booleans \(or 0 and 1\), one per row"):
        RolloutBatch(rewards=[1.0, 0.0, 1.0, 1.0], group_index=[0] * 4, **{name: flags})


@pytest.mark.parametrize("flags", [[True, False, False, True], np.array([1, 0, 0, 1], dtype=bool),
                                   torch.tensor([True, False, False, True]), [1, 0, 0, 1],
                                   torch.tensor([1, 0, 0, 1])])  # fmt: skip
def test_boolean_flags_are_taken(flags):
    batch = RolloutBatch(rewards=[1.0, 0.0, 1.0, 1.0], group_index=[0] * 4, truncated=flags)
    assert batch.truncated.tolist() == [True, False, False, True]


@pytest.mark.parametrize(
    "name", ["rewards", "group_index", "answer_lengths", "loss_lengths", "base_rewards", "truncated"]
)
def test_a_meta_tensor_is_a_named_error(name):
    values = {
        "rewards": torch.tensor([1.0, 0.0, 1.0, 1.0]),
        "group_index": torch.tensor([0, 0, 0, 0]),
        "answer_lengths": torch.tensor([3.0, 4.0, 5.0, 6.0]),
        "loss_lengths": torch.tensor([3.0, 4.0, 5.0, 6.0]),
        "base_rewards": torch.tensor([1.0, 0.0, 1.0, 1.0]),
        "truncated": torch.tensor([False] * 4),
    }
    values[name] = values[name].to("meta")
    with pytest.raises(ValueError, match=rf"^{name} is a meta tensor \(no values\)"):
        RolloutBatch(**values)


def test_a_top_k_beyond_the_captures_int32_ids_is_refused_when_the_config_is_built():
    from trl_length_plugin.score_centering.config import MAX_TOP_K, load_score_centering_config

    assert load_score_centering_config({"score_centering": True, "score_centering_top_k": MAX_TOP_K})
    with pytest.raises(
        ValueError, match=r"^score_centering_top_k: Input should be less than or equal to 2147483647"
    ):
        load_score_centering_config({"score_centering": True, "score_centering_top_k": 2**40})


@pytest.mark.parametrize(
    "key",
    ["score_centering_adaptive_outer_bound", "score_centering_adaptive_k_delta", "score_centering_adaptive_k_init",
     "score_centering_adaptive_k_min", "score_centering_adaptive_k_max"],
)  # fmt: skip
def test_the_adaptive_controllers_numbers_are_bounded(key):
    from trl_length_plugin.score_centering.config import ScoreCenteringConfig

    low, high = bounds(ScoreCenteringConfig.model_fields[key])
    assert high == MAX_WEIGHT and (low == 0 or low == -MAX_WEIGHT)
