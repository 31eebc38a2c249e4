"""Advantage estimator ``length_grpo``: GRPO with the length coefficient's group normalization (decisions.md §3.3).

All-correct groups (every raw reward exactly 1.0) get ``shaped - mean(shaped)`` without std scaling,
all-wrong groups 0, mixed groups verl's GRPO normalization on the shaped rewards
(``algorithm.norm_adv_by_std_in_grpo``, epsilon 1e-6, a one-row group uses mean 0 and std 1, exactly as
``compute_grpo_outcome_advantage``).

verl passes an estimator only ``token_level_rewards`` (shaped), ``response_mask``, ``index`` (``uid``) and
``config``; the raw rewards that classify groups come from the length-shaping trainer, which runs the
estimator inside :func:`raw_scores` in the same process. Called anywhere else (the legacy
``RayPPOTrainer``, which never shapes) it raises instead of normalizing unshaped rewards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import torch

from trl_length_plugin.shaping import group_advantages

from .length_config import LENGTH_GRPO

#: verl's ``compute_grpo_outcome_advantage`` epsilon and one-row-group statistics
VERL_GRPO_EPS = 1e-6
VERL_SINGLE_ROW_STATS = (0.0, 1.0)

_RAW_SCORES: ContextVar[torch.Tensor | None] = ContextVar("length_grpo_raw_scores", default=None)


@contextmanager
def raw_scores(raw: torch.Tensor) -> Iterator[None]:
    """Make the rewards before length shaping (one per batch row, batch order) visible to ``length_grpo``."""
    token = _RAW_SCORES.set(raw)
    try:
        yield
    finally:
        _RAW_SCORES.reset(token)


def compute_length_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)``, both the per-sequence advantage broadcast over ``response_mask``."""
    shaped = token_level_rewards.sum(-1)
    raw = _RAW_SCORES.get()
    if raw is None:
        raise RuntimeError(
            f"algorithm.adv_estimator={LENGTH_GRPO} runs only inside verl_adapter's length-shaping V1 trainers "
            "(trainer.use_v1=true with length_penalty_coeff > 0); the legacy RayPPOTrainer does not shape rewards"
        )
    if raw.numel() != shaped.numel():
        raise RuntimeError(f"{LENGTH_GRPO}: {raw.numel()} raw rewards for a batch of {shaped.numel()} rows")
    scale_by_std = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    advantage = group_advantages(
        shaped,
        raw.to(shaped.device),
        np.unique(np.asarray(index, dtype=object), return_inverse=True)[1],
        scale_by_std=scale_by_std,
        std_eps=VERL_GRPO_EPS,
        single_row_stats=VERL_SINGLE_ROW_STATS,
    )
    advantages = advantage.unsqueeze(-1) * response_mask
    return advantages, advantages
