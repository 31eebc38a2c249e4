"""Per-group records of what the length shaping did, for ``verbose`` logs
(docs/reference/length-penalties.md §2.15).

Built only when ``verbose`` is on, so the default path never loops over groups.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .agents import AgentParams
from .batch import RolloutBatch
from .correctness import GroupKinds
from .groups import GroupLayout
from .terms import outputs, terms

if TYPE_CHECKING:
    from .penalties import ShapingTrace

logger = logging.getLogger("trl_length_plugin")


@dataclass
class GroupRecord:
    """One prompt group: ``status`` is ``shaped``, ``disabled``, ``missing`` (a correctness reward is
    missing) or ``non_binary``; ``details`` holds what each term's ``record`` said of the group, by term
    name in term order, then entry name (``details["profiled"]["profiled_threshold"]``; an entry also reads
    as an attribute, ``record.profiled_threshold``, when no field has its name), and ``gate`` is the gate
    term's line (``reason`` among others); ``terms`` maps each output of the registered rollout and additive
    terms (``cosine``, ``reasoning_bonus``, ``longest_total``, ``group_answer``, ``zmad_total``, ``profiled``,
    ``pass_rate``, ...) and ``band_multipliers`` each multiplier output (the band channels) to per-row values
    in row order (0, or 1, where the term did not run)."""

    group: Any
    agent: str
    rows: list[int]
    status: str
    details: dict[str, dict[str, Any]]
    rewards: list[float]
    lengths: dict[str, list[float]]
    terms: dict[str, list[float]]
    band_multipliers: dict[str, list[float]]
    shaped: list[float]

    @property
    def gate(self) -> Mapping[str, Any] | None:
        """The gate term's line, None when no gate acted on the group."""
        lines = (v for t in terms("gate") for v in self.details.get(t.name, {}).values())
        return next((line for line in lines if isinstance(line, Mapping)), None)

    def __getattr__(self, name: str) -> Any:
        """A term's entry by its name; an AttributeError when no term recorded it for this group."""
        for entries in self.__dict__.get("details", {}).values():
            if name in entries:
                return entries[name]
        raise AttributeError(f"{type(self).__name__!r} has no attribute, and no term recorded {name!r}")


def _status(processed: bool, enabled: bool, missing: bool) -> str:
    if processed:
        return "shaped"
    if not enabled:
        return "disabled"
    return "missing" if missing else "non_binary"


def _details(params: Any, trace: ShapingTrace, group: int, shaped: bool) -> dict[str, dict[str, Any]]:
    """What each term with per-group values (its ``prepare``'s, a gate's outputs) says of ``group`` through
    its ``record``, by term in term order; the values are ``group``'s, a number or a list of numbers."""
    details = {}
    for term in terms():
        values = trace.groups.get(term.name)
        if term.record is not None and values is not None:
            entries = term.record(
                params, {key: value[group].tolist() for key, value in values.items()}, shaped
            )
            if entries:
                details[term.name] = entries
    return details


def _row_columns(batch: RolloutBatch, trace: ShapingTrace, shaped: torch.Tensor) -> dict[str, dict]:
    """Per-row Python lists: lengths, each rollout and additive output and each multiplier."""
    terms = {
        name: trace.changes.get(name, torch.zeros_like(shaped)) for name in outputs("rollout", "additive")
    }
    bands = {name: trace.multipliers.get(name, torch.ones_like(shaped)) for name in outputs("multiplier")}
    lengths = {
        "reasoning": batch.reasoning_lengths,
        "answer": batch.answer_lengths,
        "total": batch.total_lengths,
    }
    return {
        "lengths": {name: values.tolist() for name, values in lengths.items()},
        "terms": {name: values.tolist() for name, values in terms.items()},
        "band_multipliers": {name: values.tolist() for name, values in bands.items()},
    }


def build_records(
    batch: RolloutBatch,
    params: AgentParams,
    kinds: GroupKinds,
    processed: torch.Tensor,
    trace: ShapingTrace,
    shaped: torch.Tensor,
) -> list[GroupRecord]:
    """One record per group, groups in order of first appearance, from the engine's ``trace``: the terms'
    per-group values through their ``record``."""
    layout = batch.layout
    order = torch.argsort(layout.gid * layout.num_rows + torch.arange(layout.num_rows)).tolist()
    starts = (torch.cumsum(layout.sizes, 0) - layout.sizes).tolist()
    ids = batch.group_index
    ids = ids.gid if isinstance(ids, GroupLayout) else ids
    ids = ids.tolist() if hasattr(ids, "tolist") else ids
    rewards, shaped_values = batch.rewards.tolist(), shaped.tolist()
    columns = _row_columns(batch, trace, shaped)
    enabled = params["enabled"]
    records = []
    for group, size in enumerate(layout.sizes.tolist()):
        rows = order[starts[group] : starts[group] + size]
        code = int(params.codes[group])
        status = _status(bool(processed[group]), bool(enabled[group]), bool(kinds.missing[group]))
        records.append(
            GroupRecord(
                group=ids[rows[0]],
                agent=params.names[code],
                rows=rows,
                status=status,
                details=_details(params.params[code], trace, group, status == "shaped"),
                rewards=[rewards[i] for i in rows],
                shaped=[shaped_values[i] for i in rows],
                **{
                    kind: {name: [values[i] for i in rows] for name, values in lists.items()}
                    for kind, lists in columns.items()
                },
            )
        )
    return records


def format_group_record(record: GroupRecord) -> str:
    """A multi-line text of one record: the group line, the gate line, one line per rollout."""
    lines = [f"length_penalty group={record.group} agent={record.agent} status={record.status}"]
    for name, value in (entry for entries in record.details.values() for entry in entries.items()):
        if isinstance(value, Mapping):
            lines.append(f"  {name} " + " ".join(f"{key}={item}" for key, item in value.items()))
        elif value is not None:
            lines.append(f"  {name}={value}")
    for k, row in enumerate(record.rows):
        lengths = " ".join(f"{name}_len={values[k]:g}" for name, values in record.lengths.items())
        terms = " ".join(f"{name}={values[k]:+.4f}" for name, values in record.terms.items() if values[k])
        bands = " ".join(
            f"band_{name}={values[k]:.4f}"
            for name, values in record.band_multipliers.items()
            if values[k] != 1
        )
        parts = [f"  [{k}] row={row} reward={record.rewards[k]:.4f}", lengths, terms, bands]
        parts.append(f"shaped={record.shaped[k]:.4f}")
        lines.append(" ".join(part for part in parts if part))
    return "\n".join(lines)


def log_group_records(records: list[GroupRecord], is_main_process: bool = True) -> None:
    """Log each record at INFO on ``trl_length_plugin`` (main process only)."""
    if not is_main_process or not logger.isEnabledFor(logging.INFO):
        return
    for record in records:
        logger.info(format_group_record(record))
