"""Entry point of the ``verl.plugins`` group: ``import verl`` imports this module in every process.

verl swallows plugin import errors at debug level, so a failure here is logged at ERROR level with the
traceback, kept in ``LOAD_ERRORS``, and fails closed: every verl trainer then refuses, in the TaskRunner
before any worker starts, a config that uses one of the plugin's keys or its ``luspo`` loss, naming the
load error, instead of training on raw rewards (docs/reference/product.md §1.5).
"""

from __future__ import annotations

import importlib
import logging

logger = logging.getLogger("trl_length_plugin")

#: modules whose import registers something with verl
_REGISTERING_MODULES = ("verl_adapter.luspo", "verl_adapter.length_shaping", "verl_adapter.score_centering")
#: top-level config keys (and their prefixes) that only this plugin understands
PLUGIN_KEY_PREFIXES = (
    "length_penalty",
    "reasoning_tags",
    "drop_zero_std_groups",
    "score_centering",
    "force_on_policy_ratio",
)

LOAD_ERRORS: dict[str, BaseException] = {}


def plugin_features(config) -> list[str]:
    """What in a verl config needs this plugin: its top-level keys and ``loss_mode=luspo``."""
    keys = [str(key) for key in config if str(key).startswith(PLUGIN_KEY_PREFIXES)]
    policy_loss = config.actor_rollout_ref.actor.get("policy_loss") or {}
    if policy_loss.get("loss_mode") == "luspo":
        keys.append("actor_rollout_ref.actor.policy_loss.loss_mode=luspo")
    return keys


def _refusing(cls: type) -> type:
    """``cls`` whose constructor refuses a config that needs the plugin (which failed to load)."""

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

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__})


def fail_closed() -> None:
    """Make verl's V1 trainers and its legacy trainer refuse configs that need the plugin."""
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.v1 import trainer_base

    registry = trainer_base.TRAINER_REGISTRY
    for name, cls in list(registry.items()):
        registry[name] = _refusing(cls)
    ray_trainer.RayPPOTrainer = _refusing(ray_trainer.RayPPOTrainer)


for _name in _REGISTERING_MODULES:
    try:
        importlib.import_module(_name)
    except Exception as err:  # noqa: BLE001 - reported loudly and fails closed, see module docstring
        LOAD_ERRORS[_name] = err
        logger.error("trl-length-plugin: could not load %s into verl: %r", _name, err, exc_info=True)
if LOAD_ERRORS:
    try:
        fail_closed()
    except Exception as err:  # noqa: BLE001 - verl itself is broken: its own imports will fail too
        logger.error("trl-length-plugin: could not guard verl's trainers: %r", err)
