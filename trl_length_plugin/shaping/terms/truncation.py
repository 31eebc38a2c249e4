"""Truncated rollouts, ``truncation: penalty`` (docs/reference/length-penalties.md §2.19).

A truncated rollout (no end-of-sequence token within the host's length limit) of a ``penalty`` agent has its
positive rollout reward multiplied by ``truncation_penalty_factor``; a reward <= 0 is left as it is (a
penalty never raises a reward). ``mask`` and ``incorrect`` act outside the engine (``truncation.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..fields import Fraction
from . import Parameter, register_term

if TYPE_CHECKING:
    import torch

    from ..view import GroupView
    from . import TermInputs

Mode = Literal["none", "mask", "penalty", "incorrect"]
TRUNCATION_MODES: tuple[str, ...] = get_args(Mode)
PENALTY = TRUNCATION_MODES.index("penalty")
PARAMETERS = {
    "truncation": Parameter(Mode, "none", "what a truncated rollout gets; penalty: this term (§2.19)"),
    "truncation_penalty_factor": Parameter(
        Fraction, 0.0, "the factor a truncated positive reward gets (§2.19)"
    ),
}


def truncation_errors(params: Mapping[str, Any], given: set[str]) -> list[str]:
    """``truncation_penalty_factor`` set to a value other than its default without ``truncation: penalty``
    (as every term's key without its switch, ``idle_key_errors``)."""
    factor = "truncation_penalty_factor"
    if factor in given and params[factor] != PARAMETERS[factor].default and params["truncation"] != "penalty":
        return ["truncation_penalty_factor: needs truncation: penalty"]
    return []


def penalized_groups(view: GroupView) -> torch.Tensor:
    """(Gb,) the groups whose agent sets ``truncation: penalty`` (``mask`` and ``incorrect`` act elsewhere)."""
    return view.p("truncation") == PENALTY


@register_term(
    "truncation",
    kind="rollout",
    order=3,
    parameters=PARAMETERS,
    switches=("truncation",),
    check=truncation_errors,
    turned_on=penalized_groups,
)
def truncation(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    on = penalized_groups(view)
    if view.truncated is None or not bool(on.any()):
        return {}
    reward = inputs.adjustment.clamp(min=0.0)  # a rollout term reads the running rollout reward
    hit = view.processed & view.truncated & on
    return {"truncation": reward.mul_(view.p("truncation_penalty_factor") - 1.0).mul_(hit)}
