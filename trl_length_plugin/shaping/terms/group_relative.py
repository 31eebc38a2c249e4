"""Group relative-length scaling (docs/reference/length-penalties.md §2.8), gated by the profile gate
(§2.13).

Per channel over the eligible rollouts of an open group: ``coeff * (w - mean(w))`` with
``w = 1 - (x - min) / (max - min)``; equal lengths give 0; zero-length channels take part.
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
    f"group_{channel}_length_penalty_coeff": Parameter(
        NonNegative, 0.0, f"the coefficient of the {channel} channel's relative length (§2.8)"
    )
    for channel in CHANNELS
}


@register_term(
    "group_relative",
    kind="additive",
    order=3,
    parameters=PARAMETERS,
    switches=tuple(PARAMETERS),
    outputs=tuple(f"group_{channel}" for channel in CHANNELS),
)
def group_relative(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    import torch

    from ..groups import row_count, row_min_max, row_sum, weights

    channels = view.channels_on("group_{}_length_penalty_coeff")
    if not channels:
        return {}
    member = (view.eligible & inputs.gate_open)[:, None]
    count = row_count(member).clamp(min=1)
    x = view.stacked_lengths(channels)
    low, high = row_min_max(x, member)
    span = high - low
    spread = span > 0
    weight = (x - low).div_(torch.where(spread, span, 1.0)).neg_().add_(1).mul_(weights(member & spread))
    coeff = view.stacked("group_{}_length_penalty_coeff", channels)
    weight.sub_(row_sum(weight) / count).mul_(coeff).mul_(weights(member))
    return {f"group_{channel}": weight[:, i] for i, channel in enumerate(channels)}
