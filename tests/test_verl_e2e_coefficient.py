"""verl's own trainer end to end on CPU with the plugin: the length coefficient with the group filter, and a planted runtime error (``trl-length verl-smoke``; the setting and
what every test asserts: ``tests/verl_e2e_helpers.py``). Nothing is faked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.verl_e2e_helpers import RECIPES, assert_trained, processes_of, smoke

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_coefficient_and_zero_std_filter(tmp_path):
    """The recipe's floor of 64 tokens exceeds a CPU run's 48-token answers: a floor of 4 lets it act."""
    recipe = str(RECIPES / "grpo_length_coeff_qwen2.5-0.5b.sh")
    done, metrics, log = smoke(tmp_path, recipe, "++length_penalty_min_tokens=4")
    assert_trained(done, metrics, "length_penalty/coeff")
    assert all(row["length_penalty/coeff"] == 0.5 for row in metrics.values())
    assert max(row["length_penalty/coeff_penalized_frac"] for row in metrics.values()) > 0
    assert "Length penalty:" in done.stdout and "Length penalty:" in log


def test_a_runtime_error_fails_in_one_line_and_leaves_nothing(tmp_path):
    """A copy of a recipe whose reward function raises: FAIL naming the process and the error, exit 1, no process
    of the run's session and no weight segment of its own left."""
    reward = tmp_path / "bad_reward.py"
    reward.write_text(
        "def compute_score(*args, **kwargs):\n    raise RuntimeError('planted error in the reward')\n"
    )
    recipe = tmp_path / "recipe.sh"
    recipe.write_text((RECIPES / "luspo_qwen2.5-0.5b.sh").read_text())
    before = set(Path("/dev/shm").glob("verl_weights_*"))
    done, _, _ = smoke(tmp_path, str(recipe), f"reward.custom_reward_function.path={reward}")
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "FAIL" in line]
    assert len(errors) == 1 and "RuntimeError: planted error in the reward" in errors[0], done.stderr[-2000:]
    assert "pid=" in errors[0]
    assert not processes_of(tmp_path / "run")
    left = [p for p in Path("/dev/shm").glob("verl_weights_*") if p not in before]
    assert not left
