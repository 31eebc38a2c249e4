"""Score centering's keys in a ``LengthPluginGRPOConfig``, resolved at load time into what the TRL trainer
does (docs/reference/score-centering.md §5.2, §5.5, §5.7).

:func:`resolve_plan` derives the mode and its bounds from TRL's importance-sampling keys (the core's
``resolve_mode``), sampler replay from TRL's sampling filters, and the on-policy ratio, with every check the
config alone decides; every error names the TRL key. ``LengthPluginGRPOConfig`` calls it; the trainer side
is ``score_centering.ScoreCenteringMixin``.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from trl_length_plugin.score_centering.config import (
    SAMPLING_FILTER_RULES,
    HostWeights,
    ScoreCenteringPlanBase,
    check_base_clip,
    check_engine_cap,
    check_is_bounds,
    check_sampling_filters,
    refuse_sequence_ratio,
    resolve_mode,
)
from trl_length_plugin.score_centering.modes import get_mode
from trl_length_plugin.score_centering.sampling_request import check_sampling_settings

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
    ratio) and sampler replay. TRL has no ``is`` or ``adaptive-ppo-clip`` mode: the plugin writes those
    sampled-token weights."""

    replay: bool = False

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


def _check_token_ratio(args) -> None:
    """The base loss's importance ratio must be per token (reference §5.5): no LUSPO, VESPO or GSPO."""
    if args.luspo:
        refuse_sequence_ratio("luspo: true")
    if args.loss_type in SEQUENCE_RATIO_LOSS_TYPES:
        refuse_sequence_ratio(f"loss_type: {args.loss_type!r}")
    if args.importance_sampling_level == "sequence":
        refuse_sequence_ratio("importance_sampling_level: 'sequence'")


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


def resolve_plan(args) -> ScoreCenteringPlan | None:
    """Check the config and resolve the plan (None when score centering is off); every error names a key."""
    check_trl_sampling_filters(args)
    config = args.score_centering_config
    if not config.enabled:
        return None
    top_k = config.score_centering_top_k
    _check_token_ratio(args)
    high_key = "epsilon" if args.epsilon_high is None else "epsilon_high"
    clip = {"epsilon": args.epsilon, "epsilon_high": args.epsilon_high}
    check_base_clip(config, clip, "epsilon", high_key)
    check_engine_cap(
        (args.vllm_engine_kwargs or {}).get("max_logprobs"), top_k, "vllm_engine_kwargs.max_logprobs"
    )
    if not args.use_vllm:
        raise ValueError("score_centering: needs use_vllm: true (the sampler's head comes from vLLM)")
    if args.max_tool_calling_iterations is not None:
        raise ValueError(
            "max_tool_calling_iterations: tool-calling loops are not supported with score_centering"
        )
    captured = sorted(set(args.generation_kwargs or {}) & set(CAPTURE_KWARGS))
    if captured:
        raise ValueError(f"generation_kwargs.{captured[0]}: score centering sets what vLLM returns; drop it")
    keys = {name: name for name in ("temperature", "top_k", "top_p", "min_p")}
    replay = check_sampling_settings(_sampling(args), top_k, keys, replay_supported=True)
    mode, bounds, outer = resolve_mode(config, _host_weights(args))
    if config.force_on_policy_ratio:
        accumulation, per_generation = args.gradient_accumulation_steps, args.steps_per_generation
        if args.num_iterations != 1 or accumulation % per_generation:
            raise ValueError(
                "force_on_policy_ratio: needs one optimizer update per rollout batch: num_iterations: 1 and "
                f"steps_per_generation dividing gradient_accumulation_steps (got num_iterations="
                f"{args.num_iterations}, steps_per_generation={per_generation}, "
                f"gradient_accumulation_steps={accumulation})"
            )
    return ScoreCenteringPlan(top_k, mode, bounds, outer, config.force_on_policy_ratio, replay=replay)
