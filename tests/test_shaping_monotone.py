"""Longer never scores higher than shorter at the same correctness, for every composition of the terms
(issue 42, class 2; docs/reference/length-penalties.md §2.6 "Longer never scores higher").

Over random configurations (every group term, every per-rollout term, the band, overrides per agent, the
coefficient) and random groups whose rows are mostly comparable by length: of two rows of a group with the
same correctness reward, one longer than the other (in every channel longer, or both empty there), the
longer one's shaped reward is never above the shorter one's. The only exceptions are the sources' own
documented rules, each excluded by the named condition below and listed in the reference with its example
(the ``test_exception_*`` tests are those examples).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.shaping_strategies import every_term_config, ordered_groups
from trl_length_plugin.shaping import LengthPenaltyConfig, RolloutBatch, load_shaping_config, shape_rollouts
from trl_length_plugin.shaping.normalization import TRL_NORMALIZATION

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CHANNELS = ("reasoning", "answer")
COEFFICIENTS = (0.0, 0.5, 2.0)


@dataclass
class Case:
    """One shaped batch and what the exceptions read: per row its lengths, its agent's parameters, its
    prompt's target and the terms' outputs (the verbose trace)."""

    rows: RolloutBatch
    shaped: list[float]
    lengths: dict[str, list[float]]
    params: list
    targets: list
    changes: dict[str, list[float]]
    loss_keep: list[bool]
    correctness: list[float]

    def change(self, name: str, row: int) -> float:
        return self.changes[name][row] if name in self.changes else 0.0


def longer(case: Case, a: int, b: int) -> bool:
    """Row ``a`` is longer than row ``b``: in each channel longer, or both empty, and longer in one."""
    pairs = [(case.lengths[c][a], case.lengths[c][b]) for c in CHANNELS]
    return all(x > y or x == y == 0 for x, y in pairs) and any(x > y for x, y in pairs)


# -- the documented exceptions: (case, shorter row, longer row) -> whether the rule decided the pair ----------
def profiled_needs_a_non_negative_sum(case: Case, short: int, long: int) -> bool:
    """§2.10 (NeMo-RL): the profiled penalty applies only where the §2.7-2.9 terms sum to >= 0, so a longer
    row that a longest penalty already hit escapes it while a shorter one pays it."""
    return case.change("profiled", short) < 0 and case.change("profiled", long) == 0


def shortest_bonus_skips_an_empty_channel(case: Case, short: int, long: int) -> bool:
    """§2.7 (NeMo-RL): the shortest bonus goes to the shortest *non-empty* channel, so a row with an empty
    answer cannot win the answer bonus that a longer row wins."""
    return any(
        case.change(f"{c}_bonus", long) > 0 and case.lengths[c][short] == 0
        for c in ("reasoning", "answer", "total")
    )


def cosine_rises_with_length(case: Case, short: int, long: int) -> bool:
    """§2.18 (Yeo et al., TRL's defaults): a wrong rollout's cosine reward rises with its length (-1 at 0 to
    -0.5 at the maximum: a wrong model should think longer). (A correct one's may not: refused at load.)"""
    p = case.params[long]
    return (
        bool(p.cosine_max_length)
        and case.correctness[long] <= 0
        and p.cosine_max_value_wrong > p.cosine_min_value_wrong
    )


def lcpo_exact_asks_for_the_target(case: Case, short: int, long: int) -> bool:
    """§2.20 (L1, LCPO-Exact): -alpha * |n - t| pays for reaching the prompt's target from below."""
    p, target = case.params[short], case.targets[short]
    if p.target_length != "exact" or target is None:
        return False
    return case.lengths[p.target_length_channel][short] < target


def outside_the_loss(case: Case, short: int, long: int) -> bool:
    """§3.2 (the seed: masked tokens do not count): a rollout that leaves the loss (``truncation: mask``,
    TRL's ``mask_truncated_completions``) has loss length 0, so the coefficient keeps it at multiplier 1; its
    reward trains nothing."""
    return not case.loss_keep[long]


EXCEPTIONS = (
    outside_the_loss,
    profiled_needs_a_non_negative_sum,
    shortest_bonus_skips_an_empty_channel,
    cosine_rises_with_length,
    lcpo_exact_asks_for_the_target,
)


def shape(data, config: dict, coeff: float, min_tokens: int = 0) -> Case:
    logging.getLogger("trl_length_plugin").setLevel(logging.ERROR)
    rewards, group_index, reasoning, answer, agents, metadata, truncated, totals = data
    rows = RolloutBatch(
        rewards, group_index, reasoning, answer, agents, metadata, loss_lengths=totals, truncated=truncated
    )
    shaping = load_shaping_config(
        {
            "length_penalty": {**config, "verbose": True},
            "length_penalty_coeff": coeff,
            "length_penalty_min_tokens": min_tokens,
        }
    )
    result = shape_rollouts(rows, shaping, TRL_NORMALIZATION)
    trace = result.penalties.trace if result.penalties is not None else None
    changes = {} if trace is None else {name: values.tolist() for name, values in trace.changes.items()}
    block = LengthPenaltyConfig.model_validate(config)
    targets = [None if entry is None else entry.get("target_length") for entry in metadata]
    return Case(
        rows,
        result.rewards.tolist(),
        {"reasoning": reasoning, "answer": answer, "total": totals},
        [block.for_agent(agent) for agent in agents],
        targets,
        changes,
        [True] * len(rewards) if result.loss_keep is None else result.loss_keep.tolist(),
        result.correctness.tolist(),
    )


def violations(case: Case) -> list[tuple[int, int]]:
    """(shorter, longer) pairs of a group, same correctness, where the longer scores higher and no
    documented rule decided it."""
    ids, raw, out = case.rows.layout.gid.tolist(), case.rows.rewards.tolist(), case.shaped
    found = []
    for short in range(len(ids)):
        for long in range(len(ids)):
            same = ids[short] == ids[long] and raw[short] == raw[long] and not math.isnan(raw[short])
            higher = same and longer(case, long, short) and out[long] > out[short] + 1e-9
            if higher and not any(rule(case, short, long) for rule in EXCEPTIONS):
                found.append((short, long))
    return found


def group(rewards, answer, reasoning=None, entry=None, truncated=None):
    """One group's ``ordered_groups`` fields from its rewards and channel lengths."""
    n = len(rewards)
    reasoning = reasoning or [0] * n
    totals = [r + a for r, a in zip(reasoning, answer, strict=True)]
    return rewards, [0] * n, reasoning, answer, [None] * n, [entry] * n, truncated or [False] * n, totals


# Issue 42's case: a correct rollout in the overlong buffer escaped the longest penalty a shorter one got
OVERLONG_ESCAPE = (
    group([1.0, 1.0, 1.0, 1.0], [10, 40, 50, 60]),
    {"default": {"overlong_max_length": 48, "overlong_buffer": 12, "overlong_factor": 0.5,
                 "longest_total_penalty": 0.4}},
)  # fmt: skip


def test_issue_42s_case_is_no_violation():
    case = shape(*OVERLONG_ESCAPE, 0.0)
    assert case.shaped == pytest.approx([1.0, 1 - 0.5 / 3, 0.5, 0.1])
    assert not violations(case)


@SETTINGS
@example(data=OVERLONG_ESCAPE[0], config=OVERLONG_ESCAPE[1], coeff=0.0)
@given(data=ordered_groups(), config=every_term_config(), coeff=st.sampled_from(COEFFICIENTS))
def test_longer_never_scores_higher_at_the_same_correctness(data, config, coeff):
    case = shape(data, config, coeff)
    assert not violations(case), (violations(case), case.shaped)


# -- each exception's example (docs/reference/length-penalties.md §2.6 "Longer never scores higher") --------
def excused_by(rule, data, block: dict, coeff: float = 0.0, min_tokens: int = 0) -> list[float]:
    """The shaped rewards of one group whose last row is longer than the one before it and scores higher;
    asserts ``rule``, and only it, decides that pair."""
    case = shape(data, {"default": block}, coeff, min_tokens)
    short, long = len(case.shaped) - 2, len(case.shaped) - 1
    assert longer(case, long, short) and case.shaped[long] > case.shaped[short]
    assert [r.__name__ for r in EXCEPTIONS if r(case, short, long)] == [rule.__name__]
    return case.shaped


def test_exception_profiled_needs_a_non_negative_sum():
    profile = {"profiled_rewards": [1, 1], "profiled_output_lengths": [1000, 1100]}  # threshold 1050
    block = {"longest_total_penalty": 0.05, "profiled_length_penalty": 0.1, "profiled_length_n_std": 0.0}
    shaped = excused_by(
        profiled_needs_a_non_negative_sum, group([1.0] * 3, [1000, 1100, 1200], entry=profile), block
    )
    assert shaped == pytest.approx([1.0, 0.9, 0.95])


def test_exception_shortest_bonus_skips_an_empty_channel():
    data = group([1.0, 1.0], [3, 4], reasoning=[0, 5])
    assert excused_by(shortest_bonus_skips_an_empty_channel, data, {"reasoning_bonus": 0.1}) == [1.0, 1.1]


def test_exception_cosine_rises_with_length():
    data = group([0.0, 0.0], [0, 48])
    assert excused_by(cosine_rises_with_length, data, {"cosine_max_length": 48}) == pytest.approx(
        [-1.0, -0.5]
    )


def test_exception_lcpo_exact_asks_for_the_target():
    data = group([1.0, 1.0], [50, 100], entry={"target_length": 100})
    block = {"target_length": "exact", "target_length_alpha": 0.001}
    assert excused_by(lcpo_exact_asks_for_the_target, data, block) == pytest.approx([0.95, 1.0])


def test_exception_outside_the_loss():
    """The truncated row leaves the loss: its loss length is 0, so the coefficient (floor m = 10 sets L_ref)
    keeps it at multiplier 1 while the 20-token row gets 0.5."""
    data = group([1.0, 1.0, 1.0], [10, 20, 40], truncated=[False, False, True])
    shaped = excused_by(outside_the_loss, data, {"truncation": "mask"}, coeff=1.0, min_tokens=10)
    assert shaped == [1.0, 0.5, 1.0]


def test_preview_shows_the_longest_penalty_on_the_longest_rollout(tmp_path, capsys):
    """Issue 42's case through ``trl-length preview`` (the offline CLI): the 60-token rollout, not the
    40-token one, loses the longest penalty, and no longer rollout ends above a shorter one."""
    import json

    from trl_length_plugin.tools import commands

    rollouts, out = tmp_path / "r.jsonl", tmp_path / "shaped.jsonl"
    lengths = OVERLONG_ESCAPE[0][3]
    rollouts.write_text(
        "".join(
            json.dumps({"prompt_id": "p", "reasoning_tokens": 0, "answer_tokens": n, "reward": 1}) + "\n"
            for n in lengths
        )
    )
    block = json.dumps(OVERLONG_ESCAPE[1])
    commands.main(["preview", str(rollouts), "--length_penalty", block, "--output", str(out),
                   "--png", str(tmp_path / "p.png")])  # fmt: skip
    capsys.readouterr()
    shaped = [json.loads(line)["shaped_reward"] for line in out.read_text().splitlines()]
    assert shaped == pytest.approx([1.0, 1 - 0.5 / 3, 0.5, 0.1])
    assert shaped == sorted(shaped, reverse=True)
