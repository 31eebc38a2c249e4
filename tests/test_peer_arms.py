"""The peer arms of the efficacy grid (bench/peer_arms.py): hand-computed values, and equality with the hosts'
own code where it ships the control (verl's DAPO reward manager, TRL's cosine-scaled reward)."""

from __future__ import annotations

import math

import pytest

from bench import peer_arms

#: completions of the embedded task: correct, wrong, correct, malformed
COMPLETIONS = ["<think>3 + 4 so 7</think>7", "<think>3 + 4 so 8</think>8", "<think>hmm</think>7", "7"]
ANSWERS = ["7", "7", "7", "7"]


def ids(*lengths: int) -> list[list[int]]:
    return [[5] * n for n in lengths]


def test_soft_overlong_is_trls_function_with_dapos_numbers():
    reward = peer_arms.soft_overlong_reward(48, 12)
    assert type(reward).__module__ == "trl.rewards.other_rewards"
    assert reward(completion_ids=ids(30, 36, 42, 48, 49)) == [0.0, 0.0, -0.5, -1.0, -1.0]


def test_dapo_overlong_hand_values():
    reward = peer_arms.dapo_overlong_reward(48, 12, penalty_factor=0.5)
    assert reward(completion_ids=ids(10, 36, 39, 48)) == [0.0, 0.0, -0.125, -0.5]


def test_dapo_overlong_equals_verls_reward_manager(random_model_dir):
    """verl's own ``DAPORewardManager`` with an overlong buffer, on a real ``DataProto`` of responses of the
    given lengths whose scores are the task's correctness: the reward at each response's last token equals
    correctness + our overlong reward."""
    pytest.importorskip("verl")
    from tests.dapo_reference import dapo_manager_rewards
    from trl_length_plugin.embedded import load_tokenizer, score_completion

    tokenizer = load_tokenizer(random_model_dir)
    max_len, buffer, factor = 48, 12, 0.7
    lengths = [20, 37, 41, 48]
    texts = [COMPLETIONS[0], COMPLETIONS[1], COMPLETIONS[0], COMPLETIONS[3]]
    scores = [score_completion(text, "7") for text in texts]
    theirs = dapo_manager_rewards(tokenizer, texts, lengths, max_len, buffer, factor)
    ours = peer_arms.dapo_overlong_reward(max_len, buffer, factor)(completion_ids=ids(*lengths))
    assert scores == [1.0, 0.0, 1.0, 0.0]
    assert theirs == pytest.approx([s + o for s, o in zip(scores, ours, strict=True)], abs=1e-6)
    assert ours[0] == 0.0 and ours[1] == pytest.approx(-0.7 / 12) and ours[3] == pytest.approx(-0.7)


def test_cosine_hand_values():
    reward = peer_arms.cosine_reward(48)
    values = reward(completions=COMPLETIONS, answer=ANSWERS, completion_ids=ids(0, 24, 48, 96))
    # correct at 0 tokens: 1.0; wrong at half: -0.75; correct at max: 0.5; wrong beyond max (clamped): -0.5
    assert values == pytest.approx([1.0, -0.75, 0.5, -0.5])


def test_cosine_equals_trls_function_given_the_same_correctness(monkeypatch):
    """TRL's ``get_cosine_scaled_reward`` judges correctness with math verification (not installed, and not
    the task's format): its ``accuracy_reward`` is replaced by the task's correctness, everything else is TRL's
    own code."""
    from trl.rewards import accuracy_rewards

    from trl_length_plugin.embedded import correctness_reward

    monkeypatch.setattr(
        accuracy_rewards,
        "accuracy_reward",
        lambda completions, solution: correctness_reward(completions, solution),
    )
    lengths = ids(3, 17, 31, 60)
    for bounds in (
        {},
        dict(min_value_wrong=-2.0, max_value_wrong=-0.1, min_value_correct=0.2, max_value_correct=2.0),
    ):
        theirs = accuracy_rewards.get_cosine_scaled_reward(40, **bounds)(COMPLETIONS, ANSWERS, lengths)
        ours = peer_arms.cosine_reward(40, **bounds)(
            completions=COMPLETIONS, answer=ANSWERS, completion_ids=lengths
        )
        assert ours == pytest.approx(theirs, abs=1e-12)
    assert theirs[0] == pytest.approx(0.2 + 0.5 * 1.8 * (1 + math.cos(3 / 40 * math.pi)))


def test_kimi_length_reward_hand_values():
    reward = peer_arms.kimi_length_reward(num_generations=4, weight=0.5)
    completions = [COMPLETIONS[0], COMPLETIONS[1], COMPLETIONS[0], COMPLETIONS[1]] * 2
    lengths = ids(10, 20, 30, 10, 7, 7, 7, 7)
    values = reward(completions=completions, answer=["7"] * 8, completion_ids=lengths)
    # group 1: lambda = 0.5, 0, -0.5, 0.5; correct keep lambda, wrong min(0, lambda); group 2: equal lengths
    assert values == pytest.approx([0.25, 0.0, -0.25, 0.0, 0.0, 0.0, 0.0, 0.0])


def test_per_token_penalty():
    assert peer_arms.per_token_penalty(0.01)(completion_ids=ids(0, 10, 48)) == pytest.approx(
        [0.0, -0.1, -0.48]
    )


def test_reward_names_are_trls_metric_keys():
    names = {
        peer_arms.dapo_overlong_reward(48, 12).__name__,
        peer_arms.cosine_reward(48).__name__,
        peer_arms.kimi_length_reward(8).__name__,
        peer_arms.per_token_penalty(0.01).__name__,
        peer_arms.soft_overlong_reward(48, 12).__name__,
    }
    assert names == {
        "dapo_overlong_reward",
        "cosine_reward",
        "kimi_length_reward",
        "per_token_length_penalty",
        "soft_overlong_punishment_reward",
    }
