"""Pass-rate-scaled length penalty (docs/reference/length-penalties.md §2.11).

Correct rows get ``-w * rho * total / l_max``: rho the group's pass rate, l_max the longest correct total;
not subject to the two-positives rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..fields import NonNegative
from . import Parameter, register_term

if TYPE_CHECKING:
    import torch

    from ..view import GroupView
    from . import TermInputs

PARAMETERS = {
    "pass_rate_length_penalty_weight": Parameter(NonNegative, 0.0, "w, the weight of the penalty (§2.11)"),
}


@register_term(
    "pass_rate",
    kind="additive",
    order=6,
    parameters=PARAMETERS,
    switches=("pass_rate_length_penalty_weight",),
)
def pass_rate(view: GroupView, inputs: TermInputs) -> dict[str, torch.Tensor]:
    import torch

    from ..groups import row_count, row_max, weights

    if not view.on("pass_rate_length_penalty_weight"):
        return {}
    weight = view.p("pass_rate_length_penalty_weight")
    total = view.lengths["total"]
    rho = view.n_positive.double() / row_count(view.bucket.valid).double()
    longest = row_max(total, view.positive)
    on = (rho > 0) & (longest > 0)
    term = (total * (-weight * rho)).div_(torch.where(on, longest, 1.0))
    return {"pass_rate": term.mul_(weights(view.positive & on))}
