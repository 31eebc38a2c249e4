"""The length algorithms as registered terms (docs/reference/length-penalties.md §2.6-2.13, §2.17-2.20).

Each algorithm is one module of this package, found here by :func:`pkgutil.iter_modules` (no list to keep),
that registers itself with :func:`register_term`; a module outside the package may register a term the same
way (docs/write-a-term.md). A term declares:

- ``parameters``: its flat ``length_penalty`` keys, from which ``LengthPenaltyParams`` is assembled, and
  ``switches``, those of them that turn it on (it runs when some agent of the batch sets one: not 0, false
  or none); ``check``: its keys' dependent-key errors, checked at load;
- ``kind`` and ``order``, its place in the §2.6 order; ``outputs``, its per-row values (the verbose records'
  columns); ``metrics``: its per-row metric values, derived from what it returned;
- ``metadata``: the core's per-prompt data it reads (§2.14: bands, profiles, target length); ``columns``:
  per-prompt dataset columns of its own (:class:`PromptColumn`: name, parser, citation), which every host
  reads and the core parses, caches and hands to it per group; and ``prepare``: its per-group inputs, built
  once per batch from the agents' parameters and the merged metadata (``TermInputs.prepared``), where a
  term merges its own columns with its keys;
- ``record``: what the verbose record of one group says of it (§2.15), from the agent's parameters, the
  group's ``prepare`` values (a gate's outputs too; a term without them is not asked) and whether the group
  was shaped.

Per bucket of groups the engine runs:

0. the ``rollout`` terms in ``order`` (cosine, overlong, target length, truncation penalty, §2.17-2.20):
   per-row changes of the correctness, added to the running rollout reward (which they read as
   ``inputs.adjustment``; a term may return the new reward itself under ``REWARD``, which replaces it
   exactly); the later terms read it as ``view.rewards``, while ``view.positive`` stays the correctness. A
   group where a rollout term is ``on`` keeps a negative rollout reward (§2.6, step 8);
1. the ``gate`` terms (the profile gate, §2.13): per group, whether the gated terms apply (``open``);
2. the ``additive`` terms in ``order``: each returns per-row adjustments, summed as they finish; a term
   reads the sum of the terms before it as ``inputs.adjustment`` (the profiled penalty's ">= 0" rule,
   §2.10) and the gate as ``inputs.gate_open``;
3. the sum is added to the reward and clamped, then the ``multiplier`` terms (the profile band, §2.12)
   multiply it (``inputs.adjustment``: the clamped reward).

Only pydantic is imported here and at the top of the term modules (their computations import torch
themselves), so the config assembles its parameter model before torch is imported (product.md §1.4).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import operator
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

from pydantic import Field
from pydantic.fields import FieldInfo

from ..columns import HOST_COLUMNS, METADATA_COLUMNS, METADATA_KEYS, PROMPT_ID, ROLLOUT_COLUMNS

if TYPE_CHECKING:
    import torch

    from ..agents import AgentParams
    from ..metadata import GroupMetadata
    from ..view import GroupView

Kind = Literal["rollout", "gate", "additive", "multiplier"]
KINDS: tuple[Kind, ...] = get_args(Kind)  # in §2.6 order
#: the per-prompt metadata a term may read (§2.14): the merged bands, the profiles, the target length
Metadata = Literal["bands", "profiles", "target"]
#: the keys every agent block has beside the terms' (``config.SharedParams``): no term's key takes their names
SHARED_KEYS = ("enabled", "length_type", "top_percentile")
#: the key under which a rollout term may return the new rollout reward itself
REWARD = "reward"
#: the key of a gate term's per-group output saying whether the gated terms apply
GATE_OPEN = "open"


def switched_on(value: Any) -> bool:
    """Whether a switch's value turns its term on: not 0, false or none."""
    return value not in (0, False, "none")


