"""The per-rollout length terms (docs/reference/length-penalties.md §2.17-2.19): DAPO overlong punishment,
the cosine length reward and truncated rollouts. Hand-computed values, the float64 reference, properties,
load-time refusals and parity with the hosts' own functions (TRL's ``get_soft_overlong_punishment`` and
``get_cosine_scaled_reward``, verl's ``DAPORewardManager``)."""

from __future__ import annotations

import logging
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.shaping_strategies import config_dict, shaping_batch
from tests.test_shaping_reference import SETTINGS, assert_matches_reference, chunk_slots
from trl_length_plugin.shaping import LengthPenaltyConfig, RolloutBatch, apply_length_penalties
from trl_length_plugin.shaping.config import LengthConfigError, LengthShapingConfig, load_shaping_config
from trl_length_plugin.shaping.normalization import TRL_NORMALIZATION
from trl_length_plugin.shaping.pipeline import shape_rollouts

OVERLONG = {"overlong_max_length": 48, "overlong_buffer": 12}


def penalties(rewards, lengths, groups=None, truncated=None, **params):
    batch = RolloutBatch(rewards, groups or [0] * len(rewards), answer_lengths=lengths, truncated=truncated)
    return apply_length_penalties(batch, {"default": params})


def test_overlong_hand_values():
    result = penalties([1, 1, 1, 1, 1, 0], [10, 36, 42, 48, 60, 42], **OVERLONG)
    # 0 up to 36, linear to -1 at 48, -1 beyond; a wrong rollout keeps its negative reward
    assert result.rewards.tolist() == [1.0, 1.0, 0.5, 0.0, 0.0, -0.5]
    assert result.metrics["length_penalty/overlong_frac"] == pytest.approx(4 / 6)
    assert result.metrics["length_penalty/overlong_penalty_mean"] == pytest.approx(-3.0 / 6)
    factor = penalties([1, 1], [39, 100], overlong_factor=0.5, **OVERLONG)
    assert factor.rewards.tolist() == [0.875, 0.5]


def test_overlong_reads_its_channel():
    batch = RolloutBatch([1, 1], [0, 0], reasoning_lengths=[40, 0], answer_lengths=[2, 45])
    config = {"default": {**OVERLONG, "overlong_channel": "answer"}}
    assert apply_length_penalties(batch, config).rewards.tolist() == [1.0, 0.25]


def test_group_terms_see_the_overlong_penalty():
    """Two correct rollouts: alone, the longest top scorer loses 0.1; with the overlong penalty the long one
    is still a top scorer (top scorers compare correctness, §2.7), so it loses the 0.1 on top of its overlong
    penalty."""
    plain = penalties([1, 1], [42, 30], longest_total_penalty=0.1)
    assert plain.rewards.tolist() == [0.9, 1.0]
    both = penalties([1, 1], [42, 30], longest_total_penalty=0.1, **OVERLONG)
    assert both.rewards.tolist() == pytest.approx([0.4, 1.0])


def test_a_rollout_in_the_overlong_buffer_never_escapes_the_longest_penalty():
    """Issue 42's case (§2.6 "Longer never scores higher"): four correct rollouts, the three longest in the
    overlong buffer or past it (rollout rewards 1, 0.833, 0.5, 0.5). Before, the top threshold read those
    rollout rewards: only rows 0 and 1 were top scorers, so the 40-token row lost the longest penalty and
    the 50- and 60-token rows scored above it ([1, 0.433, 0.5, 0.5]). Now every correct row is a top scorer
    (NeMo-RL: binary rewards tie at the top) and the longest, 60 tokens, loses it."""
    result = penalties(
        [1, 1, 1, 1], [10, 40, 50, 60], longest_total_penalty=0.4, overlong_factor=0.5, **OVERLONG
    )
    assert result.rewards.tolist() == pytest.approx([1.0, 1 - 0.5 / 3, 0.5, 0.1])


