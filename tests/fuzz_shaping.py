"""Fuzzing run of the length shaping: arbitrary per-prompt metadata objects and arbitrary configs.

Every metadata object goes through the engine and through the float64 loop reference
(``tests/shaping_reference.py``) on a random batch: no exception, the same rewards and metrics (the
invalid-metadata fraction counts what was ignored). Every config (valid keys with arbitrary values,
unknown keys, nested garbage) is either refused with ``LengthConfigError`` (one line naming a key) or
accepted, and an accepted one shapes a random batch exactly as the reference does. Any other outcome is a
failure and stops the run.

    python tests/fuzz_shaping.py --metadata 10000 --configs 1000

(Run as a script: verl and TransferQueue install a top-level ``tests`` package that shadows this folder.)
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trl_length_plugin.shaping import LengthConfigError, RolloutBatch, load_shaping_config, shape_rollouts
from trl_length_plugin.shaping.normalization import TRL_NORMALIZATION

sys.path.insert(0, str(Path(__file__).parent))
from shaping_reference import reference_coefficient, reference_penalties  # noqa: E402
from shaping_strategies import PARAMS, config_dict, shaping_batch, wild_metadata_entry  # noqa: E402

RUN = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))
TOLERANCE = 1e-9


def close(actual: list[float], expected: list[float]) -> bool:
    return len(actual) == len(expected) and all(
        (math.isnan(a) and math.isnan(e)) or abs(a - e) <= TOLERANCE
        for a, e in zip(actual, expected, strict=True)
    )


def check_penalties(batch, config, entries=None) -> dict:
    """Engine vs reference on one batch; returns the engine's metrics. ``entries`` replace the metadata."""
    rewards, group_index, reasoning, answer, agents, metadata, multi = batch
    if entries is not None:
        per_group = {key: entries[i % len(entries)] for i, key in enumerate(dict.fromkeys(group_index))}
        metadata = [per_group[key] for key in group_index]
    rollouts = RolloutBatch(
        rewards, group_index, reasoning, answer, agents, metadata, multi, loss_lengths=answer
    )
    result = shape_rollouts(rollouts, config, TRL_NORMALIZATION)
    shaped = rollouts.rewards.double().tolist()
    metrics = {}
    if config.penalties_on:
        shaped, metrics, _ = reference_penalties(
            rewards, group_index, reasoning, answer, config.penalties, agents, metadata, multi
        )
    if config.coefficient_on:
        binary = {}
        for key, reward, flag in zip(group_index, rewards, multi or [False] * len(rewards), strict=True):
            ok = not math.isnan(reward) and min(abs(reward), abs(reward - 1)) <= 1e-6 and not flag
            binary[key] = binary.get(key, True) and ok
        truth = [r if binary[key] else math.nan for r, key in zip(rewards, group_index, strict=True)]
        shaped, _ = reference_coefficient(
            shaped, answer, group_index, config.length_penalty_coeff, config.length_penalty_min_tokens, truth
        )
    if not close(result.rewards.tolist(), shaped):
        raise AssertionError(f"rewards differ from the reference: {result.rewards.tolist()} vs {shaped}")
    for key, value in metrics.items():
        if not close([result.metrics[key]], [value]):
            raise AssertionError(f"{key} = {result.metrics[key]}, reference {value}")
    return result.metrics


def fuzz_metadata(objects: int) -> Counter:
    counts = Counter()

    @RUN
    @given(
        batch=shaping_batch(shared_metadata=True),
        config=config_dict(),
        entries=st.lists(wild_metadata_entry(), min_size=1, max_size=8),
    )
    def run(batch, config, entries):
        config["default"].update(profiled_length_penalty=0.2, profile_band_total=True, enabled=True)
        metrics = check_penalties(batch, load_shaping_config({"length_penalty": config}), entries)
        counts["objects"] += len(entries)
        counts["batches"] += 1
        counts["batches with ignored metadata"] += metrics["length_penalty/invalid_metadata_frac"] > 0

    while counts["objects"] < objects:
        run()
    return counts


_garbage = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)  # fmt: skip
_params = st.dictionaries(
    st.one_of(st.sampled_from(sorted(PARAMS)), st.text(max_size=6)),
    st.one_of(_garbage, *PARAMS.values()),
    max_size=6,
)
_raw_config = st.fixed_dictionaries(
    {},
    optional={
        "length_penalty": st.one_of(_garbage, st.fixed_dictionaries({"default": _params})),
        "length_penalty_coeff": st.one_of(_garbage, st.sampled_from([0.0, 0.5, 2.0])),
        "length_penalty_min_tokens": st.one_of(_garbage, st.sampled_from([0, 4])),
        "length_penalty_coeff_warmup_steps": st.one_of(_garbage, st.sampled_from([0, 3])),
        "drop_zero_std_groups": st.one_of(_garbage, st.booleans()),
        "reasoning_tags": st.one_of(_garbage, st.just(["<r>", "</r>"])),
        "unknown_key": _garbage,
    },
)


def fuzz_configs(configs: int) -> Counter:
    counts = Counter()

    @RUN
    @given(raw=_raw_config, batch=shaping_batch())
    def run(raw, batch):
        try:
            config = load_shaping_config(raw)
        except LengthConfigError as err:
            if "\n" in str(err) or ":" not in str(err):
                raise AssertionError(f"not a one-line error naming a key: {err!r}") from None
            counts["refused"] += 1
        else:
            check_penalties(batch, config)
            counts["accepted and matched the reference"] += 1
        counts["configs"] += 1

    while counts["configs"] < configs:
        run()
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metadata", type=int, default=10_000, help="metadata objects to feed")
    parser.add_argument("--configs", type=int, default=1_000, help="configs to feed")
    args = parser.parse_args()
    logging.getLogger("trl_length_plugin").setLevel(logging.ERROR)
    print("metadata:", dict(fuzz_metadata(args.metadata)))
    print("configs:", dict(fuzz_configs(args.configs)))


if __name__ == "__main__":
    main()
