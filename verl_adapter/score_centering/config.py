"""The score-centering keys of a verl config, validated in the TaskRunner before any worker starts
(docs/reference/score-centering.md §5.5, §5.7, §5.8).

Top-level keys of verl's Hydra config, added with ``+``, named as in every host (``score_centering``,
``score_centering_top_k``, ``score_centering_importance_sampling``, ``force_on_policy_ratio`` and the six
``score_centering_adaptive_*`` keys). :func:`resolve_settings` checks them with the core's
``ScoreCenteringConfig``, then against the rest of verl's config; every error is one line naming the key.

``auto`` reads the mode from ``algorithm.rollout_correction`` (verl's decoupled rollout correction, whose
token-level weights multiply the base loss): ``rollout_is=null`` gives ``off``; ``rollout_is=token`` with a
float threshold u (verl's TIS, clamped above only) gives ``tis`` in [0, u]; with a ``"lo_hi"`` threshold
(verl's IcePop) ``icepop`` in [lo, hi]. Sequence-level IS, rejection sampling (``rollout_rs``, which masks
tokens out of the loss), batch-normalized weights and bypass mode are rejected. ``is`` and
``adaptive-ppo-clip`` have no verl mode: they need ``rollout_is=null`` and the plugin writes the sampled-token
weights itself (the untruncated ratio; adaptive-ppo-clip's filter with lo = 1 - ``actor.clip_ratio_low``,
hi = 1 + ``actor.clip_ratio_high``). Every bound is checked as the core's loss and controller would check it
(``check_is_bounds``, ``adaptive_ppo_clip_bounds``); base losses whose ratio is per sequence
(:data:`SEQUENCE_RATIO_LOSS_MODES`) are refused; the rollout's sampling filters are checked against vLLM's
ranges with or without score centering (:func:`check_sampling_filters`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omegaconf import DictConfig, open_dict
from verl.trainer.ppo.rollout_corr_helper import _parse_rollout_is_threshold

from trl_length_plugin import score_centering as core
from trl_length_plugin.score_centering import (
    SAMPLING_FILTER_RULES,
    SCORE_CENTERING_KEYS,
    HostSettings,
    HostWeights,
    ScoreCenteringConfig,
    ScoreCenteringPlanBase,
    check_is_bounds,
    engine_logprob_cap,
    get_mode,
    load_score_centering_config,
    resolve_plan,
)
from verl_adapter.config_values import plain

#: the agent-loop manager that carries the sampler's heads into TransferQueue (set when unset)
MANAGER_CLASS = "verl_adapter.score_centering.rollout.ScoreCenteringAgentLoopManager"
#: verl 0.9.1's policy losses score centering wraps, and the aggregation each gives its per-token loss
#: (None: ``actor.loss_agg_mode``, which ``ppo_loss`` passes in); A * C is aggregated the same way
BASE_LOSS_AGGREGATION: dict[str, str | None] = {
    "vanilla": None,
    "dppo_tv": None,
    "dppo_kl": None,
    "gpg": None,
    "clip_cov": None,
    "kl_cov": None,
    "dro": None,
    "cispo": None,
    "sapo": "seq-mean-token-mean",
}
#: the registered policy losses whose importance ratio is per sequence (GSPO, GMPO's geometric mean, the
#: plugin's LUSPO): refused with score centering (docs/reference/score-centering.md §5.5)
SEQUENCE_RATIO_LOSS_MODES = ("gspo", "geo_mean", "luspo")
#: the actor's clip keys, finite under score centering
CLIP_KEYS = ("clip_ratio", "clip_ratio_low", "clip_ratio_high")
#: the key under which the worker loss runs the wrapper; the user keeps their own base loss mode
LOSS_MODE = "score_centering"


@dataclass(frozen=True)
class ScoreCenteringSettings(ScoreCenteringPlanBase):
    """What the actor does (pickled into the workers): the shared plan (K, the mode and its bounds, the outer
    bound, the on-policy ratio), the base loss mode and how it aggregates (None: ``loss_agg_mode``). verl has
    no untruncated token IS and no adaptive filter: the plugin writes those weights."""

    base_loss_mode: str = "vanilla"
    base_aggregation: str | None = None

    def aggregation(self, loss_agg_mode: str) -> str:
        return self.base_aggregation or loss_agg_mode

    @property
    def detail(self) -> str:
        return f"base loss {self.base_loss_mode}"


def score_centering_config(config: DictConfig) -> ScoreCenteringConfig:
    """The shared keys of a full verl config, validated by the core (an unknown ``score_centering*`` key too)."""
    keys = [key for key in config if str(key).startswith("score_centering") or key in SCORE_CENTERING_KEYS]
    return load_score_centering_config({key: plain(config[key]) for key in keys})


def _derived_mode(correction) -> tuple[str, tuple[float, float] | None]:
    """The mode verl's ``algorithm.rollout_correction`` applies to the sampled token, and its bounds."""
    key = "algorithm.rollout_correction"
    if correction.get("bypass_mode", False):
        raise ValueError(
            f"{key}.bypass_mode: score centering needs verl's decoupled mode (bypass_mode=false): in bypass mode "
            "the PPO ratio itself is against the rollout policy and no token weight says which mode to mirror"
        )
    if correction.get("rollout_rs") is not None:
        raise ValueError(
            f"{key}.rollout_rs: rejection sampling removes tokens from the loss mask, which would mask the "
            "correction too (docs/reference/score-centering.md §5.1); use token-level IcePop "
            "(rollout_is=token rollout_is_threshold=LO_HI) or unset it"
        )
    rollout_is = correction.get("rollout_is")
    if rollout_is is None:
        return "off", None
    if rollout_is != "token":
        raise ValueError(
            f"{key}.rollout_is: {rollout_is!r} is sequence-level; score centering needs token-level IS "
            "(rollout_is=token) or none (docs/reference/score-centering.md §5.5)"
        )
    if correction.get("rollout_is_batch_normalize", False):
        raise ValueError(
            f"{key}.rollout_is_batch_normalize: batch-normalized weights match no score-centering mode; set it false"
        )
    try:
        upper, lower = _parse_rollout_is_threshold(correction.get("rollout_is_threshold", 2.0))
    except (TypeError, ValueError) as err:
        raise ValueError(f"{key}.rollout_is_threshold: {err}") from None
    if not math.isfinite(upper):
        raise ValueError(f"{key}.rollout_is_threshold: needs a finite upper bound, got {upper}")
    threshold = f"{key}.rollout_is_threshold"
    bounds = check_is_bounds(0.0 if lower is None else lower, upper, threshold, threshold)
    return ("tis", bounds) if lower is None else ("icepop", bounds)


