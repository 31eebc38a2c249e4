"""The per-rollout ``Length penalty:`` record of the length coefficient (docs/reference/length-coefficient.md
§3.4): an INFO line on the ``trl_length_plugin`` logger, or a JSON line in a file (large batches)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


def log_length_coefficient(
    result: LengthCoefficientResult,
    *,
    step: int | None = None,
    session_ids: Sequence[str] | None = None,
    is_main_process: bool = True,
    jsonl: str | Path | None = None,
) -> None:
    """Emit the §3.4 record of every rollout, main process only, nothing when the coefficient is 0: INFO
    lines on ``trl_length_plugin``, or, with ``jsonl``, JSON lines appended to that file (with ``step``)."""
    if not is_main_process or result.coeff == 0:
        return
    if jsonl is not None:
        path = Path(jsonl)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as sink:
            for record in length_penalty_records(result, step, session_ids):
                sink.write(json.dumps({"step": step, **record}) + "\n")
        return
    if logger.isEnabledFor(logging.INFO):
        for record in length_penalty_records(result, step, session_ids):
            logger.info(format_length_penalty(record))
