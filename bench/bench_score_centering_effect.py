"""What score centering does to the gradient, exactly (docs/score-centering.md, "What the correction does to
the gradient"; docs/reference/score-centering.md §5.1).

On the warm-started embedded model, at the generated positions of real rollouts, under two measured
sampler/trainer mismatches:

- ``lag``: the sampler holds the trainer's weights ``--lag-steps`` optimizer steps earlier (on-policy GRPO
  steps of the embedded task: AdamW at ``--learning-rate``, group-normalized correctness advantages);
- ``bf16``: the sampler runs the trainer's weights in bfloat16, the trainer in float32;

and three sampling settings (temperature 1, full vocabulary; top-k 16 with sampler replay; top-p 0.9 with
top_k = K and replay), it enumerates the vocabulary at every position (bench/score_centering_effect.py) for
each mode and K: the bias of the sampled-token term's expected logit gradient with and without the
correction (target 0 for a token-independent advantage), relative bias, variance and head mass. Prints a
markdown table and writes a PNG.

    OMP_NUM_THREADS=1 python -m bench.bench_score_centering_effect [--prompts 32] [--lag-steps 4]
        [--out docs/images/score_centering_effect.png]
"""

from __future__ import annotations

import argparse
import copy
import csv
import math
import os
import random
import time
from pathlib import Path
from typing import NamedTuple

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402

from bench.score_centering_effect import (  # noqa: E402
    EffectSummary,
    ModeSpec,
    mean_kl,
    position_effect,
    sampler_logprobs,
    summarize,
)
from trl_length_plugin.figures import pyplot, save_figure  # noqa: E402

#: the modes with the bounds of the shipped recipes (score_centering_tis / _icepop / _adaptive, k = 0)
SPECS = (
    ModeSpec("off", "off"),
    ModeSpec("is", "is"),
    ModeSpec("tis [0, 3]", "tis", (0.0, 3.0)),
    ModeSpec("icepop [0.5, 2]", "icepop", (0.5, 2.0)),
    ModeSpec("adaptive A>0", "adaptive-ppo-clip", (0.8, 1.28), 1.0, 10.0),
    ModeSpec("adaptive A<0", "adaptive-ppo-clip", (0.8, 1.28), -1.0, 10.0),
)
FULL_VOCAB_K = (1, 4, 16, 64, 300, 512)
FLOOR = 1e-17  # zero biases are drawn here on the log scale
#: (label, sampling filter as a function of K, replay, the Ks it runs at)
SAMPLINGS = (
    ("full vocabulary", lambda k: {}, False, FULL_VOCAB_K),
    ("top-k 16, replay", lambda k: {"top_k": 16}, True, (16, 64)),
    ("top-p 0.9 + top_k K, replay", lambda k: {"top_p": 0.9, "top_k": k}, True, (64,)),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32, help="rollouts per setting (one per prompt)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--lag-steps", type=int, default=4, help="optimizer steps the lagging sampler misses")
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="the CPU recipe's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="docs/images/score_centering_effect.png")
    parser.add_argument("--csv", default=None, help="also write every row with every figure here")
    return parser.parse_args(argv)


def chat_prompts_of(tokenizer, data) -> list[list[int]]:
    """The chat-templated prompt ids of a ``make_task_dataset`` dataset."""
    return [
        tokenizer.apply_chat_template(
            row["prompt"], tokenize=True, add_generation_prompt=True, return_dict=False
        )
        for row in data
    ]


def rollouts(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, **sampling):
    """One sampled completion per prompt: ``(sequences [B, L], prompt width, attention mask [B, L])``, the
    prompts left-padded to one width, the mask ending at each completion's eos."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    attention = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        attention[row, width - len(prompt) :] = 1
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=attention,
            do_sample=True,
            temperature=sampling.get("temperature", 1.0),
            top_k=sampling.get("top_k", 0),
            top_p=sampling.get("top_p", 1.0),
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
        )
    completion = out[:, width:]
    ended = (completion == tokenizer.eos_token_id).int().cumsum(1)
    completion_mask = (ended - (completion == tokenizer.eos_token_id).int()) == 0  # up to and with eos
    full_mask = torch.cat([attention.bool(), completion_mask], 1)
    return out, width, full_mask


def forward_logits(model, sequences, mask) -> torch.Tensor:
    """The logits of left-padded sequences, positions counted from each row's first token (as generate)."""
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=sequences, attention_mask=mask.long(), position_ids=positions).logits


