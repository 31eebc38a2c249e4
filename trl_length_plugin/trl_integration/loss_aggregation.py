"""TRL 1.16's aggregation of a per-token loss for each ``loss_type`` (``GRPOTrainer._compute_loss``), written
once so the score-centering term A * C is normalized exactly like the base loss
(docs/reference/score-centering.md §5.5). tests/test_trl_score_centering.py proves that, applied to TRL's
own per-token loss, it reproduces TRL's loss for every loss type."""

from __future__ import annotations

import torch

LOSS_TYPES = ("grpo", "sapo", "bnpo", "dr_grpo", "luspo", "cispo", "dapo", "vespo")


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    *,
    training: bool,
    accumulation_steps: int,
    num_items_in_batch: torch.Tensor,
    num_processes: int,
    steps_per_generation: int,
    max_completion_length: int,
) -> torch.Tensor:
    """The loss of one micro-batch, divided for gradient accumulation as TRL divides it."""
    if loss_type in ("cispo", "dapo", "vespo"):  # the generation batch's global token count
        normalizer = num_items_in_batch.clamp(min=1.0) / num_processes
        if training:
            normalizer = normalizer * accumulation_steps / steps_per_generation
        return (per_token * mask).sum() / normalizer
    if loss_type in ("grpo", "sapo"):
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        loss = (per_token * mask).sum() / (per_token.size(0) * max_completion_length)
    elif loss_type == "luspo":
        loss = (per_token * mask).sum(-1).mean()
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}; expected one of {LOSS_TYPES}")
    return loss / (accumulation_steps if training else 1.0)
