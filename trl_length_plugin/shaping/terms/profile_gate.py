"""Profile gate on group-relative scaling (docs/reference/length-penalties.md §2.13).

Per group: the limit is ``band[channel][field]`` of the merged band; the gate opens only when the mean
channel length of the positives (``positive_only``) or of all rows is above it. It fails closed on a missing
limit or no rows to average. A closed gate zeroes only the group-relative terms of that group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from ..fields import CHANNELS, Channel
from . import Parameter, register_term

if TYPE_CHECKING:
    import torch

    from ..agents import AgentParams
    from ..metadata import GroupMetadata
    from ..view import GroupView
    from . import TermInputs

GATE_REASONS = ("disabled", "missing_profile_limit", "no_lengths", "mean_le_limit", "mean_gt_limit")
_MISSING, _NO_LENGTHS, _LE, _GT = 1, 2, 3, 4
PARAMETERS = {
    "group_length_penalty_profile_gate": Parameter(bool, False, "gate the group-relative terms (§2.13)"),
    "group_length_penalty_profile_gate_channel": Parameter(
        Channel, "total", "the channel of the band and of the mean length (§2.13)", CHANNELS
    ),
    "group_length_penalty_profile_gate_field": Parameter(
        Literal["a", "b", "f"], "a", "the band's field that is the limit (§2.13)"
    ),
    "group_length_penalty_profile_gate_positive_only": Parameter(
        bool, True, "average the positives only, else all rows (§2.13)"
    ),
}


def gate_limits(params: AgentParams, meta: GroupMetadata) -> dict[str, torch.Tensor]:
    """Per group, the ``limit``: ``band[channel][field]`` of the merged band (NaN when missing)."""
    import torch

    stacked = torch.stack([meta.bands[ch] for ch in CHANNELS], dim=1)  # (G, channel, field)
    channel = params["group_length_penalty_profile_gate_channel"].long()
    field = params["group_length_penalty_profile_gate_field"].long()
    return {"limit": stacked[torch.arange(stacked.shape[0]), channel, field]}


def gate_record(params: Any, values: dict[str, float], shaped: bool) -> dict[str, Any]:
    """The gate's line of a shaped group whose agent gates (§2.15)."""
    if not (shaped and params.group_length_penalty_profile_gate):
        return {}
    return {
        "profile_gate": {
            "channel": params.group_length_penalty_profile_gate_channel,
            "field": params.group_length_penalty_profile_gate_field,
            "positive_only": params.group_length_penalty_profile_gate_positive_only,
            "mean": values["mean"],
            "limit": values["limit"],
            "open": bool(values["open"]),
            "reason": GATE_REASONS[int(values["reason"])],
        }
    }


@register_term(
    "profile_gate",
    kind="gate",
    order=0,
    parameters=PARAMETERS,
    switches=("group_length_penalty_profile_gate",),
    outputs=("open", "mean", "reason"),
    metadata=("bands",),
    prepare=gate_limits,
    record=gate_record,
)
def profile_gate(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    """``open``, ``mean`` and ``reason`` (an index into ``GATE_REASONS``) per group; a group whose agent has
    no gate is open with reason ``disabled``."""
    import torch

    from ..groups import row_count, row_sum, weights

    lengths = view.channel_of("group_length_penalty_profile_gate_channel")
    enabled = view.p("group_length_penalty_profile_gate") & view.shaped_groups
    positive_only = view.p("group_length_penalty_profile_gate_positive_only")
    member = (view.positive & positive_only) | (view.processed & ~positive_only)
    count = row_count(member)
    mean = row_sum(lengths * weights(member)) / count
    reason = torch.full_like(count, _LE)
    reason[mean > inputs.prepared["limit"]] = _GT
    reason[count == 0] = _NO_LENGTHS
    reason[torch.isnan(inputs.prepared["limit"])] = _MISSING
    reason[~enabled] = 0
    return {"open": ~enabled | (reason == _GT), "mean": mean, "reason": reason}
