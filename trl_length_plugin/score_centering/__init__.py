"""Score centering, the whole capability and framework-free (docs/reference/score-centering.md §5): the
hosts (``trl_integration``, ``verl_adapter``) only translate their data and hooks and call this package, through
the names exported here (docs/write-a-host.md).

- ``config``: the shared keys and the load-time rules, each naming the host's key (§5.5, §5.7, §5.8);
- ``plan``: a host's settings in the plugin's terms and the one plan resolved from them after every check
  (``resolve_plan``), which a worker process runs;
- ``run``: :class:`~trl_length_plugin.score_centering.run.ScoreCenteringRun`, the object every host holds;
- ``modes``: the importance-sampling modes, one module each, registered (§5.1's table, §5.5, §5.7;
  docs/write-a-mode.md);
- ``estimator``: the correction C, the sampled-token weights and the §5.6 metrics (§5.1, §5.6);
- ``topk_logprobs``: the trainer's logprobs at the sampler's K ids in one pass (§5.4);
- ``capture`` and ``sampling_request``: vLLM head extraction, and what a request must ask for (§5.2, §5.3);
- ``controller``: the adaptive-ppo-clip controller, its metric names and checkpoint file (§5.7).

Names are re-exported lazily so that importing the config (pydantic only) never imports torch.
"""

from __future__ import annotations

from trl_length_plugin._optional import lazy_exports

_EXPORTS = {
    "SAMPLING_FILTER_RULES": "config",
    "SCORE_CENTERING_KEYS": "config",
    "ScoreCenteringConfig": "config",
    "check_is_bounds": "config",
    "check_model_vocabulary": "config",
    "check_sampling_filters": "config",
    "engine_logprob_cap": "config",
    "load_score_centering_config": "config",
    "sampling_filter_error": "config",
    "HostSettings": "plan",
    "HostWeights": "plan",
    "ScoreCenteringPlanBase": "plan",
    "resolve_mode": "plan",
    "resolve_plan": "plan",
    "ScoreCenteringRun": "run",
    "ImportanceSampling": "modes",
    "get_mode": "modes",
    "mode_names": "modes",
    "register_mode": "modes",
    "unregister_mode": "modes",
    "METRIC_KEYS": "estimator",
    "ScoreCenteringOutputs": "estimator",
    "compute_score_centering_term": "estimator",
    "sampled_token_weights": "estimator",
    "sampled_token_weights_from_logprobs": "estimator",
    "score_centering_metrics": "estimator",
    "score_centering_outputs": "estimator",
    "score_centering_token_metrics": "estimator",
    "logprobs_at_ids": "topk_logprobs",
    "policy_logprobs_at_sampler_topk": "topk_logprobs",
    "ScoreCenteringCaptureError": "capture",
    "extract_flat_score_centering_samples": "capture",
    "extract_listed_score_centering_samples": "capture",
    "extract_sampled_token_logprobs": "capture",
    "extract_score_centering_samples": "capture",
    "build_score_centering_request_overrides": "sampling_request",
    "validate_score_centering_request": "sampling_request",
    "AdaptiveClipController": "controller",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
