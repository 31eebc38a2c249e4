"""Loss-side math of the core: LUSPO (docs/reference/luspo.md §4) and score centering (docs/reference/score-centering.md §5).

Names are re-exported lazily so that importing one loss never imports the other.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "luspo_loss": "trl_length_plugin.losses.luspo",
    "compute_score_centering_term": "trl_length_plugin.losses.score_centering",
    "score_centering_metrics": "trl_length_plugin.losses.score_centering",
    "sampled_token_weights": "trl_length_plugin.losses.score_centering",
    "AdaptiveClipController": "trl_length_plugin.losses.adaptive_controller",
    "ScoreCenteringConfig": "trl_length_plugin.losses.score_centering_config",
    "policy_logprobs_at_sampler_topk": "trl_length_plugin.losses.topk_logprobs",
    "logprobs_at_ids": "trl_length_plugin.losses.topk_logprobs",
    "score_centering_token_metrics": "trl_length_plugin.losses.score_centering",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
