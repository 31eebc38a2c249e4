"""Reasoning, answer and total lengths of completions (docs/reference/length-penalties.md §2.5).

Only the model's own output counts: a text completion whole; in a conversational completion the
assistant (or role-less) messages, their ``content`` and ``reasoning_content``. Reasoning is the text
between the reasoning tags (the tags themselves count in neither channel); an unterminated opening tag
makes the rest reasoning, and a closing tag with no opening tag before it makes the text before it
reasoning (chat templates that open the reasoning block in the prompt). Answer is the rest.
``tokens``: ``len(tokenizer.encode(text, add_special_tokens=False))`` per channel; ``chars``: ``len``.
Completions given as token ids (:func:`measure_token_ids`) are counted in their own tokens, split by the same
rule where the tags lie in the tokens' texts (:func:`split_reasoning_ids`), nothing encoded again: the counts of
the text where the model's tokens are the tokenizer's own encoding of it.

A completion that is neither a string nor a list of messages (mappings), a message ``content`` that is
neither a string, None nor a list of parts, or text that is not valid Unicode (a lone surrogate, which no
tokenizer encodes) is a ``ValueError`` naming the completion's index.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .config import DEFAULT_REASONING_TAGS

Completion = str | Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class ChannelLengths:
    """Per-row lengths (int64) of the reasoning and answer channels; ``total`` is their sum."""

    reasoning: torch.Tensor
    answer: torch.Tensor

    @property
    def total(self) -> torch.Tensor:
        return self.reasoning + self.answer


def channel_spans(
    text: str, reasoning_tags: tuple[str, str] = DEFAULT_REASONING_TAGS
) -> list[tuple[int, int, bool]]:
    """The parts of one text outside the tags, in order: ``(start, end, is_reasoning)``."""
    opening, closing = reasoning_tags
    spans = []
    position = 0
    first_close, first_open = text.find(closing), text.find(opening)
    if first_close != -1 and (first_open == -1 or first_close < first_open):
        spans.append((0, first_close, True))
        position = first_close + len(closing)
    while True:
        start = text.find(opening, position)
        if start == -1:
            spans.append((position, len(text), False))
            return spans
        spans.append((position, start, False))
        end = text.find(closing, start + len(opening))
        if end == -1:
            spans.append((start + len(opening), len(text), True))
            return spans
        spans.append((start + len(opening), end, True))
        position = end + len(closing)


def split_reasoning(text: str, reasoning_tags: tuple[str, str] = DEFAULT_REASONING_TAGS) -> tuple[str, str]:
    """``(reasoning, answer)`` of one text."""
    spans = channel_spans(text, reasoning_tags)
    return tuple(
        "".join(text[a:b] for a, b, thought in spans if thought is wanted) for wanted in (True, False)
    )


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence) or isinstance(content, bytes | bytearray):
        raise ValueError(
            f"a message's content must be a string or a list of parts, got {type(content).__name__}"
        )
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            parts.append(part["text"])
    return "".join(parts)


def completion_channels(
    completion: Completion, reasoning_tags: tuple[str, str] = DEFAULT_REASONING_TAGS
) -> tuple[str, str]:
    """``(reasoning, answer)`` text of a completion: a string or a list of chat messages."""
    if isinstance(completion, str):
        return split_reasoning(completion, reasoning_tags)
    if not isinstance(completion, Sequence) or isinstance(completion, bytes | bytearray):
        raise ValueError(f"expected a string or a list of chat messages, got {type(completion).__name__}")
    reasoning, answer = [], []
    for message in completion:
        if not isinstance(message, Mapping):
            raise ValueError(f"a chat message must be a mapping, got {type(message).__name__}")
        if message.get("role") not in (None, "assistant"):
            continue
        if isinstance(message.get("reasoning_content"), str):
            reasoning.append(message["reasoning_content"])
        tagged, rest = split_reasoning(_content_text(message.get("content")), reasoning_tags)
        reasoning.append(tagged)
        answer.append(rest)
    return "".join(reasoning), "".join(answer)


def _count(text: str, length_type: str, tokenizer: Any) -> int:
    if length_type == "chars":
        return len(text)
    if length_type != "tokens":
        raise ValueError(f"length_type must be 'tokens' or 'chars', got {length_type!r}")
    if tokenizer is None:
        raise ValueError(
            "length_type 'tokens' needs a tokenizer (docs/reference/length-penalties.md §2.5); use 'chars' without one"
        )
    return len(tokenizer.encode(text, add_special_tokens=False)) if text else 0


def _check_unicode(text: str) -> None:
    """A ``ValueError`` when ``text`` holds a lone surrogate (not valid Unicode)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("not valid Unicode text (it holds a lone surrogate)") from None


