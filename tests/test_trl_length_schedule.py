"""The length schedule on the real GRPOTrainer (trl 1.16, CPU, embedded model; docs/reference/length-coefficient.md
§3.7): the value changes at the stage boundary, is logged as ``length_schedule/<key>``, is the value the
shaping uses (``length_penalty/coeff``), is recorded in the checkpoint and continues on resume; the wrapper
route moves its block's keys by the trainer's global step."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from tests.test_trl_cli import BLOCKED, assert_one_error_line, write_recipe
from tests.trl_length_helpers import deterministic_rollout, tiny_config
from trl_length_plugin.embedded import correctness_reward, load_tokenizer, make_task_dataset
from trl_length_plugin.shaping.schedule import STATE_FILE, coeff_at, config_at
from trl_length_plugin.trl_integration import LengthPenaltyReward, LengthPluginGRPOTrainer, cli

SCHEDULE = [{"key": "length_penalty_coeff", "stages": [{"until_step": 2, "value": 0.25}]}]
METRIC = "length_schedule/length_penalty_coeff"


def build(model_dir, output_dir, **overrides):
    tokenizer = load_tokenizer(model_dir)
    settings = dict(max_steps=3, length_penalty_coeff=1.0, length_schedule=SCHEDULE, save_steps=2)
    args = tiny_config(output_dir, save_strategy="steps", **{**settings, **overrides})
    return LengthPluginGRPOTrainer(
        model=str(model_dir),
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=make_task_dataset(32),
        processing_class=tokenizer,
        rollout_func=deterministic_rollout(tokenizer, 4),
    )


def logged(trainer, key):
    return {row["step"]: row[key] for row in trainer.state.log_history if key in row}


@pytest.mark.slow
def test_schedule_moves_logs_checkpoints_and_resumes(random_model_dir, tmp_path, caplog):
    trainer = build(random_model_dir, tmp_path / "run")
    with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
        trainer.train()
    assert logged(trainer, METRIC) == {1: 0.25, 2: 0.25, 3: 1.0}  # steps 0, 1 in the stage; then the config's
    assert logged(trainer, "length_penalty/coeff") == {1: 0.25, 2: 0.25, 3: 1.0}  # what the shaping used
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Length penalty:")]
    assert [line.split()[3] for line in lines] == ["coeff=0.25", "coeff=0.25", "coeff=1"]
    assert any(
        "length schedule: length_schedule=" in r.getMessage() for r in caplog.records
    )  # the settings line
    state = json.loads((tmp_path / "run" / "checkpoint-2" / STATE_FILE).read_text())
    assert state == {"step": 2, "schedules": SCHEDULE, "values": {"length_penalty_coeff": 1.0}}

    resumed = build(random_model_dir, tmp_path / "run")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert logged(resumed, METRIC)[3] == 1.0 and logged(resumed, "length_penalty/coeff")[3] == 1.0
    shaped = "rewards/length_penalty/mean"
    assert logged(resumed, shaped)[3] == logged(trainer, shaped)[3] != 0  # the same step 3 as uninterrupted
    assert "length_schedule: resumed at step 2: length_penalty_coeff=1" in caplog.text

    changed = build(
        random_model_dir,
        tmp_path / "run",
        length_schedule=[{"key": "length_penalty_coeff", "stages": [{"until_step": 5, "value": 0.5}]}],
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        changed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert "differs from the config's" in caplog.text
    assert logged(changed, METRIC)[3] == 0.5  # the config's schedule, at the restored step


GROUP = "length_penalty.default.group_total_length_penalty_coeff"
GROUP_SCHEDULE = [{"key": GROUP, "stages": [{"until_step": 2, "value": 0.05}]}]
BLOCK = {"default": {"group_total_length_penalty_coeff": 0.4}}


@pytest.mark.slow
def test_wrapper_route_moves_the_block_by_the_trainers_step(random_model_dir, tmp_path):
    """The stock GRPOTrainer with ``LengthPenaltyReward(..., length_schedule=...)`` logs the same scheduled
    value and the same ``length_penalty`` column as the subclass with the same keys, step by step."""
    from trl import GRPOTrainer

    tokenizer = load_tokenizer(random_model_dir)
    common = dict(
        model=str(random_model_dir),
        train_dataset=make_task_dataset(32),
        processing_class=tokenizer,
        rollout_func=deterministic_rollout(tokenizer, 4),
    )
    wrapper = LengthPenaltyReward(
        correctness_reward, BLOCK, num_generations=4, tokenizer=tokenizer, length_schedule=GROUP_SCHEDULE
    )
    stock = GRPOTrainer(
        reward_funcs=[correctness_reward, wrapper], args=tiny_config(tmp_path / "a", max_steps=3), **common
    )
    stock.train()
    subclass = LengthPluginGRPOTrainer(
        reward_funcs=[correctness_reward],
        args=tiny_config(tmp_path / "b", max_steps=3, length_penalty=BLOCK, length_schedule=GROUP_SCHEDULE),
        **common,
    )
    subclass.train()
    metric = f"length_schedule/{GROUP}"
    assert logged(subclass, metric) == {1: 0.05, 2: 0.05, 3: 0.4}
    assert logged(stock, metric) == pytest.approx(logged(subclass, metric), rel=1e-7)  # log_metric: float32
    column = "rewards/length_penalty/std"
    assert logged(stock, column) == pytest.approx(logged(subclass, column), abs=1e-7)
    assert all(value > 0 for value in logged(stock, column).values())


def test_recipe_key_and_flag(tmp_path):
    """``length_schedule`` as a recipe's YAML list and as a JSON flag reach the trainer's config
    (``recipe:coefficient_cpu``: c = 1 warmed up over 4 steps, floor 4 tokens)."""
    floor = [{"key": "length_penalty_min_tokens", "stages": [{"until_step": 3, "value": 16}]}]
    recipe = write_recipe(tmp_path, "coefficient_cpu", length_schedule=floor)
    shaping = cli.parse_args(["--config", str(recipe)])[1].shaping
    assert [config_at(shaping, s).length_penalty_min_tokens for s in (0, 2, 3)] == [16, 16, 4]
    assert [coeff_at(shaping, s) for s in (0, 1, 4)] == [0.0, 0.25, 1.0]  # the recipe's warm-up still runs
    ramp = json.dumps(
        [{"key": "length_penalty_coeff", "stages": [{"until_step": 4, "start": 0, "end": 0.5}]}]
    )
    flags = ["--length_schedule", ramp, "--length_penalty_coeff_warmup_steps", "0"]
    shaping = cli.parse_args(["--config", str(recipe), *flags])[1].shaping
    assert [coeff_at(shaping, s) for s in range(5)] == [0.0, 0.125, 0.25, 0.375, 1.0]


def test_a_bad_schedule_flag_is_one_line_before_trl_is_imported(tmp_path):
    flag = json.dumps([{"key": "length_penalty_cof", "stages": [{"until_step": 2, "value": 0.5}]}])
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED, "grpo", "--length_penalty_coeff", "1", "--length_schedule", flag],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert_one_error_line(
        done.stderr,
        "length_schedule.0.key: length_penalty_cof: unknown key (did you mean 'length_penalty_coeff'?)",
    )
