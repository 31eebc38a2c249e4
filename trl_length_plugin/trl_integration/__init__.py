"""The TRL 1.16 integration: config, trainer, reward wrapper and callback (docs/reference/length-penalties.md §2-4).

Importing this package needs TRL (``pip install 'trl-length-plugin[trl]'``); the core does not.
"""

from trl_length_plugin._optional import require

require("trl", "trl")

from trl_length_plugin.trl_integration.callback import LengthPluginCallback, linear_warmup  # noqa: E402
from trl_length_plugin.trl_integration.config import LengthPluginGRPOConfig  # noqa: E402
from trl_length_plugin.trl_integration.reward_wrapper import LengthPenaltyReward  # noqa: E402
from trl_length_plugin.trl_integration.trainer import LengthPluginGRPOTrainer  # noqa: E402

__all__ = [
    "LengthPenaltyReward",
    "LengthPluginCallback",
    "LengthPluginGRPOConfig",
    "LengthPluginGRPOTrainer",
    "linear_warmup",
]
