"""``trl-length preview`` through the real command: on hand-made rollouts it gives the hand-computed shaped
rewards and advantages, equal to ``shape_rollouts`` called directly on the same rollouts and (slow) to the
TRL trainer's own step; the report counts what each algorithm, the gate and the binary check did; a bad
config exits 2 with the trainer's own one-line message naming the key; the PNG is written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import yaml

from trl_length_plugin.shaping import RolloutBatch, load_shaping_config, shape_rollouts
from trl_length_plugin.shaping.normalization import TRL_NORMALIZATION
from trl_length_plugin.tools import commands

BAND = {"total": {"a": 10, "b": 20, "f": 0.5}}
# (group, agent, reasoning, answer, reward, completion tokens); group b's first row carries its band
ROWS = [
    ("a", "math", 15, 5, 1, 21),
    ("a", "math", 55, 5, 1, 61),
    ("a", "math", 0, 5, 0, 6),
    ("a", "math", 35, 5, 1, 41),
    ("b", "math", 10, 5, 1, 16),
    ("b", "math", 20, 5, 1, 26),
    ("c", "judge", 20, 5, 0.5, 26),
    ("c", "judge", 20, 5, 1, 26),
]
RECIPE = {
    "model_name_or_path": "embedded",  # not a shaping key: left to trl-length grpo
    "length_penalty": {
        "default": {
            "group_total_length_penalty_coeff": 0.3,
            "group_length_penalty_profile_gate": True,
            "profile_band_total": True,
        }
    },
    "length_penalty_coeff": 0.5,
}
# a: no band, so the gate is closed (missing_profile_limit) and only the coefficient acts (L_ref 21):
#    1 / (1 + 0.5 * 40 / 21) = 21 / 41 and 1 / (1 + 0.5 * 20 / 21) = 21 / 31.
# b: gate open (positive mean 20 > a = 10); group-relative w = [1, 0] -> +0.15, -0.15; band: total 15 gives
#    1 - 0.5 * 0.5 = 0.75, total 25 gives f = 0.5; then the coefficient (L_ref 16) on row 1: 16 / 21.
# c: 0.5 is not binary: untouched.
SHAPED = [1.0, 21 / 41, 0.0, 21 / 31, 1.15 * 0.75, 0.85 * 0.5 * 16 / 21, 0.5, 1.0]


def write_rollouts(path):
    with path.open("w") as sink:
        for i, (group, agent, reasoning, answer, reward, tokens) in enumerate(ROWS):
            row = {"prompt_id": group, "agent": agent, "reasoning_tokens": reasoning, "answer_tokens": answer}
            row.update(reward=reward, completion_tokens=tokens, **({"profile_band": BAND} if i == 4 else {}))
            sink.write(json.dumps(row) + "\n")
    return path


def preview(capsys, *argv) -> tuple[int, str, str]:
    """Run ``trl-length preview`` in this process: (exit status, stdout, stderr)."""
    try:
        commands.main(["preview", *map(str, argv)])
        status = 0
    except SystemExit as done:
        status = done.code
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(RECIPE))
    return path


def test_preview_gives_the_hand_computed_step_and_the_engine_output(tmp_path, recipe, capsys):
    rollouts, out, png = write_rollouts(tmp_path / "r.jsonl"), tmp_path / "shaped.jsonl", tmp_path / "p.png"
    status, stdout, _ = preview(capsys, rollouts, "--config", recipe, "--output", out, "--png", png)
    assert status == 0 and png.stat().st_size > 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["reward"] for row in written] == [row[4] for row in ROWS]  # the input rows, as read
    shaped = torch.tensor([row["shaped_reward"] for row in written], dtype=torch.float64)
    torch.testing.assert_close(shaped, torch.tensor(SHAPED, dtype=torch.float64), rtol=0, atol=1e-12)
    # all-correct b is only centred; c (skipped by the coefficient) keeps TRL's (r - mean) / (std + 1e-4)
    advantages = torch.tensor([row["advantage"] for row in written], dtype=torch.float64)
    b = SHAPED[4] - (SHAPED[4] + SHAPED[5]) / 2
    c = 0.25 / (0.5 / 2**0.5 + 1e-4)
    torch.testing.assert_close(
        advantages[4:], torch.tensor([b, -b, -c, c], dtype=torch.float64), atol=1e-12, rtol=0
    )
    engine = shape_rollouts(
        RolloutBatch(
            [row[4] for row in ROWS],
            [0, 0, 0, 0, 1, 1, 2, 2],
            [row[2] for row in ROWS],
            [row[3] for row in ROWS],
            agents=[row[1] for row in ROWS],
            metadata=[None] * 4 + [{"profile_band": BAND}] + [None] * 3,
            loss_lengths=[row[5] for row in ROWS],
        ),
        load_shaping_config({k: RECIPE[k] for k in ("length_penalty", "length_penalty_coeff")}),
        TRL_NORMALIZATION,
    )
    assert shaped.tolist() == engine.rewards.tolist() and advantages.tolist() == engine.advantages.tolist()
    for key, value in engine.metrics.items():
        assert f"    {key:<46} {value:.6g}\n" in stdout


def test_the_report_counts_groups_per_algorithm_gate_and_skips(tmp_path, recipe, capsys):
    status, stdout, _ = preview(
        capsys, write_rollouts(tmp_path / "r.jsonl"), "--config", recipe, "--png", tmp_path / "p.png"
    )
    assert status == 0
    assert "8 rows read" in stdout and "8 rollouts in 3 groups; rows skipped: 0" in stdout
    overall, math_agent, judge = stdout.split("== ")[1:]
    assert overall.startswith("all agents: 8 rollouts, 3 groups")
    assert "length_penalty/env_reward_mean                 0.8125\n" in overall  # 6.5 / 8
    assert "length_penalty/skipped_non_binary_frac         0.25\n" in overall
    # deltas over the 6 rows of a and b: 0, -20/41, 0, -10/31, -0.1375, 0.3238 - 1
    assert "6 rollouts of shaped groups" in overall and "lowered 4, unchanged 2, raised 0" in overall
    assert "mean -0.2707  min -0.6762" in overall and "max +0.0000" in overall
    assert "groups touched per algorithm: coefficient 2, band_total 1, group_total 1" in overall
    assert "profile gate: open 1 (mean_gt_limit 1), closed 1 (missing_profile_limit 1)" in overall
    assert "groups skipped: non_binary 1" in overall
    assert math_agent.startswith("agent math: 6 rollouts, 2 groups") and "groups skipped: none" in math_agent
    assert "length_penalty/env_reward_mean                 0.833333\n" in math_agent  # 5 / 6
    assert judge.startswith("agent judge: 2 rollouts, 1 groups") and "groups skipped: non_binary 1" in judge
    assert "groups touched per algorithm: none" in judge


def test_flags_override_the_recipe_and_groups_default_to_the_prompt(tmp_path, recipe, capsys):
    """Without a ``group`` column the rows of a prompt are one group; a flag replaces the recipe's key."""
    rollouts = write_rollouts(tmp_path / "r.jsonl")
    out = tmp_path / "o.jsonl"
    status, stdout, _ = preview(
        capsys,
        rollouts,
        "--config",
        recipe,
        "--length_penalty_coeff",
        "0",
        "--output",
        out,
        "--png",
        tmp_path / "p.png",
    )
    assert status == 0 and "length coefficient" not in stdout
    shaped = [json.loads(line)["shaped_reward"] for line in out.read_text().splitlines()]
    assert shaped[:6] == pytest.approx([1.0, 1.0, 0.0, 1.0, 1.15 * 0.75, 0.85 * 0.5], abs=1e-12)


