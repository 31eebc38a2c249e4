"""The reward-wrapper route: ``LengthPenaltyReward`` on TRL's stock ``GRPOTrainer`` gives the same rewards
as ``LengthPluginGRPOTrainer`` for the group penalties (docs/reference/length-penalties.md §2.4), the callback delivers the
schedule and keeps evaluation unshaped, and the wrapper's metrics reach TRL's logs.

Completions come from a deterministic TRL ``rollout_func`` so both trainers see the same batch."""

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
from trl_length_plugin.shaping import METRIC_KEYS
from trl_length_plugin.trl_integration import LengthPenaltyReward, LengthPluginCallback

BLOCK = {
    "default": {
        "group_total_length_penalty_coeff": 0.2,
        "total_bonus": 0.05,
        "pass_rate_length_penalty_weight": 0.1,
    },
    "agent_overrides": {"math": {"length_type": "chars"}},
}


@pytest.fixture(scope="module")
def setup(random_model_dir):
    tokenizer = load_tokenizer(random_model_dir)
    dataset = make_task_dataset(32).add_column("agent", ["math" if i % 2 else "default" for i in range(32)])
    common = dict(
        model=str(random_model_dir),
        train_dataset=dataset,
        eval_dataset=make_task_dataset(8, seed=3),
        processing_class=tokenizer,
        rollout_func=deterministic_rollout(tokenizer, 4),
    )
    return tokenizer, common


@pytest.mark.slow
def test_wrapper_matches_subclass(setup, tmp_path):
    tokenizer, common = setup
    train = dict(per_device_train_batch_size=16, max_steps=2, eval_strategy="steps", eval_steps=2)
    subclass = RecordingTrainer(
        reward_funcs=[correctness_reward],
        args=tiny_config(tmp_path / "a", length_penalty=BLOCK, **train),
        **common,
    )
    subclass.train()
    wrapper = LengthPenaltyReward(correctness_reward, BLOCK, num_generations=4, tokenizer=tokenizer)
    stock = RecordingStockTrainer(
        reward_funcs=[correctness_reward, wrapper],
        args=tiny_config(tmp_path / "b", **train),
        callbacks=[LengthPluginCallback(targets=[wrapper])],
        **common,
    )
    stock.train()
    for mode in ("train", "eval"):
        ours = [r.rewards_per_func for r in subclass.records if r.mode == mode]
        theirs = [r.rewards_per_func for r in stock.records if r.mode == mode]
        assert len(ours) == len(theirs) >= 1
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
    assert bool((stock.records[0].rewards_per_func[:, 1] != 0).any()), (
        "the batch gave the shaping nothing to do"
    )
    assert bool((stock.records[-1].rewards_per_func[:, 1] == 0).all())  # evaluation: never shaped
    for step in (0, 1):
        for key in METRIC_KEYS:
            assert stock.state.log_history[step][key] == pytest.approx(
                subclass.state.log_history[step][key]
            ), key


@pytest.mark.slow
def test_weight_schedule_reaches_wrapper_and_trainer(setup, tmp_path):
    tokenizer, common = setup
    common = {k: v for k, v in common.items() if k != "eval_dataset"}
    half = {"length_penalty_weight": lambda step: 0.5}
    wrapper = LengthPenaltyReward(correctness_reward, BLOCK, num_generations=4, tokenizer=tokenizer)
    stock = RecordingStockTrainer(
        reward_funcs=[correctness_reward, wrapper],
        args=tiny_config(tmp_path / "b", per_device_train_batch_size=16),
        callbacks=[LengthPluginCallback(half, targets=[wrapper])],
        **common,
    )
    stock.train()
    subclass = RecordingTrainer(
        reward_funcs=[correctness_reward],
        args=tiny_config(tmp_path / "a", per_device_train_batch_size=16, length_penalty=BLOCK),
        callbacks=[LengthPluginCallback(half)],
        **common,
    )
    subclass.train()
    full = subclass.records[0].rewards_per_func
    torch.testing.assert_close(stock.records[0].rewards_per_func[:, 1], 0.5 * full[:, 1], rtol=0, atol=1e-6)
    assert subclass.reward_weights.tolist() == [1.0, 0.5]  # the trainer scales its column by TRL's weight
    total = (full[:, 0] + 0.5 * full[:, 1]).mean().item()
    assert subclass.state.log_history[0]["reward"] == pytest.approx(total, abs=1e-6)


