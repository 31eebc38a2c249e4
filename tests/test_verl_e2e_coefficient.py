"""verl's own trainer end to end on CPU with the plugin: the length coefficient with the group filter and the per-rollout terms (``trl-length verl-smoke``; the setting and
what every test asserts: ``tests/verl_e2e_helpers.py``). Nothing is faked."""

from __future__ import annotations

import pytest

from tests.verl_e2e_helpers import RECIPES, assert_trained, smoke

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


#: the per-rollout terms: overlong punishment, truncated rollouts masked, a per-prompt target length (the smoke
#: data's ``extra_info.target_length``)
PER_ROLLOUT_TERMS = [
    "+length_penalty.default.overlong_max_length=48",
    "+length_penalty.default.overlong_buffer=16",
    "+length_penalty.default.overlong_factor=1.0",
    "+length_penalty.default.truncation=mask",
    "+length_penalty.default.target_length=max",
    "+length_penalty.default.target_length_alpha=0.01",
]


def test_coefficient_zero_std_filter_and_per_rollout_terms(tmp_path):
    """The coefficient recipe (``length_grpo``, the group filter) with the per-rollout terms in the same run. The
    recipe's floor of 64 tokens exceeds a CPU run's 48-token answers: a floor of 4 lets the coefficient act."""
    recipe = str(RECIPES / "grpo_length_coeff_qwen2.5-0.5b.sh")
    done, metrics, log = smoke(tmp_path, recipe, "++length_penalty_min_tokens=4", *PER_ROLLOUT_TERMS)
    assert_trained(done, metrics, "length_penalty/coeff")
    for row in metrics.values():
        for key in ("overlong_frac", "truncated_frac", "target_frac"):
            assert f"length_penalty/{key}" in row, key
    assert all(row["length_penalty/coeff"] == 0.5 for row in metrics.values())
    assert max(row["length_penalty/coeff_penalized_frac"] for row in metrics.values()) > 0
    assert "[trl-length verl-smoke] length coefficient: acted (it penalized up to" in done.stdout  # issue 42
    assert "Length penalty:" in done.stdout and "Length penalty:" in log
