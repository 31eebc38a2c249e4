"""Score centering's plan: what a run does, resolved once from the shared keys and a host's settings, after every
check in one order (docs/reference/score-centering.md §5.2, §5.5, §5.7).

A host describes its settings in the plugin's terms (:class:`HostSettings`, with its importance-sampling setting
as :class:`HostWeights`), in its own key names; :func:`resolve_plan` makes every check the core makes on them and
builds the one frozen plan (:class:`ScoreCenteringPlanBase`, subclassed by each host for its own fields): K, the
mode and its bounds, the outer bound, the on-policy ratio and sampler replay. The plan is what a worker process
needs: the per-micro-batch outputs, the sampled-token weights, the controller's counts and the sampler's request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trl_length_plugin.score_centering.config import (
    ScoreCenteringConfig,
    adaptive_ppo_clip_bounds,
    check_base_clip,
    check_engine_cap,
    refuse_sequence_ratio,
)
from trl_length_plugin.score_centering.controller import AdaptiveClipController
from trl_length_plugin.score_centering.estimator import (
    ScoreCenteringOutputs,
    sampled_token_weights_from_logprobs,
    score_centering_outputs,
)
from trl_length_plugin.score_centering.modes import get_mode
from trl_length_plugin.score_centering.sampling_request import (
    build_score_centering_request_overrides,
    check_sampling_settings,
    validate_score_centering_request,
)

if TYPE_CHECKING:
    import torch


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
        """The host's part of :meth:`summary` (none here)."""
        return ""

    def outputs(
        self,
        k: float,
        policy_logprobs_at_sampler_topk: torch.Tensor,
        *,
        sampler_topk_logprobs: torch.Tensor,
        token_mask: torch.Tensor,
        advantages: torch.Tensor | None = None,
    ) -> ScoreCenteringOutputs:
        """C and the §5.6 values of one micro-batch at the controller's offset ``k``, from one head computation
        (``estimator.score_centering_outputs``; renormalized over the kept set under sampler replay)."""
        return score_centering_outputs(
            self, k, policy_logprobs_at_sampler_topk, sampler_topk_logprobs=sampler_topk_logprobs,
            token_mask=token_mask, advantages=advantages, sampler_replay=self.replay,
        )  # fmt: skip

    def sampled_token_weights(
        self,
        k: float,
        old_logprobs: torch.Tensor,
        sampler_logprobs: torch.Tensor,
        token_mask: torch.Tensor,
        advantages: torch.Tensor,
    ) -> torch.Tensor:
        """The mode's sampled-token weights at offset ``k``, from the ratio old / sampler (reference §5.5, §5.7):
        what the plugin writes into the base loss where :attr:`writes_weights` (``is``, ``adaptive-ppo-clip``), or
        what a host that computes no weights of its own applies."""
        return sampled_token_weights_from_logprobs(
            old_logprobs,
            sampler_logprobs,
            token_mask,
            self.mode,
            self.bounds_at(k),
            advantages,
            self.outer_bound,
        )

    def clip_counts(
        self,
        k: float,
        logprobs: torch.Tensor,
        sampler_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        token_mask: torch.Tensor,
    ) -> torch.Tensor:
        """The controller's (clipped, positive) token counts of a micro-batch at offset ``k``: tokens with A > 0
        whose ratio trainer / sampler exceeds hi + k (reference §5.7)."""
        upper = self.bounds_at(k)[1]
        return AdaptiveClipController.counts_from_logprobs(
            logprobs, sampler_logprobs, advantages, token_mask, upper
        )

    def capture_request(
        self,
        sampling: Mapping[str, Any],
        *,
        api: str = "sampling_params",
        logprobs_mode: str = "processed_logprobs",
    ) -> dict[str, Any]:
        """A policy request's ``sampling`` fields with what the sampler is asked for, K candidates per token in
        ``api``'s fields (``sampling_request.build_score_centering_request_overrides``), checked against the
        engine's ``logprobs_mode`` (``validate_score_centering_request``, reference §5.2, §5.5)."""
        request = {**sampling, **build_score_centering_request_overrides(self.top_k, api=api)}
        validate_score_centering_request(
            request, self.top_k, logprobs_mode=logprobs_mode, sampler_replay=self.replay
        )
        return request

    def summary(self) -> str:
        """One line saying what runs, for the setup log."""
        mode = self.mode
        if self.bounds is not None:
            offset = " + k" if self.uses_controller else ""
            mode += f" in [{self.bounds[0]:g}, {self.bounds[1]:g}{offset}]"
        parts = [f"K={self.top_k}", f"mode {mode}", *filter(None, [self.detail])]
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
