"""Whether each switched-on feature of a smoke run acted (issue 42). ``verl-smoke`` and ``recipe-smoke`` pass on
the mechanics (the steps trained, the metrics finite), which a feature that never changed a reward or a loss
passes too: each feature the run logged says whether it acted, and when it never did, why (from the run's
own metrics) and what would make it act on this model."""

from __future__ import annotations

import math
from collections.abc import Sequence

#: the longest response of a step: verl's metric, TRL's
LONGEST = ("response_length/max", "completions/max_length")
#: a correction below this at every step is 0 (float rounding)
NO_CORRECTION = 1e-12


def _values(rows: Sequence[dict], *keys: str) -> list[float]:
    """The finite numbers the rows log under any of ``keys``."""
    found = (row.get(key) for row in rows for key in keys)
    return [float(v) for v in found if isinstance(v, (int, float)) and math.isfinite(v)]


def _mean(rows: Sequence[dict], key: str) -> float:
    values = _values(rows, key)
    return sum(values) / len(values) if values else math.nan


def coefficient_line(rows: Sequence[dict], min_tokens: float) -> str | None:
    """The length coefficient (docs/reference/length-coefficient.md §3.1): it acts on a correct response longer
    than its group's shortest correct one and than ``length_penalty_min_tokens``."""
    penalized = _values(rows, "length_penalty/coeff_penalized_frac")
    if not penalized:
        return None
    if max(penalized) > 0:
        return f"length coefficient: acted (it penalized up to {max(penalized):.3g} of a step's responses)"
    coefficients = _values(rows, "length_penalty/coeff")
    if coefficients and max(coefficients) == 0:
        why = "the coefficient was 0 at every step (its warm-up or schedule); train past them or raise length_penalty_coeff"
    else:
        longest = max(_values(rows, *LONGEST), default=math.nan)
        if longest <= min_tokens:
            why = (
                f"every response was under its floor length_penalty_min_tokens={min_tokens:g} (the longest: "
                f"{longest:g} tokens); set length_penalty_min_tokens below {longest:g} to make it act on this model"
            )
        else:
            why = (
                "no correct response was longer than its group's shortest correct one: groups with no correct "
                "response, or correct ones of one length; more rollouts per prompt, or a task the model answers "
                "more often, make it act"
            )
    return f"length coefficient: never acted: {why}"


def shaping_line(rows: Sequence[dict]) -> str | None:
    """The group shaping terms (docs/reference/length-penalties.md §2.6): they act on a group whose rollouts
    differ in length, binary rewards, and (the correctness-gated terms) a correct rollout."""
    adjusted = _values(rows, "length_penalty/adjusted_frac")
    if not adjusted:
        return None
    if max(adjusted) > 0:
        return f"group shaping: acted (it changed up to {max(adjusted):.3g} of a step's rewards)"
    shares = ", ".join(
        f"{name} {_mean(rows, f'length_penalty/pct_{key}'):.3g}"
        for name, key in (("all-wrong", "all_wrong"), ("all-correct", "all_correct"), ("mixed", "mixed"))
    )
    return (
        f"group shaping: never acted: no reward changed at any step (groups, mean share: {shares}; non-binary "
        f"{_mean(rows, 'length_penalty/skipped_non_binary_frac'):.3g}); groups whose rollouts differ in length, "
        "more rollouts per prompt or a task the model answers some of the time, make it act"
    )


def centering_line(rows: Sequence[dict]) -> str | None:
    """Score centering (docs/reference/score-centering.md §5.1): its correction C is 0 where the sampler agrees
    with the trainer and every ratio p/q is inside the mode's bounds."""
    corrections = _values(rows, "score_centering/correction_abs_mean")
    if not corrections:
        return None
    if max(corrections) > NO_CORRECTION:
        return f"score centering: acted (mean |correction| up to {max(corrections):.3g} a step)"
    return (
        "score centering: never acted: its correction was 0 at every step (the sampler agreed with the trainer, "
        f"rho_mean {_mean(rows, 'score_centering/rho_mean'):.4g}, and every ratio was inside the bounds); it acts "
        "where they disagree: a sampler that lags or is quantized (as in serving), or bounds that cut (a lower "
        "upper bound)"
    )


def acted_lines(rows: Sequence[dict], min_tokens: float = 0.0) -> list[str]:
    """One line per feature the rows log (the coefficient, group shaping, score centering): acted, or never
    acted, why, and what would make it act. ``min_tokens``: the run's ``length_penalty_min_tokens``."""
    lines = (coefficient_line(rows, min_tokens), shaping_line(rows), centering_line(rows))
    return [line for line in lines if line is not None]
