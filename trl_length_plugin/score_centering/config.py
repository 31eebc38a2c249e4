"""The score-centering keys every host shares, and the load-time rules every host applies to its own keys
(docs/reference/score-centering.md §5.5, §5.7, §5.8).

:class:`ScoreCenteringConfig` validates the top-k count, the mode, ``force_on_policy_ratio`` and the adaptive
controller's keys together. A host describes its importance-sampling setting in the plugin's terms
(:class:`HostWeights`, with its key names) and :func:`resolve_mode` resolves ``auto`` and the bounds; the
bound, clip, sampling-filter, vocabulary and engine-cap rules take the host's key names, so every error is
the host's own one line and no host rewrites it. :class:`ScoreCenteringPlanBase` is what every host's resolved
plan holds. Needs only pydantic (``transformers``, which every host has, to read a model's vocabulary size).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
        description="auto, or a registered mode (score_centering.modes: off | is | tis | icepop | "
        "adaptive-ppo-clip); auto derives it from the host's importance-sampling keys (reference §5.5).",
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


@dataclass(frozen=True)
class HostWeights:
    """A host's importance-sampling setting in the plugin's terms (reference §5.5, §5.7), in the host's keys."""

    derived: str
    """The mode the host's own sampled-token weights apply: ``off``, ``tis`` or ``icepop``."""
    carries_written: bool
    """Whether the sampled-token weights the plugin writes (a mode's ``written``) can take the place of the host's."""
    needs: Callable[[str], str]
    """For a mode this setting refuses: what it needs, in the host's keys (the error's tail)."""
    bounds: Callable[[str], tuple[float, float]]
    """tis's or icepop's bounds from the host's keys, checked (:func:`check_is_bounds`)."""
    clip: tuple[Any, Any, str, str]
    """The base loss's clip ``(low, high, low_key, high_key)``: adaptive-ppo-clip's lo and hi."""


def resolve_mode(
    config: ScoreCenteringConfig, host: HostWeights
) -> tuple[str, tuple[float, float] | None, float | None]:
    """The mode (``auto``: the host's), its bounds and the outer bound (reference §5.5, §5.7), for every host;
    a mode the host's setting cannot run is refused naming what it needs."""
    wanted = config.score_centering_importance_sampling
    mode = host.derived if wanted == "auto" else wanted
    spec = get_mode(mode)
    if mode != host.derived and not (spec.written and host.carries_written):
        raise ValueError(f"score_centering_importance_sampling: {mode!r} {host.needs(mode)}")
    if spec.bounds == "host":
        return mode, host.bounds(mode), None
    if spec.bounds == "clip":
        return mode, *adaptive_ppo_clip_bounds(config, *host.clip)
    return mode, None, None


@dataclass(frozen=True)
class ScoreCenteringPlanBase:
    """What every host resolves (reference §5.2, §5.5, §5.7): K, the mode and its bounds (adaptive-ppo-clip:
    (lo, hi) before the offset k), the outer bound, the detached on-policy ratio and sampler replay. Built once,
    by :func:`resolve_plan`, after every check; a host's plan adds its own fields and :attr:`detail`, the host's
    part of :meth:`summary`."""

    top_k: int
    mode: str
    bounds: tuple[float, float] | None
    outer_bound: float | None
    force_on_policy: bool
    replay: bool = False

    @property
    def writes_weights(self) -> bool:
        """No host has the mode's sampled-token weights (``is``, the adaptive filter): the plugin writes them."""
        return get_mode(self.mode).written

    @property
    def uses_controller(self) -> bool:
        """The adaptive controller steps the mode's offset k (reference §5.7)."""
        return get_mode(self.mode).controller

    def bounds_at(self, k: float) -> tuple[float, float] | None:
        """The bounds for this step: a controller mode's (lo, hi + k), the mode's own bounds otherwise."""
        if not self.uses_controller:
            return self.bounds
        return self.bounds[0], self.bounds[1] + k

    @property
    def detail(self) -> str:
        raise NotImplementedError

    def summary(self) -> str:
        """One line saying what runs, for the setup log."""
        mode = self.mode
        if self.bounds is not None:
            offset = " + k" if self.uses_controller else ""
            mode += f" in [{self.bounds[0]:g}, {self.bounds[1]:g}{offset}]"
        parts = [f"K={self.top_k}", f"mode {mode}", self.detail]
        if self.force_on_policy:
            parts.append("on-policy ratio")
        return "score centering: " + ", ".join(parts)


@dataclass(frozen=True)
class HostSettings:
    """What score centering's plan reads of a host's settings, in the host's keys (reference §5.2, §5.5, §5.7)."""

    weights: HostWeights
    """The host's importance-sampling setting in the plugin's terms."""
    clip: Mapping[str, Any]
    """The base loss's clip keys as the host sets them, and the low and high key that bound it (``clip_keys``)."""
    clip_keys: tuple[str, str]
    engine_cap: tuple[Any, str]
    """vLLM's ``max_logprobs`` as the host sets it (None: unset), and its key."""
    sampling: Mapping[str, Any]
    """``temperature``, ``top_k``, ``top_p``, ``min_p`` as the host samples, and each one's key (``sampling_keys``,
    ``logprobs_mode`` included)."""
    sampling_keys: Mapping[str, str]
    logprobs_mode: str = "processed_logprobs"
    replay_supported: bool = False
    """Whether the host can renormalize over the sampler's kept set when a filter is on (sampler replay)."""
    sequence_ratio: str | None = None
    """The host setting that makes the base loss's ratio per sequence (``key: value``), or None."""
    one_update_per_batch: str | None = None
    """None when the host runs one optimizer update per rollout batch; else what it sets instead, in its keys."""


def resolve_plan(config: ScoreCenteringConfig, host: HostSettings, plan: type, **host_fields: Any):
    """The one frozen plan of a run (a ``plan`` subclass of :class:`ScoreCenteringPlanBase` with the host's
    ``host_fields``), after every check the core makes on the host's settings, in this order: the base loss's
    ratio is per token, its clip range, vLLM's logprob cap, the sampling settings (sampler replay), the mode and
    its bounds, one update per rollout batch under ``force_on_policy_ratio`` (reference §5.2, §5.5, §5.7). Every
    error is one line naming the host's key; the host makes its own checks before."""
    from trl_length_plugin.score_centering.sampling_request import check_sampling_settings

    top_k = config.score_centering_top_k
    if host.sequence_ratio is not None:
        refuse_sequence_ratio(host.sequence_ratio)
    check_base_clip(config, dict(host.clip), *host.clip_keys)
    cap, cap_key = host.engine_cap
    check_engine_cap(cap, top_k, cap_key)
    replay = check_sampling_settings(
        host.sampling, top_k, host.sampling_keys, logprobs_mode=host.logprobs_mode,
        replay_supported=host.replay_supported,
    )  # fmt: skip
    mode, bounds, outer = resolve_mode(config, host.weights)
    if config.force_on_policy_ratio and host.one_update_per_batch is not None:
        raise ValueError(
            f"force_on_policy_ratio: needs one optimizer update per rollout batch: {host.one_update_per_batch}"
        )
    return plan(top_k, mode, bounds, outer, config.force_on_policy_ratio, replay, **host_fields)
