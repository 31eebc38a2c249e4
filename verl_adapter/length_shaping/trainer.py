"""The group-level hook: a mixin for verl's V1 trainers that shapes whole ``uid`` groups before advantages.

``length_shaping`` puts it in front of every built-in V1 trainer class (``sync``, ``colocate_async``,
``separate_async``) in verl's trainer registry, so ``trainer.v1.trainer_mode`` keeps its meaning (the
base class compares it with ``"sync"``) and a ``length_penalty`` block is never silently ignored. A custom
trainer gets the same behaviour by listing :class:`LengthShapingMixin` first among its bases.

- ``__init__`` validates the length keys (docs/reference/product.md §1.3, docs/reference/length-penalties.md
  §2.1) and, for ``loss_mode=luspo``, the KL aggregation (docs/reference/luspo.md §4.1) in the TaskRunner,
  before any worker is launched, with errors naming the key.
- ``_compute_advantage`` (verl calls it once per training step with the sampled groups; validation never
  goes through it, so validation rollouts are never shaped, §2.15) takes the batch's shaped groups (shaped
  when the filter saw them finish, else now), writes the shaped scores as ``rm_scores``, lets verl compute
  advantages (with rollout correction and the KL penalty as configured), then puts the raw ``rm_scores``
  back and stores the shaped ones as ``token_level_rewards``: verl's ``critic/score/*`` keep reporting the
  raw reward and ``critic/rewards/*`` the shaped one. Under ``truncation: mask`` it first zeroes the
  ``response_mask`` (as verl's own rejection sampling does) and the ``loss_mask`` of truncated rollouts, so
  they get zero advantages and leave the actor's loss and its token count (TRL's
  ``mask_truncated_completions``, docs/reference/length-penalties.md §2.19). The metrics join verl's metrics dict; the verbose
  records and the ``Length penalty:`` lines (docs/reference/length-coefficient.md §3.4) are logged here, in
  the single-controller process only.
- ``_build_replay_buffer`` gives verl's replay buffer the shaped group filter when
  ``algorithm.filter_groups`` is on with ``metric=reward`` (§3.3; another metric, DAPO's ``acc``, is verl's
  own filter).
- ``_save_checkpoint`` / ``_load_checkpoint`` record the length schedule (its stages and the values at the
  saved step) in ``length_schedule_state.json`` inside each ``global_step_<n>`` folder and say on resume
  where it continues (docs/reference/length-coefficient.md §3.7); the values follow
  ``trainer.global_steps``, which verl restores.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.workers.utils.padding import response_to_nested

from trl_length_plugin.shaping import LengthShapingConfig, ShapingRun
from verl_adapter.length_shaping.advantage import raw_scores
from verl_adapter.length_shaping.config import log_rollouts, shaped_filter, shaping_config
from verl_adapter.length_shaping.filter import SHAPED_BUFFERS, with_shaped_filter
from verl_adapter.length_shaping.rollouts import RolloutShaper, ShapedRows, padded, row_lengths
from verl_adapter.platform.host import checkpoint_folder, resumed_checkpoint_folder
from verl_adapter.setup_checks import check_luspo

logger = logging.getLogger("trl_length_plugin")


def follow_verl_log_level() -> None:
    """``import verl`` sets Python logging to WARNING, which hides this plugin's INFO lines (the settings line,
    the ``Length penalty:`` lines): unless the application set its level, the plugin's logger follows
    ``VERL_LOGGING_LEVEL`` (default INFO), as verl's own ``verl`` logger does in ``main_ppo``."""
    if logger.level == logging.NOTSET:
        logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO").upper())


def scores_at_last_token(
    rm_scores: torch.Tensor, shaped: torch.Tensor, changed: torch.Tensor
) -> torch.Tensor:
    """``rm_scores`` (nested, one row per rollout) with each changed row's score set at its last token.

    Only rows the shaping changed are rewritten, and those carry their score on the last token alone.
    """
    table = padded(rm_scores).clone()
    rows = torch.nonzero(changed).flatten()
    last = row_lengths(rm_scores)[rows] - 1
    table[rows] = 0
    table[rows, last] = shaped[rows].to(table.dtype)
    return table


def masked_rows(batch: KVBatchMeta, keep: torch.Tensor) -> dict[str, torch.Tensor]:
    """The batch's ``response_mask`` and ``loss_mask`` (verl's token count of the actor's loss) with the rows
    ``keep`` leaves out zeroed (``truncation: mask``, docs/reference/length-penalties.md §2.19)."""
    names = ["response_mask", "loss_mask"]
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=names)
    present = set(data.keys())  # a TensorDict refuses ``key in td``
    out = {}
    for name in (name for name in names if name in present):
        table = padded(data[name])
        out[name] = response_to_nested(table * keep.unsqueeze(1).to(table.dtype), data[name])
    return out


