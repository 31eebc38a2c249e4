"""The toy budget, a term with per-prompt data of its own: each correct row beyond its prompt's ``toy_budget``
loses ``toy_budget_penalty`` (docs/write-a-term.md, "Per-prompt data of its own")."""

from __future__ import annotations

from trl_length_plugin.shaping.fields import NonNegative
from trl_length_plugin.shaping.terms import Parameter, PromptColumn, register_term

PARAMETERS = {"toy_budget_penalty": Parameter(NonNegative, 0.0, "the loss of a correct row over budget")}


def toy_budget_value(value):
    """A budget is a positive number of tokens (a bool, a string or a non-positive number is malformed)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"not a budget: {value!r}")
    return float(value)


def toy_budget_prepare(params, meta):
    return {"budget": meta.columns["toy_budget"][:, 0]}


@register_term(
    "toy_budget",
    kind="additive",
    order=11,
    parameters=PARAMETERS,
    switches=("toy_budget_penalty",),
    columns=(PromptColumn("toy_budget", toy_budget_value, "docs/write-a-term.md"),),
    prepare=toy_budget_prepare,
)
def toy_budget(view, inputs):
    over = view.positive & (view.lengths["total"] > inputs.prepared["budget"])
    return {"toy_budget": -view.p("toy_budget_penalty") * over}
