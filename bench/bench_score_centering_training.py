"""What score centering does to training under a sampler/trainer mismatch (docs/score-centering.md, "What it
does to training"; docs/reference/score-centering.md §5.1, §5.5).

GRPO on the embedded reasoning task from its warm model (``tasks.REASONING``), with a sampler whose weights
lag the trainer's by ``--lag`` optimizer steps at every step (a stale copy, as an asynchronous sampler or a
delayed weight sync has). Each step samples 4 prompts x 8 completions from the lagging sampler at temperature
1 over the full vocabulary (at most 64 new tokens), takes the sampler's top-``--k`` ids and logprobs at every
generated position (what vLLM returns), and trains on the group-normalized correctness advantages A with a
token-mean loss, one optimizer step per batch (AdamW, lr 1e-4, as the demo). The arms differ only in the loss
(docs/reference/score-centering.md §5.5: L = L_base + A * C):

- ``no correction``: the sampler's tokens as if on-policy, L = -A log p(y);
- ``tis`` (bounds [0, 3]) / ``icepop`` (bounds [0.5, 2]) alone: the base loss's sampled-token weight w(r), r = p(y) / q(y)
  (``sampled_token_weights``: TRL's ``token_truncate`` / ``token_mask`` corrections), L = -A w(r) log p(y);
- ``centering off`` / ``centering tis`` / ``centering icepop``: the same plus A * C
  (``compute_score_centering_term``, K = ``--k``), the plugin's ``score_centering_importance_sampling``
  modes with the shipped recipes' bounds.

The loop calls the shipped core (weights and C) instead of TRL's trainer: TRL takes the sampler's logprobs
from vLLM only, and the CPU vLLM route runs about 90 s a step here (recipe:score_centering_cpu, 3 min for
2 steps), too slow for 30 runs of 60 steps. Per run it records the held-out accuracy and length (the
task's held-out problems, ``--eval-samples`` each at the training temperature), the spread of the
sampled-token ratio r over training (the std of r per step, its mean and the mean fraction of tokens with
r outside [0.5, 2]), the measured mismatch (mean per-token KL(q || p) at the sampled positions) and the
trained model's KL to the warm model (mean per-token KL(trained || warm) over the held-out samples, exact
over the vocabulary). One JSON per finished run in ``--out``/runs (an interrupted run resumes); the table
gives paired per-seed differences with 95% bootstrap intervals, and a PNG the training curves.

    OMP_NUM_THREADS=1 python -m bench.bench_score_centering_training [--seeds 0,1,2,3,4] [--steps 60]
        [--lag 4] [--k 16] [--out outputs/score-centering-training]
        [--png docs/images/score_centering_training.png]
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import statistics
import time
from pathlib import Path
from typing import NamedTuple

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from bench.bench_efficacy import (  # noqa: E402
    check_block,
    paired_interval,
    replace_block,
    separates,
    slug,
    warm_weights,
)
from bench.bench_score_centering_effect import chat_prompts_of, forward_logits, rollouts  # noqa: E402
from bench.samplers import (  # noqa: E402
    PRECISIONS,
    Sampler,
    load_sampler_weights,
    make_sampler_model,
    parse_sampler,
)
from trl_length_plugin.embedded import real_task, tasks  # noqa: E402
from trl_length_plugin.figures import pyplot, save_figure  # noqa: E402
from trl_length_plugin.score_centering.estimator import (  # noqa: E402
    compute_score_centering_term,
    sampled_token_weights,
)


class Arm(NamedTuple):
    """One loss: the base loss's importance-sampling ``mode`` and bounds, with or without A * C."""

    name: str
    mode: str
    bounds: tuple[float, float] | None
    centering: bool


