"""A multiplicative term never raises a reward (issue 31, class 6; docs/reference/length-penalties.md §2.6,
docs/reference/length-coefficient.md §3.1, §3.5).

NeMo-RL's review found that a multiplicative band applied after additive penalties makes longer rollouts
score higher once the value is negative (0.5 * -1 > 1 * -1). Here every multiplicative step (the profile
band, LCPO-Max's budget, the truncation penalty, the length coefficient) multiplies only a positive value,
so over random configurations (every term, negative rollout rewards included) and groups: the band and the
coefficient never raise a reward, and of two correct rollouts of a group the longer never overtakes the
shorter one that was at least as good before the coefficient.
"""

from __future__ import annotations

import logging

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.shaping_strategies import config_dict, shaping_batch, without_idle_keys
from trl_length_plugin.shaping import RolloutBatch, load_shaping_config, shape_rollouts
from trl_length_plugin.shaping.normalization import TRL_NORMALIZATION

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BAND_FLAGS = {f"profile_band_{channel}": False for channel in ("total", "reasoning", "answer")}


@st.composite
def rollout_terms(draw) -> dict:
    """Per-rollout terms that can make a correct rollout's reward negative before the multipliers."""
    terms = {}
    if draw(st.booleans()):
        longest = draw(st.integers(1, 60))
        terms |= {"overlong_max_length": longest, "overlong_buffer": draw(st.integers(1, longest)),
                  "overlong_factor": draw(st.sampled_from([0.5, 1.0, 2.0, 3.0]))}  # fmt: skip
    if draw(st.booleans()):
        terms |= {"cosine_max_length": draw(st.integers(1, 60)),
                  "cosine_min_value_wrong": -3.0, "cosine_max_value_wrong": -2.0,  # below every correct value
                  "cosine_min_value_correct": draw(st.sampled_from([-2.0, -0.5, 0.0, 0.5])),
                  "cosine_max_value_correct": draw(st.sampled_from([0.5, 1.0, 2.0]))}  # fmt: skip
    if draw(st.booleans()):
        terms |= {"truncation": "penalty", "truncation_penalty_factor": draw(st.sampled_from([0.0, 0.5]))}
    return terms


def shaped(batch, penalties: dict, coeff: float):
    logging.getLogger("trl_length_plugin").setLevel(logging.ERROR)
    rewards, group_index, reasoning, answer, agents, metadata, multi = batch
    rows = RolloutBatch(
        rewards, group_index, reasoning, answer, agents, metadata, multi,
        loss_lengths=[r + a for r, a in zip(reasoning, answer, strict=True)],
        truncated=[length % 3 == 0 for length in answer],
    )  # fmt: skip
    config = load_shaping_config({"length_penalty": penalties, "length_penalty_coeff": coeff})
    return rows, shape_rollouts(rows, config, TRL_NORMALIZATION)


def without_bands(penalties: dict) -> dict:
    overrides = penalties.get("agent_overrides") or {}
    return {
        **penalties,
        "default": {**penalties["default"], **BAND_FLAGS},
        "agent_overrides": {a: None if o is None else {**o, **BAND_FLAGS} for a, o in overrides.items()},
    }


def not_above(after: torch.Tensor, before: torch.Tensor) -> bool:
    return bool(((after <= before + 1e-12) | (after.isnan() & before.isnan())).all())


@SETTINGS
@given(batch=shaping_batch(), penalties=config_dict(), rollout=rollout_terms(),
       coeff=st.sampled_from([0.0, 0.5, 1.0, 5.0]))  # fmt: skip
def test_no_multiplicative_term_raises_a_reward_or_favours_a_longer_rollout(batch, penalties, rollout, coeff):
    default = {**penalties["default"], **rollout}
    penalties = {**penalties, "default": without_idle_keys(default, default)}
    rows, result = shaped(batch, penalties, coeff)
    before = result.penalties.rewards.double() if result.penalties is not None else rows.rewards.double()
    after = result.rewards.double()
    assert not_above(after, before)  # the coefficient
    correct = rows.rewards == 1.0
    loss, ids = rows.loss_lengths, [int(g) for g in batch[1]]
    for i in range(len(after)):
        for j in range(len(after)):
            same = ids[i] == ids[j] and correct[i] and correct[j]
            if same and loss[i] <= loss[j] and before[i] >= before[j]:
                assert after[i] >= after[j] - 1e-12, (i, j, before[i], before[j], after[i], after[j])
    _, unbanded = shaped(batch, without_bands(penalties), coeff)
    if result.penalties is not None and unbanded.penalties is not None:
        assert not_above(result.penalties.rewards.double(), unbanded.penalties.rewards.double())  # the band


def test_the_reviews_case_a_negative_correct_reward_is_not_shrunk_for_the_longer_rollout():
    """Both rollouts correct and past the overlong maximum (rollout reward 1 - 2 = -1): before issue 31 the
    coefficient halved the longer one's -1 to -0.5, ranking it above the shorter one."""
    batch = ([1.0, 1.0, 0.0, 0.0], [0, 0, 0, 0], [0, 0, 0, 0], [30, 60, 5, 5], None, None, None)
    block = {"default": {"overlong_max_length": 20, "overlong_buffer": 10, "overlong_factor": 2.0}}
    _, result = shaped(batch, block, 1.0)
    assert result.rewards.tolist()[:2] == [-1.0, -1.0]
    assert result.coefficient.multipliers.tolist() == [1.0, 1.0, 1.0, 1.0]
