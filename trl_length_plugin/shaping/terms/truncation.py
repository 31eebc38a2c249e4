"""Truncated rollouts, ``truncation: penalty`` (docs/reference/length-penalties.md §2.19).

A truncated rollout (no end-of-sequence token within the host's length limit) of a ``penalty`` agent has its
positive rollout reward multiplied by ``truncation_penalty_factor``; a reward <= 0 is left as it is (a
penalty never raises a reward). ``mask`` and ``incorrect`` act outside the engine (``truncation.py``).
"""

from __future__ import annotations

import torch

from ..agents import TRUNCATION_MODES
from ..view import GroupView
from . import TermInputs, register_term

PENALTY = TRUNCATION_MODES.index("penalty")


@register_term("truncation", kind="rollout", order=3, parameters=("truncation",), reads_adjustment=True)
def truncation(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    on = view.p("truncation") == PENALTY
    if view.truncated is None or not bool(on.any()):
        return {}
    reward = inputs.adjustment.clamp(min=0.0)  # a rollout term reads the running rollout reward
    hit = view.processed & view.truncated & on
    return {"truncation": reward.mul_(view.p("truncation_penalty_factor") - 1.0).mul_(hit)}
