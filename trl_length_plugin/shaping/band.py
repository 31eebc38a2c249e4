"""Profile-band multipliers and the profile gate (decisions.md §2.12, §2.13), on packed groups."""

from __future__ import annotations

import torch

from .config import BAND_CHANNELS
from .groups import row_count, row_sum

GATE_REASONS = ("disabled", "missing_profile_limit", "no_lengths", "mean_le_limit", "mean_gt_limit")
GATE_FIELDS = ("a", "b", "f")
_MISSING, _NO_LENGTHS, _LE, _GT = 1, 2, 3, 4


def gate_limits(bands: dict[str, torch.Tensor], channel: torch.Tensor, field: torch.Tensor) -> torch.Tensor:
    """Per group, ``band[channel][field]`` of the merged band (NaN when missing); ``channel`` and ``field``
    index ``BAND_CHANNELS`` and ``GATE_FIELDS``."""
    stacked = torch.stack([bands[ch] for ch in BAND_CHANNELS], dim=1)  # (G, channel, field)
    return stacked[torch.arange(stacked.shape[0]), channel, field]


def profile_gate(
    enabled: torch.Tensor,
    limit: torch.Tensor,
    positive_only: torch.Tensor,
    lengths: torch.Tensor,
    positive: torch.Tensor,
    processed: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(open, mean, reason)`` per group: open only when the mean channel length of the positives (or of
    all rows) is above the limit; fails closed on a missing limit or no rows (§2.13). ``reason`` indexes
    ``GATE_REASONS``; a group whose agent has no gate is open with reason ``disabled``. Row matrices are
    slot-major ``[width, groups]``."""
    member = (positive & positive_only) | (processed & ~positive_only)
    count = row_count(member)
    mean = row_sum(lengths * member) / count
    reason = torch.full_like(count, _LE)
    reason[mean > limit] = _GT
    reason[count == 0] = _NO_LENGTHS
    reason[torch.isnan(limit)] = _MISSING
    reason[~enabled] = 0
    return ~enabled | (reason == _GT), mean, reason


def band_multiplier(length: torch.Tensor, band: torch.Tensor, apply: torch.Tensor) -> torch.Tensor:
    """1 up to ``a``, linear down to ``f`` at ``b``, ``f`` beyond (§2.12); 1 where ``apply`` is false or
    the group has no band (NaN). ``band`` is (groups, 3) ``a, b, f``; ``length`` is ``[width, groups]``."""
    a, b, f = band.unbind(-1)
    missing = torch.isnan(a)
    a, b = a.nan_to_num(0.0), b.nan_to_num(1.0)
    shrink = (1 - f).nan_to_num(0.0).masked_fill(missing, 0.0)
    fraction = (length - a).div_(b - a).clamp_(0, 1).mul_(shrink).mul_(apply)
    return fraction.neg_().add_(1)
