"""The toy window: a two-number column (a window per prompt) and a term's own line in the verbose record
(docs/write-a-term.md)."""

from __future__ import annotations

import torch

from trl_length_plugin.shaping.terms import Parameter, PromptColumn, register_term


def window_prepare(params, meta):
    return {"window": meta.columns["toy_window"]}


def window_record(params, values, shaped):
    return {"toy_window": {"low": values["window"][0], "high": values["window"][1]}}


@register_term(
    "toy_window",
    kind="additive",
    order=12,
    parameters={"toy_window_on": Parameter(bool, False, "record each group's window")},
    switches=("toy_window_on",),
    columns=(PromptColumn("toy_window", lambda value: value, "docs/write-a-term.md", width=2),),
    prepare=window_prepare,
    record=window_record,
)
def window(view, inputs):
    return {"toy_window": torch.zeros_like(view.rewards)}
