"""``algorithm.filter_groups`` (DAPO dynamic sampling) judged on shaped rewards (decisions.md §3.3).

verl 0.9.1 filters groups in the V1 replay buffer (``ReplayBuffer._dapo_filtered_keys``), when a group
finishes and before the trainer's advantage step. With length shaping on, this override shapes each newly
finished group with the same :class:`RolloutShaper` as the advantage step and keeps it by the engine's
``nonzero_std_keep_mask``: an all-correct group survives only when its shaped range exceeds 1e-6, any other
group only when its shaped rewards are not all equal. Everything else (the classification cache, refills,
metrics, validation never filtered) is verl's.

Deviation from verl: verl never filters a group of one row (``replay_buffer.py``: ``len(values) > 1``);
this filter follows §3.3 as written, so a one-row group (its shaped rewards trivially all equal) is dropped.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
import transfer_queue as tq
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

from trl_length_plugin.shaping import nonzero_std_keep_mask

from .length_rollouts import RolloutShaper


class ShapedGroupFilter:
    """Replay-buffer mixin; ``length_shaper`` is attached by the length-shaping trainer."""

    length_shaper: RolloutShaper

    def _dapo_filtered_keys(self, partition_id: str) -> tuple[set[str], Counter]:
        if partition_id == "val" or self.filter_groups_metric is None:
            return set(), Counter()
        finished = self.finished_keys[partition_id]
        cache = self._dapo_classification_cache[partition_id]
        for uid in cache.keys() - finished:
            del cache[uid]
        new = finished - cache.keys()
        keys = [key for key in self.partitions[partition_id] if key.split("_")[0] in new]
        uids = np.asarray([key.split("_")[0] for key in keys], dtype=object)
        missing = new - set(uids.tolist())
        if missing:  # verl's own check, same message
            raise RuntimeError(
                f"Finished groups are missing DAPO metric {self.filter_groups_metric!r}: {sorted(missing)[:5]}"
            )
        cache.update(dict.fromkeys(new))
        if keys:
            data = tq.kv_batch_get(
                keys=keys, partition_id=partition_id, select_fields=self.length_shaper.fields
            )
            scores = self.length_shaper.shape(data, keys)
            keep = nonzero_std_keep_mask(scores.shaped, scores.raw, scores.group_ids)
            dropped_rows = torch.nonzero(~keep).flatten()
            dropped, first = np.unique(uids[dropped_rows.numpy()], return_index=True)
            values = scores.shaped[dropped_rows[torch.from_numpy(first)]].tolist()
            cache.update(zip(dropped.tolist(), values, strict=True))
        filtered = {uid: value for uid, value in cache.items() if value is not None}
        return set(filtered), Counter(filtered.values())


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
