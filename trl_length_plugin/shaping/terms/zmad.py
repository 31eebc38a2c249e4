"""zMAD long-outlier penalty (docs/reference/length-penalties.md §2.9).

Per channel among the eligible rollouts: the modified Z score ``0.6745 (x - median) / MAD`` (median as
``statistics.median``); rows with a score strictly above the threshold lose the penalty; nothing is flagged
when MAD is 0 or MAD / max(median, 1e-9) < 0.015. Only long outliers are penalized.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..fields import CHANNELS, NonNegative
from . import Parameter, register_term

if TYPE_CHECKING:
    import torch

    from ..view import GroupView
    from . import TermInputs

ZMAD_SCALE = 0.6745  # Iglewicz-Hoaglin
ZMAD_MIN_RELATIVE_MAD = 0.015
PARAMETERS = {
    f"{channel}_zmad_{name}": Parameter(NonNegative, 0.0, f"the {channel} channel's zMAD {name} (§2.9)")
    for channel in CHANNELS
    for name in ("threshold", "penalty")
}


@register_term(
    "zmad",
    kind="additive",
    order=4,
    parameters=PARAMETERS,
    switches=tuple(PARAMETERS),
    outputs=tuple(f"zmad_{channel}" for channel in CHANNELS),
)
def zmad(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    import torch

    from ..groups import row_count, row_padded, sorted_median, sorted_slots, weights

    channels = [
        channel for channel in CHANNELS if view.on(f"{channel}_zmad_threshold", f"{channel}_zmad_penalty")
    ]
    if not channels:
        return {}
    threshold, penalty = (
        view.stacked("{}_zmad_threshold", channels),
        view.stacked("{}_zmad_penalty", channels),
    )
    member = view.eligible[:, None] & (threshold > 0) & (penalty > 0)
    count = row_count(member)
    x = view.stacked_lengths(channels)
    padded = row_padded(x, member)  # non-members BIG: sorted last
    ordered = sorted_slots(padded.clone())
    median = sorted_median(ordered, count)
    # the members' distances to the median in sorted order fall, then rise; the non-members stay BIG (a
    # median is at most 2**53, far below BIG's spacing) and last (in a group without members nothing is read)
    mad = sorted_median(sorted_slots(ordered.sub_(median).abs_(), bitonic=True), count)
    deviation = padded.sub_(median)  # each row's own, in place of its padded length
    above = deviation > 0  # z > threshold > 0 needs it; then |z| is z
    usable = (mad != 0) & (mad / median.clamp(min=1e-9) >= ZMAD_MIN_RELATIVE_MAD)
    z = deviation.mul_(ZMAD_SCALE).div_(torch.where(usable, mad, 1.0))
    flagged = weights(member & usable & above & (z > threshold)).mul_(-penalty)
    return {f"zmad_{channel}": flagged[:, i] for i, channel in enumerate(channels)}
