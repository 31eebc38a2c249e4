"""Length shaping in TRL's ``GRPOTrainer``: :class:`LengthShapingMixin`, in front of ``GRPOTrainer`` in the MRO
like ``ScoreCenteringMixin`` (docs/reference/length-penalties.md §2, docs/reference/length-coefficient.md §3).

The mixin only translates: each training batch's rollouts become one ``RolloutBatch`` of the gathered
batch, the core's ``shape_rollouts`` shapes it, and the result goes back into TRL's data. Where (checked
against trl 1.16 at setup and on first use, see ``_host.py``):

- ``_calculate_rewards`` returns the reward columns gathered across processes; the override fills the
  extra ``length_penalty`` column with ``shaped - correctness`` (§2.4), so TRL's sum, advantages and
  ``rewards/length_penalty/mean`` follow;
- ``_generate_and_score_completions``: with the coefficient on, advantages become the §3.3 group
  normalization (groups the coefficient skipped keep TRL's own); with ``drop_zero_std_groups``, filtered
  groups leave the loss mask (through ``tool_mask``: ``completion_mask`` is also TRL's attention mask) and
  ``num_items_in_batch``; ``_compute_loss`` rescales per-sequence losses by one factor per generation
  batch, so filtered rows leave the global sequence count (§3.3, docs/reference/luspo.md §4.1);
- evaluation batches are never shaped (§2.15);
- checkpoints record the length schedule (docs/reference/length-coefficient.md §3.7).

One ``_ShapingStep`` record carries a generation batch's data between these hooks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sized
from dataclasses import dataclass

import torch
from trl.trainer.utils import get_callable_name

from trl_length_plugin.shaping import LengthShapingConfig, ShapingResult, ShapingRun, trl_normalization
from trl_length_plugin.trl_integration import _host
from trl_length_plugin.trl_integration.callback import check_schedule_name
from trl_length_plugin.trl_integration.config import SEQUENCE_MEAN_LOSSES, LengthPluginGRPOConfig
from trl_length_plugin.trl_integration.rollouts import (
    LocalRollouts,
    RowMetadata,
    band_source_warning,
    consecutive_groups,
    gathered_batch,
    nested_metadata_warning,
    truncated_flags,
)

logger = logging.getLogger("trl_length_plugin")

LENGTH_PENALTY_COLUMN = "length_penalty"
NO_REWARD_SOURCE = (
    "No reward source provided. Pass `reward_funcs`, or an `environment_factory` whose environment defines a "
    "`get_reward` method."
)  # GRPOTrainer's own message


def length_penalty(prompts, **kwargs):
    """Placeholder reward function of the ``length_penalty`` column; the trainer fills it after the gather."""
    return [None] * len(prompts)


def reward_name(func) -> str:
    """The name TRL gives a reward function's column (a model path's last component for reward models)."""
    if isinstance(func, str):
        return func.rstrip("/").split("/")[-1]
    config = getattr(func, "config", None)
    if config is not None and hasattr(config, "_name_or_path"):
        return config._name_or_path.rstrip("/").split("/")[-1]
    return get_callable_name(func)


def resolve_correctness(names: list[str], wanted: str | None, has_environment: bool) -> int | None:
    """Index of the correctness reward among ``names`` (reference §2.4); None when only the environment's
    reward columns (known after TRL's setup) can still provide it."""
    if not names and not has_environment:
        raise ValueError(NO_REWARD_SOURCE)
    if wanted is None:
        if len(names) == 1 and not has_environment:
            return 0
        if not names:
            return None
        raise ValueError(
            f"correctness_reward: required when there are several reward sources ({names}"
            f"{' and the environment' if has_environment else ''}); name the binary reward the length "
            "shaping acts on (reference §2.4)"
        )
    short = wanted.rsplit(".", 1)[-1]
    matches = [i for i, name in enumerate(names) if name in (wanted, short)]
    if len(matches) == 1:
        return matches[0]
    if not matches and has_environment:
        return None
    problem = "matches no" if not matches else "is ambiguous among the"
    raise ValueError(f"correctness_reward: {wanted!r} {problem} reward functions {names}")


@dataclass
class _ShapingStep:
    """One generation batch, from ``_generate`` to ``_generate_and_score_completions``."""

    tool_mask: list | None = None
    result: ShapingResult | None = None


class LengthShapingMixin:
    """The trainer side of length shaping; in front of ``GRPOTrainer`` in the MRO. ``_run`` is the core's
    ``ShapingRun`` of the config's ``LengthShapingConfig``, ``_shaping`` (not enabled: every hook passes
    through)."""

    _length_step: _ShapingStep | None = None

    @property
    def _shaping(self) -> LengthShapingConfig:
        return self._run.config

    # -- setup ------------------------------------------------------------------------------------------
    def _check_length_shaping_inputs(
        self, args: LengthPluginGRPOConfig, funcs: list, train_dataset, environment_factory
    ) -> None:
        """Before the model loads: the shaping config, and every check that needs no model. The dataset's first
        example is checked here, or for a streaming dataset (no length, no indexing) when it arrives in the
        first training batch (reference §2.14)."""
        self._run = ShapingRun(args.shaping)
        self._metadata = RowMetadata(self._run.metadata)
        self._unchecked_example = False
        if not self._shaping.enabled:
            return
        names = [reward_name(f) for f in funcs]
        if LENGTH_PENALTY_COLUMN in names:
            raise ValueError(
                f"a reward function is named {LENGTH_PENALTY_COLUMN!r}; that column is the plugin's"
            )
        self._correctness_column = resolve_correctness(
            names, args.correctness_reward, environment_factory is not None
        )
        bonus = args.entropy_coef != 0.0 or args.use_adaptive_entropy
        if args.drop_zero_std_groups and args.loss_type in SEQUENCE_MEAN_LOSSES and bonus:
            raise ValueError(
                f"drop_zero_std_groups with loss_type={args.loss_type!r} cannot be combined with the entropy "
                "bonus (entropy_coef / use_adaptive_entropy); use loss_type 'dapo' or 'bnpo'"
            )
        if self._shaping.penalties_on and train_dataset is not None:
            if isinstance(train_dataset, Sized):
                self._check_example(train_dataset[0] if len(train_dataset) else None)
            else:
                self._unchecked_example = True

    def _check_example(self, example) -> None:
        """The setup warnings of §2.12-2.14 from a dataset example: nested metadata, no band source."""
        for warning in (
            nested_metadata_warning(example),
            band_source_warning(self._shaping, list(example or ())),
        ):
            if warning:
                logger.warning(warning)

    def _install_length_shaping(self, args: LengthPluginGRPOConfig) -> None:
        """After ``GRPOTrainer.__init__``: the correctness column, the ``length_penalty`` column, the log."""
        if not self._shaping.enabled:
            return
        if self._correctness_column is None:  # the environment's reward columns now exist
            self._correctness_column = resolve_correctness(
                self.reward_func_names, args.correctness_reward, False
            )
        if self._shaping.uses_tokens() and self._tokenizer is None:
            raise ValueError("length_penalty: length_type 'tokens' needs a tokenizer (reference §2.5)")
        if self.aux_loss_enabled and args.drop_zero_std_groups and self.loss_type in SEQUENCE_MEAN_LOSSES:
            raise ValueError(
                f"drop_zero_std_groups with loss_type={self.loss_type!r} cannot be combined with the MoE router "
                "auxiliary loss (set router_aux_loss_coef=0 or use loss_type 'dapo' or 'bnpo')"
            )
        self._penalty_column = len(self.reward_funcs)
        self.reward_funcs.append(length_penalty)
        self.reward_func_names.append(LENGTH_PENALTY_COLUMN)
        self.reward_processing_classes.append(None)
        self.reward_weights = torch.cat([self.reward_weights, torch.ones(1)])
        log_file = args.length_penalty_log_file
        self._run.normalization = trl_normalization(self.scale_rewards)
        self._run.log_file = None if log_file is None else os.path.join(args.output_dir, log_file)
        self._run.log_rollouts = args.length_penalty_log_rollouts
        self._run.announce()

    # -- schedules (callback.py) ------------------------------------------------------------------------
    def set_length_schedule(self, name: str, value: float) -> None:
        """Receive a scheduled value from ``LengthPluginCallback`` (``length_penalty_weight``, the reward
        weight of the shaping column; the shaping config's own numbers move by ``length_schedule``)."""
        check_schedule_name(name)
        if not self._shaping.enabled:
            raise ValueError("a length_penalty_weight schedule needs length shaping switched on")
        self.reward_weights[self._penalty_column] = value

    def attach_model(self, model) -> None:
        """The trainer knows its model already (part of the callback's target protocol)."""

    # -- hooks ------------------------------------------------------------------------------------------
    def _generate(self, prompts):
        output = super()._generate(prompts)
        _host.check_generate_output(output)
        if self._length_step is not None:
            self._length_step.tool_mask = output[_host.TOOL_MASK]  # for the loss-mask lengths of §3.2
        return output

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if not self._shaping.enabled:
            return rewards_per_func
        correctness = rewards_per_func[:, self._correctness_column]
        if not self.model.training:  # evaluation batches are never shaped (reference §2.15)
            rewards_per_func[:, self._penalty_column] = correctness * 0
            return rewards_per_func
        result = self._shape(inputs, completions, completion_ids_list, rewards_per_func)
        rewards_per_func[:, self._penalty_column] = (result.rewards - result.raw).to(rewards_per_func)
        if self._length_step is not None:
            self._length_step.result = result
        return rewards_per_func

    def _shape(
        self, inputs, completions, completion_ids_list, rewards_per_func: torch.Tensor
    ) -> ShapingResult:
        """Shape the gathered batch (float64, CPU); metrics into TRL's ``_metrics``, logs on the main process."""
        shaping, main = self._shaping, self.accelerator.is_main_process
        if self._unchecked_example:  # a streaming dataset's first example
            self._unchecked_example = False
            self._check_example(inputs[0] if inputs else None)
        correctness = rewards_per_func[:, self._correctness_column]
        weights = self.reward_weights.to(rewards_per_func.device)
        others = torch.ones(rewards_per_func.shape[1], dtype=torch.bool)
        others[self._penalty_column] = False  # TRL's total without the length column
        base = (rewards_per_func[:, others] * weights[others]).nansum(1)
        base[torch.isnan(rewards_per_func[:, others]).all(dim=1)] = torch.nan  # TRL's unscorable rows
        batch = gathered_batch(
            LocalRollouts.from_inputs(completions, inputs, self.args.agent_column),
            correctness,
            consecutive_groups(correctness.numel(), self.num_generations),
            shaping,
            tokenizer=self._tokenizer,
            loss_lengths=self._loss_mask_lengths(completion_ids_list) if shaping.coefficient_on else None,
            base_rewards=base.double().cpu(),
            metadata=self._metadata,
            device=self.accelerator.device,
            truncated=self._truncated(completion_ids_list),
        )
        step = self.state.global_step
        result = self._run.shape(batch, step, shaping_weight=float(self.reward_weights[self._penalty_column]))
        self._run.log_step(result, step, is_main_process=main)
        for key, value in result.metrics.items():
            self._metrics["train"][key].append(value)
        return result

    def _truncated(self, completion_ids_list) -> torch.Tensor | None:
        """TRL's ``is_truncated`` per local row when some agent sets ``truncation`` (reference §2.19)."""
        block = self._shaping.penalties
        if block is None or not block.truncation_modes:
            return None
        return truncated_flags(completion_ids_list, [*self.eos_token_ids, self._tokenizer.pad_token_id])

    def _loss_mask_lengths(self, completion_ids_list) -> torch.Tensor:
        """Per local row, the token count of ``completion_mask * tool_mask`` after
        ``mask_truncated_completions`` (reference §3.2), as TRL builds those masks."""
        tool_mask = self._length_step.tool_mask if self._length_step is not None else None
        if tool_mask is not None:
            lengths = torch.tensor([sum(mask) for mask in tool_mask], dtype=torch.float64)
        else:
            lengths = torch.tensor([len(ids) for ids in completion_ids_list], dtype=torch.float64)
        if self.mask_truncated_completions:
            ends = [*self.eos_token_ids, self._tokenizer.pad_token_id]
            lengths = lengths * ~truncated_flags(completion_ids_list, ends)
        return lengths

    def _generate_and_score_completions(self, inputs):
        self._length_step = _ShapingStep()
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            step, self._length_step = self._length_step, None
        if step.result is not None:
            _host.check_scored_output(output, len(inputs))
            self._apply(output, step.result, len(inputs))
        return output

    def _apply(self, output: dict, result: ShapingResult, rows: int) -> None:
        """Write this rank's part of ``result`` into TRL's batch: advantages, and for filtered groups the
        loss mask (``tool_mask``), ``num_items_in_batch`` and the loss scale of ``_compute_loss`` (§3.3)."""
        local = slice(self.accelerator.process_index * rows, (self.accelerator.process_index + 1) * rows)
        device = output["advantages"].device
        if result.advantages is not None:
            advantages = result.advantages[local].to(device=device, dtype=output["advantages"].dtype)
            output["advantages"] = torch.where(
                result.host_rows[local].to(device), output["advantages"], advantages
            )
            _host.replace_logged(
                self._logs["advantages"], self.accelerator.gather(output["advantages"]).tolist()
            )
        if result.loss_keep is not None:  # truncation: mask, as TRL's mask_truncated_completions (§2.19)
            kept = result.loss_keep[local].to(device).unsqueeze(1)
            for key in ("completion_mask", "tool_mask"):
                if output.get(key) is not None:
                    output[key] = output[key] * kept.to(output[key].dtype)
            loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
            output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        if result.keep is not None:
            keep = result.keep[local].to(device)
            completion_mask = output["completion_mask"]  # also the attention mask: left whole
            tool_mask = output.get("tool_mask", torch.ones_like(completion_mask))
            output["tool_mask"] = tool_mask * keep.unsqueeze(1).to(tool_mask.dtype)
            loss_mask = completion_mask * output["tool_mask"]
            output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
            if self.loss_type in SEQUENCE_MEAN_LOSSES:
                # one factor for the whole generation batch: rows are shuffled before the micro-batch split
                scale = result.keep.numel() / result.keep.sum().clamp(min=1)
                output["length_keep_scale"] = torch.full((rows,), float(scale), device=device)

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        scale = inputs.get("length_keep_scale")
        if scale is None:
            return loss
        # per-sequence losses average over all N rows; filtered rows leave that count (§3.3, §4.1)
        return loss * scale[0]

    # -- checkpoints (the length schedule's record, docs/reference/length-coefficient.md §3.7) -----------
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self._shaping.enabled and self.args.should_save:
            self._run.save(_host.checkpoint_folder(self, trial), self.state.global_step)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if self._shaping.enabled and checkpoint is not None:
            self._run.resume(checkpoint, self.state.global_step)
