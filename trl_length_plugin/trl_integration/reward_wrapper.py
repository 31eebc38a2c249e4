"""``LengthPenaltyReward``: the group length penalties (decisions.md §2) for the stock ``GRPOTrainer``.

Reward functions see only their own rank's completions and a group may be split across ranks
(host-trl.md §2.3), so the wrapper gathers what the penalties need itself: every rank calls reward
functions in the same order, and the gather order is the sampler order, so the gathered rows form
consecutive groups of ``num_generations``. It returns this rank's part of ``shaped - correctness``,
the ``length_penalty`` column of decisions.md §2.4, and gives the same rewards as
``LengthPluginGRPOTrainer`` for the group penalties (shared code in ``rollouts.py``).

Use it next to the correctness reward::

    penalty = LengthPenaltyReward(correctness_reward, {"default": {"group_total_length_penalty_coeff": 0.1}},
                                  num_generations=8, tokenizer=tokenizer)
    GRPOTrainer(..., reward_funcs=[correctness_reward, penalty],
                callbacks=[LengthPluginCallback(targets=[penalty])])

Evaluation batches are never shaped (§2.15) nor grouped: the column is 0, or ``None`` where the correctness
reward is ``None``. The wrapper tells them apart by the model of the trainer that calls it (the owner of
the ``log_metric`` TRL passes), else by the model the callback attached.

Limits of this route: it must stay synchronous (it runs collectives); it calls the correctness function
a second time; the coefficient and its advantage normalization (§3) need the subclass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from accelerate import PartialState

from trl_length_plugin.shaping import LengthPenaltyConfig
from trl_length_plugin.trl_integration.config import parse_length_penalty
from trl_length_plugin.trl_integration.rollouts import (
    LocalRollouts,
    gather_rollouts,
    group_penalties,
    measure_channels,
    nested_metadata_warning,
    resolve_reasoning_tags,
    uses_tokens,
)

logger = logging.getLogger("trl_length_plugin")


class LengthPenaltyReward:
    """A TRL reward function returning the ``length_penalty`` column for this rank's rows.

    ``length_penalty``: the §2.1 block (mapping, JSON string, YAML path or ``LengthPenaltyConfig``);
    ``num_generations``: TRL's G; ``tokenizer``: required when some agent counts ``tokens``;
    ``metrics``: when true (default), the §2.15 metrics go to TRL's logs through ``log_metric``.
    """

    __name__ = "length_penalty"

    def __init__(
        self,
        correctness: Callable[..., Sequence[float | None]],
        length_penalty: LengthPenaltyConfig | Mapping[str, Any] | str,
        num_generations: int,
        tokenizer: Any = None,
        reasoning_tags: Sequence[str] = ("<think>", "</think>"),
        agent_column: str = "agent",
        metrics: bool = True,
    ):
        config = length_penalty if isinstance(length_penalty, LengthPenaltyConfig) else None
        config = config or parse_length_penalty(length_penalty)
        if config is None or not config.any_enabled:
            raise ValueError("length_penalty: the block enables no agent; the wrapper would do nothing")
        if uses_tokens(config) and tokenizer is None:
            raise ValueError("length_penalty: length_type 'tokens' needs a tokenizer (decisions.md §2.5)")
        if num_generations < 2:
            raise ValueError(f"num_generations must be >= 2, got {num_generations}")
        self.correctness = correctness
        self.config = config
        self.num_generations = num_generations
        self.tokenizer = tokenizer
        self.reasoning_tags = resolve_reasoning_tags(config, reasoning_tags)
        self.agent_column = agent_column
        self.metrics = metrics
        self.weight = 1.0
        self.model = None
        self._checked_nesting = False

    # -- LengthPluginCallback target protocol -------------------------------------------------------------
    def set_length_schedule(self, name: str, value: float) -> None:
        if name != "length_penalty_weight":
            raise ValueError(f"the reward wrapper schedules only length_penalty_weight, not {name!r}")
        self.weight = value

    def attach_model(self, model) -> None:
        """Remember the model so evaluation batches (``model.training`` false) are left unshaped."""
        self.model = model

    def _training(self, log_metric) -> bool:
        """TRL's own test (``self.model.training`` of the calling trainer, whose bound ``_log_metric`` is
        ``log_metric``), falling back on the attached model; unknown counts as training."""
        trainer = getattr(log_metric, "__self__", None)
        model = getattr(trainer, "model", None)
        model = self.model if model is None else model
        return model is None or model.training

    # -- the reward function ------------------------------------------------------------------------------
    def __call__(
        self, prompts, completions, completion_ids=None, log_metric=None, **columns
    ) -> list[float | None]:
        raw = self.correctness(
            prompts=prompts, completions=completions, completion_ids=completion_ids, **columns
        )
        if not self._training(log_metric):
            return [None if r is None else 0.0 for r in raw]
        if not self._checked_nesting:
            self._checked_nesting = True
            first = {key: values[0] for key, values in columns.items() if isinstance(values, list) and values}
            warning = nested_metadata_warning(first)
            if warning:
                logger.warning(warning)
        state = PartialState()
        local_correctness = torch.tensor(
            [float("nan") if r is None else float(r) for r in raw], dtype=torch.float64
        )
        local = LocalRollouts.from_columns(completions, columns, self.agent_column)
        channels = measure_channels(local, self.config, self.tokenizer, self.reasoning_tags)
        values = torch.cat([local_correctness.unsqueeze(1), channels.double()], dim=1)
        rollouts = gather_rollouts(local, values, state.device)
        correctness = rollouts.values[:, 0]
        rollouts.values = rollouts.values[:, 1:]
        result = group_penalties(
            correctness, self.num_generations, rollouts, self.config, state.is_main_process
        )
        if self.metrics and log_metric is not None:  # every rank logs the same global values
            for key, value in result.metrics.items():
                log_metric(key, value)
        rows = len(completions)
        mine = slice(state.process_index * rows, (state.process_index + 1) * rows)
        delta = (result.rewards.double() - correctness)[mine] * self.weight
        return [None if d != d else float(d) for d in delta.tolist()]
