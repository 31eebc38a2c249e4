"""Score centering's keys in a ``LengthPluginGRPOConfig``, resolved at load time into what the TRL trainer
does (docs/reference/score-centering.md §5.2, §5.5, §5.7).

:func:`resolve_plan` makes TRL's own checks (vLLM generation, no tool loop, no capture kwargs), then hands
TRL's settings in the plugin's terms (:func:`host_settings`: the importance-sampling keys, the clip, vLLM's
logprob cap, the sampling filters, the ratio level, the update count) to the core's ``resolve_plan``, which
makes every shared check and builds the one frozen plan; every error names the TRL key.
``LengthPluginGRPOConfig`` calls it; the trainer side is ``score_centering.ScoreCenteringMixin``.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from trl_length_plugin.score_centering import (
    SAMPLING_FILTER_RULES,
    HostSettings,
    HostWeights,
    ScoreCenteringPlanBase,
    check_is_bounds,
    check_sampling_filters,
    get_mode,
)
from trl_length_plugin.score_centering import resolve_plan as core_resolve_plan

TOKEN_MODES = {"token_truncate": "tis", "token_mask": "icepop"}
SEQUENCE_MODES = ("sequence_mask", "sequence_truncate")
#: TRL's ``vllm_importance_sampling_mode`` values (``GRPOConfig``'s documented options)
TRL_IS_MODES = (*TOKEN_MODES, *SEQUENCE_MODES)
#: TRL loss types whose importance ratio is per sequence whatever ``importance_sampling_level`` says
SEQUENCE_RATIO_LOSS_TYPES = ("luspo", "vespo")
#: generation_kwargs that would change what vLLM returns for the head
CAPTURE_KWARGS = ("logprobs", "prompt_logprobs", "logprob_token_ids", "flat_logprobs", "detokenize")


@dataclass(frozen=True)
class ScoreCenteringPlan(ScoreCenteringPlanBase):
    """What the trainer does: the shared plan (K, the mode and its bounds, the outer bound, the on-policy
    ratio, sampler replay). TRL has no ``is`` or ``adaptive-ppo-clip`` mode: the plugin writes those
    sampled-token weights."""

    @property
    def detail(self) -> str:
        return "sampler replay" if self.replay else "full vocabulary"


def _sampling(args) -> dict:
    """The effective sampling settings (``generation_kwargs`` override TRL's own keys)."""
    kwargs = args.generation_kwargs or {}
    names = ("temperature", "top_k", "top_p", "min_p")
    return {name: kwargs.get(name, getattr(args, name)) for name in names}


def check_trl_sampling_filters(args) -> None:
    """TRL's sampling filters and their ``generation_kwargs`` overrides in vLLM's ranges, with or without score
    centering (reference §5.2): a NaN or out-of-range value would fail only in vLLM, after the model loads."""
    own = {name: getattr(args, name) for name in SAMPLING_FILTER_RULES}
    check_sampling_filters({"": own, "generation_kwargs.": args.generation_kwargs or {}})


def _host_weights(args) -> HostWeights:
    """TRL's importance-sampling keys in the plugin's terms (reference §5.5, §5.7): the correction off gives
    ``off``; on, its token-level mode gives tis or icepop, and the plugin's weights replace TRL's ratio."""
    correction, trl_mode = args.vllm_importance_sampling_correction, args.vllm_importance_sampling_mode
    if trl_mode not in TRL_IS_MODES:
        close = difflib.get_close_matches(str(trl_mode).lower(), TRL_IS_MODES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"vllm_importance_sampling_mode: {trl_mode!r} is not one of {', '.join(TRL_IS_MODES)}{hint}"
        )
    if correction and trl_mode in SEQUENCE_MODES:
        raise ValueError(
            f"vllm_importance_sampling_mode: {trl_mode!r} (TRL's default) is sequence-level; score centering needs "
            "a token-level mode: set vllm_importance_sampling_mode: token_truncate (tis) or token_mask (icepop), "
            "or vllm_importance_sampling_correction: false (off)"
        )

    def needs(mode: str) -> str:
        if mode == "off":
            return "needs vllm_importance_sampling_correction: false (TRL would weight the base loss)"
        wanted = next((name for name, value in TOKEN_MODES.items() if value == mode), None)
        if wanted is None and not get_mode(mode).written:  # neither TRL's mode nor weights the plugin writes
            return "is not a mode of TRL's vllm_importance_sampling_mode, and the plugin does not write its weights"
        if not correction:
            return "needs vllm_importance_sampling_correction: true (with a token-level vllm_importance_sampling_mode)"
        return f"needs vllm_importance_sampling_mode: {wanted}, got {trl_mode!r}"

    def bounds(mode: str) -> tuple[float, float]:
        low, high = args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max
        if high is None or (isinstance(high, float) and not math.isfinite(high)):
            raise ValueError(
                f"vllm_importance_sampling_clip_max: {mode} needs a finite upper bound, got {high}"
            )
        low_key, high_key = "vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max"
        return check_is_bounds(0.0 if low is None else low, high, low_key, high_key)

    high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    return HostWeights(
        derived=TOKEN_MODES[trl_mode] if correction else "off",
        carries_written=bool(correction),
        needs=needs,
        bounds=bounds,
        clip=(args.epsilon, high, "epsilon", "epsilon_high"),
    )


def _sequence_ratio(args) -> str | None:
    """The TRL setting that makes the base loss's importance ratio per sequence (reference §5.5): LUSPO, VESPO
    or GSPO."""
    if args.luspo:
        return "luspo: true"
    if args.loss_type in SEQUENCE_RATIO_LOSS_TYPES:
        return f"loss_type: {args.loss_type!r}"
    if args.importance_sampling_level == "sequence":
        return "importance_sampling_level: 'sequence'"
    return None


def _one_update_per_batch(args) -> str | None:
    """None when TRL runs one optimizer update per rollout batch; else what its keys say instead."""
    accumulation, per_generation = args.gradient_accumulation_steps, args.steps_per_generation
    if args.num_iterations == 1 and accumulation % per_generation == 0:
        return None
    return (
        f"num_iterations: 1 and steps_per_generation dividing gradient_accumulation_steps (got num_iterations="
        f"{args.num_iterations}, steps_per_generation={per_generation}, gradient_accumulation_steps={accumulation})"
    )


def host_settings(args) -> HostSettings:
    """TRL's settings that the plan reads, in TRL's keys."""
    return HostSettings(
        weights=_host_weights(args),
        clip={"epsilon": args.epsilon, "epsilon_high": args.epsilon_high},
        clip_keys=("epsilon", "epsilon" if args.epsilon_high is None else "epsilon_high"),
        engine_cap=((args.vllm_engine_kwargs or {}).get("max_logprobs"), "vllm_engine_kwargs.max_logprobs"),
        sampling=_sampling(args),
        sampling_keys={name: name for name in ("temperature", "top_k", "top_p", "min_p")},
        replay_supported=True,
        sequence_ratio=_sequence_ratio(args),
        one_update_per_batch=_one_update_per_batch(args),
    )


def resolve_plan(args) -> ScoreCenteringPlan | None:
    """Check the config and resolve the plan (None when score centering is off); every error names a key."""
    check_trl_sampling_filters(args)
    config = args.score_centering_config
    if not config.enabled:
        return None
    if not args.use_vllm:
        raise ValueError("score_centering: needs use_vllm: true (the sampler's head comes from vLLM)")
    if args.max_tool_calling_iterations is not None:
        raise ValueError(
            "max_tool_calling_iterations: tool-calling loops are not supported with score_centering"
        )
    captured = sorted(set(args.generation_kwargs or {}) & set(CAPTURE_KWARGS))
    if captured:
        raise ValueError(f"generation_kwargs.{captured[0]}: score centering sets what vLLM returns; drop it")
    return core_resolve_plan(config, host_settings(args), ScoreCenteringPlan)
