"""The score-centering keys every host shares, and the load-time rules every host applies to its own keys
(docs/reference/score-centering.md §5.5, §5.7, §5.8).

:class:`ScoreCenteringConfig` validates the top-k count, the mode, ``force_on_policy_ratio`` and the adaptive
controller's keys together. The bound, clip, sampling-filter, vocabulary and engine-cap rules take the host's
key names, so every error is the host's own one line and no host rewrites it; ``plan.resolve_plan`` applies
them to a host's settings in one order. Needs only pydantic (``transformers``, which every host has, to read a
model's vocabulary size).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, NoReturn

from pydantic import BaseModel, BeforeValidator, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from trl_length_plugin.config_base import STRICT, config_error, did_you_mean, not_bool
from trl_length_plugin.score_centering.modes import AUTO, get_mode, mode_names
from trl_length_plugin.shaping.fields import MAX_WEIGHT, Bounded, Count


def _registered(value: Any) -> str:
    """``auto`` or a registered importance-sampling mode (``score_centering.modes``), else pydantic's own
    message for a choice."""
    names = (AUTO, *mode_names())
    if isinstance(value, str) and value in names:
        return value
    expected = ", ".join(map(repr, names[:-1])) + f" or {names[-1]!r}"
    raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})


Mode = Annotated[str, BeforeValidator(_registered)]
#: the largest K: the capture holds token ids as int32 (``capture.py``), so no vocabulary the engine returns
#: heads of, and no K, is larger (reference §5.8); checked when the config is built, before the vocabulary
MAX_TOP_K = 2**31 - 1


class ScoreCenteringConfig(BaseModel):
    """``score_centering`` and its keys (reference §5.5, §5.7, §5.8); field names are the keys a user writes,
    descriptions their help."""

    model_config = STRICT

    score_centering: bool = Field(
        False,
        description="Add the score-centering correction A * C to the loss, from the vLLM sampler's top-k head "
        "(docs/reference/score-centering.md §5). Needs use_vllm.",
    )
    score_centering_top_k: Annotated[Count, Field(le=MAX_TOP_K)] = Field(
        0, description="K, the candidates captured per generated token (required >= 1 with score_centering)."
    )
    score_centering_importance_sampling: Mode = Field(
        "auto",
        description=f"auto, or a registered mode (score_centering.modes: {' | '.join(mode_names())}); auto "
        "derives it from the host's importance-sampling keys (reference §5.5).",
    )
    force_on_policy_ratio: bool = Field(
        False, description="The sampled-token ratio uses the detached current policy (reference §5.5)."
    )
    score_centering_adaptive_outer_bound: Annotated[
        float, Field(gt=0, le=MAX_WEIGHT), BeforeValidator(not_bool)
    ] = Field(10.0, description="adaptive-ppo-clip's outer bound o, above 1 + epsilon_high (§5.7).")
    score_centering_adaptive_k_init: Bounded = Field(
        0.0, description="adaptive-ppo-clip's initial offset k (§5.7)."
    )
    score_centering_adaptive_target: Annotated[float, Field(gt=0, lt=1), BeforeValidator(not_bool)] = Field(
        0.02, description="adaptive-ppo-clip's target clip fraction, in (0, 1) (§5.7)."
    )
    score_centering_adaptive_k_delta: Annotated[
        float, Field(gt=0, le=MAX_WEIGHT), BeforeValidator(not_bool)
    ] = Field(0.05, description="adaptive-ppo-clip's step of k per optimizer step (§5.7).")
    score_centering_adaptive_k_min: Bounded = Field(0.0, description="Lower bound of k (§5.7).")
    score_centering_adaptive_k_max: Bounded = Field(1.0, description="Upper bound of k (§5.7).")

    @model_validator(mode="after")
    def _dependent_keys(self) -> ScoreCenteringConfig:
        k = self.score_centering_top_k
        if self.score_centering and k < 1:
            raise ValueError("score_centering_top_k: required (>= 1) with score_centering: true")
        if not self.score_centering:
            given = [key for key in self.model_fields_set if key != "score_centering" and getattr(self, key)]
            if k > 0 or given:
                raise ValueError(f"{sorted(given)[0]}: needs score_centering: true")
        mode = self.score_centering_importance_sampling
        adaptive = mode != AUTO and get_mode(mode).controller
        if adaptive and not self.force_on_policy_ratio:
            raise ValueError(f"score_centering_importance_sampling: {mode} needs force_on_policy_ratio: true")
        controller = sorted(self.model_fields_set & set(CONTROLLER_KEYS))
        if controller and not adaptive:
            modes = " or ".join(name for name in mode_names() if get_mode(name).controller)
            raise ValueError(
                f"{controller[0]}: a key of the {modes} controller; set score_centering_importance_sampling: "
                f"{modes}"
            )
        low, high = self.score_centering_adaptive_k_min, self.score_centering_adaptive_k_max
        if high < low:
            raise ValueError(
                f"score_centering_adaptive_k_max: must be >= score_centering_adaptive_k_min ({low})"
            )
        if not low <= self.score_centering_adaptive_k_init <= high:
            raise ValueError(f"score_centering_adaptive_k_init: must lie in [k_min, k_max] = [{low}, {high}]")
        return self

    @property
    def enabled(self) -> bool:
        return self.score_centering


#: the keys of ``ScoreCenteringConfig``, as a user writes them
SCORE_CENTERING_KEYS = tuple(ScoreCenteringConfig.model_fields)
#: the keys of the adaptive-ppo-clip controller (reference §5.7)
CONTROLLER_KEYS = tuple(key for key in SCORE_CENTERING_KEYS if key.startswith("score_centering_adaptive_"))


def load_score_centering_config(values: Mapping[str, Any]) -> ScoreCenteringConfig:
    """The shared keys from a host's settings (``values``: key -> plain value; any other key is ignored, but
    a ``score_centering*`` key that is not one of them is refused with a hint), validated; an error is one
    line naming the key (reference §5.5)."""
    unknown = [
        key for key in values if str(key).startswith("score_centering") and key not in SCORE_CENTERING_KEYS
    ]
    if unknown:
        hint = (
            did_you_mean(unknown[0], SCORE_CENTERING_KEYS)
            or f"; expected one of {', '.join(SCORE_CENTERING_KEYS)}"
        )
        raise ValueError(f"{unknown[0]}: unknown score-centering key{hint}")
    try:
        return ScoreCenteringConfig.model_validate(
            {key: values[key] for key in SCORE_CENTERING_KEYS if key in values}
        )
    except ValidationError as err:
        raise ValueError(config_error(err)) from None


def _finite(value, key: str) -> float:
    """A real, finite number (not a boolean), else an error naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{key}: must be a finite number, got {value!r}")
    return float(value)


