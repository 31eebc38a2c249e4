"""vLLM top-k capture for score centering (``score-centering.md``; docs/reference/score-centering.md §5.2, §5.3, §5.5).

Extraction of the sampler's head from a vLLM ``CompletionOutput`` (the request side, what a request must ask
for and a host's sampling keys, is ``sampling_request``):
CPU ``(ids int32 [T, K], logprobs float32 [T, K])``. vLLM is never imported here (the objects are read by
duck typing), so the core stays framework-free (docs/reference/product.md §1.2).

How vLLM lays out ``logprobs=K`` (checked against vLLM 0.31): every generated position carries the sampled
token followed by the top K in rank order (ranks 1..K).

* ``list[dict[int, Logprob]]`` (default): the dict dedups ids, so a position has K + 1 entries when the
  sampled token is outside the top K and K entries when it is inside.
* ``FlatLogprobs`` (``SamplingParams.flat_logprobs=True``): always K + 1 entries per position, the sampled
  token first, duplicates kept.

The head is taken by rank: the K entries of ranks 1..K, in rank order. In a dict with K + 1 entries that is
every entry but the sampled token's; in the flat layout, entries 1..K of the position. The sampled token's
own logprob is chosen by its id (:func:`extract_sampled_token_logprobs`), never as "the first entry"
(with K > 0, TRL's ``lp[0]`` is the most likely token, not the sampled one).

Every failed check raises :class:`ScoreCenteringCaptureError` naming the check and the position; nothing is
floored, renormalized or silently dropped.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np
import torch

MAX_LOGPROB = 1e-5
MAX_HEAD_MASS = 1.0001
_INT32_MAX = np.iinfo(np.int32).max
_FLOAT32_MAX = float(np.finfo(np.float32).max)
CAPTURE_CHECKS = (
    # request (validate_score_centering_request)
    "num_candidates",
    "logprob_token_ids",
    "logprob_count",
    "temperature",
    "logprobs_mode",
    "sampling_filter",
    # extraction (extract_*_score_centering_samples)
    "logprobs_present",
    "layout",
    "generated_token_count",
    "candidate_count",
    "candidate_ranks",
    "sampled_token",
    "id_range",
    "unique_ids",
    "logprob_float32",
    "logprob_max",
    "head_mass",
)


class ScoreCenteringCaptureError(ValueError):
    """A score-centering capture check failed; ``check`` is one of ``CAPTURE_CHECKS``; ``completion`` is the
    completion's index in its batch when the caller knows it (:meth:`of_completion`)."""

    def __init__(self, check: str, detail: str, position: int | None = None, completion: int | None = None):
        self.check, self.detail, self.position, self.completion = check, detail, position, completion
        where = "" if position is None else f" at generated position {position}"
        of = "" if completion is None else f" of completion {completion}"
        super().__init__(f"score-centering capture check {check!r} failed{where}{of}: {detail}")

    def of_completion(self, completion: int) -> ScoreCenteringCaptureError:
        """The same failure, naming the completion."""
        return ScoreCenteringCaptureError(self.check, self.detail, self.position, completion)


def checked_num_candidates(num_candidates: Any) -> int:
    if isinstance(num_candidates, bool) or not isinstance(num_candidates, int) or num_candidates < 1:
        raise ScoreCenteringCaptureError(
            "num_candidates", f"num_candidates must be a positive int, got {num_candidates!r}"
        )
    return num_candidates


def _first(bad: np.ndarray) -> int:
    """The first generated position where a per-position check fails."""
    rows = bad.reshape(bad.shape[0], -1).any(axis=1)
    return int(np.argmax(rows))


