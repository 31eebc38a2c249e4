"""GSM8K helpers for the real-model recipes (``recipes/trl``): a prompt mapping and a binary reward.

Used by dotted path from a recipe: ``dataset_map: trl_length_plugin.trl_integration.tasks.gsm8k_prompt``
and ``reward_funcs: [trl_length_plugin.trl_integration.tasks.gsm8k_correctness]``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

GSM8K_SYSTEM = (
    "Solve the math problem. Reason step by step inside <think> and </think>, "
    "then write only the final number."
)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def gsm8k_prompt(example: dict) -> dict:
    """openai/gsm8k row -> conversational ``prompt`` and the bare final ``answer``."""
    return {
        "prompt": [
            {"role": "system", "content": GSM8K_SYSTEM},
            {"role": "user", "content": example["question"]},
        ],
        "answer": example["answer"].rsplit("####", 1)[-1].strip().replace(",", ""),
    }


def _final_number(text: str) -> str | None:
    tail = text.rsplit("</think>", 1)[-1]
    numbers = _NUMBER.findall(tail)
    return numbers[-1].replace(",", "").rstrip(".") if numbers else None


def _text(completion: str | Sequence[dict]) -> str:
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion if m.get("role", "assistant") == "assistant")


def gsm8k_correctness(completions: list, answer: list[str], **kwargs) -> list[float]:
    """1.0 when the last number after the reasoning equals the reference answer, else 0.0 (binary, §2.4)."""
    rewards = []
    for completion, reference in zip(completions, answer, strict=True):
        final = _final_number(_text(completion))
        try:
            rewards.append(float(final is not None and float(final) == float(reference)))
        except ValueError:
            rewards.append(0.0)
    return rewards