def idle_key_errors(params: Mapping[str, Any], given: set[str]) -> list[str]:
    """``key: message`` for a term's key set (in ``given``) to a value other than its default while none of
    the term's switches turns it on in ``params``: the key would do nothing, whatever the term
    (docs/reference/length-penalties.md §2.6). Writing a default changes nothing and is accepted."""
    errors = []
    for term in terms():
        keys = set(term.parameters) - set(term.switches)
        idle = sorted(key for key in given & keys if params[key] != term.parameters[key].default)
        if idle and not any(switched_on(params[key]) for key in term.switches):
            needs = " or ".join(term.parameters[key].switched_on_text(key) for key in term.switches)
            errors.append(f"{idle[0]}: needs {needs} (the key that switches its term on)")
    return errors


@dataclass(frozen=True)
class Parameter:
    """One flat ``length_penalty`` key: its type (with its constraints), default and description; a string
    key's ``options`` are its values in the order of its per-group index (its ``Literal`` order unless
    given)."""

    annotation: Any
    default: Any
    description: str
    options: tuple[str, ...] = ()

    def default_error(self) -> str | None:
        """Why the default breaks the key's own type or constraints (pydantic, strict like the config), or None."""
        from pydantic import TypeAdapter, ValidationError

        from ...config_base import STRICT

        try:
            TypeAdapter(self.annotation, config=STRICT).validate_python(self.default)
        except ValidationError as err:
            return err.errors()[0]["msg"]
        return None

    def field(self) -> tuple[Any, FieldInfo]:
        """The pydantic field definition: ``(annotation, Field(default, description=...))``."""
        return self.annotation, Field(self.default, description=self.description)

    def switched_on_text(self, key: str) -> str:
        """How a user switches this key on: ``key: a or b`` (choices), ``key: true`` or ``key > 0``."""
        if self.choices():
            return f"{key}: {' or '.join(c for c in self.choices() if switched_on(c))}"
        return f"{key}: true" if self.annotation is bool else f"{key} > 0"

    def choices(self) -> tuple[str, ...]:
        """The values a string key is indexed by, or () for other keys."""
        if self.options or get_origin(self.annotation) is not Literal:
            return self.options
        return get_args(self.annotation)


@dataclass(frozen=True)
class PromptColumn:
    """A per-prompt dataset column a term brings (docs/reference/length-penalties.md §2.14): read from the
    top level of each row (or verl's ``extra_info``) like the core's columns, parsed once per prompt, cached
    for the run, and given to the term per group as ``GroupMetadata.columns[name]`` (``width`` float64 values,
    NaN where the prompt has none or a malformed one).

    ``parse(value)``: one present entry as ``width`` numbers (a number when ``width`` is 1); it raises for a
    malformed entry (any error), which is then flagged, warned about and counted in
    ``length_penalty/invalid_metadata_frac``, never raised out of the shaping (as the core's columns).
    ``cite``: where the column is specified."""

    name: str
    parse: Callable[[Any], float | Sequence[float]]
    cite: str
    width: int = 1

    def read(self, values: list[Any], malformed: object = None) -> tuple[Any, Any]:
        """(n, width) float64 values of the column's entries (None: absent; NaN where absent or malformed) and
        (n,) malformed flags: each present entry through ``parse``; an entry that is the caller's
        ``malformed`` marker (its row was not a mapping), any error of the parser, a wrong count or a
        non-finite number flags it: a term's parser never stops the shaping (§2.14)."""
        import numpy as np

        parsed = np.full((len(values), self.width), np.nan)
        bad = np.zeros(len(values), dtype=bool)
        for i, value in enumerate(values):
            if value is None:
                continue
            try:
                read = None if value is malformed else np.asarray(self.parse(value), dtype=np.float64)
            except Exception:  # noqa: BLE001 -- the term's code: whatever it raises, the entry is malformed
                read = None
            if read is None or read.size != self.width or not np.isfinite(read).all():
                bad[i] = True
            else:
                parsed[i] = read.reshape(-1)
        return parsed, bad


@dataclass
class TermInputs:
    """What a term reads besides the view, for the groups of the bucket: the gate (Gb,), the running sum
    of the earlier terms of its kind (``[width, Gb]``; a rollout term: the running rollout reward; a
    multiplier: the clamped shaped reward) and its own per-group values from ``prepare``."""

    gate_open: torch.Tensor
    adjustment: torch.Tensor
    prepared: dict[str, torch.Tensor]


