"""Profile gate on group-relative scaling (docs/reference/length-penalties.md §2.13).

Per group: the limit is ``band[channel][field]`` of the merged band; the gate opens only when the mean
channel length of the positives (``positive_only``) or of all rows is above it. It fails closed on a missing
limit or no rows to average. A closed gate zeroes only the group-relative terms of that group.
"""

from __future__ import annotations

import torch

from ..agents import GATE_FIELDS
from ..config import BAND_CHANNELS, CHANNELS
from ..groups import row_count, row_sum, weights
from ..view import GroupView
from . import TermInputs, register_term

GATE_REASONS = ("disabled", "missing_profile_limit", "no_lengths", "mean_le_limit", "mean_gt_limit")
_MISSING, _NO_LENGTHS, _LE, _GT = 1, 2, 3, 4
_BAND_TO_CHANNEL = torch.tensor([CHANNELS.index(channel) for channel in BAND_CHANNELS])
assert GATE_FIELDS == ("a", "b", "f")


def gate_limits(bands: dict[str, torch.Tensor], channel: torch.Tensor, field: torch.Tensor) -> torch.Tensor:
    """Per group, ``band[channel][field]`` of the merged band (NaN when missing); ``channel`` and ``field``
    index ``BAND_CHANNELS`` and ``GATE_FIELDS``."""
    stacked = torch.stack([bands[ch] for ch in BAND_CHANNELS], dim=1)  # (G, channel, field)
    return stacked[torch.arange(stacked.shape[0]), channel, field]


@register_term(
    "profile_gate",
    kind="gate",
    order=0,
    parameters=("group_length_penalty_profile_gate",),
    channels=BAND_CHANNELS,
    outputs=("open", "mean", "reason"),
)
def profile_gate(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    """``open``, ``mean`` and ``reason`` (an index into ``GATE_REASONS``) per group; a group whose agent has
    no gate is open with reason ``disabled``."""
    channel_of = _BAND_TO_CHANNEL[view.p("group_length_penalty_profile_gate_channel")]
    lengths = view.channel_lengths.gather(1, channel_of.expand(view.bucket.width, 1, -1)).squeeze(1)
    enabled = view.p("group_length_penalty_profile_gate") & view.shaped_groups
    positive_only = view.p("group_length_penalty_profile_gate_positive_only")
    member = (view.positive & positive_only) | (view.processed & ~positive_only)
    count = row_count(member)
    mean = row_sum(lengths * weights(member)) / count
    reason = torch.full_like(count, _LE)
    reason[mean > inputs.limits] = _GT
    reason[count == 0] = _NO_LENGTHS
    reason[torch.isnan(inputs.limits)] = _MISSING
    reason[~enabled] = 0
    return {"open": ~enabled | (reason == _GT), "mean": mean, "reason": reason}
