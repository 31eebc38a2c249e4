"""The demo: GRPO with TRL on the embedded reasoning task (or ``--task arithmetic``) with the best length
control of docs/efficacy.md.

The run prints a compact table under a progress bar, then the trained model answers the held-out problems;
its row is printed beside the stored grid rows of the same seed (plain GRPO, the same arm, and the best peer
arm: TRL's or verl's own length tools), from the summary committed beside docs/efficacy.md, and a PNG shows
the curves.

Run with ``make demo`` (or ``python -m trl_length_plugin.demo [--task arithmetic]``). No Hub access is
needed. ``bench/bench_efficacy.py`` trains every arm of docs/efficacy.md with the same settings and functions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trl_length_plugin.embedded import reasoning

#: the demo never reaches the Hub: these are set to 1 unless the caller set them
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
ACCURACY_KEY = "rewards/correctness_reward/mean"
LENGTH_KEY = "completions/mean_length"
#: GRPO settings of the demo and of every arm of bench/bench_efficacy.py: 4 prompts x 8 completions a step
TRAINING = dict(
    per_device_train_batch_size=32,
    num_generations=8,
    max_completion_length=48,
    temperature=1.0,
    learning_rate=1e-4,
    lr_scheduler_type="constant",
)
STEPS = 60
#: the held-out problems: the distinct questions of this draw, removed from every training set
HELD_OUT_DRAW, HELD_OUT_SEED = 64, 10_000
#: completions sampled per held-out problem at the training temperature
EVAL_SAMPLES = 64
PLAIN_NAME = "plain GRPO"
#: the reasoning task's GRPO settings: ``TRAINING`` with room for its longest warm-start targets (57 tokens,
#: docs/embedded.md) and batches in the dataset's order, so every step holds one problem of each level
REASONING_TRAINING = {**TRAINING, "max_completion_length": 64, "shuffle_dataset": False}
#: the reasoning task's training problems per seed: 128 steps of 4 prompts (a longer run starts them again)
REASONING_TRAINING_SIZE = 512


@dataclass(frozen=True)
class Task:
    """A task to train on: the warm model of ``name`` (``embedded_model_dir(task=name)``, or the packaged
    ``real_model``), its GRPO ``training`` settings, its ``held_out`` problems (``eval_samples`` completions
    each) and its ``training_set(seed)``. The embedded tasks score with ``correctness_reward``
    (docs/embedded.md), another task with its ``reward``. ``warm_seed``: the one warm model every seed's run starts
    from (its seed), or None for a warm model per seed. The task's best trade-off of docs/efficacy.md
    (``best_name``, ``best_keys``: bench/bench_efficacy.py names and keys it the same way), its best peer arm
    and the grid summary committed beside the doc, from which the demo prints their rows."""

    name: str
    training: dict
    held_out: Callable[[], object]
    training_set: Callable[[int], object]
    best_name: str
    best_keys: dict
    best_peer: str
    grid_summary: str
    warm_seed: int | None = None
    real_model: str = ""
    reward: Callable | None = None
    eval_samples: int = EVAL_SAMPLES

    @property
    def max_length(self) -> int:
        return self.training["max_completion_length"]

    @property
    def correctness(self) -> Callable:
        """The task's correctness reward (TRL's reward-function signature)."""
        from trl_length_plugin.embedded import correctness_reward

        return self.reward or correctness_reward

    @property
    def accuracy_key(self) -> str:
        """The logged mean of the correctness reward (``ACCURACY_KEY`` on the embedded tasks)."""
        return f"rewards/{self.correctness.__name__}/mean"

    def model_dir(self, seed: int) -> Path:
        from trl_length_plugin.embedded import embedded_model_dir, real_model_dir

        if self.real_model:
            return real_model_dir(self.real_model)
        warm_seed = seed if self.warm_seed is None else self.warm_seed
        return embedded_model_dir(warm_start=True, seed=warm_seed, task=self.name)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=list(TASKS), default=DEFAULT_TASK.name, help="the embedded task")
    parser.add_argument("--steps", type=int, default=STEPS, help="GRPO optimizer steps")
    parser.add_argument(
        "--output-dir",
        default="",
        help="where the PNG and logs go (default outputs/demo, or outputs/demo-TASK)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    default_dir = "outputs/demo" if args.task == DEFAULT_TASK.name else f"outputs/demo-{args.task}"
    args.output_dir = args.output_dir or default_dir
    return args


def question(row: dict) -> str:
    return row["prompt"][0]["content"]


def distinct_problems(dataset):
    """The first row of each distinct question of ``dataset``."""
    first: dict[str, int] = {}
    for i, row in enumerate(dataset):
        first.setdefault(question(row), i)
    return dataset.select(list(first.values()))


def held_out_dataset():
    """One row per held-out problem, the same for every seed and arm."""
    from trl_length_plugin.embedded import make_task_dataset

    return distinct_problems(make_task_dataset(HELD_OUT_DRAW, seed=HELD_OUT_SEED))


def training_dataset(seed: int, size: int = 2048):
    """The task's problems drawn with ``seed``, held-out problems removed."""
    from trl_length_plugin.embedded import make_task_dataset

    held_out = {prompt[0]["content"] for prompt in held_out_dataset()["prompt"]}
    return make_task_dataset(size, seed=seed).filter(lambda row: question(row) not in held_out)


