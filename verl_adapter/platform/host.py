"""The verl version this adapter was written for, checked once at import (docs/reference/product.md §1.5),
and the legacy trainer's guard (docs/verl.md, "Not supported")."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import verl
from packaging.version import Version

SUPPORTED_VERL = (Version("0.9.1"), Version("0.10"))
EXPECTED = f"verl >={SUPPORTED_VERL[0]},<{SUPPORTED_VERL[1]} (written for 0.9.1)"


def require_supported_verl(feature: str) -> None:
    """Raise ImportError naming the expected verl version when the installed one is outside it."""
    if not SUPPORTED_VERL[0] <= Version(verl.__version__) < SUPPORTED_VERL[1]:
        raise ImportError(
            f"{feature} supports {EXPECTED}; found verl {verl.__version__}. "
            "Install 'trl-length-plugin[verl]'."
        )


#: the built-in V1 trainers the adapter's mixins go in front of
BUILTIN_TRAINERS = ("sync", "colocate_async", "separate_async")


def wrap_builtin_trainers(mixin: type, prefix: str, module: str) -> None:
    """Put ``mixin`` in front of each built-in V1 trainer in verl's trainer registry (idempotent); the new
    classes are named ``prefix`` + the trainer's name, in ``module``."""
    from verl.trainer.ppo.v1 import trainer_base

    registry = trainer_base.TRAINER_REGISTRY
    for name in BUILTIN_TRAINERS:
        base = registry[name]
        if not issubclass(base, mixin):
            registry[name] = type(f"{prefix}{base.__name__}", (mixin, base), {"__module__": module})


def refuse_in_legacy_trainer(feature: str, enabled: Callable) -> None:
    """Wrap ``RayPPOTrainer.__init__`` (once per feature) so that a legacy run (``trainer.use_v1=false``) whose
    config ``enabled`` says uses ``feature`` fails before any worker starts instead of silently ignoring it."""
    from verl.trainer.ppo import ray_trainer

    original = ray_trainer.RayPPOTrainer.__init__
    guarded = getattr(original, "plugin_guards", ())
    if feature in guarded:
        return

    @functools.wraps(original)
    def __init__(self, config, *args, **kwargs):
        if enabled(config):
            raise NotImplementedError(
                f"{feature} needs verl's V1 trainer (trainer.use_v1=true, the default); the legacy "
                "RayPPOTrainer (trainer.use_v1=false) has no hook for it and would train without it"
            )
        original(self, config, *args, **kwargs)

    __init__.plugin_guards = (*guarded, feature)
    ray_trainer.RayPPOTrainer.__init__ = __init__


def checkpoint_folder(trainer_config, global_steps: int) -> str:
    """Step ``global_steps``'s checkpoint folder in verl 0.9.1's layout, ``default_local_dir/global_step_<n>``,
    where ``_save_checkpoint`` writes and the plugin saves its own state beside it."""
    return os.path.join(trainer_config.default_local_dir, f"global_step_{global_steps}")


def resumed_checkpoint_folder(trainer_config, global_steps: int) -> str:
    """The checkpoint folder verl's ``_load_checkpoint`` resumed from: ``trainer.resume_from_path`` in
    ``resume_path`` mode, else :func:`checkpoint_folder`, absolute."""
    if trainer_config.resume_mode == "resume_path":
        return os.path.abspath(trainer_config.resume_from_path)
    return os.path.abspath(checkpoint_folder(trainer_config, global_steps))
