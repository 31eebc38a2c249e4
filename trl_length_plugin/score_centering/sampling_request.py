"""The request side of score centering's vLLM capture (docs/reference/score-centering.md §5.2, §5.3, §5.5): what
a vLLM request must ask for (``logprobs=K`` of the raw distribution, no processor that changes it) and how a
host's sampling keys are checked against the same rules at load time (:func:`check_sampling_settings`, whose
errors name the host's keys). Every failed check raises ``capture.ScoreCenteringCaptureError``; vLLM is never
imported here."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from trl_length_plugin.score_centering.capture import ScoreCenteringCaptureError, checked_num_candidates
from trl_length_plugin.score_centering.config import sampling_filter_error

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


def build_score_centering_request_overrides(
    num_candidates: int, *, api: Literal["chat", "completions", "sampling_params"] = "chat"
) -> dict[str, Any]:
    """Fields to merge into each policy request so vLLM returns its top-``num_candidates`` head.

    ``"chat"``: the OpenAI chat-completions fields ``logprobs=True, top_logprobs=K`` (the document's HTTP
    fields); ``"completions"``: ``/v1/completions``' ``logprobs=K``; ``"sampling_params"``: keyword
    arguments of ``vllm.SamplingParams`` (``logprobs=K``). ``logprob_token_ids`` must stay unset.
    """
    k = checked_num_candidates(num_candidates)
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
    k = checked_num_candidates(num_candidates)
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
