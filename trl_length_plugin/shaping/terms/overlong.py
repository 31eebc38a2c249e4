"""DAPO soft overlong punishment (docs/reference/length-penalties.md §2.17).

Per rollout, on the configured channel's length ``n``, with maximum ``L``, buffer ``B`` and factor ``f``:
``-f * clamp((n - (L - B)) / B, 0, 1)``: 0 up to ``L - B``, linear to ``-f`` at ``L``, ``-f`` beyond (TRL's
``get_soft_overlong_punishment`` with ``f = 1``; verl's DAPO reward manager's overlong buffer).
"""

from __future__ import annotations

import torch

from ..view import GroupView
from . import TermInputs, register_term


@register_term(
    "overlong",
    kind="rollout",
    order=1,
    parameters=("overlong_max_length",),
    channels=("reasoning", "answer", "total"),
)
def overlong(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    longest, buffer = view.p("overlong_max_length"), view.p("overlong_buffer")
    on = longest > 0
    excess = (view.channel_of("overlong_channel") - (longest - buffer)) / torch.where(on, buffer, 1.0)
    penalty = excess.clamp_(0.0, 1.0).mul_(-view.p("overlong_factor"))
    return {"overlong": penalty.mul_(view.processed & on)}