def check_is_bounds(low, high, low_key: str, high_key: str) -> tuple[float, float]:
    """tis/icepop's bounds ``(lo, hi)``, checked at load time (reference §5.5): finite with ``0 <= lo < hi``
    (``hi <= lo`` would clip every ratio to one value or mask every token, so the term vanishes)."""
    lo, hi = _finite(low, low_key), _finite(high, high_key)
    if lo < 0:
        raise ValueError(f"{low_key}: the importance-sampling lower bound must be >= 0, got {lo:g}")
    if hi <= lo:
        raise ValueError(
            f"{high_key}: the importance-sampling upper bound must be above {low_key} = {lo:g}, got {hi:g}"
        )
    return lo, hi


def adaptive_ppo_clip_bounds(
    config: ScoreCenteringConfig, low: float, high: float, low_key: str, high_key: str
) -> tuple[tuple[float, float], float]:
    """adaptive-ppo-clip's ``(lo, hi) = (1 - low, 1 + high)`` from a host's clip keys and the outer bound
    (reference §5.7), checked at load time for every k the controller can reach: finite keys, ``lo >= 0``,
    ``hi + k_min > lo`` and an outer bound above hi (errors name the key)."""
    lo, hi = 1.0 - _finite(low, low_key), 1.0 + _finite(high, high_key)
    if lo < 0:
        raise ValueError(
            f"{low_key}: adaptive-ppo-clip's lower bound lo = 1 - {low_key} must be >= 0, got {lo:g}"
        )
    k_min = config.score_centering_adaptive_k_min
    if hi + k_min <= lo:
        key = "score_centering_adaptive_k_min" if k_min < 0 else high_key
        raise ValueError(
            f"{key}: adaptive-ppo-clip needs hi + k_min > lo at every k the controller reaches, got "
            f"hi = 1 + {high_key} = {hi:g}, k_min = {k_min:g}, lo = 1 - {low_key} = {lo:g}"
        )
    outer = config.score_centering_adaptive_outer_bound
    if outer <= hi:
        raise ValueError(
            f"score_centering_adaptive_outer_bound: must be above hi = 1 + {high_key} = {hi}, got {outer}"
        )
    return (lo, hi), outer


def check_clip_keys(values: dict[str, float | None]) -> None:
    """The base loss's clip keys a host passes (None: unset) must be finite numbers under score centering."""
    for key, value in values.items():
        if value is not None:
            _finite(value, key)


def check_clip_range(low: float, high: float, low_key: str, high_key: str) -> None:
    """The base loss's ratio clip ``[1 - low, 1 + high]`` (finite keys) must not be empty under score centering:
    with ``1 + high <= 1 - low`` every ratio clips to one constant and positive-advantage tokens get no
    gradient (reference §5.5). adaptive-ppo-clip has its own rule (``adaptive_ppo_clip_bounds``)."""
    if 1.0 + high <= 1.0 - low:
        raise ValueError(
            f"{high_key}: the base loss's clip range [1 - {low_key}, 1 + {high_key}] = [{1.0 - low:g}, "
            f"{1.0 + high:g}] is empty, so positive-advantage tokens would learn nothing"
        )


