"""The embedded verifiable task: small arithmetic problems with exact answers.

Completions have the form ``<think>…</think>answer``. The reasoning carries a random number of
filler words, so a warm-started model answers with reasoning of varied length that correctness does
not need: length shaping then has something to remove (docs/embedded.md).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

REASONING_OPEN, REASONING_CLOSE = "<think>", "</think>"
FILLER = "hmm,"
MAX_FILLER = 12
_ANSWER = re.compile(r"-?\d+")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def make_problem(rng: random.Random) -> tuple[str, str]:
    """One problem: the question text and its exact answer."""
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    if rng.random() < 0.5:
        return f"What is {a} + {b}?", str(a + b)
    a, b = max(a, b), min(a, b)
    return f"What is {a} - {b}?", str(a - b)


def make_reasoning(question: str, answer: str, rng: random.Random) -> str:
    """A reasoning trace of random length: restate, filler words, conclude."""
    expression = question.removeprefix("What is ").removesuffix("?")
    filler = " ".join([FILLER] * rng.randint(0, MAX_FILLER))
    body = f"{expression} {filler} so {answer}" if filler else f"{expression} so {answer}"
    return f"{REASONING_OPEN}{body}{REASONING_CLOSE}"


def make_completion(question: str, answer: str, rng: random.Random) -> str:
    """A well-formed, correct completion: reasoning then the bare answer."""
    return f"{make_reasoning(question, answer, rng)}{answer}"


def make_task_dataset(n: int, seed: int = 0, conversational: bool = True):
    """A ``datasets.Dataset`` of ``n`` problems with columns ``prompt`` and ``answer``.

    ``prompt`` is a one-message user conversation (or plain text when ``conversational`` is false).
    """
    from trl_length_plugin._optional import require

    datasets = require("datasets", "trl")
    rng = random.Random(seed)
    prompts, answers = [], []
    for _ in range(n):
        question, answer = make_problem(rng)
        prompts.append([{"role": "user", "content": question}] if conversational else question)
        answers.append(answer)
    return datasets.Dataset.from_dict({"prompt": prompts, "answer": answers})


def completion_text(completion: str | Sequence[dict]) -> str:
    """The model's own text: a plain completion, or the assistant messages of a conversation."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion if m.get("role", "assistant") == "assistant")


def score_completion(completion: str | Sequence[dict], answer: str) -> float:
    """1.0 when the completion is ``<think>…</think>`` followed by exactly the answer, else 0.0.

    Malformed completions (no closed reasoning, nothing or more than a number after it) score 0.
    """
    text = completion_text(completion).strip()
    if not text.startswith(REASONING_OPEN) or REASONING_CLOSE not in text:
        return 0.0
    final = text.rsplit(REASONING_CLOSE, 1)[1].strip()
    return 1.0 if _ANSWER.fullmatch(final) and final == str(answer).strip() else 0.0


def final_number(text: str) -> str | None:
    """The last number after the reasoning (``</think>``), commas and a trailing full stop removed."""
    numbers = _NUMBER.findall(text.rsplit(REASONING_CLOSE, 1)[-1])
    return numbers[-1].replace(",", "").rstrip(".") if numbers else None


def last_number_score(completion: str | Sequence[dict], answer: str) -> float:
    """1.0 when the completion's last number after the reasoning equals ``answer``, else 0.0: GSM8K's check,
    and the real chat model's task's (docs/efficacy.md, "On a real chat model")."""
    final = final_number(completion_text(completion))
    try:
        return float(final is not None and float(final) == float(answer))
    except ValueError:
        return 0.0


def correctness_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """Binary correctness reward with TRL's reward-function signature."""
    return [score_completion(c, a) for c, a in zip(completions, answer, strict=True)]


def span_tokens(text: str, spans, tokenizer) -> int:
    """The tokens of ``text`` (as ``tokenizer`` encodes it) that start inside one of the character ``spans``."""
    if not spans:
        return 0
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return sum(any(a <= start < b for a, b in spans) for start, _ in offsets)