ARMS = (
    Arm("no correction", "off", None, False),
    Arm("tis", "tis", (0.0, 3.0), False),
    Arm("icepop", "icepop", (0.5, 2.0), False),
    Arm("centering off", "off", None, True),
    Arm("centering tis", "tis", (0.0, 3.0), True),
    Arm("centering icepop", "icepop", (0.5, 2.0), True),
)
BASELINE = ARMS[0].name
#: the pairs a claim about C compares: the same base loss with and without the correction
CENTERING_PAIRS = tuple((on.name, off.name) for on, off in zip(ARMS[3:], ARMS[:3], strict=True))
PROMPTS, GENERATIONS = 4, 8
RATIO_BAND = (0.5, 2.0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--task", choices=list(TASKS), default="reasoning", help="the embedded task or the real model's"
    )
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--steps", type=int, default=tasks.STEPS)
    parser.add_argument(
        "--sampler",
        default="fp32",
        help=f"the sampler's precision: {', '.join(PRECISIONS)} (bench/samplers.py)",
    )
    parser.add_argument("--lag", type=int, default=4, help="optimizer steps the sampler's weights lag behind")
    parser.add_argument("--k", type=int, default=16, help="the sampler's top-k head (K)")
    parser.add_argument("--learning-rate", type=float, default=None, help="default: the task's")
    parser.add_argument("--eval-samples", type=int, default=16, help="completions per held-out problem")
    parser.add_argument(
        "--eval-every", type=int, default=0, help="held-out figures every N steps too (0: at the end only)"
    )
    parser.add_argument(
        "--checkpoint-every", type=int, default=50, help="a run's resumable state every N steps (0: none)"
    )
    parser.add_argument("--arms", default="", help="comma-separated arm names (default all)")
    parser.add_argument("--out", default="outputs/score-centering-training")
    parser.add_argument("--png", default="docs/images/score_centering_training.png")
    parser.add_argument("--summary", default="", help="also write every run's record to this JSON file")
    parser.add_argument(
        "--from-summary", default="", help="regenerate the tables and the PNG from such a JSON file alone"
    )
    parser.add_argument(
        "--doc",
        default="",
        help="with --summary or --from-summary: also write the tables into this doc's block named after the "
        "summary file",
    )
    parser.add_argument(
        "--measure",
        default="",
        help="comma-separated samplers (fp32,bf16,int8,int4): their mismatch with the warm model, no training",
    )
    args = parser.parse_args(argv)
    if args.doc and args.measure:
        parser.error("--doc writes a grid's tables; --measure runs no grid")
    if args.doc:
        summary = args.from_summary or args.summary
        if not summary:
            parser.error(
                "--doc needs --summary or --from-summary: the block it writes is named after that file"
            )
        check_block(Path(args.doc), Path(summary).name)
    args.sampler_setting = parse_sampler(args.sampler, args.lag)
    if args.learning_rate is None:
        args.learning_rate = TASKS[args.task].training["learning_rate"]
    return args


#: the tasks a run trains on: the embedded reasoning task and the real chat model's (docs/efficacy.md)
TASKS = {"reasoning": tasks.REASONING, "real": real_task.REAL}


def batch_shape(task: tasks.Task) -> tuple[int, int]:
    """Prompts and completions per prompt of one step of ``task`` (its GRPO settings)."""
    generations = task.training["num_generations"]
    return task.training["per_device_train_batch_size"] // generations, generations


