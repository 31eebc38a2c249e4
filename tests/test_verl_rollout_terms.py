"""The per-rollout terms at verl's real call site (docs/reference/length-penalties.md §2.17-2.19): verl's
Hydra config and V1 trainer, TransferQueue on a local Ray, the replay buffer and
``PPOTrainer._compute_advantage`` (as tests/test_verl_shaping.py drives them; rollout generation and the
actor update are not run). A response that hits ``data.max_response_length`` without its end-of-sequence
token is truncated; the shaped scores equal the engine's on the same rollouts and flags, and ``mask`` zeroes
the truncated rows' ``response_mask``, which the actor's loss reads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from tests.test_verl_shaping import run_advantage_step, words
from tests.verl_length_helpers import Rollout, make_trainer, read
from trl_length_plugin.shaping import RolloutBatch, load_shaping_config, measure_lengths, shape_rollouts

pytestmark = pytest.mark.slow


@dataclass
class CutRollout(Rollout):
    """A rollout whose response stops without the end-of-sequence token (``cut``)."""

    cut: bool = False

    def response(self, tokenizer):
        ids, mask = super().response(tokenizer)
        return (ids[:-1], mask[:-1]) if self.cut else (ids, mask)


def test_overlong_and_incorrect_at_verls_call_site(store, tokenizer, tmp_path):
    items = [
        CutRollout("a", 1.0, words(2)),
        CutRollout("a", 1.0, words(12), cut=True),
        CutRollout("a", 0.0, words(5)),
        CutRollout("a", 1.0, words(11)),
        CutRollout("b", 1.0, words(3)),
        CutRollout("b", 1.0, words(8)),
    ]
    limit = len(items[1].response(tokenizer)[0])
    assert len(items[3].response(tokenizer)[0]) <= limit  # ends on EOS: not truncated
    block = {"default": {"truncation": "incorrect", "overlong_max_length": limit, "overlong_buffer": 8}}
    path = tmp_path / "length_penalty.yaml"
    path.write_text(str(block).replace("'", '"'))
    trainer = make_trainer(
        [f"+length_penalty={path}", "algorithm.adv_estimator=grpo", f"data.max_response_length={limit}"],
        tokenizer,
    )
    batch, rows, index, metrics = run_advantage_step(trainer, items, tokenizer, groups=2, pad_to=1)

    raw = torch.tensor([r.reward for r in items], dtype=torch.float64)
    truncated = [r.cut for r in items]
    lengths = measure_lengths(
        [r.text for r in items], ["tokens"] * len(items), tokenizer, ("<think>", "</think>")
    )
    groups = np.unique([r.uid for r in items], return_inverse=True)[1]
    expected = shape_rollouts(
        RolloutBatch(raw, groups, lengths.reasoning, lengths.answer, truncated=truncated),
        load_shaping_config({"length_penalty": block}),
        normalization=None,
    )
    shaped = torch.stack([scores.double().sum() for scores in rows["token_level_rewards"]])
    torch.testing.assert_close(shaped, expected.rewards[index].double(), rtol=0, atol=1e-6)
    assert float(expected.rewards[1]) < 0  # truncated, so wrong, and overlong: negative
    assert metrics["length_penalty/truncated_frac"] == pytest.approx(1 / 6)
    assert metrics["length_penalty/overlong_frac"] == pytest.approx(
        expected.metrics["length_penalty/overlong_frac"]
    )
    assert expected.metrics["length_penalty/overlong_frac"] > 0


def test_mask_zeroes_the_response_mask_at_verls_call_site(store, tokenizer, tmp_path):
    """``truncation: mask`` as TRL's ``mask_truncated_completions``: the truncated rollouts' ``response_mask``
    and ``loss_mask`` are zeroed before verl's advantages, so their advantages are 0 and they leave the actor's loss; rewards are
    unchanged, and the other rows' advantages are those of the same batch without the mask (the masked rows
    still count in their groups' statistics, as in TRL)."""
    items = [
        CutRollout("a", 1.0, words(2)),
        CutRollout("a", 1.0, words(12), cut=True),
        CutRollout("a", 0.0, words(5)),
        CutRollout("b", 1.0, words(12), cut=True),
        CutRollout("b", 0.0, words(8)),
        CutRollout("b", 1.0, words(3)),
    ]
    limit = len(items[1].response(tokenizer)[0])
    runs = {}
    for mode in ("mask", "none"):
        path = tmp_path / f"{mode}.yaml"
        path.write_text(f'{{"default": {{"truncation": "{mode}", "total_bonus": 0.25}}}}')
        overrides = [
            f"+length_penalty={path}",
            "algorithm.adv_estimator=grpo",
            f"data.max_response_length={limit}",
        ]
        trainer = make_trainer(overrides, tokenizer)
        runs[mode] = run_advantage_step(trainer, items, tokenizer, groups=2, pad_to=1)
        if mode == "mask":  # read before the next run puts the same keys again
            batch = runs[mode][0]
            loss_mask = read(batch.keys, batch.partition_id, ["loss_mask"])["loss_mask"]
    (_, masked, index, metrics), (_, plain, plain_index, _) = runs["mask"], runs["none"]
    assert index == plain_index
    cut = torch.tensor([items[i].cut for i in index])
    original = [torch.tensor(items[i].response(tokenizer)[1]) for i in index]
    for row, keep in enumerate((~cut).tolist()):
        mask = masked["response_mask"][row]
        assert mask.tolist() == (original[row].tolist() if keep else [0] * len(original[row]))
        assert loss_mask[row].tolist() == mask.tolist()  # the actor's token count leaves them out too
        assert plain["response_mask"][row].tolist() == original[row].tolist()
        advantages = masked["advantages"][row]
        if keep:
            torch.testing.assert_close(advantages, plain["advantages"][row], rtol=0, atol=0)
        else:
            assert float(advantages.abs().sum()) == 0 and float(plain["advantages"][row].abs().sum()) > 0
        torch.testing.assert_close(
            masked["token_level_rewards"][row].sum(), plain["token_level_rewards"][row].sum(), rtol=0, atol=0
        )
    assert metrics["length_penalty/truncated_frac"] == pytest.approx(2 / 6)