def measure_lengths(
    completions: Sequence[Completion],
    length_type: str | Sequence[str] = "tokens",
    tokenizer: Any = None,
    reasoning_tags: tuple[str, str] = DEFAULT_REASONING_TAGS,
) -> ChannelLengths:
    """Channel lengths of each completion; ``length_type`` is one unit or one per row (per agent)."""
    types = [length_type] * len(completions) if isinstance(length_type, str) else list(length_type)
    if len(types) != len(completions):
        raise ValueError("length_type must be one string or one per completion")
    if tokenizer is None and "tokens" in types:
        raise ValueError(
            "length_type 'tokens' needs a tokenizer (docs/reference/length-penalties.md §2.5); use 'chars' without one"
        )
    reasoning, answer = [], []
    for row, (completion, unit) in enumerate(zip(completions, types, strict=True)):
        try:
            thought, said = completion_channels(completion, reasoning_tags)
            _check_unicode(thought)
            _check_unicode(said)
        except ValueError as err:
            raise ValueError(f"completions[{row}]: {err}") from None
        reasoning.append(_count(thought, unit, tokenizer))
        answer.append(_count(said, unit, tokenizer))
    return ChannelLengths(torch.tensor(reasoning, dtype=torch.long), torch.tensor(answer, dtype=torch.long))


def split_reasoning_ids(
    ids: Sequence[int], pieces: Mapping[int, str], reasoning_tags: tuple[str, str] = DEFAULT_REASONING_TAGS
) -> tuple[int, int]:
    """``(reasoning, answer)`` token counts of one completion's ids (special tokens already left out), split by
    :func:`split_reasoning`'s rule: the tags are found in the tokens' own texts (``pieces``: token id -> its
    text), and a token counts in the channel of its first character outside the tags (a token that is all tag,
    in neither). No text is encoded again."""
    text = "".join(pieces[token] for token in ids)
    channel = [0] * len(text)  # 0: a tag's, 1: reasoning, 2: answer
    for start, end, thought in channel_spans(text, reasoning_tags):
        channel[start:end] = [1 if thought else 2] * (end - start)
    counts, position = [0, 0, 0], 0
    for token in ids:
        width = len(pieces[token])
        counts[next((c for c in channel[position : position + width] if c), 0)] += 1
        position += width
    return counts[1], counts[2]


#: tokenizer -> the texts of the token ids looked up so far (a vocabulary does not change)
_PIECES: weakref.WeakKeyDictionary[Any, dict[int, str]] = weakref.WeakKeyDictionary()


def token_pieces(tokenizer: Any, completion_ids: Sequence[Sequence[int]]) -> dict[int, str]:
    """Each token id of ``completion_ids`` -> its own text, each id looked up once per tokenizer."""
    pieces = _PIECES.setdefault(tokenizer, {})
    new = sorted({token for ids in completion_ids for token in ids} - pieces.keys())
    if new:  # (batch_decode([]) gives [""])
        pieces.update(zip(new, tokenizer.batch_decode([[token] for token in new]), strict=True))
    return pieces


def measure_token_ids(
    completion_ids: Sequence[Sequence[int]] | torch.Tensor,
    tokenizer: Any,
    length_type: str | Sequence[str] = "tokens",
    reasoning_tags: tuple[str, str] = DEFAULT_REASONING_TAGS,
) -> ChannelLengths:
    """Channel lengths of completions given as token ids, special tokens left out (as TRL decodes completions):
    in ``tokens`` the ids themselves, split at the tags (:func:`split_reasoning_ids`: nothing decoded and encoded
    again); in ``chars`` the decoded text, measured like text."""
    if tokenizer is None:
        raise ValueError("measuring token ids needs the tokenizer that produced them")
    if isinstance(completion_ids, torch.Tensor):
        completion_ids = completion_ids.tolist()
    types = [length_type] * len(completion_ids) if isinstance(length_type, str) else list(length_type)
    if len(types) != len(completion_ids):
        raise ValueError("length_type must be one string or one per completion")
    special = set(tokenizer.all_special_ids)
    generated = [[token for token in ids if token not in special] for ids in completion_ids]
    pieces = token_pieces(
        tokenizer, [ids for ids, unit in zip(generated, types, strict=True) if unit == "tokens"]
    )
    reasoning, answer = [], []
    for ids, unit in zip(generated, types, strict=True):
        if unit == "tokens":
            thought, said = split_reasoning_ids(ids, pieces, reasoning_tags)
        else:
            text = measure_lengths(
                [tokenizer.decode(ids, skip_special_tokens=True)], unit, None, reasoning_tags
            )
            thought, said = int(text.reasoning[0]), int(text.answer[0])
        reasoning.append(thought)
        answer.append(said)
    return ChannelLengths(torch.tensor(reasoning, dtype=torch.long), torch.tensor(answer, dtype=torch.long))
