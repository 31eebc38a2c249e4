"""The per-rollout terms on the real ``GRPOTrainer`` (docs/reference/length-penalties.md §2.17-2.19):
``truncation: mask`` equals TRL's own ``mask_truncated_completions`` on the same batch (masks, denominators,
loss and the updated weights), and the overlong term reaches TRL's ``length_penalty`` column with the
truncated flag TRL computes. Completions come from a deterministic TRL ``rollout_func`` (some without their
end-of-sequence token, i.e. truncated by TRL's rule); the rest of the step is the real trainer."""

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
from trl_length_plugin.shaping import measure_lengths
from trl_length_plugin.trl_integration import LengthPenaltyReward

pytestmark = pytest.mark.slow


def truncating_rollout(tokenizer):
    """The deterministic rollout, with the end-of-sequence token dropped from every third completion."""
    rollout = deterministic_rollout(tokenizer, 4)

    def run(prompts, trainer):
        out = rollout(prompts, trainer)
        out["completion_ids"] = [
            ids[:-1] if i % 3 == 1 else ids for i, ids in enumerate(out["completion_ids"])
        ]
        return out

    return run


def train(cls, tokenizer, model_dir, output_dir, **overrides):
    trainer = cls(
        model=str(model_dir),
        reward_funcs=[correctness_reward],
        args=tiny_config(output_dir, learning_rate=1e-2, **overrides),
        train_dataset=make_task_dataset(16),
        processing_class=tokenizer,
        rollout_func=truncating_rollout(tokenizer),
    )
    trainer.train()
    return trainer


def test_mask_equals_trls_mask_truncated_completions(random_model_dir, tmp_path):
    tokenizer = load_tokenizer(random_model_dir)
    stock = train(
        RecordingStockTrainer,
        tokenizer,
        random_model_dir,
        tmp_path / "stock",
        mask_truncated_completions=True,
    )
    ours = train(
        RecordingTrainer,
        tokenizer,
        random_model_dir,
        tmp_path / "ours",
        length_penalty={"default": {"truncation": "mask"}},
    )
    (theirs,), (mine,) = stock.records, ours.records
    truncated = torch.tensor([i % 3 == 1 for i in range(len(mine.completion_ids))])
    assert int(truncated.sum()) > 0
    assert bool((theirs.output["completion_mask"][truncated] == 0).all())
    for key in ("completion_mask", "advantages", "num_items_in_batch"):
        torch.testing.assert_close(mine.output[key], theirs.output[key], rtol=0, atol=0)
    assert float(mine.rewards_per_func[:, 1].abs().sum()) == 0.0  # mask changes no reward
    assert ours.state.log_history[0]["length_penalty/truncated_frac"] == pytest.approx(
        float(truncated.double().mean())
    )
    with torch.no_grad():
        for a, b in zip(stock.model.parameters(), ours.model.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-7)  # the same loss, the same update


def test_overlong_and_incorrect_reach_the_length_penalty_column(random_model_dir, tmp_path):
    tokenizer = load_tokenizer(random_model_dir)
    block = {"default": {"truncation": "incorrect", "overlong_max_length": 20, "overlong_buffer": 10}}
    trainer = train(RecordingTrainer, tokenizer, random_model_dir, tmp_path, length_penalty=block)
    (record,) = trainer.records
    correctness = record.rewards_per_func[:, 0].double()
    lengths = measure_lengths(
        record.completions, ["tokens"] * correctness.numel(), tokenizer, ("<think>", "</think>")
    )
    total = (lengths.reasoning + lengths.answer).double()
    truncated = torch.tensor([i % 3 == 1 for i in range(correctness.numel())])
    correct = correctness.masked_fill(truncated, 0.0)
    overlong = -((total - 10) / 10).clamp(0, 1)
    assert bool((overlong < 0).any())
    torch.testing.assert_close(
        correctness + record.rewards_per_func[:, 1].double(), correct + overlong, rtol=0, atol=1e-6
    )
    logged = trainer.state.log_history[0]
    assert logged["length_penalty/overlong_frac"] == pytest.approx(float((overlong < 0).double().mean()))


def test_reward_wrapper_refuses_mask_in_one_line(random_model_dir):
    tokenizer = load_tokenizer(random_model_dir)
    with pytest.raises(ValueError, match="length_penalty.truncation: 'mask'") as err:
        LengthPenaltyReward(correctness_reward, {"default": {"truncation": "mask"}}, tokenizer=tokenizer)
    assert "\n" not in str(err.value)


def test_reward_wrapper_truncation_penalty_on_the_stock_trainer(random_model_dir, tmp_path):
    """The wrapper route: TRL's own trainer, the flag from ``completion_ids`` and the trainer's stop ids."""
    tokenizer = load_tokenizer(random_model_dir)
    block = {"default": {"truncation": "penalty", "truncation_penalty_factor": 0.25}}
    penalty = LengthPenaltyReward(correctness_reward, block, tokenizer=tokenizer)
    trainer = RecordingStockTrainer(
        model=str(random_model_dir),
        reward_funcs=[correctness_reward, penalty],
        args=tiny_config(tmp_path),
        train_dataset=make_task_dataset(16),
        processing_class=tokenizer,
        rollout_func=truncating_rollout(tokenizer),
    )
    trainer.train()
    (record,) = trainer.records
    correctness = record.rewards_per_func[:, 0].double()
    truncated = torch.tensor([i % 3 == 1 for i in range(correctness.numel())])
    assert float(correctness[truncated].sum()) > 0  # some truncated rows are correct
    expected = torch.where(truncated, -0.75 * correctness, 0.0)
    torch.testing.assert_close(record.rewards_per_func[:, 1].double(), expected, rtol=0, atol=1e-6)
    assert trainer.state.log_history[0]["length_penalty/truncated_frac"] == pytest.approx(
        float(truncated.double().mean())
    )
