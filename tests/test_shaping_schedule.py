"""The length schedule (docs/reference/length-coefficient.md §3.7): stage values by step (hand-computed),
properties, bad entries refused at load naming the key, the warm-up as one schedule (identical numbers), the
stepped config the pipeline shapes with, and the checkpoint record."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trl_length_plugin.shaping import RolloutBatch, load_shaping_config, shape_rollouts
from trl_length_plugin.shaping.config import LengthConfigError, LengthShapingConfig
from trl_length_plugin.shaping.normalization import TRL_NORMALIZATION
from trl_length_plugin.shaping.schedule import (
    STATE_FILE,
    coeff_at,
    config_at,
    resume_message,
    save_schedule_state,
    schedule_end,
    schedule_metrics,
    scheduled_values,
    value_at,
)
from trl_length_plugin.shaping.schedule_keys import KeySchedule
from trl_length_plugin.shaping.terms import terms

GROUP_COEFF = "length_penalty.default.group_total_length_penalty_coeff"


def entry(*stages, key="length_penalty_coeff") -> KeySchedule:
    return KeySchedule.model_validate({"key": key, "stages": list(stages)})


def test_stage_values_and_ramps_by_hand():
    schedule = entry(
        {"until_step": 3, "value": 0.1},
        {"until_step": 7, "start": 0.2, "end": 1.0},
        {"until_step": 8, "value": 0.6},
    )
    got = [value_at(schedule, step, final=0.5) for step in (-2, 0, 2, 3, 4, 5, 6, 7, 8, 100)]
    # ramp over [3, 7): 0.2 + 0.8 * (step - 3) / 4
    assert got == pytest.approx([0.1, 0.1, 0.1, 0.2, 0.4, 0.6, 0.8, 0.6, 0.5, 0.5], abs=1e-15)


def test_warmup_is_one_schedule_with_identical_numbers():
    """The old rule, ``c * max(step, 0) / W`` below W and c after, bit for bit."""
    for coeff, warmup in [(2.0, 4), (0.3, 7), (1e-3, 3), (0.1, 1)]:
        config = LengthShapingConfig(length_penalty_coeff=coeff, length_penalty_coeff_warmup_steps=warmup)
        for step in range(-1, warmup + 3):
            old = coeff if step >= warmup else coeff * max(step, 0) / warmup
            assert coeff_at(config, step) == old  # exact
        written = load_shaping_config(
            {
                "length_penalty_coeff": coeff,
                "length_schedule": [{"key": "length_penalty_coeff", "stages": [
                    {"until_step": warmup, "start": 0.0, "end": coeff}]}],
            }
        )  # fmt: skip
        assert [coeff_at(written, s) for s in range(warmup + 2)] == [
            coeff_at(config, s) for s in range(warmup + 2)
        ]
    config = LengthShapingConfig(length_penalty_coeff=2.0, length_penalty_coeff_warmup_steps=4)
    assert [schedule_metrics(config, s) for s in (0, 1, 5)] == [
        {"length_schedule/length_penalty_coeff": v} for v in (0.0, 0.5, 2.0)
    ]


stage_lists = st.lists(
    st.tuples(
        st.integers(1, 20),
        st.one_of(
            st.floats(0, 10).map(lambda v: {"value": v}),
            st.tuples(st.floats(0, 10), st.floats(0, 10)).map(lambda r: {"start": r[0], "end": r[1]}),
        ),
    ),
    min_size=1,
    max_size=5,
)


def build(stages) -> KeySchedule:
    until, out = 0, []
    for gap, body in stages:
        until += gap
        out.append({"until_step": until, **body})
    return entry(*out)


@given(stage_lists, st.floats(0.01, 10), st.integers(-5, 150))
def test_value_is_a_stage_value_or_on_its_ramp(stages, final, step):
    schedule = build(stages)
    value = value_at(schedule, step, final)
    begin = 0
    for stage in schedule.stages:
        if max(step, 0) < stage.until_step:
            if stage.value is not None:
                assert value == stage.value
            else:
                low, high = sorted((stage.start, stage.end))
                assert low - 1e-12 <= value <= high + 1e-12
                assert value == pytest.approx(
                    stage.start
                    + (stage.end - stage.start) * (max(step, 0) - begin) / (stage.until_step - begin)
                )
            return
        begin = stage.until_step
    assert value == final


@given(stage_lists, st.integers(0, 120), st.integers(0, 120))
def test_stage_selection_is_monotone(stages, a, b):
    """A later step never falls in an earlier stage: with distinct constant values, the stage index of
    the value is non-decreasing in the step."""
    schedule = build([(gap, {"value": float(i)}) for i, (gap, _) in enumerate(stages)])
    first, second = sorted((a, b))
    index = lambda s: value_at(schedule, s, final=float(len(stages)))  # noqa: E731
    assert index(first) <= index(second)


def group_config(**extra) -> dict:
    return {"length_penalty": {"default": {"group_total_length_penalty_coeff": 0.4}}, **extra}


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        (
            [{"key": "length_penalty.default.group_total_length_penalty_cof", "stages": [{"until_step": 2, "value": 1}]}],
            "length_schedule.0.key: length_penalty.default.group_total_length_penalty_cof: unknown key "
            "(did you mean 'group_total_length_penalty_coeff'?)",
        ),
        (
            [{"key": "length_penalty_cof", "stages": [{"until_step": 2, "value": 1}]}],
            "length_schedule.0.key: length_penalty_cof: unknown key (did you mean 'length_penalty_coeff'?)",
        ),
        (
            [{"key": "length_penalty.default.length_type", "stages": [{"until_step": 2, "value": 1}]}],
            "length_schedule.0.key: length_penalty.default.length_type: not a numeric key",
        ),
        (
            [{"key": "length_penalty.default.enabled", "stages": [{"until_step": 2, "value": 1}]}],
            "length_schedule.0.key: length_penalty.default.enabled: not a numeric key",
        ),
        (
            [{"key": "length_penalty.agent_overrides.coder.total_bonus", "stages": [{"until_step": 2, "value": 1}]}],
            "length_schedule.0.key: length_penalty.agent_overrides: not set in the config",
        ),
        (
            [{"key": GROUP_COEFF, "stages": [{"until_step": 5, "value": 0.1}, {"until_step": 5, "value": 0.2}]}],
            "length_schedule.0: until_step must increase from stage to stage, got [5, 5]",
        ),
        (
            [{"key": GROUP_COEFF, "stages": [{"until_step": 5, "value": float("nan")}]}],
            "length_schedule.0.stages.0.value: Input should be a finite number",
        ),
        (
            [{"key": GROUP_COEFF, "stages": [{"until_step": 5, "value": -0.1}]}],
            f"length_schedule.0.stages.0: -0.1 for {GROUP_COEFF}: Input should be greater than or equal to 0",
        ),
        (
            [{"key": GROUP_COEFF, "stages": [{"until_step": 0, "value": 0.1}]}],
            "length_schedule.0.stages.0.until_step: Input should be greater than or equal to 1",
        ),
        (
            [{"key": GROUP_COEFF, "stages": [{"until_step": 3, "value": 0.1, "start": 0.0, "end": 1.0}]}],
            "length_schedule.0.stages.0: a stage needs either value, or start and end (a ramp)",
        ),
        (
            [{"key": GROUP_COEFF, "stages": [{"until_step": 3, "value": True}]}],
            "length_schedule.0.stages.0.value: expected a number, got a boolean",
        ),
        (
            [{"key": GROUP_COEFF, "stages": [{"until_step": 3, "value": 0.1, "steps": 2}]}],
            "length_schedule.0.stages.0.steps: Extra inputs are not permitted",
        ),
        (
            [{"key": "length_penalty.default.total_bonus", "stages": [{"until_step": 3, "value": 0.1}]}],
            "length_schedule.0.key: length_penalty.default.total_bonus: is 0 (off) in the config",
        ),
        (
            [{"key": "length_penalty.default.profiled_length_min_samples", "stages": [
                {"until_step": 3, "start": 2, "end": 4}]}],
            "length_schedule.0.stages.0: length_penalty.default.profiled_length_min_samples is an integer key",
        ),
        (
            [{"key": GROUP_COEFF, "stages": [{"until_step": 3, "value": 0.1}]}] * 2,
            f"length_schedule.1.key: {GROUP_COEFF}: scheduled twice",
        ),
        ("[{", "length_schedule: not valid JSON"),
    ],
)  # fmt: skip
def test_bad_schedules_are_refused_at_load_naming_the_key(schedule, message):
    with pytest.raises(LengthConfigError) as err:
        load_shaping_config(group_config(length_schedule=schedule))
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_a_scheduled_coefficient_cannot_also_warm_up():
    with pytest.raises(LengthConfigError, match="scheduled and by length_penalty_coeff_warmup_steps"):
        load_shaping_config(
            {
                "length_penalty_coeff": 1.0,
                "length_penalty_coeff_warmup_steps": 3,
                "length_schedule": [
                    {"key": "length_penalty_coeff", "stages": [{"until_step": 2, "value": 0.5}]}
                ],
            }
        )


def test_json_string_and_yaml_file(tmp_path):
    text = json.dumps([{"key": GROUP_COEFF, "stages": [{"until_step": 2, "value": 0.1}]}])
    from_json = load_shaping_config(group_config(length_schedule=text))
    path = tmp_path / "schedule.yaml"
    path.write_text(
        f"length_schedule:\n  - key: {GROUP_COEFF}\n    stages: [{{until_step: 2, value: 0.1}}]\n"
    )
    assert (
        load_shaping_config(group_config(length_schedule=str(path))).length_schedule
        == from_json.length_schedule
    )


def batch_of(lengths: list[float]) -> RolloutBatch:
    n = len(lengths)
    return RolloutBatch(
        rewards=[1.0, 1.0, 0.0, 1.0][:n],
        group_index=[0] * n,
        answer_lengths=lengths,
    )


def test_the_pipeline_shapes_with_the_steps_values_and_logs_them():
    """At each step the shaped rewards equal those of the config written with that step's value."""
    config = load_shaping_config(
        {
            "length_penalty": {"default": {"group_total_length_penalty_coeff": 0.4}},
            "length_schedule": [{"key": GROUP_COEFF, "stages": [{"until_step": 2, "value": 0.1},
                                                                {"until_step": 4, "start": 0.2, "end": 0.3}]}],
        }
    )  # fmt: skip
    lengths = [10.0, 20.0, 30.0, 40.0]
    for step, coeff in [(0, 0.1), (1, 0.1), (2, 0.2), (3, 0.25), (4, 0.4), (9, 0.4)]:
        unscheduled = load_shaping_config(
            {"length_penalty": {"default": {"group_total_length_penalty_coeff": coeff}}}
        )
        result = shape_rollouts(batch_of(lengths), config, TRL_NORMALIZATION, step=step)
        assert torch.equal(
            result.rewards, shape_rollouts(batch_of(lengths), unscheduled, TRL_NORMALIZATION).rewards
        )
        assert result.metrics[f"length_schedule/{GROUP_COEFF}"] == pytest.approx(coeff, abs=1e-15)
    first, later = (
        shape_rollouts(batch_of(lengths), config, TRL_NORMALIZATION, step=s).rewards for s in (0, 4)
    )
    assert not torch.equal(first, later)  # the schedule changes the numbers
    assert config.length_penalty.for_agent(None).group_total_length_penalty_coeff == 0.4  # the base stays


