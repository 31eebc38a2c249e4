"""Per-prompt metadata: parsed once per prompt, then merged per group (docs/reference/length-penalties.md
§2.10, §2.12-2.14, §2.20).

:func:`parse_prompt_metadata` turns per-prompt entries (mappings with ``profiled_rewards``,
``profiled_output_lengths``, ``profile_band``, ``target_length``; any may be missing) into a
:class:`PromptMetadata` table of tensors; :class:`MetadataCache` keeps that table by prompt key, so a host
parses each prompt once per run;
:func:`merge_group_metadata` merges a group's entry over the config's global bands. A term's own columns
(``terms.PromptColumn``) are parsed here too, entry by entry with the term's parser, and kept beside the
core's parts (``PromptMetadata.columns``).

A malformed entry is flagged in ``PromptMetadata.invalid`` (the caller warns and counts it) and never
raises. Malformed (reference §2.12, §2.14):

- a ``profile_band`` that is not a mapping (every channel flagged), or a channel name other than
  ``total``/``reasoning``/``answer`` (flagged under ``channel_name``; the known channels are still read);
- a channel block that is not a mapping, lacks ``a``, ``b`` or ``f``, has a value that is not a real number
  (bools and strings are not numbers), is not finite, is above ``MAX_LENGTH`` in size, has ``a < 0``,
  ``b <= a`` or ``f`` outside [0, 1];
- ``profiled_rewards`` / ``profiled_output_lengths`` (both present) that are not sequences of the same
  length of real numbers (a reward may be a bool), or a length that is negative or above ``MAX_LENGTH``;
- a ``target_length`` that is not a real number (bools and strings are not), not finite, <= 0 or above
  ``MAX_LENGTH`` (§2.20).

Numbers may be Python, numpy or 0-d tensor scalars; sequences lists, tuples, 1-D numpy arrays or tensors.

Plain Python dicts, lists and numbers convert in bulk (C-level ``map`` columns; integers through ``bytes``
or ``struct``); anything else goes through the per-entry parsers, which define what is valid.
"""

from __future__ import annotations

import math
import numbers
import struct
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, repeat
from operator import is_not
from typing import Any

import numpy as np
import torch

from .columns import (
    CHANNEL_NAME,
    METADATA_KEYS,
    PROFILE_BAND,
    PROFILED,
    PROFILED_OUTPUT_LENGTHS,
    PROFILED_REWARDS,
    TARGET,
)
from .config import BAND_CHANNELS, MAX_LENGTH, ProfileBandChannel
from .terms import metadata_keys, prompt_columns
from .threads import single_threaded

_BAND_KEYS = frozenset(BAND_CHANNELS)
_INVALID = object()  # a malformed entry


@dataclass
class PromptMetadata:
    """Parsed metadata of P prompts, independent of any config.

    ``bands`` (P, channel, 3): ``a, b, f`` per ``BAND_CHANNELS`` channel, NaN where absent or malformed;
    ``profiled`` (P, 3): count, sum and sum of squares of the passing profiled lengths (count 0: none);
    ``invalid`` (P, len(metadata_keys())) bool: what was malformed; ``target`` (P,): the target length
    (§2.20), NaN where absent or malformed; ``columns``: each term column (P, width), NaN where absent or
    malformed.
    """

    bands: torch.Tensor
    profiled: torch.Tensor
    invalid: torch.Tensor
    target: torch.Tensor
    columns: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def empty(cls, n: int) -> PromptMetadata:
        return cls(
            torch.full((n, len(BAND_CHANNELS), 3), math.nan, dtype=torch.float64),
            torch.zeros((n, 3), dtype=torch.float64),
            torch.zeros((n, len(metadata_keys())), dtype=torch.bool),
            torch.full((n,), math.nan, dtype=torch.float64),
            {c.name: torch.full((n, c.width), math.nan, dtype=torch.float64) for c in prompt_columns()},
        )

    def __len__(self) -> int:
        return self.bands.shape[0]

    def take(self, index: torch.Tensor) -> PromptMetadata:
        """The rows ``index`` (e.g. each group's prompt)."""
        return PromptMetadata(
            self.bands[index],
            self.profiled[index],
            self.invalid[index],
            self.target[index],
            {name: values[index] for name, values in self.columns.items()},
        )


