"""The group-level hook: a mixin for verl's V1 trainers that shapes whole ``uid`` groups before advantages.

``length_shaping`` puts it in front of every built-in V1 trainer class (``sync``, ``colocate_async``,
``separate_async``) in verl's trainer registry, so ``trainer.v1.trainer_mode`` keeps its meaning (the
base class compares it with ``"sync"``) and a ``length_penalty`` block is never silently ignored. A custom
trainer gets the same behaviour by listing :class:`LengthShapingMixin` first among its bases.

- ``__init__`` validates the length keys (decisions.md §1.3, §2.1) and, for ``loss_mode=luspo``, the KL
  aggregation (§4.1) in the TaskRunner, before any worker is launched, with errors naming the key.
- ``_compute_advantage`` (verl calls it once per training step with the sampled groups; validation never
  goes through it, so validation rollouts are never shaped, §2.15) reads the rollouts from TransferQueue,
  runs the engine, writes the shaped scores as ``rm_scores``, lets verl compute advantages (with rollout
  correction and the KL penalty as configured), then puts the raw ``rm_scores`` back and stores the shaped
  ones as ``token_level_rewards``: verl's ``critic/score/*`` keep reporting the raw reward and
  ``critic/rewards/*`` the shaped one. The §2.15 and §3 metrics join verl's metrics dict; the §3.4 lines
  are logged here, in the single-controller process only.
- ``_build_replay_buffer`` gives verl's replay buffer the shaped group filter when
  ``algorithm.filter_groups`` is on (§3.3).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.workers.utils.padding import response_to_nested

from .length_advantage import raw_scores
from .length_config import LengthShapingSettings
from .length_filter import SHAPED_BUFFERS, with_shaped_filter
from .length_rollouts import RolloutShaper, ShapedScores, padded, row_lengths
from .luspo import check_kl_aggregation

logger = logging.getLogger("trl_length_plugin")


def scores_at_last_token(rm_scores: torch.Tensor, scores: ShapedScores) -> torch.Tensor:
    """``rm_scores`` (nested, one row per rollout) with each changed row's score set at its last token.

    Only rows the shaping changed are rewritten, and those carry their score on the last token alone.
    """
    table = padded(rm_scores).clone()
    changed = torch.nonzero(scores.changed).flatten()
    last = row_lengths(rm_scores)[changed] - 1
    table[changed] = 0
    table[changed, last] = scores.shaped[changed].to(table.dtype)
    return table


class LengthShapingMixin:
    """Length shaping for a verl V1 ``PPOTrainer`` subclass (list it first among the bases)."""

    def __init__(self, config):
        actor = config.actor_rollout_ref.actor
        if (actor.get("policy_loss") or {}).get("loss_mode") == "luspo":
            check_kl_aggregation(bool(actor.get("use_kl_loss", False)), actor.get("loss_agg_mode"))
        self.length_shaping = LengthShapingSettings.from_verl_config(config)
        self.length_shaper = RolloutShaper(self.length_shaping)
        if self.length_shaping.enabled:
            logger.info(
                "trl-length-plugin: length shaping on (group penalties: %s, coefficient: %s)",
                self.length_shaping.penalties_on,
                self.length_shaping.coeff,
            )
        super().__init__(config)

    def _build_replay_buffer(self):
        buffer = super()._build_replay_buffer()
        filter_on = bool((self.config.algorithm.get("filter_groups") or {}).get("enable", False))
        if not (self.length_shaping.enabled and filter_on):
            return buffer
        if type(buffer) not in SHAPED_BUFFERS:
            logger.warning(
                "trl-length-plugin: the custom sampler %s owns group filtering; it must judge shaped rewards "
                "itself (decisions.md §3.3)",
                type(buffer).__name__,
            )
            return buffer
        return with_shaped_filter(buffer, self.length_shaper)

    def _init_tokenizer(self):
        super()._init_tokenizer()
        self.length_shaper.tokenizer = self.tokenizer

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        if not self.length_shaping.enabled:
            return super()._compute_advantage(batch, metrics)
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=self.length_shaper.fields
        )
        padding = np.array([tag.get("is_padding", False) for tag in batch.tags], dtype=bool)
        scores = self.length_shaper.shape(data, batch.keys, padding=padding, step=self.global_steps, log=True)
        metrics.update(scores.metrics)

        mask = data["response_mask"]
        shaped = response_to_nested(scores_at_last_token(data["rm_scores"], scores), mask)
        self._put(batch, rm_scores=shaped)
        with raw_scores(scores.raw):
            batch = super()._compute_advantage(batch, metrics)
        restored = {"rm_scores": data["rm_scores"]}
        if not self.config.algorithm.use_kl_in_reward:  # otherwise verl stored the KL-penalized shaped ones
            restored["token_level_rewards"] = shaped
        return self._put(batch, **restored)

    @staticmethod
    def _put(batch: KVBatchMeta, **fields: torch.Tensor) -> KVBatchMeta:
        """Write fields of the batch to TransferQueue; the stored batch's metadata, as verl's own steps return."""
        return tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(fields, batch_size=len(batch))
        )