class LengthShapingMixin:
    """Length shaping for a verl V1 ``PPOTrainer`` subclass (list it first among the bases)."""

    def __init__(self, config):
        check_luspo(config)
        self.length_run = ShapingRun(shaping_config(config), log_rollouts=log_rollouts(config))
        self.length_shaper = RolloutShaper(self.length_run, step=lambda: self.global_steps)
        self.length_shaper.max_response_length = config.data.get("max_response_length")
        follow_verl_log_level()
        self.length_run.announce()
        super().__init__(config)

    @property
    def length_shaping(self) -> LengthShapingConfig:
        """The run's length-shaping config."""
        return self.length_run.config

    @property
    def length_log_rollouts(self) -> bool:
        """``+length_penalty_log_rollouts``: one ``Length penalty:`` line per rollout (the run's setting)."""
        return self.length_run.log_rollouts

    @length_log_rollouts.setter
    def length_log_rollouts(self, value: bool) -> None:
        self.length_run.log_rollouts = value

    def _build_replay_buffer(self):
        buffer = super()._build_replay_buffer()
        filter_groups = self.config.algorithm.get("filter_groups") or {}
        if not (self.length_shaping.enabled and filter_groups.get("enable", False)):
            return buffer
        if type(buffer) not in SHAPED_BUFFERS:
            logger.warning(
                "trl-length-plugin: the custom sampler %s owns group filtering; it must judge shaped rewards "
                "itself (docs/reference/length-coefficient.md §3.3)",
                type(buffer).__name__,
            )
            return buffer
        if not shaped_filter(self.config.algorithm):
            logger.info(
                "trl-length-plugin: algorithm.filter_groups.metric=%s is verl's own filter on that metric: it "
                "drops all-correct groups too, whose length spread the shaping trains on; metric=reward keeps "
                "them (docs/reference/length-coefficient.md §3.3)",
                filter_groups.get("metric"),
            )
            return buffer
        return with_shaped_filter(buffer, self.length_shaper)

    def _save_checkpoint(self):
        if self.length_shaping.enabled:
            folder = checkpoint_folder(self.config.trainer, self.global_steps)
            os.makedirs(folder, exist_ok=True)
            self.length_run.save(folder, self.global_steps)
        super()._save_checkpoint()

    def _load_checkpoint(self):
        super()._load_checkpoint()
        if not (self.length_shaping.enabled and self.global_steps):
            return
        self.length_run.resume(
            resumed_checkpoint_folder(self.config.trainer, self.global_steps), self.global_steps
        )

    def _init_tokenizer(self):
        super()._init_tokenizer()
        self.length_shaper.tokenizer = self.tokenizer

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        if not self.length_shaping.enabled:
            return super()._compute_advantage(batch, metrics)
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["rm_scores", "response_mask"]
        )
        real = ~np.array([tag.get("is_padding", False) for tag in batch.tags], dtype=bool)
        rows = self._shaped_rows(batch, [key for key, keep in zip(batch.keys, real, strict=True) if keep])
        metrics.update(rows.metrics)
        self.length_run.log(self.global_steps, rows.records, rows.lines)

        raw = padded(data["rm_scores"]).double().sum(-1)
        shaped, host_rows = raw.clone(), torch.zeros_like(raw, dtype=torch.bool)
        index = torch.from_numpy(np.flatnonzero(real))
        shaped[index], host_rows[index] = rows.shaped, rows.host_rows
        changed = ~torch.isclose(shaped, raw, rtol=0, atol=0, equal_nan=True)
        nested = response_to_nested(
            scores_at_last_token(data["rm_scores"], shaped, changed), data["response_mask"]
        )
        masked = {}
        if not bool(rows.loss_keep.all()):  # truncation: mask (§2.19)
            keep = torch.ones_like(raw, dtype=torch.bool)
            keep[index] = rows.loss_keep
            masked = masked_rows(batch, keep)
        self._put(batch, rm_scores=nested, **masked)
        with raw_scores(raw, host_rows):
            batch = super()._compute_advantage(batch, metrics)
        restored = {"rm_scores": data["rm_scores"]}
        if not self.config.algorithm.use_kl_in_reward:  # otherwise verl stored the KL-penalized shaped ones
            restored["token_level_rewards"] = nested
        return self._put(batch, **restored)

    def _shaped_rows(self, batch: KVBatchMeta, keys: list[str]) -> ShapedRows:
        def fetch(rows, fields):
            return tq.kv_batch_get(keys=rows, partition_id=batch.partition_id, select_fields=fields)

        return self.length_shaper.take(fetch, keys)

    @staticmethod
    def _put(batch: KVBatchMeta, **fields: torch.Tensor) -> KVBatchMeta:
        """Write fields of the batch to TransferQueue; the stored batch's metadata, as verl's own steps return."""
        return tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(fields, batch_size=len(batch))
        )
