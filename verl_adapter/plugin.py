"""Entry point of the ``verl.plugins`` group: ``import verl`` imports this module in every process.

It imports nothing of verl's and registers lazily (docs/reference/product.md §1.5): each of the adapter's
registering modules is imported right after verl itself has imported the verl module it registers with
(``REGISTRATIONS``), so a process pays for the plugin only where verl loads that part itself (the trainer
in the TaskRunner, the losses in the actor workers), and a bare ``import verl`` stays as cheap as without
the plugin (``bench/bench_verl_import.py``). It also makes verl's TRL probe answer whether TRL has the class verl
imports after asking (``platform.patches.install``: verl beside TRL 1.16, docs/verl.md).

verl swallows plugin import errors at debug level, so a failure in a registering module is logged at ERROR
level with the traceback, kept in ``LOAD_ERRORS`` of that process, and fails closed there: a verl trainer
then refuses, before any worker starts, a config that uses one of the plugin's keys or its ``luspo`` loss,
naming the load error, instead of training on raw rewards (docs/reference/product.md §1.5). A module that
only a worker imports (the losses) fails in that worker, when verl imports the module it registers with.
"""

from __future__ import annotations

import functools
import importlib
import logging

from verl_adapter.platform import patches
from verl_adapter.platform.after_import import after_import

logger = logging.getLogger("trl_length_plugin")

#: verl module -> the adapter modules that register with it, imported right after verl imported it
REGISTRATIONS: dict[str, tuple[str, ...]] = {
    # the policy loss luspo and the advantage estimator length_grpo
    "verl.trainer.ppo.core_algos": ("verl_adapter.luspo", "verl_adapter.length_shaping.advantage"),
    "verl.workers.utils.losses": ("verl_adapter.score_centering.loss",),  # the policy loss score_centering
    "verl.trainer.ppo.ray_trainer": (
        "verl_adapter.platform.legacy_trainer",
    ),  # the legacy trainer's refusals
    # the mixins in front of the V1 trainers (the package imports them all)
    "verl.trainer.ppo.v1": ("verl_adapter.length_shaping.register", "verl_adapter.score_centering.register"),
}
LOAD_ERRORS: dict[str, BaseException] = {}
#: the verl modules of ``REGISTRATIONS`` whose registrations have run in this process
_REGISTERED: set[str] = set()


def plugin_features(config) -> list[str]:
    """What in a verl config needs this plugin: its top-level keys and ``loss_mode=luspo``."""
    from verl_adapter.keys import is_plugin_key  # pydantic: only a refusing trainer pays for it

    keys = [str(key) for key in config if is_plugin_key(str(key))]
    policy_loss = config.actor_rollout_ref.actor.get("policy_loss") or {}
    if policy_loss.get("loss_mode") == "luspo":
        keys.append("actor_rollout_ref.actor.policy_loss.loss_mode=luspo")
    return keys


def _refusing(cls: type) -> type:
    """``cls`` whose constructor refuses a config that needs the plugin (which failed to load)."""
    if getattr(cls, "plugin_refuses", False):
        return cls

    def __init__(self, config, *args, **kwargs):
        features = plugin_features(config)
        if features:
            errors = "; ".join(f"{name}: {err!r}" for name, err in LOAD_ERRORS.items())
            raise RuntimeError(
                f"the config uses {', '.join(features)} but trl-length-plugin failed to load into verl "
                f"({errors}); nothing would apply them. Fix the installation (pip install "
                "'trl-length-plugin[verl]') or remove those keys."
            )
        cls.__init__(self, config, *args, **kwargs)

    namespace = {"__init__": __init__, "__module__": cls.__module__, "plugin_refuses": True}
    return type(cls.__name__, (cls,), namespace)


def fail_closed() -> None:
    """Make verl's V1 trainers and its legacy trainer, of those verl has imported, refuse configs that need
    the plugin (idempotent)."""
    if "verl.trainer.ppo.v1" in _REGISTERED:
        from verl.trainer.ppo.v1 import trainer_base

        registry = trainer_base.TRAINER_REGISTRY
        for name, cls in list(registry.items()):
            registry[name] = _refusing(cls)
    if "verl.trainer.ppo.ray_trainer" in _REGISTERED:
        from verl.trainer.ppo import ray_trainer

        ray_trainer.RayPPOTrainer = _refusing(ray_trainer.RayPPOTrainer)


def register_with(verl_module: str) -> None:
    """Import the adapter modules that register with ``verl_module`` (once); on a failure, fail closed."""
    if verl_module in _REGISTERED:
        return
    _REGISTERED.add(verl_module)
    for name in REGISTRATIONS[verl_module]:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - reported loudly and fails closed, see module docstring
            LOAD_ERRORS[name] = err
            logger.error("trl-length-plugin: could not load %s into verl: %r", name, err, exc_info=True)
    if LOAD_ERRORS:
        try:
            fail_closed()
        except Exception as err:  # noqa: BLE001 - verl itself is broken: its own imports will fail too
            logger.error("trl-length-plugin: could not guard verl's trainers: %r", err)


def install() -> None:
    """Patch what verl needs patched (``platform.patches``); register now with the verl modules already imported,
    and right after import with the others."""
    try:
        patches.install()
    except Exception as err:  # noqa: BLE001 - verl swallows entry-point errors: reported loudly here; the
        # plugin's own features do not depend on this patch, so they stay on
        logger.error("trl-length-plugin: %s", err)
    for verl_module in REGISTRATIONS:
        if verl_module not in _REGISTERED:
            after_import(verl_module, functools.partial(register_with, verl_module))


install()
