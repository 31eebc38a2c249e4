"""Flat extraction of the sampler head vs the per-position Python walk (issue 7, docs/reference/score-centering.md §5.2).

T = 32,768 generated positions, K = 128 candidates, built with vLLM's own
``append_logprobs_for_next_position`` (the engine's code path). Measured: the vectorized extractor on
``FlatLogprobs``. Baselines, every check included and identical tensors returned:

* walk: the same ``FlatLogprobs`` read one position at a time (``flat[t]`` -> dict), then the per-position
  extractor: what extraction costs without the flat path;
* walk (dicts ready): the per-position extractor on vLLM's default ``list[dict]`` layout, whose dicts the
  engine already paid for while generating (a lower bound of the walk).

Run: ``OMP_NUM_THREADS=2 .venv/bin/python -m bench.bench_vllm_extraction``
"""

from __future__ import annotations

import argparse
import copy

import numpy as np
import torch
from vllm.logprobs import append_logprobs_for_next_position, create_sample_logprobs
from vllm.outputs import CompletionOutput

from bench._harness import header, report, timeit
from trl_length_plugin.score_centering.capture import (
    extract_flat_score_centering_samples,
    extract_sampled_token_logprobs,
    extract_score_centering_samples,
)


def build_output(positions: int, k: int, vocab: int, flat: bool, seed: int = 0) -> CompletionOutput:
    rng = np.random.default_rng(seed)
    container = create_sample_logprobs(flat)
    sampled_ids = []
    for _ in range(positions):
        head = rng.choice(vocab, size=k + 1, replace=False)
        logprobs = np.sort(rng.uniform(-30.0, -1.0, size=k + 1))[::-1] - np.log(k + 1)
        sampled, rank = (int(head[-1]), k + 1) if rng.random() < 0.3 else (int(head[0]), 1)
        append_logprobs_for_next_position(
            container,
            [sampled, *head[:k].tolist()],
            [float(logprobs[rank - 1]), *logprobs[:k].tolist()],
            [None] * (k + 1),
            rank,
            k,
        )
        sampled_ids.append(sampled)
    return CompletionOutput(
        index=0, text="", token_ids=sampled_ids, cumulative_logprob=None, logprobs=container
    )


class _PositionWalk:
    """A FlatLogprobs read position by position, as a plain sequence (the extractor then walks it)."""

    def __init__(self, flat):
        self.flat = flat

    def __len__(self) -> int:
        return len(self.flat)

    def __iter__(self):
        return (self.flat[t] for t in range(len(self.flat)))


def walk_flat(output: CompletionOutput, k: int):
    walked = copy.copy(output)
    walked.logprobs = _PositionWalk(output.logprobs)
    return extract_score_centering_samples(walked, k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=32768)
    parser.add_argument("--candidates", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    t, k = args.positions, args.candidates
    plain = build_output(t, k, vocab=151936, flat=False)
    flat = build_output(t, k, vocab=151936, flat=True)
    for a, b in zip(
        extract_score_centering_samples(plain, k), extract_flat_score_centering_samples(flat, k), strict=True
    ):
        assert torch.equal(a, b)
    assert torch.equal(extract_sampled_token_logprobs(plain), extract_sampled_token_logprobs(flat))

    for a, b in zip(walk_flat(flat, k), extract_flat_score_centering_samples(flat, k), strict=True):
        assert torch.equal(a, b)

    header(f"vLLM head extraction, T={t}, K={k} (flat numpy vs per-position walk, same checks)")
    vectorized = timeit(lambda: extract_flat_score_centering_samples(flat, k), repeat=args.repeat, warmup=1)
    walk = timeit(lambda: walk_flat(flat, k), repeat=args.repeat, warmup=0)
    speedup = walk / vectorized
    report(f"extract head flat vs walk T={t} K={k}", vectorized * 1e3, walk * 1e3, "ms")
    walk_dicts = timeit(lambda: extract_score_centering_samples(plain, k), repeat=args.repeat, warmup=0)
    report(f"extract head flat vs walk (dicts ready) T={t} K={k}", vectorized * 1e3, walk_dicts * 1e3, "ms")
    walk_sampled = timeit(lambda: extract_sampled_token_logprobs(plain), repeat=args.repeat, warmup=0)
    flat_sampled = timeit(lambda: extract_sampled_token_logprobs(flat), repeat=args.repeat, warmup=1)
    report(f"sampled logprob by id flat vs walk T={t}", flat_sampled * 1e3, walk_sampled * 1e3, "ms")
    print(f"# head extraction speed-up {speedup:.1f}x (target >= 10x): {'PASS' if speedup >= 10 else 'FAIL'}")


if __name__ == "__main__":
    main()