def _checked_head(ids: np.ndarray, logprobs: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The value checks shared by both extractors, then CPU (int32, float32) tensors ``[T, K]``.

    Each check is one whole-array test; the failing position is located only when it fails.
    """
    if ids.size and (ids.min() < 0 or ids.max() > _INT32_MAX):
        t = _first((ids < 0) | (ids > _INT32_MAX))
        raise ScoreCenteringCaptureError(
            "id_range", f"ids must be int32-compatible and >= 0: {ids[t].tolist()}", t
        )
    ids32 = ids.astype(np.int32)
    if ids.shape[1] > 1:
        ordered = np.sort(ids32, axis=1)
        same = ordered[:, 1:] == ordered[:, :-1]
        if same.any():
            t = _first(same)
            raise ScoreCenteringCaptureError("unique_ids", f"duplicate candidate ids {ids[t].tolist()}", t)
    values32 = _checked_logprob_values(logprobs)
    mass = np.exp(values32).sum(axis=1)
    if mass.size and mass.max() > MAX_HEAD_MASS:
        t = int(np.argmax(mass > MAX_HEAD_MASS))
        raise ScoreCenteringCaptureError("head_mass", f"head mass {mass[t]:.6f} exceeds {MAX_HEAD_MASS}", t)
    return torch.from_numpy(ids32), torch.from_numpy(values32)


def _checked_logprob_values(logprobs: np.ndarray) -> np.ndarray:
    """float32-representable (``-inf`` allowed: filtered-out candidates) and no larger than 1e-5; as float32."""
    with np.errstate(over="ignore"):  # an overflow to -inf is detected below
        values32 = logprobs.astype(np.float32)
    if logprobs.size:
        low, high = logprobs.min(), logprobs.max()  # NaN propagates to both
        overflow = low == -math.inf and np.count_nonzero(values32 == -math.inf) != np.count_nonzero(
            logprobs == -math.inf
        )
        if math.isnan(high) or high > _FLOAT32_MAX or -math.inf < low < -_FLOAT32_MAX or overflow:
            t = _first(
                np.isnan(logprobs) | (logprobs == math.inf) | (np.isinf(values32) & np.isfinite(logprobs))
            )
            raise ScoreCenteringCaptureError(
                "logprob_float32",
                f"logprobs must be float32-representable or -inf: {logprobs[t].tolist()}",
                t,
            )
        if high > MAX_LOGPROB:
            t = _first(logprobs > MAX_LOGPROB)
            raise ScoreCenteringCaptureError(
                "logprob_max", f"logprobs must be <= {MAX_LOGPROB}: {logprobs[t].tolist()}", t
            )
    return values32


def _is_flat(logprobs: Any) -> bool:
    return all(
        hasattr(logprobs, name) for name in ("start_indices", "end_indices", "token_ids", "logprobs", "ranks")
    )


def _position_logprobs(output: Any) -> tuple[Any, list[int]]:
    logprobs = getattr(output, "logprobs", None)
    if logprobs is None:
        raise ScoreCenteringCaptureError(
            "logprobs_present", "the output carries no logprobs (request logprobs=K)"
        )
    sampled = list(output.token_ids)
    if len(logprobs) != len(sampled):
        raise ScoreCenteringCaptureError(
            "generated_token_count",
            f"{len(logprobs)} logprob positions for {len(sampled)} generated tokens",
            min(len(logprobs), len(sampled)),
        )
    return logprobs, sampled


def extract_score_centering_samples(output: Any, num_candidates: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's head from a vLLM ``CompletionOutput``: CPU ``(ids int32 [T, K], logprobs float32 [T, K])``.

    Walks ``list[dict[int, Logprob]]`` logprobs one position at a time; ``FlatLogprobs`` go to
    :func:`extract_flat_score_centering_samples` (same checks, same tensors).
    """
    k = checked_num_candidates(num_candidates)
    if _is_flat(getattr(output, "logprobs", None)):
        return extract_flat_score_centering_samples(output, k)
    logprobs, sampled = _position_logprobs(output)
    ids = np.empty((len(sampled), k), dtype=np.int64)
    values = np.empty((len(sampled), k), dtype=np.float64)
    expected_ranks = list(range(1, k + 1))
    for t, (position, token) in enumerate(zip(logprobs, sampled, strict=True)):
        entries = position or {}
        if len(entries) not in (k, k + 1):
            raise ScoreCenteringCaptureError(
                "candidate_count",
                f"{len(entries)} entries, expected {k} or {k + 1} (head + sampled token)",
                t,
            )
        if token not in entries:
            raise ScoreCenteringCaptureError(
                "sampled_token", f"the sampled token {token} has no logprob entry", t
            )
        head = [
            (entry.rank, tid, entry.logprob)
            for tid, entry in entries.items()
            if len(entries) == k or tid != token
        ]
        if any(rank is None for rank, _, _ in head) or sorted(rank for rank, _, _ in head) != expected_ranks:
            raise ScoreCenteringCaptureError(
                "candidate_ranks", f"head ranks {[rank for rank, _, _ in head]} are not 1..{k}", t
            )
        head.sort(key=lambda entry: entry[0])
        ids[t] = [tid for _, tid, _ in head]
        values[t] = [value for _, _, value in head]
    return _checked_head(ids, values)


def _take(values: list, indices: list[int]) -> list:
    """``[values[i] for i in indices]``, gathered in C by ``operator.itemgetter``."""
    if len(indices) < 2:
        return [values[i] for i in indices]
    return list(operator.itemgetter(*indices)(values))


def _flat_entries(output: Any, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sampled ids ``[T]`` and each position's entry ids and logprobs ``[T, K + 1]`` (vLLM's flat layout:
    the sampled token, then ranks 1..K), after the layout checks. One C-level pass over each flat list."""
    flat, sampled = _position_logprobs(output)
    if not _is_flat(flat):
        raise ScoreCenteringCaptureError("layout", f"expected vLLM FlatLogprobs, got {type(flat).__name__}")
    starts = np.asarray(flat.start_indices, dtype=np.int64)
    counts = np.asarray(flat.end_indices, dtype=np.int64) - starts
    bad = counts != k + 1
    if bad.any():
        t = int(np.argmax(bad))
        raise ScoreCenteringCaptureError(
            "candidate_count", f"{counts[t]} entries, expected {k + 1} (sampled token + head)", t
        )
    ids = np.fromiter(flat.token_ids, dtype=np.int64, count=len(flat.token_ids))
    values = np.fromiter(flat.logprobs, dtype=np.float64, count=len(flat.logprobs))
    positions = len(starts)
    if len(ids) == positions * (k + 1) and np.array_equal(starts, np.arange(positions) * (k + 1)):
        ids, values = ids.reshape(positions, k + 1), values.reshape(positions, k + 1)  # contiguous: no gather
    else:
        rows = starts[:, None] + np.arange(k + 1)
        ids, values = ids[rows], values[rows]
    return np.asarray(sampled, dtype=np.int64), ids, values


def extract_flat_score_centering_samples(
    output: Any, num_candidates: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`extract_score_centering_samples` for ``FlatLogprobs``, vectorized over positions with numpy.

    The head is entries 1..K of each position, which vLLM writes in rank order (the rank fields are not
    read); entry 0 must be the sampled token.
    """
    k = checked_num_candidates(num_candidates)
    sampled, ids, values = _flat_entries(output, k)
    bad = ids[:, 0] != sampled
    if bad.any():
        t = int(np.argmax(bad))
        raise ScoreCenteringCaptureError(
            "sampled_token",
            f"the position starts with token {ids[t, 0]}, the sampled token is {sampled[t]}",
            t,
        )
    return _checked_head(ids[:, 1:], values[:, 1:])


def _flat_sampled_logprobs(flat: Any, sampled: list[int]) -> np.ndarray:
    """The logprob of the entry holding the sampled id at each position of ``FlatLogprobs``."""
    tokens = np.asarray(sampled, dtype=np.int64)
    starts = list(flat.start_indices)
    counts = np.asarray(flat.end_indices, dtype=np.int64) - np.asarray(starts, dtype=np.int64)
    first = np.asarray(_take(flat.token_ids, starts), dtype=np.int64)
    if len(first) == len(tokens) and (counts > 0).all() and np.array_equal(first, tokens):
        return np.asarray(_take(flat.logprobs, starts), dtype=np.float64)  # vLLM puts the sampled token first
    offsets = np.cumsum(counts) - counts
    entries = np.repeat(np.asarray(starts, dtype=np.int64) - offsets, counts) + np.arange(int(counts.sum()))
    positions = np.repeat(np.arange(len(starts)), counts)
    hits = np.flatnonzero(
        np.asarray(_take(flat.token_ids, entries.tolist()), dtype=np.int64) == tokens[positions]
    )
    hit_positions, first_hit = np.unique(positions[hits], return_index=True)
    if len(hit_positions) != len(starts):
        t = int(np.argmax(np.isin(np.arange(len(starts)), hit_positions, invert=True)))
        raise ScoreCenteringCaptureError(
            "sampled_token", f"the sampled token {sampled[t]} has no logprob entry", t
        )
    return np.asarray(_take(flat.logprobs, entries[hits[first_hit]].tolist()), dtype=np.float64)


def extract_listed_score_centering_samples(
    sampled_ids: list[int], logprobs: list[list[float]], token_ids: list[list[int]], num_candidates: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The head and the sampled token's logprob from per-position lists without ranks (an OpenAI-style
    completions response: each position holds the sampled token and the top K, deduplicated, in any order).

    Returns CPU ``(ids int32 [T, K], logprobs float32 [T, K], sampled float32 [T])``; the head keeps the
    listed order (descending logprob in vLLM's responses). A position with K + 1 entries drops the sampled
    token's (found by id), one with K keeps all; the value checks are those of the other extractors.
    """
    k = checked_num_candidates(num_candidates)
    if not len(sampled_ids) == len(logprobs) == len(token_ids):
        raise ScoreCenteringCaptureError(
            "generated_token_count",
            f"{len(logprobs)} logprob positions and {len(token_ids)} id positions for {len(sampled_ids)} tokens",
        )
    ids = np.empty((len(sampled_ids), k), dtype=np.int64)
    values = np.empty((len(sampled_ids), k), dtype=np.float64)
    sampled = np.empty(len(sampled_ids), dtype=np.float64)
    for t, (token, row_values, row_ids) in enumerate(zip(sampled_ids, logprobs, token_ids, strict=True)):
        if len(row_ids) != len(row_values) or len(row_ids) not in (k, k + 1):
            raise ScoreCenteringCaptureError(
                "candidate_count",
                f"{len(row_ids)} entries, expected {k} or {k + 1} (head + sampled token)",
                t,
            )
        if token not in row_ids:
            raise ScoreCenteringCaptureError(
                "sampled_token", f"the sampled token {token} has no logprob entry", t
            )
        where = row_ids.index(token)
        sampled[t] = float("nan") if row_values[where] is None else row_values[where]
        keep = [i for i in range(len(row_ids)) if len(row_ids) == k or i != where]
        ids[t] = [row_ids[i] for i in keep]
        values[t] = [float("nan") if row_values[i] is None else row_values[i] for i in keep]
    head_ids, head_logprobs = _checked_head(ids, values)
    return head_ids, head_logprobs, torch.from_numpy(_checked_logprob_values(sampled[:, None])[:, 0].copy())


def extract_sampled_token_logprobs(output: Any) -> torch.Tensor:
    """CPU float32 ``[T]``: each position's logprob of the token actually sampled, chosen by id (docs/reference/score-centering.md §5.3).

    Works on both layouts (the flat one vectorized); the float32 and ``<= 1e-5`` checks apply.
    """
    logprobs, sampled = _position_logprobs(output)
    if _is_flat(logprobs):
        values = _flat_sampled_logprobs(logprobs, sampled)
    else:
        values = np.empty(len(sampled), dtype=np.float64)
        for t, (position, token) in enumerate(zip(logprobs, sampled, strict=True)):
            entry = (position or {}).get(token)
            if entry is None:
                raise ScoreCenteringCaptureError(
                    "sampled_token", f"the sampled token {token} has no logprob entry", t
                )
            values[t] = entry.logprob
    return torch.from_numpy(_checked_logprob_values(values[:, None])[:, 0].copy())