def position_logits(model, sequences, width: int, mask) -> torch.Tensor:
    """Float64 logits ``[N, V]`` at every generated position (the logits that predicted each completion token)."""
    with torch.no_grad():
        logits = forward_logits(model, sequences, mask)
    predicting = logits[:, width - 1 : -1].to(torch.float64)
    return predicting[mask[:, width:]]


def grpo_steps(model, tokenizer, steps: int, lr: float, seed: int):
    """``steps`` on-policy GRPO optimizer steps on the embedded task (8 prompts x 8 completions, group-normalized
    correctness advantages, token-mean loss): the trainer the lagging sampler misses."""
    from trl_length_plugin.embedded import make_task_dataset, score_completion

    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for _ in range(steps):
        data = make_task_dataset(8, seed=rng.randint(0, 10**6))
        prompts = [prompt for prompt in chat_prompts_of(tokenizer, data) for _ in range(8)]
        answers = [row["answer"] for row in data for _ in range(8)]
        sequences, width, mask = rollouts(model, tokenizer, prompts, 48)
        texts = tokenizer.batch_decode(sequences[:, width:], skip_special_tokens=True)
        rewards = torch.tensor([score_completion(t, a) for t, a in zip(texts, answers, strict=True)])
        groups = rewards.view(-1, 8)
        advantages = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).view(-1)
        model.train()
        logits = forward_logits(model, sequences, mask)[:, width - 1 : -1]
        logp = logits.log_softmax(-1).gather(-1, sequences[:, width:].unsqueeze(-1)).squeeze(-1)
        completion_mask = mask[:, width:].float()
        loss = -(advantages.unsqueeze(1) * logp * completion_mask).sum() / completion_mask.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.eval()
    return model


def main(argv: list[str] | None = None) -> None:
    import transformers

    from trl_length_plugin.embedded import embedded_model_dir, load_tokenizer, make_task_dataset

    args = parse_args(argv)
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    model_dir = embedded_model_dir()
    tokenizer = load_tokenizer(model_dir)
    warm = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    lagged_trainer = grpo_steps(copy.deepcopy(warm), tokenizer, args.lag_steps, args.learning_rate, args.seed)
    mismatches = {  # name: (sampler, trainer)
        f"lag {args.lag_steps} steps": (warm, lagged_trainer),
        "bf16 sampler": (copy.deepcopy(warm).to(torch.bfloat16), warm),
    }
    prompts = chat_prompts_of(tokenizer, make_task_dataset(args.prompts, seed=args.seed + 1))
    rows = []
    for mismatch, (sampler, trainer) in mismatches.items():
        for label, sampling_for, replay, ks in SAMPLINGS:
            positions = {}  # the rollouts of each sampling filter, shared by the Ks it serves
            for k in ks:
                sampling = sampling_for(k)
                key = tuple(sorted(sampling.items()))
                if key not in positions:
                    torch.manual_seed(args.seed)
                    sequences, width, mask = rollouts(
                        sampler, tokenizer, prompts, args.max_new_tokens, **sampling
                    )
                    positions[key] = (
                        position_logits(sampler, sequences, width, mask),
                        position_logits(trainer, sequences, width, mask),
                    )
                sampler_z, trainer_z = positions[key]
                log_q = sampler_logprobs(sampler_z, **sampling)
                kl = mean_kl(log_q, trainer_z, replay)
                for spec in SPECS:
                    effect = position_effect(
                        trainer_z, log_q, num_candidates=k, spec=spec, sampler_replay=replay
                    )
                    rows.append(Row(mismatch, label, k, spec.name, len(trainer_z), kl, summarize(effect)))
    print_tables(rows)
    if args.csv:
        write_csv(rows, args.csv)
    out = plot(rows, args.out)
    print(f"\nwrote {out}; wall time {time.perf_counter() - start:.0f} s")


class Row(NamedTuple):
    mismatch: str
    sampling: str
    k: int
    mode: str
    positions: int
    kl: float
    summary: EffectSummary


def _bias_cell(s: EffectSummary) -> str:
    relative = "" if math.isnan(s.relative_bias) else f" ({s.relative_bias:.2g})"
    return f"{s.bias:.1e}{relative}"


