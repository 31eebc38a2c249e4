"""The one shaping step every host runs: penalties, coefficient, group normalization and the zero-std
filter on one group layout (docs/reference/length-coefficient.md §3.6; its parts:
docs/reference/length-penalties.md §2 and docs/reference/length-coefficient.md §3.1-3.3).

A host adapter translates its rollouts into a :class:`RolloutBatch`, calls :func:`shape_rollouts` once per
training batch and writes the :class:`ShapingResult` back: the shaped correctness rewards, the §3.3
advantages (coefficient on), the keep mask (filter on), the metrics and what the logs need. TRL and verl
give the same numbers by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .batch import RolloutBatch
from .coefficient import LengthCoefficientResult, apply_length_coefficient, finite_number
from .config import LengthShapingConfig
from .correctness import classify_groups
from .groups import GroupLayout, all_set, any_set, weights
from .metrics import mean_metrics
from .normalization import GroupNormalization, advantages_and_keep
from .penalties import LengthPenaltyResult, apply_length_penalties
from .schedule import config_at, schedule_metrics
from .threads import single_threaded
from .truncation import apply_truncation


@dataclass
class ShapingResult:
    """What one shaping step produced, one entry per row of the batch (float64 unless noted).

    - ``rewards``: shaped correctness rewards; ``raw``: the input; ``correctness``: the correctness the step
      judged (``raw`` with truncated rows 0 under ``truncation: incorrect``, reference §2.19).
    - ``totals``: the reward advantages and the filter judge: ``base_rewards + weight * (rewards - raw)``.
    - ``advantages``: the §3.3 group normalization of ``totals`` (coefficient on), else None.
    - ``host_rows`` (bool): rows of groups the coefficient skipped (missing or non-binary correctness): a
      host keeps its own advantages there (``advantages`` holds its plain normalization for them).
    - ``keep`` (bool): rows whose group survives the zero-std filter (filter on), else None; a group with no
      correct row is judged without the length terms (§3.3).
    - ``loss_keep`` (bool): rows whose tokens stay in the loss under ``truncation: mask`` (reference §2.19),
      else None; a host zeroes the loss mask of the others.
    - ``row_metrics``: reference §2.15 and §3 metrics as per-row values; ``metrics``: their means over the
      batch; ``penalties`` / ``coefficient``: the parts' own results (verbose group records, the ``Length
      penalty:`` lines).
    """

    layout: GroupLayout
    rewards: torch.Tensor
    raw: torch.Tensor
    correctness: torch.Tensor
    totals: torch.Tensor
    host_rows: torch.Tensor
    advantages: torch.Tensor | None = None
    keep: torch.Tensor | None = None
    row_metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    penalties: LengthPenaltyResult | None = None
    coefficient: LengthCoefficientResult | None = None
    loss_keep: torch.Tensor | None = None

    @property
    def metrics(self) -> dict[str, float]:
        return mean_metrics(self.row_metrics)


def _coefficient(
    batch: RolloutBatch,
    config: LengthShapingConfig,
    host_rows: torch.Tensor,
    shaped: torch.Tensor,
    coeff: float,
) -> LengthCoefficientResult:
    """§3.1 on the rows of binary groups; the others (``host_rows``) keep multiplier 1 (one warning, one
    metric)."""
    if batch.loss_lengths is None:
        raise ValueError(
            "the length coefficient needs loss_lengths (the loss-mask token count of each rollout)"
        )
    if any_set(host_rows):
        config.warn_once(
            ("coefficient_skipped",),
            "length_penalty_coeff: groups with a missing or non-binary correctness reward are left to the "
            "host's own advantages, counted in length_penalty/coeff_skipped_frac "
            "(docs/reference/length-coefficient.md §3.1)",
        )
        correctness = batch.rewards.double().masked_fill(host_rows, torch.nan)
    else:
        correctness = batch.rewards.double()
    return apply_length_coefficient(
        shaped,
        batch.loss_lengths,
        batch.layout,
        coeff,
        config.length_penalty_min_tokens,
        correctness=correctness,
    )


def shape_rollouts(
    batch: RolloutBatch,
    config: LengthShapingConfig,
    normalization: GroupNormalization | None,
    *,
    step: int = 0,
    shaping_weight: float = 1.0,
) -> ShapingResult:
    """Shape one training batch (reference §2.6 then §3.1-3.3).

    ``normalization``: the host's normalization of mixed groups (every host passes its own, the core has no
    default), or None when the host computes the advantages itself (verl's ``length_grpo`` estimator calls
    the same ``group_advantages``, the stock TRL trainer behind ``LengthPenaltyReward`` its own); ``step``: the
    optimizer step, for ``length_schedule`` and the coefficient's warm-up (§3.7: the values of that step,
    logged as ``length_schedule/<key>``; what is on is judged on ``config``); ``shaping_weight``: the host's
    weight of the shaping in its total reward.
    """
    shaping_weight = finite_number(shaping_weight, "shaping_weight")
    stepped = config_at(config, step)
    with single_threaded():
        layout, raw = batch.layout, batch.rewards.double()
        truncation = apply_truncation(batch, config.penalties)  # before the binary check (§2.19)
        if truncation is not None:
            batch = truncation.batch
        correctness = batch.rewards.double()
        kinds = classify_groups(layout, correctness, batch.multi_component)
        result = ShapingResult(layout, correctness, raw, correctness, raw, (~kinds.binary)[layout.gid])
        if truncation is not None:
            result.row_metrics.update(truncation.row_metrics)
            result.loss_keep = None if all_set(truncation.keep) else truncation.keep
        if config.penalties_on:
            result.penalties = apply_length_penalties(batch, stepped.penalties, kinds)
            result.rewards = result.penalties.rewards.double()
            result.row_metrics.update(result.penalties.row_metrics)
        if config.coefficient_on:
            result.coefficient = _coefficient(
                batch, stepped, result.host_rows, result.rewards, stepped.length_penalty_coeff
            )
            result.rewards = result.coefficient.rewards.double()
            result.row_metrics.update(result.coefficient.row_metrics())
            result.row_metrics["length_penalty/coeff_skipped_frac"] = weights(result.host_rows)
        base = raw if batch.base_rewards is None else batch.base_rewards
        result.totals = base + shaping_weight * (result.rewards - raw).nan_to_num(0.0)
        normalized = normalization if config.coefficient_on else None
        if normalized is not None or config.drop_zero_std_groups:
            unshaped = base + shaping_weight * (correctness - raw).nan_to_num(0.0)  # no length term (§3.3)
            result.advantages, result.keep = advantages_and_keep(
                result.totals,
                correctness,
                layout,
                normalized,
                result.host_rows,
                config.drop_zero_std_groups,
                unshaped,
            )
        if result.keep is not None:
            result.row_metrics["length_penalty/zero_std_filtered_frac"] = weights(~result.keep)
        for name, value in schedule_metrics(config, step).items():
            result.row_metrics[name] = torch.full_like(raw, value)
    return result
