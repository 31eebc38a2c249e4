"""bench/bench_shaping.py (issue 21): its base section runs the given commit's own engine beside this one,
and every part its parts section times runs."""

from __future__ import annotations

import sys

import torch

from bench import bench_shaping as bench


def test_the_base_engine_is_the_commits_own(tmp_path):
    """The commit's package is imported under its own name, so none of its lazy imports (exports,
    validators) reaches this engine's modules, and this engine's stay where they were. HEAD's engine gives
    this tree's numbers (on a clean clone they are the same code; locally an uncommitted change of the
    engine's numbers shows here)."""
    ours = {name: module for name, module in sys.modules.items() if name.startswith("trl_length_plugin.")}
    run, cache = bench.base_engine("HEAD", tmp_path)
    assert cache.__module__.startswith(f"{bench.BASE_PACKAGE}.")
    assert all(sys.modules[name] is module for name, module in ours.items())
    rewards, group_index, reasoning, answer, metadata = bench.make_batch(256, 8)
    for meta in (metadata, None):
        base_advantages, base_keep = run(rewards, group_index, reasoning, answer, meta)
        advantages, keep = bench.engine(rewards, group_index, reasoning, answer, meta)
        assert torch.equal(base_advantages, advantages) and torch.equal(base_keep, keep)


def test_every_part_runs():
    calls = bench.parts(256, 8)
    assert {"the floor", "the whole step, no metadata", "penalties, zmad alone"} <= set(calls)
    for call in calls.values():
        call()
