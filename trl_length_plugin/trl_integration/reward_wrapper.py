"""``LengthPenaltyReward``: the group length penalties (docs/reference/length-penalties.md §2) for the stock ``GRPOTrainer``.

Reward functions see only their own rank's completions and a group may be split across ranks
(docs/trl.md, "How it hooks into TRL"), so the wrapper gathers what the penalties need itself: every rank calls reward
functions in the same order, and the gather order is the sampler order, so the gathered rows form
consecutive groups of the trainer's ``num_generations`` (read from the calling trainer; a different value
given to the wrapper is refused at the first call, as is a value of TRL's own keys that the plugin's config
refuses at load, docs/reference/product.md §1.3). It returns this rank's part of ``shaped -
correctness``, the ``length_penalty`` column of docs/reference/length-penalties.md §2.4, and gives the same
rewards as ``LengthPluginGRPOTrainer`` for the group penalties (both run the core's ``shape_rollouts``).

Use it next to the correctness reward::

    penalty = LengthPenaltyReward(correctness_reward, {"default": {"group_total_length_penalty_coeff": 0.1}},
                                  tokenizer=tokenizer)
    GRPOTrainer(..., reward_funcs=[correctness_reward, penalty],
                callbacks=[LengthPluginCallback(targets=[penalty])])

Evaluation batches are never shaped (§2.15) nor grouped: the column is 0, or ``None`` where the correctness
reward is ``None``. The wrapper tells them apart by the model of the trainer that calls it (the owner of
the ``log_metric`` TRL passes), else by the model the callback attached. It logs its settings line when
built and gives the calling trainer its model-card section (``model_card.LengthCardCallback``).

Per-prompt metadata is parsed once per distinct entry across calls, as in the subclass (``RowMetadata``);
streaming datasets work. Limits of this route: it must stay synchronous (it runs collectives); it calls
the correctness function a second time; the coefficient and its advantage normalization
(docs/reference/length-coefficient.md §3) need the subclass.

From the stock command line, ``trl grpo`` takes a dotted path to a module-level instance, e.g.
``--reward_funcs my_rewards.correctness my_rewards.length_penalty`` where ``my_rewards.py`` defines
``length_penalty = LengthPenaltyReward(correctness, {...}, tokenizer=...)`` (docs/trl.md, "The wrapper
route").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import gather

from trl_length_plugin.shaping import (
    LengthConfigError,
    LengthPenaltyConfig,
    LengthShapingConfig,
    ShapingRun,
    load_shaping_config,
)
from trl_length_plugin.shaping.columns import AGENT_COLUMN
from trl_length_plugin.trl_integration.callback import check_schedule_name
from trl_length_plugin.trl_integration.keys import TRL_KEYS, check_trl_keys
from trl_length_plugin.trl_integration.model_card import LengthCardCallback, wrapper_card
from trl_length_plugin.trl_integration.rollouts import (
    LocalRollouts,
    RowMetadata,
    consecutive_groups,
    gathered_batch,
    nested_metadata_warning,
    truncated_flags,
)

logger = logging.getLogger("trl_length_plugin")


class LengthPenaltyReward:
    """A TRL reward function returning the ``length_penalty`` column for this rank's rows.

    ``length_penalty``: the §2.1 block (mapping, JSON string, YAML path or ``LengthPenaltyConfig``);
    ``num_generations``: optional, TRL's G (it is read from the calling trainer; a different value is an
    error); ``tokenizer``: required when some agent counts ``tokens``; ``reasoning_tags``: the reasoning
    channel's tags when the block sets none (default ``<think>``, ``</think>``); ``metrics``: when true (default),
    the §2.15 metrics go to TRL's logs through ``log_metric``; ``length_schedule``: keys of the block moved
    by the calling trainer's global step (docs/reference/length-coefficient.md §3.7).
    """

    __name__ = "length_penalty"

    def __init__(
        self,
        correctness: Callable[..., Sequence[float | None]],
        length_penalty: LengthPenaltyConfig | Mapping[str, Any] | str,
        num_generations: int | None = None,
        tokenizer: Any = None,
        reasoning_tags: Sequence[str] | None = None,
        agent_column: str = AGENT_COLUMN,
        metrics: bool = True,
        length_schedule: Sequence[Mapping[str, Any]] | str | None = None,
    ):
        try:
            given = {"length_penalty": length_penalty, "length_schedule": length_schedule}
            if reasoning_tags is not None:  # else the block's own tags, or the default pair (reference §2.5)
                given["reasoning_tags"] = reasoning_tags
            config = load_shaping_config(given)
        except LengthConfigError as err:
            raise ValueError(str(err)) from None
        if not config.penalties_on:
            raise ValueError("length_penalty: the block enables no agent; the wrapper would do nothing")
        if config.uses_tokens() and tokenizer is None:
            raise ValueError("length_penalty: length_type 'tokens' needs a tokenizer (reference §2.5)")
        if "mask" in config.length_penalty.truncation_modes:
            raise ValueError(
                "length_penalty.truncation: 'mask' needs the loss mask, which a reward function cannot reach; "
                "use LengthPluginGRPOTrainer (or TRL's mask_truncated_completions), or 'penalty' / 'incorrect'"
            )
        if num_generations is not None and num_generations < 2:
            raise ValueError(f"num_generations must be >= 2, got {num_generations}")
        self.correctness = correctness
        self.num_generations = num_generations
        self.tokenizer = tokenizer
        self.agent_column = agent_column
        self.metrics = metrics
        self.weight = 1.0
        self.model = None
        self._checked_nesting = False
        self._checked_args = False
        self._run = ShapingRun(config)  # no normalization: the stock trainer's advantages
        self._metadata = RowMetadata(self._run.metadata)
        self._run.announce(" (reward wrapper)")

    @property
    def shaping(self) -> LengthShapingConfig:
        return self._run.config

    @property
    def config(self) -> LengthPenaltyConfig:
        return self.shaping.length_penalty

    # -- LengthPluginCallback target protocol -------------------------------------------------------------
    def set_length_schedule(self, name: str, value: float) -> None:
        check_schedule_name(name)
        self.weight = value

    def attach_model(self, model) -> None:
        """Remember the model so evaluation batches (``model.training`` false) are left unshaped."""
        self.model = model

    def _training(self, trainer) -> bool:
        """TRL's own test (``model.training`` of the calling trainer), falling back on the attached model;
        unknown counts as training."""
        model = getattr(trainer, "model", None)
        model = self.model if model is None else model
        return model is None or model.training

    def _group_size(self, trainer) -> int:
        """The trainer's ``num_generations``: the group size of the gathered batch (§2.2)."""
        size = getattr(trainer, "num_generations", None)
        if size is None:
            if self.num_generations is None:
                raise ValueError(
                    "LengthPenaltyReward: the calling trainer is unknown (no log_metric from TRL); pass "
                    "num_generations equal to the trainer's"
                )
            return self.num_generations
        if self.num_generations is not None and self.num_generations != size:
            raise ValueError(
                f"LengthPenaltyReward was given num_generations={self.num_generations} but the trainer's is "
                f"{size}: groups would be wrong; drop the argument (the wrapper reads the trainer's)"
            )
        return size

    def _check_trainer_args(self, trainer) -> None:
        """TRL's own keys of the calling trainer's args (docs/reference/product.md §1.3), once: the stock trainer
        checks them only at the first loss (or never), so the wrapper refuses them at its first call."""
        args = getattr(trainer, "args", None)
        if self._checked_args or args is None:
            return
        self._checked_args = True
        try:
            check_trl_keys({key: getattr(args, key) for key in TRL_KEYS if hasattr(args, key)})
        except ValueError as err:
            raise ValueError(f"LengthPenaltyReward: the trainer's {err}") from None

    def _add_card(self, trainer) -> None:
        """Give the calling trainer the card section of this wrapper, once (``model_card.LengthCardCallback``)."""
        handler = getattr(trainer, "callback_handler", None)
        if handler is None or any(isinstance(c, LengthCardCallback) for c in handler.callbacks):
            return
        trainer.add_callback(LengthCardCallback(trainer, wrapper_card(self.shaping)))

    def _truncated(self, trainer, completion_ids) -> torch.Tensor | None:
        """TRL's ``is_truncated`` per local row when some agent sets ``truncation`` (reference §2.19): the
        calling trainer's end-of-sequence and pad ids, else the tokenizer's."""
        if not self.config.truncation_modes:
            return None
        if completion_ids is None:
            raise ValueError("length_penalty.truncation needs completion_ids from the trainer")
        source = getattr(trainer, "processing_class", None) or self.tokenizer
        source = getattr(source, "tokenizer", source)
        stops = list(getattr(trainer, "eos_token_ids", None) or [source.eos_token_id])
        return truncated_flags(completion_ids, [*stops, source.pad_token_id])

    # -- the reward function ------------------------------------------------------------------------------
    def __call__(
        self, prompts, completions, completion_ids=None, log_metric=None, **columns
    ) -> list[float | None]:
        raw = self.correctness(
            prompts=prompts, completions=completions, completion_ids=completion_ids, **columns
        )
        trainer = getattr(log_metric, "__self__", None)
        self._check_trainer_args(trainer)
        self._add_card(trainer)
        if not self._training(trainer):
            return [None if r is None else 0.0 for r in raw]
        group_size = self._group_size(trainer)
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
        correctness = gather(local_correctness.to(state.device)).cpu()
        batch = gathered_batch(
            LocalRollouts.from_columns(completions, columns, self.agent_column),
            correctness,
            consecutive_groups(correctness.numel(), group_size),
            self.shaping,
            tokenizer=self.tokenizer,
            metadata=self._metadata,
            device=state.device,
            truncated=self._truncated(trainer, completion_ids),
        )
        trainer_state = columns.get("trainer_state")  # TRL's, for the schedule's step (§3.7)
        step = 0 if trainer_state is None else trainer_state.global_step
        result = self._run.shape(batch, step)
        self._run.log_step(result, step, is_main_process=state.is_main_process)
        if self.metrics and log_metric is not None:  # every rank logs the same global values
            for key, value in result.metrics.items():
                log_metric(key, value)
        rows = len(completions)
        mine = slice(state.process_index * rows, (state.process_index + 1) * rows)
        delta = (result.rewards - correctness)[mine] * self.weight
        return [None if d != d else float(d) for d in delta.tolist()]
