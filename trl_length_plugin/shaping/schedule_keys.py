"""The ``length_schedule`` entries (docs/reference/length-coefficient.md §3.7): where an entry may come from (a
list, a JSON array, a YAML file), its stages and the key path it moves; ``schedule.py`` checks them against the
config that holds them and moves the keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, model_validator

from trl_length_plugin.config_base import STRICT, did_you_mean, not_bool, read_json, read_yaml, unwrapped

from .fields import Number

if TYPE_CHECKING:
    from .config import LengthShapingConfig


def schedule_entries(value: Any) -> Any:
    """``length_schedule`` from a list, a JSON array string or the path of a YAML file (holding the list or
    a mapping whose only key is ``length_schedule``); None is no schedule."""
    if value is None:
        return ()
    if isinstance(value, str) and value.strip().startswith("["):
        return read_json(value)
    if isinstance(value, str | Path):
        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(f"{str(value)!r} is neither a JSON array nor the path of a YAML file")
        value = read_yaml(path) or ()
        if isinstance(value, Mapping) and set(value) == {"length_schedule"}:
            value = value["length_schedule"] or ()
    return value


class ScheduleStage(BaseModel):
    """One stage of a ``length_schedule`` entry: ``value``, or a linear ramp ``start`` -> ``end``, until
    optimizer step ``until_step`` (exclusive; docs/reference/length-coefficient.md §3.7)."""

    model_config = STRICT

    until_step: Annotated[int, Field(ge=1), BeforeValidator(not_bool)]
    value: Number | None = None
    start: Number | None = None
    end: Number | None = None

    @model_validator(mode="after")
    def _value_or_ramp(self) -> ScheduleStage:
        ramp = (self.start, self.end) != (None, None)
        if (self.value is None) != ramp or (ramp and None in (self.start, self.end)):
            raise ValueError("a stage needs either value, or start and end (a ramp)")
        return self


class KeySchedule(BaseModel):
    """One ``length_schedule`` entry: the dotted path of a numeric key and its stages, in step order (§3.7)."""

    model_config = STRICT

    key: Annotated[str, Field(min_length=1)]
    stages: Annotated[tuple[ScheduleStage, ...], Field(min_length=1)]

    @model_validator(mode="after")
    def _steps_increase(self) -> KeySchedule:
        steps = [stage.until_step for stage in self.stages]
        if any(later <= earlier for earlier, later in zip(steps, steps[1:], strict=False)):
            raise ValueError(f"until_step must increase from stage to stage, got {steps}")
        return self


#: the key the coefficient's warm-up schedules (docs/reference/length-coefficient.md §3.7)
WARMUP_KEY = "length_penalty_coeff"


def scheduled_leaf(config: LengthShapingConfig, key: str) -> tuple[BaseModel, str]:
    """The model instance that holds ``key``'s last part, and that part; ``ValueError`` naming the key when
    the path is unknown, passes through a block the config does not set, or ends on a non-number."""
    *path, name = key.split(".")
    node: Any = config
    for depth, part in enumerate(path):
        where = ".".join(path[: depth + 1])
        if isinstance(node, dict):
            if part not in node or node[part] is None:
                raise ValueError(
                    f"{where}: not set in the config (known: {', '.join(sorted(node)) or 'none'})"
                )
            node = node[part]
            continue
        if part not in type(node).model_fields:
            raise ValueError(f"{where}: unknown key{did_you_mean(part, type(node).model_fields)}")
        node = getattr(node, part)
        if node is None:
            raise ValueError(f"{where}: not set in the config; a schedule moves a key the config sets")
        if not isinstance(node, BaseModel | dict):
            raise ValueError(f"{where}: not a block of keys")
    if not isinstance(node, BaseModel) or name not in type(node).model_fields:
        known = type(node).model_fields if isinstance(node, BaseModel) else ()
        raise ValueError(f"{key}: unknown key{did_you_mean(name, known)}")
    kind = unwrapped(type(node).model_fields[name].annotation)
    if kind not in (int, float):
        raise ValueError(f"{key}: not a numeric key (a schedule moves numbers)")
    return node, name