def test_group_terms_keep_positive_as_the_correctness():
    """Cosine makes a wrong rollout's reward negative and a correct one's 0.5 at the maximum: the two correct
    rows are still the positives, so the shortest bonus goes to the shortest correct row."""
    result = penalties([1, 0, 1], [48, 5, 24], cosine_max_length=48, total_bonus=0.25)
    assert result.rewards.tolist() == pytest.approx(
        [0.5, -0.5 - 0.5 * 0.5 * (1 + math.cos(5 / 48 * math.pi)), 0.75 + 0.25]
    )


def test_cosine_hand_values():
    result = penalties([1, 0, 1, 0], [0, 24, 48, 96], cosine_max_length=48)
    # correct at 0: 1.0; wrong at half: -0.75; correct at the maximum: 0.5; wrong beyond it (clamped): -0.5
    assert result.rewards.tolist() == pytest.approx([1.0, -0.75, 0.5, -0.5])
    assert result.metrics["length_penalty/cosine_delta_mean"] == pytest.approx((0 - 0.75 - 0.5 - 0.5) / 4)


def test_soft_overlong_equals_trls_function():
    """TRL's ``get_soft_overlong_punishment`` counts ``len(completion_ids)``; the batch's total channel is fed
    the same counts, so the shaped reward of a correct rollout is 1 + TRL's value, bit for bit."""
    from trl.rewards import get_soft_overlong_punishment

    lengths = list(range(0, 61, 3))
    theirs = get_soft_overlong_punishment(48, 12)(completion_ids=[[7] * n for n in lengths])
    ours = penalties([1] * len(lengths), lengths, **OVERLONG).rewards - 1
    assert ours.tolist() == theirs
    assert min(theirs) == -1.0 and theirs.count(0.0) == 13


def test_dapo_overlong_equals_verls_reward_manager(random_model_dir):
    """verl's own ``DAPORewardManager`` with an overlong buffer, on a real ``DataProto`` whose scores are the
    task's correctness: the reward at each response's last token equals our shaped reward (correctness plus
    overlong, wrong rollouts negative), with the factor verl calls ``penalty_factor``."""
    pytest.importorskip("verl")
    from tests.dapo_reference import dapo_manager_rewards
    from trl_length_plugin.embedded import load_tokenizer, score_completion

    tokenizer = load_tokenizer(random_model_dir)
    max_len, buffer, factor = 48, 12, 0.7
    lengths = [20, 37, 41, 48]
    texts = ["<think>3 + 4 so 7</think>7", "<think>3 + 4 so 8</think>8", "<think>hmm</think>7", "7"]
    theirs = dapo_manager_rewards(tokenizer, texts, lengths, max_len, buffer, factor)
    scores = [score_completion(text, "7") for text in texts]
    assert scores == [1.0, 0.0, 1.0, 0.0]
    ours = penalties(
        scores, lengths, overlong_max_length=max_len, overlong_buffer=buffer, overlong_factor=factor
    ).rewards
    assert ours.tolist() == pytest.approx(theirs, abs=1e-6)  # verl's reward tensor is float32
    assert ours.tolist() == pytest.approx([1.0, -0.7 / 12, 1 - 0.7 * 5 / 12, -0.7])


def test_cosine_equals_trls_function(monkeypatch):
    """TRL's ``get_cosine_scaled_reward`` judges correctness with math verification (not installed here, and
    not the task's format): its ``accuracy_reward`` is replaced by the task's correctness, everything else is
    TRL's own code. Its length is ``len(completion_ids)``; our total channel is fed the same counts."""
    from trl.rewards import accuracy_rewards

    correctness = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    monkeypatch.setattr(accuracy_rewards, "accuracy_reward", lambda completions, solution: correctness)
    lengths = [3, 17, 31, 60, 40, 0]
    ids = [[5] * n for n in lengths]
    for bounds in (
        {},
        dict(min_value_wrong=-2.0, max_value_wrong=-0.1, min_value_correct=0.2, max_value_correct=2.0),
    ):
        theirs = accuracy_rewards.get_cosine_scaled_reward(40, **bounds)(["x"] * 6, ["y"] * 6, ids)
        keys = {f"cosine_{key}": value for key, value in bounds.items()}
        ours = penalties(correctness, lengths, cosine_max_length=40, **keys).rewards
        assert ours.tolist() == pytest.approx(theirs, abs=1e-12)
    assert theirs[0] == pytest.approx(0.2 + 0.5 * 1.8 * (1 + math.cos(3 / 40 * math.pi)))