def _clip(actor: DictConfig) -> tuple[float, float, str, str]:
    """The actor's clip in effect ``(low, high, low_key, high_key)``: ``clip_ratio_low`` / ``clip_ratio_high``,
    each ``clip_ratio`` when unset."""
    key = "actor_rollout_ref.actor.clip_ratio"
    clip = actor.get("clip_ratio", 0.2)
    low, low_key = (
        (clip, key) if actor.get("clip_ratio_low") is None else (actor.clip_ratio_low, f"{key}_low")
    )
    high, high_key = (
        (clip, key) if actor.get("clip_ratio_high") is None else (actor.clip_ratio_high, f"{key}_high")
    )
    return low, high, low_key, high_key


def _host_weights(config: DictConfig) -> HostWeights:
    """verl's ``algorithm.rollout_correction`` in the plugin's terms (reference §5.5, §5.7, §5.8): its token
    weights give off, tis or icepop; the plugin's own weights need it off (``rollout_is=null``)."""
    correction = config.algorithm.get("rollout_correction") or {}
    derived, bounds = _derived_mode(correction)

    def needs(mode: str) -> str:
        if mode in ("tis", "icepop"):
            threshold = "a float (TIS)" if mode == "tis" else "'LO_HI' (IcePop)"
            return (
                f"needs algorithm.rollout_correction.rollout_is=token with rollout_is_threshold {threshold}; "
                f"verl's setting gives {derived!r}"
            )
        if mode != "off" and not get_mode(mode).written:
            return (
                "is not a mode verl's rollout_correction computes, and the plugin does not write its weights"
            )
        what = "leaves the base loss unweighted" if mode == "off" else "writes the sampled-token weights"
        return (
            f"{what}; set algorithm.rollout_correction.rollout_is=null (it is {correction.get('rollout_is')!r}, "
            f"which verl turns into {derived})"
        )

    return HostWeights(
        derived=derived,
        carries_written=derived == "off",
        needs=needs,
        bounds=lambda _mode: bounds,
        clip=_clip(config.actor_rollout_ref.actor),
    )


