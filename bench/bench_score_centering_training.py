"""What score centering does to training under a sampler/trainer mismatch (docs/score-centering.md, "What it
does to training"; docs/reference/score-centering.md §5.1, §5.5).

GRPO on the embedded reasoning task from its warm model (``demo.REASONING``), with a sampler whose weights
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

from bench.bench_efficacy import paired_interval, separates, slug  # noqa: E402
from bench.bench_score_centering_effect import chat_prompts_of, forward_logits, rollouts  # noqa: E402
from trl_length_plugin.score_centering.estimator import (  # noqa: E402
    compute_score_centering_term,
    sampled_token_weights,
)
from trl_length_plugin.tools import demo  # noqa: E402


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
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--steps", type=int, default=demo.STEPS)
    parser.add_argument("--lag", type=int, default=4, help="optimizer steps the sampler's weights lag behind")
    parser.add_argument("--k", type=int, default=16, help="the sampler's top-k head (K)")
    parser.add_argument("--learning-rate", type=float, default=demo.TRAINING["learning_rate"])
    parser.add_argument("--eval-samples", type=int, default=16, help="completions per held-out problem")
    parser.add_argument("--arms", default="", help="comma-separated arm names (default all)")
    parser.add_argument("--out", default="outputs/score-centering-training")
    parser.add_argument("--png", default="docs/images/score_centering_training.png")
    return parser.parse_args(argv)


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

    ``trainer_logprobs`` ``[B, T, V]`` (log-softmax, differentiable), ``sampler_logprobs`` ``[B, T, V]`` (the lagging
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


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """GRPO's advantages: rewards minus their group mean over the group std (TRL's scale, epsilon 1e-4)."""
    groups = rewards.view(-1, GENERATIONS)
    return ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).view(-1)


def token_kl(log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """KL(a || b) per position from two logprob tensors ``[..., V]``."""
    return (log_a.exp() * (log_a - log_b)).sum(-1)


def train_run(arm: Arm, seed: int, args: argparse.Namespace) -> dict:
    """One run: ``args.steps`` GRPO steps of ``arm`` with a sampler ``args.lag`` steps behind, then the
    held-out figures; the record stored as JSON."""
    import transformers

    from trl_length_plugin.embedded import load_tokenizer, score_completion

    started = time.perf_counter()
    task = demo.REASONING
    model_dir = task.model_dir(seed)
    tokenizer = load_tokenizer(model_dir)
    warm = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    trainer, sampler = copy.deepcopy(warm), copy.deepcopy(warm)
    optimizer = torch.optim.AdamW(trainer.parameters(), lr=args.learning_rate, weight_decay=0.0)
    states = collections.deque(maxlen=args.lag + 1)  # the trainer's weights of the last lag + 1 steps
    data = task.training_set(seed)
    torch.manual_seed(seed)
    curve = []
    for step in range(args.steps):
        states.append(copy.deepcopy(trainer.state_dict()))
        sampler.load_state_dict(states[0])  # the weights of `lag` steps ago (the warm ones at first)
        start = step * PROMPTS % len(data)
        rows = data.select(range(start, start + PROMPTS))
        prompts = [p for p in chat_prompts_of(tokenizer, rows) for _ in range(GENERATIONS)]
        answers = [a for a in rows["answer"] for _ in range(GENERATIONS)]
        sequences, width, full_mask = rollouts(sampler, tokenizer, prompts, task.max_length)
        texts = tokenizer.batch_decode(sequences[:, width:], skip_special_tokens=True)
        rewards = torch.tensor([score_completion(t, a) for t, a in zip(texts, answers, strict=True)])
        tokens, mask = sequences[:, width:], full_mask[:, width:]
        with torch.no_grad():
            sampler_logprobs = forward_logits(sampler, sequences, full_mask)[:, width - 1 : -1].log_softmax(
                -1
            )
        trainer.train()
        logprobs = forward_logits(trainer, sequences, full_mask)[:, width - 1 : -1].log_softmax(-1)
        loss, ratio = arm_loss(
            logprobs, sampler_logprobs, tokens, mask, group_advantages(rewards), arm, args.k
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        trainer.eval()
        kept = ratio[mask]
        mismatch = token_kl(sampler_logprobs, logprobs.detach())[mask]
        curve.append(
            dict(
                step=step + 1,
                accuracy=rewards.mean().item(),
                length=mask.sum(1).float().mean().item(),
                ratio_std=kept.std().item(),
                ratio_outside=((kept < RATIO_BAND[0]) | (kept > RATIO_BAND[1])).float().mean().item(),
                sampler_kl=mismatch.mean().item(),
            )
        )
    held_out = task.held_out()
    completions = demo.sample(
        trainer, tokenizer, held_out, args.eval_samples, demo.HELD_OUT_SEED, task.max_length
    )
    return dict(
        arm=arm.name,
        seed=seed,
        settings=settings(arm, args),
        eval={
            **demo.held_out_figures(completions, held_out),
            "kl_to_warm": kl_to_warm(trainer, warm, tokenizer, completions, held_out),
        },
        train={
            key: statistics.fmean(row[key] for row in curve)
            for key in ("ratio_std", "ratio_outside", "sampler_kl")
        },
        curve=curve,
        seconds=time.perf_counter() - started,
    )


def kl_to_warm(trained, warm, tokenizer, completions: list[dict], held_out) -> float:
    """Mean per-token KL(trained || warm) at the positions of the trained model's held-out completions."""
    total, count = 0.0, 0
    prompts = chat_prompts_of(tokenizer, held_out)
    for start in range(0, len(completions), 256):
        batch = completions[start : start + 256]
        sequences = [prompts[c["row"]] + tokenizer.encode(c["text"], add_special_tokens=False) for c in batch]
        width = max(len(s) for s in sequences)
        ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        mask = torch.zeros_like(ids, dtype=torch.bool)
        scored = torch.zeros_like(mask)
        for row, (sequence, c) in enumerate(zip(sequences, batch, strict=True)):
            ids[row, width - len(sequence) :] = torch.tensor(sequence)
            mask[row, width - len(sequence) :] = True
            scored[row, width - len(sequence) + len(prompts[c["row"]]) - 1 : width - 1] = True
        with torch.no_grad():
            kl = token_kl(
                forward_logits(trained, ids, mask).log_softmax(-1),
                forward_logits(warm, ids, mask).log_softmax(-1),
            )
        total += kl[scored].sum().item()
        count += int(scored.sum())
    return total / max(count, 1)


