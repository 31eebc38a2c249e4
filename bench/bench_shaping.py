"""The length-shaping step (``shape_rollouts``) against three baselines measured in the same run.

Every group algorithm and the length coefficient are on at once (bonus, longest, group-relative with the
profile gate, zMAD on all channels, profiled length, pass rate, profile bands from global defaults and
per-prompt metadata), with the §3.3 advantages and keep mask (docs/reference/length-penalties.md §2,
docs/reference/length-coefficient.md §3). Integer lengths, groups of 8 and 16. Medians of 21 calls.

1. ``reference``: the step vs ``tests/shaping_reference.py`` (the per-group loop of the tests) on the same
   batch, with per-prompt metadata converted from Python objects inside the timed call, and with global
   bands only. For the largest batch the reference runs on a 65,536-row sub-batch and is scaled
   linearly, which the case name says ("ref 65536 rows x8").
2. ``metadata``: steady state with per-prompt metadata parsed once (a warm ``MetadataCache``, as the
   trainers hold it) vs the same batch without metadata (target: at most 1.3x).
3. ``threads``: the step at torch's default thread count vs one thread, while ``--busy`` processes spin on
   the other cores (a trainer's machine is busy; target: at most 1.5x).
4. ``base``: the step vs the same step of the engine at ``--base`` (a commit of this repository, extracted
   with ``git archive`` into a temporary folder and imported beside this one), calls alternated one by one,
   with metadata in the call, with a warm ``MetadataCache`` and without metadata (target of issue 21 against
   64b9fae: at most 0.5x with metadata, at most 1.0x without); and beside them the ``floor``, the few passes
   any implementation needs (rewards, lengths and group ids read once, one segmented reduction, the outputs
   written), called in the same turns, as the step / floor ratio (target: within 10x). Times are CPU times of
   this one-thread process, so other processes on a shared machine do not count.
5. ``parts``: each part of the step as the step calls it (the batch and its layout, the metadata parsing,
   the classification, the penalties with every term and with each term alone, the coefficient, the
   advantages with the keep mask), alternated with the floor: where the time goes.

The allocator's state decides whether the engine's temporaries are page-faulted in afresh on every
call, so ``--allocator`` sets it: ``warm`` (default) as a trainer process has it, after one freed 16 MB
buffer (``warm_allocator``); ``trl`` after two real GRPO steps of ``LengthPluginGRPOTrainer`` on the
embedded model (needs the ``trl`` extra), the state ``warm`` stands for; ``cold`` in an otherwise
empty process.

    python -m bench.bench_shaping [--sections reference,metadata,threads,base,parts] [--threads 1]
        [--sizes 8192,65536,524288] [--allocator warm|trl|cold] [--busy 2] [--base 64b9fae]
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import multiprocessing
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch

from bench._harness import header, report, timeit
from trl_length_plugin.shaping import (
    TRL_NORMALIZATION,
    LengthShapingConfig,
    MetadataCache,
    RolloutBatch,
    shape_rollouts,
)
from trl_length_plugin.shaping.columns import PROFILE_BAND, PROFILED_OUTPUT_LENGTHS, PROFILED_REWARDS

REFERENCE_ROWS = 65_536
BASE_PACKAGE = "trl_length_plugin_base"
CONFIG = {
    "default": {
        **{f"{c}_bonus": 0.05 for c in ("reasoning", "answer", "total")},
        **{f"longest_{c}_penalty": 0.05 for c in ("reasoning", "answer", "total")},
        **{f"group_{c}_length_penalty_coeff": 0.1 for c in ("reasoning", "answer", "total")},
        **{f"{c}_zmad_threshold": 2.0 for c in ("reasoning", "answer", "total")},
        **{f"{c}_zmad_penalty": 0.1 for c in ("reasoning", "answer", "total")},
        "profiled_length_penalty": 0.1,
        "pass_rate_length_penalty_weight": 0.2,
        "group_length_penalty_profile_gate": True,
    },
    "profile_band": {
        "enabled": True,
        "defaults": {
            "total": {"a": 1500, "b": 4000, "f": 0.8},
            "reasoning": {"a": 1200, "b": 3500, "f": 0.8},
            "answer": {"a": 200, "b": 500, "f": 0.9},
        },
    },
}
COEFF = 1.0
SHAPING = LengthShapingConfig(length_penalty=CONFIG, length_penalty_coeff=COEFF, drop_zero_std_groups=True)


def warm_allocator() -> None:
    """Leave glibc's allocator as a trainer process has it: once a freed buffer of a few MB (a weight
    loaded on CPU, a batch of token ids) has raised its dynamic mmap and trim thresholds, the engine's
    temporaries are reused from the heap. In an otherwise empty process they are handed back to the OS
    after every call and page-faulted in again (thousands of faults per call at 65,536 rows)."""
    torch.empty(2**21, dtype=torch.float64)  # 16 MB: mmapped, freed at once


def trl_steps() -> None:
    """Two real GRPO steps with length shaping on the embedded model (``bench_trl_effect.train``), in
    this process."""
    from bench.bench_trl_effect import train

    with tempfile.TemporaryDirectory() as output_dir:
        train(shaping=True, steps=2, seed=0, output_dir=output_dir)


def load_reference():
    """``tests/shaping_reference.py`` by path (a ``tests`` package of verl shadows the repository's)."""
    path = Path(__file__).resolve().parents[1] / "tests" / "shaping_reference.py"
    spec = importlib.util.spec_from_file_location("shaping_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_batch(rows: int, group_size: int, seed: int = 0):
    """Binary rewards, integer lengths, per-prompt metadata shared by the rows of a group."""
    generator = torch.Generator().manual_seed(seed)
    groups = rows // group_size
    rewards = (torch.rand(rows, generator=generator) < 0.6).double()
    reasoning = torch.randint(0, 4000, (rows,), generator=generator)
    answer = torch.randint(0, 500, (rows,), generator=generator)
    group_index = torch.arange(rows) // group_size
    profiled = torch.randint(500, 4000, (groups, 8), generator=generator).tolist()
    passed = (torch.rand(groups, 8, generator=generator) < 0.7).long().tolist()
    per_group = [
        {
            PROFILED_REWARDS: passed[g],
            PROFILED_OUTPUT_LENGTHS: profiled[g],
            PROFILE_BAND: {"total": {"a": 1000 + g % 700, "b": 3000 + g % 900, "f": 0.85}},
        }
        for g in range(groups)
    ]
    metadata = [per_group[g] for g in group_index.tolist()]
    return rewards, group_index, reasoning, answer, metadata


def engine(rewards, group_index, reasoning, answer, metadata):
    """One shaping step, as a trainer runs it (the coefficient's L is the total length here)."""
    batch = RolloutBatch(
        rewards, group_index, reasoning, answer, metadata=metadata, loss_lengths=reasoning + answer
    )
    result = shape_rollouts(batch, SHAPING, TRL_NORMALIZATION)
    return result.advantages, result.keep


def reference(ref, config, rewards, group_index, reasoning, answer, metadata):
    shaped, _, _ = ref.reference_penalties(rewards, group_index, reasoning, answer, config, None, metadata)
    total = [r + a for r, a in zip(reasoning, answer, strict=True)]
    final, _ = ref.reference_coefficient(shaped, total, group_index, COEFF, 0, rewards)
    return ref.reference_advantages(final, rewards, group_index), ref.reference_keep(
        final, rewards, group_index
    )


def step(data: tuple, metadata=lambda: None):
    """A shaping step on ``data`` (rewards, groups, reasoning, answer) with ``metadata()`` each call."""
    return lambda: engine(*data, metadata())


def cached_metadata(metadata: list, group_size: int, cache_class=MetadataCache):
    """Per-group parsed metadata from a warm ``cache_class`` (an engine's ``MetadataCache``) keyed by prompt,
    as the trainers look it up (one key per group)."""
    cache = cache_class()
    keys = list(range(len(metadata) // group_size))
    cache.lookup(keys, lambda new: [metadata[key * group_size] for key in new])  # first sight: parsed
    return lambda: cache.lookup(keys, lambda new: [metadata[key * group_size] for key in new])


@contextmanager
def busy(processes: int):
    """``processes`` spinning processes (a busy machine) for the duration of the block."""
    workers = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(processes)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        for worker in workers:
            worker.terminate()


def _spin() -> None:
    while True:
        pass


def reference_section(sizes: list[int]) -> None:
    ref = load_reference()
    config = SHAPING.length_penalty
    header("shaping step vs per-group reference (all algorithms + coefficient + advantages + filter)")
    for rows in sizes:
        for group_size in (8, 16):
            rewards, group_index, reasoning, answer, metadata = make_batch(rows, group_size)
            for label, meta in (("per-prompt metadata", metadata), ("global bands only", None)):
                data = (rewards, group_index, reasoning, answer, meta)
                measured = timeit(lambda data=data: engine(*data), repeat=21, warmup=1)
                sub_rows = min(rows, REFERENCE_ROWS)
                sub = (
                    rewards[:sub_rows].tolist(),
                    group_index[:sub_rows].tolist(),
                    reasoning[:sub_rows].tolist(),
                    answer[:sub_rows].tolist(),
                    None if meta is None else meta[:sub_rows],
                )
                start = time.perf_counter()
                reference(ref, config, *sub)
                baseline = (time.perf_counter() - start) * rows / sub_rows
                scaled = f", ref {sub_rows} rows x{rows // sub_rows}" if sub_rows < rows else ""
                case = f"{rows} rows, groups of {group_size}, {label}{scaled}"
                report(case, measured * 1e3, baseline * 1e3)


def metadata_section(sizes: list[int]) -> None:
    header("metadata parsed once (warm cache, lookup in the timed call) vs no metadata (target <= 1.3)")
    for rows in sizes:
        for group_size in (8, 16):
            *data, metadata = make_batch(rows, group_size)
            with_metadata = timeit(step(data, cached_metadata(metadata, group_size)), 21)
            without = timeit(step(data), 21)
            report(f"{rows} rows, groups of {group_size}", with_metadata * 1e3, without * 1e3)


def threads_section(sizes: list[int], processes: int) -> None:
    default = torch.get_num_threads()
    header(f"{default} torch threads vs 1, {processes} busy process(es) (target <= 1.5)")
    with busy(processes):
        for rows in sizes:
            *data, metadata = make_batch(rows, 8)
            shaping_step = step(data, cached_metadata(metadata, 8))
            times = {default: [], 1: []}
            shaping_step()  # warm-up
            for _ in range(41):  # interleaved calls: drift in the busy processes hits both alike
                for threads in (default, 1):
                    torch.set_num_threads(threads)
                    start = time.perf_counter()
                    shaping_step()
                    times[threads].append(time.perf_counter() - start)
            torch.set_num_threads(default)
            median = statistics.median
            report(f"{rows} rows, groups of 8", median(times[default]) * 1e3, median(times[1]) * 1e3)


def base_engine(commit: str, folder: Path):
    """``engine`` of the package at ``commit`` (``git archive``), imported beside this one as
    ``trl_length_plugin_base``: the extracted package is renamed and its absolute imports rewritten, so its
    lazy imports (exports, validators) resolve to its own modules, never to this engine's."""
    repo = Path(__file__).resolve().parents[1]
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "trl_length_plugin"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    package = folder / BASE_PACKAGE
    (folder / "trl_length_plugin").rename(package)
    for source in package.rglob("*.py"):
        text = source.read_text(encoding="utf-8")
        source.write_text(re.sub(r"\btrl_length_plugin\b", BASE_PACKAGE, text), encoding="utf-8")
    for name in [name for name in sys.modules if name.split(".")[0] == BASE_PACKAGE]:
        del sys.modules[name]  # an earlier call's commit
    sys.path.insert(0, str(folder))
    try:
        base = importlib.import_module(f"{BASE_PACKAGE}.shaping")
    finally:
        sys.path.remove(str(folder))
    config = base.LengthShapingConfig(
        length_penalty=CONFIG, length_penalty_coeff=COEFF, drop_zero_std_groups=True
    )

    def run(rewards, group_index, reasoning, answer, metadata):
        batch = base.RolloutBatch(
            rewards, group_index, reasoning, answer, metadata=metadata, loss_lengths=reasoning + answer
        )
        result = base.shape_rollouts(batch, config, base.TRL_NORMALIZATION)
        return result.advantages, result.keep

    return run, base.MetadataCache


def floor(rewards, group_index, reasoning, answer, group_size):
    """The passes any shaping step needs: rewards, lengths and group ids read once, one segmented reduction
    (each group's reward and length sums), the outputs (one advantage and one keep flag per row) written."""
    lengths = (reasoning + answer).double()
    sums = torch.zeros(rewards.numel() // group_size, 2, dtype=torch.float64)
    sums.index_add_(0, group_index, torch.stack((rewards.double(), lengths), 1))
    means = (sums / group_size)[group_index]
    advantages = rewards - means[:, 0] - 1e-9 * (lengths - means[:, 1])
    return advantages, advantages != 0


def base_section(sizes: list[int], commit: str, calls: int = 21) -> None:
    with tempfile.TemporaryDirectory() as folder:
        base, base_cache = base_engine(commit, Path(folder))
        header(
            f"shaping step: this engine vs {commit}'s, alternated call by call (median CPU time of {calls})"
        )
        floors = []
        for rows in sizes:
            for group_size in (8, 16):
                *data, metadata = make_batch(rows, group_size)
                at_floor = partial(floor, *data, group_size)
                cases = {
                    "metadata in the call": (lambda m=metadata: m, lambda m=metadata: m),
                    "cached metadata": (
                        cached_metadata(metadata, group_size),
                        cached_metadata(metadata, group_size, base_cache),
                    ),
                    "no metadata": (lambda: None, lambda: None),
                }
                for label, (ours_meta, base_meta) in cases.items():
                    timed = alternated(
                        [
                            lambda m=ours_meta, d=data: engine(*d, m()),
                            lambda m=base_meta, d=data: base(*d, m()),
                            at_floor,
                        ],
                        calls,
                    )
                    report(f"{rows} rows, groups of {group_size}, {label}", timed[0] * 1e3, timed[1] * 1e3)
                    if label == "no metadata":
                        floors.append((rows, group_size, timed[0], timed[2]))
        header("shaping step without metadata vs the floor, alternated with it (target: within 10x)")
        for rows, group_size, measured, at_floor in floors:
            report(f"{rows} rows, groups of {group_size}", measured * 1e3, at_floor * 1e3)


def alternated(fns: list, calls: int) -> list[float]:
    """Median CPU seconds of each of ``fns``, called in turn ``calls`` times after one warm-up round (drift
    of the machine hits them alike)."""
    times = [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(calls):
        for fn, own in zip(fns, times, strict=True):
            start = time.process_time()
            fn()
            own.append(time.process_time() - start)
    return [statistics.median(own) for own in times]


def parts(rows: int, group_size: int) -> dict:
    """Each part of the step as the step calls it, on one batch: name -> a call of it. A term alone runs
    with its own keys of ``CONFIG`` (and the band block where it reads bands)."""
    from trl_length_plugin.shaping.coefficient import apply_length_coefficient
    from trl_length_plugin.shaping.correctness import classify_groups
    from trl_length_plugin.shaping.metadata import parse_prompt_metadata
    from trl_length_plugin.shaping.normalization import advantages_and_keep
    from trl_length_plugin.shaping.penalties import apply_length_penalties
    from trl_length_plugin.shaping.terms import terms

    rewards, group_index, reasoning, answer, metadata = make_batch(rows, group_size)
    batch = RolloutBatch(rewards, group_index, reasoning, answer, loss_lengths=reasoning + answer)
    kinds = classify_groups(batch.layout, batch.rewards)
    totals = batch.rewards + 0.1 * batch.total_lengths / 4000
    first_rows = batch.group_rows(metadata)
    calls = {
        "the floor": lambda: floor(rewards, group_index, reasoning, answer, group_size),
        "the whole step, no metadata": lambda: engine(rewards, group_index, reasoning, answer, None),
        "batch and group layout": lambda: (
            RolloutBatch(rewards, group_index, reasoning, answer, loss_lengths=reasoning + answer).layout
        ),
        "metadata parsing (one entry per group)": lambda: parse_prompt_metadata(first_rows),
        "classify groups": lambda: classify_groups(batch.layout, batch.rewards),
        "penalties, every term": lambda: apply_length_penalties(batch, SHAPING.penalties, kinds),
    }
    for term in terms():
        config = {"default": {key: v for key, v in CONFIG["default"].items() if key in term.parameters}}
        if "bands" in term.metadata:
            config["profile_band"] = CONFIG["profile_band"]
        elif not config["default"]:
            continue
        alone = LengthShapingConfig(length_penalty=config).penalties
        calls[f"penalties, {term.name} alone"] = partial(apply_length_penalties, batch, alone, kinds)
    calls["length coefficient"] = lambda: apply_length_coefficient(
        totals, batch.loss_lengths, batch.layout, COEFF, correctness=batch.rewards
    )
    calls["advantages and keep mask"] = lambda: advantages_and_keep(
        totals, batch.rewards, batch.layout, TRL_NORMALIZATION, (~kinds.binary)[batch.layout.gid]
    )
    return calls


def parts_section(sizes: list[int], calls: int = 21) -> None:
    """Each part of the step on its own, alternated with the floor of the same batch."""
    for rows in sizes:
        for group_size in (8, 16):
            header(
                f"{rows} rows, groups of {group_size}: the parts vs the floor (median CPU time of {calls})"
            )
            timed = parts(rows, group_size)
            at_floor = timed.pop("the floor")
            for label, call in timed.items():
                measured, floor_time = alternated([call, at_floor], calls)
                report(label, measured * 1e3, floor_time * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="reference,metadata,threads")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the reference/metadata runs")
    parser.add_argument("--sizes", default="8192,65536,524288")
    parser.add_argument("--allocator", choices=("warm", "trl", "cold"), default="warm")
    parser.add_argument("--busy", type=int, default=2, help="spinning processes of the threads section")
    parser.add_argument("--base", default="64b9fae", help="the commit whose engine the base section runs")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    {"warm": warm_allocator, "trl": trl_steps, "cold": lambda: None}[args.allocator]()
    print(f"# allocator: {args.allocator}; torch default threads: {torch.get_num_threads()}")
    sections = args.sections.split(",")
    if "threads" in sections:
        threads_section([size for size in sizes if size <= 65_536], args.busy)
    torch.set_num_threads(args.threads)
    if "reference" in sections:
        reference_section(sizes)
    if "metadata" in sections:
        metadata_section(sizes)
    if "base" in sections:
        base_section(sizes, args.base)
    if "parts" in sections:
        parts_section(sizes)


if __name__ == "__main__":
    main()