def test_wrapper_rejections():
    with pytest.raises(ValueError, match="needs a tokenizer"):
        LengthPenaltyReward(correctness_reward, BLOCK, num_generations=4)
    with pytest.raises(ValueError, match="default.totl_bonus"):
        LengthPenaltyReward(correctness_reward, {"default": {"totl_bonus": 1}}, num_generations=4)
    with pytest.raises(ValueError, match="enables no agent"):
        LengthPenaltyReward(correctness_reward, {"default": {"enabled": False}}, num_generations=4)
    wrapper = LengthPenaltyReward(
        correctness_reward, {"default": {"length_type": "chars"}}, num_generations=4
    )
    with pytest.raises(ValueError, match="length_penalty_weight"):
        wrapper.set_length_schedule("length_penalty_coeff", 1.0)


def unscorable_every_third(completions, answer, **kwargs):
    """The embedded correctness reward with ``None`` (unscorable) on every third row."""
    scores = correctness_reward(completions, answer, **kwargs)
    return [None if i % 3 == 0 else score for i, score in enumerate(scores)]


@pytest.mark.slow
def test_eval_without_callback_is_unshaped_and_ungrouped(setup, tmp_path):
    """Without the callback the wrapper still sees evaluation (through the calling trainer), never groups
    its rows (groups of ``num_generations_eval``, not ``num_generations``), and keeps unscorable rows ``None``
    so TRL's eval metrics still treat them as unscorable (docs/reference/length-penalties.md §2.15)."""
    tokenizer, common = setup
    wrapper = LengthPenaltyReward(unscorable_every_third, BLOCK, num_generations=4, tokenizer=tokenizer)
    stock = RecordingStockTrainer(
        reward_funcs=[unscorable_every_third, wrapper],
        args=tiny_config(tmp_path, per_device_eval_batch_size=6, num_generations_eval=2),
        **{**common, "eval_dataset": make_task_dataset(6, seed=3)},
    )
    stock.evaluate()
    assert stock.records and all(record.mode == "eval" for record in stock.records)
    for record in stock.records:
        correctness, penalty = record.rewards_per_func[:, 0], record.rewards_per_func[:, 1]
        unscorable = torch.isnan(correctness)
        assert bool(unscorable.any())
        assert bool(torch.isnan(penalty[unscorable]).all()) and bool((penalty[~unscorable] == 0).all())


@pytest.mark.slow
def test_wrapper_reads_the_trainers_group_size_and_refuses_a_mismatch(setup, tmp_path):
    """Groups are the trainer's ``num_generations`` (4 here): the wrapper without the argument reads it, and
    a different value is refused at the first call instead of shaping wrong groups."""
    tokenizer, common = setup
    common = {k: v for k, v in common.items() if k != "eval_dataset"}
    runs = {}
    for name, size in (("read", None), ("given", 4)):
        wrapper = LengthPenaltyReward(correctness_reward, BLOCK, num_generations=size, tokenizer=tokenizer)
        stock = RecordingStockTrainer(
            reward_funcs=[correctness_reward, wrapper], args=tiny_config(tmp_path / name), **common
        )
        stock.train()
        runs[name] = stock.records[0].rewards_per_func
    torch.testing.assert_close(runs["read"], runs["given"], rtol=0, atol=0)
    wrong = LengthPenaltyReward(correctness_reward, BLOCK, num_generations=2, tokenizer=tokenizer)
    stock = RecordingStockTrainer(
        reward_funcs=[correctness_reward, wrong], args=tiny_config(tmp_path / "wrong"), **common
    )
    with pytest.raises(ValueError, match="num_generations=2 but the trainer's is 4"):
        stock.train()
