"""The multiplicative length coefficient relative to the shortest correct rollout (docs/reference/length-coefficient.md §3.1-3.2)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .batch import as_float_tensor, valid_lengths
from .groups import GroupLayout, row_min, weights
from .metrics import mean_metrics
from .threads import single_threaded


@dataclass
class LengthCoefficientResult:
    """``rewards`` = input * ``multipliers``; ``reward_reductions`` = input - ``rewards``; ``raw_rewards``
    is the input; all in the input's dtype. ``lengths``, ``layout`` and ``coeff`` serve the log line."""

    rewards: torch.Tensor
    multipliers: torch.Tensor
    reward_reductions: torch.Tensor
    raw_rewards: torch.Tensor
    lengths: torch.Tensor
    coeff: float
    layout: GroupLayout = field(repr=False)
    group_index: Any = field(repr=False)

    def row_metrics(self) -> dict[str, torch.Tensor]:
        """The coefficient's metrics as per-row values (reference §3); their means are the metrics."""
        return {
            "length_penalty/coeff": torch.full_like(self.lengths, self.coeff),
            "length_penalty/coeff_penalized_frac": weights(self.multipliers < 1),
            "length_penalty/coeff_reward_reduction_mean": torch.nan_to_num(self.reward_reductions.double()),
        }

    def metrics(self) -> dict[str, float]:
        """The coefficient's per-rollout metrics, logged alike by every adapter."""
        return mean_metrics(self.row_metrics())


def finite_number(value: Any, name: str, minimum: float | None = None) -> float:
    """``value`` as a float: a real number (not a bool; a Python, numpy or 0-d tensor scalar), finite and
    at least ``minimum``; else a ``ValueError`` naming ``name``."""
    if isinstance(value, torch.Tensor | np.ndarray) and value.ndim == 0:
        value = value.item()
    number = (
        float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_) else None
    )
    if number is None or not math.isfinite(number) or (minimum is not None and number < minimum):
        bound = f" >= {minimum:g}" if minimum is not None else ""
        raise ValueError(f"{name} must be a finite number{bound}, got {value!r}")
    return number


@single_threaded()
def apply_length_coefficient(
    rewards: Any,
    lengths: Any,
    group_index: Any,
    coeff: float,
    min_tokens: int = 0,
    correctness: Any = None,
) -> LengthCoefficientResult:
    """Multiply correct rollouts by ``1 / (1 + c * max(0, L - L_ref) / L_ref)`` (docs/reference/length-coefficient.md §3.1).

    A row is correct when its raw correctness reward (``correctness``, by default ``rewards``) is exactly
    1.0; L_ref = max(shortest correct L of the group, ``min_tokens``, 1); ``lengths`` are loss-mask token
    counts (§3.2). With group penalties on, pass their result as ``rewards`` and the raw correctness
    reward as ``correctness`` (§3.5). Every other row, and a correct row whose reward is <= 0 (a negative
    rollout reward, §2.6 step 8), keeps multiplier 1: the coefficient never raises a reward.
    """
    coeff = finite_number(coeff, "length_penalty_coeff", minimum=0.0)
    min_tokens = finite_number(min_tokens, "length_penalty_min_tokens", minimum=0.0)
    raw = as_float_tensor(rewards, "rewards")
    values = raw.double()
    length = as_float_tensor(lengths, "lengths").double()
    if length.numel() != values.numel() or not valid_lengths(length):
        raise ValueError("lengths must be one finite count >= 0 (at most 2**53) per reward")
    truth = values if correctness is None else as_float_tensor(correctness, "correctness").double()
    if truth.numel() != values.numel():
        raise ValueError("correctness must have one value per reward")
    correct = truth == 1.0
    layout = GroupLayout.of(group_index)
    if layout.num_rows != values.numel():
        raise ValueError(f"group_index has {layout.num_rows} rows, rewards have {values.numel()}")
    floor = max(float(min_tokens), 1.0)
    parts = []
    for bucket in layout.buckets:
        length_b, correct_b = bucket.pack(length), bucket.pack(correct, False)
        reference = row_min(length_b, correct_b).clamp(min=floor)  # BIG without a correct row
        parts.append(1 / (1 + coeff * (length_b - reference).clamp(min=0) / reference * weights(correct_b)))
    # a value <= 0 keeps multiplier 1: shrinking it would raise the reward of the longer rollout (§3.1)
    multipliers = torch.where(values > 0, layout.unpack(parts), 1.0)
    out = (values * multipliers).to(raw.dtype)
    return LengthCoefficientResult(
        rewards=out,
        multipliers=multipliers.to(raw.dtype),
        reward_reductions=(values - out.double()).to(raw.dtype),
        raw_rewards=raw,
        lengths=length,
        coeff=coeff,
        layout=layout,
        group_index=group_index,
    )