def shaping(**params):
    return LengthShapingConfig(length_penalty={"default": params})


def test_truncation_modes_hand_values():
    batch = dict(rewards=[1, 0, 1, 1], group_index=[0, 0, 1, 1], answer_lengths=[10, 36, 42, 50])
    flags = [False, True, False, True]
    incorrect = shape_rollouts(
        RolloutBatch(**batch, truncated=flags), shaping(truncation="incorrect"), TRL_NORMALIZATION
    )
    assert incorrect.rewards.tolist() == [1.0, 0.0, 1.0, 0.0] and incorrect.loss_keep is None
    assert incorrect.metrics["length_penalty/truncated_frac"] == 0.5
    assert incorrect.metrics["length_penalty/pct_all_correct"] == 0.0  # the binary check saw the zero
    mask = shape_rollouts(
        RolloutBatch(**batch, truncated=flags), shaping(truncation="mask"), TRL_NORMALIZATION
    )
    assert mask.rewards.tolist() == [1.0, 0.0, 1.0, 1.0] and mask.loss_keep.tolist() == [
        True,
        False,
        True,
        False,
    ]
    penalty = shape_rollouts(
        RolloutBatch(**batch, truncated=flags),
        shaping(truncation="penalty", truncation_penalty_factor=0.25),
        TRL_NORMALIZATION,
    )
    assert penalty.rewards.tolist() == [1.0, 0.0, 1.0, 0.25] and penalty.loss_keep is None


def test_truncation_penalty_never_raises_a_negative_reward():
    result = penalties(
        [1, 0],
        [60, 60],
        truncated=[True, True],
        truncation="penalty",
        truncation_penalty_factor=0.5,
        **OVERLONG,
    )
    assert result.rewards.tolist() == [0.0, -1.0]
    cosine = penalties(
        [1, 0],
        [0, 0],
        truncated=[True, True],
        truncation="penalty",
        truncation_penalty_factor=0.5,
        cosine_max_length=10,
    )
    assert cosine.rewards.tolist() == [0.5, -1.0]


def test_mask_zeroes_the_coefficients_loss_length():
    """The masked row's loss length counts 0 (§3.2, as TRL's ``mask_truncated_completions``)."""
    batch = dict(rewards=[1, 1], group_index=[0, 0], loss_lengths=[10, 40], truncated=[False, True])
    plain = LengthShapingConfig(length_penalty_coeff=1.0, length_penalty_min_tokens=10)
    assert shape_rollouts(RolloutBatch(**batch), plain, TRL_NORMALIZATION).rewards.tolist() == [1.0, 0.25]
    masked = plain.model_copy(
        update={
            "length_penalty": LengthShapingConfig(
                length_penalty={"default": {"truncation": "mask"}}
            ).length_penalty
        }
    )
    result = shape_rollouts(RolloutBatch(**batch), masked, TRL_NORMALIZATION)
    assert result.rewards.tolist() == [1.0, 1.0] and result.loss_keep.tolist() == [True, False]


