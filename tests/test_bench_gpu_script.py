"""The prepared GPU benchmark (bench/gpu/bench_score_centering_gpu.py) runs: its ``--smoke`` sizes on CPU, so the
script a lent GPU machine gets is known to work before the machine's minutes are spent."""

from __future__ import annotations

import json

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
