"""Two processes (torchrun, gloo) with prompt groups split across ranks give the same shaped rewards,
advantages and loss masks as one process on the same global batch (docs/reference/length-penalties.md §2.2, §3.3), and so does
the reward wrapper on the stock trainer, which gathers across processes itself.

TRL splits a group across ranks when ``per_device_train_batch_size * steps_per_generation`` is not a
multiple of ``num_generations`` (docs/trl.md, "How it hooks into TRL"): here 6 rows per rank and groups of 4, so the second
group has two rows on each rank. Completions come from a deterministic TRL ``rollout_func`` (the model's
own sampling differs between one and two processes, so it cannot give the same global batch); prompts
come from TRL's sampler and everything after generation is the real trainer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
GLOBAL_BATCH = 12
LENGTH_PENALTY = {"default": {"group_total_length_penalty_coeff": 0.2, "total_bonus": 0.05}}


def run_worker(model_dir: str, out_file: str, output_dir: str) -> None:
    """One training step with the subclass and one with the reward wrapper on the stock trainer; the main
    process writes the gathered rewards, advantages and mask sums."""
    from tests.trl_length_helpers import (
        RecordingStockTrainer,
        RecordingTrainer,
        deterministic_rollout,
        tiny_config,
    )
    from trl_length_plugin.embedded import correctness_reward, load_tokenizer, make_task_dataset
    from trl_length_plugin.trl_integration import LengthPenaltyReward

    world = int(os.environ.get("WORLD_SIZE", "1"))
    tokenizer = load_tokenizer(model_dir)
    common = dict(
        model=model_dir,
        train_dataset=make_task_dataset(24),
        processing_class=tokenizer,
        rollout_func=deterministic_rollout(tokenizer, 4),
    )
    args = tiny_config(
        output_dir,
        per_device_train_batch_size=GLOBAL_BATCH // world,
        length_penalty=LENGTH_PENALTY,
        length_penalty_coeff=1.0,
        drop_zero_std_groups=True,
    )
    trainer = RecordingTrainer(reward_funcs=[correctness_reward], args=args, **common)
    trainer.train()
    (record,) = trainer.records
    wrapper = LengthPenaltyReward(correctness_reward, LENGTH_PENALTY, num_generations=4, tokenizer=tokenizer)
    stock = RecordingStockTrainer(
        reward_funcs=[correctness_reward, wrapper],
        args=tiny_config(output_dir, per_device_train_batch_size=GLOBAL_BATCH // world),
        **common,
    )
    stock.train()
    gathered = trainer.accelerator.gather
    result = {
        "world": world,
        "local_rows": len(record.completions),
        "rewards": record.rewards_per_func.tolist(),
        "advantages": gathered(record.output["advantages"]).tolist(),
        "mask_sums": gathered(
            (record.output["completion_mask"] * record.output["tool_mask"]).sum(1)
        ).tolist(),
        "num_items": int(record.output["num_items_in_batch"]),
        "log": {k: v for k, v in trainer.state.log_history[0].items() if k.startswith("length_penalty/")},
        "wrapper_rewards": stock.records[0].rewards_per_func.tolist(),
    }
    if trainer.accelerator.is_main_process:
        Path(out_file).write_text(json.dumps(result))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_match_one(random_model_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    two = tmp_path / "two.json"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29517",
        __file__,
        str(random_model_dir),
        str(two),
        str(tmp_path / "out2"),
    ]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[done.stderr.find("Traceback") :][:4000]
    one = tmp_path / "one.json"
    run_worker(str(random_model_dir), str(one), str(tmp_path / "out1"))
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert (a["world"], b["world"], b["local_rows"]) == (1, 2, GLOBAL_BATCH // 2)
    torch.testing.assert_close(torch.tensor(b["rewards"]), torch.tensor(a["rewards"]), rtol=0, atol=1e-6)
    torch.testing.assert_close(
        torch.tensor(b["advantages"]), torch.tensor(a["advantages"]), rtol=0, atol=1e-5
    )
    assert b["mask_sums"] == a["mask_sums"] and b["num_items"] == a["num_items"]
    assert b["log"] == pytest.approx(a["log"], abs=1e-6)
    assert any(row[1] != 0 for row in a["rewards"]), "the batch gave the shaping nothing to do"
    # the reward wrapper on the stock trainer gathers across processes itself (compared with the subclass
    # in test_trl_wrapper.py): two processes give what one gives
    wrapped_two, wrapped_one = torch.tensor(b["wrapper_rewards"]), torch.tensor(a["wrapper_rewards"])
    torch.testing.assert_close(wrapped_two, wrapped_one, rtol=0, atol=1e-6)
    assert bool((wrapped_one[:, 1] != 0).any())


if __name__ == "__main__":
    # as pytest's importlib mode does: "tests" is this directory (site-packages may hold another "tests")
    sys.modules["tests"] = types.ModuleType("tests")
    sys.modules["tests"].__path__ = [str(REPO / "tests")]
    run_worker(*sys.argv[1:4])