def test_config_at_keeps_what_is_on_and_shares_warnings():
    config = LengthShapingConfig(length_penalty_coeff=1.0, length_penalty_coeff_warmup_steps=2)
    stepped = config_at(config, 0)
    assert stepped.length_penalty_coeff == 0.0 and stepped.length_penalty_coeff_warmup_steps == 0
    assert stepped._warned is config._warned and config.coefficient_on
    assert config_at(LengthShapingConfig(length_penalty_coeff=1.0), 5) == LengthShapingConfig(
        length_penalty_coeff=1.0
    )


def test_integer_keys_stay_integers():
    config = load_shaping_config(
        {
            "length_penalty_coeff": 1.0,
            "length_penalty_min_tokens": 64,
            "length_schedule": [
                {"key": "length_penalty_min_tokens", "stages": [{"until_step": 3, "value": 256}]}
            ],
        }
    )
    assert [config_at(config, s).length_penalty_min_tokens for s in (0, 3)] == [256, 64]
    assert isinstance(config_at(config, 0).length_penalty_min_tokens, int)


def test_checkpoint_record_and_resume_messages(tmp_path):
    config = load_shaping_config(
        group_config(length_schedule=[{"key": GROUP_COEFF, "stages": [{"until_step": 3, "value": 0.1}]}])
    )
    save_schedule_state(config, 2, str(tmp_path))
    saved = json.loads((tmp_path / STATE_FILE).read_text())
    assert saved == {
        "step": 2,
        "schedules": [{"key": GROUP_COEFF, "stages": [{"until_step": 3, "value": 0.1}]}],
        "values": {GROUP_COEFF: 0.1},
    }
    assert resume_message(config, 2, str(tmp_path)) == (
        False,
        f"length_schedule: resumed at step 2: {GROUP_COEFF}=0.1",
    )
    changed = load_shaping_config(
        group_config(length_schedule=[{"key": GROUP_COEFF, "stages": [{"until_step": 5, "value": 0.1}]}])
    )
    warning, message = resume_message(changed, 2, str(tmp_path))
    assert warning and "differs from the config's" in message
    assert resume_message(config, 2, str(tmp_path / "missing"))[0]
    unscheduled = load_shaping_config(group_config())
    save_schedule_state(unscheduled, 2, str(tmp_path / "none"))  # nothing scheduled: no file, no message
    assert not (tmp_path / "none").exists() and resume_message(unscheduled, 2, str(tmp_path)) is None