def test_bad_config_exits_2_with_the_trainers_message(tmp_path, capsys):
    """The same keys fail with the same text as ``LengthPluginGRPOConfig`` (the trainer's config)."""
    from tests.trl_length_helpers import tiny_config

    rollouts = write_rollouts(tmp_path / "r.jsonl")
    cases = [
        ({"length_penalty": {"default": {"top_percentile": 1.5}}}, "length_penalty.default.top_percentile"),
        (
            {"length_penalty": {"default": {"group_total_coeff": 0.1}}},
            "length_penalty.default.group_total_coeff",
        ),
        (
            {
                "length_penalty": {
                    "profile_band": {"enabled": True, "defaults": {"total": {"a": 20, "b": 10, "f": 1}}}
                }
            },
            "length_penalty.profile_band.defaults.total",
        ),
        (
            {"length_penalty_coeff_warmup_steps": 5},
            "length_penalty_coeff_warmup_steps: needs length_penalty_coeff",
        ),
        ({"length_penalty_coeff": -1.0}, "length_penalty_coeff"),
    ]
    for values, key in cases:
        with pytest.raises(ValueError) as trainer_error:
            tiny_config(tmp_path / "trainer", **values)
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(values))
        status, _, err = preview(capsys, rollouts, "--config", path)
        assert status == 2 and key in err
        assert err == f"trl-length preview: error: {trainer_error.value}\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--length_penalty", '{"default": {"length_type": "token"}}'],
            "length_penalty.default.length_type: ",
        ),
        (["--length_penalty", "{not json"], "length_penalty: not valid JSON"),
        (["--drop_zero_std_groups", "maybe"], "drop_zero_std_groups: Input should be a valid boolean"),
        ([], "the config switches no length shaping on"),
        # issue 31: a JSON key written twice is refused naming the key and both values, as YAML's is
        (
            ["--length_penalty", '{"default": {"total_bonus": 0.1, "total_bonus": 0.3}}'],
            "length_penalty: key 'total_bonus' written twice (values 0.1 and 0.3)",
        ),
        # issue 31: a block that enables an agent but switches no term on printed metrics and exited 0
        (
            ["--length_penalty", '{"default": {"top_percentile": 0.3}}'],
            "the config switches no length shaping on",
        ),
        (["--length_penalty", '{"default": {"enabled": true}}'], "the config switches no length shaping on"),
        (
            ["--length_penalty", '{"default": {"total_bonus": 0.1, "enabled": false}}'],
            "the config switches no length shaping on",
        ),
        (
            ["--length_penalty_coeff", "0.1", "--scale_rewards", "all"],
            "argument --scale_rewards: invalid choice",
        ),
        (["--length_penalty_coeff", "0.1", "--output", "x.csv"], "--output x.csv: preview writes JSONL"),
    ],
)
def test_bad_flags_exit_2_with_one_line(argv, message, tmp_path, capsys):
    status, _, err = preview(capsys, write_rollouts(tmp_path / "r.jsonl"), *argv)
    assert status == 2 and err.startswith("trl-length preview: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_misspelled_recipe_key_and_the_console_command(tmp_path):
    """A near miss of a shaping key is an error (other recipe keys are the trainer's); a real process exits
    2 with one line and no traceback."""
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"length_penalty_cof": 0.5, "learning_rate": 1e-4}))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trl_length_plugin.tools.commands",
            "preview",
            str(write_rollouts(tmp_path / "r.jsonl")),
            "--config",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr == (
        f"trl-length preview: error: {path}: unknown key 'length_penalty_cof'; "
        "did you mean 'length_penalty_coeff'?\n"
    )