def arm_loss(
    trainer_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    tokens: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    arm: Arm,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token-mean loss of ``arm`` and the sampled tokens' ratio r (detached, 0 where masked).

    ``trainer_logprobs`` ``[B, T, V]`` (log-softmax, differentiable), ``sampler_logprobs`` ``[B, T, V]`` (the
    sampler's full distribution; only its top-``k`` head and the sampled token's value enter, as vLLM
    returns them), ``tokens`` ``[B, T]``, ``mask`` ``[B, T]`` bool, ``advantages`` ``[B]``."""
    sampled = trainer_logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    sampled_q = sampler_logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    ratio = torch.where(mask, sampled.detach() - sampled_q, 0.0).exp()
    weights = torch.where(mask, sampled_token_weights(ratio, arm.mode, arm.bounds), 0.0)
    a = advantages.unsqueeze(1)
    per_token = -a * weights * sampled
    if arm.centering:
        head_q, head_ids = sampler_logprobs.topk(k, dim=-1)
        term = compute_score_centering_term(
            trainer_logprobs.gather(-1, head_ids),
            sampler_topk_logprobs=head_q,
            importance_sampling_mode=arm.mode,
            is_bounds=arm.bounds,
            token_mask=mask,
            sampler_replay=False,
        )
        per_token = per_token + a * term.correction
    loss = torch.where(mask, per_token, 0.0).sum() / mask.sum().clamp(min=1)
    return loss, torch.where(mask, ratio, 0.0)


def group_advantages(rewards: torch.Tensor, generations: int = GENERATIONS) -> torch.Tensor:
    """GRPO's advantages: rewards minus their group mean over the group std (TRL's scale, epsilon 1e-4)."""
    groups = rewards.view(-1, generations)
    return ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).view(-1)


def token_kl(log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """KL(a || b) per position from two logprob tensors ``[..., V]``."""
    return (log_a.exp() * (log_a - log_b)).sum(-1)


def step_logprobs(model, sequences, mask, width: int, temperature: float) -> torch.Tensor:
    """Float32 logprobs ``[B, T, V]`` at the generated positions, at the sampling temperature."""
    logits = forward_logits(model, sequences, mask)[:, width - 1 : -1].float()
    return (logits / temperature).log_softmax(-1)


def mismatch(sampler_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor, tokens, mask) -> dict:
    """The sampler/trainer mismatch at the sampled tokens: KL(q || p) per token, the std of r = p(y)/q(y), the
    share of r outside ``RATIO_BAND`` and the logprob gap, the mean |log p(y) - log q(y)|."""
    log_r = (trainer_logprobs - sampler_logprobs).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)[mask]
    ratio = log_r.exp()
    return dict(
        sampler_kl=token_kl(sampler_logprobs, trainer_logprobs)[mask].mean().item(),
        ratio_std=ratio.std().item(),
        ratio_outside=((ratio < RATIO_BAND[0]) | (ratio > RATIO_BAND[1])).float().mean().item(),
        gap=log_r.abs().mean().item(),
    )


class Batch(NamedTuple):
    """One step's rollouts: sequences, prompt width, attention mask, completion tokens and mask, rewards."""

    sequences: torch.Tensor
    width: int
    full_mask: torch.Tensor
    tokens: torch.Tensor
    mask: torch.Tensor
    rewards: torch.Tensor


def sample_batch(sampler, tokenizer, task: tasks.Task, rows) -> Batch:
    """``batch_shape(task)`` completions of ``rows`` from ``sampler`` at the task's temperature, scored."""
    _, generations = batch_shape(task)
    prompts = [p for p in chat_prompts_of(tokenizer, rows) for _ in range(generations)]
    answers = [a for a in rows["answer"] for _ in range(generations)]
    sequences, width, full_mask = rollouts(
        sampler, tokenizer, prompts, task.max_length, temperature=task.training["temperature"]
    )
    texts = tokenizer.batch_decode(sequences[:, width:], skip_special_tokens=True)
    rewards = torch.tensor(task.correctness(texts, answers), dtype=torch.float32)
    return Batch(sequences, width, full_mask, sequences[:, width:], full_mask[:, width:], rewards)


def held_out(model, warm, tokenizer, task: tasks.Task, samples: int) -> dict:
    """The held-out figures of ``model`` (``samples`` completions a problem at the training temperature) and its
    KL to the ``warm`` model (None when ``warm`` is None)."""
    problems = task.held_out()
    completions = tasks.sample(
        model, tokenizer, problems, samples, tasks.HELD_OUT_SEED, task.max_length, task
    )
    figures = {
        key: value for key, value in tasks.held_out_figures(completions, problems).items() if key != "levels"
    }
    if warm is not None:
        figures["kl_to_warm"] = kl_to_warm(model, warm, tokenizer, completions, problems, task)
    return figures


def checkpoint_path(out: Path, arm: Arm, seed: int) -> Path:
    return out / "checkpoints" / f"{slug(arm.name)}-seed{seed}.pt"


