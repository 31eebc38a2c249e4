"""Longest top-scorer penalty (docs/reference/length-penalties.md §2.7).

Per channel: among the top scorers with a non-empty channel, when there are at least two, the longest
(lowest row on ties) loses the channel's penalty.
"""

from __future__ import annotations

import torch

from ..config import CHANNELS
from ..groups import row_count, row_first_extreme, weights
from ..view import GroupView
from . import TermInputs, register_term


@register_term(
    "longest_penalty",
    kind="additive",
    order=2,
    parameters=tuple(f"longest_{channel}_penalty" for channel in CHANNELS),
    channels=CHANNELS,
    outputs=tuple(f"longest_{channel}" for channel in CHANNELS),
)
def longest_penalty(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    channels = view.channels_on("longest_{}_penalty")
    if not channels:
        return {}
    x = view.stacked_lengths(channels)
    candidates = view.top[:, None] & (x > 0)
    loser = row_first_extreme(x, candidates, True)
    penalty = view.stacked("longest_{}_penalty", channels)
    lost = weights(loser & (row_count(candidates) >= 2)).mul_(-penalty)
    return {f"longest_{channel}": lost[:, i] for i, channel in enumerate(channels)}
