"""The reward-wrapper route: ``LengthPenaltyReward`` on TRL's stock ``GRPOTrainer`` gives the same rewards
as ``LengthPluginGRPOTrainer`` for the group penalties (docs/reference/length-penalties.md §2.4), the callback delivers the
schedule and keeps evaluation unshaped, and the wrapper's metrics reach TRL's logs.

Completions come from a deterministic TRL ``rollout_func`` so both trainers see the same batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.trl_length_helpers import (
    RecordingStockTrainer,
    RecordingTrainer,
    deterministic_rollout,
    tiny_config,
)
from trl_length_plugin.embedded import correctness_reward, load_tokenizer, make_task_dataset
from trl_length_plugin.shaping import METRIC_KEYS
from trl_length_plugin.trl_integration import LengthPenaltyReward, LengthPluginCallback

REPO = Path(__file__).resolve().parents[1]

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


@pytest.mark.parametrize("name", ["length_penalty_coeff", "length_penalty.default.total_bonus", "weight"])
def test_a_callback_schedule_of_a_config_number_is_refused_when_built(name):
    """One mechanism moves the shaping config's numbers, length_schedule (checked at load, saved in checkpoints)."""
    with pytest.raises(
        ValueError, match=f"schedules only length_penalty_weight, not '{name}'.*length_schedule"
    ):
        LengthPluginCallback({name: lambda step: 0.5})


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


def test_wrapper_takes_the_blocks_reasoning_tags():
    """Tags set only in the block apply (reference §2.5); tags given to both must agree."""
    block = {"default": {"length_type": "chars", "total_bonus": 0.1}, "reasoning_tags": ["<r>", "</r>"]}
    assert LengthPenaltyReward(correctness_reward, block).shaping.tags == ("<r>", "</r>")
    assert LengthPenaltyReward(correctness_reward, block, reasoning_tags=("<r>", "</r>")).shaping.tags == (
        "<r>",
        "</r>",
    )
    with pytest.raises(ValueError, match="reasoning_tags: .* disagrees"):
        LengthPenaltyReward(correctness_reward, block, reasoning_tags=("<think>", "</think>"))


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


@pytest.mark.slow
def test_wrapper_refuses_a_bad_trl_key_of_the_stock_trainer_at_its_first_call(setup, tmp_path):
    """TRL's stock ``GRPOConfig`` takes ``loss_type: GRPO`` and fails only at the loss with its own message;
    the wrapper's first call refuses it in one line naming the key, with the config's did-you-mean."""
    from trl import GRPOConfig

    from tests.trl_length_helpers import TINY

    tokenizer, common = setup
    common = {k: v for k, v in common.items() if k != "eval_dataset"}
    wrapper = LengthPenaltyReward(correctness_reward, BLOCK, tokenizer=tokenizer)
    args = GRPOConfig(output_dir=str(tmp_path), **{**TINY, "loss_type": "GRPO"})
    stock = RecordingStockTrainer(reward_funcs=[correctness_reward, wrapper], args=args, **common)
    with pytest.raises(ValueError) as error:
        stock.train()
    assert str(error.value) == (
        "LengthPenaltyReward: the trainer's loss_type: 'GRPO' is not one of 'grpo', 'dr_grpo', 'dapo', 'bnpo', "
        "'cispo', 'sapo', 'luspo', 'vespo' (did you mean 'grpo'?)"
    )
    assert not stock.records  # refused in the first reward call, before any batch reached the loss


