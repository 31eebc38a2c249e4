"""Length shaping in verl (docs/reference/length-penalties.md §2, docs/reference/length-coefficient.md §3):
importing this module registers everything with verl.

``verl_adapter.plugin`` imports it right after verl imports ``verl.trainer.ppo.v1`` (the TaskRunner, where
the trainer is built). It

1. checks that the installed verl is 0.9.x and still has the hooks used here, failing with a clear
   message otherwise;
2. puts :class:`~verl_adapter.length_shaping.trainer.LengthShapingMixin` in front of each built-in V1 trainer in
   verl's trainer registry (``sync``, ``colocate_async``, ``separate_async``), so whichever
   ``trainer.v1.trainer_mode`` a run uses validates and applies the length keys.

The legacy ``RayPPOTrainer`` (``trainer.use_v1=false``), which has no group-level hook, refuses a config that
enables length shaping (``verl_adapter.platform.legacy_trainer``).

See ``docs/verl.md`` for why this hook and for the config keys.
"""

from __future__ import annotations

from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from trl_length_plugin.host_checks import parameters
from verl_adapter.length_shaping.trainer import LengthShapingMixin
from verl_adapter.platform.host import EXPECTED, require_supported_verl, wrap_builtin_trainers

#: the verl methods the length shaping overrides, with their parameters in verl 0.9.1
HOOKS = (
    (trainer_base.PPOTrainer, "_compute_advantage", ("self", "batch", "metrics")),
    (trainer_base.PPOTrainer, "_build_replay_buffer", ("self",)),
    (trainer_base.PPOTrainer, "_init_tokenizer", ("self",)),
    (ReplayBuffer, "_dapo_filtered_keys", ("self", "partition_id")),
)


def check_verl_hooks() -> None:
    """Raise ImportError naming the expected version when verl is not the one these hooks were written for."""
    require_supported_verl("verl_adapter.length_shaping.register")
    changed = [
        f"{cls.__name__}.{name}"
        for cls, name, params in HOOKS
        if parameters(getattr(cls, name, None)) != params
    ]
    if not isinstance(getattr(trainer_base, "TRAINER_REGISTRY", None), dict):
        changed.append("trainer_base.TRAINER_REGISTRY")
    if changed:
        raise ImportError(
            f"the verl V1 trainer hooks used for length shaping changed ({', '.join(changed)}); "
            f"this verl_adapter supports {EXPECTED}"
        )


def register() -> None:
    """Wrap the built-in V1 trainers (idempotent)."""
    wrap_builtin_trainers(LengthShapingMixin, "LengthShaping", __name__)


check_verl_hooks()
register()
