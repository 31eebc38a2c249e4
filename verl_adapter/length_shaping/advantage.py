"""Advantage estimator ``length_grpo``: GRPO with the length coefficient's group normalization
(docs/reference/length-coefficient.md §3.3), the core's ``group_advantages``.

All-correct groups (every raw reward exactly 1.0) get ``shaped - mean(shaped)`` without std scaling,
all-wrong groups 0, mixed groups (and groups the coefficient skipped for a missing or non-binary reward)
verl's GRPO normalization on the shaped rewards (``algorithm.norm_adv_by_std_in_grpo``, epsilon 1e-6, a
one-row group uses mean 0 and std 1, exactly as ``compute_grpo_outcome_advantage``).

verl passes an estimator only ``token_level_rewards`` (shaped), ``response_mask``, ``index`` (``uid``) and
``config``; the raw rewards that classify groups and the skipped rows come from the length-shaping trainer,
which runs the estimator inside :func:`raw_scores` in the same process. Called anywhere else (the legacy
``RayPPOTrainer``, which never shapes) it raises instead of normalizing unshaped rewards.

Importing this module registers ``length_grpo`` in verl's estimator registry; ``verl_adapter.plugin`` imports
it right after verl imports ``verl.trainer.ppo.core_algos``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from trl_length_plugin.shaping import group_advantages, verl_normalization
from verl_adapter.length_shaping.config import LENGTH_GRPO

_RAW_SCORES: ContextVar[tuple[torch.Tensor, torch.Tensor] | None] = ContextVar(
    "length_grpo_raw", default=None
)


@contextmanager
def raw_scores(raw: torch.Tensor, host_rows: torch.Tensor) -> Iterator[None]:
    """Make the rewards before length shaping and the rows the coefficient skipped (one per batch row,
    batch order) visible to ``length_grpo``."""
    token = _RAW_SCORES.set((raw, host_rows))
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
    context = _RAW_SCORES.get()
    if context is None:
        raise RuntimeError(
            f"algorithm.adv_estimator={LENGTH_GRPO} runs only inside verl_adapter's length-shaping V1 trainers "
            "(trainer.use_v1=true with length_penalty_coeff > 0); the legacy RayPPOTrainer does not shape rewards"
        )
    raw, host_rows = context
    if raw.numel() != shaped.numel():
        raise RuntimeError(f"{LENGTH_GRPO}: {raw.numel()} raw rewards for a batch of {shaped.numel()} rows")
    scale_by_std = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    advantage = group_advantages(
        shaped,
        raw.to(shaped.device),
        np.unique(np.asarray(index, dtype=object), return_inverse=True)[1],
        **vars(verl_normalization(scale_by_std)),
        plain_rows=host_rows,
    )
    advantages = advantage.unsqueeze(-1) * response_mask
    return advantages, advantages


def register() -> None:
    """``length_grpo`` in verl's estimator registry (idempotent)."""
    if core_algos.ADV_ESTIMATOR_REGISTRY.get(LENGTH_GRPO) is not compute_length_grpo_advantage:
        core_algos.register_adv_est(LENGTH_GRPO)(compute_length_grpo_advantage)


register()