@pytest.mark.slow
def test_wrapper_prints_its_settings_and_writes_its_card_section(setup, tmp_path, caplog):
    """On TRL's stock trainer with ``save_strategy: "no"`` (TRL writes no card): the wrapper logs its
    settings line with the values at INFO, and the card written when training ends carries the
    plugin's tag, the wrapper's block and the citations (docs/trl.md, "Model card")."""
    tokenizer, common = setup
    common = {k: v for k, v in common.items() if k != "eval_dataset"}
    with caplog.at_level("INFO", "trl_length_plugin"):
        wrapper = LengthPenaltyReward(correctness_reward, BLOCK, tokenizer=tokenizer)
    assert [r.getMessage() for r in caplog.records] == [
        "trl-length-plugin: group length penalties: length_penalty.agent_overrides.math.length_type=chars, "
        "length_penalty.default.group_total_length_penalty_coeff=0.2, "
        "length_penalty.default.pass_rate_length_penalty_weight=0.1, length_penalty.default.total_bonus=0.05 "
        "(reward wrapper)"
    ]
    stock = RecordingStockTrainer(
        reward_funcs=[correctness_reward, wrapper], args=tiny_config(tmp_path, save_strategy="no"), **common
    )
    stock.train()
    card = (tmp_path / "README.md").read_text()
    metadata = yaml.safe_load(card.split("---\n")[1])
    assert {"trl", "grpo", "trl-length-plugin"} <= set(metadata["tags"])
    section = card[card.index("## Length control") :]
    assert json.loads(section[section.index("```json") + 7 : section.index("```\n\n")]) == {
        "length_penalty": BLOCK
    }
    assert "as the reward function `length_penalty` (LengthPenaltyReward)" in section
    assert "Cite group length penalties as:" in card and "Cite trl-length-plugin as:" in card
    assert "Cite LUSPO as:" not in card and card.count("## Length control") == 1


#: the module of docs/trl.md, "The wrapper route": a module-level wrapper instance for ``--reward_funcs``
REWARDS_MODULE = """\
from trl_length_plugin.embedded import correctness_reward, embedded_model_dir, load_tokenizer
from trl_length_plugin.trl_integration import LengthPenaltyReward

length_penalty = LengthPenaltyReward(
    correctness_reward,
    {"default": {"group_total_length_penalty_coeff": 0.1}},
    tokenizer=load_tokenizer(embedded_model_dir()),
)
"""


@pytest.mark.slow
def test_stock_trl_grpo_command_with_the_wrapper(tiny_model_dir, tmp_path):
    """TRL's own ``trl grpo`` (accelerate launch of trl/scripts/grpo.py), offline, on the embedded model
    directory and a local JSON Lines dataset, with the wrapper given by dotted path: it trains two steps,
    logs the wrapper's settings, column and metrics, and the card in the output folder has the wrapper's
    section (docs/trl.md, "The wrapper route", "Model card")."""
    (tmp_path / "data").mkdir()
    make_task_dataset(32).to_json(str(tmp_path / "data" / "train.jsonl"))
    (tmp_path / "length_rewards.py").write_text(REWARDS_MODULE)
    out = tmp_path / "out"
    config = dict(
        model_name_or_path=str(tiny_model_dir),
        dataset_name="./data",  # a local folder: datasets reads data/train.jsonl as the train split
        reward_funcs=["trl_length_plugin.embedded.correctness_reward", "length_rewards.length_penalty"],
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=48,
        max_steps=2,
        seed=0,
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="steps",
        save_steps=2,
        report_to="none",
        output_dir=str(out),
    )
    (tmp_path / "grpo.yaml").write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [str(Path(sys.executable).with_name("trl")), "grpo", "--config", "grpo.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Training completed" in done.stdout
    logs = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    steps = [row for row in logs if "loss" in row]
    assert len(steps) == 2
    for row in steps:
        correctness, penalty = row["rewards/correctness_reward/mean"], row["rewards/length_penalty/mean"]
        assert row["reward"] == pytest.approx(correctness + penalty, abs=1e-6)
        assert row["length_penalty/env_reward_mean"] == pytest.approx(correctness)
        assert abs(penalty) < 1e-6  # group-relative scaling is mean-centred over each group's correct rows
    assert max(row["length_penalty/adjusted_frac"] for row in steps) > 0
    assert max(row["rewards/length_penalty/std"] for row in steps) > 0
    settings = "trl-length-plugin: group length penalties: length_penalty.default.group_total_length_penalty_coeff=0.1"
    assert settings + " (reward wrapper)" in done.stdout + done.stderr
    card = (out / "README.md").read_text()  # the wrapper's section, written after the checkpoint's card
    assert "- trl-length-plugin" in card.split("---")[1]
    assert '"group_total_length_penalty_coeff": 0.1' in card and "Cite trl-length-plugin as:" in card
