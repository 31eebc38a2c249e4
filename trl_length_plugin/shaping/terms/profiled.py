"""Profiled-length threshold penalty (docs/reference/length-penalties.md §2.10).

Every processed row (correct or not) whose total length is at least the prompt's profiled threshold
(mean + n_std * sample std of the passing profiled lengths) loses the penalty, but only when the additive
terms before it sum to >= 0 on that row: it reads the running adjustment.
"""

from __future__ import annotations

import torch

from ..groups import weights
from ..view import GroupView
from . import TermInputs, register_term


@register_term(
    "profiled",
    kind="additive",
    order=5,
    parameters=("profiled_length_penalty",),
    channels=("total",),
    reads_adjustment=True,
)
def profiled(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    penalty = view.p("profiled_length_penalty")
    if not bool((penalty > 0).any()):
        return {}
    hit = view.processed & (view.lengths["total"] >= inputs.profiled_threshold) & (inputs.adjustment >= 0)
    return {"profiled": weights(hit).mul_(-penalty)}
