"""``trl-length profile`` and ``trl-length preview`` at scale (issue 15): synthetic rollouts of the embedded
task's shape (completion text of 20-320 characters, 8 per prompt, a third wrong) profiled in characters in
bounded memory, then previewed with the profiled bands.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m bench.bench_profile [--rows 1000000]``

Each command runs in its own process, which reports its peak RSS (``getrusage``) and the wall time of the
command itself. Cases, each against a baseline from the same run:

- profile wall time vs ``json.loads`` of every line alone (the parse floor);
- profile memory (peak RSS above a process that only imports what it imports) vs the memory of a process
  that ``json.loads`` every row into one list (peak RSS above a bare interpreter): what each holds;
- profile peak RSS vs profiling a tenth of the rows (how memory grows);
- preview wall time vs ``shape_rollouts`` alone on the same batch (the engine inside it).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._harness import header, report

SAMPLES = 8
RECIPE = {
    "length_penalty": {
        "default": {
            "length_type": "chars",
            "group_total_length_penalty_coeff": 0.2,
            "group_length_penalty_profile_gate": True,
            "profile_band_total": True,
            "profiled_length_penalty": 0.1,
        }
    }
}
# run in a child: the command (or the baseline), then its wall time and peak RSS on the last stderr line
CHILD = """
import json, resource, sys, time
start = time.perf_counter()
if sys.argv[1] == "load":
    with open(sys.argv[2]) as lines:
        rows = [json.loads(line) for line in lines]
elif sys.argv[1] == "parse":
    with open(sys.argv[2]) as lines:
        for line in lines:
            json.loads(line)
elif sys.argv[1] == "imports":
    import datasets, torch, trl_length_plugin.offline.profile_cli, trl_length_plugin.shaping.lengths
elif sys.argv[1] != "noop":
    from trl_length_plugin.tools import commands
    commands.main(sys.argv[1:])
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}),
      file=sys.stderr)
"""


def write_rollouts(path: Path, rows: int, seed: int = 0) -> None:
    """``rows`` rollouts of ``rows // SAMPLES`` prompts, blocked by prompt as ``--generate`` writes them."""
    rng = random.Random(seed)
    with path.open("w") as sink:
        for i in range(rows):
            a, b, fillers = rng.randint(0, 9), rng.randint(0, 9), rng.randint(0, 60)
            reward = 1 if rng.random() < 0.67 else 0
            final = a + b if reward else a + b + 1
            text = f"<think>{a} + {b} {'hmm, ' * fillers}so {final}</think>{final}"
            row = {
                "prompt_id": i // SAMPLES,
                "completion": text,
                "reward": reward,
                "completion_tokens": fillers + 9,
            }
            sink.write(json.dumps(row) + "\n")


def child(*argv: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stderr.strip().splitlines()[-1])


def engine_seconds(rollouts: Path, prompts: Path) -> float:
    """``shape_rollouts`` alone on the batch ``preview`` builds from the same files (median of 3)."""
    import statistics

    import datasets
    import torch

    from trl_length_plugin.shaping import (
        TRL_NORMALIZATION,
        RolloutBatch,
        load_shaping_config,
        measure_lengths,
        shape_rollouts,
    )
    from trl_length_plugin.shaping.columns import PROFILE_BAND, PROFILED_OUTPUT_LENGTHS, PROFILED_REWARDS

    rows = [json.loads(line) for line in rollouts.open()]
    lengths = measure_lengths([row["completion"] for row in rows], "chars")
    table = datasets.load_from_disk(str(prompts))
    names = (PROFILED_REWARDS, PROFILED_OUTPUT_LENGTHS, PROFILE_BAND)
    metadata = [
        dict(zip(names, values, strict=True)) for values in zip(*(table[n] for n in names), strict=True)
    ]
    batch = RolloutBatch(
        torch.tensor([row["reward"] for row in rows], dtype=torch.float64),
        torch.tensor([row["prompt_id"] for row in rows]),
        lengths.reasoning,
        lengths.answer,
        metadata=[metadata[row["prompt_id"]] for row in rows],
    )
    config = load_shaping_config(RECIPE)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        shape_rollouts(batch, config, TRL_NORMALIZATION)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rollouts, small = work / "rollouts.jsonl", work / "small.jsonl"
        write_rollouts(rollouts, args.rows)
        write_rollouts(small, args.rows // 10)
        size_mb = rollouts.stat().st_size / 2**20
        prompts = work / "prompts"
        chars = ("--length-type", "chars")
        profile = child("profile", str(rollouts), "--output", str(prompts), *chars)
        profile_small = child("profile", str(small), "--output", str(work / "small_prompts"), *chars)
        parse, load = child("parse", str(rollouts)), child("load", str(rollouts))
        imports, bare = child("imports"), child("noop")
        recipe = work / "recipe.json"
        recipe.write_text(json.dumps(RECIPE))
        preview = child(
            "preview",
            str(rollouts),
            "--config",
            str(recipe),
            "--prompts",
            str(prompts),
            "--png",
            str(work / "p.png"),
        )
        engine = engine_seconds(rollouts, prompts)
    rows = args.rows
    header(f"offline tools: {rows} rollouts ({size_mb:.0f} MB JSONL), {rows // SAMPLES} prompts")
    report(
        f"profile {rows} rows: wall, vs json.loads of each line", profile["seconds"], parse["seconds"], "s"
    )
    held, loaded = profile["rss_mb"] - imports["rss_mb"], load["rss_mb"] - bare["rss_mb"]
    report(f"profile {rows} rows: memory held, vs json rows in a list", held, loaded, "MB")
    report(f"profile peak RSS: {rows} vs {rows // 10} rows", profile["rss_mb"], profile_small["rss_mb"], "MB")
    report(f"preview {rows} rows: wall, vs shape_rollouts alone", preview["seconds"], engine, "s")
    print(f"profile: {rows / profile['seconds']:,.0f} rows/s, peak RSS {profile['rss_mb']:.0f} MB "
          f"({imports['rss_mb']:.0f} MB after its imports)")  # fmt: skip
    print(f"preview: {rows / preview['seconds']:,.0f} rows/s, peak RSS {preview['rss_mb']:.0f} MB")


if __name__ == "__main__":
    main()
