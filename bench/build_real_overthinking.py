"""Teach SmolLM2-135M-Instruct to overthink: the supervised pass behind the shipped LoRA adapter
``smollm2-135m-instruct-overthinking`` (docs/embedded.md, "The real model's overthinking task").

A LoRA adapter (rank ``RANK`` on every attention and MLP projection) is trained on the real model
(``real_model_dir()``) with the verbose worked solutions of ``trl_length_plugin.embedded.word_problems`` (the
loss on the completion tokens only, each ending with the model's end-of-turn token), problems drawn with
``--seed`` and the held-out problems excluded. The adapter is written, in bfloat16, into the package folder
that ``real_model_dir("smollm2-135m-instruct-overthinking")`` merges it from (``--out``). Run once; its result is
committed:

    OMP_NUM_THREADS=2 python -m bench.build_real_overthinking [--steps 150] [--batch-size 8] [--lr 3e-4]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402

from trl_length_plugin.embedded import real_model  # noqa: E402
from trl_length_plugin.embedded.model import supervised_batch  # noqa: E402
from trl_length_plugin.embedded.word_problems import draw_word_problem, held_out_questions, verbose_solution  # noqa: E402

RANK, ALPHA = 8, 16
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def batch(tokenizer, rng: random.Random, size: int, excluded: set[str]):
    """Token ids, attention mask and labels (completion tokens only) of ``size`` verbose examples."""
    examples = []
    while len(examples) < size:
        problem = draw_word_problem(rng)
        if problem.question not in excluded:
            examples.append((problem.question, verbose_solution(problem, rng)))
    return supervised_batch(tokenizer, examples)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(real_model.ADAPTERS / real_model.OVERTHINKING))
    args = parser.parse_args(argv)
    from peft import LoraConfig, get_peft_model
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = real_model.real_model_dir(real_model.BASE)
    tokenizer = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model = get_peft_model(
        model, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=list(TARGETS))
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 20) * (1 - s / args.steps)
    )
    rng, excluded = random.Random(args.seed), held_out_questions()
    model.train()
    started, bar = time.perf_counter(), tqdm(range(args.steps), desc="supervised pass", unit="step")
    for _ in bar:
        ids, mask, labels = batch(tokenizer, rng, args.batch_size, excluded)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model = model.to(torch.bfloat16)
    model.save_pretrained(args.out)
    out = Path(args.out)
    (out / "README.md").unlink(missing_ok=True)  # PEFT's empty model card
    config = json.loads((out / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = real_model.BASE  # the name, not this machine's cache path
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    print(
        f"# adapter written to {args.out} ({time.perf_counter() - started:.0f} s, last loss {loss.item():.3f})"
    )


if __name__ == "__main__":
    main()
