"""The length schedule (curriculum): numeric keys of the shaping config moved through stages by optimizer
step (docs/reference/length-coefficient.md §3.7).

A ``length_schedule`` entry names a numeric key by its dotted path in ``LengthShapingConfig`` (for example
``length_penalty_coeff`` or ``length_penalty.default.group_total_length_penalty_coeff``) and lists stages:
each holds a ``value`` or ramps linearly from ``start`` to ``end`` until ``until_step`` (exclusive); after
the last stage the key has the value the config gives it. The coefficient's warm-up is the one-stage
schedule ``[{until_step: W, start: 0, end: length_penalty_coeff}]``.

:func:`config_at` gives the config of one step (every scheduled key at its value, no schedule left);
hosts pass the optimizer step to ``shape_rollouts``, which calls it, so TRL and verl move the same keys
the same way; :func:`coeff_at` is the coefficient of one step. The config validates the entries when it is
loaded (:func:`check_schedule`), and with them the configuration of every stage (:func:`check_stage_configs`),
by its own class: this module builds on the config's types without importing the config.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import TypeAdapter, ValidationError

from trl_length_plugin.config_base import config_error, unwrapped

from .schedule_keys import WARMUP_KEY, KeySchedule, ScheduleStage, scheduled_leaf
from .terms import terms

if TYPE_CHECKING:
    from .config import LengthShapingConfig

#: the checkpoint file that records the schedule and its values at the saved step
STATE_FILE = "length_schedule_state.json"


def warmup_schedule(config: LengthShapingConfig) -> KeySchedule | None:
    """``length_penalty_coeff_warmup_steps`` as a schedule: a ramp from 0 to the coefficient (§3.7)."""
    steps = config.length_penalty_coeff_warmup_steps
    if not steps:
        return None
    return KeySchedule(
        key=WARMUP_KEY, stages=(ScheduleStage(until_step=steps, start=0.0, end=config.length_penalty_coeff),)
    )


def schedules(config: LengthShapingConfig) -> tuple[KeySchedule, ...]:
    """Every schedule of the run: the written ``length_schedule`` and the warm-up's."""
    warmup = warmup_schedule(config)
    return (*config.length_schedule, *([warmup] if warmup else []))


def schedule_end(config: LengthShapingConfig) -> int:
    """The first step after every stage (0 without a schedule): from there each key has its config value."""
    return max((s.stages[-1].until_step for s in schedules(config)), default=0)


def value_at(schedule: KeySchedule, step: int, final: float) -> float:
    """The key's value at optimizer step ``step`` (negative steps count as 0); ``final`` after the last stage."""
    step, begin = max(step, 0), 0
    for stage in schedule.stages:
        if step < stage.until_step:
            if stage.value is not None:
                return stage.value
            return stage.start + (stage.end - stage.start) * (step - begin) / (stage.until_step - begin)
        begin = stage.until_step
    return final


def scheduled_values(config: LengthShapingConfig, step: int) -> dict[str, float]:
    """Each scheduled key's value at ``step``, by key path."""
    values = {}
    for schedule in schedules(config):
        owner, name = scheduled_leaf(config, schedule.key)
        values[schedule.key] = value_at(schedule, step, getattr(owner, name))
    return values


def stage_steps(config: LengthShapingConfig) -> list[int]:
    """The first and the last step between each two consecutive stage ends (0 is the first end). In between
    every scheduled key is constant or linear in the step, and the config's rules are bounds and orderings,
    so a rule that holds at both steps holds at every step between them (§3.7)."""
    ends = sorted({0, *(stage.until_step for s in schedules(config) for stage in s.stages)})
    return sorted({*ends[:-1], *(end - 1 for end in ends[1:])})


def stage_config_values(config: LengthShapingConfig, step: int) -> dict[str, Any]:
    """The keys a user would write to get the config of ``step``: the config's own keys with each scheduled
    key at its value, without schedule or warm-up. A switch scheduled to 0 keeps the config's value: the
    stage switches its term's effect off, not the term (§3.7)."""
    switches = {WARMUP_KEY, *(key for term in terms() for key in term.switches)}
    values = config.model_dump(
        exclude_unset=True, exclude={"length_schedule", "length_penalty_coeff_warmup_steps"}
    )
    for key, value in scheduled_values(config, step).items():
        *path, name = key.split(".")
        if value == 0 and name in switches:
            continue
        node = values
        for part in path:
            node = node.setdefault(part, {})
        node[name] = value
    return values


def _stages_at(config: LengthShapingConfig, step: int) -> str:
    """The stages in force at ``step``, by their key paths."""
    names = [
        f"length_schedule.{index}.stages.{number}"
        for index, schedule in enumerate(config.length_schedule)
        for number, stage in enumerate(schedule.stages)
        if step < stage.until_step and (number == 0 or step >= schedule.stages[number - 1].until_step)
    ]
    if step < config.length_penalty_coeff_warmup_steps:
        names.append("length_penalty_coeff_warmup_steps")
    return ", ".join(names)


