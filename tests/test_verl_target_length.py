"""The target-length reward at verl's real call site (docs/reference/length-penalties.md §2.20): verl's Hydra
config and V1 trainer, TransferQueue on a local Ray, the replay buffer and ``PPOTrainer._compute_advantage``
(as tests/test_verl_shaping.py drives them; rollout generation and the actor update are not run). The
``target_length`` column is read as the profile columns are: top-level, else under ``extra_info``; the
shaped scores equal the engine's on the same rollouts and targets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.test_verl_shaping import run_advantage_step, words
from tests.verl_length_helpers import Rollout, make_trainer
from trl_length_plugin.shaping import RolloutBatch, load_shaping_config, measure_lengths, shape_rollouts

pytestmark = pytest.mark.slow


def test_exact_at_verls_call_site(store, tokenizer, tmp_path):
    top, nested = {"target_length": 12}, {"target_length": 6}
    items = [
        *(Rollout("a", r, words(n), columns=top) for r, n in [(1.0, 2), (1.0, 9), (0.0, 5)]),
        *(Rollout("b", r, words(n), extra_info=nested) for r, n in [(1.0, 1), (0.0, 7)]),
        *(Rollout("c", 1.0, words(n)) for n in [3, 4]),
    ]
    block = {"default": {"target_length": "exact", "target_length_alpha": 0.05}}
    path = tmp_path / "length_penalty.yaml"
    path.write_text(str(block).replace("'", '"'))
    trainer = make_trainer([f"+length_penalty={path}", "algorithm.adv_estimator=grpo"], tokenizer)
    batch, rows, index, metrics = run_advantage_step(trainer, items, tokenizer, groups=3, pad_to=1)

    raw = torch.tensor([r.reward for r in items], dtype=torch.float64)
    lengths = measure_lengths(
        [r.text for r in items], ["tokens"] * len(items), tokenizer, ("<think>", "</think>")
    )
    groups = np.unique([r.uid for r in items], return_inverse=True)[1]
    targets = [12] * 3 + [6] * 2 + [None] * 2
    expected = shape_rollouts(
        RolloutBatch(
            raw, groups, lengths.reasoning, lengths.answer, metadata=[{"target_length": t} for t in targets]
        ),
        load_shaping_config({"length_penalty": block}),
        normalization=None,
    )
    total = (lengths.reasoning + lengths.answer).tolist()
    by_hand = [
        r - 0.05 * abs(n - t) if t else r for r, n, t in zip(raw.tolist(), total, targets, strict=True)
    ]
    torch.testing.assert_close(expected.rewards.double(), torch.tensor(by_hand, dtype=torch.float64))
    shaped = torch.stack([scores.double().sum() for scores in rows["token_level_rewards"]])
    torch.testing.assert_close(shaped, expected.rewards[index].double(), rtol=0, atol=1e-6)
    assert metrics["length_penalty/target_frac"] == pytest.approx(5 / 7)
    assert metrics["length_penalty/target_rel_error_mean"] == pytest.approx(
        expected.metrics["length_penalty/target_rel_error_mean"]
    )
