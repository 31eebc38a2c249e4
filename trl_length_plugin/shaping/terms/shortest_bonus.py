"""Shortest-rollout bonus (docs/reference/length-penalties.md §2.7).

Per channel, in the order reasoning, answer, total: among the eligible rollouts with a non-empty channel
the shortest (lowest row on ties) gets the channel's bonus when its running adjusted reward (its reward
plus the bonuses of the channels before) is at least the group's top threshold.
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
    f"{channel}_bonus": Parameter(NonNegative, 0.0, f"the bonus of the shortest {channel} channel (§2.7)")
    for channel in CHANNELS
}


@register_term(
    "shortest_bonus",
    kind="additive",
    order=1,
    parameters=PARAMETERS,
    switches=tuple(PARAMETERS),
    outputs=tuple(PARAMETERS),
)
def shortest_bonus(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    from ..groups import row_first_extreme, weights

    channels = view.channels_on("{}_bonus")
    if not channels:
        return {}
    x = view.stacked_lengths(channels)
    winners = row_first_extreme(x, view.eligible[:, None] & (x > 0), False)
    bonus = view.stacked("{}_bonus", channels)
    running, out = view.correctness, {}  # the top threshold compares correctness (§2.7)
    for i, channel in enumerate(channels):
        out[f"{channel}_bonus"] = weights(winners[:, i] & (running >= view.threshold)).mul_(bonus[i])
        running = running + out[f"{channel}_bonus"]
    return out
