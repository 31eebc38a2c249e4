"""The target-length reward on the real ``GRPOTrainer`` (docs/reference/length-penalties.md §2.20): the
dataset's ``target_length`` column (written with ``add_target_lengths``, some rows without one) reaches
TRL's ``length_penalty`` column through both routes, the subclass (``exact``) and the reward wrapper on the
stock trainer (``max``). Completions come from the deterministic TRL ``rollout_func`` of
tests/trl_length_helpers.py, planned from the question without the instruction; the rest of the step is the
real trainer."""

from __future__ import annotations

import pytest
import torch

from tests.trl_length_helpers import (
    RecordingStockTrainer,
    RecordingTrainer,
    deterministic_rollout,
    tiny_config,
)
from trl_length_plugin.embedded import correctness_reward, load_tokenizer, make_task_dataset
from trl_length_plugin.shaping import add_target_lengths, measure_lengths
from trl_length_plugin.trl_integration import LengthPenaltyReward

pytestmark = pytest.mark.slow
ALPHA = 0.05
#: per prompt: a target, except every fourth prompt
TARGETS = [None if i % 4 == 0 else 6 + 2 * i for i in range(16)]


def targeted_dataset():
    return add_target_lengths(make_task_dataset(16), targets=TARGETS)


def targeted_rollout(tokenizer):
    """The deterministic rollout, planned from each prompt's question without the target instruction."""
    rollout = deterministic_rollout(tokenizer, 4)

    def run(prompts, trainer):
        plain = [[*p[:-1], {**p[-1], "content": p[-1]["content"].split(" Think for ")[0]}] for p in prompts]
        return rollout(plain, trainer)

    return run


def recorded(trainer, tokenizer):
    """(correctness, length_penalty column, total lengths, targets) of the trainer's one recorded batch."""
    (record,) = trainer.records
    correctness = record.rewards_per_func[:, 0].double()
    lengths = measure_lengths(
        record.completions, ["tokens"] * correctness.numel(), tokenizer, ("<think>", "</think>")
    )
    targets = [x["target_length"] for x in record.inputs]
    asks = [
        x["prompt"][-1]["content"].endswith(f" Think for {t} tokens.")
        for x, t in zip(record.inputs, targets, strict=True)
    ]
    assert asks == [t is not None for t in targets] and None in targets and any(asks)  # both kinds of prompt
    column = record.rewards_per_func[:, 1].double()
    return correctness, column, (lengths.reasoning + lengths.answer).double(), targets


def test_exact_through_the_subclass(random_model_dir, tmp_path):
    tokenizer = load_tokenizer(random_model_dir)
    block = {"default": {"target_length": "exact", "target_length_alpha": ALPHA}}
    trainer = RecordingTrainer(
        model=str(random_model_dir),
        reward_funcs=[correctness_reward],
        args=tiny_config(tmp_path, length_penalty=block),
        train_dataset=targeted_dataset(),
        processing_class=tokenizer,
        rollout_func=targeted_rollout(tokenizer),
    )
    trainer.train()
    correctness, column, total, targets = recorded(trainer, tokenizer)
    expected = torch.tensor(
        [0.0 if t is None else -ALPHA * abs(n - t) for n, t in zip(total.tolist(), targets, strict=True)]
    )
    assert float(expected.abs().sum()) > 0
    torch.testing.assert_close(column, expected.double(), rtol=0, atol=1e-6)
    logged = trainer.state.log_history[0]
    aimed = [t is not None for t in targets]
    assert logged["length_penalty/target_frac"] == pytest.approx(sum(aimed) / len(aimed))
    errors = [abs(n - t) / t for n, t in zip(total.tolist(), targets, strict=True) if t is not None]
    assert logged["length_penalty/target_rel_error_mean"] == pytest.approx(sum(errors) / len(errors))


def test_max_through_the_reward_wrapper_on_the_stock_trainer(random_model_dir, tmp_path):
    tokenizer = load_tokenizer(random_model_dir)
    block = {"default": {"target_length": "max", "target_length_alpha": ALPHA, "target_length_delta": 0.2}}
    penalty = LengthPenaltyReward(correctness_reward, block, tokenizer=tokenizer)
    trainer = RecordingStockTrainer(
        model=str(random_model_dir),
        reward_funcs=[correctness_reward, penalty],
        args=tiny_config(tmp_path),
        train_dataset=targeted_dataset(),
        processing_class=tokenizer,
        rollout_func=targeted_rollout(tokenizer),
    )
    trainer.train()
    correctness, column, total, targets = recorded(trainer, tokenizer)
    budget = [
        1.0 if t is None else min(max(ALPHA * (t - n) + 0.2, 0.0), 1.0)
        for n, t in zip(total.tolist(), targets, strict=True)
    ]
    expected = correctness * (torch.tensor(budget, dtype=torch.float64) - 1.0)
    assert float(expected.abs().sum()) > 0 and bool((correctness > 0).any())
    torch.testing.assert_close(column, expected, rtol=0, atol=1e-6)
    assert trainer.state.log_history[0]["length_penalty/target_frac"] == pytest.approx(
        sum(t is not None for t in targets) / len(targets)
    )
