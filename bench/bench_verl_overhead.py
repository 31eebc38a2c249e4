"""The plugin's cost on verl's own training step: plain GRPO vs each feature on, in verl's real loop on CPU.

Each arm is one ``trl-length verl-smoke`` run of the same base configuration (the shipped GRPO recipe without
its length block, on the embedded warm model: 4 prompts x 8 rollouts of up to 48 tokens a step, learning rate
1e-6), in one invocation of this script; verl's ``timing_s/step`` and its phases (generation, old logprobs,
advantages: where the shaping runs, the actor update) over the steps after the first (the first includes vLLM's
warm-up), their medians, and the peak of verl's ``actor/perf/cpu_memory_used_gb`` (the trainer
worker's host memory). Ratios are against plain GRPO of the same invocation; with ``--rounds 2`` the arms run
twice in alternating order (ABC..CBA) and each arm's steps are pooled. Targets: shaping and LUSPO at most
1.05x of plain GRPO's step; score centering reported at K = 16 and 64.

    python -m bench.bench_verl_overhead [--steps 8] [--rounds 1] [--arms "group penalties" ...]

``--arms`` runs only the arms whose names contain one of the given texts (plain GRPO always runs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench._harness import header, report
from trl_length_plugin.recipes import RECIPES_DIR
from verl_adapter.tools.check import recipe_overrides
from verl_adapter.tools.smoke_log import read_metrics

RECIPE = RECIPES_DIR / "verl" / "grpo_length_penalty_qwen2.5-0.5b.sh"
BLOCK = RECIPES_DIR / "verl" / "length_penalty_gsm8k.yaml"
SCORE_CENTERING = [
    "algorithm.rollout_correction.rollout_is=token",
    "algorithm.rollout_correction.rollout_is_threshold=2.0",
    "+score_centering=true",
    "+score_centering_importance_sampling=auto",
    "actor_rollout_ref.rollout.calculate_log_probs=True",
]
#: verl's phases of a step: generation, the actor's old logprobs, advantages (the shaping runs here), the update
PHASES = ("timing_s/gen", "timing_s/old_log_prob", "timing_s/adv", "timing_s/update_actor")
ARMS = {
    "plain GRPO": [],
    "group penalties (the recipe's block)": [f"+length_penalty={BLOCK}"],
    "length coefficient (length_grpo, c=0.5)": [
        "algorithm.adv_estimator=length_grpo",
        "+length_penalty_coeff=0.5",
    ],
    "LUSPO": [
        "actor_rollout_ref.actor.policy_loss.loss_mode=luspo",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum",
    ],
    "score centering K=16 (tis)": [*SCORE_CENTERING, "+score_centering_top_k=16"],
    "score centering K=64 (tis)": [*SCORE_CENTERING, "+score_centering_top_k=64"],
}


def base_overrides() -> list[str]:
    """The recipe's overrides without its length block: plain GRPO."""
    return [o for o in recipe_overrides(RECIPE, []) if not o.startswith("+length_penalty=")]


def run_arm(extra: list[str], steps: int, folder: Path) -> dict[int, dict]:
    command = [
        sys.executable,
        "-m",
        "verl_adapter.tools.smoke",
        *base_overrides(),
        *extra,
        "--steps",
        str(steps),
    ]
    done = subprocess.run([*command, "--run-dir", str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"arm failed ({' '.join(extra) or 'plain'}): {done.stderr.strip()[-500:]}")
    return read_metrics(folder / "metrics.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--arms", nargs="*", default=(), help="run only the arms whose names contain one of these"
    )
    args = parser.parse_args()
    phases = ("timing_s/step", *PHASES)
    names = [
        name for i, name in enumerate(ARMS) if i == 0 or not args.arms or any(a in name for a in args.arms)
    ]
    times: dict[str, dict[str, list[float]]] = {name: {phase: [] for phase in phases} for name in names}
    memory: dict[str, float] = dict.fromkeys(names, 0.0)
    with tempfile.TemporaryDirectory() as root:
        for round_index in range(args.rounds):
            for i, name in enumerate(names if round_index % 2 == 0 else names[::-1]):
                metrics = run_arm(ARMS[name], args.steps, Path(root) / f"{round_index}-{i}")
                later = [metrics[s] for s in sorted(metrics) if s > 1]
                for phase in phases:
                    times[name][phase] += [row.get(phase, 0.0) for row in later]
                memory[name] = max(
                    memory[name], *(row["actor/perf/cpu_memory_used_gb"] for row in metrics.values())
                )
                medians = ", ".join(
                    f"{p.split('/')[1]} {statistics.median(times[name][p]):.3f}" for p in phases
                )
                print(f"# {name}: {len(later)} steps, medians (s): {medians}", flush=True)
    threads = os.environ.get("OMP_NUM_THREADS")
    print(f"# verl's timings of steps 2-{args.steps} of each run (OMP_NUM_THREADS={threads})")
    for phase in phases:
        header(f"{phase}, steps 2-{args.steps}, median")
        base = statistics.median(times["plain GRPO"][phase])
        for name in names[1:]:
            report(name, statistics.median(times[name][phase]), base, unit="s")
    header("peak trainer-worker host memory (actor/perf/cpu_memory_used_gb)")
    for name in names[1:]:
        report(name, memory[name], memory["plain GRPO"], unit="GB")


if __name__ == "__main__":
    main()
