"""The preview PNG: total lengths weighted by the correctness reward (before) and by the shaped reward
(after), and each shaped rollout's reward delta against its total length."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from trl_length_plugin.figures import pyplot
from trl_length_plugin.offline.outputs import replacing


def plot_preview(
    lengths: torch.Tensor,
    raw: torch.Tensor,
    shaped: torch.Tensor,
    in_shaped_group: torch.Tensor,
    unit: str,
    path: Path,
) -> Path:
    """Write the two panels to ``path`` (NaN rewards count as 0; through ``outputs.replacing``)."""
    plt = pyplot()

    x = lengths.double().numpy()
    before, after = raw.nan_to_num(0.0).numpy(), shaped.nan_to_num(0.0).numpy()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    low, high = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
    bins = np.histogram_bin_edges(x, bins=min(40, int(high - low) + 1), range=(low - 0.5, high + 0.5))
    left.hist(
        x, bins=bins, weights=before, histtype="step", linewidth=1.5, label="before: correctness reward"
    )
    left.hist(x, bins=bins, weights=after, histtype="step", linewidth=1.5, label="after: shaped reward")
    left.set_xlabel(f"total length ({unit})")
    left.set_ylabel("sum of rewards")
    left.set_title("lengths weighted by reward")
    left.legend()
    mask = in_shaped_group.numpy()
    right.scatter(x[mask], (after - before)[mask], s=8, alpha=0.5)
    right.axhline(0.0, color="grey", linewidth=0.8)
    right.set_xlabel(f"total length ({unit})")
    right.set_ylabel("shaped - correctness")
    right.set_title("reward delta vs length (shaped groups)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    with replacing(path) as temporary:
        fig.savefig(temporary, dpi=100)
    plt.close(fig)
    return path