def train_run(arm: Arm, seed: int, args: argparse.Namespace) -> dict:
    """One run: ``args.steps`` GRPO steps of ``arm`` with the sampler ``args.sampler_setting``, the held-out
    figures every ``args.eval_every`` steps and at the end; the record stored as JSON. Every
    ``args.checkpoint_every`` steps the run's state is saved, and a run with a saved state resumes from it."""
    import transformers

    from trl_length_plugin.embedded import load_tokenizer

    started = time.perf_counter()
    task, setting = TASKS[args.task], args.sampler_setting
    model_dir = task.model_dir(seed)
    tokenizer = load_tokenizer(model_dir)
    warm = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    trainer = copy.deepcopy(warm)
    sampler = make_sampler_model(warm, setting)
    optimizer = torch.optim.AdamW(trainer.parameters(), lr=args.learning_rate, weight_decay=0.0)
    states = collections.deque(maxlen=setting.lag + 1)  # the trainer's weights of the last lag + 1 steps
    data = task.training_set(seed)
    prompts, _ = batch_shape(task)
    temperature = task.training["temperature"]
    torch.manual_seed(seed)
    curve, evals, first, before = [], [], 0, 0.0
    saved = checkpoint_path(Path(args.out), arm, seed)
    if saved.exists():
        state = torch.load(saved, weights_only=False)
        if state["settings"] == settings(arm, args):
            trainer.load_state_dict(state["trainer"])
            optimizer.load_state_dict(state["optimizer"])
            states.extend(state["states"])
            curve, evals, first, before = state["curve"], state["evals"], state["step"], state["seconds"]
            torch.set_rng_state(state["rng"])
    for step in tqdm(range(first, args.steps), desc=f"{arm.name}, seed {seed}", unit="step", leave=False):
        states.append(copy.deepcopy(trainer.state_dict()))
        load_sampler_weights(
            sampler, states[0], setting
        )  # the weights of `lag` steps ago (the warm ones at first)
        start = step * prompts % len(data)
        batch = sample_batch(sampler, tokenizer, task, data.select(range(start, start + prompts)))
        with torch.no_grad():
            sampler_logprobs = step_logprobs(
                sampler, batch.sequences, batch.full_mask, batch.width, temperature
            )
        trainer.train()
        logprobs = step_logprobs(trainer, batch.sequences, batch.full_mask, batch.width, temperature)
        advantages = group_advantages(batch.rewards, batch_shape(task)[1])
        loss, _ = arm_loss(logprobs, sampler_logprobs, batch.tokens, batch.mask, advantages, arm, args.k)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        trainer.eval()
        curve.append(
            dict(
                step=step + 1,
                accuracy=batch.rewards.mean().item(),
                length=batch.mask.sum(1).float().mean().item(),
                **mismatch(sampler_logprobs, logprobs.detach(), batch.tokens, batch.mask),
            )
        )
        del sampler_logprobs, logprobs, loss
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            evals.append(dict(step=step + 1, **held_out(trainer, warm, tokenizer, task, args.eval_samples)))
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and step + 1 < args.steps:
            saved.parent.mkdir(parents=True, exist_ok=True)
            state = dict(
                settings=settings(arm, args),
                trainer=trainer.state_dict(),
                optimizer=optimizer.state_dict(),
                states=list(states),
                curve=curve,
                evals=evals,
                step=step + 1,
                rng=torch.get_rng_state(),
                seconds=before + time.perf_counter() - started,
            )
            torch.save(state, saved.with_suffix(".tmp"))
            saved.with_suffix(".tmp").replace(saved)
    final = held_out(trainer, warm, tokenizer, task, args.eval_samples)
    evals.append(dict(step=args.steps, **final))
    saved.unlink(missing_ok=True)
    return dict(
        arm=arm.name,
        seed=seed,
        settings=settings(arm, args),
        eval=final,
        evals=evals,
        train={key: statistics.fmean(row[key] for row in curve) for key in TRAIN_FIGURES},
        curve=curve,
        seconds=before + time.perf_counter() - started,
    )


TRAIN_FIGURES = ("ratio_std", "ratio_outside", "sampler_kl", "gap")


