"""PNG curves of a training run (mean completion length and accuracy/reward against step)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trl_length_plugin.figures import pyplot, save_figure

LENGTH_KEY = "completions/mean_length"


def reward_keys(log_history: Sequence[dict]) -> list[str]:
    """The per-function reward means TRL logged (``rewards/<name>/mean``), in first-seen order."""
    keys: dict[str, None] = {}
    for row in log_history:
        keys.update((k, None) for k in row if k.startswith("rewards/") and k.endswith("/mean"))
    return list(keys)


def _series(log_history: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    rows = [row for row in log_history if key in row and "step" in row]
    return [row["step"] for row in rows], [row[key] for row in rows]


def plot_training_curves(
    log_history: Sequence[dict],
    path: str | Path,
    title: str = "",
    runs: dict[str, Sequence[dict]] | None = None,
) -> Path:
    """Plot mean completion length and every logged reward mean against step; save a PNG.

    ``log_history`` is a trainer's ``state.log_history``. ``runs`` optionally maps labels to further
    histories drawn on the same axes (e.g. shaping on vs off). Returns the PNG path.
    """
    plt = pyplot()
    histories = {"": log_history} if runs is None else dict(runs)
    keys = reward_keys([row for history in histories.values() for row in history])
    fig, axes = plt.subplots(1, 1 + max(1, len(keys)), figsize=(5 * (1 + max(1, len(keys))), 3.6))
    for label, history in histories.items():
        axes[0].plot(*_series(history, LENGTH_KEY), label=label or None)
        for ax, key in zip(axes[1:], keys, strict=False):
            ax.plot(*_series(history, key), label=label or None)
    axes[0].set_title("mean completion length (tokens)")
    for ax, key in zip(axes[1:], keys, strict=False):
        ax.set_title(key)
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if runs is not None:
            ax.legend()
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)
