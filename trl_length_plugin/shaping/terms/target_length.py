"""The target-length reward, L1 / LCPO (docs/reference/length-penalties.md §2.20; Aggarwal and Welleck, "L1:
Controlling How Long A Reasoning Model Thinks With Reinforcement Learning", arXiv 2503.04697).

Per rollout of a prompt with a ``target_length`` t, on the configured channel's length ``n``:

- ``exact`` (LCPO-Exact): ``-alpha * |n - t|`` is added to the rollout reward, correct or not;
- ``max`` (LCPO-Max): a correct rollout's positive rollout reward is multiplied by
  ``clip(alpha * (t - n) + delta, 0, 1)``; an incorrect one is left as it is (0 with the correctness alone).

Rows of prompts without a target are left unchanged. The term also returns the per-row values of its
metrics (``METRICS``), NaN outside the rows each averages over.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..fields import CHANNELS, Channel, Fraction, NonNegative, Positive
from . import Parameter, register_term

if TYPE_CHECKING:
    import torch

    from ..agents import AgentParams
    from ..metadata import GroupMetadata
    from ..view import GroupView
    from . import TermInputs

Mode = Literal["none", "exact", "max"]
EXACT, MAX = get_args(Mode).index("exact"), get_args(Mode).index("max")
METRICS = ("target_frac", "target_ratio_mean", "target_rel_error_mean", "target_within_tolerance_frac")
PARAMETERS = {
    "target_length": Parameter(Mode, "none", "LCPO-Exact or LCPO-Max against the prompt's target (§2.20)"),
    "target_length_alpha": Parameter(NonNegative, 0.0003, "alpha, the weight of the length error (§2.20)"),
    "target_length_delta": Parameter(Fraction, 0.5, "delta, LCPO-Max's offset (§2.20)"),
    "target_length_tolerance": Parameter(Positive, 0.1, "the relative error counted as on target (§2.20)"),
    "target_length_channel": Parameter(
        Channel, "total", "the length channel the target is for (§2.5)", CHANNELS
    ),
}


def target_errors(params: Mapping[str, Any], given: set[str]) -> list[str]:
    """A delta with ``exact`` (a key without a mode is refused as every term's, ``idle_key_errors``)."""
    errors = []
    if "target_length_delta" in given and params["target_length"] == "exact":
        errors.append("target_length_delta: needs target_length: max (exact has no delta)")
    return errors


def prompt_targets(params: AgentParams, meta: GroupMetadata) -> dict[str, torch.Tensor]:
    """Each group's target length (NaN: none, §2.20)."""
    return {"target": meta.target}


def target_length_metrics(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The §2.20 metrics: those ``target_metrics`` computed, and ``target_delta_mean``."""
    metrics = {f"length_penalty/{name}": values[name] for name in METRICS}
    metrics["length_penalty/target_delta_mean"] = values["target_length"].double()
    return metrics


def target_metrics(view: GroupView, target: torch.Tensor, length: torch.Tensor) -> dict[str, torch.Tensor]:
    """``[width, Gb]`` per-row values of the §2.20 metrics: over the rows of shaped groups of agents with the
    term on, whether the prompt has a target; over those with one, ``n / t``, ``|n - t| / t`` and whether
    the latter is within ``target_length_tolerance``."""
    scope = view.processed & (view.p("target_length") > 0)
    aimed = scope & ~target.isnan()
    error = (length - target).abs_().div_(target)
    import torch

    nan = torch.tensor(math.nan, dtype=torch.float64)
    return {
        "target_frac": torch.where(scope, aimed.double(), nan),
        "target_ratio_mean": torch.where(aimed, length / target, nan),
        "target_rel_error_mean": torch.where(aimed, error, nan),
        "target_within_tolerance_frac": torch.where(
            aimed, (error <= view.p("target_length_tolerance")).double(), nan
        ),
    }


@register_term(
    "target_length",
    kind="rollout",
    order=2,
    parameters=PARAMETERS,
    switches=("target_length",),
    metadata=("target",),
    prepare=prompt_targets,
    metrics=target_length_metrics,
    check=target_errors,
)
def target_length(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    import torch

    mode, alpha = view.p("target_length"), view.p("target_length_alpha")
    target = inputs.prepared["target"].expand_as(view.rewards)
    length = view.channel_of("target_length_channel")
    aimed = view.processed & ~target.isnan()
    exact = -alpha * (length - target).abs()
    budget = (alpha * (target - length) + view.p("target_length_delta")).clamp_(0.0, 1.0)
    scaled = inputs.adjustment.clamp(min=0.0).mul_(budget - 1.0).mul_(view.positive)
    change = torch.where(mode == EXACT, exact, torch.where(mode == MAX, scaled, 0.0))
    return {"target_length": torch.where(aimed, change, 0.0), **target_metrics(view, target, length)}
