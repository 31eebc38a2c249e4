"""The worker of tests/test_trl_streaming.py's two-process test, run by torchrun (and in-process for one)."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GLOBAL_BATCH = 12  # 6 rows per rank with two processes: the second group has two rows on each rank


def run_worker(model_dir: str, out_file: str, output_dir: str) -> None:
    """One step of each route on the streaming dataset; the main process writes the gathered rewards and
    length metrics."""
    from tests.test_trl_streaming import BLOCK, length_metrics, metadata_dataset
    from tests.trl_length_helpers import (
        RecordingStockTrainer,
        RecordingTrainer,
        deterministic_rollout,
        tiny_config,
    )
    from trl_length_plugin.embedded import correctness_reward, load_tokenizer
    from trl_length_plugin.trl_integration import LengthPenaltyReward

    tokenizer = load_tokenizer(model_dir)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = dict(per_device_train_batch_size=GLOBAL_BATCH // world, max_steps=1, shuffle_dataset=False)
    common = dict(
        model=model_dir,
        train_dataset=metadata_dataset(6).to_iterable_dataset().skip(3),  # prompts 3-5 (5: malformed, rank 1)
        processing_class=tokenizer,
        rollout_func=deterministic_rollout(tokenizer, 4),
    )
    trainer = RecordingTrainer(
        reward_funcs=[correctness_reward],
        args=tiny_config(output_dir, length_penalty=BLOCK, **args),
        **common,
    )
    trainer.train()
    wrapper = LengthPenaltyReward(correctness_reward, BLOCK, tokenizer=tokenizer)
    stock = RecordingStockTrainer(
        reward_funcs=[correctness_reward, wrapper], args=tiny_config(output_dir, **args), **common
    )
    stock.train()
    result = {
        "world": world,
        "rewards": trainer.records[0].rewards_per_func.tolist(),
        "wrapper_rewards": stock.records[0].rewards_per_func.tolist(),
        "log": length_metrics(trainer),
        "wrapper_log": length_metrics(stock),
    }
    if trainer.accelerator.is_main_process:
        Path(out_file).write_text(json.dumps(result))


if __name__ == "__main__":
    # as pytest's importlib mode does: "tests" is this directory (site-packages may hold another "tests")
    sys.modules["tests"] = types.ModuleType("tests")
    sys.modules["tests"].__path__ = [str(REPO / "tests")]
    run_worker(*sys.argv[1:4])
