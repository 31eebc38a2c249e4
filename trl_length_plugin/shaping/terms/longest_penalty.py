"""Longest top-scorer penalty (docs/reference/length-penalties.md §2.7).

Per channel: among the top scorers with a non-empty channel, when there are at least two, the longest
(lowest row on ties) loses the channel's penalty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..fields import CHANNELS, NonNegative
from . import Parameter, register_term

if TYPE_CHECKING:
    import torch

    from ..view import GroupView
    from . import TermInputs

PARAMETERS = {
    f"longest_{channel}_penalty": Parameter(
        NonNegative, 0.0, f"the penalty of the longest top scorer's {channel} channel (§2.7)"
    )
    for channel in CHANNELS
}


@register_term(
    "longest_penalty",
    kind="additive",
    order=2,
    parameters=PARAMETERS,
    switches=tuple(PARAMETERS),
    outputs=tuple(f"longest_{channel}" for channel in CHANNELS),
)
def longest_penalty(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    from ..groups import row_count, row_first_extreme, weights

    channels = view.channels_on("longest_{}_penalty")
    if not channels:
        return {}
    x = view.stacked_lengths(channels)
    candidates = view.top[:, None] & (x > 0)
    loser = row_first_extreme(x, candidates, True)
    penalty = view.stacked("longest_{}_penalty", channels)
    lost = weights(loser & (row_count(candidates) >= 2)).mul_(-penalty)
    return {f"longest_{channel}": lost[:, i] for i, channel in enumerate(channels)}