def reasoning_training_dataset(seed: int):
    """The reasoning task's training problems of ``seed``, in level blocks (docs/embedded.md)."""
    return reasoning.training_dataset(seed, size=REASONING_TRAINING_SIZE)


#: the best trade-off of ours on the embedded grids (docs/efficacy.md): group-relative 1.0
GROUP_RELATIVE = dict(length_penalty={"default": {"group_total_length_penalty_coeff": 1.0}})
ARITHMETIC = Task(
    "arithmetic",
    TRAINING,
    held_out_dataset,
    training_dataset,
    best_name="group-relative 1.0",
    best_keys=GROUP_RELATIVE,
    best_peer="per-token penalty 0.01",
    grid_summary="efficacy_peers_runs.json",
)
#: the reasoning task's warm model costs about 9 min of CPU to build, so every seed starts from seed 0's; a
#: seed still draws its own training problems and samples (docs/efficacy.md, "Setup")
REASONING = Task(
    "reasoning",
    REASONING_TRAINING,
    reasoning.held_out_dataset,
    reasoning_training_dataset,
    best_name="group-relative 1.0",
    best_keys=GROUP_RELATIVE,
    best_peer="Kimi k1.5 length reward 1.0",
    grid_summary="efficacy_reasoning10_runs.json",
    warm_seed=0,
)
#: the task ``make demo`` and the comparison of docs/efficacy.md use
DEFAULT_TASK = REASONING
TASKS = {task.name: task for task in (ARITHMETIC, REASONING)}


def sampling_config(
    tokenizer, samples: int = 1, max_new_tokens: int | None = None, temperature: float | None = None
):
    """The sampling settings of training (TRL's defaults at ``TRAINING``'s temperature and length, or
    ``temperature`` and ``max_new_tokens``), ``samples`` completions per prompt."""
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=max_new_tokens or TRAINING["max_completion_length"],
        do_sample=True,
        temperature=temperature or TRAINING["temperature"],
        top_p=1.0,
        top_k=0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        num_return_sequences=samples,
    )


