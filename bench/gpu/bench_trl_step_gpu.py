"""A real ``LengthPluginGRPOTrainer`` training step on a GPU (docs/benchmarks.md, "A TRL training step on a
GPU"): the prepared script for a lent GPU machine, which has torch, transformers, accelerate, peft, pandas
and pyarrow but no TRL, datasets or pydantic, no network, and takes at most 64 MiB of working tree.

It trains the embedded reasoning model (the pinned warm model, bench/warm_models, docs/embedded.md) with TRL's
own generation (no vLLM) in bfloat16 on CUDA:

1. ``check``: group shaping (group-relative scaling and the longest penalty), the length coefficient and LUSPO
   together for a few steps; the plugin's metrics must be logged and finite, the coefficient's value the
   configured one, the loss LUSPO's, the weights bf16 on the GPU and changed by the steps, and on the GPU's
   batch each shaper must have changed some reward.
2. ``timing``: the median step time (generation, rewards, shaping, loss, backward, optimizer; CUDA-synchronized)
   of plain GRPO, each feature on alone (LUSPO against TRL's GSPO, the loss it scales by length) and all three
   together, in one process at learning rate 0 (every arm samples the same completions), so each ratio
   compares steps measured in the same run on the same work.

Preparation, here in the repository root (TRL is pure Python; of what it and the plugin need the machine lacks
TRL, datasets, dill, multiprocess and pydantic; the wheels come to about 5 MB):

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \\
        -d .whl trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 pydantic==2.14.4 \\
        pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5

The run there (carry ``.whl``; datasets needs pyarrow >= 24, which the first line checks):

    python3 -c "import pyarrow, sys; sys.exit(int(pyarrow.__version__.split('.')[0]) < 24)" || exit 3; \\
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \\
        .whl/*.whl && PYTHONPATH=/tmp/site TRL_LENGTH_PLUGIN_CACHE=bench/warm_models PYTHONUNBUFFERED=1 \\
        python3 -m bench.gpu.bench_trl_step_gpu

(exit 3: the machine's pyarrow is older; add ``pyarrow==26.0.1`` to the download, 55 MB.) Locally:

    python -m bench.gpu.bench_trl_step_gpu --smoke   # tiny sizes on CPU, fp32: the suite's dry run

Prints ``case | measured | baseline | ratio`` lines and writes them, with the checked metrics, as JSON to
``$OUT/trl_step_gpu.json`` when ``OUT`` is set. A few minutes on an H100.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time

import torch
from transformers import TrainerCallback

from bench._harness import header, report

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

GPU = dict(prompts=32, generations=8, completion=128, warmup=2, timed=6, check_steps=4)
SMOKE = dict(prompts=2, generations=4, completion=24, warmup=1, timed=1, check_steps=2)
GROUP_SHAPING = {"default": {"group_total_length_penalty_coeff": 0.2, "longest_total_penalty": 0.1}}
COEFF = 0.5
GSPO = dict(importance_sampling_level="sequence", epsilon=2e-3, epsilon_high=2.5e-3)  # LUSPO's clip range
ALL_THREE = {"length_penalty": GROUP_SHAPING, "length_penalty_coeff": COEFF, "luspo": True}
#: name -> (the plugin's and TRL's keys on top of plain GRPO, the arm it is timed against)
VARIANTS = {
    "plain GRPO": ({}, "plain GRPO"),
    "group shaping": ({"length_penalty": GROUP_SHAPING}, "plain GRPO"),
    "length coefficient": ({"length_penalty_coeff": COEFF}, "plain GRPO"),
    "stock GSPO": (GSPO, "plain GRPO"),
    "LUSPO": ({"luspo": True}, "stock GSPO"),  # GSPO's loss scaled by length
    "all three": (ALL_THREE, "plain GRPO"),
}
#: the plugin's metrics the check run must log (docs/reference/length-penalties.md §2.15, length-coefficient.md §3.1)
METRICS = (
    "length_penalty/reward_delta_mean",
    "length_penalty/adjusted_frac",
    "length_penalty/pct_mixed",
    "length_penalty/coeff",
    "length_penalty/coeff_penalized_frac",
    "length_penalty/coeff_reward_reduction_mean",
)
#: on the GPU's batch each shaper must have changed some reward
ACTED = ("length_penalty/adjusted_frac", "length_penalty/coeff_penalized_frac")
RESULTS: list[dict] = []


class StepTimer(TrainerCallback):
    """Times each optimizer step (CUDA-synchronized on a GPU), in ms."""

    def __init__(self, cuda: bool):
        self.cuda, self.times, self._start = cuda, [], 0.0

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = self._now()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(1e3 * (self._now() - self._start))


def train(variant: dict, sizes: dict, steps: int, cuda: bool, output_dir: str, learning_rate: float = 0.0):
    """One ``LengthPluginGRPOTrainer`` run of ``steps`` steps with the keys ``variant``; returns the trainer,
    its step times and its weights' change. Learning rate 0 (the timing runs): every arm samples the same
    completions from the same seed, so step k is the same generation work in each."""
    from trl_length_plugin.embedded import (
        CPU_RUN_ARGS,
        correctness_reward,
        embedded_model_dir,
        load_tokenizer,
    )
    from trl_length_plugin.embedded.reasoning import make_reasoning_dataset
    from trl_length_plugin.trl_integration import LengthPluginGRPOConfig, LengthPluginGRPOTrainer

    model_dir = embedded_model_dir(task="reasoning")
    device_args = (
        dict(bf16=True, model_init_kwargs={"dtype": torch.bfloat16}, logging_steps=1, save_strategy="no",
             report_to="none", disable_tqdm=True)
        if cuda
        else CPU_RUN_ARGS
    )  # fmt: skip
    args = LengthPluginGRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=sizes["prompts"] * sizes["generations"],
        num_generations=sizes["generations"],
        max_completion_length=sizes["completion"],
        max_steps=steps,
        learning_rate=learning_rate,
        seed=0,
        **device_args,
        **variant,
    )
    timer = StepTimer(cuda)
    trainer = LengthPluginGRPOTrainer(
        model=str(model_dir),
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=make_reasoning_dataset(steps * sizes["prompts"]),
        processing_class=load_tokenizer(model_dir),
        callbacks=[timer],
    )
    before = [p.detach().float().clone() for p in trainer.model.parameters()]
    trainer.train()
    change = sum(
        float((p.detach().float() - b).abs().sum())
        for p, b in zip(trainer.model.parameters(), before, strict=True)
    )
    return trainer, timer.times, change


def check(sizes: dict, cuda: bool) -> dict:
    """Group shaping, the coefficient and LUSPO together: the plugin's metrics logged and finite, the
    coefficient as configured, LUSPO's loss, bf16 weights on the GPU (fp32 on CPU), a real update."""
    with tempfile.TemporaryDirectory() as out:
        trainer, _, change = train(ALL_THREE, sizes, sizes["check_steps"], cuda, out, learning_rate=1e-5)
    logged = [entry for entry in trainer.state.log_history if "length_penalty/coeff" in entry]
    problems = []
    if len(logged) != sizes["check_steps"]:
        problems.append(f"{len(logged)} of {sizes['check_steps']} steps logged the plugin's metrics")
    for key in METRICS:
        values = [entry.get(key) for entry in logged]
        if any(value is None or not math.isfinite(value) for value in values):
            problems.append(f"{key}: {values}")
    if any(entry["length_penalty/coeff"] != COEFF for entry in logged):
        problems.append("length_penalty/coeff is not the configured coefficient")
    parameter = next(trainer.model.parameters())
    expected = (torch.bfloat16, "cuda") if cuda else (torch.float32, "cpu")
    if (parameter.dtype, parameter.device.type) != expected:
        problems.append(f"weights are {parameter.dtype} on {parameter.device}, expected {expected}")
    if trainer.loss_type != "luspo":
        problems.append(f"loss_type is {trainer.loss_type!r}, expected 'luspo'")
    if not change > 0:
        problems.append("the steps did not change the weights")
    summary = {key: statistics.fmean(entry[key] for entry in logged) for key in METRICS if logged}
    if cuda and not all(summary.get(key, 0) > 0 for key in ACTED):  # the smoke run's 8 rollouts may not
        problems.append(f"a feature never acted: {', '.join(f'{k}={summary.get(k)}' for k in ACTED)}")
    print(
        f"# check ({sizes['check_steps']} steps, all three on): "
        + ", ".join(f"{k}={v:.4g}" for k, v in summary.items())
    )
    if problems:
        raise SystemExit("check failed: " + "; ".join(problems))
    print("# check: PASS")
    return summary


