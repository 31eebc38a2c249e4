"""``trl-length verl-check``: verl's Hydra config with a run's overrides, checked by every plugin check
without Ray or GPUs (docs/verl.md, "Check a verl config on a laptop").

Every check runs the real command in a subprocess (the console script ``trl-length`` of this venv, or the
recipe script itself with bash), on verl 0.9.1's own config; exit code 2 and one line per error naming the key.
The time limit of 30 s is on the command's CPU time (user + system): wall time on this shared two-core
machine also counts the other processes' load, so it is asserted with a looser bound.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("verl")

from trl_length_plugin.recipes import RECIPES_DIR  # noqa: E402
from verl_adapter.tools.check import CheckError, recipe_overrides  # noqa: E402

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
RECIPES = RECIPES_DIR / "verl"
PROG = "trl-length verl-check: error: "
#: per shipped recipe: an override as written, its misspelling, and the key the error must name
TYPOS = {
    "grpo_length_coeff_qwen2.5-0.5b.sh": (
        "+length_penalty_coeff=0.5",
        "+length_penalty_coef=0.5",
        "length_penalty_coef: unknown trl-length-plugin key; did you mean 'length_penalty_coeff'?",
    ),
    "grpo_length_penalty_qwen2.5-0.5b.sh": (
        '+length_penalty="$HERE',
        '+lenght_penalty="$HERE',
        "lenght_penalty: unknown trl-length-plugin key; did you mean 'length_penalty'?",
    ),
    "grpo_score_centering_qwen2.5-0.5b.sh": (
        "+score_centering_top_k=16",
        "+score_centering_topk=16",
        "score_centering_topk: unknown trl-length-plugin key; did you mean 'score_centering_top_k'?",
    ),
    "gspo_qwen2.5-0.5b.sh": (
        "actor_rollout_ref.actor.clip_ratio_low=",
        "actor_rollout_ref.actor.clip_ratio_lo=",
        "(did you mean 'actor_rollout_ref.actor.clip_ratio_low'?)",
    ),
    "luspo_qwen2.5-0.5b.sh": (
        "actor_rollout_ref.actor.loss_agg_mode=",
        "actor_rollout_ref.actor.loss_agg_mod=",
        "(did you mean 'actor_rollout_ref.actor.loss_agg_mode'?)",
    ),
}
LIMIT_S = 30


def run(command: list[str], cwd: Path | None = None) -> tuple[subprocess.CompletedProcess, float, float]:
    """The finished command, its wall time and its CPU time (user + system, children included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=cwd)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done, wall, cpu


def verl_check(*args: str) -> tuple[subprocess.CompletedProcess, float, float]:
    return run([str(BIN / "trl-length"), "verl-check", *args])


def error_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.strip()]


def test_every_recipe_is_covered():
    assert sorted(TYPOS) == sorted(path.name for path in RECIPES.glob("*.sh"))


def test_shipped_recipes_pass_unchanged():
    scripts = sorted(str(path) for path in RECIPES.glob("*.sh"))
    done, _, _ = verl_check(*scripts)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("trl-length verl-check: OK: ")
    assert all(script in lines[0] for script in scripts)


@pytest.fixture
def recipes_copy(tmp_path: Path) -> Path:
    """The shipped recipe folder (scripts and the YAML block they name), copied."""
    return Path(shutil.copytree(RECIPES, tmp_path / "verl"))


@pytest.mark.parametrize("name", sorted(TYPOS))
def test_a_typo_in_each_recipe_is_one_line_naming_the_key(recipes_copy, name):
    written, typo, message = TYPOS[name]
    script = recipes_copy / name
    text = script.read_text()
    assert text.count(written) == 1
    script.write_text(text.replace(written, typo))
    done, wall, cpu = verl_check(str(script))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    [line] = error_lines(done)
    assert line.startswith(f"{PROG}{script}: ")
    assert message in line
    assert cpu < LIMIT_S, f"{cpu:.1f} s of CPU"
    assert wall < 3 * LIMIT_S, f"{wall:.1f} s"


def test_the_recipe_checks_itself_before_ray(recipes_copy):
    """``bash RECIPE.sh +typo`` stops at the recipe's own first line, ``python3 -m verl_adapter.tools.check``: exit
    code 2 from ``set -e`` before ``python3 -m verl.trainer.main_ppo`` (which would print ``ray init kwargs``)."""
    script = recipes_copy / "grpo_length_coeff_qwen2.5-0.5b.sh"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    start = time.perf_counter()
    done = subprocess.run(
        ["bash", str(script), "+length_penalty_min_token=32"],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    wall = time.perf_counter() - start
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = error_lines(done)
    assert line == (
        f"{PROG}{script}: length_penalty_min_token: unknown trl-length-plugin key; "
        "did you mean 'length_penalty_min_tokens'?"
    )
    assert "ray init" not in done.stdout
    assert wall < 3 * LIMIT_S


def test_overrides_on_the_command_line():
    """The luspo recipe's overrides (read from the script by bash, as the check reads them) given as arguments."""
    overrides = recipe_overrides(RECIPES / "luspo_qwen2.5-0.5b.sh", [])
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=luspo" in overrides
    done, _, _ = verl_check(*overrides)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout
        == f"trl-length verl-check: OK: {len(overrides)} overrides (verl's config check and every plugin check)\n"
    )