def sample(
    model,
    tokenizer,
    dataset,
    samples: int,
    seed: int,
    max_new_tokens: int | None = None,
    task: Task | None = None,
) -> list[dict]:
    """``samples`` completions per row of ``dataset`` with the training sampling settings (of ``task``, default
    ``TRAINING``'s), reproducible by ``seed``: one dict per completion with its row index, text, token count
    (up to and including EOS, as TRL counts ``completions/mean_length``) and correctness (the task's reward)."""
    import torch

    from trl_length_plugin.embedded import correctness_reward

    torch.manual_seed(seed)
    if tokenizer.pad_token is None:  # a model folder of one's own may have none (TRL sets it the same way)
        tokenizer.pad_token = tokenizer.eos_token
    side, tokenizer.padding_side = tokenizer.padding_side, "left"  # prompts end where generation starts
    temperature = task.training["temperature"] if task else None
    config = sampling_config(tokenizer, samples, max_new_tokens, temperature)
    reward = task.correctness if task else correctness_reward
    model.eval()
    results = []
    answers = dataset["answer"]
    step = max(1, 512 // samples)  # about 512 sequences a batch
    for start in range(0, len(dataset), step):
        rows = dataset.select(range(start, min(start + step, len(dataset))))
        prompts = [
            tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            for prompt in rows["prompt"]
        ]
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            output = model.generate(**encoded, generation_config=config)
        for k, ids in enumerate(output[:, encoded["input_ids"].shape[1] :].tolist()):
            length = ids.index(config.eos_token_id) + 1 if config.eos_token_id in ids else len(ids)
            text = tokenizer.decode(ids[:length], skip_special_tokens=True)
            row = start + k // samples
            (correct,) = reward([text], [answers[row]])
            results.append(dict(row=row, text=text, tokens=length, correct=correct))
    tokenizer.padding_side = side
    return results


def held_out_figures(completions: list[dict], dataset) -> dict:
    """The mean ``length`` and ``accuracy`` of ``sample``'s completions of ``dataset``; where its rows have a
    ``level`` (the reasoning task), also ``levels``: per level, its samples, mean length and accuracy,
    the fraction that skips necessary steps and the mean redundant clauses (``step_report``)."""
    figures = dict(
        length=statistics.fmean(c["tokens"] for c in completions),
        accuracy=statistics.fmean(c["correct"] for c in completions),
    )
    if "level" in dataset.column_names:
        figures["levels"] = level_figures(completions, dataset)
    return figures


def level_figures(completions: list[dict], dataset) -> list[dict]:
    problems = dataset.select_columns(["prompt", "level"]).to_list()
    by_level: dict[int, list] = {}
    for c in completions:
        problem = problems[c["row"]]
        report = reasoning.step_report(c["text"], question(problem))
        by_level.setdefault(problem["level"], []).append((c, report))
    return [
        dict(
            level=level,
            samples=len(rows),
            length=statistics.fmean(c["tokens"] for c, _ in rows),
            accuracy=statistics.fmean(c["correct"] for c, _ in rows),
            skipped=statistics.fmean(report.skipped for _, report in rows),
            redundant=statistics.fmean(report.redundant for _, report in rows),
        )
        for level, rows in sorted(by_level.items())
    ]


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


def train_and_evaluate(
    keys: dict,
    seed: int,
    steps: int,
    output_dir: str | Path,
    train_dataset=None,
    callbacks=(),
    extra_rewards=(),
    reward_weights=None,
    task: Task = ARITHMETIC,
    held_out=None,
) -> dict:
    """Train one arm (``keys``: its LengthPluginGRPOConfig keys, over ``task.training``; ``extra_rewards``:
    reward functions besides the correctness reward, ``reward_weights`` all their weights) on ``task``, then sample the held-out problems (``held_out``: their rows, default the task's). Returns the log
    history and the held-out ``eval`` figures (``held_out_figures``)."""
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
    )
    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    trainer.train()
    held_out = task.held_out() if held_out is None else held_out
    completions = sample(
        trainer.model, tokenizer, held_out, task.eval_samples, HELD_OUT_SEED, task.max_length, task
    )
    return dict(history=trainer.state.log_history, eval=held_out_figures(completions, held_out))


def tail_mean(history: list[dict], key: str, last: int = 10) -> float:
    values = [row[key] for row in history if key in row][-last:]
    return sum(values) / len(values)


