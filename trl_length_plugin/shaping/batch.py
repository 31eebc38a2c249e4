"""The input of the group length shaping: one row per rollout (decisions.md §2.2-2.5, §2.14)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from typing import Any

import numpy as np
import torch

from .groups import GroupLayout


def as_float_tensor(values: Any, name: str) -> torch.Tensor:
    """A 1-D floating tensor; a floating tensor keeps its dtype, anything else becomes float64."""
    if isinstance(values, torch.Tensor) and values.is_floating_point():
        tensor = values.detach()
    else:
        source = values if isinstance(values, torch.Tensor) else np.asarray(values, dtype=np.float64)
        tensor = torch.as_tensor(source).double()
    if tensor.dim() != 1:
        raise ValueError(f"{name} must be one value per row, got shape {tuple(tensor.shape)}")
    return tensor


def finite_nonnegative(values: torch.Tensor) -> bool:
    """Whether every value is finite and >= 0 (a NaN fails the comparisons)."""
    return values.numel() == 0 or 0 <= float(values.min()) <= float(values.max()) < math.inf


def _lengths(values: Any, name: str, rows: int) -> torch.Tensor:
    lengths = as_float_tensor(values, name).double()
    if lengths.numel() != rows:
        raise ValueError(f"{name} has {lengths.numel()} rows, rewards have {rows}")
    if not finite_nonnegative(lengths):
        raise ValueError(f"{name} must be finite and >= 0")
    return lengths


@dataclass
class RolloutBatch:
    """Rollouts to shape, one row each.

    - ``rewards``: the correctness reward (binary; NaN for TRL's ``None``), decisions.md §2.4.
    - ``group_index``: the prompt group of each row, any hashable ids (§2.2).
    - ``reasoning_lengths`` / ``answer_lengths``: channel lengths (§2.5); total is their sum.
    - ``agents``: agent name per row, ``None`` meaning ``default`` (§2.3); a group uses its first row's.
    - ``metadata``: per-row mapping with ``profiled_rewards``, ``profiled_output_lengths``, ``profile_band``
      (any may be missing) or ``None``; per-prompt data, read from each group's first row (§2.14).
    - ``multi_component``: per-row flag for verl's multi-component scores, whose groups are skipped (§2.4).
    """

    rewards: Any
    group_index: Any
    reasoning_lengths: Any
    answer_lengths: Any
    agents: Sequence[str | None] | None = None
    metadata: Sequence[Mapping[str, Any] | None] | None = None
    multi_component: Any = None

    def __post_init__(self) -> None:
        self.rewards = as_float_tensor(self.rewards, "rewards")
        rows = self.rewards.numel()
        self.reasoning_lengths = _lengths(self.reasoning_lengths, "reasoning_lengths", rows)
        self.answer_lengths = _lengths(self.answer_lengths, "answer_lengths", rows)
        for name in ("agents", "metadata"):
            values = getattr(self, name)
            if values is not None and len(values) != rows:
                raise ValueError(f"{name} has {len(values)} rows, rewards have {rows}")
        if self.multi_component is not None:
            self.multi_component = torch.as_tensor(np.asarray(self.multi_component, dtype=bool))
            if self.multi_component.numel() != rows:
                raise ValueError("multi_component must have one flag per row")
        if self.layout.num_rows != rows:
            raise ValueError(f"group_index has {self.layout.num_rows} rows, rewards have {rows}")

    @cached_property
    def layout(self) -> GroupLayout:
        return GroupLayout.of(self.group_index)

    @cached_property
    def total_lengths(self) -> torch.Tensor:
        return self.reasoning_lengths + self.answer_lengths

    def group_rows(self, values: Sequence[Any] | None) -> list[Any] | None:
        """The entries of a per-row list at each group's first row (None stays None)."""
        if values is None:
            return None
        first = self.layout.first_row.tolist()
        if isinstance(values, np.ndarray):
            return values[first].tolist()
        if len(first) < 2:
            return [values[i] for i in first]
        return list(itemgetter(*first)(values))
