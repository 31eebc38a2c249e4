"""The demo: plain GRPO and the best length control of docs/efficacy.md, side by side, with TRL on the embedded
overthinking task (or ``--task reasoning|arithmetic``).

Both runs train at once (one process a core, a progress bar each), then each trained model answers the held-out
problems. The demo prints both rows beside the stored grid rows of the same seed (plain GRPO, the same arm, and
the best peer arm: TRL's or verl's own length tools, from the summary committed beside docs/efficacy.md), the
length cut and accuracy change of the best arm against plain GRPO and against the best peer, and writes a PNG of
both runs' length and accuracy per step.

Run with ``make demo`` (or ``python -m trl_length_plugin.tools.demo [--task reasoning]``). No Hub access is needed.
``bench/bench_efficacy.py`` trains every arm of docs/efficacy.md with the same settings and functions, so the
demo's runs reproduce their rows of the grid.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from trl_length_plugin.embedded.tasks import (
    ARITHMETIC,
    HELD_OUT_SEED,
    OVERTHINKING,
    STEPS,
    TASKS,
    Task,
    held_out_figures,
    sample,
)
from trl_length_plugin.figures import pyplot, save_figure
from trl_length_plugin.offline.command import Parser

#: the demo never reaches the Hub: these are set to 1 unless the caller set them
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
ACCURACY_KEY = "rewards/correctness_reward/mean"
LENGTH_KEY = "completions/mean_length"
PLAIN_NAME = "plain GRPO"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(prog="python -m trl_length_plugin.tools.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=list(TASKS), default=DEFAULT_TASK.name, help="the embedded task")
    parser.add_argument("--steps", type=int, default=STEPS, help="GRPO optimizer steps")
    parser.add_argument(
        "--output-dir",
        default="",
        help="where the PNG and logs go (default outputs/demo, or outputs/demo-TASK)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, choices=(1, 2), default=2, help="runs trained at once")
    args = parser.parse_args(argv)
    if args.steps < 1:  # 0 or -1 would train by epochs, for hours
        parser.error(f"--steps: at least 1, got {args.steps}")
    default_dir = "outputs/demo" if args.task == DEFAULT_TASK.name else f"outputs/demo-{args.task}"
    args.output_dir = args.output_dir or default_dir
    return args


#: the task ``make demo`` and the lead comparison of docs/efficacy.md use
DEFAULT_TASK = OVERTHINKING


def make_table_callback(total_steps: int):
    """A callback printing one table row per logged step under a progress bar."""
    from tqdm.auto import tqdm
    from transformers import TrainerCallback

    class TableCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.bar = tqdm(total=total_steps, desc="GRPO", unit="step", leave=False)
            self.bar.write(f"{'step':>5} {'mean_len':>9} {'accuracy':>9} {'reward':>8} {'sec':>6}")
            self.start = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or LENGTH_KEY not in logs:
                return
            self.bar.write(
                f"{state.global_step:>5} {logs[LENGTH_KEY]:>9.2f} "
                f"{logs.get(ACCURACY_KEY, float('nan')):>9.3f} {logs.get('reward', float('nan')):>8.3f} "
                f"{time.perf_counter() - self.start:>6.0f}"
            )

        def on_step_end(self, args, state, control, **kwargs):
            self.bar.update(1)

        def on_train_end(self, args, state, control, **kwargs):
            self.bar.close()

    return TableCallback()


def make_progress_callback(arm: str, progress) -> object:
    """A callback putting ``(arm, step, mean length, accuracy)`` on the ``progress`` queue at every logged step."""
    from transformers import TrainerCallback

    class ProgressReport(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and LENGTH_KEY in logs:
                progress.put((arm, state.global_step, logs[LENGTH_KEY], logs.get(ACCURACY_KEY, float("nan"))))

    return ProgressReport()


def train_arm(
    keys: dict,
    seed: int,
    steps: int,
    output_dir: str | Path,
    train_dataset=None,
    callbacks=(),
    extra_rewards=(),
    reward_weights=None,
    task: Task = ARITHMETIC,
):
    """Train one arm (``keys``: its LengthPluginGRPOConfig keys, over ``task.training``; ``extra_rewards``:
    reward functions besides the correctness reward, ``reward_weights`` all their weights) on ``task`` (its
    adapter, ``task.lora``, or the full weights); returns the trainer, its model trained."""
    from transformers import AutoModelForCausalLM
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from trl_length_plugin.embedded import CPU_RUN_ARGS, load_tokenizer
    from trl_length_plugin.trl_integration import LengthPluginGRPOConfig, LengthPluginGRPOTrainer

    model_dir = task.model_dir(seed)
    weights = {} if reward_weights is None else {"reward_weights": list(reward_weights)}
    config = LengthPluginGRPOConfig(
        output_dir=str(output_dir),
        max_steps=steps,
        seed=seed,
        **{**task.training, **CPU_RUN_ARGS, **weights, **keys},
    )
    tokenizer = load_tokenizer(model_dir)
    trainer = LengthPluginGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        processing_class=tokenizer,
        reward_funcs=[task.correctness, *extra_rewards],
        args=config,
        train_dataset=task.training_set(seed) if train_dataset is None else train_dataset,
        callbacks=list(callbacks),
        peft_config=task.peft_config(),
    )
    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    trainer.train()
    return trainer


def evaluate_arm(trainer, task: Task = ARITHMETIC, held_out=None) -> dict:
    """A trained arm (``train_arm``'s trainer) sampled on the held-out problems (``held_out``: their rows, default
    the task's). Returns the log history and the held-out ``eval`` figures (``held_out_figures``)."""
    tokenizer = trainer.processing_class
    held_out = task.held_out() if held_out is None else held_out
    completions = sample(
        trainer.model, tokenizer, held_out, task.eval_samples, HELD_OUT_SEED, task.max_length, task
    )
    figures = held_out_figures(completions, held_out, tokenizer, task.report)
    return dict(history=trainer.state.log_history, eval=figures)


def tail_mean(history: list[dict], key: str, last: int = 10) -> float:
    values = [row[key] for row in history if key in row][-last:]
    return sum(values) / len(values)


def grid_rows(task: Task, seed: int, steps: int) -> dict[str, dict]:
    """The stored grid runs (docs/efficacy.md's committed summary of ``task``) of plain GRPO, the task's best
    arm and best peer arm at ``seed`` and ``steps`` with the task's training settings, adapter and warm model:
    arm name -> record with ``train`` and ``eval``; empty where the summary lacks them."""
    path = Path(__file__).resolve().parents[1] / "docs" / task.grid_summary
    if not path.exists():
        return {}
    wanted = (PLAIN_NAME, task.best_name, task.best_peer)
    runs = json.loads(path.read_text())["runs"]
    found = {
        r["arm"]: r
        for r in runs
        if r["seed"] == seed
        and r["settings"]["steps"] == steps
        and r["settings"]["training"] == task.training
        and r["settings"].get("warm_seed") == task.warm_seed
        and r["settings"].get("lora", 0) == task.lora
    }
    return {name: found[name] for name in wanted if name in found}


def print_row(label: str, train: dict | None, held_out: dict) -> None:
    train_cells = f"{train['length']:>9.2f} {train['accuracy']:>9.3f}" if train else f"{'':>9} {'':>9}"
    print(f"[demo] {label:<58} {train_cells} {held_out['length']:>9.2f} {held_out['accuracy']:>9.3f}")
    for level in held_out.get("levels", []):
        share = f", {100 * level['redundant_share']:.0f}% of tokens" if "redundant_share" in level else ""
        print(
            f"[demo] {'  level ' + str(level['level']) + ' (' + str(level['samples']) + ' samples)':<58} "
            f"{'':>9} {'':>9} {level['length']:>9.2f} {level['accuracy']:>9.3f}   skipping "
            f"{100 * level['skipped']:.1f}%, {level['redundant']:.2f} redundant clauses{share}"
        )


def versus(a: dict, b: dict) -> str:
    return f"length {100 * (a['length'] / b['length'] - 1):+.1f}%, accuracy {100 * (a['accuracy'] - b['accuracy']):+.1f} points"


def demo_run(name: str, keys: dict, seed: int, steps: int, output_dir: str, task_name: str, progress) -> dict:
    """One arm of the demo (in a worker process): train, answer the held-out problems; its history and
    figures."""
    import torch

    torch.set_num_threads(1)  # the tiny model gains nothing from more, and bench_efficacy trains with one
    task = TASKS[task_name]
    trainer = train_arm(
        keys, seed, steps, output_dir, callbacks=[make_progress_callback(name, progress)], task=task
    )
    run = evaluate_arm(trainer, task)
    return dict(name=name, **run)


def train_side_by_side(arms: dict[str, dict], args: argparse.Namespace, task: Task) -> dict[str, dict]:
    """Train every arm (name -> keys) at once, ``args.jobs`` worker processes, a progress bar per arm."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from tqdm.auto import tqdm

    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        progress = manager.Queue()
        futures = [
            pool.submit(
                demo_run,
                name,
                keys,
                args.seed,
                args.steps,
                str(Path(args.output_dir) / slug),
                task.name,
                progress,
            )
            for slug, (name, keys) in zip(("plain", "best"), arms.items(), strict=True)
        ]
        bars = {
            name: tqdm(total=args.steps, desc=f"{name:<24}", unit="step", position=k, leave=False)
            for k, name in enumerate(arms)
        }
        while not all(future.done() for future in futures) or not progress.empty():
            try:
                name, step, length, accuracy = progress.get(timeout=0.5)
            except Exception:  # queue.Empty: no step finished in the last half second
                continue
            bars[name].update(step - bars[name].n)
            bars[name].set_postfix_str(f"length {length:.1f}, accuracy {accuracy:.2f}")
        for bar in bars.values():
            bar.close()
        return {run["name"]: run for run in (future.result() for future in futures)}


def plot_side_by_side(runs: dict[str, dict], path: Path, title: str) -> Path:
    """Both runs' mean completion length and accuracy per step, one panel each."""
    plt = pyplot()

    fig, (length_ax, accuracy_ax) = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, run in runs.items():
        rows = [row for row in run["history"] if LENGTH_KEY in row]
        steps = [row["step"] for row in rows]
        length_ax.plot(steps, [row[LENGTH_KEY] for row in rows], label=name)
        accuracy_ax.plot(steps, [100 * row[ACCURACY_KEY] for row in rows], label=name)
    length_ax.set_title("mean completion length (tokens)")
    accuracy_ax.set_title("training accuracy (%)")
    for ax in (length_ax, accuracy_ax):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> Path:
    for var in OFFLINE_VARIABLES:  # set when the demo runs, not when it is imported
        os.environ.setdefault(var, "1")
    args = parse_args(argv)
    task = TASKS[args.task]
    started = time.perf_counter()
    print(f"[demo] preparing the embedded {task.name} model (built once, then cached)")
    task.model_dir(args.seed)
    arms = {PLAIN_NAME: {}, task.best_name: task.best_keys}
    print(
        f"[demo] {PLAIN_NAME} and {task.best_name} {task.best_keys}, side by side on the embedded {task.name} task: "
        f"{args.steps} steps of 4 prompts x 8 completions each, seed {args.seed}"
    )
    runs = train_side_by_side(arms, args, task)
    print(
        f"\n[demo] {'':<58} {'train len':>9} {'train acc':>9} {'eval len':>9} {'eval acc':>9}"
        f"   (train: last 10 steps; eval: {len(task.held_out())} held-out problems x {task.eval_samples})"
    )
    for name, run in runs.items():
        history = run["history"]
        train = dict(length=tail_mean(history, LENGTH_KEY), accuracy=tail_mean(history, ACCURACY_KEY))
        print_row(f"this run: {name}", train, run["eval"])
    grid = grid_rows(task, args.seed, args.steps)
    for name, record in grid.items():
        role = " (best peer arm)" if name == task.best_peer else ""
        print_row(f"grid, seed {args.seed}: {name}{role}", record["train"], record["eval"])
    best = runs[task.best_name]["eval"]
    print(f"[demo] {task.best_name} vs {PLAIN_NAME} (this run): {versus(best, runs[PLAIN_NAME]['eval'])}")
    if task.best_peer in grid:
        print(
            f"[demo] {task.best_name} vs the grid's best peer, {task.best_peer}: {versus(best, grid[task.best_peer]['eval'])}"
        )
    print(
        f"[demo] seed {args.seed}, {task.name} task; means and intervals over seeds: docs/efficacy.md"
        + ("" if grid else f" (no stored grid run of seed {args.seed} at {args.steps} steps to compare with)")
    )
    png = plot_side_by_side(
        runs, Path(args.output_dir) / "curves.png", f"embedded {task.name} task, seed {args.seed}"
    )
    print(f"[demo] curves written to {png}  ({time.perf_counter() - started:.0f} s in all)")
    return png


if __name__ == "__main__":
    main()
