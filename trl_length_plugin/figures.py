"""Drawing and saving the PNGs of every part (the training curves, the offline preview, the demo, the benches):
matplotlib off screen, one way to lay out, write and close a figure."""

from __future__ import annotations

from pathlib import Path

from trl_length_plugin._optional import require


def pyplot():
    """matplotlib's ``pyplot`` drawing off screen (the Agg backend); a missing matplotlib names the extra."""
    require("matplotlib", "trl")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int = 100) -> Path:
    """Lay ``fig`` out, write it to ``path`` as a PNG (its folder made), close it; returns the path."""
    path = Path(path)
    try:
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)
    finally:
        pyplot().close(fig)
    return path