def check_base_clip(
    config: ScoreCenteringConfig, values: Mapping[str, float | None], low_key: str, high_key: str
) -> None:
    """The base loss's clip keys under score centering (reference §5.5): ``values`` (the host's keys, None:
    unset) finite, the keys in effect (``low_key``, ``high_key``) set, and their clip range not empty, except
    under adaptive-ppo-clip, whose rule is :func:`adaptive_ppo_clip_bounds`."""
    check_clip_keys(values)
    low, high = _finite(values[low_key], low_key), _finite(values[high_key], high_key)
    mode = config.score_centering_importance_sampling
    if mode == AUTO or get_mode(mode).bounds != "clip":
        check_clip_range(low, high, low_key, high_key)


def check_top_k_vocabulary(top_k: int, vocab_size: int) -> None:
    """K is at most the model's vocabulary size (reference §5.5); checked when the host knows the model."""
    if top_k > vocab_size:
        raise ValueError(f"score_centering_top_k: {top_k} is above the model's vocabulary size {vocab_size}")


def check_model_vocabulary(top_k: int, model: Any, **options: Any) -> None:
    """:func:`check_top_k_vocabulary` against ``model``'s vocabulary before its weights load: a model object's
    config, or for a path or Hub name only its ``config.json`` (``options``: ``revision``,
    ``trust_remote_code``); skipped when no config can be read (loading the model then fails on its own)."""
    config = getattr(model, "config", None)
    if isinstance(model, str):
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(model, **options)
        except (OSError, ValueError):
            return
    vocab_size = getattr(config.get_text_config(), "vocab_size", None) if config is not None else None
    if vocab_size is not None:
        check_top_k_vocabulary(top_k, vocab_size)


def check_engine_cap(cap, top_k: int, key: str) -> None:
    """A ``max_logprobs`` the config sets (None: unset) is an integer, -1 (no cap) or at least K."""
    if cap is None:
        return
    if isinstance(cap, bool) or not isinstance(cap, int):
        raise ValueError(f"{key}: expected an integer (-1: no cap), got {cap!r}")
    if cap != -1 and cap < top_k:
        raise ValueError(f"{key}: {cap} is below score_centering_top_k={top_k}; raise it or use -1 (no cap)")


#: vLLM's default ``max_logprobs``
VLLM_DEFAULT_MAX_LOGPROBS = 20


def engine_logprob_cap(cap, top_k: int, key: str) -> int:
    """The ``max_logprobs`` a host gives its vLLM engine under score centering: the config's (checked by
    :func:`check_engine_cap`; -1: no cap) or, unset, one that admits K (vLLM's default when K fits in it)."""
    check_engine_cap(cap, top_k, key)
    return max(top_k, VLLM_DEFAULT_MAX_LOGPROBS) if cap is None else cap


def refuse_sequence_ratio(setting: str) -> NoReturn:
    """Score centering's correction is per token: a base loss whose importance ratio is per sequence (GSPO,
    LUSPO, ...) is refused at load; ``setting`` is the host's ``key: value`` (reference §5.5)."""
    raise ValueError(
        f"{setting} uses a per-sequence importance ratio, which score_centering: true does not support (the "
        "correction is per token); use a token-level base loss or set score_centering: false"
    )


def _real(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


#: vLLM's ranges for the sampling filters, as finite-value rules (reference §5.5)
SAMPLING_FILTER_RULES = {
    "top_p": ("a finite number in (0, 1]", lambda v: _real(v) and 0 < v <= 1),
    "min_p": ("a finite number in [0, 1]", lambda v: _real(v) and 0 <= v <= 1),
    "top_k": (
        "a whole number: -1 or 0 (off) or >= 1",
        lambda v: not isinstance(v, bool) and isinstance(v, int) and (v >= -1),
    ),
}


def sampling_filter_error(name: str, value) -> str | None:
    """What is wrong with a sampling filter's value (``top_p``, ``min_p``, ``top_k``; None: unset or valid),
    by vLLM's own ranges; every host checks its filter keys with it at load time."""
    rule, valid = SAMPLING_FILTER_RULES[name]
    if value is None or valid(value):
        return None
    return f"must be {rule}, got {value!r}"


def check_sampling_filters(settings: Mapping[str, Mapping[str, Any]]) -> None:
    """A host's sampling filters in vLLM's ranges (:func:`sampling_filter_error`), at load time with or without
    score centering (reference §5.2): ``settings`` maps a key prefix (``""``, ``"generation_kwargs."``, ...) to
    the filter values under it; the error names ``prefix + name``."""
    for prefix, values in settings.items():
        for name in SAMPLING_FILTER_RULES:
            error = sampling_filter_error(name, values.get(name))
            if error is not None:
                raise ValueError(f"{prefix}{name}: {error}")
