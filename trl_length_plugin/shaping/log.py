"""The ``Length penalty:`` records of the length coefficient (docs/reference/length-coefficient.md §3.4): one
summary line per step, or one INFO line per rollout on the ``trl_length_plugin`` logger, or a JSON line per
rollout in a file (large batches)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .coefficient import LengthCoefficientResult
from .groups import GroupLayout

logger = logging.getLogger("trl_length_plugin")

FIELDS = (
    "session_id",
    "rollout_id",
    "generated_tokens",
    "multiplier",
    "reward_reduction",
    "raw_reward",
    "shaped_reward",
)


def length_penalty_records(
    result: LengthCoefficientResult, step: int | None = None, session_ids: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """One record per rollout. ``session_id`` is ``session_ids[row]`` when given, else
    ``step<step>/group<group id>``; ``rollout_id`` is the row's index within its group."""
    if session_ids is None:
        ids = result.group_index
        ids = ids.gid if isinstance(ids, GroupLayout) else ids
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        prefix = "" if step is None else f"step{step}/"
        session_ids = [f"{prefix}group{group}" for group in ids]
    rows = zip(
        session_ids,
        result.layout.position.tolist(),
        result.lengths.tolist(),
        result.multipliers.tolist(),
        result.reward_reductions.tolist(),
        result.raw_rewards.tolist(),
        result.rewards.tolist(),
        strict=True,
    )
    return [
        dict(zip(FIELDS, (session, rollout, int(tokens), *values), strict=True))
        for session, rollout, tokens, *values in rows
    ]


def format_length_penalty(record: dict[str, Any]) -> str:
    """The §3.4 line of one record."""
    return (
        f"Length penalty: session_id={record['session_id']} rollout_id={record['rollout_id']} "
        f"generated_tokens={record['generated_tokens']} multiplier={record['multiplier']:.6f} "
        f"reward_reduction={record['reward_reduction']:.6f} raw_reward={record['raw_reward']:.6f} "
        f"shaped_reward={record['shaped_reward']:.6f}"
    )


def length_penalty_lines(
    result: LengthCoefficientResult, step: int | None = None, session_ids: Sequence[str] | None = None
) -> list[str]:
    """The §3.4 line of every rollout."""
    return [format_length_penalty(record) for record in length_penalty_records(result, step, session_ids)]


def length_penalty_summary(result: LengthCoefficientResult, step: int | None = None) -> str:
    """The §3.4 summary line of one step's rollouts."""
    return records_summary(length_penalty_records(result), result.coeff, step)


def records_summary(records: Sequence[dict[str, Any]], coeff: float, step: int | None = None) -> str:
    """The §3.4 summary line of one step's records (``length_penalty_records``, possibly from several calls;
    a group is a ``session_id``)."""
    lengths = torch.tensor([r["generated_tokens"] for r in records], dtype=torch.float64)
    multipliers = torch.tensor([r["multiplier"] for r in records], dtype=torch.float64)
    reductions = torch.nan_to_num(torch.tensor([r["reward_reduction"] for r in records], dtype=torch.float64))
    rows = lengths.numel()

    def mean(values: torch.Tensor) -> float:
        return float(values.mean()) if values.numel() else 0.0

    return (
        f"Length penalty: step={'-' if step is None else step} coeff={coeff:g} rollouts={rows} "
        f"groups={len({r['session_id'] for r in records})} penalized={int((multipliers < 1).sum())} "
        f"generated_tokens_mean={mean(lengths):.1f} multiplier_mean={mean(multipliers):.6f} "
        f"multiplier_min={float(multipliers.min()) if rows else 1.0:.6f} "
        f"reward_reduction_mean={mean(reductions):.6f}"
    )


def log_records(
    records: Sequence[dict[str, Any]],
    coeff: float,
    step: int | None = None,
    jsonl: str | Path | None = None,
    rollouts: bool = True,
) -> None:
    """Emit §3.4 records (``length_penalty_records``, possibly of several calls): with ``jsonl``, one JSON line
    per rollout appended to that file (with ``step``); else INFO lines on ``trl_length_plugin``, one per
    rollout (``rollouts``) or one summary line for the step."""
    if jsonl is not None:
        path = Path(jsonl)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as sink:
            for record in records:
                sink.write(json.dumps({"step": step, **record}) + "\n")
        return
    if not logger.isEnabledFor(logging.INFO):
        return
    if not rollouts:
        logger.info(records_summary(records, coeff, step))
        return
    for record in records:
        logger.info(format_length_penalty(record))


def log_length_coefficient(
    result: LengthCoefficientResult,
    *,
    step: int | None = None,
    session_ids: Sequence[str] | None = None,
    is_main_process: bool = True,
    jsonl: str | Path | None = None,
    rollouts: bool = True,
) -> None:
    """:func:`log_records` of one result's records, main process only, nothing when the coefficient is 0."""
    if not is_main_process or result.coeff == 0:
        return
    log_records(length_penalty_records(result, step, session_ids), result.coeff, step, jsonl, rollouts)
