"""Per-step cost of LengthPluginGRPOTrainer with every shaping feature on vs TRL's stock GRPOTrainer.

Same config (8 prompts x 8 completions of up to 48 tokens per step), seed and learning rate 0, so both
generate the very same completions every step and differ only by the plugin's work. Per optimizer step
(generation, rewards, advantages, loss, backward): the CPU time of this process (robust when other jobs
share the machine) and the wall time, medians over steps, the two trainers alternating (ABBA) in one run;
plus the CPU time spent in the plugin's own code. Target: at most 5% per step.

    OMP_NUM_THREADS=2 python -m bench.bench_trl_overhead [--steps 12] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")

from bench._harness import header, report  # noqa: E402
from trl_length_plugin.shaping.columns import (  # noqa: E402
    AGENT_COLUMN,
    PROFILE_BAND,
    PROFILED_OUTPUT_LENGTHS,
    PROFILED_REWARDS,
)

WARMUP = 2
EVERYTHING = dict(
    length_penalty={
        "default": {
            "top_percentile": 0.5,
            "total_bonus": 0.05,
            "reasoning_bonus": 0.05,
            "longest_total_penalty": 0.05,
            "group_total_length_penalty_coeff": 0.1,
            "group_reasoning_length_penalty_coeff": 0.1,
            "total_zmad_threshold": 1.0,
            "total_zmad_penalty": 0.05,
            "profiled_length_penalty": 0.05,
            "pass_rate_length_penalty_weight": 0.1,
            "profile_band_total": True,
            "group_length_penalty_profile_gate": True,
        },
        "agent_overrides": {"math": {"length_type": "chars"}, "other": {"answer_bonus": 0.05}},
        "profile_band": {"enabled": True, "defaults": {"reasoning": {"a": 10.0, "b": 30.0, "f": 0.8}}},
    },
    length_penalty_coeff=1.0,
    length_penalty_min_tokens=4,
    drop_zero_std_groups=True,
)


def dataset(rows: int, seed: int):
    from trl_length_plugin.embedded import make_task_dataset

    data = make_task_dataset(rows, seed=seed)
    data = data.add_column(AGENT_COLUMN, ["math" if i % 2 else "other" for i in range(rows)])
    data = data.add_column(PROFILED_REWARDS, [[1, 1, 0, 1]] * rows)
    data = data.add_column(PROFILED_OUTPUT_LENGTHS, [[20, 24, 40, 22]] * rows)
    return data.add_column(PROFILE_BAND, [{"total": {"a": 18.0, "b": 40.0, "f": 0.7}}] * rows)


class StepClock:
    """CPU and wall time of each optimizer step, from ``on_step_begin`` to ``on_step_end``."""

    def __init__(self):
        from transformers import TrainerCallback

        clock = self
        self.cpu: list[float] = []
        self.wall: list[float] = []

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                clock.started = (time.process_time(), time.perf_counter())

            def on_step_end(self, args, state, control, **kwargs):
                clock.cpu.append(time.process_time() - clock.started[0])
                clock.wall.append(time.perf_counter() - clock.started[1])

        self.callback = Callback()


def timed_plugin(own: dict[int, float]) -> type:
    """The plugin trainer adding the CPU time of its own work (shaping the gathered batch, and writing the
    result into TRL's batch) to ``own[global_step]``."""
    from trl_length_plugin.trl_integration import LengthPluginGRPOTrainer

    def timed(method):
        def wrapper(self, *args, **kwargs):
            start = time.process_time()
            result = method(self, *args, **kwargs)
            own[self.state.global_step] = own.get(self.state.global_step, 0.0) + time.process_time() - start
            return result

        return wrapper

    class TimedPlugin(LengthPluginGRPOTrainer):
        _shape = timed(LengthPluginGRPOTrainer._shape)
        _apply = timed(LengthPluginGRPOTrainer._apply)

    return TimedPlugin


def run(plugin: bool, steps: int, seed: int, output_dir: str) -> tuple[StepClock, list[float]]:
    """The step clock and, for the plugin, the CPU time of its own code per step."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_length_plugin.embedded import (
        CPU_RUN_ARGS,
        correctness_reward,
        embedded_model_dir,
        load_tokenizer,
    )
    from trl_length_plugin.trl_integration import LengthPluginGRPOConfig

    model_dir = embedded_model_dir()
    common = dict(
        output_dir=output_dir,
        learning_rate=0.0,
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=48,
        max_steps=steps,
        seed=seed,
        **CPU_RUN_ARGS,
    )
    own: dict[int, float] = {}
    if plugin:
        cls, args = timed_plugin(own), LengthPluginGRPOConfig(**common, **EVERYTHING)
    else:
        cls, args = GRPOTrainer, GRPOConfig(**common)
    clock = StepClock()
    trainer = cls(
        model=str(model_dir),
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=dataset(8 * steps, seed),
        processing_class=load_tokenizer(model_dir),
        callbacks=[clock.callback],
    )
    trainer.train()
    return clock, [own[step] for step in sorted(own)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=1, help="ABBA rounds")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    cpu = {False: [], True: []}
    wall = {False: [], True: []}
    own: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        run(False, 3, args.seed, tmp)  # warm-up: the first steps of a process are several times slower
        for plugin in [False, True, True, False] * args.rounds:  # ABBA order cancels drift in machine load
            clock, hooks = run(plugin, args.steps, args.seed, tmp)
            cpu[plugin] += clock.cpu[WARMUP:]  # a trainer's first steps are slower
            wall[plugin] += clock.wall[WARMUP:]
            own += hooks[WARMUP:]
    median = statistics.median
    header(
        f"TRL plugin trainer (every feature) vs stock GRPOTrainer, medians over {len(cpu[False])} steps each"
    )
    report("CPU time per step, plugin vs stock", 1e3 * median(cpu[True]), 1e3 * median(cpu[False]), "ms")
    report("wall time per step, plugin vs stock", 1e3 * median(wall[True]), 1e3 * median(wall[False]), "ms")
    report("plugin's own CPU time per step vs stock step", 1e3 * median(own), 1e3 * median(cpu[False]), "ms")
    print(f"# {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
