"""Prompt datasets for the target-length reward (docs/reference/length-penalties.md §2.20): each row gets a
``target_length`` column and its prompt asks for that length ("Think for N tokens.", L1, arXiv 2503.04697).

Framework-free: :func:`add_target_lengths` takes a ``datasets`` ``Dataset`` or ``IterableDataset`` (through
its ``map``) or a list of row mappings, and never imports ``datasets``.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Mapping, Sequence
from typing import Any

from .columns import TARGET
from .config import MAX_LENGTH

DEFAULT_TEMPLATE = "Think for {n} tokens."


def _instruction(template: str, n: float) -> str:
    return template.format(n=int(n) if float(n).is_integer() else n)


def _checked_target(value: Any, where: str) -> float:
    """A target length: a real number (no bool) in (0, 2**53], or a ValueError naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{where}: target_length must be a number, got {value!r}")
    if not (math.isfinite(float(value)) and 0 < float(value) <= MAX_LENGTH):
        raise ValueError(f"{where}: target_length must be finite and in (0, 2**53], got {value!r}")
    return value


def prompt_with_target(prompt: Any, n: float, template: str = DEFAULT_TEMPLATE) -> Any:
    """``prompt`` asking for ``n``: the instruction (``template`` with ``{n}``) appended after a space to a
    plain prompt, or to the content of the last ``user`` message of a conversational one (a new text part
    when that content is a list of parts). The input is not modified; ``n`` is checked as a dataset's targets
    are (a number in (0, 2**53], docs/reference/length-penalties.md §2.20)."""
    instruction = _instruction(template, _checked_target(n, "prompt_with_target"))
    if isinstance(prompt, str):
        return f"{prompt} {instruction}" if prompt else instruction
    if not isinstance(prompt, Sequence) or not all(isinstance(m, Mapping) for m in prompt):
        raise ValueError(f"a prompt must be a string or a list of messages, got {type(prompt).__name__}")
    users = [i for i, message in enumerate(prompt) if message.get("role") == "user"]
    if not users:
        raise ValueError("a conversational prompt needs a user message to add the target length to")
    messages = [dict(message) for message in prompt]
    content = messages[users[-1]].get("content")
    if isinstance(content, str):
        messages[users[-1]]["content"] = f"{content} {instruction}" if content else instruction
    elif isinstance(content, list):
        messages[users[-1]]["content"] = [*content, {"type": "text", "text": instruction}]
    else:
        raise ValueError(f"the last user message's content must be text or a list of parts, got {content!r}")
    return messages


def sampled_target(seed: int, index: int | str, low: int, high: int) -> int:
    """Row ``index``'s target drawn uniformly from the integers ``low..high``: a function of ``(seed,
    index)`` only, so a streaming dataset gets the same targets as a map-style one (``index``: the row's
    position, or any stable key of the row such as its question)."""
    return random.Random(f"{seed}/{index}").randint(low, high)


def _check_range(target_range: Sequence[int]) -> tuple[int, int]:
    low, high = target_range
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)) or not 1 <= low <= high:
        raise ValueError(f"target_range must be two integers 1 <= low <= high, got {tuple(target_range)}")
    return low, high


_NO_TARGETS = "no target_length column to take targets from; give target_range or targets"


def _column_names(dataset: Any) -> list[str] | None:
    """The columns of a ``datasets`` dataset, or of a list of rows (any row's); None when unknown (a
    streaming dataset before its first row)."""
    if isinstance(dataset, list):
        return list({key: None for row in dataset for key in row})
    return getattr(dataset, "column_names", None)


def add_target_lengths(
    dataset: Any,
    target_range: Sequence[int] | None = None,
    *,
    targets: Sequence[float | None] | None = None,
    seed: int = 0,
    template: str = DEFAULT_TEMPLATE,
    prompt_column: str = "prompt",
) -> Any:
    """``dataset`` with a ``target_length`` column and each prompt asking for it (``prompt_with_target``).

    The targets: drawn per row from ``target_range`` (``low, high``, integers, seeded by ``seed`` and the row
    index), or given per row (``targets``), or else the dataset's own ``target_length`` column (as
    ``trl-length profile --targets`` writes it). A row whose target is None keeps its prompt and gets None.
    Nothing to take targets from (no range, no ``targets``, no ``target_length`` column) and a row without
    ``prompt_column`` are ValueErrors naming what is missing.
    """
    if "{n}" not in template:
        raise ValueError(f"template must contain {{n}}, got {template!r}")
    if target_range is not None and targets is not None:
        raise ValueError("give target_range or targets, not both")
    bounds = None if target_range is None else _check_range(target_range)
    from_column = target_range is None and targets is None
    if from_column and TARGET not in (_column_names(dataset) or [TARGET]):
        raise ValueError(_NO_TARGETS)

    def rewrite(row: Mapping[str, Any], index: int) -> dict[str, Any]:
        if bounds is not None:
            target = sampled_target(seed, index, *bounds)
        elif targets is not None:
            target = targets[index]
        else:
            target = row.get(TARGET)
        if target is None:
            return {**row, TARGET: None}
        target = _checked_target(target, f"row {index}")
        if prompt_column not in row:
            raise ValueError(
                f"row {index}: no {prompt_column!r} column to ask for the target in (prompt_column; "
                f"the row has {', '.join(map(repr, row)) or 'no columns'})"
            )
        return {
            **row,
            TARGET: target,
            prompt_column: prompt_with_target(row[prompt_column], target, template),
        }

    if isinstance(dataset, list):
        if targets is not None and len(targets) != len(dataset):
            raise ValueError(f"targets has {len(targets)} values for {len(dataset)} rows")
        return [rewrite(row, i) for i, row in enumerate(dataset)]
    if targets is not None and hasattr(dataset, "__len__") and len(targets) != len(dataset):
        raise ValueError(f"targets has {len(targets)} values for {len(dataset)} rows")
    return dataset.map(rewrite, with_indices=True)
