"""Group normalization and the non-zero-std filter that go with the length coefficient (docs/reference/length-coefficient.md §3.3).

Groups are classified by their raw correctness rewards: all-correct (every raw reward exactly 1.0),
all-wrong (no raw reward > 0, the positivity of §2.4) and mixed (the rest). All-correct groups are
mean-centred without std scaling, all-wrong groups get 0, mixed groups get the host trainer's
normalization computed on the shaped rewards:

- TRL ``GRPOTrainer``: ``(r - mean) / (std + 1e-4)``, unbiased std, per group (``scale_rewards="group"``)
  or over the whole batch (``std_scope="batch"``), a NaN (unscorable) row leaves the statistics and
  gets 0; ``scale_rewards="none"`` is ``scale_by_std=False``.
- verl ``compute_grpo_outcome_advantage``: the same with ``std_eps=1e-6`` and a group of one row using
  mean 0 and std 1 (``single_row_stats=(0.0, 1.0)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

from trl_length_plugin.config_base import did_you_mean

from .batch import as_float_tensor
from .groups import Bucket, GroupLayout, row_all, row_any, row_count, row_min_max, row_sum, weights
from .threads import single_threaded

ALL_CORRECT_MIN_RANGE = 1e-6  # §3.3
StdScope = Literal["group", "batch"]
STD_SCOPES: tuple[str, ...] = get_args(StdScope)


@dataclass(frozen=True)
class GroupNormalization:
    """A host's group normalization of mixed groups (the keyword arguments of :func:`group_advantages`)."""

    scale_by_std: bool = True
    std_eps: float = 1e-4
    std_scope: StdScope = "group"
    single_row_stats: tuple[float, float] | None = None


#: TRL ``GRPOTrainer``'s advantage epsilon
TRL_STD_EPS = 1e-4


def trl_normalization(scale_rewards: str) -> GroupNormalization:
    """TRL ``GRPOTrainer``'s normalization of mixed groups for its ``scale_rewards`` setting (the trainer's
    and ``trl-length preview``'s, which needs no TRL)."""
    return GroupNormalization(
        scale_by_std=scale_rewards != "none",
        std_eps=TRL_STD_EPS,
        std_scope="batch" if scale_rewards == "batch" else "group",
    )


#: TRL ``GRPOTrainer`` with ``scale_rewards="group"``
TRL_NORMALIZATION = trl_normalization("group")


def verl_normalization(norm_adv_by_std: bool) -> GroupNormalization:
    """verl ``compute_grpo_outcome_advantage``'s normalization for ``algorithm.norm_adv_by_std_in_grpo``:
    epsilon 1e-6, a one-row group with mean 0 and std 1 (its ``length_grpo`` estimator's)."""
    return GroupNormalization(scale_by_std=norm_adv_by_std, std_eps=1e-6, single_row_stats=(0.0, 1.0))


def _inputs(shaped: Any, raw: Any, group_index: Any) -> tuple[torch.Tensor, torch.Tensor, GroupLayout]:
    values = as_float_tensor(shaped, "shaped")
    truth = as_float_tensor(raw, "raw").double()
    layout = GroupLayout.of(group_index)
    if not values.numel() == truth.numel() == layout.num_rows:
        raise ValueError("shaped, raw and group_index must have one entry per row")
    return values, truth, layout


def _all_correct(bucket: Bucket, packed_raw: torch.Tensor) -> torch.Tensor:
    """Per group: every raw reward (packed) is exactly 1.0."""
    return row_all((packed_raw == 1.0) | ~bucket.valid)


def _check_scope(std_scope: str) -> None:
    if std_scope not in STD_SCOPES:
        raise ValueError(
            f"std_scope: {std_scope!r} is not one of {', '.join(map(repr, STD_SCOPES))}"
            + did_you_mean(str(std_scope), STD_SCOPES)
        )


