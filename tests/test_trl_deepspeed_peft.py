"""The plugin trainer under DeepSpeed ZeRO-2 and ZeRO-3 (one process: two-process DeepSpeed does not run on
CPU, host-feasibility.md §1) and with a PEFT LoRA adapter: real generation from the warm-started model,
shaped rewards equal to the engine's output for the same batch.

Each DeepSpeed run is a subprocess (DeepSpeed initializes a process group and global state); its first
run JIT-builds a communication op (~40 s) cached in ``TORCH_EXTENSIONS_DIR`` (tests/conftest.py)."""

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
BLOCK = {"default": {"group_total_length_penalty_coeff": 0.2}}
SHAPING = dict(
    length_penalty=BLOCK,
    length_penalty_coeff=1.0,
    drop_zero_std_groups=True,
    per_device_train_batch_size=16,
    max_completion_length=48,
    temperature=0.5,
)


def train_and_compare(output_dir: str, model_dir: str, **trainer_kwargs) -> dict:
    """One training step; the shaped rewards written by the trainer against the engine's for that batch."""
    from tests.trl_length_helpers import RecordingTrainer, expected_shaping, tiny_config
    from trl_length_plugin.embedded import correctness_reward, load_tokenizer, make_task_dataset

    tokenizer = load_tokenizer(model_dir)
    deepspeed = trainer_kwargs.pop("deepspeed", None)
    args = tiny_config(output_dir, deepspeed=deepspeed, **SHAPING)
    trainer = RecordingTrainer(
        model=model_dir,
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=make_task_dataset(32),
        processing_class=tokenizer,
        **trainer_kwargs,
    )
    trainer.train()
    (record,) = trainer.records
    raw = record.rewards_per_func[:, 0].double()
    shaped, _, advantages, keep = expected_shaping(record, args, tokenizer)
    written = raw + record.rewards_per_func[:, 1].double()
    return {
        "deepspeed": trainer.is_deepspeed_enabled,
        "peft": type(trainer.model).__name__,
        "max_reward_error": float((written - shaped).abs().max()),
        "max_advantage_error": float((record.output["advantages"].double() - advantages).abs().max()),
        "filtered_rows_masked": bool(
            ((record.output["completion_mask"] * record.output["tool_mask"])[~keep] == 0).all()
        ),
        "changed": bool((shaped != raw).any()),
        "loss_finite": bool(torch.isfinite(torch.tensor(trainer.state.log_history[0]["loss"]))),
    }


def deepspeed_worker(stage: str, model_dir: str, out_file: str) -> None:
    config = {
        "zero_optimization": {"stage": int(stage)},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
    }
    result = train_and_compare(str(Path(out_file).parent / f"zero{stage}"), model_dir, deepspeed=config)
    Path(out_file).write_text(json.dumps(result))


def check(result: dict) -> None:
    assert result["max_reward_error"] < 1e-6 and result["max_advantage_error"] < 1e-5, result
    assert result["filtered_rows_masked"] and result["loss_finite"], result
    assert result["changed"], "the batch gave the shaping nothing to do"


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero(stage, tiny_model_dir, tmp_path):
    out = tmp_path / "result.json"
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(29540 + stage),
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, __file__, str(stage), str(tiny_model_dir), str(out)]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[done.stderr.find("Traceback") :][:4000]
    result = json.loads(out.read_text())
    assert result["deepspeed"], result
    check(result)


@pytest.mark.slow
def test_peft_lora(tiny_model_dir, tmp_path):
    from peft import LoraConfig

    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    result = train_and_compare(str(tmp_path), str(tiny_model_dir), peft_config=lora)
    assert result["peft"].startswith("Peft"), result
    check(result)


if __name__ == "__main__":
    # as pytest's importlib mode does: "tests" is this directory (site-packages may hold another "tests")
    sys.modules["tests"] = types.ModuleType("tests")
    sys.modules["tests"].__path__ = [str(REPO / "tests")]
    deepspeed_worker(*sys.argv[1:4])
