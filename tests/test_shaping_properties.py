"""Invariants of the group length shaping on random batches (docs/reference/length-penalties.md §2.4, §2.6, §2.7)."""

from __future__ import annotations

import logging

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.shaping_strategies import config_dict, shaping_batch
from trl_length_plugin.shaping import LengthPenaltyConfig, RolloutBatch, apply_length_penalties

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(batch, config, dtype=torch.float64):
    logging.getLogger("trl_length_plugin").setLevel(logging.ERROR)
    rewards, group_index, reasoning, answer, agents, metadata, multi = batch
    cfg = LengthPenaltyConfig.model_validate({**config, "verbose": True})
    rollouts = RolloutBatch(
        torch.tensor(rewards, dtype=dtype), group_index, reasoning, answer, agents, metadata, multi
    )
    return rollouts, apply_length_penalties(rollouts, cfg)


@SETTINGS
@given(batch=shaping_batch(), config=config_dict(), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_skipped_groups_are_bit_identical(batch, config, dtype):
    rollouts, result = run(batch, config, dtype)
    assert result.rewards.dtype == dtype
    skipped = [row for group in result.groups if group.status != "shaped" for row in group.rows]
    integer = torch.int32 if dtype == torch.float32 else torch.int64
    assert torch.equal(result.rewards[skipped].view(integer), rollouts.rewards[skipped].view(integer))


@SETTINGS
@given(batch=shaping_batch(), config=config_dict())
def test_clamp_never_gives_a_negative_reward_and_all_wrong_groups_stay_zero(batch, config):
    rollouts, result = run(batch, config)
    for group in result.groups:
        if group.status != "shaped":
            continue
        shaped = result.rewards[group.rows]
        assert bool((shaped >= 0).all())
        if all(reward <= 0 for reward in group.rewards):
            assert shaped.tolist() == [0.0] * len(group.rows)


@st.composite
def untied_batch(draw):
    """A batch whose channel lengths are all distinct, with per-prompt agents and metadata, and a
    permutation of the rows within their groups."""
    rewards, group_index, _, _, agents, metadata, multi = draw(shaping_batch(shared_metadata=True))
    rows = len(rewards)
    reasoning = draw(st.permutations(range(rows)))
    answer = [1000 * k for k in draw(st.permutations(range(rows)))]  # totals are distinct too
    order = list(range(rows))
    for key in set(group_index):
        members = [i for i in order if group_index[i] == key]
        for slot, row in zip(members, draw(st.permutations(members)), strict=True):
            order[slot] = row
    return (rewards, group_index, list(reasoning), answer, agents, metadata, multi), order


@SETTINGS
@given(data=untied_batch(), config=config_dict())
def test_permuting_rows_within_groups_permutes_the_output(data, config):
    """Without length ties the lowest-index tie rule never decides, so the output follows the rows."""
    batch, order = data
    _, result = run(batch, config)
    permuted = tuple(None if column is None else [column[i] for i in order] for column in batch)
    _, permuted_result = run(permuted, config)
    expected = result.rewards[order]
    assert torch.allclose(permuted_result.rewards, expected, rtol=0, atol=1e-12, equal_nan=True)


@given(
    st.sampled_from([1, 2, 4, 8, 16, 32]).flatmap(
        lambda width: st.tuples(
            st.just(width),
            st.lists(
                st.tuples(st.lists(st.integers(0, 60), max_size=width), st.integers(0, 60)),
                min_size=1,
                max_size=6,
            ),
            st.permutations(range(width)),
        )
    )
)
@SETTINGS
def test_the_sorting_networks_sort_like_torch_sort(data):
    """``sorted_slots`` on padded groups (members in any slots), and its bitonic network on the distances of
    their sorted values to a point (what zMAD's MAD sorts), equal ``torch.sort``."""
    from trl_length_plugin.shaping.groups import BIG, sorted_slots

    width, groups, slots = data
    values = torch.full((width, len(groups)), BIG, dtype=torch.float64)
    for g, (members, _) in enumerate(groups):
        values[: len(members), g] = torch.tensor(members, dtype=torch.float64)
    values = values[list(slots)]
    ordered = sorted_slots(values.clone())
    assert torch.equal(ordered, torch.sort(values, 0).values)
    point = torch.tensor([float(point) for _, point in groups], dtype=torch.float64)
    distances = (ordered - point).abs_()
    assert torch.equal(sorted_slots(distances.clone(), bitonic=True), torch.sort(distances, 0).values)
