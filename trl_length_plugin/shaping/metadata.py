"""Per-prompt metadata as per-group tensors (decisions.md §2.10, §2.12-2.14).

Each group reads the metadata of its first row (the fields are per prompt). A malformed entry is
ignored for that group and channel and reported in ``invalid`` so the caller can warn and count it;
it never raises:

- a ``profile_band`` that is not a mapping, or a channel block that is not a mapping, lacks ``a``,
  ``b`` or ``f``, has a value that is not a finite int/float (bools and strings are not numbers), has
  ``b <= a`` or ``f`` outside [0, 1];
- ``profiled_rewards`` / ``profiled_output_lengths`` (both present) that are not lists or tuples of
  the same length whose values convert to finite floats.

Conversion runs in bulk over the groups (C-level ``map(dict.get, ...)`` columns, one flat list per
field, no Python loop per group); integers, the usual lengths and 0/1 rewards, convert at C speed
through ``bytes`` or ``struct`` and anything else through numpy. The per-entry parsers below define
what is valid and handle batches holding anything but plain dicts, lists and numbers.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import is_not
from typing import Any

import numpy as np
import torch

from .config import BAND_CHANNELS, ProfileBandChannel

PROFILED = "profiled"
METADATA_KEYS = (*BAND_CHANNELS, PROFILED)  # the names ``invalid`` is keyed by
_INVALID = object()  # a malformed entry


@dataclass
class GroupMetadata:
    """Per-group tensors: ``bands[channel]`` is (G, 3) ``a, b, f`` merged over the global defaults (NaN
    rows: no band); ``profiled_*`` describe the passing profiled lengths (count 0: no usable profile);
    ``invalid[key]`` (G,) flags a malformed channel or profile."""

    bands: dict[str, torch.Tensor]
    profiled_count: torch.Tensor
    profiled_sum: torch.Tensor
    profiled_sum_sq: torch.Tensor
    invalid: dict[str, torch.Tensor]

    def profiled_threshold(self, n_std: torch.Tensor, min_samples: torch.Tensor) -> torch.Tensor:
        """mean + n_std * sample std of the passing profiled lengths, NaN below ``min_samples`` (§2.10).

        The variance is ``(n * sum(x^2) - sum(x)^2) / (n (n - 1))``: exact for integer lengths, hence
        the correctly rounded value of ``statistics.variance``.
        """
        n = self.profiled_count.double()
        mean = self.profiled_sum / n
        variance = (n * self.profiled_sum_sq - self.profiled_sum**2) / (n * (n - 1))
        std = torch.where(n > 1, variance.clamp(min=0).sqrt(), torch.zeros_like(n))
        return (mean + n_std * std).masked_fill(n < min_samples, math.nan)


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _get(mapping: Any, key: str) -> Any:
    """``mapping[key]`` or None; ``_INVALID`` when ``mapping`` is neither a mapping nor None."""
    if mapping is None or mapping is _INVALID:
        return mapping
    return mapping.get(key) if isinstance(mapping, Mapping) else _INVALID


def _columns(items: list[Any], keys: tuple[str, ...]) -> list[list[Any]]:
    """Per key, ``item.get(key)`` of each item (None stays None, a non-mapping gives ``_INVALID``); one
    C-level ``map`` per key when every item is a dict."""
    if set(map(type, items)) <= {dict}:
        return [list(map(dict.get, items, repeat(key))) for key in keys]
    return [[item.get(key) if type(item) is dict else _get(item, key) for item in items] for key in keys]


def _given(items: list[Any]) -> np.ndarray:
    """(n,) flags: the item is not None."""
    missing = items.count(None)
    if missing in (0, len(items)):
        return np.full(len(items), missing == 0)
    return np.fromiter(map(is_not, items, repeat(None)), dtype=bool, count=len(items))


def _band(block: Any) -> tuple[float, float, float] | None | object:
    """A channel block as ``(a, b, f)``, None when absent, ``_INVALID`` when malformed."""
    if block is None or block is _INVALID:
        return block
    if not isinstance(block, Mapping):
        return _INVALID
    a, b, f = block.get("a"), block.get("b"), block.get("f")
    if not (_real(a) and _real(b) and _real(f)) or b <= a or not 0 <= f <= 1:
        return _INVALID
    return float(a), float(b), float(f)


def _floats(values: Any) -> np.ndarray | None:
    """A list or tuple of values as a 1-D float64 array, None when it is not one."""
    if not isinstance(values, (list, tuple)):
        return None
    try:
        array = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return array if array.ndim == 1 else None


def _numbers(values: list[Any]) -> np.ndarray | None:
    """``values`` as a 1-D float64 array (the conversion of ``_floats``), None when one does not convert.

    Integers convert at C speed, through ``bytes`` when all are in 0..255 (0/1 rewards), else through
    ``struct``; anything else goes through numpy's per-item conversion (several times slower)."""
    try:
        return np.frombuffer(bytes(values), dtype=np.uint8).astype(np.float64)
    except (TypeError, ValueError):  # not all integers in 0..255
        pass
    try:
        packed = struct.pack(f"{len(values)}q", *values)
    except struct.error:  # a float, a string, an integer beyond int64, ...
        return _floats(values)
    return np.frombuffer(packed, dtype=np.int64).astype(np.float64)


def _profile(rewards: Any, lengths: Any) -> np.ndarray | None | object:
    """The passing profiled lengths, None when either list is absent, ``_INVALID`` when malformed."""
    if rewards is None or lengths is None:
        return None
    r, x = _floats(rewards), _floats(lengths)
    if r is None or x is None or r.size != x.size or not (np.isfinite(r).all() and np.isfinite(x).all()):
        return _INVALID
    return x[r > 0]