def kl_to_warm(
    trained, warm, tokenizer, completions: list[dict], held_out, task: tasks.Task = tasks.REASONING
) -> float:
    """Mean per-token KL(trained || warm) at the positions of the trained model's held-out completions, at the
    task's temperature, in chunks of about 2**24 logits."""
    total, count = 0.0, 0
    prompts = chat_prompts_of(tokenizer, held_out)
    temperature = task.training["temperature"]
    sequences = [
        prompts[c["row"]] + tokenizer.encode(c["text"], add_special_tokens=False) for c in completions
    ]
    rows = max(1, 2**24 // (max(map(len, sequences)) * trained.config.vocab_size))
    for start in range(0, len(completions), rows):
        batch, chunk = completions[start : start + rows], sequences[start : start + rows]
        width = max(len(s) for s in chunk)
        ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        mask = torch.zeros_like(ids, dtype=torch.bool)
        scored = torch.zeros_like(mask)
        for row, (sequence, c) in enumerate(zip(chunk, batch, strict=True)):
            ids[row, width - len(sequence) :] = torch.tensor(sequence)
            mask[row, width - len(sequence) :] = True
            scored[row, width - len(sequence) + len(prompts[c["row"]]) - 1 : width - 1] = True
        with torch.no_grad():
            kl = token_kl(
                (forward_logits(trained, ids, mask).float() / temperature).log_softmax(-1),
                (forward_logits(warm, ids, mask).float() / temperature).log_softmax(-1),
            )
        total += kl[scored].sum().item()
        count += int(scored.sum())
    return total / max(count, 1)


def settings(arm: Arm, args: argparse.Namespace) -> dict:
    """Everything a run's result depends on (its loss, K where C is on, the sampler, the sampling and training
    constants); a stored run with other settings is redone."""
    task = TASKS[args.task]
    prompts, generations = batch_shape(task)
    return dict(
        task=task.name,
        mode=arm.mode,
        bounds=list(arm.bounds) if arm.bounds else None,
        centering=arm.centering,
        k=args.k if arm.centering else None,
        steps=args.steps,
        sampler=args.sampler_setting.precision,
        lag=args.lag,
        learning_rate=args.learning_rate,
        eval_samples=args.eval_samples,
        eval_every=args.eval_every,
        prompts=prompts,
        generations=generations,
        temperature=task.training["temperature"],
        ratio_band=list(RATIO_BAND),
        max_length=task.max_length,
        warm_seed=task.warm_seed,
    )


def warm_reference(args: argparse.Namespace) -> dict:
    """The warm model's held-out figures at the runs' evaluation settings (the same for every seed: one warm
    model, a fixed sampling seed), computed once and kept in ``--out``/warm.json."""
    import transformers

    from trl_length_plugin.embedded import load_tokenizer

    task = TASKS[args.task]
    path = Path(args.out) / "warm.json"
    wanted = dict(task=task.name, eval_samples=args.eval_samples, temperature=task.training["temperature"])
    stored = json.loads(path.read_text()) if path.exists() else None
    if stored is None or stored["settings"] != wanted:
        model_dir = task.model_dir(task.warm_seed or 0)
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        stored = dict(
            settings=wanted,
            model=model_dir.name,
            weights=warm_weights(task, task.warm_seed or 0),
            eval=held_out(model, None, load_tokenizer(model_dir), task, args.eval_samples),
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stored))
    return stored


def run_all(arms: list[Arm], seeds: list[int], args: argparse.Namespace) -> list[dict]:
    """Every (arm, seed) run, seed by seed; a stored run with these settings is read, not redone."""
    runs = Path(args.out) / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    records = []
    todo = [(arm, seed) for seed in seeds for arm in arms]
    for arm, seed in tqdm(todo, desc="runs", unit="run"):
        path = runs / f"{slug(arm.name)}-seed{seed}.json"
        stored = json.loads(path.read_text()) if path.exists() else None
        if stored is None or stored["settings"] != settings(arm, args):
            stored = train_run(arm, seed, args)
            path.write_text(json.dumps(stored))
        records.append(stored)
    return records


def collapse_step(record: dict, warm_accuracy: float) -> int | None:
    """The first evaluated step whose held-out accuracy is below the warm model's, or None."""
    return next((e["step"] for e in record.get("evals", []) if e["accuracy"] < warm_accuracy), None)


