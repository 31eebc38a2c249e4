"""``LengthPluginGRPOTrainer``: TRL's ``GRPOTrainer`` with group length penalties and the length coefficient.

Where each piece hooks in (host-trl.md §2, checked against trl 1.16.0, see ``_host.py``):

- ``_calculate_rewards`` returns the reward columns gathered across processes; the override fills the
  extra ``length_penalty`` column with ``shaped - correctness`` (decisions.md §2.4) computed on whole
  groups of that gathered batch (§2.2), so TRL's sum, advantages and ``rewards/length_penalty/mean``
  follow. Lengths: channel lengths of the completions (§2.5) and loss-mask token counts (§3.2).
- ``_generate_and_score_completions``: with the coefficient on, advantages become the §3.3 group
  normalization of the shaped rewards (a group with an unscorable row is skipped by the coefficient and
  keeps TRL's advantages, §2.4); with ``drop_zero_std_groups``, filtered groups leave the loss mask
  (through ``tool_mask``: ``completion_mask`` is also TRL's attention mask) and ``num_items_in_batch``;
  ``_compute_loss`` rescales per-sequence losses by one factor per generation batch, so filtered rows
  leave the global sequence count (§3.3, §4.1).
- Evaluation batches are never shaped (§2.15).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from trl import GRPOTrainer
from trl.trainer.utils import get_callable_name

from trl_length_plugin.shaping import (
    apply_length_coefficient,
    group_advantages,
    log_length_coefficient,
    nonzero_std_keep_mask,
)
from trl_length_plugin.trl_integration._host import check_trl_host
from trl_length_plugin.trl_integration.callback import LengthPluginCallback, linear_warmup
from trl_length_plugin.trl_integration.config import SEQUENCE_MEAN_LOSSES, LengthPluginGRPOConfig
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

LENGTH_PENALTY_COLUMN = "length_penalty"
TRL_STD_EPS = 1e-4  # GRPOTrainer's advantage epsilon


def length_penalty(prompts, **kwargs):
    """Placeholder reward function of the ``length_penalty`` column; the trainer fills it after the gather."""
    return [None] * len(prompts)


def unscorable_groups(correctness: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Per row of the gathered batch, whether its group holds a NaN (TRL's ``None``) correctness reward;
    such groups are skipped whole by the coefficient (decisions.md §2.4), as verl skips them."""
    nan = torch.isnan(correctness.cpu()).view(-1, num_generations).any(dim=1)
    return nan.repeat_interleave(num_generations)


def reward_name(func) -> str:
    """The name TRL gives a reward function's column (a model path's last component for reward models)."""
    if isinstance(func, str):
        return func.rstrip("/").split("/")[-1]
    config = getattr(func, "config", None)
    if config is not None and hasattr(config, "_name_or_path"):
        return config._name_or_path.rstrip("/").split("/")[-1]
    return get_callable_name(func)


def resolve_correctness(names: list[str], wanted: str | None, has_environment_rewards: bool) -> int:
    """Index of the correctness reward among ``names`` (decisions.md §2.4)."""
    if wanted is None:
        if len(names) == 1 and not has_environment_rewards:
            return 0
        raise ValueError(
            f"correctness_reward: required when there are several reward functions ({names}); name the binary "
            "reward the length shaping acts on (decisions.md §2.4)"
        )
    short = wanted.rsplit(".", 1)[-1]
    matches = [i for i, name in enumerate(names) if name in (wanted, short)]
    if len(matches) != 1:
        problem = "matches no" if not matches else "is ambiguous among the"
        raise ValueError(f"correctness_reward: {wanted!r} {problem} reward functions {names}")
    return matches[0]


@dataclass
class _AdvantageUpdate:
    """What ``_calculate_rewards`` hands to ``_generate_and_score_completions`` for one training batch."""

    advantages: torch.Tensor | None  # (N,) global, §3.3 normalization
    keep: torch.Tensor | None  # (N,) bool, non-zero-std filter
    unscorable: torch.Tensor | None = None  # (N,) bool, rows whose advantages stay TRL's (§2.4)


class LengthPluginGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` driven by a ``LengthPluginGRPOConfig`` (decisions.md §2-3); nothing changes when
    no length key is set."""

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: LengthPluginGRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        **kwargs,
    ):
        check_trl_host()
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = LengthPluginGRPOConfig(f"{name.rstrip('/').split('/')[-1]}-GRPO")
        if not isinstance(args, LengthPluginGRPOConfig):
            raise TypeError(
                "LengthPluginGRPOTrainer needs a LengthPluginGRPOConfig, got " + type(args).__name__
            )
        if reward_funcs is None:
            funcs = []
        else:
            funcs = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
        self._shaping = args.length_shaping_enabled
        self._penalty_config = args.length_penalty_config if args.group_penalties_enabled else None
        self._coefficient_on = args.length_penalty_coeff > 0
        self._coeff = args.length_penalty_coeff
        self._pending: _AdvantageUpdate | None = None
        self._tool_mask = None
        if self._shaping:  # every check that needs no model runs before the model loads
            names = [reward_name(f) for f in funcs]
            if LENGTH_PENALTY_COLUMN in names:
                raise ValueError(
                    f"a reward function is named {LENGTH_PENALTY_COLUMN!r}; that column is the plugin's"
                )
            self._correctness_column = resolve_correctness(
                names, args.correctness_reward, kwargs.get("environment_factory") is not None
            )
            self._reasoning_tags = resolve_reasoning_tags(args.length_penalty_config, args.reasoning_tags)
            self._check_filter_denominators(args)
            if (
                self._penalty_config is not None
                and train_dataset is not None
                and hasattr(train_dataset, "__len__")
            ):
                warning = nested_metadata_warning(train_dataset[0] if len(train_dataset) else None)
                if warning:
                    logger.warning(warning)
        callbacks = list(callbacks or [])
        if args.length_penalty_coeff_warmup_steps or args.length_curves_png:
            schedules = {}
            if args.length_penalty_coeff_warmup_steps:
                warmup = linear_warmup(args.length_penalty_coeff, args.length_penalty_coeff_warmup_steps)
                schedules["length_penalty_coeff"] = warmup
            callbacks.append(LengthPluginCallback(schedules, curves_png=args.length_curves_png or None))
        super().__init__(
            model,
            funcs,
            args,
            train_dataset,
            eval_dataset,
            processing_class,
            reward_processing_classes,
            callbacks,
            **kwargs,
        )
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, LengthPluginCallback):
                callback.bind(self)
        if not self._shaping:
            return
        if self._penalty_config is not None and uses_tokens(self._penalty_config) and self._tokenizer is None:
            raise ValueError("length_penalty: length_type 'tokens' needs a tokenizer (decisions.md §2.5)")
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

    @staticmethod
    def _check_filter_denominators(args: LengthPluginGRPOConfig) -> None:
        """Filtered groups leave per-sequence denominators by rescaling the loss, which would also rescale
        the entropy bonus; refuse that combination rather than train on a wrong bonus (decisions.md §3.3)."""
        bonus = args.entropy_coef != 0.0 or args.use_adaptive_entropy
        if args.drop_zero_std_groups and args.loss_type in SEQUENCE_MEAN_LOSSES and bonus:
            raise ValueError(
                f"drop_zero_std_groups with loss_type={args.loss_type!r} cannot be combined with the entropy "
                "bonus (entropy_coef / use_adaptive_entropy); use loss_type 'dapo' or 'bnpo'"
            )

    # -- schedules (callback.py) ------------------------------------------------------------------------
    def set_length_schedule(self, name: str, value: float) -> None:
        """Receive a scheduled value from ``LengthPluginCallback``."""
        if name == "length_penalty_coeff":
            if not self._coefficient_on:
                raise ValueError(
                    "a length_penalty_coeff schedule needs length_penalty_coeff > 0 in the config"
                )
            self._coeff = value
        elif name == "length_penalty_weight":
            if not self._shaping:
                raise ValueError("a length_penalty_weight schedule needs length shaping switched on")
            self.reward_weights[self._penalty_column] = value
        else:
            raise ValueError(
                f"unknown length schedule {name!r}; use length_penalty_coeff or length_penalty_weight"
            )

    def attach_model(self, model) -> None:
        """The trainer knows its model already (part of the callback's target protocol)."""

    # -- hooks ------------------------------------------------------------------------------------------
    def _generate(self, prompts):
        output = super()._generate(prompts)
        self._tool_mask = output[2]  # needed for the loss-mask lengths of §3.2
        return output

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if not self._shaping:
            return rewards_per_func
        correctness = rewards_per_func[:, self._correctness_column]
        if not self.model.training:  # evaluation batches are never shaped (decisions.md §2.15)
            rewards_per_func[:, self._penalty_column] = correctness * 0
            return rewards_per_func
        shaped = self._shape(inputs, completions, completion_ids_list, correctness)
        rewards_per_func[:, self._penalty_column] = (shaped - correctness.double().cpu()).to(rewards_per_func)
        self._pending = self._advantage_update(rewards_per_func, correctness)
        return rewards_per_func

    def _shape(self, inputs, completions, completion_ids_list, correctness: torch.Tensor) -> torch.Tensor:
        """Shaped correctness rewards of the gathered batch (float64, CPU), metrics into ``_metrics``."""
        metrics = self._metrics["train"]
        main = self.accelerator.is_main_process
        config = self._penalty_config
        raw = shaped = correctness.detach().double().cpu()
        if config is None and not self._coefficient_on:  # only the zero-std filter: nothing to measure
            return shaped
        local = (
            LocalRollouts.from_inputs(completions, inputs, self.args.agent_column)
            if config is not None
            else LocalRollouts(completions, None, None)
        )
        columns = []
        if config is not None:
            columns.append(measure_channels(local, config, self._tokenizer, self._reasoning_tags))
        if self._coefficient_on:
            columns.append(self._loss_mask_lengths(completion_ids_list).unsqueeze(1))
        rollouts = gather_rollouts(local, torch.cat(columns, dim=1), self.accelerator.device)
        if config is not None:
            result = group_penalties(correctness, self.num_generations, rollouts, config, main)
            shaped = result.rewards.double()
            for key, value in result.metrics.items():
                metrics[key].append(value)
        if self._coefficient_on:
            group_index = torch.arange(shaped.numel()) // self.num_generations
            coefficient = apply_length_coefficient(
                shaped,
                rollouts.values[:, -1],
                group_index,
                self._coeff,
                self.args.length_penalty_min_tokens,
                correctness=raw.masked_fill(unscorable_groups(raw, self.num_generations), torch.nan),
            )
            log_length_coefficient(coefficient, step=self.state.global_step, is_main_process=main)
            shaped = coefficient.rewards
            for key, value in coefficient.metrics().items():
                metrics[key].append(value)
        return shaped

    def _loss_mask_lengths(self, completion_ids_list) -> torch.Tensor:
        """Per local row, the token count of ``completion_mask * tool_mask`` after
        ``mask_truncated_completions`` (decisions.md §3.2), as TRL builds those masks."""
        if self._tool_mask is not None:
            lengths = torch.tensor([sum(mask) for mask in self._tool_mask], dtype=torch.float64)
        else:
            lengths = torch.tensor([len(ids) for ids in completion_ids_list], dtype=torch.float64)
        if self.mask_truncated_completions:
            ends = {*self.eos_token_ids, self._tokenizer.pad_token_id}
            finished = torch.tensor([bool(ids) and ids[-1] in ends for ids in completion_ids_list])
            lengths = lengths * finished
        return lengths

    def _advantage_update(
        self, rewards_per_func: torch.Tensor, correctness: torch.Tensor
    ) -> _AdvantageUpdate | None:
        """§3.3 on the gathered, shaped batch: group normalization (coefficient on) and the filter."""
        if not (self._coefficient_on or self.args.drop_zero_std_groups):
            return None
        weights = self.reward_weights.to(rewards_per_func.device)
        total = (rewards_per_func * weights).nansum(dim=1)
        total[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan  # TRL's unscorable rows
        total, raw = total.cpu(), correctness.cpu()
        group_index = torch.arange(total.numel()) // self.num_generations
        update = _AdvantageUpdate(None, None)
        if self._coefficient_on:
            update.unscorable = unscorable_groups(raw, self.num_generations)
            update.advantages = group_advantages(
                total,
                raw,
                group_index,
                scale_by_std=self.scale_rewards != "none",
                std_eps=TRL_STD_EPS,
                std_scope="batch" if self.scale_rewards == "batch" else "group",
            )
        if self.args.drop_zero_std_groups:
            update.keep = nonzero_std_keep_mask(total, raw, group_index)
            self._metrics["train"]["length_penalty/zero_std_filtered_frac"].append(
                float((~update.keep).double().mean())
            )
        return update

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        update, self._pending = self._pending, None
        if update is not None:
            self._apply_advantage_update(output, update, len(inputs))
        return output

    def _apply_advantage_update(self, output: dict, update: _AdvantageUpdate, rows: int) -> None:
        """Write this rank's part of ``update`` into TRL's batch: advantages, and for filtered groups the
        loss mask (``tool_mask``), ``num_items_in_batch`` and the loss scale of ``_compute_loss`` (§3.3)."""
        local = slice(self.accelerator.process_index * rows, (self.accelerator.process_index + 1) * rows)
        device = output["advantages"].device
        if update.advantages is not None:
            advantages = update.advantages[local].to(device=device, dtype=output["advantages"].dtype)
            unscorable = update.unscorable[local].to(device)
            output["advantages"] = torch.where(unscorable, output["advantages"], advantages)
            self._logs["advantages"].extend(self.accelerator.gather(output["advantages"]).tolist())
        if update.keep is not None:
            keep = update.keep[local].to(device)
            completion_mask = output["completion_mask"]  # also the attention mask: left whole
            tool_mask = output.get("tool_mask", torch.ones_like(completion_mask))
            output["tool_mask"] = tool_mask * keep.unsqueeze(1).to(tool_mask.dtype)
            loss_mask = completion_mask * output["tool_mask"]
            output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
            if self.loss_type in SEQUENCE_MEAN_LOSSES:
                # one factor for the whole generation batch: rows are shuffled before the micro-batch split
                scale = update.keep.numel() / update.keep.sum().clamp(min=1)
                output["length_keep_scale"] = torch.full((rows,), float(scale), device=device)

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        scale = inputs.get("length_keep_scale")
        if scale is None:
            return loss
        # per-sequence losses average over all N rows; filtered rows leave that count (§3.3, §4.1)
        return loss * scale[0]
