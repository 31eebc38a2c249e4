"""Effect of length shaping in TRL on the embedded task: the same seed and steps with shaping off and on.

Mean completion length should fall clearly with shaping on while accuracy stays within a few points.
Prints one line per measure (shaping on, shaping off, ratio) and writes a PNG of both runs' curves.

    OMP_NUM_THREADS=2 python -m bench.bench_trl_effect [--steps 60] [--seeds 0,1,2] [--png outputs/bench_trl_effect.png]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")

from bench._harness import header, report  # noqa: E402

ACCURACY = "rewards/correctness_reward/mean"
LENGTH = "completions/mean_length"
SHAPING = dict(
    length_penalty={"default": {"group_total_length_penalty_coeff": 0.3}}, length_penalty_coeff=0.5
)
EVAL_PROMPTS = 64


def train(shaping: bool, steps: int, seed: int, output_dir: str) -> tuple[list[dict], dict]:
    """Train, then evaluate on held-out prompts (never shaped): (per-step logs, eval metrics)."""
    from trl_length_plugin.embedded import (
        CPU_RUN_ARGS,
        correctness_reward,
        embedded_model_dir,
        load_tokenizer,
        make_task_dataset,
    )
    from trl_length_plugin.trl_integration import LengthPluginGRPOConfig, LengthPluginGRPOTrainer

    model_dir = embedded_model_dir()
    args = LengthPluginGRPOConfig(
        output_dir=output_dir,
        learning_rate=1e-4,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=16,
        num_generations=4,
        max_completion_length=48,
        max_steps=steps,
        seed=seed,
        **CPU_RUN_ARGS,
        **(SHAPING if shaping else {}),
    )
    trainer = LengthPluginGRPOTrainer(
        model=str(model_dir),
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=make_task_dataset(4 * steps, seed=seed),
        eval_dataset=make_task_dataset(EVAL_PROMPTS, seed=seed + 1),
        processing_class=load_tokenizer(model_dir),
    )
    trainer.train()
    history = [row for row in trainer.state.log_history if LENGTH in row]
    return history, trainer.evaluate()


def tail_mean(history: list[dict], key: str, last: int) -> float:
    return statistics.fmean(row[key] for row in history[-last:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated; figures are means over seeds")
    parser.add_argument("--png", default="outputs/bench_trl_effect.png")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    start = time.perf_counter()
    runs = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for shaping in (False, True):
                runs[shaping].append(train(shaping, args.steps, seed, os.path.join(tmp, f"{shaping}-{seed}")))
    last = max(1, args.steps // 4)

    def mean(shaping: bool, measure) -> float:
        return statistics.fmean(measure(history, evaluation) for history, evaluation in runs[shaping])

    def line(case: str, measure, unit: str = "") -> None:
        report(case, mean(True, measure), mean(False, measure), unit)

    header(
        f"TRL length shaping on (measured) vs off (baseline), embedded task, {args.steps} steps, "
        f"mean over seeds {args.seeds}"
    )
    line("first step: mean completion length", lambda h, e: h[0][LENGTH], "tk")
    line(f"last {last} steps: mean completion length", lambda h, e: tail_mean(h, LENGTH, last), "tk")
    line(f"last {last} steps: accuracy", lambda h, e: tail_mean(h, ACCURACY, last))
    line(f"held-out eval ({EVAL_PROMPTS}x4): mean length", lambda h, e: e[f"eval_{LENGTH}"], "tk")
    line(f"held-out eval ({EVAL_PROMPTS}x4): accuracy", lambda h, e: e[f"eval_{ACCURACY}"])
    from trl_length_plugin.trl_integration.plotting import plot_training_curves

    os.makedirs(os.path.dirname(os.path.abspath(args.png)), exist_ok=True)
    curves = {"shaping off": runs[False][0][0], "shaping on": runs[True][0][0]}
    path = plot_training_curves(
        curves["shaping on"], args.png, title=f"TRL length shaping, seed {seeds[0]}", runs=curves
    )
    print(f"# curves: {path}  ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