def test_truncation_needs_the_flag():
    with pytest.raises(ValueError, match="truncated flag"):
        shape_rollouts(RolloutBatch([1, 0], [0, 0]), shaping(truncation="mask"), TRL_NORMALIZATION)
    with pytest.raises(ValueError, match="one flag per row"):
        RolloutBatch([1, 0], [0, 0], truncated=[True])


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"overlong_max_length": 48}, "length_penalty.default.overlong_buffer"),
        ({"overlong_max_length": 48, "overlong_buffer": 49}, "length_penalty.default.overlong_buffer"),
        ({"overlong_buffer": 4}, "length_penalty.default.overlong_buffer"),
        ({"overlong_max_length": -1, "overlong_buffer": 1}, "length_penalty.default.overlong_max_length"),
        ({**OVERLONG, "overlong_factor": -0.5}, "length_penalty.default.overlong_factor"),
        ({"overlong_max_length": 48.5, "overlong_buffer": 4}, "length_penalty.default.overlong_max_length"),
        ({"cosine_min_value_wrong": -2.0}, "length_penalty.default.cosine_min_value_wrong"),
        ({"cosine_max_length": 10, "cosine_channel": "all"}, "length_penalty.default.cosine_channel"),
        ({"truncation": "drop"}, "length_penalty.default.truncation"),
        ({"truncation_penalty_factor": 0.5}, "length_penalty.default.truncation_penalty_factor"),
        (
            {"truncation": "penalty", "truncation_penalty_factor": 1.5},
            "length_penalty.default.truncation_penalty_factor",
        ),
    ],
)
def test_bad_values_are_refused_at_load_naming_the_key(params, key):
    with pytest.raises(LengthConfigError) as err:
        load_shaping_config({"length_penalty": {"default": params}})
    message = str(err.value)
    assert key in message and "\n" not in message


def test_an_override_is_checked_merged_with_default():
    block = {"default": OVERLONG, "agent_overrides": {"math": {"overlong_max_length": 8}}}
    with pytest.raises(LengthConfigError, match="agent_overrides.math.overlong_buffer"):
        load_shaping_config({"length_penalty": block})
    ok = load_shaping_config(
        {"length_penalty": {**block, "agent_overrides": {"math": {"overlong_buffer": 4}}}}
    )
    assert ok.length_penalty.for_agent("math").overlong_buffer == 4


@settings(deadline=None, max_examples=300)
@given(
    lengths=st.lists(st.integers(0, 200), min_size=1, max_size=12),
    longest=st.integers(1, 150),
    buffer_share=st.floats(0.01, 1.0),
    factor=st.floats(0.0, 3.0),
)
def test_overlong_is_bounded_and_non_increasing_in_length(lengths, longest, buffer_share, factor):
    buffer = max(1, int(longest * buffer_share))
    ordered = sorted(lengths)
    result = penalties(
        [1] * len(ordered),
        ordered,
        overlong_max_length=longest,
        overlong_buffer=buffer,
        overlong_factor=factor,
    )
    values = (result.rewards - 1).tolist()
    assert all(-factor - 1e-12 <= v <= 0 for v in values)
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))
    assert all(v == 0 for n, v in zip(ordered, values, strict=True) if n <= longest - buffer)


@settings(deadline=None, max_examples=300)
@given(
    lengths=st.lists(st.integers(0, 200), min_size=1, max_size=12),
    correct=st.lists(st.booleans(), min_size=12, max_size=12),
    longest=st.integers(1, 150),
)
def test_cosine_stays_within_its_bounds_and_prefers_short_correct(lengths, correct, longest):
    rewards = [float(c) for c in correct[: len(lengths)]]
    values = penalties(rewards, lengths, cosine_max_length=longest).rewards.tolist()
    for r, v in zip(rewards, values, strict=True):
        assert (0.5 - 1e-12 <= v <= 1 + 1e-12) if r else (-1 - 1e-12 <= v <= -0.5 + 1e-12)
    for r in (0.0, 1.0):
        pairs = sorted((n, v) for rr, n, v in zip(rewards, lengths, values, strict=True) if rr == r)
        ok = (
            all(a[1] >= b[1] - 1e-12 for a, b in zip(pairs, pairs[1:], strict=False))
            if r
            else all(a[1] <= b[1] + 1e-12 for a, b in zip(pairs, pairs[1:], strict=False))
        )
        assert ok


