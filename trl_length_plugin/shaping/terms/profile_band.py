"""Profile-band multiplier (docs/reference/length-penalties.md §2.12).

Per enabled channel, in the order total, reasoning, answer, on rows whose original reward is positive and
whose clamped reward is still above 0: 1 up to ``a``, linear down to ``f`` at ``b``, ``f`` beyond. Rows of
groups without a band (NaN) keep 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..fields import BAND_CHANNELS
from . import Parameter, register_term

if TYPE_CHECKING:
    import torch

    from ..agents import AgentParams
    from ..metadata import GroupMetadata
    from ..view import GroupView
    from . import TermInputs

PARAMETERS = {
    f"profile_band_{channel}": Parameter(bool, False, f"the band multiplier on the {channel} channel (§2.12)")
    for channel in BAND_CHANNELS
}


def band_multiplier(length: torch.Tensor, band: torch.Tensor, apply: torch.Tensor) -> torch.Tensor:
    """The multiplier of ``length`` ``[width, groups]`` under ``band`` (groups, 3) ``a, b, f``; 1 where
    ``apply`` is false or the band is missing (NaN)."""
    a, b, f = band.unbind(-1)
    from ..groups import weights

    missing = a.isnan()
    a, b = a.nan_to_num(0.0), b.nan_to_num(1.0)
    shrink = (1 - f).nan_to_num(0.0).masked_fill(missing, 0.0)
    fraction = (length - a).div_(b - a).clamp_(0, 1).mul_(shrink).mul_(weights(apply))
    return fraction.neg_().add_(1)


def merged_bands(params: AgentParams, meta: GroupMetadata) -> dict[str, torch.Tensor]:
    """Each group's merged band per channel, (G, 3) ``a, b, f`` (NaN: none, §2.12)."""
    return meta.bands


@register_term(
    "profile_band",
    kind="multiplier",
    order=7,
    parameters=PARAMETERS,
    switches=tuple(PARAMETERS),
    outputs=BAND_CHANNELS,
    metadata=("bands",),
    prepare=merged_bands,
)
def profile_band(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    """One multiplier per enabled channel; ``inputs.adjustment`` holds the clamped shaped reward."""
    banded = view.positive & (inputs.adjustment > 0)
    return {
        channel: band_multiplier(
            view.lengths[channel], inputs.prepared[channel], banded & view.p(f"profile_band_{channel}")
        )
        for channel in BAND_CHANNELS
        if view.params.uses(f"profile_band_{channel}")
    }