def accuracy_area(record: dict) -> float:
    """The mean held-out accuracy (points) over a run's evaluated steps: how well it did along the way."""
    return 100 * statistics.fmean(e["accuracy"] for e in record["evals"])


FIGURES = (  # (key in the record, label, scale)
    (("eval", "accuracy"), "held-out accuracy (points)", 100.0),
    (("eval", "length"), "held-out length (tokens)", 1.0),
    (("eval", "kl_to_warm"), "KL to the warm model (x1e-3)", 1e3),
    (("train", "ratio_std"), "std of r per step", 1.0),
    (("train", "ratio_outside"), "r outside [0.5, 2] (%)", 100.0),
    (("train", "sampler_kl"), "KL(q ‖ p) per token (x1e-3)", 1e3),
)


def figure(record: dict, key: tuple[str, str], scale: float) -> float:
    return scale * record[key[0]][key[1]]


def tables(records: list[dict], arms: list[Arm]) -> str:
    """Means over seeds (spread), then paired differences with 95% bootstrap intervals: each arm vs no
    correction, and each centered arm vs its base loss alone."""
    by_run = {(r["arm"], r["seed"]): r for r in records}
    names = [arm.name for arm in arms]
    lines = ["| arm | seeds | " + " | ".join(label for _, label, _ in FIGURES) + " |"]
    lines.append("|---|---|" + "---|" * len(FIGURES))
    for name in names:
        mine = [r for (arm, _), r in by_run.items() if arm == name]
        cells = [
            f"{statistics.fmean(figure(r, key, s) for r in mine):.2f} ({statistics.stdev(figure(r, key, s) for r in mine) if len(mine) > 1 else 0.0:.2f})"
            for key, _, s in FIGURES
        ]
        lines.append(f"| {name} | {len(mine)} | " + " | ".join(cells) + " |")
    pairs = [(name, BASELINE) for name in names if name != BASELINE]
    pairs += [pair for pair in CENTERING_PAIRS if set(pair) <= set(names) and pair not in pairs]
    lines += [
        "",
        "| difference (per seed, paired) | seeds | accuracy (points) | length (tokens) | KL to warm (x1e-3) | separates |",
        "|---|---|---|---|---|---|",
    ]
    for a, b in pairs:
        seeds = sorted(seed for arm, seed in by_run if arm == a and (b, seed) in by_run)
        if not seeds:
            continue
        cells, apart = [], []
        for key, _, scale in FIGURES[:3]:
            interval = paired_interval(
                [figure(by_run[a, s], key, scale) - figure(by_run[b, s], key, scale) for s in seeds]
            )
            cells.append(f"{interval[0]:+.2f} [{interval[1]:+.2f}, {interval[2]:+.2f}]")
            apart.append(separates(interval))
        verdict = (
            ", ".join(
                label.split(" (")[0] for (_, label, _), sep in zip(FIGURES[:3], apart, strict=True) if sep
            )
            or "none"
        )
        lines.append(f"| {a} − {b} | {len(seeds)} | " + " | ".join(cells) + f" | {verdict} |")
    return "\n".join(lines)


