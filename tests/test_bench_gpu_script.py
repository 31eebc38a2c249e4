"""The prepared GPU benchmarks (bench/gpu/) run: their ``--smoke`` sizes on CPU, so the
script a lent GPU machine gets is known to work before the machine's minutes are spent."""

from __future__ import annotations

import json

import pytest

from bench.gpu import bench_score_centering_gpu


def test_smoke_run_writes_every_case(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(bench_score_centering_gpu, "RESULTS", [])
    bench_score_centering_gpu.main(["--smoke"])
    cases = [
        row["case"] for row in json.loads((tmp_path / "score_centering_gpu.json").read_text())["results"]
    ]
    assert "top-k K=16: time" in cases and "score centering K=16 (tis): step time" in cases
    assert "logprobs_at_ids K=16: time" in cases
    assert "ratio" in capsys.readouterr().out


@pytest.mark.slow
def test_trl_step_smoke_run_checks_the_plugin_and_times_every_variant(tmp_path, monkeypatch, capsys):
    """bench/gpu/bench_trl_step_gpu.py's CPU dry run: the check (group shaping, the coefficient and LUSPO
    together, the plugin's metrics logged) passes and every variant is timed against plain GRPO."""
    from bench.gpu import bench_trl_step_gpu

    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(bench_trl_step_gpu, "RESULTS", [])
    bench_trl_step_gpu.main(["--smoke"])
    written = json.loads((tmp_path / "trl_step_gpu.json").read_text())
    assert [row["case"] for row in written["results"]] == [
        f"{name} (vs {against}): step time" for name, (_, against) in bench_trl_step_gpu.VARIANTS.items()
    ]
    assert written["check"]["length_penalty/coeff"] == bench_trl_step_gpu.COEFF
    assert "# check: PASS" in capsys.readouterr().out
