"""``algorithm.filter_groups`` (DAPO dynamic sampling) judged on shaped rewards (docs/reference/
length-coefficient.md §3.3).

verl 0.9.1 filters groups in the V1 replay buffer (``ReplayBuffer._dapo_filtered_keys``) when a group
finishes, before the trainer's advantage step. With length shaping on, this override shapes each newly
finished group (``RolloutShaper.shape_groups``, kept by ``uid`` for the advantage step, so no group is
shaped twice), classifies it by the core's ``nonzero_std_keep_mask`` — an all-correct group survives only
when its shaped range exceeds 1e-6, a mixed group only when its shaped rewards are not all equal, a group with
no correct rollout on its raw scores (a per-rollout term's spread never keeps it) — and records
that in verl's classification cache; verl's own ``_dapo_filtered_keys`` then does everything else (cache
upkeep, the missing-metric check, the filtered set and its counts). Installed for
``algorithm.filter_groups.metric=reward`` only: any other metric (DAPO's ``acc``) is verl's own filter.

Deviation from verl: verl never filters a group of one row (``len(values) > 1``); this filter follows §3.3
as written, so a one-row group (its shaped rewards trivially all equal) is dropped.
"""

from __future__ import annotations

import numpy as np
import transfer_queue as tq
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

from trl_length_plugin.shaping import nonzero_std_keep_mask
from verl_adapter.length_shaping.rollouts import RolloutShaper


class ShapedGroupFilter:
    """Replay-buffer mixin; ``length_shaper`` is attached by the length-shaping trainer."""

    length_shaper: RolloutShaper

    def _dapo_filtered_keys(self, partition_id: str):
        if partition_id != "val" and self.filter_groups_metric is not None:
            self._classify_new_groups(partition_id)
        return super()._dapo_filtered_keys(partition_id)

    def _classify_new_groups(self, partition_id: str) -> None:
        """Shape the finished groups verl has not classified yet and record each one's classification
        (verl's convention: the shared value of a dropped group, None for a kept one)."""
        cache = self._dapo_classification_cache[partition_id]
        new = self.finished_keys[partition_id] - cache.keys()
        keys = [key for key in self.partitions[partition_id] if key.split("_")[0] in new]
        if not keys:
            return  # groups without trajectories: verl's own check reports them

        def fetch(rows, fields):
            return tq.kv_batch_get(keys=rows, partition_id=partition_id, select_fields=fields)

        rows = self.length_shaper.shape_groups(fetch, keys)
        uids = [key.split("_")[0] for key in keys]
        keep = nonzero_std_keep_mask(rows.shaped, rows.correctness, np.unique(uids, return_inverse=True)[1])
        dropped = set()
        for uid, kept, value in zip(uids, keep.tolist(), rows.shaped.tolist(), strict=True):
            if uid not in cache:
                cache[uid] = None if kept else value
                if not kept:
                    dropped.add(uid)
        self.length_shaper.forget(dropped)


class ShapedReplayBuffer(ShapedGroupFilter, ReplayBuffer):
    """verl's sync replay buffer with the shaped group filter."""


class ShapedReplayBufferAsync(ShapedGroupFilter, ReplayBufferAsync):
    """verl's async replay buffer with the shaped group filter."""


SHAPED_BUFFERS: dict[type, type] = {
    ReplayBuffer: ShapedReplayBuffer,
    ReplayBufferAsync: ShapedReplayBufferAsync,
}


def with_shaped_filter(buffer: ReplayBuffer, shaper: RolloutShaper) -> ReplayBuffer:
    """Give a buffer built by verl's ``_build_replay_buffer`` the shaped filter (same state, subclass)."""
    buffer.__class__ = SHAPED_BUFFERS[type(buffer)]
    buffer.length_shaper = shaper
    return buffer