OVERLONG = {"length_penalty": {"default": {"overlong_max_length": 4096, "overlong_buffer": 512}}}
BAND = {
    "length_penalty": {
        "profile_band": {"enabled": True, "defaults": {"total": {"a": 100, "b": 200, "f": 0.5}}}
    }
}
BAND_A, BAND_B = (
    "length_penalty.profile_band.defaults.total.a",
    "length_penalty.profile_band.defaults.total.b",
)
OVERLONG_MAX = "length_penalty.default.overlong_max_length"


@pytest.mark.parametrize(
    ("config", "schedule", "message"),
    [
        (  # a band stage whose a passes b: longer rollouts would be rewarded
            BAND, [{"key": BAND_A, "stages": [{"until_step": 10, "value": 300}]}],
            "length_schedule.0.stages.0: the config of step 0 is refused: "
            "length_penalty.profile_band.defaults.total: profile band needs b > a, got a=300.0, b=200.0",
        ),
        (  # b scheduled below a, in the second stage
            BAND, [{"key": BAND_B, "stages": [{"until_step": 10, "value": 150}, {"until_step": 20, "value": 50}]}],
            "length_schedule.0.stages.1: the config of step 10 is refused: "
            "length_penalty.profile_band.defaults.total: profile band needs b > a",
        ),
        (  # a ramp of a that ends past b: its last step is refused, though each value is a valid length
            BAND, [{"key": BAND_A, "stages": [{"until_step": 11, "start": 0, "end": 440}]}],
            "length_schedule.0.stages.0: the config of step 10 is refused: "
            "length_penalty.profile_band.defaults.total: profile band needs b > a, got a=400.0",
        ),
        (  # a and b scheduled together, crossing in their second stages
            BAND, [{"key": BAND_A, "stages": [{"until_step": 5, "value": 10}, {"until_step": 9, "value": 90}]},
                   {"key": BAND_B, "stages": [{"until_step": 7, "value": 80}]}],
            "length_schedule.0.stages.1, length_schedule.1.stages.0: the config of step 5 is refused",
        ),
        (  # an overlong maximum scheduled below its buffer: a zero-length answer would lose reward
            OVERLONG, [{"key": OVERLONG_MAX, "stages": [{"until_step": 10, "value": 2048}, {"until_step": 20, "value": 256}]}],
            "length_schedule.0.stages.1: the config of step 10 is refused: length_penalty.default.overlong_buffer: "
            "needs 0 < overlong_buffer <= overlong_max_length (256), got 512",
        ),
        (  # a buffer scheduled to 0: a division by zero
            OVERLONG, [{"key": "length_penalty.default.overlong_buffer", "stages": [{"until_step": 3, "value": 0}]}],
            "length_schedule.0.stages.0: the config of step 0 is refused: length_penalty.default.overlong_buffer",
        ),
    ],
)  # fmt: skip
def test_a_stage_whose_config_the_loader_refuses_is_refused_naming_the_stage(config, schedule, message):
    with pytest.raises(LengthConfigError) as err:
        load_shaping_config({**config, "length_schedule": schedule})
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("config", "schedule"),
    [
        (OVERLONG, [{"key": OVERLONG_MAX, "stages": [{"until_step": 10, "value": 2048}, {"until_step": 20, "value": 512}]}]),
        (OVERLONG, [{"key": OVERLONG_MAX, "stages": [{"until_step": 10, "value": 0}]}]),  # the term's effect off
        (BAND, [{"key": BAND_A, "stages": [{"until_step": 10, "start": 0, "end": 199}]}]),
        ({"length_penalty_coeff": 1.0, "length_penalty_min_tokens": 64, "length_penalty_coeff_warmup_steps": 5}, ()),
    ],
)  # fmt: skip
def test_stages_the_base_rules_accept_load(config, schedule):
    load_shaping_config({**config, "length_schedule": schedule})


