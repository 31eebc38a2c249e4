"""GSPO vs LUSPO on the embedded task: mean completion length and accuracy, side by side (issue 6, docs/reference/luspo.md §4).

Both losses run TRL's real GRPOTrainer on the warm-started embedded model with the same seeds, data, steps
and clip range (the paper's 2e-3 / 2.5e-3); only the loss differs: GSPO = ``loss_type="grpo"`` with
sequence-level ratios (each sequence's term averaged over its tokens), LUSPO = ``loss_type="luspo"`` (each
sequence's term times its length). Each rollout batch serves two optimizer steps (``num_iterations=2``) so
the ratios move and the clip range acts. Curves are averaged over the seeds.

Prints the curves as a table, the last-window means as ``case | measured (LUSPO) | baseline (GSPO) | ratio``
lines, writes a PNG, and says in words whether GSPO's length collapse (the paper's contrast) shows here.

    python -m bench.bench_luspo_effect [--steps 80] [--seeds 0,1,2] [--out outputs/luspo_effect.png]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402

from bench._harness import header, report  # noqa: E402

LENGTH_KEY = "completions/mean_length"
ACCURACY_KEY = "rewards/correctness_reward/mean"
LOSSES = {"gspo": {"loss_type": "grpo"}, "luspo": {"loss_type": "luspo"}}
#: the paper's clip range (docs/reference/luspo.md §4.2), shared by both losses
CLIP = {"epsilon": 2e-3, "epsilon_high": 2.5e-3}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80, help="optimizer steps per run")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds; curves are averaged")
    parser.add_argument("--out", default="outputs/luspo_effect.png", help="PNG of the curves")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (2 oversubscribes a busy machine)"
    )
    parser.add_argument("--window", type=int, default=5, help="logged generations averaged at each end")
    return parser.parse_args(argv)


def train(loss: str, seed: int, args: argparse.Namespace, output_dir: Path) -> list[dict]:
    """One run; returns the trainer's log history."""
    from transformers import AutoModelForCausalLM
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from trl_length_plugin.embedded import (
        CPU_RUN_ARGS,
        correctness_reward,
        embedded_model_dir,
        load_tokenizer,
        make_task_dataset,
    )

    model_dir = embedded_model_dir(warm_start=True)
    config = GRPOConfig(
        output_dir=str(output_dir / f"{loss}-{seed}"),
        **LOSSES[loss],
        **CLIP,
        importance_sampling_level="sequence",
        beta=0.0,
        max_steps=args.steps,
        per_device_train_batch_size=32,
        gradient_accumulation_steps=2,
        num_iterations=2,
        num_generations=8,
        max_completion_length=64,
        temperature=1.0,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        **CPU_RUN_ARGS,
        seed=seed,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        processing_class=load_tokenizer(model_dir),
        reward_funcs=[correctness_reward],
        args=config,
        train_dataset=make_task_dataset(4096, seed=seed),
    )
    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    trainer.train()
    return trainer.state.log_history


def curve(history: list[dict], key: str) -> dict[int, float]:
    return {row["step"]: row[key] for row in history if key in row}


def seed_mean(curves: list[dict[int, float]]) -> dict[int, float]:
    return {step: statistics.mean(c[step] for c in curves) for step in sorted(curves[0])}


def end_change(values: list[float], window: int) -> float:
    return statistics.mean(values[-window:]) - statistics.mean(values[:window])


def verdict(lengths: dict[str, list[dict[int, float]]], window: int) -> str:
    """Plain-words reading of the length curves: does GSPO shrink where LUSPO holds, and in how many seeds?"""
    change = {k: [end_change(list(c.values()), window) for c in runs] for k, runs in lengths.items()}
    start = statistics.mean(statistics.mean(list(c.values())[:window]) for c in lengths["gspo"])
    gspo, luspo = statistics.mean(change["gspo"]), statistics.mean(change["luspo"])
    agree = sum(g < u - 1.0 for g, u in zip(change["gspo"], change["luspo"], strict=True))
    seeds = len(change["gspo"])
    per_seed = ", ".join(f"{g:+.1f}/{u:+.1f}" for g, u in zip(change["gspo"], change["luspo"], strict=True))
    words = (
        f"Length change, first vs last {window} generations: GSPO {gspo:+.2f}, LUSPO {luspo:+.2f} tokens from "
        f"{start:.1f} (seed mean; per seed GSPO/LUSPO: {per_seed}). "
    )
    if gspo < -0.1 * start and luspo > gspo + 1.0:
        where = (
            "in every seed" if agree == seeds else f"in the seed mean, but in only {agree} of {seeds} seeds"
        )
        return words + (
            f"GSPO's completions shrink while LUSPO's hold, {where}: the paper's length-collapse contrast shows at "
            "this scale" + ("." if agree == seeds else ", weakly.")
        )
    return words + "No consistent contrast: the paper's length collapse does not show at this scale."


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from trl_length_plugin.trl_integration.plotting import plot_training_curves

    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    histories = {loss: [] for loss in LOSSES}
    started = time.perf_counter()
    for seed in seeds:
        for loss in LOSSES:
            histories[loss].append(train(loss, seed, args, out.parent / "luspo_effect_runs"))
    elapsed = time.perf_counter() - started
    lengths = {k: [curve(h, LENGTH_KEY) for h in runs] for k, runs in histories.items()}
    accuracy = {k: [curve(h, ACCURACY_KEY) for h in runs] for k, runs in histories.items()}
    mean_length = {k: seed_mean(v) for k, v in lengths.items()}
    mean_accuracy = {k: seed_mean(v) for k, v in accuracy.items()}

    print(
        f"# GSPO vs LUSPO, embedded task: {args.steps} steps x seeds {seeds}, lr {args.learning_rate}, "
        f"clip {CLIP['epsilon']}/{CLIP['epsilon_high']}, 8 prompts x 8 completions per generation "
        f"({elapsed:.0f} s in all); seed means"
    )
    print(f"{'step':>5} {'len GSPO':>9} {'len LUSPO':>10} {'acc GSPO':>9} {'acc LUSPO':>10}")
    for step in mean_length["gspo"]:
        print(
            f"{step:>5} {mean_length['gspo'][step]:>9.2f} {mean_length['luspo'][step]:>10.2f} "
            f"{mean_accuracy['gspo'][step]:>9.3f} {mean_accuracy['luspo'][step]:>10.3f}"
        )
    w = args.window
    header(f"last {w} generations, seed mean: LUSPO (measured) vs GSPO (baseline)")
    last = {k: statistics.mean(list(v.values())[-w:]) for k, v in mean_length.items()}
    report("mean completion length", last["luspo"], last["gspo"], "tok")
    last = {k: statistics.mean(list(v.values())[-w:]) for k, v in mean_accuracy.items()}
    report("accuracy", last["luspo"], last["gspo"], "")
    runs = {
        k.upper(): [
            {"step": s, LENGTH_KEY: mean_length[k][s], ACCURACY_KEY: mean_accuracy[k][s]}
            for s in mean_length[k]
        ]
        for k in LOSSES
    }
    png = plot_training_curves(runs["GSPO"], out, title="GSPO vs LUSPO, embedded task (seed mean)", runs=runs)
    print(f"curves: {png}")
    print(verdict(lengths, w))


if __name__ == "__main__":
    main()
