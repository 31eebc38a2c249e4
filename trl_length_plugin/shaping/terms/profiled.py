"""Profiled-length threshold penalty (docs/reference/length-penalties.md §2.10).

Every processed row (correct or not) whose total length is at least the prompt's profiled threshold
(mean + n_std * sample std of the passing profiled lengths) loses the penalty, but only when the additive
terms before it sum to >= 0 on that row: it reads the running adjustment.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..fields import Bounded, NonNegative, PositiveCount
from . import Parameter, register_term

if TYPE_CHECKING:
    import torch

    from ..agents import AgentParams
    from ..metadata import GroupMetadata
    from ..view import GroupView
    from . import TermInputs

PARAMETERS = {
    "profiled_length_penalty": Parameter(NonNegative, 0.0, "the penalty at or above the threshold (§2.10)"),
    "profiled_length_n_std": Parameter(Bounded, 1.0, "n_std, the threshold's standard deviations (§2.10)"),
    "profiled_length_min_samples": Parameter(
        PositiveCount, 2, "the passing profiled lengths a threshold needs (§2.10)"
    ),
}


def profiled_thresholds(params: AgentParams, meta: GroupMetadata) -> dict[str, torch.Tensor]:
    """Each group's threshold from its prompt's profile (NaN: none, §2.10)."""
    return {
        "threshold": meta.profiled_threshold(
            params["profiled_length_n_std"], params["profiled_length_min_samples"]
        )
    }


def threshold_record(params: Any, values: dict[str, float], shaped: bool) -> dict[str, Any]:
    """The group's threshold, when its prompt has one (§2.15)."""
    return {} if math.isnan(values["threshold"]) else {"profiled_threshold": values["threshold"]}


@register_term(
    "profiled",
    kind="additive",
    order=5,
    parameters=PARAMETERS,
    switches=("profiled_length_penalty",),
    metadata=("profiles",),
    prepare=profiled_thresholds,
    record=threshold_record,
)
def profiled(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    from ..groups import weights

    if not view.on("profiled_length_penalty"):
        return {}
    penalty = view.p("profiled_length_penalty")
    hit = view.processed & (view.lengths["total"] >= inputs.prepared["threshold"]) & (inputs.adjustment >= 0)
    return {"profiled": weights(hit).mul_(-penalty)}
