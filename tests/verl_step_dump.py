"""A test helper loaded into every process of a verl run by ``VERL_USE_EXTERNAL_MODULES`` (``tests/test_verl_e2e_*.py``):
in the TaskRunner it puts a class in front of each (plugin-wrapped) V1 trainer that saves step 1's batch after the
advantage step — the rollouts verl generated, the raw scores and the rewards verl trained on — to
``$TRL_LENGTH_STEP_DUMP`` (``torch.save``). Nothing of verl is replaced: the class only reads TransferQueue.
"""

from __future__ import annotations

import os

from verl_adapter.platform.after_import import after_import
from verl_adapter.plugin import register_with

FIELDS = [
    "uid",
    "responses",
    "response_mask",
    "rm_scores",
    "token_level_rewards",
    "data_source",
    "reward_model",
]


def _values(column) -> list:
    """A non-tensor column as a list (a stack has ``tolist``; TransferQueue may return a plain sequence)."""
    return column.tolist() if hasattr(column, "tolist") else list(column)


def _dump_step_one() -> None:
    import torch
    import transfer_queue as tq
    from verl.trainer.ppo.v1 import trainer_base

    register_with("verl.trainer.ppo.v1")  # the plugin's mixins first, so this class sits in front of them

    class DumpStepOne:
        def _compute_advantage(self, batch, metrics):
            batch = super()._compute_advantage(batch, metrics)
            if self.global_steps == 1:
                data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=FIELDS)
                rows = {
                    "keys": list(batch.keys),
                    "padding": [bool(tag.get("is_padding", False)) for tag in batch.tags],
                    "responses": [t.tolist() for t in data["responses"].unbind()],
                    "response_mask": [t.tolist() for t in data["response_mask"].unbind()],
                    "rm_scores": [float(t.sum()) for t in data["rm_scores"].unbind()],
                    "token_level_rewards": [float(t.sum()) for t in data["token_level_rewards"].unbind()],
                    "uid": _values(data["uid"]),
                    "data_source": _values(data["data_source"]),
                }
                torch.save(rows, os.environ["TRL_LENGTH_STEP_DUMP"])
            return batch

    registry = trainer_base.TRAINER_REGISTRY
    for name, cls in list(registry.items()):
        registry[name] = type(f"DumpStepOne{cls.__name__}", (DumpStepOne, cls), {})


if os.environ.get("TRL_LENGTH_STEP_DUMP"):
    after_import("verl.trainer.ppo.v1", _dump_step_one)
