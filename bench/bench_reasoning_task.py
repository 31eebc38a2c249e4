"""The reasoning tasks' properties, measured on their warm models: necessary steps, redundancy, RL signal.

Builds (or reads from the cache) the warm-started model of ``--task`` (the reasoning task, or the overthinking
task on the same problems) and ``--seed``, samples every held-out
problem ``--samples`` times at the training temperature, and prints per difficulty level the accuracy, the
accuracy of completions that skip necessary steps vs those that write them (with counts), the redundancy
(re-checks, recaps, restatements and repeated steps: clauses, and their share of the tokens) and its effect on
accuracy, and the shortest correct length (any, and among completions that write every step, vs the shortest
possible). Then one plain GRPO run of ``--steps`` steps (4 prompts x 8 completions, every batch one problem of
each level; the reasoning task with at most ``MAX_COMPLETION`` new tokens, the overthinking task with its grid's
settings, ``tasks.OVERTHINKING``), the same figures after it, and how much of the warm model's length and redundant
tokens plain GRPO keeps. Recorded in docs/embedded.md:

    OMP_NUM_THREADS=1 python -m bench.bench_reasoning_task [--task reasoning|overthinking] [--seed 0]
        [--steps 60] [--samples 64] [--out outputs/reasoning_task, or outputs/TASK_task]
        [--training KEY=VALUE ...] [--lora RANK]  (regime settings of the GRPO run, e.g. learning_rate=3e-6)
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")

import dataclasses  # noqa: E402

from trl_length_plugin.embedded import real_task, reasoning, tasks, word_problems  # noqa: E402
from trl_length_plugin.embedded.task import span_tokens  # noqa: E402
from trl_length_plugin.tools import demo  # noqa: E402

MAX_COMPLETION = 96
#: each task as this bench trains it: the reasoning task with the demo's settings and longer completions (as
#: docs/embedded.md measured it), the overthinking tasks with their grids' settings
TASKS = {
    "reasoning": dataclasses.replace(
        tasks.REASONING, training={**tasks.REASONING.training, "max_completion_length": MAX_COMPLETION}
    ),
    "overthinking": tasks.OVERTHINKING,
    "real-overthinking": real_task.REAL_OVERTHINKING,
}


def shortest_completion(task: tasks.Task, question: str) -> str:
    """The shortest correct completion of ``question`` that writes every step, in ``task``'s form."""
    if task.report is reasoning.step_report:
        return reasoning.shortest_completion(question)
    return word_problems.concise_solution(word_problems.parse_word_problem(question))


def annotate(completions: list[dict], dataset, tokenizer, task: tasks.Task) -> list[dict]:
    """Each sampled completion with its level, step report and the shortest correct length of its problem."""
    rows = []
    for c in completions:
        question = tasks.question(dataset[c["row"]])
        text = c["text"].strip()
        report = task.report(text, question)
        shortest = len(tokenizer.encode(shortest_completion(task, question), add_special_tokens=False)) + 1
        redundant_tokens = span_tokens(text, report.spans, tokenizer)
        rows.append(
            {
                **c,
                "level": report.necessary,
                "skipped": report.skipped,
                "followed": report.followed == report.necessary,
                "redundant": report.redundant,
                "redundant_tokens": redundant_tokens,
                "shortest": shortest,
            }
        )
    return rows


def _acc(rows: list[dict]) -> float | None:
    return 100 * statistics.fmean(r["correct"] for r in rows) if rows else None


def properties(rows: list[dict]) -> list[dict]:
    """Per level (and all levels): the figures of docs/embedded.md's property table."""
    out = []
    for level in [*sorted({r["level"] for r in rows}), "all"]:
        mine = [r for r in rows if level == "all" or r["level"] == level]
        skipped = [r for r in mine if r["skipped"]]
        written = [r for r in mine if not r["skipped"]]
        followed = [r for r in written if r["followed"]]
        lean = [r for r in written if r["redundant"] == 0]
        padded = [r for r in written if r["redundant"] > 0]
        correct = [r["tokens"] for r in mine if r["correct"]]
        correct_writing = [r["tokens"] for r in written if r["correct"]]
        out.append(
            dict(
                level=level,
                n=len(mine),
                accuracy=_acc(mine),
                skip_rate=100 * len(skipped) / len(mine),
                skip_n=len(skipped),
                skip_accuracy=_acc(skipped),
                write_n=len(written),
                write_accuracy=_acc(written),
                followed_rate=100 * len(followed) / len(written) if written else None,
                followed_accuracy=_acc(followed),
                redundant_mean=statistics.fmean(r["redundant"] for r in written) if written else None,
                redundant_share=100
                * sum(r["redundant_tokens"] for r in mine)
                / sum(r["tokens"] for r in mine),
                redundant_tokens=statistics.fmean(r["redundant_tokens"] for r in mine),
                redundant_rate=100 * len(padded) / len(written) if written else None,
                lean_accuracy=_acc(lean),
                padded_accuracy=_acc(padded),
                length=statistics.fmean(r["tokens"] for r in mine),
                shortest_correct=min(correct) if correct else None,
                shortest_correct_writing=min(correct_writing) if correct_writing else None,
                correct_length=statistics.fmean(correct) if correct else None,
                shortest_possible=statistics.fmean(r["shortest"] for r in mine),
            )
        )
    return out


