"""`make demo` (issue 39): plain GRPO and the best arm side by side on the embedded overthinking task, their rows
beside the grid's, the cut against plain GRPO and the best peer, and a PNG of both runs per step."""

from __future__ import annotations

import pytest

from trl_length_plugin.embedded import tasks
from trl_length_plugin.tools import demo


@pytest.mark.slow
def test_demo_trains_plain_grpo_and_the_best_arm_side_by_side(tmp_path, capsys):
    png = demo.main(["--steps", "2", "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    task = demo.DEFAULT_TASK
    assert task is tasks.OVERTHINKING
    assert f"this run: {demo.PLAIN_NAME}" in out and f"this run: {task.best_name}" in out
    assert f"[demo] {task.best_name} vs {demo.PLAIN_NAME} (this run): length " in out
    assert "no stored grid run of seed 0 at 2 steps" in out  # the grid ran 60 steps
    assert png == tmp_path / "curves.png" and png.stat().st_size > 0
    assert {p.name for p in tmp_path.iterdir()} >= {"plain", "best", "curves.png"}
