"""docs/verl.md does what it says: every ``main_ppo`` command on the page (its own override examples and
the recipe it runs) composes with verl's Hydra config and passes verl's ``validate_config`` and the
trainer's startup validation; the command that confirms the plugin loaded prints what the page says; the
startup line is the page's and visible under verl's logging; a plugin that failed to load fails closed."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

from verl.trainer.ppo.utils import need_critic, need_reference_policy  # noqa: E402
from verl.utils.config import validate_config  # noqa: E402

from tests.verl_length_helpers import compose_verl, make_trainer, recipe_overrides  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PAGE = (REPO / "docs" / "verl.md").read_text()
BLOCKS = re.findall(r"```bash\n(.*?)```", PAGE, re.S)
#: stands in for the reader's own overrides: the GSPO recipe (model, data, batch sizes, vLLM, n=8)
#: without its loss keys
BASE_RECIPE = REPO / "recipes" / "verl" / "gspo_qwen2.5-0.5b.sh"
LOSS_KEYS = ("actor_rollout_ref.actor.policy_loss.loss_mode", "actor_rollout_ref.actor.loss_agg_mode")


def key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+")


def page_commands(tmp_path: Path, base: list[str]) -> list[list[str]]:
    """The overrides of every ``python3 -m verl.trainer.main_ppo`` the page's bash blocks run (directly or
    through a recipe), with ``YOUR_OVERRIDES`` set to ``base``; ``python3`` and ``pip`` only record."""
    shim, log = tmp_path / "bin", tmp_path / "argv.jsonl"
    shim.mkdir(parents=True)
    for name in ("python3", "pip"):
        fake = shim / name
        fake.write_text(
            f"#!{sys.executable}\nimport json, sys\n"
            f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        )
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    quoted = " ".join("'" + o.replace("'", "'\\''") + "'" for o in base)
    script = f"set -euo pipefail\ncd {REPO}\nYOUR_OVERRIDES=({quoted})\n" + "\n".join(BLOCKS)
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path)}
    subprocess.run(["bash", "-c", script], check=True, env=env, timeout=120)
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    commands = []
    for argv in runs:
        if argv[:2] != ["-m", "verl.trainer.main_ppo"]:
            continue
        overrides = argv[2:]
        if overrides[: len(base)] == base:  # the page's own command: its keys replace the stand-in's
            own = overrides[len(base) :]
            overrides = [o for o in base if key(o) not in {key(x) for x in own}] + own
        commands.append(overrides)
    return commands


def test_every_main_ppo_command_on_the_page_composes_and_validates(tmp_path, vllm_for_verl):
    base = [o for o in recipe_overrides(BASE_RECIPE, tmp_path) if not key(o).startswith(LOSS_KEYS)]
    commands = page_commands(tmp_path / "page", base)
    expected = sum(block.count("python3 -m verl.trainer.main_ppo") for block in BLOCKS)
    expected += sum(block.count("bash recipes/verl/") for block in BLOCKS)
    assert len(commands) == expected >= 8
    for overrides in commands:
        paths = [o.split("=", 1)[1] for o in overrides if re.search(r"\.(yaml|parquet)$", o)]
        assert paths and all(p.startswith("/") for p in paths), overrides  # the page's own rule
        config = compose_verl(overrides)
        validate_config(
            config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
        )
        trainer = make_trainer(overrides)  # the TaskRunner's startup validation
        luspo = config.actor_rollout_ref.actor.policy_loss.loss_mode == "luspo"
        switched_on = trainer.length_shaping.enabled or luspo or trainer.score_centering is not None
        assert switched_on, overrides  # each example switches something on


def test_confirmation_command_prints_what_the_page_says():
    (block,) = [b for b in BLOCKS if "LOAD_ERRORS" in b]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # python3 is this interpreter
    done = subprocess.run(["bash", "-c", block], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-2:] == [
        "load errors: {}",
        "verl_adapter.length_shaping.advantage verl_adapter.luspo",
    ]


def test_startup_line_is_the_pages_and_follows_verls_log_level(caplog, monkeypatch):
    """``import verl`` leaves Python logging at WARNING; the trainer raises the plugin's logger to
    ``VERL_LOGGING_LEVEL`` (default INFO) unless it was set, so the settings line shows."""
    (line,) = re.findall(r"```\nINFO:[^:]+:\d\d:\d\d,\d+:(.*)\n```", PAGE)
    plugin = logging.getLogger("trl_length_plugin")
    level = plugin.level
    monkeypatch.delenv("VERL_LOGGING_LEVEL", raising=False)
    plugin.setLevel(logging.NOTSET)
    try:
        make_trainer([f"+length_penalty={REPO}/recipes/verl/length_penalty_gsm8k.yaml"])
        assert plugin.level == logging.INFO
        assert line in [record.getMessage() for record in caplog.records]
    finally:
        plugin.setLevel(level)


FAILED_LOAD = """
import sys
from pathlib import Path

sys.modules["verl_adapter.length_shaping.register"] = None  # importing it now fails, as with a broken install
import verl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.trainer.ppo.v1 import get_trainer_cls
from verl_adapter.plugin import LOAD_ERRORS


def build(overrides):
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    OmegaConf.resolve(config)
    return get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)


print(sorted(LOAD_ERRORS))
for overrides in (["+length_penalty.default.total_bonus=0.1"], ["actor_rollout_ref.actor.policy_loss.loss_mode=luspo"]):
    try:
        build(overrides)
    except RuntimeError as err:
        print("refused:", err)
build([])
print("plain config: built")
"""


def test_a_plugin_that_failed_to_load_fails_closed():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", FAILED_LOAD], capture_output=True, text=True, timeout=180, env=env, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()[-4:]
    assert lines[0] == "['verl_adapter.length_shaping.register']"
    features = ["length_penalty", "actor_rollout_ref.actor.policy_loss.loss_mode=luspo"]
    for line, feature in zip(lines[1:3], features, strict=True):
        assert line.startswith(
            f"refused: the config uses {feature} but trl-length-plugin failed to load into verl "
            "(verl_adapter.length_shaping.register: ModuleNotFoundError("
        ), line
    assert lines[3] == "plain config: built"
    assert "trl-length-plugin: could not load verl_adapter.length_shaping.register into verl" in done.stderr
