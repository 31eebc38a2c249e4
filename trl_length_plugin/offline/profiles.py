"""Per-prompt profiles and bands from reference rollouts (docs/profiles.md, ``trl-length profile``): the
three metadata fields of docs/reference/length-penalties.md §2.14, and on request the target length of §2.20.

- ``profiled_rewards``: every rollout's correctness reward, in file order;
- ``profiled_output_lengths``: every rollout's total length (reasoning + answer, §2.5), same order;
- ``profile_band``: per channel of a rule ``channel=QA,QB,F``, over the prompt's passing rollouts
  (reward > 0, as §2.10 counts them) with at least ``min_passing`` of them: ``a`` = the ``QA`` quantile
  of their channel lengths, ``b`` = the ``QB`` quantile, ``f`` = ``F``. Quantiles interpolate linearly
  between order statistics (position ``(n - 1) * q`` of the sorted lengths, numpy's default). A band with
  ``b <= a`` (the lengths too close) is not written;
- ``target_length`` (with a rule ``[channel=]Q``, channel default ``total``): the ``Q`` quantile of the
  prompt's passing channel lengths, same quantiles and same ``min_passing``, rounded to the nearest integer
  (halves to even) and at least 1; None for a prompt with fewer passing rollouts.

Memory: 32 bytes per rollout (prompt index, reward, reasoning and answer length) plus the prompt keys
while reading, then about as much again for the sorted copies and the Arrow columns written; no completion
and no Python object per rollout is held.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from trl_length_plugin.shaping.columns import PROFILE_BAND, PROFILED_OUTPUT_LENGTHS, PROFILED_REWARDS, TARGET
from trl_length_plugin.shaping.config import BAND_CHANNELS

DEFAULT_RULE = "total=0.5,0.9,0.8"


@dataclass(frozen=True)
class BandRule:
    """``a`` and ``b`` as quantiles of a channel's passing lengths, ``f`` given."""

    channel: str
    a_quantile: float
    b_quantile: float
    f: float

    @classmethod
    def parse(cls, text: str) -> BandRule:
        """``CHANNEL=QA,QB,F`` with 0 <= QA < QB <= 1 and 0 <= F <= 1 (ValueError otherwise)."""
        channel, _, numbers = text.partition("=")
        if channel not in BAND_CHANNELS:
            raise ValueError(f"{text!r}: the channel must be one of {', '.join(BAND_CHANNELS)}")
        try:
            qa, qb, f = (float(part) for part in numbers.split(","))
        except ValueError:
            raise ValueError(f"{text!r}: expected CHANNEL=QA,QB,F, e.g. {DEFAULT_RULE}") from None
        if not (0 <= qa < qb <= 1 and 0 <= f <= 1):
            raise ValueError(f"{text!r}: needs 0 <= QA < QB <= 1 and 0 <= F <= 1")
        return cls(channel, qa, qb, f)

    def __str__(self) -> str:
        return f"{self.channel}: a = q{self.a_quantile:g}, b = q{self.b_quantile:g}, f = {self.f:g}"


@dataclass(frozen=True)
class TargetRule:
    """The target length as a quantile of a channel's passing lengths (docs/reference/length-penalties.md
    §2.20)."""

    channel: str
    quantile: float

    @classmethod
    def parse(cls, text: str) -> TargetRule:
        """``[CHANNEL=]Q`` with 0 <= Q <= 1, channel default ``total`` (ValueError otherwise)."""
        channel, _, number = text.rpartition("=")
        channel = channel or "total"
        if channel not in BAND_CHANNELS:
            raise ValueError(f"{text!r}: the channel must be one of {', '.join(BAND_CHANNELS)}")
        try:
            q = float(number)
        except ValueError:
            raise ValueError(f"{text!r}: expected [CHANNEL=]Q, e.g. total=0.5") from None
        if not 0 <= q <= 1:
            raise ValueError(f"{text!r}: needs 0 <= Q <= 1")
        return cls(channel, q)

    def __str__(self) -> str:
        return f"{self.channel}: q{self.quantile:g}"


def _quantiles(values: np.ndarray, starts: np.ndarray, counts: np.ndarray, q: float) -> np.ndarray:
    """The ``q`` quantile of each run ``values[starts[i]:starts[i] + counts[i]]`` (sorted, counts > 0)."""
    position = (counts - 1) * q
    low = np.floor(position).astype(np.int64)
    high = np.minimum(low + 1, counts - 1)
    below, above = values[starts + low], values[starts + high]
    return below + (position - low) * (above - below)