def trajectory_table(records: list[dict], arms: list[Arm], warm: dict) -> str:
    """Per arm, how the held-out accuracy went along the run: its mean over the evaluated steps, the seeds
    whose accuracy fell below the warm model's (collapse) and the first such step; then the mean over evaluated
    steps paired per seed against no correction and against the arm's base loss, with 95% intervals."""
    by_run = {(r["arm"], r["seed"]): r for r in records}
    warm_accuracy = warm["eval"]["accuracy"]
    lines = [
        f"| arm | seeds | held-out accuracy over the evaluated steps (points) | runs below the warm model's "
        f"{100 * warm_accuracy:.1f}% | first step below (per run) | logprob gap per token (mean) |",
        "|---|---|---|---|---|---|",
    ]
    for arm in arms:
        mine = [r for (name, _), r in sorted(by_run.items()) if name == arm.name]
        if not mine:
            continue
        collapses = [collapse_step(r, warm_accuracy) for r in mine]
        below = [str(step) for step in collapses if step is not None]
        lines.append(
            f"| {arm.name} | {len(mine)} | {statistics.fmean(map(accuracy_area, mine)):.1f} | "
            f"{len(below)} of {len(mine)} | {', '.join(below) or '-'} | "
            f"{statistics.fmean(r['train']['gap'] for r in mine):.4f} |"
        )
    names = [arm.name for arm in arms]
    pairs = [(name, BASELINE) for name in names if name != BASELINE]
    pairs += [pair for pair in CENTERING_PAIRS if set(pair) <= set(names) and pair not in pairs]
    lines += [
        "",
        "| difference (per seed, paired) | seeds | accuracy over the evaluated steps (points) | separates |",
    ]
    lines.append("|---|---|---|---|")
    for a, b in pairs:
        seeds = sorted(seed for arm, seed in by_run if arm == a and (b, seed) in by_run)
        if seeds:
            interval = paired_interval(
                [accuracy_area(by_run[a, s]) - accuracy_area(by_run[b, s]) for s in seeds]
            )
            lines.append(
                f"| {a} − {b} | {len(seeds)} | {interval[0]:+.2f} [{interval[1]:+.2f}, {interval[2]:+.2f}] | "
                f"{'yes' if separates(interval) else 'no'} |"
            )
    return "\n".join(lines)


def plot(records: list[dict], arms: list[Arm], path: Path, title: str = "", warm: dict | None = None) -> Path:
    """Per arm, mean over seeds: held-out accuracy at the evaluated steps (with the warm model's as a line),
    training accuracy and the logprob gap per step (5-step means)."""
    plt = pyplot()

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    for arm in arms:
        mine = [r for r in records if r["arm"] == arm.name]
        if not mine:
            continue
        style = "-" if arm.centering else "--"
        evals = [r.get("evals", []) for r in mine]
        if all(evals):
            steps = [e["step"] for e in evals[0]]
            axes[0].plot(
                steps,
                [100 * statistics.fmean(e[i]["accuracy"] for e in evals) for i in range(len(steps))],
                style,
            )
        curves = [r["curve"] for r in mine]
        steps = [row["step"] for row in curves[0]]
        for ax, key, scale in ((axes[1], "accuracy", 100.0), (axes[2], "gap", 1.0)):
            if all(key in c[0] for c in curves):
                values = [scale * statistics.fmean(c[i][key] for c in curves) for i in range(len(steps))]
                ax.plot(steps, smooth(values), style, label=arm.name)
    if warm is not None:
        axes[0].axhline(100 * warm["eval"]["accuracy"], color="k", lw=0.8, ls=":", label="warm model")
        axes[0].legend(fontsize=8)
    for ax, name in zip(
        axes,
        (
            "held-out accuracy (%)",
            "training accuracy (%, 5-step mean)",
            "logprob gap |log p(y) - log q(y)| per token",
        ),
        strict=True,
    ):
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(title or "score centering under a sampler/trainer mismatch (mean over seeds)")
    return save_figure(fig, path, dpi=110)


def smooth(values: list[float], window: int = 5) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def measure(samplers: list[Sampler], args: argparse.Namespace, batches: int = 8) -> str:
    """The mismatch each sampler has with the warm model it serves, before any training: ``batches`` steps'
    rollouts of the first training problems (seed 0), sampled from the sampler and scored by the warm model in
    float32 at the task's temperature; a markdown table."""
    import transformers

    from trl_length_plugin.embedded import load_tokenizer

    task = TASKS[args.task]
    model_dir = task.model_dir(0)
    tokenizer = load_tokenizer(model_dir)
    warm = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    data, (prompts, _) = task.training_set(0), batch_shape(task)
    temperature = task.training["temperature"]
    lines = [
        "| sampler | tokens | KL(q ‖ p) per token | std of r | r outside [0.5, 2] (%) | logprob gap per token |",
        "|---|---|---|---|---|---|",
    ]
    for setting in samplers:
        sampler = make_sampler_model(warm, setting)
        load_sampler_weights(sampler, warm.state_dict(), setting)
        torch.manual_seed(0)
        rows, count = [], 0
        for b in range(batches):
            batch = sample_batch(sampler, tokenizer, task, data.select(range(b * prompts, (b + 1) * prompts)))
            with torch.no_grad():
                q = step_logprobs(sampler, batch.sequences, batch.full_mask, batch.width, temperature)
                p = step_logprobs(warm, batch.sequences, batch.full_mask, batch.width, temperature)
            n = int(batch.mask.sum())
            rows.append((n, mismatch(q, p, batch.tokens, batch.mask)))
            count += n
        mean = {key: sum(n * m[key] for n, m in rows) / count for key in rows[0][1]}
        lines.append(
            f"| {setting.precision} | {count} | {mean['sampler_kl']:.2e} | {mean['ratio_std']:.4f} | "
            f"{100 * mean['ratio_outside']:.3f} | {mean['gap']:.4f} |"
        )
    return "\n".join(lines)