def print_tables(rows: list[Row]) -> None:
    """One markdown table per mismatch and sampling: per mode, the bias without the correction, with it at
    each K (relative to the former in parentheses), and the variance; then the head masses, rho and |C|."""
    for mismatch, sampling in dict.fromkeys((r.mismatch, r.sampling) for r in rows):
        block = [r for r in rows if (r.mismatch, r.sampling) == (mismatch, sampling)]
        ks = list(dict.fromkeys(r.k for r in block))
        first = block[0]
        print(f"\n{mismatch}, {sampling}: {first.positions} positions, mean KL(q||p) {first.kl:.2e}\n")
        print("| mode | no correction | " + " | ".join(f"K = {k}" for k in ks) + " | variance |")
        print("| --- " * (len(ks) + 3) + "|")
        for spec in SPECS:
            cells = [next(r for r in block if r.k == k and r.mode == spec.name).summary for k in ks]
            line = " | ".join(_bias_cell(c) for c in cells)
            print(f"| {spec.name} | {cells[0].base_bias:.1e} | {line} | {cells[0].variance:.3f} |")
        off = [next(r for r in block if r.k == k and r.mode == "off").summary for k in ks]
        tis = [next(r for r in block if r.k == k and r.mode == SPECS[2].name).summary for k in ks]
        for name, values in (
            ("head_mass", [f"{c.head_mass:.4f}" for c in off]),
            ("train_head_mass", [f"{c.train_head_mass:.4f}" for c in off]),
            ("rho_mean", [f"{c.rho:.3f}" for c in off]),
            ("correction_abs_mean, off", [f"{c.correction_abs:.1e}" for c in off]),
            (f"correction_abs_mean, {SPECS[2].name}", [f"{c.correction_abs:.1e}" for c in tis]),
        ):
            print(f"| {name} | | " + " | ".join(values) + " | |")


def write_csv(rows: list[Row], path: str) -> None:
    """Every row with every summary field, for recomputing the tables."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*Row._fields[:-1], *EffectSummary._fields])
        for row in rows:
            writer.writerow([*row[:-1], *row.summary])


def plot(rows: list[Row], path: str) -> Path:
    """Bias with the correction (solid) and without (dashed) against K, full vocabulary, per mismatch."""
    plt = pyplot()

    mismatches = list(dict.fromkeys(r.mismatch for r in rows))
    fig, axes = plt.subplots(1, len(mismatches) + 1, figsize=(5 * (len(mismatches) + 1), 4))
    for ax, mismatch in zip(axes, mismatches, strict=False):
        for index, spec in enumerate(SPECS):
            picked = [
                r for r in rows if (r.mismatch, r.sampling, r.mode) == (mismatch, SAMPLINGS[0][0], spec.name)
            ]
            ks = [r.k for r in picked]
            color = f"C{index}"
            ax.plot(ks, [max(r.summary.bias, FLOOR) for r in picked], "o-", color=color, label=spec.name)
            ax.plot(ks, [max(r.summary.base_bias, FLOOR) for r in picked], "--", color=color, alpha=0.5)
        ax.set(xscale="log", yscale="log", xlabel="K", ylabel="mean ||E[grad]|| (logits)",
               title=f"{mismatch} (KL {picked[0].kl:.1e}); dashed: no correction")  # fmt: skip
        ax.legend(fontsize=7)
    ax = axes[-1]
    for mismatch in mismatches:
        picked = [r for r in rows if (r.mismatch, r.sampling, r.mode) == (mismatch, SAMPLINGS[0][0], "off")]
        ks = [r.k for r in picked]
        ax.plot(ks, [max(1 - r.summary.head_mass, FLOOR) for r in picked], "o-", label=f"{mismatch}: sampler")
        ax.plot(
            ks,
            [max(1 - r.summary.train_head_mass, FLOOR) for r in picked],
            "x--",
            label=f"{mismatch}: trainer",
        )
    ax.set(
        xscale="log", yscale="log", xlabel="K", ylabel="1 - head mass", title="tail mass (full vocabulary)"
    )
    ax.legend(fontsize=7)
    return save_figure(fig, path, dpi=110)


if __name__ == "__main__":
    main()
