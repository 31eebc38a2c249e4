"""Loss-side math of the core: LUSPO (docs/reference/luspo.md §4). Score centering has its own package,
``trl_length_plugin.score_centering``."""

from __future__ import annotations

from trl_length_plugin.losses.luspo import luspo_loss

__all__ = ["luspo_loss"]
