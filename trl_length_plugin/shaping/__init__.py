"""Framework-free length shaping (docs/reference/length-penalties.md, docs/reference/length-coefficient.md):
the typed config, the registered length terms (``terms``), the length coefficient, its group normalization
and filter, length measurement, log lines, :func:`shape_rollouts`, the one step every host runs, and
:class:`ShapingRun`, the run object every host holds. The names exported here are the host contract
(docs/write-a-host.md).

Needs only torch, numpy and pydantic (docs/reference/product.md §1.2). Names are exported lazily, so
``trl_length_plugin.shaping.config`` imports with pydantic alone (the command line validates a recipe with
it before torch is imported).
"""

from __future__ import annotations

from trl_length_plugin._optional import lazy_exports

_EXPORTS = {
    "RolloutBatch": "batch",
    "LengthCoefficientResult": "coefficient",
    "apply_length_coefficient": "coefficient",
    "SHAPING_KEYS": "config",
    "LengthConfigError": "config",
    "LengthPenaltyConfig": "config",
    "LengthPenaltyParams": "config",
    "LengthShapingConfig": "config",
    "ProfileBandChannel": "config",
    "ProfileBandConfig": "config",
    "load_length_penalty_config": "config",
    "length_limit_error": "config",
    "load_shaping_config": "config",
    "GroupLayout": "groups",
    "ChannelLengths": "lengths",
    "completion_channels": "lengths",
    "measure_lengths": "lengths",
    "measure_token_ids": "lengths",
    "split_reasoning": "lengths",
    "length_penalty_lines": "log",
    "length_penalty_summary": "log",
    "log_length_coefficient": "log",
    "MetadataCache": "metadata",
    "mean_metrics": "metrics",
    "PromptMetadata": "metadata",
    "parse_prompt_metadata": "metadata",
    "GroupNormalization": "normalization",
    "TRL_NORMALIZATION": "normalization",
    "group_advantages": "normalization",
    "trl_normalization": "normalization",
    "verl_normalization": "normalization",
    "nonzero_std_keep_mask": "normalization",
    "METRIC_KEYS": "penalties",
    "LengthPenaltyResult": "penalties",
    "apply_length_penalties": "penalties",
    "ShapingResult": "pipeline",
    "shape_rollouts": "pipeline",
    "GroupRecord": "records",
    "entry_key": "rows",
    "metadata_entries": "rows",
    "metadata_entry": "rows",
    "truncated_rows": "rows",
    "ShapingRun": "run",
    "format_group_record": "records",
    "log_group_records": "records",
    "add_target_lengths": "targets",
    "PromptColumn": "terms",
    "metadata_columns": "terms",
    "register_term": "terms",
    "prompt_with_target": "targets",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