@dataclass
class GroupMetadata:
    """Per-group tensors the algorithms read: ``bands[channel]`` (G, 3) merged over the global defaults
    (NaN rows: no band); the passing profiled lengths' count, sum and sum of squares; the target length
    (NaN: none); ``invalid[key]`` (G,) for the parts the config reads; ``columns``: the term columns read
    (G, width)."""

    bands: dict[str, torch.Tensor]
    profiled_count: torch.Tensor
    profiled_sum: torch.Tensor
    profiled_sum_sq: torch.Tensor
    invalid: dict[str, torch.Tensor]
    target: torch.Tensor
    columns: dict[str, torch.Tensor] = field(default_factory=dict)

    def profiled_threshold(self, n_std: torch.Tensor, min_samples: torch.Tensor) -> torch.Tensor:
        """mean + n_std * sample std of the passing profiled lengths, NaN below ``min_samples`` (§2.10).

        The variance is ``(n * sum(x^2) - sum(x)^2) / (n (n - 1))``: exact for integer lengths up to
        ``MAX_LENGTH``, hence the correctly rounded value of ``statistics.variance``.
        """
        n = self.profiled_count.double()
        mean = self.profiled_sum / n
        variance = (n * self.profiled_sum_sq - self.profiled_sum**2) / (n * (n - 1))
        std = torch.where(n > 1, variance.clamp(min=0).sqrt(), torch.zeros_like(n))
        return (mean + n_std * std).masked_fill(n < min_samples, math.nan)


def merge_group_metadata(
    prompts: PromptMetadata | None,
    global_bands: Mapping[str, ProfileBandChannel],
    num_groups: int,
    read_bands: bool = True,
    read_profiles: bool = True,
    read_target: bool = True,
    read_columns: Collection[str] = (),
) -> GroupMetadata:
    """Each group's bands merged over ``global_bands`` per channel (the row's channel wins, §2.12); only
    the parts asked for are read (and flagged), term columns by name. ``prompts`` holds one row per group,
    or None."""
    prompts = PromptMetadata.empty(num_groups) if prompts is None else prompts
    bands, invalid = {}, {}
    for i, channel in enumerate(BAND_CHANNELS):
        band = global_bands.get(channel)
        default = (band.a, band.b, band.f) if band is not None else (math.nan,) * 3
        own = (
            prompts.bands[:, i] if read_bands else torch.full((num_groups, 3), math.nan, dtype=torch.float64)
        )
        absent = torch.isnan(own[:, :1])
        bands[channel] = torch.where(absent, torch.tensor(default, dtype=torch.float64), own)
    reads = {
        PROFILED: read_profiles,
        TARGET: read_target,
        **{name: name in read_columns for name in prompts.columns},
    }
    for column, key in enumerate(metadata_keys()):
        read = reads.get(key, read_bands)
        invalid[key] = prompts.invalid[:, column] if read else torch.zeros(num_groups, dtype=torch.bool)
    columns = {name: prompts.columns[name] for name in read_columns}
    profiled = prompts.profiled if read_profiles else torch.zeros((num_groups, 3), dtype=torch.float64)
    count, total, total_sq = profiled.unbind(1)
    target = prompts.target if read_target else torch.full((num_groups,), math.nan, dtype=torch.float64)
    return GroupMetadata(bands, count.long(), total, total_sq, invalid, target, columns)