def check_schedule(config: LengthShapingConfig) -> None:
    """Validate each ``length_schedule`` entry against ``config`` (``ValueError``, one line naming the key):
    a numeric key the config sets to a non-zero value (the value after the last stage), stage values the key
    accepts, ramps only on float keys, each key once and not both scheduled and warmed up; then the
    configuration of every stage, by the base configuration's rules (``schedule.check_stage_configs``)."""
    seen = {WARMUP_KEY} if config.length_penalty_coeff_warmup_steps else set()
    for index, schedule in enumerate(config.length_schedule):
        prefix = f"length_schedule.{index}.key: {schedule.key}"
        if schedule.key in seen:
            also = " and by length_penalty_coeff_warmup_steps" if schedule.key == WARMUP_KEY else " twice"
            raise ValueError(f"{prefix}: scheduled{also}; set one schedule per key")
        seen.add(schedule.key)
        try:
            owner, name = scheduled_leaf(config, schedule.key)
        except ValueError as err:
            raise ValueError(f"length_schedule.{index}.key: {err}") from None
        if not getattr(owner, name):
            raise ValueError(
                f"{prefix}: is 0 (off) in the config; set it to the value the key keeps after the last stage"
            )
        field = type(owner).model_fields[name]
        adapter = TypeAdapter(Annotated[(field.annotation, *field.metadata)])
        for number, stage in enumerate(schedule.stages):
            if stage.value is None and unwrapped(field.annotation) is int:
                raise ValueError(
                    f"length_schedule.{index}.stages.{number}: {schedule.key} is an integer key; give a value, "
                    "not a ramp"
                )
            for value in (stage.value, stage.start, stage.end):
                if value is None:
                    continue
                try:
                    adapter.validate_python(value)
                except ValidationError as err:
                    problem = err.errors()[0]["msg"].removeprefix("Value error, ")
                    raise ValueError(
                        f"length_schedule.{index}.stages.{number}: {value!r} for {schedule.key}: {problem}"
                    ) from None
    check_stage_configs(config)


def check_stage_configs(config: LengthShapingConfig) -> None:
    """Refuse a schedule that reaches a configuration the loader would refuse as a base configuration
    (``ValueError``, one line naming the stage, the step and the key): each step of :func:`stage_steps` is
    checked by the base configuration's own rules (§3.7)."""
    for step in stage_steps(config):
        try:
            type(config).model_validate(stage_config_values(config, step))
        except ValidationError as err:
            problem = config_error(err, model=type(config))
            raise ValueError(
                f"{_stages_at(config, step)}: the config of step {step} is refused: {problem}"
            ) from None


def _with_value(node: Any, parts: list[str], value: float) -> Any:
    head, *rest = parts
    if isinstance(node, dict):
        return {**node, head: _with_value(node[head], rest, value)}
    if not rest:
        kind = unwrapped(type(node).model_fields[head].annotation)
        return node.model_copy(update={head: int(value) if kind is int else float(value)})
    return node.model_copy(update={head: _with_value(getattr(node, head), rest, value)})


def config_at(config: LengthShapingConfig, step: int) -> LengthShapingConfig:
    """The config of optimizer step ``step``: each scheduled key at its value, without schedule or warm-up.

    What is switched on is judged on ``config`` (a key scheduled through 0 stays on, §3.7)."""
    values = scheduled_values(config, step)
    if not values:
        return config
    stepped: Any = config
    for key, value in values.items():
        stepped = _with_value(stepped, key.split("."), value)
    return stepped.model_copy(update={"length_schedule": (), "length_penalty_coeff_warmup_steps": 0})


def coeff_at(config: LengthShapingConfig, step: int) -> float:
    """The coefficient at optimizer step ``step``: its warm-up or ``length_schedule`` (§3.7)."""
    return config_at(config, step).length_penalty_coeff


def schedule_metrics(config: LengthShapingConfig, step: int) -> dict[str, float]:
    """``length_schedule/<key>``: each scheduled key's value at ``step``, for the host's metrics."""
    return {f"length_schedule/{key}": value for key, value in scheduled_values(config, step).items()}


def schedule_state(config: LengthShapingConfig, step: int) -> dict[str, Any]:
    """What a checkpoint records: the step, the schedules and their values there."""
    return {
        "step": step,
        "schedules": [s.model_dump(mode="json", exclude_none=True) for s in schedules(config)],
        "values": scheduled_values(config, step),
    }


def save_schedule_state(config: LengthShapingConfig, step: int, folder: str) -> None:
    """Write :func:`schedule_state` to ``folder/STATE_FILE`` (nothing when no key is scheduled)."""
    if schedules(config):
        with open(os.path.join(folder, STATE_FILE), "w") as state:
            json.dump(schedule_state(config, step), state)


def resume_message(config: LengthShapingConfig, step: int, folder: str) -> tuple[bool, str] | None:
    """On resume at ``step`` from ``folder``: ``(is_warning, message)``; a warning when the checkpoint's
    schedule differs from the config's or its file is missing, else where the schedule continues. None
    when no key is scheduled."""
    if not schedules(config):
        return None
    path = os.path.join(folder, STATE_FILE)
    now = schedule_state(config, step)
    try:
        with open(path) as state:
            saved = json.load(state)
        if not isinstance(saved, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        return True, f"length_schedule: {path} not found; the schedule continues by step {step}"
    except (OSError, ValueError) as err:  # the state is a record only: the schedule follows the step
        why = " ".join(str(err).split())
        return True, f"length_schedule: {path} is unreadable ({why}); the schedule continues by step {step}"
    if saved.get("schedules") != now["schedules"]:
        return True, (
            f"length_schedule: the checkpoint's schedule {saved.get('schedules')} differs from the config's "
            f"{now['schedules']}; continuing with the config's at step {step}"
        )
    values = ", ".join(f"{key}={value:g}" for key, value in now["values"].items())
    return False, f"length_schedule: resumed at step {step}: {values}"
