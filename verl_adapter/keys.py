"""The top-level keys of a verl config that only this plugin reads, from the pydantic models that declare
them (``trl_length_plugin.plugin_keys``; docs/reference/product.md §1.3, §1.5).

Needs only pydantic: the plugin's entry point reads them only when its trainers refuse a config.
"""

from __future__ import annotations

from trl_length_plugin.plugin_keys import KEY_FAMILIES
from trl_length_plugin.score_centering import SCORE_CENTERING_KEYS
from trl_length_plugin.shaping import SHAPING_KEYS

#: TRL's zero-std filter: verl filters with its own ``algorithm.filter_groups``, so the key is refused with
#: that pointer (reference §3.3)
DROP_ZERO_STD = "drop_zero_std_groups"
#: the length-shaping keys verl reads
VERL_KEYS = tuple(key for key in SHAPING_KEYS if key != DROP_ZERO_STD)
#: of the TRL config's own keys (``HostKeys``), the one verl reads: one ``Length penalty:`` line per rollout
#: instead of the step's summary (reference §3.4)
LOG_ROLLOUTS = "length_penalty_log_rollouts"
#: every top-level key the plugin reads in verl (``DROP_ZERO_STD`` for its pointer)
PLUGIN_KEYS = (*VERL_KEYS, LOG_ROLLOUTS, *SCORE_CENTERING_KEYS, DROP_ZERO_STD)


def is_plugin_key(key: str) -> bool:
    """Whether a top-level key is the plugin's: one of its keys, or a misspelt member of a family."""
    return key in PLUGIN_KEYS or key.startswith(KEY_FAMILIES)