def test_bad_values_are_one_line_each():
    """A negative coefficient and LUSPO's KL aggregation rule broken by the overrides: one line per error."""
    overrides = recipe_overrides(RECIPES / "luspo_qwen2.5-0.5b.sh", [])
    bad = [
        "algorithm.adv_estimator=length_grpo",
        "+length_penalty_coeff=-0.5",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
    ]
    done, _, _ = verl_check(*overrides, *bad)
    assert done.returncode == 2, done.stdout + done.stderr
    assert error_lines(done) == [
        f"{PROG}actor_rollout_ref.actor.policy_loss.loss_mode=luspo with actor_rollout_ref.actor.use_kl_loss=true "
        "needs actor_rollout_ref.actor.loss_agg_mode='seq-mean-token-sum' (verl aggregates the KL term with it; "
        "docs/reference/luspo.md §4.1), got 'token-mean'",
        f"{PROG}invalid length shaping config: length_penalty_coeff: Input should be greater than or equal to 0",
    ]


def test_an_overlong_maximum_above_the_response_length_is_refused():
    """Issue 31: a length limit that can never act names both keys (docs/reference/length-penalties.md §2.17)."""
    overrides = recipe_overrides(RECIPES / "grpo_length_penalty_qwen2.5-0.5b.sh", [])
    done, _, _ = verl_check(
        *overrides,
        "+length_penalty.default.overlong_max_length=2048",
        "+length_penalty.default.overlong_buffer=256",
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert error_lines(done) == [
        f"{PROG}invalid length shaping config: length_penalty.default.overlong_max_length: 2048 is above "
        "data.max_response_length (1024): no rollout reaches it, so the penalty would never reach its maximum; "
        "set it <= 1024"
    ]


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("exec python3 -m verl.trainer.main_ppo a=1", "cannot be intercepted"),
        ('PY=python3; "$PY" -m verl.trainer.main_ppo a=1', "no 'python3 -m verl.trainer.main_ppo' command"),
    ],
)
def test_a_script_whose_command_cannot_be_intercepted_is_not_run(tmp_path, command, message):
    script, ran = tmp_path / "run.sh", tmp_path / "ran"
    script.write_text(f"touch {ran}\n{command}\n")
    with pytest.raises(CheckError, match=message):
        recipe_overrides(script, [])
    assert not ran.exists()


def test_a_script_is_read_after_shell_expansion(tmp_path):
    """Variables, quoting, line continuations and the script's own arguments, as bash passes them."""
    script = tmp_path / "run.sh"
    script.write_text(
        "set -euo pipefail\nDIR=${DIR:-/data/my dir}\npython3 -m verl.trainer.main_ppo \\\n"
        '    data.train_files="$DIR/train.parquet" \\\n    +length_penalty_coeff=0.5 "$@"\necho never\n'
    )
    assert recipe_overrides(script, ["trainer.total_epochs=2"]) == [
        "data.train_files=/data/my dir/train.parquet",
        "+length_penalty_coeff=0.5",
        "trainer.total_epochs=2",
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe\x00binary\x89PNG", "not UTF-8 text; a recipe is a bash script"),
        (b"python3 -m verl.trainer.main_ppo a=1\x00\x00", "a binary file (it holds NUL bytes); a recipe is a bash script"),
        (b"python3 -m verl.trainer.main_ppo \"$(printf 'data.x=\\351')\"\n", "passes overrides that are not UTF-8 text"),
    ],
)  # fmt: skip
def test_a_binary_or_non_utf8_script_is_one_line_naming_the_file(tmp_path, content, message):
    """Issue 31: verl-check on odd input names the file in one line (it ended in a traceback)."""
    script = tmp_path / "odd.sh"
    script.write_bytes(content)
    with pytest.raises(CheckError) as err:
        recipe_overrides(script, [])
    assert str(err.value) == f"{script}: {message}"
    done = subprocess.run(
        [sys.executable, "-m", "verl_adapter.tools.check", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and done.stderr.splitlines() == [f"{PROG}{script}: {message}"], done.stderr


def test_a_hanging_recipe_script_leaves_no_process(tmp_path, monkeypatch):
    """Issue 42: a recipe script that hangs before its training command was killed at the time limit, but its
    children ran on; the script's whole process session is ended now, and the error is one line."""
    from verl_adapter.tools import check

    pid_file = tmp_path / "child"
    script = tmp_path / "hangs.bash"
    script.write_text(f"sleep 300 &\necho $! > {pid_file}\nsleep 300\npython3 -m verl.trainer.main_ppo x=1\n")
    monkeypatch.setattr(check, "SCRIPT_TIMEOUT_S", 2)
    with pytest.raises(
        CheckError, match=r"hangs.bash: could not run it with bash: Command .* timed out after 2"
    ):
        recipe_overrides(script, [])
    child = int(pid_file.read_text())
    assert (
        not Path(f"/proc/{child}").exists()
        or "Z" in Path(f"/proc/{child}/stat").read_text().split(")")[1][:3]
    )


def test_a_bash_recipe_is_a_recipe_not_an_override(tmp_path):
    """Issue 42: ``RECIPE.bash`` was read as a Hydra override."""
    script = tmp_path / "mine.bash"
    script.write_text("python3 -m verl.trainer.main_ppo +length_penalty_coef=0.5\n")
    done = subprocess.run(
        [sys.executable, "-m", "trl_length_plugin.tools.commands", "verl-check", str(script)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 2
    assert (
        f"trl-length verl-check: error: {script}: length_penalty_coef: unknown trl-length-plugin key; "
        "did you mean 'length_penalty_coeff'?"
    ) in done.stderr.splitlines()
