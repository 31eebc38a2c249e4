"""The length algorithms as registered terms (docs/reference/length-penalties.md §2.6-2.13).

Each algorithm is one small module that registers itself with :func:`register_term`, declaring its
parameters (the flat ``length_penalty`` keys, unchanged), the channels it reads, its kind and its place in
the §2.6 order. Per bucket of groups the engine runs:

0. the ``rollout`` terms in ``order`` (cosine, overlong, target length, truncation penalty, §2.17-2.20):
   per-row changes of the correctness, added to the running rollout reward (which they read as
   ``inputs.adjustment``; a term may return the new reward itself as ``reward``, and per-row metric values as
   ``metric:<name>``, which are not added); the later terms read it as ``view.rewards``, while
   ``view.positive`` stays the correctness;
1. the ``gate`` terms (the profile gate, §2.13): per group, whether the gated terms apply;
2. the ``additive`` terms in ``order``: each returns per-row adjustments, summed as they finish; a term that
   declares ``reads_adjustment`` receives the sum of the terms before it (the profiled penalty's ">= 0"
   rule, §2.10); the shortest bonus keeps its own running reward over its channels (§2.7);
3. the sum is added to the reward and clamped at 0, then the ``multiplier`` terms (the profile band,
   §2.12) multiply it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from ..view import GroupView

Kind = Literal["rollout", "gate", "additive", "multiplier"]


@dataclass
class TermInputs:
    """What a term may read besides the view, per group of the bucket (Gb,): the gate, the running sum of
    earlier additive terms (``[width, Gb]``; for a rollout term: the running rollout reward), the profiled
    threshold, the merged bands (Gb, 3), the gate limits and the target length (NaN: none, §2.20)."""

    gate_open: torch.Tensor
    adjustment: torch.Tensor
    profiled_threshold: torch.Tensor
    bands: dict[str, torch.Tensor]
    limits: torch.Tensor
    target: torch.Tensor


@dataclass(frozen=True)
class Term:
    """A registered algorithm: ``compute(view, inputs)`` returns named per-row tensors (``outputs``)."""

    name: str
    kind: Kind
    order: int
    parameters: tuple[str, ...]
    channels: tuple[str, ...]
    outputs: tuple[str, ...]
    compute: Callable[[GroupView, TermInputs], dict[str, torch.Tensor]]
    reads_adjustment: bool = False
    reads_gate: bool = False

    def used_by(self, view: GroupView) -> bool:
        """Whether some agent of the batch sets one of this term's parameters."""
        return view.params.uses(*self.parameters)


_REGISTRY: dict[str, Term] = {}
_MODULES = ("cosine", "overlong", "target_length", "truncation", "profile_gate", "shortest_bonus", "longest_penalty", "group_relative", "zmad", "profiled",
            "pass_rate", "profile_band")  # fmt: skip


def register_term(
    name: str,
    *,
    kind: Kind,
    order: int,
    parameters: tuple[str, ...],
    channels: tuple[str, ...] = (),
    outputs: tuple[str, ...] = (),
    reads_adjustment: bool = False,
    reads_gate: bool = False,
) -> Callable[[Callable], Callable]:
    """Decorator registering ``compute(view, inputs) -> {output: tensor}`` as a length term."""

    def register(compute: Callable) -> Callable:
        if name in _REGISTRY:
            raise ValueError(f"length term {name!r} is registered twice")
        _REGISTRY[name] = Term(
            name, kind, order, parameters, channels, outputs or (name,), compute, reads_adjustment, reads_gate
        )
        return compute

    return register


def terms(kind: Kind) -> list[Term]:
    """The registered terms of one kind, in §2.6 order."""
    return sorted((t for t in _REGISTRY.values() if t.kind == kind), key=lambda t: t.order)


for _module in _MODULES:
    importlib.import_module(f"{__name__}.{_module}")

#: the rollout and additive terms' per-row outputs, in order (the verbose records' columns)
ADDITIVE_OUTPUTS = tuple(
    name for kind in ("rollout", "additive") for term in terms(kind) for name in term.outputs
)