Compute = Callable[["GroupView", TermInputs], "dict[str, torch.Tensor]"]
#: ``record(params, values, shaped)``: a group's entries in its verbose record, ``{name: value}`` (a mapping
#: value is printed as one line of ``key=value`` pairs, anything else as ``name=value``; None is left out),
#: from the agent's parameters, the group's values of the term's ``prepare`` (and a gate's outputs: a term
#: without them is not asked), each a number or a list of numbers, and whether the group was shaped
Record = Callable[[Any, "dict[str, Any]", bool], "dict[str, Any]"]


@dataclass(frozen=True)
class Term:
    """A registered algorithm: ``compute(view, inputs)`` returns named per-row tensors (a gate: per-group
    ones), its declared ``outputs`` and any values its ``metrics`` read."""

    name: str
    kind: Kind
    order: int
    parameters: Mapping[str, Parameter]
    switches: tuple[str, ...]
    outputs: tuple[str, ...]
    compute: Compute
    metadata: tuple[Metadata, ...] = ()
    prepare: Callable[[AgentParams, GroupMetadata], dict[str, torch.Tensor]] | None = None
    metrics: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None
    check: Callable[[Mapping[str, Any], set[str]], list[str]] | None = None
    turned_on: Callable[[GroupView], torch.Tensor] | None = None
    record: Record | None = None
    columns: tuple[PromptColumn, ...] = ()

    def used_by(self, params: AgentParams) -> bool:
        """Whether some agent of the batch sets one of the term's switches."""
        return params.uses(*self.switches)

    def on(self, view: GroupView) -> torch.Tensor:
        """(Gb,) the groups whose agent turns the term on: a switch not 0, false or none, unless the term
        says otherwise (``turned_on``)."""
        if self.turned_on is not None:
            return self.turned_on(view)
        return functools.reduce(operator.or_, (view.p(name) != 0 for name in self.switches))


#: the entry-point group through which an installed package registers its terms (docs/write-a-term.md)
ENTRY_POINT_GROUP = "trl_length_plugin.terms"


class TermLoadError(ImportError):
    """A module of the ``ENTRY_POINT_GROUP`` failed to load or to register its terms (one line)."""


_REGISTRY: dict[str, Term] = {}
_ORDERED: list[Term] = []  # the registry in §2.6 order
_KEYS: dict[str, Parameter] = {}  # every term's keys
_open = True  # registration is open until the config builds its parameter model