@single_threaded()
def group_advantages(
    shaped: Any,
    raw: Any,
    group_index: Any,
    scale_by_std: bool = True,
    std_eps: float = 1e-4,
    *,
    std_scope: StdScope = "group",
    single_row_stats: tuple[float, float] | None = None,
    plain_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Advantages per row from shaped rewards (docs/reference/length-coefficient.md §3.3), in the dtype of ``shaped``.

    ``single_row_stats``: the (mean, std) a group of one row uses (verl: ``(0.0, 1.0)``); ``None`` gives
    such a mixed group the advantage 0 (TRL, where its std is undefined). ``plain_rows`` (per row, bool):
    the groups of these rows get the host normalization whatever their raw rewards (groups the coefficient
    skipped, reference §3.1). ``std_scope`` is ``"group"`` or ``"batch"``; anything else is a ``ValueError``.
    """
    normalization = GroupNormalization(scale_by_std, std_eps, std_scope, single_row_stats)
    return advantages_and_keep(shaped, raw, group_index, normalization, plain_rows, keep=False)[0]


@single_threaded()
def nonzero_std_keep_mask(shaped: Any, raw: Any, group_index: Any, unshaped: Any = None) -> torch.Tensor:
    """Per row, whether its group survives the non-zero-std filter (docs/reference/length-coefficient.md §3.3).

    All-correct groups need a shaped range above 1e-6; mixed groups shaped rewards that are not all equal;
    a group with no correct row (no raw reward > 0) is judged on ``unshaped``, the host's rewards without
    the length terms (default ``raw``, the correctness: such a group is dropped), so a per-rollout term's
    spread never keeps it. NaN rows are ignored.
    """
    return advantages_and_keep(shaped, raw, group_index, None, unshaped=unshaped)[1]


@single_threaded()
def advantages_and_keep(
    shaped: Any,
    raw: Any,
    group_index: Any,
    normalization: GroupNormalization | None,
    plain_rows: torch.Tensor | None = None,
    keep: bool = True,
    unshaped: Any = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """:func:`group_advantages` under ``normalization`` (None: not computed) and, with ``keep``,
    :func:`nonzero_std_keep_mask` (``unshaped``: its judge of groups without a correct row), from one
    packing of the rewards per bucket."""
    if normalization is not None:
        _check_scope(normalization.std_scope)
    values, truth, layout = _inputs(shaped, raw, group_index)
    judge = truth if unshaped is None else as_float_tensor(unshaped, "unshaped").double()
    if judge.numel() != truth.numel():
        raise ValueError("unshaped must have one entry per row")
    x = values.double()
    batch_std = None
    if normalization is not None and normalization.scale_by_std and normalization.std_scope == "batch":
        finite = x[~torch.isnan(x)]
        batch_std = ((finite - finite.mean()).pow(2).sum() / (finite.numel() - 1)).sqrt()
    advantages, kept = [], []
    for bucket in layout.buckets:
        packed = bucket.pack(x)
        valid = bucket.valid & ~torch.isnan(packed)
        packed_truth = bucket.pack(truth)
        all_correct = _all_correct(bucket, packed_truth)
        if normalization is not None:
            plain = None if plain_rows is None else row_any(bucket.pack(plain_rows, False) & bucket.valid)
            advantages.append(
                _advantage(packed, valid, packed_truth, all_correct, bucket, normalization, batch_std, plain)
            )
        if keep:
            kept.append(_survives(packed, valid, packed_truth, all_correct, bucket, bucket.pack(judge)))
    return (
        layout.unpack(advantages).to(values.dtype) if normalization is not None else None,
        layout.unpack(kept, torch.bool) if keep else None,
    )


def _survives(
    packed: torch.Tensor,
    valid: torch.Tensor,
    packed_truth: torch.Tensor,
    all_correct: torch.Tensor,
    bucket: Bucket,
    packed_judge: torch.Tensor,
) -> torch.Tensor:
    """One bucket's keep mask (``[width, Gb]``, §3.3): an all-correct group on its shaped range, a mixed one
    on shaped rewards not all equal, one without a correct row on its unshaped rewards not all equal."""
    lowest, highest = row_min_max(packed.nan_to_num(0.0), valid)
    all_wrong = ~row_any((packed_truth > 0) & bucket.valid)
    judged = bucket.valid & ~torch.isnan(packed_judge)
    judge_low, judge_high = row_min_max(packed_judge.nan_to_num(0.0), judged)
    survives = torch.where(
        all_correct,
        highest - lowest > ALL_CORRECT_MIN_RANGE,
        torch.where(all_wrong, judge_high > judge_low, highest > lowest),
    )
    return survives.expand_as(packed)


def _advantage(
    packed: torch.Tensor,
    valid: torch.Tensor,
    packed_truth: torch.Tensor,
    all_correct: torch.Tensor,
    bucket: Bucket,
    normalization: GroupNormalization,
    batch_std: torch.Tensor | None,
    plain: torch.Tensor | None,
) -> torch.Tensor:
    """One bucket's advantages (``[width, Gb]``) under ``normalization`` (§3.3)."""
    present = weights(valid)  # masks multiply as 1.0 / 0.0 values (faster than bool, the same numbers)
    known = packed.nan_to_num(0.0) * present
    count = row_count(valid)
    centred = (known - row_sum(known) / count.clamp(min=1)) * present
    mixed = centred
    if normalization.scale_by_std:
        std = batch_std if batch_std is not None else (centred.pow(2).sum(0) / (count - 1)).sqrt()
        mixed = centred / (std + normalization.std_eps)
    if normalization.single_row_stats is not None:
        mean, std = normalization.single_row_stats
        single = (
            (known - mean) / (std + normalization.std_eps) if normalization.scale_by_std else known - mean
        )
        alone = count == 1
        mixed = mixed.nan_to_num(0.0) * ~alone + single * alone
    all_wrong = ~row_any((packed_truth > 0) & bucket.valid)
    if plain is not None:
        all_correct, all_wrong = all_correct & ~plain, all_wrong & ~plain
    advantage = mixed.nan_to_num(0.0) * ~all_correct + centred * all_correct
    return advantage * weights(valid & ~all_wrong)