# -- per-entry parsers: what is valid ----------------------------------------------------------------------
def _number(value: Any, bools: bool = False) -> float | None:
    """A finite real number as a float, None when ``value`` is not one (a bool only with ``bools``)."""
    if isinstance(value, (np.ndarray, torch.Tensor)):
        if value.ndim != 0 or value.dtype in (np.bool_, torch.bool) and not bools:
            return None
        value = value.item()
    if isinstance(value, (bool, np.bool_)):
        return float(value) if bools else None
    if not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (OverflowError, TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _length(value: Any) -> float | None:
    number = _number(value)
    return number if number is not None and abs(number) <= MAX_LENGTH else None


def _band(block: Any) -> tuple[float, float, float] | None | object:
    """A channel block as ``(a, b, f)``, None when absent, ``_INVALID`` when malformed."""
    if block is None or block is _INVALID:
        return block
    if not isinstance(block, Mapping):
        return _INVALID
    a, b, f = _length(block.get("a")), _length(block.get("b")), _number(block.get("f"))
    if a is None or b is None or f is None or a < 0 or b <= a or not 0 <= f <= 1:
        return _INVALID
    return a, b, f


def _sequence(values: Any) -> list | None:
    """A list, tuple, 1-D numpy array or 1-D tensor as a list; None for anything else."""
    if isinstance(values, (list, tuple)):
        return list(values)
    if isinstance(values, (np.ndarray, torch.Tensor)) and values.ndim == 1:
        return values.tolist()
    return None


def _profile(rewards: Any, lengths: Any) -> np.ndarray | None | object:
    """The passing profiled lengths, None when either list is absent, ``_INVALID`` when malformed."""
    if rewards is None or lengths is None:
        return None
    r, x = _sequence(rewards), _sequence(lengths)
    if r is None or x is None or len(r) != len(x):
        return _INVALID
    r = [_number(value, bools=True) for value in r]
    x = [_length(value) for value in x]
    if None in r or None in x or any(value < 0 for value in x):
        return _INVALID
    return np.array([length for reward, length in zip(r, x, strict=True) if reward > 0], dtype=np.float64)


# -- bulk conversion ----------------------------------------------------------------------------------------
def _only(values: list[Any], *kinds: type) -> bool:
    """Whether each value's type is exactly one of ``kinds`` (a bool is not an int): one C-level pass for the
    types, one count per kind (about 1.5x faster than a set of the types)."""
    types = list(map(type, values))
    remaining = len(types)
    for kind in kinds:
        remaining -= types.count(kind)
        if not remaining:
            break
    return not remaining


def _given(items: list[Any]) -> np.ndarray:
    """(n,) flags: the item is not None (by identity: items may be numpy arrays), one byte per flag at C
    speed."""
    return np.frombuffer(bytearray(map(is_not, items, repeat(None))), dtype=bool)


def _get(mapping: Any, key: str) -> Any:
    """``mapping[key]`` or None; ``_INVALID`` when ``mapping`` is neither a mapping nor None."""
    if mapping is None or mapping is _INVALID:
        return mapping
    return mapping.get(key) if isinstance(mapping, Mapping) else _INVALID


def _columns(items: list[Any], keys: tuple[str, ...]) -> list[list[Any]]:
    """Per key, ``item.get(key)`` of each item (None stays None, a non-mapping gives ``_INVALID``); one
    C-level ``map`` per key when every item is a dict."""
    if _only(items, dict):
        return [list(map(dict.get, items, repeat(key))) for key in keys]
    return [[_get(item, key) for item in items] for key in keys]


def _integers(values: list[Any]) -> np.ndarray | None:
    """Plain integers as float64 at C speed (``bytes`` for 0..255, else ``struct``); None otherwise."""
    try:
        return np.frombuffer(bytes(values), dtype=np.uint8).astype(np.float64)
    except (TypeError, ValueError):  # not all integers in 0..255
        pass
    try:
        packed = struct.pack(f"{len(values)}q", *values)
    except (struct.error, OverflowError):  # a float, a string, an integer beyond int64, ...
        return None
    return np.frombuffer(packed, dtype=np.int64).astype(np.float64)


def _plain_numbers(values: list[Any]) -> np.ndarray | None:
    """Values that are all plain ints or floats (no bool) as float64; None for anything else."""
    if not _only(values, int, float):
        return None
    converted = _integers(values)
    if converted is None:
        try:
            converted = np.array(values, dtype=np.float64)
        except OverflowError:  # an integer beyond float range
            return None
    return converted


def _channel_bands(blocks: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(n, 3) ``a, b, f`` (NaN where absent or malformed) and (n,) malformed flags."""
    n = len(blocks)
    values = np.full((n, 3), math.nan)
    bad = np.zeros(n, dtype=bool)
    flags = _given(blocks)
    if not flags.any():
        return values, bad
    present, given_blocks = np.flatnonzero(flags), blocks if flags.all() else list(compress(blocks, flags))
    if _only(given_blocks, dict):
        fields = list(chain.from_iterable(map(dict.get, given_blocks, repeat(key)) for key in "abf"))
        if _only(fields, int, float):  # no bool, string, array or missing value
            try:
                given = np.frombuffer(struct.pack(f"{len(fields)}d", *fields), dtype=np.float64)
            except (
                OverflowError,
                struct.error,
            ):  # an integer beyond float range: the per-entry path flags it
                given = None
            if given is not None:
                a, b, f = given = given.reshape(3, -1)
                good = (np.abs(given[:2]) <= MAX_LENGTH).all(0) & np.isfinite(f)
                good &= (a >= 0) & (b > a) & (f >= 0) & (f <= 1)
                values[present[good]] = given.T[good]
                bad[present[~good]] = True
                return values, bad
    parsed = [_band(block) for block in blocks]
    for i, p in enumerate(parsed):
        if p is _INVALID:
            bad[i] = True
        elif p is not None:
            values[i] = p
    return values, bad


def _flat_profiles(rewards: list[Any], lengths: list[Any], present: np.ndarray) -> tuple | None:
    """The bulk path of :func:`_profiles` for lists of plain numbers; None when it does not apply."""
    if not (_only(rewards, list, tuple) and _only(lengths, list, tuple)):
        return None
    sizes = list(map(len, rewards))
    if sizes != list(map(len, lengths)):
        return None
    flat_r = _plain_numbers(list(chain.from_iterable(rewards)))
    flat_x = None if flat_r is None else _plain_numbers(list(chain.from_iterable(lengths)))
    if flat_x is None:
        return None
    owner = np.repeat(np.flatnonzero(present), sizes)
    good = np.isfinite(flat_r) & np.isfinite(flat_x) & (flat_x >= 0) & (flat_x <= MAX_LENGTH)
    bad, passing = np.zeros(len(present), dtype=bool), flat_r > 0
    if not good.all():
        bad[owner[~good]] = True
        passing &= ~bad[owner]
    return flat_x, owner, passing, bad


def _profiles(rewards: list[Any], lengths: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(n, 3) count, sum and sum of squares of the passing profiled lengths, and (n,) malformed flags."""
    n = len(rewards)
    present = _given(rewards) & _given(lengths)
    given_r, given_x = (
        (rewards, lengths)
        if present.all()
        else (list(compress(rewards, present)), list(compress(lengths, present)))
    )
    flat = _flat_profiles(given_r, given_x, present)
    if flat is None:  # anything but lists of plain numbers: one entry at a time
        parsed = [_profile(r, x) for r, x in zip(rewards, lengths, strict=True)]
        kept = [p if isinstance(p, np.ndarray) else np.empty(0) for p in parsed]
        flat_x = np.concatenate(kept) if kept else np.empty(0)
        owner = np.repeat(np.arange(n), list(map(len, kept)))
        flat = flat_x, owner, np.ones(flat_x.size, dtype=bool), np.array([p is _INVALID for p in parsed])
    flat_x, owner, passing, bad = flat
    x = np.where(passing, flat_x, 0.0)
    stats = np.stack(
        [
            np.bincount(owner, weights=passing, minlength=n),
            np.bincount(owner, weights=x, minlength=n),
            np.bincount(owner, weights=x * x, minlength=n),
        ],
        axis=1,
    )
    return stats, bad.astype(bool)


def _targets(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(n,) target lengths (NaN where absent or malformed) and (n,) malformed flags (§2.20)."""
    given = _given(values)
    targets = np.full(len(values), math.nan)
    present = list(compress(values, given))
    numbers = _plain_numbers(present)
    if numbers is None:  # not all plain ints and floats: one value at a time
        numbers = np.array([math.nan if (x := _length(v)) is None else x for v in present], dtype=np.float64)
    good = (numbers > 0) & (numbers <= MAX_LENGTH)  # NaN and infinities fail
    targets[np.flatnonzero(given)[good]] = numbers[good]
    bad = given.copy()
    bad[given] = ~good
    return targets, bad


def _unknown_channels(blocks: list[Any]) -> np.ndarray:
    """(n,) flags: a band mapping with a key other than the three channel names (dicts and None: one C-level
    pass over the keys when none is unknown)."""
    plain = _only(blocks, dict, type(None))
    if plain and set(chain.from_iterable(filter(None, blocks))) <= _BAND_KEYS:  # ({} has no keys anyway)
        return np.zeros(len(blocks), dtype=bool)
    return np.fromiter(
        (isinstance(b, Mapping) and not b.keys() <= _BAND_KEYS for b in blocks), dtype=bool, count=len(blocks)
    )


@single_threaded()
def parse_prompt_metadata(entries: Sequence[Any]) -> PromptMetadata:
    """Parse one metadata entry per prompt (a mapping or None); never raises on malformed entries."""
    entries = list(entries)
    table = PromptMetadata.empty(len(entries))
    if not entries or not _given(entries).any():
        return table
    keys = (PROFILE_BAND, PROFILED_REWARDS, PROFILED_OUTPUT_LENGTHS, TARGET)
    blocks, rewards, lengths, targets = _columns(entries, keys)
    invalid = np.zeros((len(entries), len(metadata_keys())), dtype=bool)
    for i, channel_blocks in enumerate(_columns(blocks, BAND_CHANNELS)):
        values, invalid[:, i] = _channel_bands(channel_blocks)
        table.bands[:, i] = torch.from_numpy(values)
    stats, invalid[:, METADATA_KEYS.index(PROFILED)] = _profiles(rewards, lengths)
    invalid[:, METADATA_KEYS.index(CHANNEL_NAME)] = _unknown_channels(blocks)
    target, invalid[:, METADATA_KEYS.index(TARGET)] = _targets(targets)
    table.target = torch.from_numpy(target)
    table.profiled = torch.from_numpy(stats)
    for offset, column in enumerate(prompt_columns(), len(METADATA_KEYS)):
        (values,) = _columns(entries, (column.name,))
        parsed, invalid[:, offset] = column.read(values, malformed=_INVALID)
        table.columns[column.name] = torch.from_numpy(parsed)
    table.invalid = torch.from_numpy(invalid)
    return table


class MetadataCache:
    """Parsed metadata by prompt key: each prompt is parsed the first time its key is seen, then looked up
    (reference §2.14). Bounded: past ``max_prompts`` keys the cache starts afresh (a host streaming prompts
    re-parses at most once per ``max_prompts`` new prompts). ``parsed`` counts the entries parsed so far."""

    def __init__(self, max_prompts: int = 1 << 20):
        if max_prompts < 1:
            raise ValueError(f"max_prompts must be >= 1, got {max_prompts}")
        self.max_prompts = max_prompts
        self.parsed = 0
        self._rows: dict[Hashable, int] = {}
        self._table = PromptMetadata.empty(0)

    def __len__(self) -> int:
        return len(self._rows)

    @single_threaded()
    def lookup(
        self, keys: Sequence[Hashable], fetch: Callable[[list[Hashable]], Sequence[Any]]
    ) -> PromptMetadata:
        """The metadata of each key; ``fetch(new_keys)`` returns the entries of keys not seen before."""
        new = [key for key in dict.fromkeys(keys) if key not in self._rows]
        if len(self._rows) + len(new) > self.max_prompts:
            self._rows, self._table = {}, PromptMetadata.empty(0)
            new = list(dict.fromkeys(keys))
        if new:
            entries = fetch(new)
            if len(entries) != len(new):
                raise ValueError(f"fetch returned {len(entries)} metadata entries for {len(new)} prompts")
            self._store(new, parse_prompt_metadata(entries))
        index = torch.from_numpy(
            np.fromiter(map(self._rows.__getitem__, keys), dtype=np.int64, count=len(keys))
        )
        return self._table.take(index)

    def _store(self, keys: list[Hashable], parsed: PromptMetadata) -> None:
        """Append the parsed rows; the table's capacity doubles when full (amortized linear cost)."""
        start = len(self._rows)
        end = start + len(keys)
        if end > len(self._table):
            grown = PromptMetadata.empty(max(end, 2 * len(self._table)))
            for old, new in zip(_parts(self._table), _parts(grown), strict=True):
                new[:start] = old[:start]
            self._table = grown
        for table, rows in zip(_parts(self._table), _parts(parsed), strict=True):
            table[start:end] = rows
        self._rows.update(zip(keys, range(start, end), strict=True))
        self.parsed += len(keys)


def _parts(table: PromptMetadata) -> list[torch.Tensor]:
    """The table's tensors, the term columns in name order."""
    return [
        table.bands,
        table.profiled,
        table.invalid,
        table.target,
        *(table.columns[k] for k in sorted(table.columns)),
    ]