def _channel_bands(blocks: list[Any], default: tuple[float, float, float]) -> tuple[np.ndarray, np.ndarray]:
    """(n, 3) ``a, b, f`` (the default where absent or malformed) and (n,) malformed flags."""
    n = len(blocks)
    values = np.tile(np.array(default, dtype=np.float64), (n, 1))
    bad = np.zeros(n, dtype=bool)
    flags = _given(blocks)
    if not flags.any():
        return values, bad
    present, given_blocks = np.flatnonzero(flags), list(compress(blocks, flags))
    if set(map(type, given_blocks)) <= {dict}:
        a, b, f = (list(map(dict.get, given_blocks, repeat(key))) for key in "abf")
        fields = a + b + f
        if set(map(type, fields)) <= {int, float}:  # no bool, string or missing value
            given = np.frombuffer(struct.pack(f"{len(fields)}d", *fields), dtype=np.float64).reshape(3, -1)
            a, b, f = given
            good = np.isfinite(given).all(0) & (b > a) & (f >= 0) & (f <= 1)
            values[present[good]] = given.T[good]
            bad[present[~good]] = True
            return values, bad
    parsed = [_band(block) for block in blocks]
    values = np.array([default if p is None or p is _INVALID else p for p in parsed], dtype=np.float64)
    return values.reshape(-1, 3), np.array([p is _INVALID for p in parsed], dtype=bool)


def _profiles(rewards: list[Any], lengths: list[Any]) -> tuple[np.ndarray, ...]:
    """Per group: count, sum and sum of squares of the passing profiled lengths, and malformed flags."""
    n = len(rewards)
    present = _given(rewards) & _given(lengths)
    given_r, given_x = rewards, lengths
    if not present.all():
        given_r, given_x = list(compress(rewards, present)), list(compress(lengths, present))
    flat = None
    if set(map(type, given_r)) | set(map(type, given_x)) <= {list, tuple}:
        sizes = list(map(len, given_r))
        if sizes == list(map(len, given_x)):
            flat_r = _numbers(list(chain.from_iterable(given_r)))
            flat_x = None if flat_r is None else _numbers(list(chain.from_iterable(given_x)))
            if flat_x is not None:
                owner = np.repeat(np.flatnonzero(present), sizes)
                finite = np.isfinite(flat_r) & np.isfinite(flat_x)
                bad, passing = np.zeros(n, dtype=bool), flat_r > 0
                if not finite.all():
                    bad[owner[~finite]] = True
                    passing &= ~bad[owner]
                flat = flat_x, owner, passing, bad
    if flat is None:  # anything but lists of numbers: one group at a time
        parsed = [_profile(r, x) for r, x in zip(rewards, lengths, strict=True)]
        kept = [p if isinstance(p, np.ndarray) else np.empty(0) for p in parsed]
        flat_x = np.concatenate(kept) if kept else np.empty(0)
        owner = np.repeat(np.arange(n), list(map(len, kept)))
        flat = flat_x, owner, np.ones(flat_x.size, dtype=bool), np.array([p is _INVALID for p in parsed])
    flat_x, owner, passing, bad = flat
    x = np.where(passing, flat_x, 0.0)
    return (
        np.bincount(owner, weights=passing, minlength=n).astype(np.int64),
        np.bincount(owner, weights=x, minlength=n),
        np.bincount(owner, weights=x * x, minlength=n),
        bad.astype(bool),
    )


def group_metadata(
    group_meta: list[Any] | None,
    global_bands: Mapping[str, ProfileBandChannel],
    num_groups: int,
    read_bands: bool = True,
    read_profiles: bool = True,
) -> GroupMetadata:
    """Convert each group's metadata (None: no metadata), merging bands over ``global_bands`` per
    channel (the row's channel wins, §2.12). Only the parts asked for are read."""
    defaults = {
        ch: (band.a, band.b, band.f) if (band := global_bands.get(ch)) is not None else (math.nan,) * 3
        for ch in BAND_CHANNELS
    }
    bands = {
        ch: torch.tensor(defaults[ch], dtype=torch.float64).expand(num_groups, 3) for ch in BAND_CHANNELS
    }
    no_flags = torch.zeros(num_groups, dtype=torch.bool)
    invalid = dict.fromkeys(METADATA_KEYS, no_flags)
    zeros = torch.zeros(num_groups, dtype=torch.float64)
    count, total, total_sq = zeros.long(), zeros, zeros
    if not group_meta or group_meta.count(None) == len(group_meta):
        return GroupMetadata(bands, count, total, total_sq, invalid)

    keys = ("profile_band",) * read_bands + ("profiled_rewards", "profiled_output_lengths") * read_profiles
    columns = dict(zip(keys, _columns(group_meta, keys), strict=True))
    if read_bands:
        blocks = _columns(columns["profile_band"], BAND_CHANNELS)
        for ch, channel_blocks in zip(BAND_CHANNELS, blocks, strict=True):
            values, bad = _channel_bands(channel_blocks, defaults[ch])
            bands[ch], invalid[ch] = torch.from_numpy(values), torch.from_numpy(bad)
    if read_profiles:
        profile = _profiles(columns["profiled_rewards"], columns["profiled_output_lengths"])
        count, total, total_sq, invalid[PROFILED] = map(torch.from_numpy, profile)
    return GroupMetadata(bands, count, total, total_sq, invalid)
