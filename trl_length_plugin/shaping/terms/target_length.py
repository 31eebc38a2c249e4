"""The target-length reward, L1 / LCPO (docs/reference/length-penalties.md §2.20; Aggarwal and Welleck, "L1:
Controlling How Long A Reasoning Model Thinks With Reinforcement Learning", arXiv 2503.04697).

Per rollout of a prompt with a ``target_length`` t, on the configured channel's length ``n``:

- ``exact`` (LCPO-Exact): ``-alpha * |n - t|`` is added to the rollout reward, correct or not;
- ``max`` (LCPO-Max): a correct rollout's positive rollout reward is multiplied by
  ``clip(alpha * (t - n) + delta, 0, 1)``; an incorrect one is left as it is (0 with the correctness alone).

Rows of prompts without a target are left unchanged. The term also returns the per-row values of its
metrics (``metric:``), NaN outside the rows each averages over.
"""

from __future__ import annotations

import math

import torch

from ..agents import TARGET_LENGTH_MODES
from ..view import GroupView
from . import TermInputs, register_term

EXACT, MAX = TARGET_LENGTH_MODES.index("exact"), TARGET_LENGTH_MODES.index("max")


def target_metrics(view: GroupView, target: torch.Tensor, length: torch.Tensor) -> dict[str, torch.Tensor]:
    """``[width, Gb]`` per-row values of the §2.20 metrics: over the rows of shaped groups of agents with the
    term on, whether the prompt has a target; over those with one, ``n / t``, ``|n - t| / t`` and whether
    the latter is within ``target_length_tolerance``."""
    scope = view.processed & (view.p("target_length") > 0)
    aimed = scope & ~target.isnan()
    error = (length - target).abs_().div_(target)
    nan = torch.tensor(math.nan, dtype=torch.float64)
    return {
        "metric:target_frac": torch.where(scope, aimed.double(), nan),
        "metric:target_ratio_mean": torch.where(aimed, length / target, nan),
        "metric:target_rel_error_mean": torch.where(aimed, error, nan),
        "metric:target_within_tolerance_frac": torch.where(
            aimed, (error <= view.p("target_length_tolerance")).double(), nan
        ),
    }


@register_term(
    "target_length",
    kind="rollout",
    order=2,
    parameters=("target_length",),
    channels=("reasoning", "answer", "total"),
    reads_adjustment=True,
)
def target_length(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    mode, alpha = view.p("target_length"), view.p("target_length_alpha")
    target = inputs.target.expand_as(view.rewards)
    length = view.channel_of("target_length_channel")
    aimed = view.processed & ~target.isnan()
    exact = -alpha * (length - target).abs()
    budget = (alpha * (target - length) + view.p("target_length_delta")).clamp_(0.0, 1.0)
    scaled = inputs.adjustment.clamp(min=0.0).mul_(budget - 1.0).mul_(view.positive)
    change = torch.where(mode == EXACT, exact, torch.where(mode == MAX, scaled, 0.0))
    return {"target_length": torch.where(aimed, change, 0.0), **target_metrics(view, target, length)}
