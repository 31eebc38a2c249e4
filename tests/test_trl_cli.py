"""``trl-length-grpo``: a bad recipe exits non-zero before any model loads with a message naming the key;
every shipped TRL recipe parses and validates; a CPU recipe trains through the console command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trl_length_plugin import cli
from trl_length_plugin.recipes import RECIPES_DIR

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((RECIPES_DIR / "trl").glob("*.yaml"))
CONSOLE = Path(sys.executable).with_name("trl-length-grpo")
MISSING_MODEL = "/nonexistent/model"  # loading it would fail with another message: proves nothing loaded


def write_recipe(tmp_path, **changes) -> Path:
    recipe = yaml.safe_load((RECIPES_DIR / "trl" / "group_relative_cpu.yaml").read_text())
    recipe.update(model_name_or_path=MISSING_MODEL, output_dir=str(tmp_path / "out"), **changes)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


BAD = {
    "unknown key": ({"length_penalty_cof": 1.0}, "length_penalty_cof"),
    "bad band": (
        {
            "length_penalty": {
                "profile_band": {"enabled": True, "defaults": {"total": {"a": 20, "b": 10, "f": 0.5}}}
            }
        },
        "profile_band.defaults.total",
    ),
    "length_type token": ({"length_penalty": {"default": {"length_type": "token"}}}, "default.length_type"),
    "unknown penalty key": (
        {"length_penalty": {"default": {"group_total_coeff": 0.1}}},
        "default.group_total_coeff",
    ),
    "bad reward path": ({"reward_funcs": ["trl_length_plugin.embedded.no_such_reward"]}, "no_such_reward"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_recipe_fails_before_model_load(case, tmp_path):
    changes, key = BAD[case]
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_args(["--config", str(write_recipe(tmp_path, **changes))])
    message = str(exit_info.value.code)
    assert key in message and MISSING_MODEL not in message


def test_bad_flag_fails(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_args(["--config", str(write_recipe(tmp_path)), "--length_penalty", '{"default": {"x": 1}}'])
    assert "default.x" in str(exit_info.value.code)


def test_console_command_exits_nonzero_naming_the_key(tmp_path):
    recipe = write_recipe(tmp_path, length_penalty={"default": {"length_type": "token"}})
    done = subprocess.run(
        [str(CONSOLE), "--config", str(recipe)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "default.length_type" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_parses(recipe, tmp_path):
    cpu = ["--bf16", "false", "--use_cpu", "true"]  # the GPU recipes ask for bf16, which this machine lacks
    parsed = cli.parse_args(["--config", str(recipe), "--output_dir", str(tmp_path), *cpu])
    script_args, training_args = parsed[0], parsed[1]
    assert script_args.reward_funcs and training_args.output_dir == str(tmp_path)


@pytest.mark.slow
def test_cpu_recipe_trains_through_the_console_command(tmp_path):
    out = tmp_path / "run"
    recipe = RECIPES_DIR / "trl" / "coefficient_cpu.yaml"
    flags = [
        "--max_steps",
        "2",
        "--output_dir",
        str(out),
        "--length_penalty",
        '{"default": {"total_bonus": 0.1}}',
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [str(CONSOLE), "--config", str(recipe), *flags],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (out / "model.safetensors").exists() and (out / "length_curves.png").exists()
    assert "length_penalty/coeff" in done.stdout and "length_penalty/adjusted_frac" in done.stdout
