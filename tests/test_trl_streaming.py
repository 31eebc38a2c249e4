"""Streaming datasets (``datasets.IterableDataset``: no length, no indexing) through both TRL routes: the
subclass and the reward wrapper shape a real trainer's batches exactly as on the map-style dataset with the
same rows, per-prompt metadata included, read from the rows themselves (docs/reference/length-penalties.md
§2.14, docs/trl.md "Streaming datasets").

Completions come from a deterministic TRL ``rollout_func``; both datasets are read in order
(``shuffle_dataset=False``: TRL shuffles an iterable dataset through a buffer, a map-style one through its
sampler, so shuffled orders differ)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.trl_length_helpers import (
    RecordingStockTrainer,
    RecordingTrainer,
    deterministic_rollout,
    expected_shaping,
    tiny_config,
)
from tests.trl_streaming_worker import run_worker
from trl_length_plugin.embedded import correctness_reward, load_tokenizer, make_task_dataset
from trl_length_plugin.shaping import LengthShapingConfig, load_shaping_config
from trl_length_plugin.shaping import metadata as metadata_module
from trl_length_plugin.shaping.columns import METADATA_COLUMNS
from trl_length_plugin.shaping.metadata import parse_prompt_metadata
from trl_length_plugin.trl_integration import LengthPenaltyReward, LengthPluginGRPOTrainer
from trl_length_plugin.trl_integration.rollouts import (
    LocalRollouts,
    RowMetadata,
    consecutive_groups,
    entry_key,
    gathered_batch,
)

REPO = Path(__file__).resolve().parents[1]
MISSING_MODEL = "/nonexistent/model"  # loading it would fail with another message: proves nothing loaded
#: per-prompt bands and profiles (one prompt, index 5, has a malformed band) over a global reasoning band
BLOCK = {
    "default": {
        "group_total_length_penalty_coeff": 0.1,
        "profile_band_total": True,
        "profiled_length_penalty": 0.2,
        "profiled_length_n_std": 0.0,
    },
    "profile_band": {"enabled": True, "defaults": {"reasoning": {"a": 4.0, "b": 16.0, "f": 0.6}}},
}
STEPS = 2
TRAIN = dict(per_device_train_batch_size=16, max_steps=STEPS, shuffle_dataset=False)


def band(i: int) -> dict:
    return {"total": {"a": 30.0, "b": 10.0, "f": 0.5} if i == 5 else {"a": 8.0 + i % 10, "b": 30.0, "f": 0.5}}


def metadata_dataset(n: int = 16):
    """The embedded task with per-prompt metadata columns (map-style)."""
    dataset = make_task_dataset(n)
    dataset = dataset.add_column("profile_band", [band(i) for i in range(n)])
    dataset = dataset.add_column("profiled_rewards", [[1, 1, 0, 1] for _ in range(n)])
    return dataset.add_column("profiled_output_lengths", [[10, 14 + i % 9, 30, 12] for i in range(n)])


def train_records(trainer) -> list:
    trainer.train()
    return [r for r in trainer.records if r.mode == "train"]


def length_metrics(trainer) -> list[dict]:
    return [
        {k: v for k, v in row.items() if k.startswith(("length_penalty/", "rewards/length_penalty"))}
        for row in trainer.state.log_history
        if "length_penalty/env_reward_mean" in row
    ]


def assert_same_steps(streamed, mapped) -> None:
    """Same prompts in the same order, the same reward columns and advantages on every step."""
    assert len(streamed) == len(mapped) == STEPS
    for s, m in zip(streamed, mapped, strict=True):
        assert [x["prompt"] for x in s.inputs] == [x["prompt"] for x in m.inputs]
        torch.testing.assert_close(s.rewards_per_func, m.rewards_per_func, rtol=0, atol=0)
        torch.testing.assert_close(s.output["advantages"], m.output["advantages"], rtol=0, atol=0)


@pytest.mark.slow
def test_subclass_trains_on_a_streaming_dataset_as_on_the_map_style_one(random_model_dir, tmp_path, caplog):
    """Penalties reading per-prompt bands and profiles, the coefficient with its filter, and LUSPO: two steps
    on the iterable dataset equal two steps on the map-style one, and match the engine's output for the
    recorded batch (each group's own band: the malformed one is counted, not applied)."""
    tokenizer = load_tokenizer(random_model_dir)
    dataset = metadata_dataset()
    features = dict(length_penalty=BLOCK, length_penalty_coeff=1.0, length_penalty_min_tokens=2,
                    drop_zero_std_groups=True, luspo=True, **TRAIN)  # fmt: skip
    runs = {}
    for name, train_dataset in (("map", dataset), ("stream", dataset.to_iterable_dataset())):
        trainer = RecordingTrainer(
            model=str(random_model_dir),
            reward_funcs=[correctness_reward],
            args=tiny_config(tmp_path / name, **features),
            train_dataset=train_dataset,
            processing_class=tokenizer,
            rollout_func=deterministic_rollout(tokenizer, 4),
        )
        with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
            runs[name] = (trainer, train_records(trainer))
    (mapped_trainer, mapped), (streamed_trainer, streamed) = runs["map"], runs["stream"]
    assert_same_steps(streamed, mapped)
    assert length_metrics(streamed_trainer) == length_metrics(mapped_trainer)
    losses = [
        [row["loss"] for row in t.state.log_history if "loss" in row]
        for t in (streamed_trainer, mapped_trainer)
    ]
    assert losses[0] == losses[1] and len(losses[0]) == STEPS
    args = streamed_trainer.args
    for record in streamed:  # the engine on the recorded rows, metadata taken from each row
        raw = record.rewards_per_func[:, 0].double()
        shaped, _, _, _ = expected_shaping(record, args, tokenizer)
        torch.testing.assert_close(raw + record.rewards_per_func[:, 1].double(), shaped, rtol=0, atol=1e-6)
        bare = [{k: v for k, v in x.items() if k not in METADATA_COLUMNS} for x in record.inputs]
        unread, _, _, _ = expected_shaping(replace(record, inputs=bare), args, tokenizer)
        assert not torch.equal(unread, shaped), "the per-prompt metadata changed nothing"
    invalid = [m["length_penalty/invalid_metadata_frac"] for m in length_metrics(streamed_trainer)]
    prompts = [p[-1]["content"] for p in dataset["prompt"]]
    fifth = [any(x["prompt"][-1]["content"] == prompts[5] for x in r.inputs) for r in streamed]
    assert fifth == [False, True] and invalid == [0.0, 0.25]  # prompt 5: one group of the second step's four
    assert sum("malformed total metadata" in r.getMessage() for r in caplog.records) == 2  # once per run


@pytest.mark.slow
def test_wrapper_trains_on_a_streaming_dataset_as_on_the_map_style_one(random_model_dir, tmp_path):
    """The reward wrapper on the stock ``GRPOTrainer``: the iterable dataset gives the map-style rewards and
    metrics, and each group reads its own prompt's band and profile (the engine's output on the recorded
    rows); each distinct metadata entry is parsed once over both steps."""
    tokenizer = load_tokenizer(random_model_dir)
    dataset = metadata_dataset(4)  # one step reads the four prompts: the second step (epoch) re-reads them
    runs = {}
    for name, train_dataset in (("map", dataset), ("stream", dataset.to_iterable_dataset())):
        wrapper = LengthPenaltyReward(correctness_reward, BLOCK, tokenizer=tokenizer)
        trainer = RecordingStockTrainer(
            model=str(random_model_dir),
            reward_funcs=[correctness_reward, wrapper],
            args=tiny_config(tmp_path / name, **TRAIN),
            train_dataset=train_dataset,
            processing_class=tokenizer,
            rollout_func=deterministic_rollout(tokenizer, 4),
        )
        runs[name] = (trainer, wrapper, train_records(trainer))
    (mapped_trainer, _, mapped), (streamed_trainer, wrapper, streamed) = runs["map"], runs["stream"]
    assert_same_steps(streamed, mapped)
    assert length_metrics(streamed_trainer) == length_metrics(mapped_trainer)
    args = tiny_config(tmp_path / "expected", length_penalty=BLOCK, **TRAIN)
    for record in streamed:
        raw = record.rewards_per_func[:, 0].double()
        shaped, _, _, _ = expected_shaping(record, args, tokenizer)
        torch.testing.assert_close(raw + record.rewards_per_func[:, 1].double(), shaped, rtol=0, atol=1e-6)
        assert not torch.equal(shaped, raw), "the batch gave the shaping nothing to do"
    assert wrapper._metadata.cache.parsed == 4  # the four prompts, each parsed once over both steps


def test_setup_accepts_a_streaming_dataset(tmp_path):
    """The setup reads no length and no row of an iterable dataset (it fails only at the model load)."""
    dataset = metadata_dataset(8).to_iterable_dataset()
    with pytest.raises(OSError):
        LengthPluginGRPOTrainer(
            model=MISSING_MODEL,
            reward_funcs=[correctness_reward],
            args=tiny_config(tmp_path, length_penalty=BLOCK),
            train_dataset=dataset,
        )


def shaping() -> LengthShapingConfig:
    """``BLOCK`` counting characters (no tokenizer needed)."""
    return load_shaping_config(
        {"length_penalty": {**BLOCK, "default": {**BLOCK["default"], "length_type": "chars"}}}
    )


def test_row_metadata_round_trips_the_parsed_table():
    """Flattened for the gather and read back: the parse of each row's entry, bit for bit."""
    entries = [
        {"profile_band": band(i), "profiled_rewards": [1, 0], "profiled_output_lengths": [3 + i, 9]}
        for i in range(6)
    ]
    entries[2] = {"profile_band": "not a mapping"}
    table = RowMetadata.from_columns(RowMetadata().local_columns(entries))
    expected = parse_prompt_metadata(entries)
    for name in ("bands", "profiled", "invalid"):
        assert torch.equal(getattr(table, name).nan_to_num(-1), getattr(expected, name).nan_to_num(-1)), name
    # entry 2: its three channels; entry 5: its total band
    assert table.invalid.dtype == torch.bool and int(table.invalid.sum()) == 4


def test_row_metadata_parses_each_distinct_entry_once(monkeypatch):
    parsed = []
    original = metadata_module.parse_prompt_metadata
    monkeypatch.setattr(
        metadata_module, "parse_prompt_metadata", lambda e: parsed.append(len(e)) or original(e)
    )
    rows = RowMetadata()
    group = [{"profile_band": band(i)} for i in (0, 0, 1, 1)]  # rows repeat their prompt's entry
    first = rows.local_columns(group)
    again = rows.local_columns([{"profile_band": band(1)}, {"profile_band": band(2)}])
    assert parsed == [2, 1] and rows.cache.parsed == 3
    torch.testing.assert_close(again[0], first[2], rtol=0, atol=0, equal_nan=True)


def test_entry_keys_follow_content_not_appearance():
    """Equal entries share a key; arrays whose printed forms coincide do not (a digest of the pickle)."""
    a, b = np.arange(2000.0), np.arange(2000.0)
    b[1000] = -1.0  # numpy elides the middle of both when printing
    assert repr(a) == repr(b)
    assert entry_key({"profiled_output_lengths": a}) != entry_key({"profiled_output_lengths": b})
    assert entry_key({"profile_band": band(3)}) == entry_key({"profile_band": band(3)})
    assert entry_key({"profile_band": lambda: 0}) != entry_key({"profile_band": lambda: 0})  # unpicklable


def test_gathered_batch_reads_each_groups_first_row():
    """The gathered batch's metadata is each group's first row's, parsed (one process)."""
    completions = ["<think>ab</think>c"] * 4
    entries = [{"profile_band": band(i)} for i in (3, 3, 7, 7)]
    local = LocalRollouts.from_columns(
        completions, {"profile_band": [e["profile_band"] for e in entries]}, "agent"
    )
    batch = gathered_batch(
        local, torch.ones(4, dtype=torch.float64), consecutive_groups(4, 2), shaping(), tokenizer=None
    )
    groups = batch.group_metadata()
    assert groups.bands[:, 0].tolist() == [[11.0, 30.0, 0.5], [15.0, 30.0, 0.5]]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_stream_as_one(random_model_dir, tmp_path):
    """Two processes (torchrun, gloo) reading the stream in shards, a group split across them: each rank's
    parsed metadata crosses in the gather and both routes give what one process gives."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    two, one = tmp_path / "two.json", tmp_path / "one.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29523",
               str(REPO / "tests" / "trl_streaming_worker.py"), str(random_model_dir), str(two), str(tmp_path / "out2")]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[done.stderr.find("Traceback") :][:4000]
    run_worker(str(random_model_dir), str(one), str(tmp_path / "out1"))
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert (a["world"], b["world"]) == (1, 2)
    for key in ("rewards", "wrapper_rewards"):
        torch.testing.assert_close(torch.tensor(b[key]), torch.tensor(a[key]), rtol=0, atol=1e-6)
        assert any(row[1] != 0 for row in a[key]), "the batch gave the shaping nothing to do"
    assert b["log"] == a["log"] and b["wrapper_log"] == a["wrapper_log"]
    assert a["log"][0]["length_penalty/invalid_metadata_frac"] == pytest.approx(1 / 3)  # prompt 5's group


def test_command_line_streams_a_local_data_file(tmp_path):
    """``--dataset_streaming true`` on a local JSON-lines file gives the trainer an ``IterableDataset``."""
    from datasets import IterableDataset

    from trl_length_plugin.trl_integration.script import load_datasets

    path = tmp_path / "train.jsonl"
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1), "profile_band": band(i)} for i in range(3)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    script_args = types.SimpleNamespace(
        dataset_name=str(path), dataset_train_split="train", dataset_streaming=True
    )
    training_args = types.SimpleNamespace(eval_strategy="no")
    dataset_args = types.SimpleNamespace(datasets=[])
    train, evaluation = load_datasets(script_args, training_args, dataset_args, None)
    assert isinstance(train, IterableDataset) and evaluation is None
    assert list(train) == rows
