"""The importance-sampling modes of score centering (docs/reference/score-centering.md §5.1's table, §5.5, §5.7).

Each mode is one module of this package that registers itself with :func:`register_mode`: its head mass m and
tail coefficient alpha (the table's row), its sampled-token weights, where its bounds come from and what it
needs from the host. The estimator, the config and the hosts ask the registered mode, never its name
(docs/write-a-mode.md). The package finds its modules itself (``pkgutil.iter_modules``); a mode outside it
registers when its module is imported. Declaring and looking up modes needs no torch (the config imports this
package with pydantic only); a mode's functions import it when they run.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple, get_args

if TYPE_CHECKING:
    import torch

#: where a mode's bounds (lo, hi) come from: none; the host's own bound keys (its tis/icepop setting); the base
#: loss's clip keys, lo = 1 - low and hi = 1 + high, with the controller's offset k added to hi (reference §5.7)
BoundsSource = Literal["none", "host", "clip"]


class Head(NamedTuple):
    """The head of every position (``[..., K]``; ``rho`` ``[...]``), masked positions and non-finite sampler
    slots neutralized: detached policy probabilities p, sampler probabilities q (0 on empty slots), the slots
    that belong to the head and the tail scale rho (0 under replay)."""

    p: torch.Tensor
    q: torch.Tensor
    slots: torch.Tensor
    rho: torch.Tensor


class Window(NamedTuple):
    """What a mode reads besides the head at one step: its bounds ``(lo, hi)`` (with the controller's offset
    already in hi), the advantages (broadcast like the positions; only their sign is read) and the outer bound."""

    bounds: tuple[float, float] | None = None
    advantages: torch.Tensor | None = None
    outer_bound: float | None = None


@dataclass(frozen=True)
class ImportanceSampling:
    """One mode (see the module docstring; docs/write-a-mode.md says what each declaration means)."""

    name: str
    coefficients: Callable[[Head, Window], tuple[torch.Tensor, torch.Tensor]]
    """m ``[..., K]`` and alpha ``[...]`` of the table, from the head (C = sum_H (m - alpha p) log p)."""
    weights: Callable[[torch.Tensor, Window], torch.Tensor]
    """The base loss's weight of each sampled token from its ratio r = p(y) / q(y)."""
    bounds: BoundsSource = "none"
    written: bool = False
    """No host computes these sampled-token weights: the plugin writes them into the host's loss."""
    controller: bool = False
    """The adaptive controller steps an offset k of hi (§5.7): needs ``force_on_policy_ratio`` and the
    advantages' sign, and its keys are the controller's."""
    order: int = 100
    """Its place in the listings (messages, help): the package's modes in the table's order, 0-4."""


_MODES: dict[str, ImportanceSampling] = {}
#: the value of ``score_centering_importance_sampling`` that takes the host's own mode (reference §5.5)
AUTO = "auto"


def register_mode(mode: ImportanceSampling) -> ImportanceSampling:
    """Register ``mode`` under its name (unique, not empty, not ``auto``), its declarations checked; returns it."""
    if not isinstance(mode.name, str) or not mode.name.strip():
        raise ValueError(
            f"importance-sampling mode: a name is needed (a non-empty string), got {mode.name!r}"
        )
    if not callable(mode.coefficients) or not callable(mode.weights):
        raise ValueError(
            f"importance-sampling mode {mode.name!r}: its coefficients and weights must be functions (docs/write-a-mode.md)"
        )
    if mode.bounds not in get_args(BoundsSource):
        raise ValueError(
            f"importance-sampling mode {mode.name!r}: bounds must be one of {get_args(BoundsSource)}, got {mode.bounds!r}"
        )
    if mode.name == AUTO:
        raise ValueError(f"importance-sampling mode {AUTO!r} is reserved: it takes the host's own mode")
    if mode.name in _MODES:
        raise ValueError(f"importance-sampling mode {mode.name!r} is registered twice")
    if mode.controller != (mode.bounds == "clip"):
        raise ValueError(
            f"importance-sampling mode {mode.name!r}: the base loss's clip bounds go with the adaptive controller "
            "(bounds='clip' and controller=True together)"
        )
    if mode.written and mode.bounds == "host":
        raise ValueError(
            f"importance-sampling mode {mode.name!r}: the host's bound keys belong to its own weights, which are "
            "off where the plugin writes the weights"
        )
    _MODES[mode.name] = mode
    return mode


def unregister_mode(name: str) -> None:
    """Remove a mode registered from outside the package; the package's own modes stay (the config, the hosts
    and their checks name them)."""
    if name in BUILT_IN:
        raise ValueError(
            f"importance-sampling mode {name!r} is one of the package's own; it cannot be unregistered"
        )
    if name not in _MODES:
        raise ValueError(f"importance-sampling mode {name!r} is not registered; registered: {mode_names()}")
    del _MODES[name]


def mode_names() -> tuple[str, ...]:
    """The registered modes' names, in their ``order``."""
    return tuple(sorted(_MODES, key=lambda name: (_MODES[name].order, name)))


def get_mode(name: str) -> ImportanceSampling:
    """The registered mode ``name``; ``ValueError`` naming the registered ones."""
    try:
        return _MODES[name]
    except KeyError:
        raise ValueError(f"importance_sampling_mode must be one of {mode_names()}, got {name!r}") from None


def in_bounds(ratio: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """Bounds are inclusive: ``lo <= r <= hi``."""
    return (ratio >= lo) & (ratio <= hi)


def head_ratios(head: Head) -> tuple[torch.Tensor, torch.Tensor]:
    """The head ratios p/q (0 on empty slots) and the tail ratio 1/rho (inf when rho = 0), which the filtering
    modes keep or drop."""
    import torch

    ratio = torch.where(head.slots, head.p / torch.where(head.slots, head.q, 1.0), 0.0)
    return ratio, torch.where(head.rho > 0, 1.0 / head.rho, math.inf)


for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
#: the package's own modes
BUILT_IN = frozenset(_MODES)
