"""The input of the length shaping: one row per rollout (docs/reference/length-penalties.md §2.2-2.5,
§2.14; docs/reference/length-coefficient.md §3.2).

A malformed batch structure (wrong shapes, non-integer group ids, negative, non-finite or absurd lengths,
unhashable agents) is a named ``ValueError``; malformed per-prompt metadata is not (it is flagged and
counted, ``metadata.py``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from typing import Any

import numpy as np
import torch

from .groups import GroupLayout, on_cpu
from .metadata import MAX_LENGTH, PromptMetadata, parse_prompt_metadata
from .threads import single_threaded


def as_float_tensor(values: Any, name: str) -> torch.Tensor:
    """A 1-D floating tensor; a floating tensor keeps its dtype, anything else becomes float64."""
    if isinstance(values, torch.Tensor):
        values = on_cpu(values.detach(), name)
    if isinstance(values, torch.Tensor) and values.is_floating_point():
        tensor = values
    else:
        try:
            source = values if isinstance(values, torch.Tensor) else np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError, OverflowError) as err:
            raise ValueError(f"{name} must be numbers, one per row ({err})") from None
        tensor = torch.as_tensor(source).double()
    if tensor.dim() != 1:
        raise ValueError(f"{name} must be one value per row, got shape {tuple(tensor.shape)}")
    return tensor


def valid_lengths(values: torch.Tensor) -> bool:
    """Whether every value is finite, >= 0 and at most ``MAX_LENGTH`` (a NaN fails the comparisons)."""
    return values.numel() == 0 or 0 <= float(values.min()) <= float(values.max()) <= MAX_LENGTH


def checked_lengths(values: Any, name: str, rows: int) -> torch.Tensor:
    """Per-row lengths as float64, or a ValueError naming ``name``."""
    lengths = as_float_tensor(values, name).double()
    if lengths.numel() != rows:
        raise ValueError(f"{name} has {lengths.numel()} rows, rewards have {rows}")
    if not valid_lengths(lengths):
        raise ValueError(f"{name} must be finite, >= 0 and at most 2**53")
    return lengths


def checked_flags(values: Any, name: str, rows: int) -> torch.Tensor:
    """One boolean per row (booleans, or integers 0 and 1, as a list, array or tensor), or a ValueError
    naming ``name``: fractions, other integers, strings and None are not flags (``"no"`` would read as
    true)."""
    refused = f"{name} must be booleans (or 0 and 1), one per row, got"
    if isinstance(values, torch.Tensor):
        values = on_cpu(values, name)
        if values.is_floating_point() or values.is_complex():
            raise ValueError(f"{refused} {values.dtype} values")
        array = values.numpy()
    else:
        try:
            array = np.asarray(values)
        except ValueError as err:  # ragged
            raise ValueError(f"{refused} {err}") from None
    if array.dtype.kind not in "biu" or not np.isin(array, (0, 1)).all():
        raise ValueError(f"{refused} {array.dtype} values")
    if array.ndim != 1 or array.size != rows:
        raise ValueError(f"{name} must have one flag per row")
    return torch.from_numpy(array.astype(bool))


def _check_agents(agents: Sequence[Any]) -> None:
    bad = next((a for a in agents if a is not None and not isinstance(a, Hashable)), None)
    if bad is not None:
        raise ValueError(f"agents must be names (strings) or None, got a {type(bad).__name__}")


@dataclass
class RolloutBatch:
    """Rollouts to shape, one row each.

    - ``rewards``: the correctness reward (binary; NaN for TRL's ``None``), reference §2.4.
    - ``group_index``: the prompt group of each row as integers (any integer dtype, Python ints), or a
      ready ``GroupLayout`` (§2.2).
    - ``reasoning_lengths`` / ``answer_lengths``: channel lengths (§2.5); total is their sum.
    - ``agents``: agent name per row, ``None`` meaning ``default`` (§2.3); a group uses its first row's.
    - ``metadata``: per-row mappings with ``profiled_rewards``, ``profiled_output_lengths``,
      ``profile_band``, ``target_length`` and the registered terms' own columns (any may be missing) or
      ``None``, read from each group's first row; or a parsed
      ``PromptMetadata`` (``MetadataCache.lookup``) with one row per group, groups in order of first
      appearance (``layout.first_row``), or one row per rollout (§2.14).
    - ``multi_component``: per-row flag for verl's multi-component scores, whose groups are skipped (§2.4).
    - ``loss_lengths``: the loss-mask token count of each rollout, the coefficient's L (reference §3.2).
    - ``truncated``: per-row flag, the rollout ended without an end-of-sequence token within the host's
      length limit (docs/reference/length-penalties.md §2.19); required by ``truncation``.
    - ``base_rewards``: the host's total reward of each row without the shaping (other reward terms
      included; NaN for a row the host cannot score); default the correctness reward. Advantages and the
      zero-std filter judge ``base_rewards + weight * (shaped - rewards)`` (reference §3.3).
    """

    rewards: Any
    group_index: Any
    reasoning_lengths: Any = None
    answer_lengths: Any = None
    agents: Sequence[str | None] | None = None
    metadata: Sequence[Mapping[str, Any] | None] | PromptMetadata | None = None
    multi_component: Any = None
    loss_lengths: Any = None
    base_rewards: Any = None
    truncated: Any = None

    @single_threaded()
    def __post_init__(self) -> None:
        self.rewards = as_float_tensor(self.rewards, "rewards")
        rows = self.rewards.numel()
        for name in ("reasoning_lengths", "answer_lengths"):
            values = getattr(self, name)
            setattr(self, name, checked_lengths(torch.zeros(rows) if values is None else values, name, rows))
        if self.loss_lengths is not None:
            self.loss_lengths = checked_lengths(self.loss_lengths, "loss_lengths", rows)
        if self.base_rewards is not None:
            self.base_rewards = as_float_tensor(self.base_rewards, "base_rewards").double()
            if self.base_rewards.numel() != rows:
                raise ValueError(f"base_rewards has {self.base_rewards.numel()} rows, rewards have {rows}")
        if self.agents is not None and len(self.agents) != rows:
            raise ValueError(f"agents has {len(self.agents)} rows, rewards have {rows}")
        if self.metadata is not None and len(self.metadata) != rows:
            per_group = (
                isinstance(self.metadata, PromptMetadata) and len(self.metadata) == self.layout.num_groups
            )
            if not per_group:
                raise ValueError(f"metadata has {len(self.metadata)} rows, rewards have {rows}")
        if self.agents is not None:
            _check_agents(self.agents)
        for name in ("multi_component", "truncated"):
            if getattr(self, name) is not None:
                setattr(self, name, checked_flags(getattr(self, name), name, rows))
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

    def group_metadata(self) -> PromptMetadata | None:
        """Each group's parsed metadata (its first row's), None without metadata."""
        if self.metadata is None:
            return None
        if isinstance(self.metadata, PromptMetadata):
            if len(self.metadata) == self.layout.num_groups:
                return self.metadata
            return self.metadata.take(self.layout.first_row)
        return parse_prompt_metadata(self.group_rows(self.metadata))