def grid_rows(task: Task, seed: int, steps: int) -> dict[str, dict]:
    """The stored grid runs (docs/efficacy.md's committed summary of ``task``) of plain GRPO, the task's best
    arm and best peer arm at ``seed`` and ``steps`` with the task's training settings and warm model: arm name
    -> record with ``train`` and ``eval``; empty where the summary lacks them."""
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
    }
    return {name: found[name] for name in wanted if name in found}


def print_row(label: str, train: dict | None, held_out: dict) -> None:
    train_cells = f"{train['length']:>9.2f} {train['accuracy']:>9.3f}" if train else f"{'':>9} {'':>9}"
    print(f"[demo] {label:<58} {train_cells} {held_out['length']:>9.2f} {held_out['accuracy']:>9.3f}")
    for level in held_out.get("levels", []):
        print(
            f"[demo] {'  level ' + str(level['level']) + ' (' + str(level['samples']) + ' samples)':<58} "
            f"{'':>9} {'':>9} {level['length']:>9.2f} {level['accuracy']:>9.3f}   skipping "
            f"{100 * level['skipped']:.1f}%, {level['redundant']:.2f} redundant clauses"
        )


def versus(a: dict, b: dict) -> str:
    return f"length {100 * (a['length'] / b['length'] - 1):+.1f}%, accuracy {100 * (a['accuracy'] - b['accuracy']):+.1f} points"


def main(argv: list[str] | None = None) -> Path:
    for var in OFFLINE_VARIABLES:  # set when the demo runs, not when it is imported
        os.environ.setdefault(var, "1")
    args = parse_args(argv)
    import torch

    from trl_length_plugin.trl_integration.plotting import plot_training_curves

    torch.set_num_threads(1)  # the tiny model gains nothing from more, and bench_efficacy trains with one

    task = TASKS[args.task]
    started = time.perf_counter()
    print(f"[demo] preparing the embedded {task.name} model (built once, then cached)")
    task.model_dir(args.seed)
    print(
        f"\n[demo] {task.best_name}: {args.steps} steps, 4 prompts x 8 completions per step {task.best_keys}"
    )
    run = train_and_evaluate(
        task.best_keys,
        args.seed,
        args.steps,
        Path(args.output_dir) / "best",
        callbacks=[make_table_callback(args.steps)],
        task=task,
    )
    history = run["history"]
    print(
        f"\n[demo] {'':<58} {'train len':>9} {'train acc':>9} {'eval len':>9} {'eval acc':>9}"
        f"   (train: last 10 steps; eval: {len(task.held_out())} held-out problems x {EVAL_SAMPLES})"
    )
    train = dict(length=tail_mean(history, LENGTH_KEY), accuracy=tail_mean(history, ACCURACY_KEY))
    print_row(f"this run: {task.best_name}", train, run["eval"])
    grid = grid_rows(task, args.seed, args.steps)
    for name, record in grid.items():
        role = " (best peer arm)" if name == task.best_peer else ""
        print_row(f"grid, seed {args.seed}: {name}{role}", record["train"], record["eval"])
    if PLAIN_NAME in grid:
        print(f"[demo] this run vs the grid's plain GRPO: {versus(run['eval'], grid[PLAIN_NAME]['eval'])}")
    if task.best_peer in grid:
        print(f"[demo] this run vs the best peer arm: {versus(run['eval'], grid[task.best_peer]['eval'])}")
    print(
        f"[demo] seed {args.seed}, {task.name} task; means and intervals over seeds: docs/efficacy.md"
        + ("" if grid else f" (no stored grid run of seed {args.seed} at {args.steps} steps to compare with)")
    )
    png = plot_training_curves(
        [],
        Path(args.output_dir) / "curves.png",
        title=f"embedded {task.name} task, seed {args.seed}",
        runs={task.best_name: history},
    )
    print(f"[demo] curves written to {png}  ({time.perf_counter() - started:.0f} s in all)")
    return png


if __name__ == "__main__":
    main()
