"""verl's own trainer end to end on CPU with the plugin: score centering at K = 16 (``trl-length verl-smoke``; the setting and
what every test asserts: ``tests/verl_e2e_helpers.py``). Nothing is faked."""

from __future__ import annotations

import pytest

from tests.verl_e2e_helpers import RECIPES, assert_trained, smoke

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_score_centering_top_16_tis(tmp_path, tiny_model_dir):
    """K = 16 candidates captured through verl's vLLM server, the trainer's logprobs at those ids, the correction
    in the loss. On the arithmetic warm model, whose head of 16 leaves some mass out (the reasoning model puts
    all of it there); TIS bounds of [0, 1.05] instead of the recipe's [0, 2], so that the tail ratio is clipped and
    the correction is not exactly 0 (within the bounds TIS is plain IS, whose correction is 0)."""
    recipe = str(RECIPES / "grpo_score_centering_qwen2.5-0.5b.sh")
    bound = "algorithm.rollout_correction.rollout_is_threshold=1.05"
    done, metrics, log = smoke(tmp_path, recipe, bound, "--model", str(tiny_model_dir))
    assert_trained(done, metrics, "score_centering/")
    assert "score centering: K=16, mode tis in [0, 1.05]" in log
    for row in metrics.values():
        assert 0 < row["score_centering/head_mass"] <= 1.0001
        assert row["training/rollout_actor_probs_pearson_corr"] > 0.99
    assert max(row["score_centering/correction_abs_mean"] for row in metrics.values()) > 0