def settings(arm: Arm, args: argparse.Namespace) -> dict:
    """Everything a run's result depends on (its loss, K where C is on, the sampling and training constants);
    a stored run with other settings is redone."""
    task = demo.REASONING
    return dict(
        mode=arm.mode,
        bounds=list(arm.bounds) if arm.bounds else None,
        centering=arm.centering,
        k=args.k if arm.centering else None,
        steps=args.steps,
        lag=args.lag,
        learning_rate=args.learning_rate,
        eval_samples=args.eval_samples,
        prompts=PROMPTS,
        generations=GENERATIONS,
        ratio_band=list(RATIO_BAND),
        max_length=task.max_length,
        warm_seed=task.warm_seed,
    )


def run_all(arms: list[Arm], seeds: list[int], args: argparse.Namespace) -> list[dict]:
    """Every (arm, seed) run, seed by seed; a stored run with these settings is read, not redone."""
    from tqdm.auto import tqdm

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


FIGURES = (  # (key in the record, label, scale)
    (("eval", "accuracy"), "held-out accuracy (points)", 100.0),
    (("eval", "length"), "held-out length (tokens)", 1.0),
    (("eval", "kl_to_warm"), "KL to the warm model (x1e-3)", 1e3),
    (("train", "ratio_std"), "std of r per step", 1.0),
    (("train", "ratio_outside"), "r outside [0.5, 2] (%)", 100.0),
    (("train", "sampler_kl"), "KL(q || p) per token (x1e-3)", 1e3),
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


def plot(records: list[dict], arms: list[Arm], path: Path) -> Path:
    """Training accuracy and the std of r per step, mean over seeds, one line per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for arm in arms:
        curves = [r["curve"] for r in records if r["arm"] == arm.name]
        if not curves:
            continue
        steps = [row["step"] for row in curves[0]]
        style = "-" if arm.centering else "--"
        for ax, key in zip(axes, ("accuracy", "ratio_std", "sampler_kl"), strict=True):
            values = [statistics.fmean(c[i][key] for c in curves) for i in range(len(steps))]
            ax.plot(steps, smooth(values), style, label=arm.name)
    for ax, title in zip(
        axes, ("training accuracy (5-step mean)", "std of r = p(y)/q(y)", "KL(q || p) per token"), strict=True
    ):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("score centering under a lagging sampler (embedded reasoning task, mean over seeds)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def smooth(values: list[float], window: int = 5) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    wanted = [name.strip() for name in args.arms.split(",") if name.strip()]
    arms = [arm for arm in ARMS if not wanted or arm.name in wanted]
    seeds = [int(s) for s in args.seeds.split(",")]
    started = time.perf_counter()
    records = run_all(arms, seeds, args)
    print(f"\n# lag {args.lag} steps, K = {args.k}, {args.steps} steps, seeds {args.seeds}")
    print(tables(records, arms))
    print(
        f"\nwrote {plot(records, arms, Path(args.png))}; wall time {time.perf_counter() - started:.0f} s "
        f"({sum(r['seconds'] for r in records) / 60:.1f} min of run time)"
    )


if __name__ == "__main__":
    main()
