"""Cosine length-scaled reward (docs/reference/length-penalties.md §2.18; Demystifying Long Chain-of-Thought
Reasoning, arXiv 2502.03373, App. C.1, as TRL's ``get_cosine_scaled_reward``).

Per rollout, progress ``t = min(n / L_max, 1)`` on the configured channel; a correct rollout gets
``v_min + (v_max - v_min)(1 + cos(t pi)) / 2`` with ``(min_value_correct, max_value_correct)``, a wrong one the
same with ``(max_value_wrong, min_value_wrong)``. The rollout reward becomes the cosine reward; the term's
output is the change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..fields import CHANNELS, Bounded, Channel, Count
from . import REWARD, Parameter, register_term

if TYPE_CHECKING:
    import torch

    from ..view import GroupView
    from . import TermInputs

PARAMETERS = {
    "cosine_max_length": Parameter(Count, 0, "L_max, the length where progress reaches 1; 0 is off (§2.18)"),
    "cosine_min_value_wrong": Parameter(Bounded, -1.0, "a wrong rollout's reward at progress 1 (§2.18)"),
    "cosine_max_value_wrong": Parameter(Bounded, -0.5, "a wrong rollout's reward at progress 0 (§2.18)"),
    "cosine_min_value_correct": Parameter(Bounded, 0.5, "a correct rollout's reward at progress 1 (§2.18)"),
    "cosine_max_value_correct": Parameter(Bounded, 1.0, "a correct rollout's reward at progress 0 (§2.18)"),
    "cosine_channel": Parameter(
        Channel, "total", "the length channel progress is measured on (§2.5)", CHANNELS
    ),
}


def cosine_errors(params: Mapping[str, Any], given: set[str]) -> list[str]:
    """Values under which length or a wrong answer would pay (§2.6 "Longer never scores higher"): a correct
    rollout's reward must not grow with its length, nor fall below a wrong rollout's."""
    if not params["cosine_max_length"]:
        return []
    low, high = params["cosine_min_value_correct"], params["cosine_max_value_correct"]
    wrong = max(params["cosine_min_value_wrong"], params["cosine_max_value_wrong"])
    if low > high:
        return [
            f"cosine_min_value_correct: {low} is above cosine_max_value_correct ({high}): a correct "
            "rollout's reward would grow with its length"
        ]
    if low < wrong:
        return [
            f"cosine_min_value_correct: {low} is below the wrong rollouts' highest value ({wrong}): a wrong "
            "rollout could score above a correct one"
        ]
    return []


def cosine_metrics(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``cosine_delta_mean``: the cosine reward minus the correctness, per rollout (§2.18)."""
    return {"length_penalty/cosine_delta_mean": values["cosine"].double()}


@register_term(
    "cosine",
    kind="rollout",
    order=0,
    parameters=PARAMETERS,
    switches=("cosine_max_length",),
    metrics=cosine_metrics,
    check=cosine_errors,
)
def cosine(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    import torch

    longest = view.p("cosine_max_length")
    on = longest > 0
    progress = (view.channel_of("cosine_channel") / torch.where(on, longest, 1.0)).clamp_(max=1.0)
    wave = torch.cos(progress * math.pi).add_(1.0).mul_(0.5)
    low = torch.where(view.positive, view.p("cosine_min_value_correct"), view.p("cosine_max_value_wrong"))
    high = torch.where(view.positive, view.p("cosine_max_value_correct"), view.p("cosine_min_value_wrong"))
    on = view.processed & on
    reward = torch.where(on, low + (high - low) * wave, view.rewards)
    return {"cosine": (reward - view.rewards), REWARD: reward}
