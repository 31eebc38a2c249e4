"""The demo: GRPO with TRL on the embedded model and task, without and with length shaping.

Each run prints a compact table under a progress bar; a PNG compares the length and accuracy curves.

Run with ``make demo`` (or ``python -m trl_length_plugin.demo``). No Hub access is needed.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")

ACCURACY_KEY = "rewards/correctness_reward/mean"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="GRPO optimizer steps")
    parser.add_argument("--output-dir", default="outputs/demo", help="where the PNG and logs go")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    return parser.parse_args(argv)


def make_table_callback(total_steps: int):
    """A callback printing one table row per logged step under a progress bar."""
    from tqdm.auto import tqdm
    from transformers import TrainerCallback

    class TableCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.bar = tqdm(total=total_steps, desc="GRPO", unit="step", leave=False)
            self.bar.write(f"{'step':>5} {'mean_len':>9} {'accuracy':>9} {'reward':>8} {'sec':>6}")
            self.start = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "completions/mean_length" not in logs:
                return
            self.bar.write(
                f"{state.global_step:>5} {logs['completions/mean_length']:>9.2f} "
                f"{logs.get(ACCURACY_KEY, float('nan')):>9.3f} {logs.get('reward', float('nan')):>8.3f} "
                f"{time.perf_counter() - self.start:>6.0f}"
            )

        def on_step_end(self, args, state, control, **kwargs):
            self.bar.update(1)

        def on_train_end(self, args, state, control, **kwargs):
            self.bar.close()

    return TableCallback()


SHAPING = dict(
    length_penalty={"default": {"group_total_length_penalty_coeff": 0.3}},
    length_penalty_coeff=0.5,
)


def run_arm(name: str, args: argparse.Namespace, model_dir: Path, shaping: dict) -> list[dict]:
    """One GRPO run on the embedded task; returns the trainer's log history."""
    from transformers import AutoModelForCausalLM
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from trl_length_plugin.embedded import CPU_RUN_ARGS, correctness_reward, load_tokenizer, make_task_dataset
    from trl_length_plugin.trl_integration import LengthPluginGRPOConfig, LengthPluginGRPOTrainer

    config = LengthPluginGRPOConfig(
        output_dir=str(Path(args.output_dir) / name),
        max_steps=args.steps,
        per_device_train_batch_size=32,
        num_generations=8,
        max_completion_length=48,
        temperature=1.0,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        **CPU_RUN_ARGS,
        seed=args.seed,
        **shaping,
    )
    trainer = LengthPluginGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        processing_class=load_tokenizer(model_dir),
        reward_funcs=[correctness_reward],
        args=config,
        train_dataset=make_task_dataset(2048, seed=args.seed),
        callbacks=[make_table_callback(args.steps)],
    )
    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    trainer.train()
    return trainer.state.log_history


def tail_mean(history: list[dict], key: str, last: int = 10) -> float:
    values = [row[key] for row in history if key in row][-last:]
    return sum(values) / len(values)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    from trl_length_plugin.embedded import embedded_model_dir
    from trl_length_plugin.plotting import plot_training_curves

    print("[demo] preparing the embedded model (built once, then cached)")
    model_dir = embedded_model_dir(warm_start=True, seed=args.seed)
    arms = {"plain GRPO": {}, "GRPO + length shaping": SHAPING}
    histories = {}
    for name, shaping in arms.items():
        print(f"\n[demo] {name}: {args.steps} steps, 4 prompts x 8 completions per step {shaping or ''}")
        histories[name] = run_arm(name.replace(" ", "_").replace("+", "with"), args, model_dir, shaping)
    print(f"\n[demo] last 10 steps{'':<16} {'mean_len':>9} {'accuracy':>9}")
    for name, history in histories.items():
        print(
            f"[demo] {name:<26} {tail_mean(history, 'completions/mean_length'):>9.2f} "
            f"{tail_mean(history, ACCURACY_KEY):>9.3f}"
        )
    png = plot_training_curves(
        [], Path(args.output_dir) / "curves.png", title="embedded task, same seed", runs=histories
    )
    print(f"[demo] curves written to {png}")
    return png


if __name__ == "__main__":
    main()
