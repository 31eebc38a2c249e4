"""Ulysses sequence parallelism keeps the sampler's ids and positions aligned (docs/reference/score-centering.md
§5.4): two processes (torchrun, gloo), one sequence-parallel group.

On each rank the hook gets the logits of the rows verl's ``ulysses_pad_and_slice_inputs`` gives that rank
(the slice of the rolled packed stream, padded to a multiple of the group size); its per-token outputs,
gathered and unpadded with verl's ``gather_outputs_and_unpad`` (what the engine does with ``log_probs``), equal
the outputs of one process on the whole micro-batch. The model forward under Ulysses (attention all-to-all)
needs GPUs and is on docs/verl.md's GPU list.
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


def run_worker(out_file: str) -> None:
    import torch.distributed as dist
    from verl.utils.ulysses import (
        gather_outputs_and_unpad,
        set_ulysses_sequence_parallel_group,
        ulysses_pad_and_slice_inputs,
    )

    from tests.verl_score_centering_helpers import MODES, make_rollouts, micro_batch, settings_and_actor
    from verl_adapter.score_centering.loss import head_outputs

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    settings, _, _ = settings_and_actor(MODES["adaptive-ppo-clip"])  # the advantages are sliced too
    vocab = 31
    rollouts = make_rollouts([3, 2, 4], [5, 4, 6], vocab, 4, seed=3)  # 24 tokens: 25 is odd below
    rollouts.prompts[0] = torch.cat([rollouts.prompts[0], torch.tensor([1])])
    rollouts.sampler_ids[0] = torch.cat([torch.zeros(1, 4, dtype=torch.int32), rollouts.sampler_ids[0]])
    rollouts.sampler_logprobs[0] = torch.cat([torch.zeros(1, 4), rollouts.sampler_logprobs[0]])
    data = micro_batch(rollouts, [0, 1, 2], adaptive_k=0.1)
    total = data["input_ids"].values().shape[0]
    logits = torch.randn(total, vocab, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    whole = head_outputs(logits.unsqueeze(0), data, settings)

    set_ulysses_sequence_parallel_group(dist.group.WORLD)
    rolled = torch.roll(data["input_ids"].values(), -1).unsqueeze(0)
    labels, _, pad = ulysses_pad_and_slice_inputs(rolled, None, sp_size=world)
    rows, _, _ = ulysses_pad_and_slice_inputs(torch.arange(total).unsqueeze(0), None, sp_size=world)
    local_logits = torch.cat([logits, torch.zeros(pad, vocab, dtype=logits.dtype)])[rows.squeeze(0)]
    local = head_outputs(local_logits.unsqueeze(0), data, settings)
    diffs = {}
    for key, value in local.items():
        assert value.shape == (1, labels.shape[1])
        gathered = gather_outputs_and_unpad(value.squeeze(0), gather_dim=0, unpad_dim=0, padding_size=pad)
        diffs[key] = (gathered - whole[key].squeeze(0)).abs().max().item()
    if dist.get_rank() == 0:
        Path(out_file).write_text(json.dumps({"world": world, "total": total, "pad": pad, "diffs": diffs}))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_ulysses_slices_and_gathers_like_one_process(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "sp.json"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29523",
    ]
    done = subprocess.run(
        [*command, __file__, str(out)], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[done.stderr.find("Traceback") :][:4000]
    result = json.loads(out.read_text())
    assert (result["world"], result["total"] % 2, result["pad"]) == (2, 1, 1)
    assert set(result["diffs"]) >= {"log_probs", "score_centering/correction"}
    assert max(result["diffs"].values()) < 1e-12, result["diffs"]


if __name__ == "__main__":
    # as pytest's importlib mode does: "tests" is this directory (site-packages may hold another "tests")
    sys.modules["tests"] = types.ModuleType("tests")
    sys.modules["tests"].__path__ = [str(REPO / "tests")]
    run_worker(sys.argv[1])
