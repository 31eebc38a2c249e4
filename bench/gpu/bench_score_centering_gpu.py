"""Score centering's trainer-side cost on a GPU (docs/benchmarks.md, "Score centering in TRL", "On a GPU"): the one
prepared script for a lent GPU machine, which has torch and transformers but no TRL, vLLM or network. It
needs only torch, transformers and this checkout (the core imports with torch alone).

1. ``function``: ``policy_logprobs_at_sampler_topk`` at V = 151,936, hidden 896, 4,096 tokens (bf16 inputs),
   forward + backward, at K = 16 and 64 and K = 16 under sampler replay, vs the same chunked function with
   K = 0 (the sampled token only: what TRL's fused head computes) and vs materialized full-vocabulary
   logits (``log_softmax`` and a gather). CUDA-event time (median of ``--repeat``) and peak allocated memory
   above the inputs.
2. ``logits``: ``logprobs_at_ids``, verl's path (its actor hands over the ``[tokens, V]`` logits), at the same
   V and tokens on bf16 logits, forward + backward (the gradient written into the logits, as verl's own
   log-softmax does), K = 16 and K = 0, vs a materialized fp32 ``log_softmax`` and gather of the sampled
   token (torch's path; verl's flash-attn cross-entropy is not on the machine).
3. ``model``: a training step's loss side on a random-weight model of Qwen2.5-0.5B's config (24 layers,
   hidden 896, V = 151,936, bf16): backbone forward, the head, a policy-gradient loss (plus ``A * C`` from
   ``compute_score_centering_term`` with score centering), backward and an AdamW step, for 8 rows x 1,024
   tokens (768 completion). The trainer's steps without TRL or vLLM on the machine: the sampler heads are
   drawn from the model's own distribution with a perturbation, as a bf16 engine would give them.

    python -m bench.gpu.bench_score_centering_gpu [--sections function,logits,model] [--repeat 10]
    python -m bench.gpu.bench_score_centering_gpu --smoke   # tiny sizes on CPU: checks the script runs

Prints ``case | measured | baseline | ratio`` lines and writes them as JSON to ``$OUT/score_centering_gpu.json``
when ``OUT`` is set. Under 3 minutes on an H200.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Callable

import torch

from bench._harness import header, report
from trl_length_plugin.score_centering.estimator import compute_score_centering_term
from trl_length_plugin.score_centering.topk_logprobs import logprobs_at_ids, policy_logprobs_at_sampler_topk

FULL = dict(vocab=151_936, hidden=896, tokens=4096, rows=8, length=1024, completion=768, layers=24)
SMOKE = dict(vocab=2048, hidden=64, tokens=256, rows=2, length=48, completion=32, layers=2)
RESULTS: list[dict] = []


def record(case: str, measured: float, baseline: float, unit: str) -> None:
    if measured != measured:  # memory on CPU (smoke runs): not measured
        return
    RESULTS.append({"case": case, "measured": measured, "baseline": baseline, "unit": unit})
    report(case, measured, baseline, unit)


class Meter:
    """Median time (CUDA events on a GPU, wall clock on CPU) and peak allocated memory above the start."""

    def __init__(self, device: torch.device, repeat: int):
        self.device, self.repeat = device, repeat

    def __call__(self, step: Callable[[], None]) -> tuple[float, float]:
        step()  # warm-up: kernels, allocator
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start_bytes = torch.cuda.memory_allocated()
        times = []
        for _ in range(self.repeat):
            if cuda:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                step()
                end.record()
                torch.cuda.synchronize()
                times.append(begin.elapsed_time(end))
            else:
                started = time.perf_counter()
                step()
                times.append(1e3 * (time.perf_counter() - started))
        peak = (torch.cuda.max_memory_allocated() - start_bytes) / 2**20 if cuda else math.nan
        return statistics.median(times), peak


def sampler_heads(logits: torch.Tensor, k: int, replay_keep: int | None = None):
    """A bf16 engine's head: the top-k of slightly perturbed logits, processed logprobs at those ids (under
    replay: renormalized over the kept ``replay_keep`` ids, the rest -inf)."""
    noisy = logits.float() + 0.05 * torch.randn_like(logits, dtype=torch.float32)
    values, ids = noisy.topk(k, dim=-1)
    if replay_keep is None:
        logprobs = values - noisy.logsumexp(-1, keepdim=True)
    else:
        kept = values[..., :replay_keep]
        logprobs = torch.full_like(values, -torch.inf)
        logprobs[..., :replay_keep] = kept - kept.logsumexp(-1, keepdim=True)
    return ids, logprobs


def function_section(sizes: dict, device: torch.device, meter: Meter) -> None:
    torch.manual_seed(0)
    tokens, hidden_size, vocab = sizes["tokens"], sizes["hidden"], sizes["vocab"]
    hidden = torch.randn(tokens, hidden_size, device=device, dtype=torch.bfloat16, requires_grad=True)
    weight = (0.02 * torch.randn(vocab, hidden_size, device=device)).to(torch.bfloat16).requires_grad_(True)
    with torch.no_grad():
        logits = hidden @ weight.T
    sampled = torch.distributions.Categorical(logits=logits.float()).sample()
    heads = {k: sampler_heads(logits, k) for k in (16, 64)}
    replay = sampler_heads(logits, 16, replay_keep=8)
    del logits

    def chunked(ids, logprobs=None, is_replay=False):
        def step():
            out = policy_logprobs_at_sampler_topk(
                hidden, weight, sampled_ids=sampled, sampler_topk_ids=ids,
                sampler_topk_logprobs=logprobs, sampler_replay=is_replay,
            )  # fmt: skip
            loss = out.sampled.sum() + torch.where(out.topk.isfinite(), out.topk, 0.0).sum()
            loss.backward()
            hidden.grad = weight.grad = None

        return step

    def full_logits():
        ids = heads[16][0]
        logprobs = (hidden @ weight.T).float().log_softmax(-1)
        loss = logprobs.gather(-1, sampled[:, None]).sum() + logprobs.gather(-1, ids).sum()
        loss.backward()
        hidden.grad = weight.grad = None

    base_ms, base_mib = meter(chunked(sampled.new_zeros(tokens, 0)))
    header(f"policy_logprobs_at_sampler_topk, V={vocab} H={hidden_size} N={tokens} bf16 fwd+bwd on {device}")
    print(f"# sampled-token path (K=0): {base_ms:.2f} ms, peak {base_mib:.0f} MiB above the inputs")
    full_ms, full_mib = meter(full_logits)
    record("full-vocabulary logits K=16: time", full_ms, base_ms, "ms")
    record("full-vocabulary logits K=16: peak memory", full_mib, base_mib, "MB")
    for name, (ids, logprobs, is_replay) in {
        "K=16": (*heads[16], False),
        "K=64": (*heads[64], False),
        "K=16 replay": (*replay, True),
    }.items():
        ms, mib = meter(chunked(ids, logprobs, is_replay))
        record(f"top-k {name}: time", ms, base_ms, "ms")
        record(f"top-k {name}: peak memory", mib, base_mib, "MB")


def logits_section(sizes: dict, device: torch.device, meter: Meter) -> None:
    torch.manual_seed(0)
    tokens, vocab = sizes["tokens"], sizes["vocab"]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    source = torch.randn(tokens, vocab, device=device, dtype=dtype).requires_grad_(True)
    sampled = torch.randint(0, vocab, (tokens, 1), device=device)
    heads = torch.cat([sampled, torch.randint(0, vocab, (tokens, 16), device=device)], 1)

    def step(ids, plugin=True):
        def run():
            logits = source * 1.0  # the backbone's output: not a leaf, so the backward may write into it
            if plugin:
                out = logprobs_at_ids(logits, ids, inplace_backward=True)
            else:
                out = logits.float().log_softmax(-1).gather(-1, ids)
            out.sum().backward()
            source.grad = None

        return run

    base_ms, base_mib = meter(step(sampled, plugin=False))
    precision = "bf16" if dtype == torch.bfloat16 else "fp32"
    header(f"logprobs_at_ids (verl's path), V={vocab} N={tokens} {precision} logits, fwd+bwd on {device}")
    print(
        f"# materialized fp32 log_softmax + gather (sampled token): {base_ms:.2f} ms, peak {base_mib:.0f} MiB"
    )
    for name, ids in (("K=0", sampled), ("K=16", heads)):
        ms, mib = meter(step(ids))
        record(f"logprobs_at_ids {name}: time", ms, base_ms, "ms")
        record(f"logprobs_at_ids {name}: peak memory", mib, base_mib, "MB")


def qwen2_05b(sizes: dict):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=sizes["vocab"], hidden_size=sizes["hidden"], intermediate_size=sizes["hidden"] * 5 + 384,
        num_hidden_layers=sizes["layers"], num_attention_heads=14 if sizes["hidden"] == 896 else 4,
        num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1_000_000.0, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def model_section(sizes: dict, device: torch.device, meter: Meter) -> None:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = qwen2_05b(sizes).to(device=device, dtype=dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    rows, length, completion = sizes["rows"], sizes["length"], sizes["completion"]
    input_ids = torch.randint(0, sizes["vocab"], (rows, length), device=device)
    labels = input_ids[:, -completion:]
    advantages = torch.randn(rows, 1, device=device)
    mask = torch.ones(rows, completion, dtype=torch.bool, device=device)
    head = model.get_output_embeddings()
    with torch.no_grad():
        hidden = model.model(input_ids=input_ids).last_hidden_state[:, -completion - 1 : -1]
        ids, sampler_logprobs = sampler_heads(head(hidden), 16)
    del hidden

    def completion_hidden():
        return model.model(input_ids=input_ids).last_hidden_state[:, -completion - 1 : -1]

    def finish(loss):
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def full_logits():
        logprobs = head(completion_hidden()).float().log_softmax(-1)
        finish(-(advantages * logprobs.gather(-1, labels[..., None]).squeeze(-1)).mean())

    def sampled_only():
        out = policy_logprobs_at_sampler_topk(
            completion_hidden(), head.weight, sampled_ids=labels, sampler_topk_ids=labels.new_zeros(rows, completion, 0)
        )  # fmt: skip
        finish(-(advantages * out.sampled).mean())

    def with_score_centering():
        out = policy_logprobs_at_sampler_topk(
            completion_hidden(), head.weight, sampled_ids=labels, sampler_topk_ids=ids,
            sampler_topk_logprobs=sampler_logprobs,
        )  # fmt: skip
        term = compute_score_centering_term(
            out.topk, sampler_topk_logprobs=sampler_logprobs, importance_sampling_mode="tis",
            is_bounds=(0.0, 1.0), token_mask=mask, sampler_replay=False,
        )  # fmt: skip
        finish(-(advantages * out.sampled).mean() + (advantages * term.correction).mean())

    base_ms, base_mib = meter(sampled_only)
    header(
        f"loss side of a step, Qwen2.5-0.5B config ({sizes['layers']} layers, random weights, {dtype}), "
        f"{rows} x {length} tokens, on {device}"
    )
    print(
        f"# sampled-token head: {base_ms:.1f} ms per step, peak {base_mib:.0f} MiB above the model and optimizer"
    )
    for name, step in (
        ("full-vocabulary logits", full_logits),
        ("score centering K=16 (tis)", with_score_centering),
    ):
        ms, mib = meter(step)
        record(f"{name}: step time", ms, base_ms, "ms")
        record(f"{name}: peak memory", mib, base_mib, "MB")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="function,logits,model")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("bench_score_centering_gpu: no CUDA device (use --smoke to check the script on CPU)")
    device = torch.device("cpu" if args.smoke else "cuda")
    sizes, meter = (SMOKE if args.smoke else FULL), Meter(device, 2 if args.smoke else args.repeat)
    if device.type == "cuda":
        print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}")
    sections = args.sections.split(",")
    if "function" in sections:
        function_section(sizes, device, meter)
    if "logits" in sections:
        logits_section(sizes, device, meter)
    if "model" in sections:
        model_section(sizes, device, meter)
    print(f"# {time.perf_counter() - started:.0f} s")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "score_centering_gpu.json"), "w") as out:
            json.dump({"device": str(device), "results": RESULTS}, out, indent=1)


if __name__ == "__main__":
    main()
