"""What the ``verl.plugins`` entry point costs every process that imports verl (docs/reference/product.md §1.5).

``import verl`` in fresh subprocesses, alternating the default (verl loads ``verl_adapter.plugin``) with
``VERL_USE_EXTERNAL_PLUGINS=none`` (the baseline) round by round, so both see the same machine load.
Per case the median over the rounds of CPU time (user + system), wall time, peak RSS and the number of
modules imported; target: at most 1.2x the baseline in CPU time and peak RSS. ``--import`` adds a verl
module to import after ``verl`` (``verl.trainer.ppo.v1`` is what the TaskRunner imports; there the plugin
registers its trainers, so that figure includes the adapter's own modules).

    python -m bench.bench_verl_import [--rounds 5] [--import verl.trainer.ppo.v1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from bench._harness import header, report

#: the child imports verl and prints its module count and whether vLLM got imported
CHILD = "import json, sys\nimport verl\n{extra}print(json.dumps([len(sys.modules), 'vllm' in sys.modules]))\n"
#: runs one child and prints its CPU time, wall time and peak RSS: a fresh wrapper per measurement, so the
#: children's ``ru_maxrss`` is that one child's
WRAPPER = """import json, resource, subprocess, sys, time
start = time.perf_counter()
done = subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, text=True, check=True)
wall = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
modules, vllm = json.loads(done.stdout.strip().splitlines()[-1])
print(json.dumps({"cpu": usage.ru_utime + usage.ru_stime, "wall": wall, "rss": usage.ru_maxrss / 1024,
                  "modules": modules, "vllm": vllm}))
"""
POLICIES = {"plugin": "auto", "none": "none"}


def one_import(policy: str, extra: str) -> dict[str, float]:
    """CPU seconds, wall seconds, peak RSS (MB), module count and vLLM of one fresh ``import verl``."""
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": policy, "OMP_NUM_THREADS": "1"}
    child = CHILD.format(extra=f"import {extra}\n" if extra else "")
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER, child], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--import", dest="extra", default="", help="a verl module to import after verl")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in POLICIES}
    for _ in range(args.rounds):
        for name, policy in POLICIES.items():
            runs[name].append(one_import(policy, args.extra))
    median = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    what = f"import verl; import {args.extra}" if args.extra else "import verl"
    header(
        f"{what}: with the plugin vs VERL_USE_EXTERNAL_PLUGINS=none, median of {args.rounds} alternated rounds"
    )
    plugin, none = median["plugin"], median["none"]
    report("CPU time (user + system)", plugin["cpu"], none["cpu"], "s")
    report("wall time", plugin["wall"], none["wall"], "s")
    report("peak RSS", plugin["rss"], none["rss"], "MB")
    report("modules imported", plugin["modules"], none["modules"], "")
    print(f"vLLM imported: plugin {bool(plugin['vllm'])}, none {bool(none['vllm'])}")


if __name__ == "__main__":
    main()
