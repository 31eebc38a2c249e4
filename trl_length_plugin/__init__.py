"""trl-length-plugin: length control for GRPO-style RL post-training.

The core (``shaping``, ``score_centering``, ``losses``) needs only torch, numpy and pydantic
(docs/reference/product.md §1.2). The TRL integration lives in ``trl_length_plugin.trl_integration`` and the
verl integration in the separate ``verl_adapter`` package; neither is imported here.
"""

from trl_length_plugin._logging import library_logger

__version__ = "0.1.0"

library_logger()
