"""Shared pieces of the verl length-shaping tests (test_verl_shaping.py, test_verl_filter.py).

- A real TransferQueue (verl 0.9.1's store between rollout and trainer) on a local Ray with one storage unit.
- verl's own Hydra config composed with test overrides, and the length-shaping trainer verl's registry returns.
- Rollouts put into TransferQueue the way verl's ``AgentLoopWorkerTQ._agent_loop_postprocess`` puts them: one
  ``kv_batch_put`` per session with ``AgentLoopOutput.as_dict()`` (reward at the last response token) updated
  with the dataset row, then the prompt's status tag ``finished``. Generation and reward scoring (vLLM and the
  reward loop, which need a GPU or a model server) are replaced by fixed token ids and scores.
"""

from __future__ import annotations

import json
import os
import random
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

verl = pytest.importorskip("verl")

import ray  # noqa: E402
import transfer_queue as tq  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput  # noqa: E402
from verl.trainer.ppo.v1 import get_trainer_cls  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")
METADATA_KEYS = ("profiled_rewards", "profiled_output_lengths", "profile_band", "target_length")


def compose_verl(overrides: list[str]):
    """verl's ``ppo_trainer`` config with ``overrides``, as ``python3 -m verl.trainer.main_ppo`` builds it."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def recipe_overrides(script: Path, tmp_path: Path) -> list[str]:
    """The Hydra overrides a recipe passes to ``python3 -m verl.trainer.main_ppo``, after shell expansion."""
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    capture = tmp_path / "argv.json"
    fake = shim / "python3"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(capture)!r}, 'w'))\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}", "DATA_DIR": "/data/gsm8k"}
    subprocess.run(["bash", str(script)], check=True, env=env, timeout=60)
    argv = json.loads(capture.read_text())
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"]
    return argv[2:]


def make_trainer(overrides: list[str], tokenizer: Any = None, step: int = 1):
    """The trainer verl's TaskRunner would build (``get_trainer_cls(trainer.v1.trainer_mode)(config)``),
    without ``init()``: no workers. The tokenizer ``init()`` would load is set directly."""
    config = compose_verl(overrides)
    OmegaConf.resolve(config)
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
    trainer.tokenizer = tokenizer
    trainer.length_shaper.tokenizer = tokenizer
    trainer.global_steps = step
    return trainer


@contextmanager
def local_transfer_queue() -> Iterator[None]:
    """A local Ray with a TransferQueue controller and one storage unit (for a module-scoped fixture)."""
    ray.init(num_cpus=2, object_store_memory=200 * 1024**2, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    try:
        yield
    finally:
        tq.close()
        ray.shutdown()


@dataclass
class Rollout:
    """One session of a prompt: model text (``reasoning`` inside the think tags, ``answer``), an optional
    tool observation inserted after the reasoning (``response_mask`` 0), the score, dataset columns."""

    uid: str
    reward: float
    answer: str
    reasoning: str = ""
    tool: str = ""
    data_source: str = "openai/gsm8k"
    extra_info: dict[str, Any] = field(default_factory=dict)
    columns: dict[str, Any] = field(default_factory=dict)  # top-level metadata columns
    early_score: float = 0.0  # part of the score on the first token: a multi-component score

    @property
    def text(self) -> str:
        """The model's own output (what docs/reference/length-penalties.md §2.5 measures)."""
        thought = f"<think>{self.reasoning}</think>" if self.reasoning else ""
        return thought + self.answer

    def response(self, tokenizer) -> tuple[list[int], list[int]]:
        """Response token ids and response mask: model tokens 1, tool tokens 0, EOS at the end."""
        encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        thought = encode(f"<think>{self.reasoning}</think>") if self.reasoning else []
        tool, answer = encode(self.tool) if self.tool else [], encode(self.answer)
        ids = thought + tool + answer + [tokenizer.eos_token_id]
        mask = [1] * len(thought) + [0] * len(tool) + [1] * (len(answer) + 1)
        return ids, mask


def put_rollouts(
    rollouts: list[Rollout], tokenizer, partition: str = "train", step: int = 1, seed: int = 0
) -> list[str]:
    """Put the rollouts (sessions in shuffled order) and finish their prompts; returns each rollout's key."""
    sessions: dict[str, int] = {}
    order = list(range(len(rollouts)))
    random.Random(seed).shuffle(order)
    keys = [""] * len(rollouts)
    for i in order:
        rollout = rollouts[i]
        session = sessions[rollout.uid] = sessions.get(rollout.uid, -1) + 1
        ids, mask = rollout.response(tokenizer)
        output = AgentLoopOutput(
            prompt_ids=[7, 8, 9, *rollout.uid.encode()],  # one prompt per group
            response_ids=ids,
            response_mask=mask,
            reward_score=rollout.reward - rollout.early_score,
            num_turns=2,
            metrics=AgentLoopMetrics(),
            extra_fields={"reward_extra_info": {"acc": rollout.reward}},
        )
        row = output.as_dict()
        row["rm_scores"][0] += rollout.early_score
        row.update(
            uid=rollout.uid,
            session_id=session,
            global_steps=step,
            data_source=rollout.data_source,
            reward_model={"ground_truth": "42"},
            extra_info=rollout.extra_info,
            **{key: rollout.columns.get(key) for key in METADATA_KEYS},
        )
        row["loss_mask"] = row["response_mask"]
        key = f"{rollout.uid}_{session}_0"
        prompt_len = len(output.prompt_ids)
        tag = {"status": "success", "global_steps": step, "seq_len": prompt_len + len(ids)}
        tag.update(min_global_steps=step, max_global_steps=step, prompt_len=prompt_len, response_len=len(ids))
        tq.kv_batch_put(
            keys=[key], partition_id=partition, fields=list_of_dict_to_tensordict([row]), tags=[tag]
        )
        keys[i] = key
    uids = list(dict.fromkeys(r.uid for r in rollouts))
    tags = [{"is_prompt": True, "status": "finished", "global_steps": step} for _ in uids]
    tq.kv_batch_put(keys=uids, partition_id=partition, tags=tags)
    return keys


def read(keys: list[str], partition: str, fields: list[str]) -> dict[str, list]:
    """TransferQueue fields of ``keys`` as per-row Python lists (tensors per row)."""
    data = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=fields)
    present = set(data.keys())
    return {
        name: list(data[name].unbind(0)) if isinstance(data[name], torch.Tensor) else list(data[name])
        for name in fields
        if name in present
    }


def clear(partition: str = "train") -> None:
    """Empty a partition between tests."""
    listed = tq.kv_list(partition) or {}
    keys = list(listed.get(partition, {}))
    if keys:
        tq.kv_clear(keys=keys, partition_id=partition)