def register_term(
    name: str,
    *,
    kind: Kind,
    order: int,
    parameters: Mapping[str, Parameter],
    switches: tuple[str, ...],
    outputs: tuple[str, ...] = (),
    metadata: tuple[Metadata, ...] = (),
    prepare: Callable[[AgentParams, GroupMetadata], dict[str, torch.Tensor]] | None = None,
    metrics: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
    check: Callable[[Mapping[str, Any], set[str]], list[str]] | None = None,
    turned_on: Callable[[GroupView], torch.Tensor] | None = None,
    record: Record | None = None,
    columns: tuple[PromptColumn, ...] = (),
) -> Callable[[Compute], Compute]:
    """Decorator registering ``compute(view, inputs) -> {output: tensor}`` as a length term (see the module
    docstring for what each declaration means); ``outputs`` defaults to ``(name,)``."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"length term: a name is needed (a non-empty string), got {name!r}")
    if kind not in KINDS:
        raise ValueError(f"length term {name!r}: kind must be one of {KINDS}, got {kind!r}")
    if not set(switches) <= set(parameters):
        raise ValueError(f"length term {name!r}: its switches must be among its parameters")

    def register(compute: Compute) -> Compute:
        if name in _REGISTRY:
            raise ValueError(f"length term {name!r} is registered twice")
        taken = set(parameters) & set(_KEYS)
        if taken:
            raise ValueError(f"length term {name!r}: key {sorted(taken)[0]!r} belongs to another term")
        named = [column.name for column in columns]
        read = {*metadata_columns(), *METADATA_KEYS, *HOST_COLUMNS, *ROLLOUT_COLUMNS, PROMPT_ID}
        clash = set(named) & read or len(set(named)) < len(named)
        if clash or any(column.width < 1 for column in columns):
            raise ValueError(
                f"length term {name!r}: its columns {named} must be new dataset column names (not one a host or "
                "tool reads), each at least one number wide"
            )
        problem = _declaration_error(parameters, outputs or (name,))
        if problem:
            raise ValueError(f"length term {name!r}: {problem}")
        if not _open:
            raise ValueError(
                f"length term {name!r}: registered after the length-shaping config was built; register it "
                f"before (a module of the {ENTRY_POINT_GROUP!r} entry-point group, or one imported before "
                "trl_length_plugin.shaping.config; docs/write-a-term.md)"
            )
        declared = (metadata, prepare, metrics, check, turned_on, record, tuple(columns))
        _REGISTRY[name] = Term(
            name, kind, order, dict(parameters), switches, outputs or (name,), compute, *declared
        )
        _ORDERED[:] = sorted(_REGISTRY.values(), key=lambda t: (KINDS.index(t.kind), t.order))
        _KEYS.update(parameters)
        return compute

    return register


def _declaration_error(parameters: Mapping[str, Parameter], named: tuple[str, ...]) -> str | None:
    """What in a new term's keys or outputs would break the registered terms: a key named like a shared key
    or a registered output, an output named like a registered output or key (the verbose records and the
    metrics hold them by name), an output named twice, a default its own constraints refuse."""
    others = {output for term in _ORDERED for output in term.outputs}
    for key, parameter in parameters.items():
        if key in SHARED_KEYS or key in others:
            kind = "a key every agent block shares" if key in SHARED_KEYS else "another term's output"
            return f"key {key!r} is {kind}; choose another name"
        problem = parameter.default_error()
        if problem:
            return f"key {key!r}: its default {parameter.default!r} breaks its own type or constraints ({problem})"
    taken = [output for output in named if output in others or output in _KEYS]
    if taken or len(set(named)) < len(named):
        return f"its outputs {list(named)} must be new names, each once (not another term's output or key)"
    return None


def registered_parameters() -> dict[str, tuple[Any, FieldInfo]]:
    """Close registration and give every term's keys as pydantic field definitions, terms in §2.6 order:
    the package's own terms, then those of installed packages (the modules their ``ENTRY_POINT_GROUP``
    entry points name, imported here). The config calls it once, to build ``LengthPenaltyParams``; a term
    registered after that is refused (docs/write-a-term.md)."""
    global _open
    if _open:
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                entry.load()
            except Exception as err:
                said = " ".join(str(err).split())
                raise TermLoadError(
                    f"{ENTRY_POINT_GROUP} entry point {entry.name!r} ({entry.value}) failed to load: "
                    f"{type(err).__name__}: {said}"
                ) from err
        _open = False
    return {key: p.field() for term in _ORDERED for key, p in term.parameters.items()}


def terms(*kinds: Kind) -> list[Term]:
    """The registered terms of these kinds (default: all), in §2.6 order."""
    return [term for term in _ORDERED if not kinds or term.kind in kinds]


def key_choices(name: str) -> tuple[str, ...]:
    """The values a term's string key is indexed by, () for any other key."""
    parameter = _KEYS.get(name)
    return () if parameter is None else parameter.choices()


def switches_reading(metadata: Metadata) -> tuple[str, ...]:
    """The switches of the terms that read ``metadata``."""
    return tuple(key for term in terms() if metadata in term.metadata for key in term.switches)


def prompt_columns() -> tuple[PromptColumn, ...]:
    """The terms' own per-prompt columns, in term order."""
    return tuple(column for term in terms() for column in term.columns)


def metadata_columns() -> tuple[str, ...]:
    """Every per-prompt column a host reads (§2.14): the core's, then the terms' own."""
    return (*METADATA_COLUMNS, *(column.name for column in prompt_columns()))


def metadata_keys() -> tuple[str, ...]:
    """The parts of a prompt's metadata flagged malformed apart: the core's, then each term column."""
    return (*METADATA_KEYS, *(column.name for column in prompt_columns()))


def outputs(*kinds: Kind) -> tuple[str, ...]:
    """The per-row outputs of the terms of these kinds, in order (the verbose records' columns)."""
    return tuple(name for term in terms(*kinds) for name in term.outputs)


for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
