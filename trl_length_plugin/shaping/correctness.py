"""What each prompt group's correctness rewards are: missing, non-binary, or binary with how many
positives (docs/reference/length-penalties.md §2.4, §2.15). Computed once per batch and shared by the
group penalties, the coefficient and the metrics."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .groups import GroupLayout, row_any, row_count

BINARY_TOLERANCE = 1e-6  # §2.4: a value this close to 0 or 1 counts as binary


@dataclass(frozen=True)
class GroupKinds:
    """Per group (G,): ``missing`` (some correctness is NaN: TRL's ``None``), ``non_binary`` (some value
    farther than the tolerance from both 0 and 1, or a multi-component score), ``positives`` (rows with
    reward > 0)."""

    missing: torch.Tensor
    non_binary: torch.Tensor
    positives: torch.Tensor

    @property
    def binary(self) -> torch.Tensor:
        """Groups every length algorithm may shape."""
        return ~(self.missing | self.non_binary)


def classify_groups(
    layout: GroupLayout, rewards: torch.Tensor, multi_component: torch.Tensor | None = None
) -> GroupKinds:
    """Classify the groups of ``layout`` by their correctness ``rewards`` (one per row)."""
    missing, non_binary, positives = [], [], []
    values = rewards.double()
    for bucket in layout.buckets:
        packed = bucket.pack(values)  # padding slots hold 0: neither NaN, off nor positive
        # the distance to the nearer of 0 and 1; NaN compares false, so a missing reward is not "off"
        off = torch.minimum(packed.abs(), (packed - 1).abs()) > BINARY_TOLERANCE
        if multi_component is not None:
            off |= bucket.pack(multi_component, False)
        missing.append(row_any(torch.isnan(packed)))
        non_binary.append(row_any(off))
        positives.append(row_count(packed > 0))
    if not layout.buckets:
        empty = torch.zeros(0, dtype=torch.bool)
        return GroupKinds(empty, empty, torch.zeros(0, dtype=torch.long))
    return GroupKinds(*(layout.per_group(part) for part in (missing, non_binary, positives)))