def _check_rollout(rollout: DictConfig) -> None:
    """The rollout must return the sampler's own head through verl's vLLM server."""
    key = "actor_rollout_ref.rollout"
    if rollout.get("name") != "vllm":
        raise ValueError(
            f"{key}.name: score centering captures the sampler's head from vLLM, got {rollout.get('name')!r}"
        )
    if rollout.get("mode", "async") != "async":
        raise ValueError(
            f"{key}.mode: score centering needs verl's async vLLM server, got {rollout.get('mode')!r}"
        )
    if (rollout.get("disaggregation") or {}).get("enabled", False):
        raise ValueError(
            f"{key}.disaggregation.enabled: prefill/decode replicas do not capture the head; set it false"
        )
    if not rollout.get("calculate_log_probs", False):
        raise ValueError(
            f"{key}.calculate_log_probs: score centering needs the sampled token's rollout logprob; set it true"
        )
    manager = (rollout.get("agent") or {}).get("agent_loop_manager_class")
    if manager not in (None, MANAGER_CLASS):
        raise ValueError(
            f"{key}.agent.agent_loop_manager_class: score centering carries the sampler's heads with {MANAGER_CLASS}; "
            f"got {manager!r} (leave it unset)"
        )


def _engine_cap(rollout: DictConfig):
    """The rollout's ``engine_kwargs.vllm.max_logprobs`` (None: unset)."""
    return plain(((rollout.get("engine_kwargs") or {}).get("vllm") or {}).get("max_logprobs"))


def check_sampling_filters(rollout: DictConfig) -> None:
    """The rollout's sampling filters (training and ``val_kwargs``) in vLLM's ranges, with or without score
    centering (docs/reference/score-centering.md §5.2): a NaN or out-of-range value fails only in vLLM."""
    key = "actor_rollout_ref.rollout"
    val = rollout.get("val_kwargs") or {}
    core.check_sampling_filters(
        {
            f"{key}.": {name: plain(rollout.get(name)) for name in SAMPLING_FILTER_RULES},
            f"{key}.val_kwargs.": {name: plain(val.get(name)) for name in SAMPLING_FILTER_RULES},
        }
    )


def _check_actor(config: DictConfig) -> None:
    """The actor must expose its logits to the plugin."""
    actor, model = config.actor_rollout_ref.actor, config.actor_rollout_ref.model
    if actor.get("strategy") not in ("fsdp", "fsdp2"):
        raise ValueError(
            f"actor_rollout_ref.actor.strategy: score centering supports verl's FSDP engines (fsdp, fsdp2), "
            f"got {actor.get('strategy')!r}"
        )
    if model.get("use_fused_kernels", False):
        raise ValueError(
            "actor_rollout_ref.model.use_fused_kernels: the fused kernels compute only the sampled token's logprob, "
            "score centering needs the logits at the sampler's K ids; set it false"
        )
    if actor.get("pad_to_length", False):
        raise ValueError(
            "actor_rollout_ref.actor.pad_to_length: not supported with score centering; set it false"
        )
    if (config.get("distillation") or {}).get("enabled", False):
        raise ValueError(
            "distillation.enabled: on-policy distillation and score centering both need the actor's logits hook"
        )


def _base_loss(actor: DictConfig) -> str:
    return (actor.get("policy_loss") or {}).get("loss_mode", "vanilla")


