"""Framework-free length shaping (decisions.md §2-3): typed config, the eight group length algorithms,
the length coefficient, its group normalization and filter, length measurement and log lines.

Needs only torch, numpy and pydantic (decisions.md §1.2).
"""

from .batch import RolloutBatch
from .coefficient import LengthCoefficientResult, apply_length_coefficient
from .config import (
    LengthPenaltyConfig,
    LengthPenaltyParams,
    ProfileBandChannel,
    ProfileBandConfig,
    load_length_penalty_config,
)
from .groups import GroupLayout
from .lengths import ChannelLengths, completion_channels, measure_lengths, measure_token_ids, split_reasoning
from .log import length_penalty_lines, log_length_coefficient
from .normalization import group_advantages, nonzero_std_keep_mask
from .penalties import METRIC_KEYS, LengthPenaltyResult, apply_length_penalties
from .records import GroupRecord, format_group_record, log_group_records

__all__ = [
    "METRIC_KEYS",
    "ChannelLengths",
    "GroupLayout",
    "GroupRecord",
    "LengthCoefficientResult",
    "LengthPenaltyConfig",
    "LengthPenaltyParams",
    "LengthPenaltyResult",
    "ProfileBandChannel",
    "ProfileBandConfig",
    "RolloutBatch",
    "apply_length_coefficient",
    "apply_length_penalties",
    "completion_channels",
    "format_group_record",
    "group_advantages",
    "length_penalty_lines",
    "load_length_penalty_config",
    "log_group_records",
    "log_length_coefficient",
    "measure_lengths",
    "measure_token_ids",
    "nonzero_std_keep_mask",
    "split_reasoning",
]