def timing(sizes: dict, cuda: bool) -> None:
    """The median step time of each arm after the warm-up steps, against its baseline arm in the same run."""
    medians = {}
    for name, (variant, _) in VARIANTS.items():
        with tempfile.TemporaryDirectory() as out:
            _, times, _ = train(variant, sizes, sizes["warmup"] + sizes["timed"], cuda, out)
        medians[name] = statistics.median(times[sizes["warmup"] :])
    rows = sizes["prompts"] * sizes["generations"]
    header(f"LengthPluginGRPOTrainer step, {rows} rollouts of <= {sizes['completion']} tokens, "
           f"median of {sizes['timed']} steps after {sizes['warmup']}, each arm against its baseline")  # fmt: skip
    for name, (_, against) in VARIANTS.items():
        case = f"{name} (vs {against}): step time"
        RESULTS.append({"case": case, "measured": medians[name], "baseline": medians[against], "unit": "ms"})
        report(case, medians[name], medians[against])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes on CPU (fp32): checks the script runs"
    )
    options = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not options.smoke
    if not cuda and not options.smoke:
        raise SystemExit("no CUDA device: run on a GPU, or with --smoke on CPU")
    sizes = SMOKE if options.smoke else GPU
    device = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"# torch {torch.__version__} on {device}")
    summary = check(sizes, cuda)
    timing(sizes, cuda)
    out = os.environ.get("OUT")
    if out:
        payload = {"device": device, "sizes": sizes, "check": summary, "results": RESULTS}
        with open(os.path.join(out, "trl_step_gpu.json"), "w") as sink:
            json.dump(payload, sink, indent=1)


if __name__ == "__main__":
    main()
