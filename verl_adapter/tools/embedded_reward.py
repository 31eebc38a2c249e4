"""The reward of ``trl-length verl-smoke``'s own data in verl's ``custom_reward_function`` form
(``smoke_config.SMOKE_TASKS``): the embedded reasoning task's, 1.0 for ``<think>…</think>`` followed by exactly
the answer (docs/embedded.md); the real chat model's arithmetic task's, 1.0 when the last number is the answer
(docs/efficacy.md, "On a real chat model"); else 0.0."""

from __future__ import annotations

from trl_length_plugin.embedded.task import last_number_score, score_completion
from verl_adapter.tools.smoke_config import SMOKE_TASKS


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """verl's reward-function signature."""
    if data_source == SMOKE_TASKS["real"]:
        return last_number_score(solution_str, ground_truth)
    return score_completion(solution_str, ground_truth)
