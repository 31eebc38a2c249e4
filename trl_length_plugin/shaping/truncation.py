"""Truncated rollouts: the ``mask`` and ``incorrect`` modes and their metric (docs/reference/length-penalties.md
§2.19). ``penalty`` is a per-rollout term of the engine (``terms/truncation.py``).

Before the binary check (§2.4): an ``incorrect`` agent's truncated rows get correctness 0 (still binary, so the
group terms and the coefficient see them as wrong); a ``mask`` agent's truncated rows leave the loss (the
host zeroes their loss mask, TRL's ``mask_truncated_completions``) and their loss-mask length counts 0 (§3.2).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .agents import AgentParams
from .batch import RolloutBatch
from .config import LengthPenaltyConfig
from .terms.truncation import TRUNCATION_MODES


@dataclass
class Truncation:
    """``batch``: the batch the shaping reads (``incorrect`` rows zeroed, ``mask`` rows' loss length 0);
    ``keep``: rows whose tokens stay in the loss (bool); ``row_metrics``: ``length_penalty/truncated_frac``."""

    batch: RolloutBatch
    keep: torch.Tensor
    row_metrics: dict[str, torch.Tensor]


def row_modes(batch: RolloutBatch, config: LengthPenaltyConfig) -> torch.Tensor:
    """Each row's ``truncation`` mode, an index into ``TRUNCATION_MODES`` (a group uses its agent's)."""
    layout = batch.layout
    params = AgentParams(config, batch.group_rows(batch.agents), layout.num_groups)
    enabled = params["enabled"]
    return torch.where(enabled, params["truncation"], 0)[layout.gid]


def apply_truncation(batch: RolloutBatch, config: LengthPenaltyConfig | None) -> Truncation | None:
    """The truncation step of ``shape_rollouts``; None when no agent sets ``truncation``."""
    if config is None or not config.any_enabled:
        return None
    if not config.truncation_modes:
        return None
    if batch.truncated is None:
        raise ValueError("length_penalty.truncation needs the hosts' truncated flag (RolloutBatch.truncated)")
    modes, truncated = row_modes(batch, config), batch.truncated
    zeroed = truncated & (modes == TRUNCATION_MODES.index("incorrect")) & ~torch.isnan(batch.rewards)
    masked = truncated & (modes == TRUNCATION_MODES.index("mask"))
    changes = {}
    if bool(zeroed.any()):
        changes["rewards"] = batch.rewards.masked_fill(zeroed, 0.0)
    if bool(masked.any()) and batch.loss_lengths is not None:
        changes["loss_lengths"] = batch.loss_lengths.masked_fill(masked, 0.0)
    if changes:
        batch = dataclasses.replace(batch, **changes)
    metrics = {"length_penalty/truncated_frac": (truncated & (modes > 0)).double()}
    return Truncation(batch, ~masked, metrics)
