"""Per-group records of what the length shaping did, for ``verbose`` logs
(docs/reference/length-penalties.md §2.15).

Built only when ``verbose`` is on, so the default path never loops over groups.
"""

from __future__ import annotations

import logging
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
    missing) or ``non_binary``; ``details`` holds what the terms' ``record`` said of the group, by entry
    name in term order (the profile gate's line, the profiled threshold; each also reads as an attribute,
    ``record.profiled_threshold``), and ``gate`` the gate term's entry; ``terms`` maps each output of the registered rollout and additive terms
    (``cosine``, ``reasoning_bonus``, ``longest_total``, ``group_answer``, ``zmad_total``, ``profiled``,
    ``pass_rate``, ...) and ``band_multipliers`` each multiplier output (the band channels) to per-row values
    in row order (0, or 1, where the term did not run)."""

    group: Any
    agent: str
    rows: list[int]
    status: str
    details: dict[str, Any]
    rewards: list[float]
    lengths: dict[str, list[float]]
    terms: dict[str, list[float]]
    band_multipliers: dict[str, list[float]]
    shaped: list[float]

    @property
    def gate(self) -> dict[str, Any] | None:
        """The gate term's entry (``reason`` among others), None when no gate acted on the group."""
        return next((self.details[t.name] for t in terms("gate") if t.name in self.details), None)

    def __getattr__(self, name: str) -> Any:
        details = self.__dict__.get("details", {})
        if name in details:
            return details[name]
        raise AttributeError(f"{type(self).__name__!r} has no attribute or detail {name!r}")


def _status(processed: bool, enabled: bool, missing: bool) -> str:
    if processed:
        return "shaped"
    if not enabled:
        return "disabled"
    return "missing" if missing else "non_binary"


def _details(params: Any, trace: ShapingTrace, group: int, shaped: bool) -> dict[str, Any]:
    """What each term that kept per-group values says of ``group`` (its ``record``), in term order."""
    details = {}
    for term in terms():
        values = trace.groups.get(term.name)
        if term.record is not None and values is not None:
            at = {key: float(value[group]) for key, value in values.items()}
            details.update(term.record(params, at, shaped))
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
    for name, value in record.details.items():
        if isinstance(value, dict):
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
