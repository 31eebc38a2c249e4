"""verl's own trainer end to end on CPU with the plugin: group penalties with the step-1 parity, and the per-rollout terms (``trl-length verl-smoke``; the setting and
what every test asserts: ``tests/verl_e2e_helpers.py``). Nothing is faked."""

from __future__ import annotations

import os

import pytest
import torch
import yaml

from tests.verl_e2e_helpers import RECIPES, REPO, assert_trained, smoke

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_group_penalties_train_and_step_one_rewards_equal_the_core(tmp_path):
    """The recipe's group penalties act on real rollouts; the rewards verl trained on at step 1 are the core's
    (``apply_length_penalties`` on the same rollouts, dumped by ``tests/verl_step_dump.py``)."""
    from trl_length_plugin.embedded import embedded_model_dir, load_tokenizer
    from trl_length_plugin.shaping import RolloutBatch, apply_length_penalties
    from trl_length_plugin.shaping.lengths import measure_token_ids

    dump = tmp_path / "step1.pt"
    env = {
        "VERL_USE_EXTERNAL_MODULES": "verl_step_dump",
        "TRL_LENGTH_STEP_DUMP": str(dump),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
    }
    done, metrics, _ = smoke(tmp_path, str(RECIPES / "grpo_length_penalty_qwen2.5-0.5b.sh"), env=env)
    assert_trained(done, metrics, "length_penalty/")
    assert max(row["length_penalty/adjusted_frac"] for row in metrics.values()) > 0

    rows = torch.load(dump)
    real = [i for i, padding in enumerate(rows["padding"]) if not padding]
    tokenizer = load_tokenizer(embedded_model_dir(task="reasoning"))
    ids = [
        [t for t, m in zip(rows["responses"][i], rows["response_mask"][i], strict=True) if m] for i in real
    ]
    lengths = measure_token_ids(ids, tokenizer)
    uids = [rows["uid"][i] for i in real]
    batch = RolloutBatch(
        torch.tensor([rows["rm_scores"][i] for i in real], dtype=torch.float64),
        [sorted(set(uids)).index(u) for u in uids],
        lengths.reasoning,
        lengths.answer,
        [rows["data_source"][i] for i in real],
    )
    block = yaml.safe_load((RECIPES / "length_penalty_gsm8k.yaml").read_text())
    expected = apply_length_penalties(batch, block).rewards
    trained = torch.tensor([rows["token_level_rewards"][i] for i in real], dtype=torch.float64)
    assert len(real) == 4 * 8
    torch.testing.assert_close(trained, expected.double(), rtol=0, atol=1e-6)
    assert not torch.equal(trained, batch.rewards.double())  # shaping changed something verl trained on


def test_per_rollout_terms_in_one_run(tmp_path):
    """Overlong punishment, truncated rollouts masked and a per-prompt target length (the smoke data's
    ``extra_info.target_length``) together."""
    overrides = [
        "algorithm.adv_estimator=grpo",
        "+length_penalty.default.overlong_max_length=48",
        "+length_penalty.default.overlong_buffer=16",
        "+length_penalty.default.overlong_factor=1.0",
        "+length_penalty.default.truncation=mask",
        "+length_penalty.default.target_length=max",
        "+length_penalty.default.target_length_alpha=0.01",
        "actor_rollout_ref.rollout.n=8",
    ]
    done, metrics, _ = smoke(tmp_path, *overrides)
    assert_trained(done, metrics, "length_penalty/")
    for row in metrics.values():
        for key in ("overlong_frac", "truncated_frac", "target_frac"):
            assert f"length_penalty/{key}" in row, key
