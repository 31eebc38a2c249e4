"""Score centering, the whole capability and framework-free (docs/reference/score-centering.md §5): the
hosts (``trl_integration``, ``verl_adapter``) only translate their data and hooks and call this package.

- ``config``: the shared keys, :func:`~trl_length_plugin.score_centering.config.resolve_mode` and the
  load-time rules, each naming the host's key (§5.5, §5.7, §5.8);
- ``modes``: the importance-sampling modes, one module each, registered (§5.1's table, §5.5, §5.7;
  docs/write-a-mode.md);
- ``estimator``: the correction C, the sampled-token weights and the §5.6 metrics (§5.1, §5.6);
- ``topk_logprobs``: the trainer's logprobs at the sampler's K ids in one pass (§5.4);
- ``capture``: vLLM request checks and head extraction, read by duck typing (§5.2, §5.3);
- ``controller``: the adaptive-ppo-clip controller, its metric names and checkpoint file (§5.7).

Names are re-exported lazily so that importing the config (pydantic only) never imports torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ScoreCenteringConfig": "config",
    "resolve_mode": "config",
    "ImportanceSampling": "modes",
    "register_mode": "modes",
    "unregister_mode": "modes",
    "compute_score_centering_term": "estimator",
    "sampled_token_weights": "estimator",
    "score_centering_metrics": "estimator",
    "score_centering_token_metrics": "estimator",
    "score_centering_outputs": "estimator",
    "policy_logprobs_at_sampler_topk": "topk_logprobs",
    "logprobs_at_ids": "topk_logprobs",
    "ScoreCenteringCaptureError": "capture",
    "build_score_centering_request_overrides": "capture",
    "validate_score_centering_request": "capture",
    "extract_score_centering_samples": "capture",
    "extract_flat_score_centering_samples": "capture",
    "extract_listed_score_centering_samples": "capture",
    "extract_sampled_token_logprobs": "capture",
    "AdaptiveClipController": "controller",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
