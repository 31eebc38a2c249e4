"""GSM8K helpers for the real-model recipes (``recipes/trl``): a prompt mapping and a binary reward.

Used by dotted path from a recipe: ``dataset_map: trl_length_plugin.trl_integration.tasks.gsm8k_prompt``
(or ``gsm8k_prompt_with_target`` for the target-length recipe) and ``reward_funcs: [trl_length_plugin.trl_integration.tasks.gsm8k_correctness]``.
"""

from __future__ import annotations

from trl_length_plugin.embedded.task import last_number_score
from trl_length_plugin.shaping.columns import TARGET

GSM8K_SYSTEM = (
    "Solve the math problem. Reason step by step inside <think> and </think>, "
    "then write only the final number."
)


def gsm8k_prompt(example: dict) -> dict:
    """openai/gsm8k row -> conversational ``prompt`` and the bare final ``answer``."""
    return {
        "prompt": [
            {"role": "system", "content": GSM8K_SYSTEM},
            {"role": "user", "content": example["question"]},
        ],
        "answer": example["answer"].rsplit("####", 1)[-1].strip().replace(",", ""),
    }


#: the target range of ``gsm8k_prompt_with_target``: L1 samples targets uniformly (arXiv 2503.04697), here within
#: the GPU recipes' 512-token completions
GSM8K_TARGET_RANGE = (100, 400)


def gsm8k_prompt_with_target(example: dict) -> dict:
    """``gsm8k_prompt`` with a ``target_length`` drawn uniformly from ``GSM8K_TARGET_RANGE`` (seeded by the
    question, so the same row always gets the same target) and the user message asking for it ("Think for
    maximum N tokens.", docs/reference/length-penalties.md §2.20)."""
    from trl_length_plugin.shaping.targets import prompt_with_target, sampled_target

    row = gsm8k_prompt(example)
    target = sampled_target(0, example["question"], *GSM8K_TARGET_RANGE)
    row["prompt"] = prompt_with_target(row["prompt"], target, "Think for maximum {n} tokens.")
    return {**row, TARGET: target}


def gsm8k_correctness(completions: list, answer: list[str], **kwargs) -> list[float]:
    """1.0 when the last number after the reasoning equals the reference answer, else 0.0 (binary, §2.4)."""
    return [last_number_score(c, a) for c, a in zip(completions, answer, strict=True)]


#: the GSM8K-format sample's word problems: (question template, worked answer template, answer); written by this
#: project (not GSM8K's data), each with GSM8K's ``<<a+b=c>>`` calculator notes and final ``#### N`` line
_SAMPLE_TEMPLATES = (
    (
        "{name} has {a} apples and buys {b} more. How many apples does {name} have now?",
        "{name} starts with {a} apples and buys {b} more, so {name} has {a} + {b} = <<{a}+{b}={c}>>{c} apples.",
        lambda a, b: a + b,
    ),
    (
        "A box holds {a} pencils. {name} takes out {b} of them. How many pencils are left in the box?",
        "The box had {a} pencils and {b} were taken out, so {a} - {b} = <<{a}-{b}={c}>>{c} pencils are left.",
        lambda a, b: a - b,
    ),
    (
        "{name} reads {a} pages a day for {b} days. How many pages does {name} read in total?",
        "{name} reads {a} pages on each of {b} days, so {a} * {b} = <<{a}*{b}={c}>>{c} pages.",
        lambda a, b: a * b,
    ),
)
_SAMPLE_NAMES = ("Mia", "Omar", "Lena", "Ravi", "Sofia", "Tom")


def gsm8k_sample(n: int, seed: int = 0) -> list[dict]:
    """``n`` GSM8K-format rows (``question``; ``answer``: the worked solution ending ``#### N``) that this project
    writes itself, for the GSM8K recipes on a machine without the Hub (``gsm8k_prompt`` reads them)."""
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        question, worked, combine = rng.choice(_SAMPLE_TEMPLATES)
        a, b, name = rng.randint(5, 40), rng.randint(2, 9), rng.choice(_SAMPLE_NAMES)
        c = combine(a, b)
        values = {"a": a, "b": b, "c": c, "name": name}
        rows.append({"question": question.format(**values), "answer": f"{worked.format(**values)}\n#### {c}"})
    return rows