def test_duplicate_recipe_key_is_refused_as_the_trainers_cli_refuses_it(tmp_path):
    """``--config`` goes through the trainer CLI's YAML reader: a key written twice is one line naming the
    key and both lines (exit 2), not the second value silently winning."""
    path = tmp_path / "recipe.yaml"
    path.write_text("length_penalty_coeff: 0.1\nlearning_rate: 1.0e-4\nlength_penalty_coeff: 0.5\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trl_length_plugin.tools.commands",
            "preview",
            str(write_rollouts(tmp_path / "r.jsonl")),
            "--config",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"trl-length preview: error: {path}: key 'length_penalty_coeff' written twice (line 1 and line 3)\n"
    )


@pytest.mark.slow
def test_preview_equals_the_trl_trainer(random_model_dir, tmp_path, capsys):
    """One real ``LengthPluginGRPOTrainer`` step (deterministic ``rollout_func``), its rollouts saved in the
    rollout format: ``preview`` gives the trainer's shaped rewards (correctness + its ``length_penalty``
    column) and its advantages."""
    from tests.trl_length_helpers import RecordingTrainer, deterministic_rollout, tiny_config
    from trl_length_plugin.embedded import correctness_reward, load_tokenizer, make_task_dataset

    tokenizer = load_tokenizer(random_model_dir)
    block = {
        "default": {
            "group_total_length_penalty_coeff": 0.2,
            "group_length_penalty_profile_gate": True,
            "profile_band_total": True,
            "total_bonus": 0.05,
            "profiled_length_penalty": 0.1,
            "profiled_length_n_std": 0.0,
        }
    }
    dataset = make_task_dataset(16)
    n = len(dataset)
    dataset = dataset.add_column("prompt_id", list(range(n)))
    dataset = dataset.add_column(
        "profile_band", [{"total": {"a": 12.0 + 4 * (i % 4), "b": 40.0, "f": 0.5}} for i in range(n)]
    )
    dataset = dataset.add_column("profiled_rewards", [[1, 0, 1, 1]] * n)
    dataset = dataset.add_column("profiled_output_lengths", [[14, 30, 18 + i % 5, 22] for i in range(n)])
    args = tiny_config(
        tmp_path / "run", length_penalty=block, length_penalty_coeff=0.5, per_device_train_batch_size=16
    )
    trainer = RecordingTrainer(
        model=str(random_model_dir),
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=deterministic_rollout(tokenizer, 4),
    )
    trainer.train()
    (record,) = trainer.records
    raw = record.rewards_per_func[:, 0].double()
    rollouts = tmp_path / "trl_rollouts.jsonl"
    with rollouts.open("w") as sink:
        for i, (inputs, completion, ids) in enumerate(
            zip(record.inputs, record.completions, record.completion_ids, strict=True)
        ):
            row = {"group": i // 4, "prompt_id": inputs["prompt_id"], "completion": completion}
            sink.write(json.dumps({**row, "reward": float(raw[i]), "completion_tokens": len(ids)}) + "\n")
    dataset.save_to_disk(str(tmp_path / "prompts"))
    out = tmp_path / "shaped.jsonl"
    status, stdout, _ = preview(
        capsys, rollouts, "--length_penalty", json.dumps(block), "--length_penalty_coeff", "0.5",
        "--prompts", tmp_path / "prompts", "--tokenizer", "embedded",
        "--output", out, "--png", tmp_path / "p.png",
    )  # fmt: skip
    assert status == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    shaped = torch.tensor([row["shaped_reward"] for row in written], dtype=torch.float64)
    trl_shaped = raw + record.rewards_per_func[:, 1].double()
    assert not torch.equal(shaped, raw)
    torch.testing.assert_close(shaped, trl_shaped, rtol=0, atol=1e-6)
    advantages = torch.tensor([row["advantage"] for row in written], dtype=torch.float64)
    torch.testing.assert_close(advantages, record.output["advantages"].double(), rtol=0, atol=1e-5)
    logged = trainer.state.log_history[0]
    print(stdout)
    assert (
        f"    {'length_penalty/adjusted_frac':<46} {logged['length_penalty/adjusted_frac']:.6g}\n" in stdout
    )