SCHEDULABLE = {
    "length_penalty_coeff": 0.5,
    "length_penalty_min_tokens": 20,
    OVERLONG_MAX: 300,
    "length_penalty.default.overlong_buffer": 100,
    "length_penalty.default.overlong_factor": 1.0,
    "length_penalty.default.group_total_length_penalty_coeff": 0.2,
    "length_penalty.default.target_length_alpha": 0.001,
    "length_penalty.default.cosine_max_length": 400,
    "length_penalty.default.cosine_min_value_wrong": -1.0,
    BAND_A: 100,
    BAND_B: 250,
    "length_penalty.profile_band.defaults.total.f": 0.5,
}
SWITCHES = {"length_penalty_coeff", *(key for term in terms() for key in term.switches)}


def base_config() -> dict:
    default = {key.rpartition(".")[2]: value for key, value in SCHEDULABLE.items() if ".default." in key}
    band = {"a": SCHEDULABLE[BAND_A], "b": SCHEDULABLE[BAND_B], "f": 0.5}
    return {
        "length_penalty_coeff": 0.5,
        "length_penalty_min_tokens": 20,
        "length_penalty": {
            "default": {**default, "target_length": "exact"},
            "profile_band": {"enabled": True, "defaults": {"total": band}},
        },
    }


stage_value = st.one_of(
    st.integers(-5, 600),
    st.floats(-2.0, 600.0),
    st.sampled_from([0, 0.0, 1e6, 1e308, 2**60, -1e308]),
)
stage = st.one_of(
    st.tuples(st.integers(1, 4), stage_value).map(lambda s: {"gap": s[0], "value": s[1]}),
    st.tuples(st.integers(1, 4), stage_value, stage_value).map(
        lambda s: {"gap": s[0], "start": s[1], "end": s[2]}
    ),
)


