"""vLLM top-k capture for score centering (``score-centering.md``; docs/reference/score-centering.md §5.2, §5.3, §5.5).

Request preparation and validation, and extraction of the sampler's head from a vLLM ``CompletionOutput``:
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
floored, renormalized or silently dropped. At load time a host checks its sampling keys against the same
request rules with :func:`check_sampling_settings`, whose errors name the host's keys.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch

from trl_length_plugin.score_centering.config import sampling_filter_error

MAX_LOGPROB = 1e-5
MAX_HEAD_MASS = 1.0001
_INT32_MAX = np.iinfo(np.int32).max
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_NEUTRAL_PROCESSORS = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_tokens": 0,
}
_MASKING_PROCESSORS = (
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "structured_outputs",
    "thinking_token_budget",
)

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


def _num_candidates(num_candidates: Any) -> int:
    if isinstance(num_candidates, bool) or not isinstance(num_candidates, int) or num_candidates < 1:
        raise ScoreCenteringCaptureError(
            "num_candidates", f"num_candidates must be a positive int, got {num_candidates!r}"
        )
    return num_candidates


def build_score_centering_request_overrides(
    num_candidates: int, *, api: Literal["chat", "completions", "sampling_params"] = "chat"
) -> dict[str, Any]:
    """Fields to merge into each policy request so vLLM returns its top-``num_candidates`` head.

    ``"chat"``: the OpenAI chat-completions fields ``logprobs=True, top_logprobs=K`` (the document's HTTP
    fields); ``"completions"``: ``/v1/completions``' ``logprobs=K``; ``"sampling_params"``: keyword
    arguments of ``vllm.SamplingParams`` (``logprobs=K``). ``logprob_token_ids`` must stay unset.
    """
    k = _num_candidates(num_candidates)
    if api == "chat":
        return {"logprobs": True, "top_logprobs": k}
    if api in ("completions", "sampling_params"):
        return {"logprobs": k}
    raise ValueError(f"api must be 'chat', 'completions' or 'sampling_params', got {api!r}")


def _field(request: Any, name: str, default: Any = None) -> Any:
    value = request.get(name) if isinstance(request, Mapping) else getattr(request, name, None)
    return default if value is None else value


def validate_score_centering_request(
    request: Any,
    num_candidates: int,
    *,
    logprobs_mode: str = "processed_logprobs",
    sampler_replay: bool = False,
) -> None:
    """Check one request's capture settings before admission (docs/reference/score-centering.md §5.2, §5.5).

    ``request`` is a ``vllm.SamplingParams`` (resolved on the worker: preferred) or a request body mapping
    (chat: ``logprobs``/``top_logprobs``; completions: ``logprobs``). A mapping's missing sampling keys are
    read as vLLM's neutral defaults; with ``vllm serve --generation-config auto`` the server fills them from
    the model's generation config instead, so send them explicitly. ``logprobs_mode`` is the engine's.

    Rejects: non-empty ``logprob_token_ids`` (vLLM would return those ids, not its top-k head), a logprob
    count other than K, a non-positive or non-finite temperature, a logprobs mode other than
    ``processed_logprobs``/``raw_logprobs``, raw logprobs at a temperature other than 1 or with filters or
    distribution-changing processors, a filter value outside vLLM's range (:func:`sampling_filter_error`),
    top-k/top-p/min-p filters without sampler replay, and under replay a
    ``top_k`` larger than K (the head must hold the kept set).
    """
    k = _num_candidates(num_candidates)
    if _field(request, "logprob_token_ids"):
        raise ScoreCenteringCaptureError(
            "logprob_token_ids",
            "requests must omit logprob_token_ids: vLLM would return those ids instead of its top-k head",
        )
    logprobs, top_logprobs = _field(request, "logprobs"), _field(request, "top_logprobs")
    chat_style = isinstance(logprobs, bool) or top_logprobs is not None
    count = (top_logprobs if logprobs is True else None) if chat_style else logprobs
    if isinstance(count, bool) or count != k:
        raise ScoreCenteringCaptureError(
            "logprob_count",
            f"the request asks for {count!r} logprobs per token (logprobs={logprobs!r}, "
            f"top_logprobs={top_logprobs!r}), score centering captures {k}",
        )
    temperature = _field(request, "temperature", 1.0)
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ScoreCenteringCaptureError(
            "temperature", f"temperature must be positive and finite, got {temperature!r}"
        )
    top_k, top_p = _field(request, "top_k", 0), _field(request, "top_p", 1.0)
    min_p = _field(request, "min_p", 0.0)
    for name, value in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p)):
        error = sampling_filter_error(name, value)
        if error is not None:
            raise ScoreCenteringCaptureError("sampling_filter", f"{name} {error}")
    active = {"top_k": top_k not in (0, -1), "top_p": top_p < 1.0, "min_p": min_p > 0.0}
    filters = {
        name: value for name, value in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p)) if active[name]
    }
    if logprobs_mode not in ("processed_logprobs", "raw_logprobs"):
        raise ScoreCenteringCaptureError(
            "logprobs_mode",
            f"logprobs_mode must be 'processed_logprobs' or 'raw_logprobs', got {logprobs_mode!r}",
        )
    if logprobs_mode == "raw_logprobs":
        processors = [
            name for name, neutral in _NEUTRAL_PROCESSORS.items() if _field(request, name, neutral) != neutral
        ] + [name for name in _MASKING_PROCESSORS if _field(request, name)]
        if temperature != 1.0 or filters or processors:
            raise ScoreCenteringCaptureError(
                "logprobs_mode",
                f"raw logprobs describe the sampled distribution only at temperature 1 without filters or "
                f"processors (temperature={temperature}, filters={filters}, processors={processors}); "
                "use logprobs_mode='processed_logprobs'",
            )
    if filters and not sampler_replay:
        raise ScoreCenteringCaptureError(
            "sampling_filter", f"sampling filters {filters} need sampler replay with score centering"
        )
    if sampler_replay and "top_k" in filters and filters["top_k"] > k:
        raise ScoreCenteringCaptureError(
            "sampling_filter",
            f"under sampler replay the head must hold the kept set: top_k={filters['top_k']} > K={k}",
        )


_FILTER_NAMES = ("top_p", "top_k", "min_p")


def check_sampling_settings(
    sampling: Mapping[str, Any],
    top_k: int,
    keys: Mapping[str, str],
    *,
    logprobs_mode: str = "processed_logprobs",
    replay_supported: bool,
) -> bool:
    """A host's sampling settings (``temperature``, ``top_k``, ``top_p``, ``min_p``; None or missing: vLLM's
    neutral value) under :func:`validate_score_centering_request`, at load time (reference §5.2, §5.5); returns
    whether sampler replay runs (``replay_supported`` and a filter on). Errors are ValueErrors naming the host's
    key for each setting (``keys``: setting name -> the host's key, ``logprobs_mode`` included)."""
    values = {name: sampling.get(name) for name in ("temperature", *_FILTER_NAMES)}
    top_k_filter, top_p, min_p = values["top_k"] or 0, _field(values, "top_p", 1.0), values["min_p"] or 0.0
    active = [
        name
        for name, on in zip(_FILTER_NAMES, (top_p < 1.0, top_k_filter > 0, min_p > 0.0), strict=True)
        if on
    ]
    replay = replay_supported and bool(active)
    request = {"logprobs": top_k, **{name: value for name, value in values.items() if value is not None}}
    failed = None
    try:
        validate_score_centering_request(request, top_k, logprobs_mode=logprobs_mode, sampler_replay=replay)
    except ScoreCenteringCaptureError as err:
        failed = err.check
    if failed is None and replay and not 1 <= top_k_filter <= top_k:  # the head must hold the kept set
        failed = "sampling_filter"
    if failed is not None:
        raise ValueError(
            _settings_error(failed, values, top_k, keys, logprobs_mode, active, replay_supported)
        )
    return replay


def _settings_error(
    check: str, values: dict, top_k: int, keys: Mapping[str, str], mode: str, active: list, replay: bool
) -> str:
    """:func:`check_sampling_settings`' one line for a failed request check, in the host's keys."""
    if check == "temperature":
        return f"{keys['temperature']}: score centering needs a positive finite temperature, got {values['temperature']}"
    if check == "sampling_filter" and replay:
        return (
            f"{keys['top_k']}: sampling filters need sampler replay, whose head must hold the kept set: set "
            f"{keys['top_k']} between 1 and score_centering_top_k={top_k} (top_p and min_p only shrink it), got "
            f"top_k={values['top_k'] or 0}"
        )
    if check == "sampling_filter":
        return (
            f"{keys[active[0]]}: sampling filters need sampler replay, which this integration does not do; sample "
            f"with top_p=1.0 top_k=-1 (got top_p={values['top_p']}, top_k={values['top_k']})"
        )
    return (
        f"{keys['logprobs_mode']}: score centering needs the sampler's own probabilities: processed_logprobs "
        f"(raw_logprobs only at temperature 1), got {mode!r}"
    )


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
    k = _num_candidates(num_candidates)
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
    k = _num_candidates(num_candidates)
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
    k = _num_candidates(num_candidates)
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
