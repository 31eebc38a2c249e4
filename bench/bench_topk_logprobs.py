"""Trainer-side top-k logprobs vs the sampled-token path: extra peak memory and time (issue 7, docs/reference/score-centering.md §5.4).

Vocabulary 151,936, hidden 896, 4,096 tokens, fp32, forward + backward (gradients to hidden states and
weight). Measured: ``policy_logprobs_at_sampler_topk`` with K = 16, 64, 256 head ids. Baseline: the same
chunked path with K = 0, i.e. the sampled token's logprob only (TRL's fused chunked logprob computes the same
thing with the same tiling idea; ``--with-trl`` adds TRL's ``ChunkedLogProbFunction`` as a reference line).

Memory method: every case runs in a fresh subprocess (glibc ``MALLOC_MMAP_THRESHOLD_=65536`` so freed tiles
go back to the OS at once). After the inputs are built, the peak-RSS counter is reset (``/proc/self/clear_refs``
= 5) and the current RSS recorded; after one forward + backward, the peak (``VmHWM``) minus that RSS is the
step's peak memory: workspace, saved tensors, outputs and the fp32 gradient buffers, all torch allocations
included (tracemalloc cannot see them). Extra memory = topk peak - sampled-token peak, compared with what a
full-vocabulary ``log_softmax`` gather needs at the least: the fp32 ``[tokens, vocab]`` logits alone
(``tokens * vocab * 4`` bytes; the log_softmax output and its gradient double or triple that).
Time: process CPU time (all threads) of the same forward + backward, which a busy shared machine disturbs
far less than wall time (printed too); one run per case at this size, ``--repeat`` for more.

Run: ``OMP_NUM_THREADS=2 .venv/bin/python -m bench.bench_topk_logprobs`` (about 1 minute per case on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from bench._harness import header, peak_since, report, reset_peak

VOCAB, HIDDEN, TOKENS = 151936, 896, 4096


def _step(case: str, k: int, hidden, weight, ids):
    from trl_length_plugin.score_centering.topk_logprobs import policy_logprobs_at_sampler_topk

    if case == "trl":
        from trl.kernels.chunked_logprob import ChunkedLogProbFunction

        logprobs, *_ = ChunkedLogProbFunction.apply(
            hidden, weight, None, ids[:, 0], 1.0, 32768, None, 1.0, ()
        )
        logprobs.sum().backward()
        return
    out = policy_logprobs_at_sampler_topk(
        hidden, weight, sampled_ids=ids[:, 0], sampler_topk_ids=ids[:, 1 : k + 1]
    )
    (out.sampled.sum() + out.topk.sum()).backward()


def child(case: str, k: int, repeat: int, tokens: int, vocab: int) -> None:
    torch.manual_seed(0)
    hidden = torch.randn(tokens, HIDDEN, requires_grad=True)
    weight = (torch.randn(vocab, HIDDEN) * 0.02).requires_grad_(True)
    ids = torch.stack([torch.randperm(vocab)[: k + 1] for _ in range(tokens)])
    hidden.grad, weight.grad = (
        torch.zeros_like(hidden),
        torch.zeros_like(weight),
    )  # gradient buffers exist in training
    before = reset_peak()
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        _step(case, k, hidden, weight, ids)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    peak = peak_since(before)
    print(
        json.dumps(
            {"peak_bytes": peak, "seconds": statistics.median(wall), "cpu_seconds": statistics.median(cpu)}
        )
    )


def run_case(case: str, k: int, args: argparse.Namespace) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    command = [sys.executable, "-m", "bench.bench_topk_logprobs", "--child", case, "--k", str(k)]
    command += ["--repeat", str(args.repeat), "--tokens", str(args.tokens), "--vocab", str(args.vocab)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=["topk", "trl"])
    parser.add_argument("--k", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--candidates", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--with-trl", action="store_true")
    parser.add_argument("--tokens", type=int, default=TOKENS, help="smaller only for a smoke run")
    parser.add_argument("--vocab", type=int, default=VOCAB, help="smaller only for a smoke run")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.k, args.repeat, args.tokens, args.vocab)
        return

    mib = 2**20
    full_vocabulary_logits = args.tokens * args.vocab * 4
    header(
        f"top-k logprobs, V={args.vocab} H={HIDDEN} N={args.tokens} fp32 fwd+bwd, {torch.get_num_threads()} threads "
        f"(baseline: sampled-token chunked path)"
    )
    sampled = run_case("topk", 0, args)
    print(
        f"# sampled-token path: peak {sampled['peak_bytes'] / mib:.0f} MiB, "
        f"{sampled['cpu_seconds']:.1f} s CPU, {sampled['seconds']:.1f} s wall"
    )
    print(
        f"# full-vocabulary log_softmax gather needs >= {full_vocabulary_logits / mib:.0f} MiB (fp32 logits)"
    )
    if args.with_trl:
        trl = run_case("trl", 0, args)
        report("trl ChunkedLogProbFunction CPU time", trl["cpu_seconds"], sampled["cpu_seconds"], "s")
        report("trl ChunkedLogProbFunction peak", trl["peak_bytes"] / mib, sampled["peak_bytes"] / mib, "MB")
    verdicts = []
    for k in args.candidates:
        topk = run_case("topk", k, args)
        extra = topk["peak_bytes"] - sampled["peak_bytes"]
        memory_ratio = report(
            f"K={k} extra peak vs full-vocab logits", extra / mib, full_vocabulary_logits / mib, "MB"
        )
        time_ratio = report(
            f"K={k} CPU time vs sampled-token path", topk["cpu_seconds"], sampled["cpu_seconds"], "s"
        )
        report(f"K={k} wall time vs sampled-token path", topk["seconds"], sampled["seconds"], "s")
        verdicts.append(memory_ratio <= 0.10 and time_ratio <= 1.5)
    print(f"# targets (extra memory <= 0.10, time <= 1.5x): {'PASS' if all(verdicts) else 'FAIL'}")


if __name__ == "__main__":
    main()
