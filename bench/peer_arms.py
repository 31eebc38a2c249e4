"""The length controls other frameworks ship, as reward functions of the efficacy grid (docs/efficacy.md).

Each builder returns a reward function with TRL's signature (``completion_ids`` and the dataset columns as
keywords), added to the correctness reward of a run. Where the peer's own code runs here it is used as it
is: TRL's ``get_soft_overlong_punishment`` (DAPO's soft overlong punishment). Where it cannot:

- verl's DAPO reward manager overlong buffer (``overlong_buffer_cfg``) needs verl's ``DataProto`` batches:
  :func:`dapo_overlong_reward` is its formula, and ``tests/test_peer_arms.py`` calls verl's own
  ``DAPORewardManager`` on the same lengths and rewards and finds the same numbers.
- TRL's ``get_cosine_scaled_reward`` judges correctness with math verification, which the task's answers do not
  go through: :func:`cosine_reward` keeps TRL's length schedule on the task's own correctness, and the test
  shows it equals TRL's function given the same correctness.
- Kimi k1.5's length reward (Kimi Team, arXiv 2501.12599, §2.3.3) and a plain per-token penalty have no
  shipped code: their formulas, tested on hand-computed values.

Lengths are ``len(completion_ids)``, TRL's own count (the end-of-sequence token included).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from trl_length_plugin.embedded import correctness_reward

RewardFunction = Callable[..., list[float]]


def _named(name: str, function: RewardFunction) -> RewardFunction:
    function.__name__ = name  # TRL logs rewards/<name>/mean
    return function


def soft_overlong_reward(max_completion_len: int, cache: int) -> RewardFunction:
    """TRL 1.16's own ``trl.rewards.get_soft_overlong_punishment`` (DAPO eq. 13)."""
    from trl.rewards import get_soft_overlong_punishment

    return get_soft_overlong_punishment(max_completion_len, cache)


def dapo_overlong_reward(max_resp_len: int, buffer_len: int, penalty_factor: float = 1.0) -> RewardFunction:
    """verl's DAPO reward manager overlong buffer: ``min(-(n - (max_resp_len - buffer_len)) / buffer_len *
    penalty_factor, 0)`` added to the score."""

    def reward(completion_ids, **_) -> list[float]:
        expected = max_resp_len - buffer_len
        return [min(-(len(ids) - expected) / buffer_len * penalty_factor, 0.0) for ids in completion_ids]

    return _named("dapo_overlong_reward", reward)


def cosine_reward(
    max_len: int,
    correctness: RewardFunction = correctness_reward,
    min_value_wrong: float = -1.0,
    max_value_wrong: float = -0.5,
    min_value_correct: float = 0.5,
    max_value_correct: float = 1.0,
) -> RewardFunction:
    """TRL's cosine-scaled reward (Demystifying Long CoT, App. C.1; TRL's defaults and its clamp at
    ``max_len``) on the task's ``correctness``; it replaces the correctness reward (weight 0 on the latter)."""

    def reward(completions, completion_ids, **columns) -> list[float]:
        rewards = []
        for correct, ids in zip(correctness(completions, **columns), completion_ids, strict=True):
            cosine = math.cos(min(len(ids) / max_len, 1.0) * math.pi)
            low, high = (
                (min_value_correct, max_value_correct) if correct else (max_value_wrong, min_value_wrong)
            )
            rewards.append(low + 0.5 * (high - low) * (1.0 + cosine))
        return rewards

    return _named("cosine_reward", reward)


def kimi_length_reward(
    num_generations: int, weight: float = 1.0, correctness: RewardFunction = correctness_reward
) -> RewardFunction:
    """Kimi k1.5's length reward per group of ``num_generations`` consecutive rows (TRL's group layout):
    lambda = 0.5 - (n - min_n) / (max_n - min_n), the reward lambda for a correct rollout and min(0, lambda)
    for a wrong one; 0 for the whole group when its lengths are equal."""

    def reward(completions, completion_ids, **columns) -> list[float]:
        correct = correctness(completions, **columns)
        lengths = [len(ids) for ids in completion_ids]
        rewards = []
        for start in range(0, len(lengths), num_generations):
            group = lengths[start : start + num_generations]
            shortest, longest = min(group), max(group)
            for n, ok in zip(group, correct[start : start + num_generations], strict=True):
                lam = 0.0 if longest == shortest else 0.5 - (n - shortest) / (longest - shortest)
                rewards.append(weight * (lam if ok else min(0.0, lam)))
        return rewards

    return _named("kimi_length_reward", reward)


def per_token_penalty(alpha: float) -> RewardFunction:
    """A plain per-token length penalty: ``-alpha * n`` for every rollout."""

    def reward(completion_ids, **_) -> list[float]:
        return [-alpha * len(ids) for ids in completion_ids]

    return _named("per_token_length_penalty", reward)
