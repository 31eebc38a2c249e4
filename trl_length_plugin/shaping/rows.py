"""What every host's row builder shares (docs/write-a-host.md): the per-prompt metadata entry of each row,
read from the dataset's columns (docs/reference/length-penalties.md §2.14), a cache key for an entry, and
the rule that says a rollout was truncated (§2.19)."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch

from .terms import metadata_columns


def metadata_entries(
    columns: Mapping[str, Sequence[Any]], rows: int, nested: Sequence[Any] | None = None
) -> list[dict[str, Any] | None] | None:
    """Each row's metadata entry: the ``metadata_columns()`` (the core's and the terms' own) found among the
    dataset's top-level ``columns`` (one list per column), else the same keys in the row's ``nested``
    mapping (verl's ``extra_info``); a row with none of them gets None. None when no column is present and
    nothing is nested."""
    names = metadata_columns()
    present = [key for key in names if key in columns]
    if not present and nested is None:
        return None
    entries = []
    for row in range(rows):
        inner = nested[row] if nested is not None else None
        inner = inner if isinstance(inner, Mapping) else {}
        entry = {key: columns[key][row] if key in present else None for key in names}
        entry = {key: inner.get(key) if value is None else value for key, value in entry.items()}
        entries.append(entry if any(value is not None for value in entry.values()) else None)
    return entries


def metadata_entry(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """One row's metadata entry (:func:`metadata_entries` of a single row given as a mapping)."""
    entries = metadata_entries({key: [value] for key, value in row.items()}, 1)
    return entries[0] if entries else None


def entry_key(entry: Any) -> Hashable:
    """A metadata entry as a cache key where the host has no prompt id: a 128-bit BLAKE2 digest of its
    pickle, so equal entries share a key whatever row, prompt or position they come from; an unpicklable
    entry gets a key of its own."""
    try:
        return hashlib.blake2b(pickle.dumps(entry, protocol=5), digest_size=16).digest()
    except (pickle.PicklingError, TypeError, AttributeError):
        return object()


def truncated_rows(
    last_tokens: torch.Tensor,
    lengths: torch.Tensor,
    stop_ids: Sequence[int | None],
    max_length: int | None = None,
) -> torch.Tensor:
    """Per row, whether the rollout was truncated: it has tokens, its last token is not an end-of-sequence or
    pad token (``stop_ids``), and, when the host gives its limit, it reached ``max_length`` (§2.19; TRL's
    ``is_truncated`` without a limit, verl's ``data.max_response_length`` with one)."""
    stops = torch.tensor([i for i in stop_ids if i is not None], dtype=torch.long)
    truncated = (lengths > 0) & ~torch.isin(last_tokens.long(), stops)
    return truncated if max_length is None else truncated & (lengths >= max_length)
