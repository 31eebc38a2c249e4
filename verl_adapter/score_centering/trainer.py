"""The trainer side of score centering: a mixin for verl's V1 trainers (docs/reference/score-centering.md
§5.5-§5.7).

``score_centering`` puts it in front of every built-in V1 trainer in verl's registry (``sync``,
``colocate_async``, ``separate_async``); with no ``score_centering`` key it does nothing.

- ``__init__`` (verl's TaskRunner, before ``init()`` starts any worker) validates the keys against verl's
  config (errors name the key) and K against the model's vocabulary (its ``config.json``), checks verl's vLLM server, registers the capturing replica as ``"vllm"`` in
  verl's ``RolloutReplicaRegistry``, sets the agent-loop manager that carries the heads and the engine's
  ``max_logprobs``, and logs what runs.
- ``on_init_end`` gives the actor workers the score-centering loss (``set_loss_fn``, with a copy of the actor
  config whose ``policy_loss.loss_mode`` is ``score_centering``; the user's mode is the base) and arms every
  actor update with verl's top-k logits hook and the controller's current k. ``compute_log_prob`` and the
  reference pass are left alone.
- ``_update_actor`` moves the actor's ``actor/score_centering/*`` metrics to ``score_centering/*`` and, under
  adaptive-ppo-clip, steps the controller once per update (one optimizer step under ``force_on_policy_ratio``)
  from the global clipped fraction, logging ``score_centering/adaptive_k`` (after the step) and
  ``score_centering/adaptive_clip_frac``.
- ``_save_checkpoint`` / ``_load_checkpoint`` keep the controller in ``score_centering_state.json`` inside
  ``global_step_N`` (written before verl's resume marker; not copied to ``default_hdfs_dir``).
"""

from __future__ import annotations

import functools
import logging
from functools import partial

import torch
from omegaconf import OmegaConf
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.rollout.replica import RolloutReplicaRegistry

from verl_adapter.platform.host import checkpoint_folder, resumed_checkpoint_folder
from verl_adapter.score_centering.config import LOSS_MODE, ScoreCenteringSettings, prepare_config
from verl_adapter.score_centering.host import check_vllm_server
from verl_adapter.score_centering.loss import (
    ADAPTIVE_K,
    CLIPPED,
    HOOK_FLAGS,
    POSITIVE,
    score_centering_ppo_loss,
)
from verl_adapter.setup_checks import score_centering_run

logger = logging.getLogger("trl_length_plugin")
METRIC_PREFIX = "actor/score_centering/"


def register_capturing_replica() -> None:
    """``"vllm"`` in verl's replica registry -> the capturing replica (verl's server, checked, plus capture)."""
    check_vllm_server()
    from verl_adapter.score_centering.server import ScoreCenteringVLLMReplica

    RolloutReplicaRegistry.register("vllm", lambda: ScoreCenteringVLLMReplica)


def worker_actor_config(config):
    """The actor config the workers build (``omega_conf_to_dataclass``) with ``loss_mode=score_centering``."""
    actor = OmegaConf.create(OmegaConf.to_container(config.actor_rollout_ref.actor, resolve=True))
    actor.policy_loss.loss_mode = LOSS_MODE
    return omega_conf_to_dataclass(actor)


class ScoreCenteringMixin:
    """Score centering for a verl V1 ``PPOTrainer`` subclass (list it first among the bases); holds the core's
    ``ScoreCenteringRun`` (``score_centering_run``, None when off)."""

    def __init__(self, config):
        self.score_centering_run = score_centering_run(config)
        if self.score_centering_run is not None:
            register_capturing_replica()
            prepare_config(config, self.score_centering)
            self._score_centering_actor = worker_actor_config(config)
            self.score_centering_run.announce()
        super().__init__(config)

    @property
    def score_centering(self) -> ScoreCenteringSettings | None:
        """The run's resolved settings, which the workers' loss runs (None when off)."""
        return self.score_centering_run.plan if self.score_centering_run is not None else None

    @property
    def score_centering_controller(self):
        """The run's adaptive-ppo-clip controller (None unless that mode runs)."""
        return self.score_centering_run.controller if self.score_centering_run is not None else None

    def on_init_end(self):
        if self.score_centering is not None:
            loss = partial(
                score_centering_ppo_loss, config=self._score_centering_actor, settings=self.score_centering
            )
            self.actor_rollout_wg.set_loss_fn(loss)
            self.actor_rollout_wg.update_actor = self._armed(self.actor_rollout_wg.update_actor)
        super().on_init_end()

    def _armed(self, update_actor):
        """verl's ``update_actor`` RPC with the top-k hook flags and k on the batch's micro-batches."""

        @functools.wraps(update_actor)
        def update(batch):
            batch.extra_info.update(HOOK_FLAGS)
            if self.score_centering_controller is not None:
                batch.extra_info[ADAPTIVE_K] = self.score_centering_run.k
            return update_actor(batch)

        return update

    def _update_actor(self, batch, metrics):
        if self.score_centering is None:
            return super()._update_actor(batch, metrics)
        actor_metrics: dict = {}
        batch = super()._update_actor(batch, actor_metrics)
        renamed = {
            key.removeprefix("actor/") if key.startswith(METRIC_PREFIX) else key: value
            for key, value in actor_metrics.items()
        }
        run = self.score_centering_run
        if run.controller is not None:
            if CLIPPED not in renamed:
                raise RuntimeError("score centering: the actor update returned no adaptive-ppo-clip counts")
            run.accumulate(torch.tensor([renamed.pop(CLIPPED), renamed.pop(POSITIVE)]))
            renamed.update(run.step_metrics())
        metrics.update(renamed)
        return batch

    def _save_checkpoint(self):
        if self.score_centering_run is not None:
            self.score_centering_run.save(checkpoint_folder(self.config.trainer, self.global_steps))
        super()._save_checkpoint()

    def _load_checkpoint(self):
        super()._load_checkpoint()
        if self.score_centering_run is not None and self.global_steps:
            self.score_centering_run.resume(resumed_checkpoint_folder(self.config.trainer, self.global_steps))
