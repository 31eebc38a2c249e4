"""The toy tax: each correct row loses ``toy_tax`` per unit of its total length (docs/write-a-term.md)."""

from __future__ import annotations

import torch

from trl_length_plugin.shaping.fields import NonNegative
from trl_length_plugin.shaping.terms import Parameter, register_term

PARAMETERS = {"toy_tax": Parameter(NonNegative, 0.0, "the loss per unit of total length of a correct row")}


def toy_metrics(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"length_penalty/toy_tax_mean": values["toy_tax"].double()}


@register_term(
    "toy_tax", kind="additive", order=10, parameters=PARAMETERS, switches=("toy_tax",), metrics=toy_metrics
)
def toy_tax(view, inputs):
    return {"toy_tax": view.lengths["total"] * -view.p("toy_tax") * view.positive}
