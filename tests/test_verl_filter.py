"""``algorithm.filter_groups`` judged on shaped rewards (docs/reference/length-coefficient.md §3.3) in verl 0.9.1's real replay buffer.

Real: verl's config and trainer registry, the V1 ``ReplayBuffer.sample`` (eviction, classification cache,
metrics, selection) on a TransferQueue on a local Ray, and the engine. Not run here: rollout generation and
reward scoring (vLLM and the reward loop; rollouts are put as ``AgentLoopWorkerTQ`` puts them) and the
refill of evicted prompts (it dispatches new prompts to the agent loop; these tests put more groups than
the batch needs, so verl selects without refilling).

The groups, with the length coefficient c = 1e-5 and a profiled-length penalty of 1.0 on group F:

====  ===================  =======================================  ======  ===========
group raw rewards          shaped rewards                           shaped  verl's raw
                                                                    filter  filter
====  ===================  =======================================  ======  ===========
A     1 1 1 1              lengths differ a lot: range > 1e-6        keep    drop
B     1 1 1 1              equal lengths: all equal                  drop    drop
C     1 1 1 1              lengths differ by a token: 0 < range      drop    drop
                           <= 1e-6
D     1 0 1 0              not all equal                             keep    keep
E     0 0 0 0              all 0                                     drop    drop
F     1 0 0 0              correct row wiped to 0: all 0             drop    keep
====  ===================  =======================================  ======  ===========
"""

from __future__ import annotations

import pytest

from tests.verl_length_helpers import Rollout, clear, make_trainer, put_rollouts, read
from trl_length_plugin.shaping import apply_length_coefficient
from verl_adapter.length_shaping.filter import ShapedReplayBuffer

COEFF = 1e-5
SHAPING = [
    f"+length_penalty_coeff={COEFF}",
    "algorithm.adv_estimator=length_grpo",
    "+length_penalty.default.enabled=true",
    "+length_penalty.default.profiled_length_penalty=1.0",
    "+length_penalty.default.length_type=chars",
]
FILTER = ["algorithm.filter_groups.enable=true", "actor_rollout_ref.rollout.n=4", "data.train_batch_size=2"]
KEPT, DROPPED = {"A", "D"}, {"B", "C", "E", "F"}


def words(n: int) -> str:
    return "The answer is 42." + " step" * n


def groups() -> list[Rollout]:
    profiled = {"profiled_rewards": [1, 1], "profiled_output_lengths": [1, 1]}  # threshold 1: every row
    return [
        *(Rollout("A", 1.0, words(n)) for n in [1, 10, 20, 40]),
        *(Rollout("B", 1.0, words(12)) for _ in range(4)),
        *(Rollout("C", 1.0, words(n)) for n in [20, 20, 21, 21]),
        *(Rollout("D", r, words(n)) for r, n in zip([1.0, 0.0, 1.0, 0.0], [3, 4, 5, 6], strict=True)),
        *(Rollout("E", 0.0, words(n)) for n in [3, 4, 5, 6]),
        *(Rollout("F", r, words(5), columns=profiled) for r in [1.0, 0.0, 0.0, 0.0]),
    ]


def test_group_design(tokenizer):
    """The premise of the table: with c = 1e-5, group A's shaped range exceeds 1e-6 and group C's does not."""
    for uid, above in (("A", True), ("C", False)):
        items = [r for r in groups() if r.uid == uid]
        lengths = [sum(r.response(tokenizer)[1]) for r in items]
        shaped = apply_length_coefficient([1.0] * len(items), lengths, [0] * len(items), COEFF).rewards
        spread = float(shaped.max() - shaped.min())
        assert spread > 1e-6 if above else 0 < spread <= 1e-6, (uid, lengths, spread)


@pytest.mark.slow
def test_filter_keeps_and_drops_the_groups_of_section_3_3(store, tokenizer):
    clear()
    keys = put_rollouts(groups(), tokenizer)
    raw_filter = make_trainer(FILTER, tokenizer).replay_buffer  # verl's own filter, on raw rewards
    raw_filter._sync_metadata_from_transfer_queue()
    raw_dropped, _ = raw_filter._dapo_filtered_keys("train")
    assert raw_dropped == {"A", "B", "C", "E"}

    trainer = make_trainer(SHAPING + FILTER, tokenizer)
    assert isinstance(trainer.replay_buffer, ShapedReplayBuffer)
    batch, metrics = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=len(KEPT))
    assert {key.split("_")[0] for key in batch.keys} == KEPT
    assert len(batch) == 4 * len(KEPT)
    assert metrics["training/filter_groups/evicted_samples"] == len(DROPPED)
    scores = read(batch.keys, "train", ["rm_scores"])["rm_scores"]  # filtering never rewrites scores
    raw = {key: r.reward for key, r in zip(keys, groups(), strict=True)}
    assert [float(s.sum()) for s in scores] == [raw[key] for key in batch.keys]