def _f(value, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(table: list[dict]) -> str:
    lines = [
        "| level (steps) | samples | accuracy (%) | skip steps (%) | accuracy skipping (n) | accuracy writing "
        "(n) | writing the problem's steps (%): accuracy | redundant clauses / writing completion | writing with redundancy (%) | accuracy writing: "
        "lean / redundant | mean length (tokens) | redundant tokens / completion (share %) | shortest correct: any / "
        "writing / possible | mean correct length |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in table:
        lines.append(
            f"| {t['level']} | {t['n']} | {_f(t['accuracy'])} | {_f(t['skip_rate'])} | "
            f"{_f(t['skip_accuracy'])} ({t['skip_n']}) | {_f(t['write_accuracy'])} ({t['write_n']}) | "
            f"{_f(t['followed_rate'])}: {_f(t['followed_accuracy'])} | "
            f"{_f(t['redundant_mean'], 2)} | {_f(t['redundant_rate'])} | {_f(t['lean_accuracy'])} / "
            f"{_f(t['padded_accuracy'])} | {_f(t['length'])} | {_f(t['redundant_tokens'])} "
            f"({_f(t['redundant_share'])}) | {_f(t['shortest_correct'])} / "
            f"{_f(t['shortest_correct_writing'])} / {_f(t['shortest_possible'])} | {_f(t['correct_length'])} |"
        )
    return "\n".join(lines)


def evaluate(model, tokenizer, samples: int, task: tasks.Task) -> list[dict]:
    dataset = task.held_out()
    completions = tasks.sample(model, tokenizer, dataset, samples, tasks.HELD_OUT_SEED, task.max_length, task)
    return annotate(completions, dataset, tokenizer, task)


def train_plain(seed: int, steps: int, task: tasks.Task):
    """One plain GRPO run on the training problems of ``seed`` (the full weights, or ``task.lora``'s adapter);
    returns the trained model and its history."""
    with tempfile.TemporaryDirectory() as tmp:
        trainer = demo.train_arm({}, seed, steps, tmp, callbacks=[demo.make_table_callback(steps)], task=task)
    return trainer.model, trainer.state.log_history


def training_setting(text: str) -> tuple[str, object]:
    """``--training``'s ``KEY=VALUE``: VALUE a Python literal (``3e-6``, ``32``, ``None``), a number (``nan``),
    ``true``/``false`` in any case, else the word itself."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"KEY=VALUE expected, got {text!r}")
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    for parse in (ast.literal_eval, float):
        try:
            return key, parse(value)
        except (ValueError, SyntaxError):
            continue
    return key, value


def regime(training: dict, settings: dict) -> dict:
    """``training`` with ``settings`` in place, checked before any model loads: each key a setting of
    ``LengthPluginGRPOConfig`` that the run does not set itself, each value of its declared type (numbers finite
    and >= 0), and the whole accepted by the config (batch size a multiple of the group size...), built as
    ``demo.train_arm`` builds it. ValueError names what is wrong."""
    import typing

    from trl_length_plugin.embedded import CPU_RUN_ARGS
    from trl_length_plugin.trl_integration import LengthPluginGRPOConfig

    hints = typing.get_type_hints(LengthPluginGRPOConfig)
    fields = {field.name for field in dataclasses.fields(LengthPluginGRPOConfig)}
    for key, value in settings.items():
        if key in ("output_dir", "max_steps", "seed", *CPU_RUN_ARGS):
            raise ValueError(
                f"{key} is the run's own (--steps, --seed, the CPU settings), not a regime setting"
            )
        if key not in fields:
            raise ValueError(f"{key} is not a GRPO setting")
        _check_type(key, value, hints[key])
    merged = {**training, **settings}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            LengthPluginGRPOConfig(output_dir=tmp, max_steps=1, seed=0, **merged, **CPU_RUN_ARGS)
        except (TypeError, ValueError) as error:
            raise ValueError((str(error).strip().splitlines() or [type(error).__name__])[0]) from None
    return merged


def _check_type(key: str, value: object, hint) -> None:
    """``value`` one of the types ``hint`` declares (an int where a float is; a number finite and >= 0)."""
    from trl_length_plugin.trl_integration.script import declared_types

    kinds = declared_types(hint)
    if isinstance(value, bool):
        fits = bool in kinds
    elif isinstance(value, int | float):
        fits = float in kinds or (int in kinds and isinstance(value, int))
    else:
        fits = any(isinstance(kind, type) and isinstance(value, kind) for kind in kinds)
    if not fits:
        names = " or ".join(
            "None" if kind is type(None) else getattr(kind, "__name__", str(kind)) for kind in kinds
        )
        raise ValueError(f"{key}: {names} expected, got {value!r}")
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and not (math.isfinite(value) and value >= 0)
    ):
        raise ValueError(f"{key}: a finite number >= 0 expected, got {value!r}")


def retention(before: dict, after: dict) -> dict:
    """How much of the warm model's mean length and redundant tokens per completion a trained model keeps (%)."""
    return {
        key: 100 * after[key] / before[key] if before[key] else float("nan")
        for key in ("length", "redundant_tokens")
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--task", choices=list(TASKS), default="reasoning", help="the task (docs/embedded.md)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the warm model's seed and the GRPO run's")
    parser.add_argument("--steps", type=int, default=tasks.STEPS, help="plain GRPO steps (0: none)")
    parser.add_argument(
        "--samples", type=int, default=None, help="completions per held-out problem (default: the task's)"
    )
    parser.add_argument("--out", default="", help="where the JSON summary goes (default outputs/TASK_task)")
    parser.add_argument(
        "--training",
        type=training_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a GRPO setting of the run instead of the task's (a regime setting, docs/embedded.md); repeatable",
    )
    parser.add_argument(
        "--lora",
        type=int,
        default=None,
        metavar="RANK",
        help="train a LoRA adapter of this rank on every linear layer, 0: the full weights (default: the task's; a "
        "regime setting)",
    )
    args = parser.parse_args(argv)
    if args.lora is not None and args.lora < 0:
        parser.error(f"--lora: a rank >= 1 expected (0: the full weights), got {args.lora}")
    task = TASKS[args.task]
    if args.lora is not None:
        task = dataclasses.replace(task, lora=args.lora)
    if args.training:
        try:
            task = dataclasses.replace(task, training=regime(task.training, dict(args.training)))
        except ValueError as error:
            parser.error(f"--training: {error}")
    import torch
    from transformers import AutoModelForCausalLM

    from trl_length_plugin.embedded import load_tokenizer

    torch.set_num_threads(1)
    args.samples = args.samples or task.eval_samples
    started = time.perf_counter()
    model_dir = task.model_dir(args.seed)
    build_s = time.perf_counter() - started
    tokenizer = load_tokenizer(model_dir)
    started = time.perf_counter()
    warm = properties(
        evaluate(AutoModelForCausalLM.from_pretrained(model_dir), tokenizer, args.samples, task)
    )
    eval_s = time.perf_counter() - started
    print(
        f"# warm model {model_dir.name} (ready in {build_s:.0f} s); held out, {args.samples} samples a "
        f"problem at temperature {task.training['temperature']} ({eval_s:.0f} s)"
    )
    print(markdown(warm))
    result = dict(
        seed=args.seed,
        samples=args.samples,
        model=model_dir.name,
        training=task.training,
        lora=task.lora,
        warm=warm,
        build_s=build_s,
    )
    if args.steps:
        started = time.perf_counter()
        model, history = train_plain(args.seed, args.steps, task)
        train_s = time.perf_counter() - started
        trained = properties(evaluate(model, tokenizer, args.samples, task))
        before, after = warm[-1], trained[-1]
        prompts = task.training["per_device_train_batch_size"] // task.training["num_generations"]
        print(
            f"\n# after plain GRPO, {args.steps} steps of {prompts} prompts x {task.training['num_generations']} "
            f"completions ({train_s:.0f} s)"
        )
        print(markdown(trained))
        print(
            f"\n# plain GRPO, held out: accuracy {before['accuracy']:.1f}% -> {after['accuracy']:.1f}% "
            f"({after['accuracy'] - before['accuracy']:+.1f} points), length {before['length']:.1f} -> "
            f"{after['length']:.1f} tokens, skip rate {before['skip_rate']:.1f}% -> {after['skip_rate']:.1f}%; "
            "by level: "
            + ", ".join(
                f"{b['level']}: {a['accuracy'] - b['accuracy']:+.1f}"
                for b, a in zip(warm[:-1], trained[:-1], strict=True)
            )
        )
        kept = retention(before, after)
        print(
            f"# plain GRPO keeps {kept['length']:.1f}% of the warm model's mean length and "
            f"{kept['redundant_tokens']:.1f}% of its redundant tokens per completion (share "
            f"{before['redundant_share']:.1f}% -> {after['redundant_share']:.1f}%)"
        )
        result.update(trained=trained, train_s=train_s, history=history, steps=args.steps, retention=kept)
    out = Path(args.out or f"outputs/{args.task}_task")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"seed{args.seed}.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
