"""The per-rollout ``Length penalty:`` INFO line of the length coefficient (decisions.md §3.4)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .coefficient import LengthCoefficientResult
from .groups import GroupLayout

logger = logging.getLogger("trl_length_plugin")


def length_penalty_lines(
    result: LengthCoefficientResult, step: int | None = None, session_ids: Sequence[str] | None = None
) -> list[str]:
    """One line per rollout. ``session_id`` is ``session_ids[row]`` when given, else
    ``step<step>/group<group id>``; ``rollout_id`` is the row's index within its group."""
    layout = result.layout
    if session_ids is None:
        ids = result.group_index
        ids = (
            ids.gid.tolist()
            if isinstance(ids, GroupLayout)
            else ids.tolist()
            if hasattr(ids, "tolist")
            else list(ids)
        )
        prefix = "" if step is None else f"step{step}/"
        session_ids = [f"{prefix}group{group}" for group in ids]
    rows = zip(
        session_ids,
        layout.position.tolist(),
        result.lengths.tolist(),
        result.multipliers.tolist(),
        result.reward_reductions.tolist(),
        result.raw_rewards.tolist(),
        result.rewards.tolist(),
        strict=True,
    )
    return [
        f"Length penalty: session_id={session} rollout_id={rollout} generated_tokens={int(tokens)} "
        f"multiplier={multiplier:.6f} reward_reduction={reduction:.6f} raw_reward={raw:.6f} "
        f"shaped_reward={shaped:.6f}"
        for session, rollout, tokens, multiplier, reduction, raw, shaped in rows
    ]


def log_length_coefficient(
    result: LengthCoefficientResult,
    *,
    step: int | None = None,
    session_ids: Sequence[str] | None = None,
    is_main_process: bool = True,
) -> None:
    """Log the §3.4 line of every rollout at INFO on ``trl_length_plugin``: main process only, before
    advantage normalization, nothing when the coefficient is 0."""
    if not is_main_process or result.coeff == 0 or not logger.isEnabledFor(logging.INFO):
        return
    for line in length_penalty_lines(result, step, session_ids):
        logger.info(line)
