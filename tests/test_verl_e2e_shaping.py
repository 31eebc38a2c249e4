"""verl's own trainer end to end on CPU with the plugin: group penalties with the step-1 parity, and a planted runtime error (``trl-length verl-smoke``; the setting and
what every test asserts: ``tests/verl_e2e_helpers.py``). Nothing is faked."""

from __future__ import annotations

import os

import pytest
import torch
import yaml

from tests.verl_e2e_helpers import RECIPES, REPO, assert_trained, processes_of, smoke
from verl_adapter.tools.smoke import leftover_segments, run_segments

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_group_penalties_train_and_step_one_rewards_equal_the_core(tmp_path):
    """The recipe's group penalties act on real rollouts; the rewards verl trained on at step 1 are the core's
    (``apply_length_penalties`` on the same rollouts, dumped by ``tests/verl_step_dump.py``), whose token counts
    equal the decode/re-encode path's."""
    from trl_length_plugin.embedded import embedded_model_dir, load_tokenizer
    from trl_length_plugin.shaping import (
        RolloutBatch,
        apply_length_penalties,
        measure_lengths,
        measure_token_ids,
    )

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
    # the generated tokens counted without encoding anything again: the decode/re-encode path's counts
    text = measure_lengths(
        [tokenizer.decode(row, skip_special_tokens=True) for row in ids], "tokens", tokenizer
    )
    assert (lengths.reasoning.tolist(), lengths.answer.tolist()) == (
        text.reasoning.tolist(),
        text.answer.tolist(),
    )
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


def test_a_runtime_error_fails_in_one_line_and_leaves_nothing(tmp_path):
    """A copy of a recipe whose reward function raises: FAIL naming the process and the error, exit 1, no process
    of the run's session and no shared-memory segment of its own left."""
    reward = tmp_path / "bad_reward.py"
    reward.write_text(
        "def compute_score(*args, **kwargs):\n    raise RuntimeError('planted error in the reward')\n"
    )
    recipe = tmp_path / "recipe.sh"
    recipe.write_text((RECIPES / "luspo_qwen2.5-0.5b.sh").read_text())
    before = run_segments()
    done, _, _ = smoke(tmp_path, str(recipe), f"reward.custom_reward_function.path={reward}")
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "FAIL" in line]
    assert len(errors) == 1 and "RuntimeError: planted error in the reward" in errors[0], done.stderr[-2000:]
    assert "pid=" in errors[0]
    assert not processes_of(tmp_path / "run")
    assert not leftover_segments(before)