@dataclass
class Profiles:
    """The finished metadata per prompt, in first-seen order of ``keys``: the two profile lists as Arrow
    list arrays (no Python object per rollout), the bands; ``with_band`` counts prompts with a band per
    channel, ``no_band`` the reasons per channel for the others."""

    keys: list[str]
    rewards: pa.ListArray
    lengths: pa.ListArray
    bands: list[dict[str, dict[str, float]] | None]
    with_band: Counter[str]
    no_band: dict[str, Counter[str]]
    targets: list[int | None] | None = None

    def columns(self, prompts: list[int | None]) -> dict[str, Any]:
        """The three columns for these prompt indices, in order (None: a row with no profile), and
        ``target_length`` when targets were built."""
        index = pa.array(prompts, type=pa.int64())
        columns = {
            PROFILED_REWARDS: self.rewards.take(index),
            PROFILED_OUTPUT_LENGTHS: self.lengths.take(index),
            PROFILE_BAND: [None if i is None else self.bands[i] for i in prompts],
        }
        if self.targets is not None:
            columns[TARGET] = [None if i is None else self.targets[i] for i in prompts]
        return columns


def _passing_quantiles(
    owner: np.ndarray, lengths: np.ndarray, prompts: int, quantiles: list[float], min_passing: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The prompts with at least ``min_passing`` passing lengths (flags) and, for those, each quantile of
    their lengths (``owner``: each passing length's prompt)."""
    by_length = np.lexsort((lengths, owner))
    owner, lengths = owner[by_length], lengths[by_length].astype(np.float64)
    counts = np.bincount(owner, minlength=prompts)
    first = np.cumsum(counts) - counts
    enough = counts >= min_passing
    return enough, [_quantiles(lengths, first[enough], counts[enough], q) for q in quantiles]


class ProfileBuilder:
    """Collects each rollout's numbers by prompt key, then computes the profiles."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self._prompt, self._reasoning, self._answer = array("q"), array("q"), array("q")
        self._reward = array("d")

    def add(self, key: str, reward: float, reasoning: int, answer: int) -> None:
        self._prompt.append(self.index.setdefault(key, len(self.index)))
        self._reward.append(reward)
        self._reasoning.append(reasoning)
        self._answer.append(answer)

    def __len__(self) -> int:
        return len(self._reward)

    def build(self, rules: list[BandRule], min_passing: int, target: TargetRule | None = None) -> Profiles:
        prompts = len(self.index)
        prompt = np.frombuffer(self._prompt, dtype=np.int64)
        order = np.argsort(prompt, kind="stable")  # by prompt, file order within a prompt
        prompt, reward = prompt[order], np.frombuffer(self._reward)[order]
        channels = {"reasoning": np.frombuffer(self._reasoning, dtype=np.int64)[order]}
        channels["answer"] = np.frombuffer(self._answer, dtype=np.int64)[order]
        channels["total"] = channels["reasoning"] + channels["answer"]
        offsets = pa.array(np.concatenate([[0], np.cumsum(np.bincount(prompt, minlength=prompts))]))
        rewards = pa.ListArray.from_arrays(offsets, pa.array(reward))
        totals = pa.ListArray.from_arrays(offsets, pa.array(channels["total"]))
        bands: list[dict[str, dict[str, float]] | None] = [None] * prompts
        with_band: Counter[str] = Counter()
        no_band: dict[str, Counter[str]] = {}
        passing = reward > 0
        for rule in rules:
            enough, (a, b) = _passing_quantiles(
                prompt[passing],
                channels[rule.channel][passing],
                prompts,
                [rule.a_quantile, rule.b_quantile],
                min_passing,
            )
            reasons = no_band.setdefault(rule.channel, Counter())
            if not enough.all():
                reasons[f"fewer than {min_passing} passing"] = int((~enough).sum())
            for i, a_i, b_i in zip(np.flatnonzero(enough).tolist(), a.tolist(), b.tolist(), strict=True):
                if b_i <= a_i:
                    reasons["b <= a (passing lengths too close)"] += 1
                    continue
                bands[i] = {**(bands[i] or {}), rule.channel: {"a": a_i, "b": b_i, "f": rule.f}}
                with_band[rule.channel] += 1
        targets = None
        if target is not None:
            enough, (values,) = _passing_quantiles(
                prompt[passing], channels[target.channel][passing], prompts, [target.quantile], min_passing
            )
            targets = [None] * prompts
            for i, value in zip(np.flatnonzero(enough).tolist(), np.rint(values).tolist(), strict=True):
                targets[i] = max(1, int(value))
        return Profiles(list(self.index), rewards, totals, bands, with_band, no_band, targets)