def write_summary(records: list[dict], warm: dict, path: Path) -> Path:
    """Every run's record (curves rounded to 5 significant digits) and the warm model's figures, as one JSON."""

    def rounded(value):
        return float(f"{value:.5g}") if isinstance(value, float) else value

    runs = []
    for r in sorted(records, key=lambda r: (r["arm"], r["seed"])):
        curve = [{key: rounded(value) for key, value in row.items()} for row in r["curve"]]
        runs.append({**r, "curve": curve})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(warm=warm, runs=runs)) + "\n")
    return path


def report(records: list[dict], arms: list[Arm], warm: dict, png: Path) -> str:
    """The tables of a grid's records (printed and returned, headed by what ran) and their PNG."""
    first = records[0]["settings"]
    name = f"{first['sampler']} sampler" + (f", lag {first['lag']}" if first["lag"] else "")
    text = (
        f"{first['task']} task, warm model {warm.get('model', '')} (weights {warm.get('weights', '')}), "
        f"{name}, K = {args_k(records)}, {first['steps']} steps, seeds "
        f"{','.join(str(s) for s in sorted({r['seed'] for r in records}))}\n\n{tables(records, arms)}"
    )
    if all(r.get("evals") for r in records):
        text += "\n\n" + trajectory_table(records, arms, warm)
    print(f"\n# {text}")
    title = f"score centering, {name} ({first['task']} task, {first['steps']} steps, mean over seeds)"
    print(f"\nwrote {plot(records, arms, png, title, warm)}")
    return text


def write_doc(doc: Path, summary: Path, text: str, runs: int) -> None:
    """``text`` into ``doc``'s block named after the summary file (docs/score-centering.md)."""
    replace_block(doc, summary.name, f"_Generated from `{summary.name}` ({runs} runs)._\n\n{text}")


def args_k(records: list[dict]) -> int | None:
    return next((r["settings"]["k"] for r in records if r["settings"]["k"] is not None), None)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.from_summary:
        stored = json.loads(Path(args.from_summary).read_text())
        names = {r["arm"] for r in stored["runs"]}
        text = report(
            stored["runs"], [arm for arm in ARMS if arm.name in names], stored["warm"], Path(args.png)
        )
        if args.doc:
            write_doc(Path(args.doc), Path(args.from_summary), text, len(stored["runs"]))
        return None
    if args.measure:
        samplers = [parse_sampler(name.strip()) for name in args.measure.split(",")]
        print(f"# {args.task} task: each sampler against the warm model it serves, before training")
        return print(measure(samplers, args))
    wanted = [name.strip() for name in args.arms.split(",") if name.strip()]
    arms = [arm for arm in ARMS if not wanted or arm.name in wanted]
    seeds = [int(s) for s in args.seeds.split(",")]
    started = time.perf_counter()
    warm = warm_reference(args)
    records = run_all(arms, seeds, args)
    if args.summary:
        write_summary(records, warm, Path(args.summary))
    text = report(records, arms, warm, Path(args.png))
    if args.doc:  # parse_args refuses --doc without a summary
        write_doc(Path(args.doc), Path(args.summary), text, len(records))
    print(
        f"wall time {time.perf_counter() - started:.0f} s ({sum(r['seconds'] for r in records) / 60:.1f} min of run "
        "time)"
    )


if __name__ == "__main__":
    main()
