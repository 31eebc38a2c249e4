"""The settings lines of a run: one line per length feature that is on, with every key it set and its value
(docs/reference/length-coefficient.md §3.4), for the setup log of every host and adapter; score centering's
line adds the keys to its resolved plan (docs/reference/score-centering.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from .config import LengthShapingConfig

PREFIX = "trl-length-plugin: "
COEFFICIENT_KEYS = ("length_penalty_coeff", "length_penalty_min_tokens", "length_penalty_coeff_warmup_steps")


def _value(value: Any) -> str:
    """``0.1``, ``true``, ``chars``, ``["<a>", "</a>"]``: numbers and strings bare, the rest as JSON."""
    if isinstance(value, bool) or value is None or isinstance(value, list | tuple | Mapping):
        return json.dumps(value)
    return str(value)


def flat_items(settings: Mapping[str, Any], prefix: str = "") -> list[str]:
    """``key=value`` of every leaf of a nested mapping, dotted paths, in key order."""
    items = []
    for key in sorted(settings):
        value = settings[key]
        if isinstance(value, Mapping) and value:
            items.extend(flat_items(value, f"{prefix}{key}."))
        else:
            items.append(f"{prefix}{key}={_value(value)}")
    return items


def shaping_settings_lines(config: LengthShapingConfig) -> list[str]:
    """One line per length feature that is on: the group penalties with every key of the block that differs
    from its default, the coefficient with its value, floor and warm-up, the zero-std filter."""
    lines = []
    if config.penalties_on:
        block = config.length_penalty.model_dump(mode="json", exclude_defaults=True)
        lines.append(
            f"{PREFIX}group length penalties: "
            + ", ".join(flat_items(block, "length_penalty.") or ["length_penalty={} (the defaults)"])
        )
    if config.coefficient_on:
        values = ", ".join(f"{key}={_value(getattr(config, key))}" for key in COEFFICIENT_KEYS)
        lines.append(f"{PREFIX}length coefficient: {values}")
    if config.drop_zero_std_groups:
        lines.append(f"{PREFIX}zero-std filter: drop_zero_std_groups=true")
    if config.length_schedule:
        schedule = [s.model_dump(mode="json", exclude_none=True) for s in config.length_schedule]
        lines.append(f"{PREFIX}length schedule: length_schedule={_value(schedule)}")
    return lines


def score_centering_settings_line(config: BaseModel, summary: str) -> str:
    """The score-centering line: the resolved plan (``summary``), then every key of ``config`` (a
    ``ScoreCenteringConfig``) that differs from its default, with its value."""
    return f"{PREFIX}{summary}; " + ", ".join(
        flat_items(config.model_dump(mode="json", exclude_defaults=True))
    )
