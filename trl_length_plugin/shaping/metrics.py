"""Metrics as per-row values, averaged over whichever rows a host reports (docs/reference/length-penalties.md
§2.15): every metric is a per-rollout mean, so a host may reduce the rows of any subset of a shaped batch
(verl reduces each training batch from groups shaped when they finished)."""

from __future__ import annotations

import torch


def mean_metrics(rows: dict[str, torch.Tensor], index: torch.Tensor | None = None) -> dict[str, float]:
    """Each metric's mean over the rows (``index``: a subset), NaN rows left out (a missing reward)."""
    return {
        name: float(torch.nanmean(values if index is None else values[index]))
        for name, values in rows.items()
    }