def _one_update_per_batch(config: DictConfig) -> str | None:
    """None when verl runs one optimizer update per rollout batch; else what its keys say instead."""
    actor = config.actor_rollout_ref.actor
    mode = config.trainer.v1.trainer_mode
    sync_steps = (config.trainer.v1.get(mode) or {}).get("parameter_sync_step", 1)
    sample = config.data.train_batch_size // sync_steps
    if actor.get("ppo_epochs", 1) == 1 and actor.ppo_mini_batch_size == sample:
        return None
    return (
        f"actor_rollout_ref.actor.ppo_epochs=1 and actor_rollout_ref.actor.ppo_mini_batch_size={sample} "
        f"(data.train_batch_size / parameter_sync_step); got ppo_epochs={actor.get('ppo_epochs', 1)}, "
        f"ppo_mini_batch_size={actor.ppo_mini_batch_size}"
    )


def host_settings(config: DictConfig) -> HostSettings:
    """verl's settings that the plan reads, in verl's keys (verl has no sampler replay)."""
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    base = _base_loss(actor)
    *_, low_key, high_key = _clip(actor)
    names = ("temperature", "top_p", "top_k", "logprobs_mode")
    sampling = {"temperature": rollout.get("temperature"), "top_p": rollout.get("top_p", 1.0)}
    sampling["top_k"] = rollout.get("top_k", -1)
    return HostSettings(
        weights=_host_weights(config),
        clip={f"actor_rollout_ref.actor.{name}": plain(actor.get(name)) for name in CLIP_KEYS},
        clip_keys=(low_key, high_key),
        engine_cap=(_engine_cap(rollout), "actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs"),
        sampling=sampling,
        sampling_keys={name: f"actor_rollout_ref.rollout.{name}" for name in names},
        logprobs_mode=rollout.get("logprobs_mode"),
        sequence_ratio=(
            f"actor_rollout_ref.actor.policy_loss.loss_mode: {base!r}"
            if base in SEQUENCE_RATIO_LOSS_MODES
            else None
        ),
        one_update_per_batch=_one_update_per_batch(config),
    )


def resolve_settings(config: DictConfig) -> ScoreCenteringSettings | None:
    """Check the keys against verl's config and resolve the settings (None: score centering off): verl's own
    checks, then the core's ``resolve_plan`` on :func:`host_settings`, then the base loss's aggregation."""
    shared = score_centering_config(config)
    if _base_loss(config.actor_rollout_ref.actor) == LOSS_MODE:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode: {LOSS_MODE!r} is set by the plugin; keep your own "
            "token-level loss mode (vanilla, sapo, cispo, ...) and add +score_centering=true"
        )
    check_sampling_filters(config.actor_rollout_ref.rollout)
    if not shared.enabled:
        return None
    _check_rollout(config.actor_rollout_ref.rollout)
    _check_actor(config)
    base = _base_loss(config.actor_rollout_ref.actor)
    if base not in BASE_LOSS_AGGREGATION and base not in SEQUENCE_RATIO_LOSS_MODES:  # the core refuses those
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode: score centering wraps {', '.join(BASE_LOSS_AGGREGATION)}; "
            f"got {base!r}"
        )
    return resolve_plan(
        shared,
        host_settings(config),
        ScoreCenteringSettings,
        base_loss_mode=base,
        base_aggregation=BASE_LOSS_AGGREGATION.get(base),
    )


def check_model_vocabulary(config: DictConfig, settings: ScoreCenteringSettings) -> None:
    """K against the vocabulary of ``actor_rollout_ref.model.path`` (its ``config.json`` only, in the TaskRunner
    before any worker starts; the core's ``check_model_vocabulary``)."""
    model = config.actor_rollout_ref.model
    core.check_model_vocabulary(
        settings.top_k, model.path, trust_remote_code=model.get("trust_remote_code", False)
    )


def prepare_config(config: DictConfig, settings: ScoreCenteringSettings) -> None:
    """What the run needs beyond the user's keys, written before ``init()`` builds the workers: the agent-loop
    manager that carries the heads, and an engine logprob cap that admits K."""
    rollout = config.actor_rollout_ref.rollout
    with open_dict(rollout):
        rollout.agent.agent_loop_manager_class = MANAGER_CLASS
        key = "actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs"
        rollout.engine_kwargs.vllm.max_logprobs = engine_logprob_cap(
            _engine_cap(rollout), settings.top_k, key
        )
