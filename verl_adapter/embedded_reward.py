"""The embedded task's reward in verl's ``custom_reward_function`` form (``trl-length verl-smoke``'s data):
1.0 for ``<think>…</think>`` followed by exactly the answer, else 0.0 (docs/embedded.md)."""

from __future__ import annotations

from trl_length_plugin.embedded.task import score_completion


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """verl's reward-function signature."""
    return score_completion(solution_str, ground_truth)
