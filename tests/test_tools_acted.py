"""Issue 42, class 6: ``verl-smoke`` and ``recipe-smoke`` said PASS when a switched-on feature never acted (the
coefficient penalized nothing, score centering's correction was 0 at every step); each feature the run logs now
says whether it acted and, when it never did, why and what would make it act (``trl_length_plugin.tools.acted``)."""

from __future__ import annotations

import pytest

from trl_length_plugin.tools.acted import acted_lines

#: a step of a run with the coefficient on (verl's metric names; TRL's longest is completions/max_length)
COEFFICIENT = {
    "length_penalty/coeff": 0.5,
    "length_penalty/coeff_penalized_frac": 0.0,
    "response_length/max": 41.0,
}
SHAPING = {
    "length_penalty/adjusted_frac": 0.0,
    "length_penalty/pct_all_wrong": 0.75,
    "length_penalty/pct_all_correct": 0.25,
    "length_penalty/pct_mixed": 0.0,
    "length_penalty/skipped_non_binary_frac": 0.0,
}
CENTERING = {"score_centering/correction_abs_mean": 0.0, "score_centering/rho_mean": 1.0}


def test_a_floor_above_every_length_is_named_with_the_floor_that_would_act():
    [line] = acted_lines([COEFFICIENT, {**COEFFICIENT, "response_length/max": 37.0}], min_tokens=64)
    assert line == (
        "length coefficient: never acted: every response was under its floor length_penalty_min_tokens=64 (the "
        "longest: 41 tokens); set length_penalty_min_tokens below 41 to make it act on this model"
    )
    trl = {**COEFFICIENT, "completions/max_length": 30.0}
    del trl["response_length/max"]
    assert "(the longest: 30 tokens)" in acted_lines([trl], min_tokens=48)[0]


@pytest.mark.parametrize(
    ("rows", "min_tokens", "says"),
    [
        (
            [{**COEFFICIENT, "length_penalty/coeff_penalized_frac": 0.25}],
            64,
            "length coefficient: acted (it penalized up to 0.25",
        ),
        (
            [{**COEFFICIENT, "length_penalty/coeff": 0.0}],
            4,
            "the coefficient was 0 at every step (its warm-up",
        ),
        ([COEFFICIENT], 4, "no correct response was longer than its group's shortest correct one"),
        (
            [SHAPING],
            0,
            "group shaping: never acted: no reward changed at any step (groups, mean share: all-wrong 0.75, all-correct 0.25, mixed 0",
        ),
        ([{**SHAPING, "length_penalty/adjusted_frac": 0.5}], 0, "group shaping: acted (it changed up to 0.5"),
        (
            [CENTERING, CENTERING],
            0,
            "score centering: never acted: its correction was 0 at every step (the sampler agreed with the trainer, rho_mean 1,",
        ),
        (
            [{**CENTERING, "score_centering/correction_abs_mean": 3e-4}],
            0,
            "score centering: acted (mean |correction| up to 0.0003",
        ),
    ],
)
def test_each_feature_says_whether_it_acted(rows, min_tokens, says):
    [line] = acted_lines(rows, min_tokens)
    assert line.startswith(says) or says in line


def test_features_the_run_did_not_log_say_nothing():
    assert acted_lines([{"actor/pg_loss": 0.1, "actor/grad_norm": 1.0}]) == []
    assert len(acted_lines([{**COEFFICIENT, **SHAPING, **CENTERING}])) == 3