@pytest.mark.slow
def test_validation_groups_are_never_filtered(store, tokenizer):
    clear("val")
    put_rollouts(groups(), tokenizer, partition="val")
    trainer = make_trainer(SHAPING + FILTER, tokenizer)
    batch, metrics = trainer.replay_buffer.sample(global_steps=1, partition_id="val", batch_size=6)
    assert {key.split("_")[0] for key in batch.keys} == KEPT | DROPPED
    assert not metrics


def test_filter_off_or_shaping_off_keeps_verls_buffer():
    """Without the filter, or without length shaping, or with another metric than ``reward`` (DAPO's
    ``acc``, refused before issue 42), the replay buffer is verl's own class."""
    for overrides in (SHAPING, FILTER, [*SHAPING, *FILTER, ACC]):
        buffer = make_trainer(overrides).replay_buffer
        assert type(buffer).__module__ == "verl.trainer.ppo.v1.replay_buffer"


# -- a group with no correct rollout (issue 42): the overlong punishment spreads it by length ---------------
ACC = "algorithm.filter_groups.metric=acc"
OVERLONG = [  # chars: words(n) is 17 + 5n characters; 0 up to 50, -1 from 100
    "+length_penalty.default.overlong_max_length=100",
    "+length_penalty.default.overlong_buffer=50",
    "+length_penalty.default.length_type=chars",
    "algorithm.adv_estimator=grpo",
]


def all_wrong_groups() -> list[Rollout]:
    """G: all wrong, lengths into the buffer (shaped 0, -0.3, -0.8, -1); D: mixed; H: all correct."""
    return [
        *(Rollout("G", 0.0, words(n)) for n in [1, 10, 20, 40]),
        *(Rollout("D", r, words(3)) for r in [1.0, 0.0, 1.0, 0.0]),
        *(Rollout("H", 1.0, words(n)) for n in [1, 10, 20, 40]),
    ]


@pytest.mark.slow
def test_the_shaped_filter_drops_an_all_wrong_group(store, tokenizer):
    """Group G's shaped scores differ by length, so before issue 42 the shaped filter kept it and GRPO gave
    its shortest wrong answer a positive advantage; judged on its correctness it is dropped. H (all correct,
    spread by the overlong punishment) survives on its shaped range as before."""
    clear()
    put_rollouts(all_wrong_groups(), tokenizer)
    trainer = make_trainer([*OVERLONG, *FILTER], tokenizer)
    assert isinstance(trainer.replay_buffer, ShapedReplayBuffer)
    batch, metrics = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    assert {key.split("_")[0] for key in batch.keys} == {"D", "H"}
    assert metrics["training/filter_groups/evicted_samples"] == 1


@pytest.mark.slow
def test_acc_metric_is_verls_own_filter_with_shaping_on(store, tokenizer):
    """``algorithm.filter_groups.metric=acc`` with shaping on: verl's own filter judges each group's
    ``acc`` (DAPO's rule: all-correct and all-wrong groups dropped) and the advantage step shapes the rest."""
    clear()
    put_rollouts(all_wrong_groups(), tokenizer)
    trainer = make_trainer([*OVERLONG, *FILTER, ACC], tokenizer)
    batch, metrics = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=1)
    assert {key.split("_")[0] for key in batch.keys} == {"D"}
    assert metrics["training/filter_groups/evicted_samples"] == 2
    step: dict = {}
    trainer._compute_advantage(batch, step)
    assert step["length_penalty/env_reward_mean"] == pytest.approx(0.5)


@pytest.mark.slow
def test_each_group_is_shaped_once_per_step(store, tokenizer, monkeypatch):
    """The filter shapes the groups as they finish; the advantage step takes them from there: every rollout
    goes through the core once, and the advantage step's metrics cover its batch."""
    from verl_adapter.length_shaping.rollouts import RolloutShaper

    shaped_keys = []
    original = RolloutShaper.shape
    monkeypatch.setattr(
        RolloutShaper,
        "shape",
        lambda self, fetch, keys: shaped_keys.extend(keys) or original(self, fetch, keys),
    )
    clear()
    keys = put_rollouts(groups(), tokenizer)
    trainer = make_trainer(SHAPING + FILTER, tokenizer)
    batch, _ = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=len(KEPT))
    metrics: dict = {}
    trainer._compute_advantage(batch, metrics)
    assert sorted(shaped_keys) == sorted(keys)  # once each: the filter's pass, none in the advantage step
    assert metrics["length_penalty/env_reward_mean"] == pytest.approx(
        0.75
    )  # groups A and D: 1 1 1 1, 1 0 1 0
    assert not trainer.length_shaper._groups  # handed out or dropped: nothing kept past the step
