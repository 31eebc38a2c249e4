"""One training run's score centering, the object every host holds (docs/write-a-host.md): the resolved plan,
what the sampler is asked for, the head's settings, the adaptive-ppo-clip controller and its checkpoint state,
the settings line and the metrics (docs/reference/score-centering.md §5.2-§5.7).

A host resolves its plan when its config loads (:func:`~trl_length_plugin.score_centering.plan.resolve_plan`, or
:meth:`ScoreCenteringRun.resolve`, which also builds the run), builds one :class:`ScoreCenteringRun` when
training starts and says :meth:`~ScoreCenteringRun.announce` at setup. Each micro-batch's loss takes
:meth:`~ScoreCenteringRun.outputs` (C and the §5.6 values) and, where the plugin writes them,
:meth:`~ScoreCenteringRun.sampled_token_weights`; the host logs :meth:`~ScoreCenteringRun.metrics` and, under
adaptive-ppo-clip, adds each micro-batch's :meth:`~ScoreCenteringRun.clip_counts` (summed over its processes)
with :meth:`~ScoreCenteringRun.accumulate` and logs :meth:`~ScoreCenteringRun.step_metrics` once per optimizer
step. A host whose loss runs in other processes gives them the plan (picklable) and the offset :attr:`k`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trl_length_plugin.score_centering.config import (
    ScoreCenteringConfig,
    check_model_vocabulary,
    engine_logprob_cap,
)
from trl_length_plugin.score_centering.controller import AdaptiveClipController
from trl_length_plugin.score_centering.estimator import ScoreCenteringOutputs, batch_means
from trl_length_plugin.score_centering.plan import HostSettings, ScoreCenteringPlanBase, resolve_plan
from trl_length_plugin.shaping.settings import score_centering_settings_line

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("trl_length_plugin")


class ScoreCenteringRun:
    """The score centering of one training run: ``config`` (the shared keys), ``plan`` (what runs, resolved
    after every check) and, under adaptive-ppo-clip, ``controller`` (its offset k, §5.7)."""

    def __init__(
        self,
        config: ScoreCenteringConfig,
        plan: ScoreCenteringPlanBase,
        controller: AdaptiveClipController | None = None,
    ):
        self.config, self.plan = config, plan
        if controller is None and plan.uses_controller:
            controller = AdaptiveClipController.from_config(config)
        self.controller = controller

    @classmethod
    def resolve(
        cls,
        config: ScoreCenteringConfig,
        host: HostSettings,
        plan: type = ScoreCenteringPlanBase,
        **host_fields,
    ) -> ScoreCenteringRun | None:
        """The run of ``config`` on a host with these settings (None when score centering is off): its plan is
        ``resolve_plan``'s, every error one line naming the host's key."""
        if not config.enabled:
            return None
        return cls(config, resolve_plan(config, host, plan, **host_fields))

    # -- setup ----------------------------------------------------------------------------------------------
    @property
    def top_k(self) -> int:
        """K, the candidates the sampler returns per generated token (§5.2)."""
        return self.plan.top_k

    def check_vocabulary(self, model: Any, **options: Any) -> None:
        """K against ``model``'s vocabulary before its weights load (``config.check_model_vocabulary``)."""
        check_model_vocabulary(self.top_k, model, **options)

    def engine_logprob_cap(self, cap: Any, key: str) -> int:
        """The ``max_logprobs`` to give the vLLM engine: the host's ``cap`` (its ``key``) checked, or one that
        admits K (``config.engine_logprob_cap``)."""
        return engine_logprob_cap(cap, self.top_k, key)

    def capture_request(self, sampling: Mapping[str, Any], **options: Any) -> dict[str, Any]:
        """``sampling`` with what the sampler is asked for, checked (the plan's ``capture_request``)."""
        return self.plan.capture_request(sampling, **options)

    def settings_line(self, detail: str = "") -> str:
        """What runs (the plan's summary, then ``detail``, e.g. the vLLM mode) and every key set (§5.6)."""
        return score_centering_settings_line(self.config, self.plan.summary() + detail)

    def announce(self, detail: str = "") -> None:
        """Log the settings line at setup."""
        logger.info("%s", self.settings_line(detail))

    # -- each micro-batch -----------------------------------------------------------------------------------
    @property
    def k(self) -> float:
        """The controller's current offset k (0 without the adaptive-ppo-clip controller)."""
        return self.controller.k if self.controller is not None else 0.0

    def outputs(
        self,
        policy_logprobs_at_sampler_topk: torch.Tensor,
        *,
        sampler_topk_logprobs: torch.Tensor,
        token_mask: torch.Tensor,
        advantages: torch.Tensor | None = None,
    ) -> ScoreCenteringOutputs:
        """C and the §5.6 values of a micro-batch at the current k (the plan's ``outputs``)."""
        return self.plan.outputs(
            self.k, policy_logprobs_at_sampler_topk, sampler_topk_logprobs=sampler_topk_logprobs,
            token_mask=token_mask, advantages=advantages,
        )  # fmt: skip

    def sampled_token_weights(
        self,
        old_logprobs: torch.Tensor,
        sampler_logprobs: torch.Tensor,
        token_mask: torch.Tensor,
        advantages: torch.Tensor,
    ) -> torch.Tensor:
        """The mode's sampled-token weights at the current k (the plan's ``sampled_token_weights``)."""
        return self.plan.sampled_token_weights(self.k, old_logprobs, sampler_logprobs, token_mask, advantages)

    @staticmethod
    def metrics(token_metrics: dict[str, torch.Tensor], token_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """The §5.6 metrics of a micro-batch: its per-position values as means over its tokens."""
        return batch_means(token_metrics, token_mask)

    # -- the adaptive controller ----------------------------------------------------------------------------
    def clip_counts(
        self,
        logprobs: torch.Tensor,
        sampler_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        token_mask: torch.Tensor,
    ) -> torch.Tensor:
        """A micro-batch's (clipped, positive) token counts at the current k, for :meth:`accumulate`."""
        return self.plan.clip_counts(self.k, logprobs, sampler_logprobs, advantages, token_mask)

    def accumulate(self, counts: torch.Tensor) -> None:
        """Add a micro-batch's counts, summed over the host's processes."""
        self.controller.accumulate(counts)

    def step_metrics(self) -> dict[str, float]:
        """The controller's step at the end of an optimizer step, as its metrics (f, and k after it, §5.6)."""
        return self.controller.step_metrics()

    # -- checkpoints ----------------------------------------------------------------------------------------
    def save(self, folder: str) -> None:
        """The controller's state in the checkpoint ``folder`` (nothing without a controller)."""
        if self.controller is not None:
            self.controller.save(folder)

    def resume(self, folder: str) -> None:
        """On resume from ``folder``: the controller's state, with a warning when the checkpoint has none."""
        if self.controller is not None:
            self.controller.restore(folder)