def as_stages(drawn: list[dict]) -> list[dict]:
    until, stages = 0, []
    for item in drawn:
        until += item["gap"]
        stages.append({"until_step": until, **{k: v for k, v in item.items() if k != "gap"}})
    return stages


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@example(  # accepted before issue 31: NaN advantages
    entries={"length_penalty.default.target_length_alpha": [{"gap": 2, "value": 1e308}]},
    rewards=[1.0, 0.0] * 4,
    lengths=[10, 300, 200, 50, 1, 2, 3, 499],
)
@given(
    entries=st.dictionaries(st.sampled_from(sorted(SCHEDULABLE)), st.lists(stage, min_size=1, max_size=3), max_size=3),
    rewards=st.lists(st.sampled_from([0.0, 1.0]), min_size=8, max_size=8),
    lengths=st.lists(st.integers(0, 500), min_size=8, max_size=8),
)  # fmt: skip
def test_whatever_the_loader_accepts_shapes_finite_numbers_with_base_configs_at_every_step(
    entries, rewards, lengths
):
    """Every step of an accepted schedule has a configuration the loader accepts as a base configuration
    (a switch at 0 read at the config's value, §3.7) and one shaping step of finite numbers."""
    logging.getLogger("trl_length_plugin").setLevel(logging.ERROR)
    schedule = [{"key": key, "stages": as_stages(stages)} for key, stages in entries.items()]
    try:
        config = load_shaping_config({**base_config(), "length_schedule": schedule})
    except LengthConfigError:
        return
    batch = RolloutBatch(
        rewards=rewards,
        group_index=[0] * 4 + [1] * 4,
        answer_lengths=lengths,
        loss_lengths=lengths,
        metadata=[{"target_length": 200}] * 8,
    )
    for step in range(schedule_end(config) + 1):
        values = base_config()
        for key, value in scheduled_values(config, step).items():
            *path, name = key.split(".")
            if value == 0 and name in SWITCHES:
                continue
            node = values
            for part in path:
                node = node[part]
            node[name] = value
        load_shaping_config(values)
        result = shape_rollouts(batch, config, TRL_NORMALIZATION, step=step)
        for numbers in (result.rewards, result.totals, result.advantages):
            assert torch.isfinite(numbers).all(), (step, numbers)