ROLLOUT_KEYS = st.fixed_dictionaries(
    {},
    optional={
        "overlong": st.tuples(
            st.integers(1, 60),
            st.integers(1, 60),
            st.sampled_from([0.0, 0.5, 1.0, 2.0]),
            st.sampled_from(["total", "reasoning", "answer"]),
        ),
        "cosine": st.tuples(
            st.integers(1, 80), st.sampled_from(["total", "reasoning", "answer"]), st.booleans()
        ),
        "truncation": st.sampled_from(["none", "penalty", "penalty", "mask", "incorrect"]),
    },
)


def rollout_params(drawn):
    params = {}
    if "overlong" in drawn:
        longest, buffer, factor, channel = drawn["overlong"]
        params.update(
            overlong_max_length=max(longest, buffer),
            overlong_buffer=buffer,
            overlong_factor=factor,
            overlong_channel=channel,
        )
    if "cosine" in drawn:
        longest, channel, custom = drawn["cosine"]
        params.update(cosine_max_length=longest, cosine_channel=channel)
        if custom:
            params.update(
                cosine_min_value_wrong=-2.0,
                cosine_max_value_wrong=0.1,
                cosine_min_value_correct=0.2,
                cosine_max_value_correct=3.0,
            )
    if drawn.get("truncation", "none") != "none":
        params["truncation"] = drawn["truncation"]
        if drawn["truncation"] == "penalty":
            params["truncation_penalty_factor"] = 0.3
    return params


@settings(SETTINGS, max_examples=600)
@given(
    batch=shaping_batch(),
    config=config_dict(),
    rollout=ROLLOUT_KEYS,
    override=ROLLOUT_KEYS,
    flags=st.randoms(use_true_random=False),
    slots=chunk_slots,
)
def test_rollout_terms_match_reference(batch, config, rollout, override, flags, slots):
    """The engine with the per-rollout terms against the float64 reference (tests/shaping_reference.py),
    with the group terms, agents, overrides and metadata of the existing strategies."""
    logging.getLogger("trl_length_plugin").setLevel(logging.ERROR)
    rewards, group_index, reasoning, answer, agents, metadata, multi = batch
    config["default"] = {**config["default"], **rollout_params(rollout)}
    if config.get("agent_overrides") and config["agent_overrides"].get("math") is not None:
        config["agent_overrides"]["math"] = {**config["agent_overrides"]["math"], **rollout_params(override)}
    try:
        cfg = LengthPenaltyConfig.model_validate(config)
    except ValueError:  # an override's maximum below the default's buffer
        return
    truncated = [flags.random() < 0.4 for _ in rewards]
    assert_matches_reference(batch, cfg, slots, truncated)


def test_preview_shows_the_overlong_term(tmp_path, capsys):
    """``trl-length preview`` runs the same step: the overlong term on the recorded lengths (totals of
    tests/test_offline_preview.py's rollouts: a 20, 60, 5, 40; b 15, 25; c is non-binary, untouched)."""
    import json

    import yaml

    from tests.test_offline_preview import preview, write_rollouts

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump({"length_penalty": {"default": {"overlong_max_length": 60, "overlong_buffer": 40}}})
    )
    out, png = tmp_path / "shaped.jsonl", tmp_path / "p.png"
    rollouts = write_rollouts(tmp_path / "r.jsonl")
    status, stdout, _ = preview(capsys, rollouts, "--config", recipe, "--output", out, "--png", png)
    assert status == 0
    shaped = [json.loads(line)["shaped_reward"] for line in out.read_text().splitlines()]
    assert shaped == pytest.approx([1.0, 0.0, 0.0, 0.5, 1.0, 0.875, 0.5, 1.0])
    assert "overlong" in stdout
    recipe.write_text(yaml.safe_dump({"length_penalty": {"default": {"truncation": "incorrect"}}}))
    status, _, err = preview(capsys, rollouts, "--config", recipe, "--png", tmp_path / "q.png")
    assert status == 2 and "length_penalty.truncation" in err and err.count("\n") == 1
