"""The TRL 1.16 integration: config, trainer, reward wrapper and callback (docs/reference/length-penalties.md
§2-4), and TRL's command line ``trl-length-grpo`` (``cli``, ``cli_help``, ``keys``: the TRL keys the plugin
checks).

The trainer's names need TRL (``pip install 'trl-length-plugin[trl]'``); they are exported lazily, so the
command line checks a recipe (pydantic only) before TRL is imported, and a missing TRL is one error naming the
extra. The core does not need TRL.
"""

from __future__ import annotations

from trl_length_plugin._optional import lazy_exports, require

_EXPORTS = {
    "LengthPenaltyReward": "reward_wrapper",
    "LengthPluginCallback": "callback",
    "LengthPluginGRPOConfig": "config",
    "LengthPluginGRPOTrainer": "trainer",
    "linear_warmup": "callback",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS, lambda: require("trl", "trl"))
