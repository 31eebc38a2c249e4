"""DAPO soft overlong punishment (docs/reference/length-penalties.md §2.17).

Per rollout, on the configured channel's length ``n``, with maximum ``L``, buffer ``B`` and factor ``f``:
``-f * clamp((n - (L - B)) / B, 0, 1)``: 0 up to ``L - B``, linear to ``-f`` at ``L``, ``-f`` beyond (TRL's
``get_soft_overlong_punishment`` with ``f = 1``; verl's DAPO reward manager's overlong buffer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..fields import CHANNELS, Channel, Count, NonNegative
from . import Parameter, register_term

if TYPE_CHECKING:
    import torch

    from ..view import GroupView
    from . import TermInputs

PARAMETERS = {
    "overlong_max_length": Parameter(
        Count, 0, "L, the length where the penalty reaches -f; 0 is off (§2.17)"
    ),
    "overlong_buffer": Parameter(Count, 0, "B, the buffer before L where the penalty grows (§2.17)"),
    "overlong_factor": Parameter(NonNegative, 1.0, "f, the penalty at L and beyond (§2.17)"),
    "overlong_channel": Parameter(Channel, "total", "the length channel the penalty reads (§2.5)", CHANNELS),
}


def overlong_errors(params: Mapping[str, Any], given: set[str]) -> list[str]:
    """``0 < overlong_buffer <= overlong_max_length`` when the maximum is set (a buffer without it is refused
    as every term's key without its switch, ``idle_key_errors``)."""
    errors = []
    longest, buffer = params["overlong_max_length"], params["overlong_buffer"]
    if longest and not 0 < buffer <= longest:
        errors.append(
            f"overlong_buffer: needs 0 < overlong_buffer <= overlong_max_length ({longest}), got {buffer}"
        )
    return errors


def overlong_metrics(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``overlong_frac`` (rows with a penalty) and ``overlong_penalty_mean`` (§2.17)."""
    penalty = values["overlong"]
    return {
        "length_penalty/overlong_frac": (penalty < 0).double(),
        "length_penalty/overlong_penalty_mean": penalty.double(),
    }


@register_term(
    "overlong",
    kind="rollout",
    order=1,
    parameters=PARAMETERS,
    switches=("overlong_max_length",),
    metrics=overlong_metrics,
    check=overlong_errors,
)
def overlong(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    import torch

    longest, buffer = view.p("overlong_max_length"), view.p("overlong_buffer")
    on = longest > 0
    excess = (view.channel_of("overlong_channel") - (longest - buffer)) / torch.where(on, buffer, 1.0)
    penalty = excess.clamp_(0.0, 1.0).mul_(-view.p("overlong_factor"))
    return {"overlong": penalty.mul_(view.processed & on)}
