"""bench/bench_efficacy.py without training (issue 14): its arms, the profile columns, resumable runs, the
summary, and that the demo trains the best trade-off docs/efficacy.md names."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
from pathlib import Path

import pytest

from bench import bench_efficacy as bench
from trl_length_plugin.embedded import real_task, tasks
from trl_length_plugin.tools import demo

REPO = Path(__file__).resolve().parents[1]
LOSS_ARMS = {"GSPO", "LUSPO"}


@pytest.mark.parametrize("arm", bench.ARMS, ids=lambda arm: arm.name)
def test_every_arm_builds_a_valid_config(arm, tmp_path):
    from trl_length_plugin.embedded import CPU_RUN_ARGS
    from trl_length_plugin.trl_integration import LengthPluginGRPOConfig

    _, weights = bench.peer_rewards(arm)
    config = LengthPluginGRPOConfig(
        output_dir=str(tmp_path),
        max_steps=tasks.STEPS,
        seed=0,
        **{**tasks.TRAINING, **CPU_RUN_ARGS, "reward_weights": weights, **arm.keys},
    )
    peers = {peer.name for peer in bench.PEER_ARMS}
    assert config.shaping.enabled == (arm.name not in {bench.PLAIN, *LOSS_ARMS, *peers})
    if arm.name in LOSS_ARMS:
        assert config.importance_sampling_level == "sequence"
        assert (config.epsilon, config.epsilon_high) == (2e-3, 2.5e-3)
        assert config.loss_type == {"GSPO": "grpo", "LUSPO": "luspo"}[arm.name]


def test_arms_have_distinct_names_and_files():
    assert len({bench.slug(arm.name) for arm in bench.ARMS}) == len(bench.ARMS)
    assert bench.ARMS[0].name == bench.PLAIN and not bench.ARMS[0].keys


def test_profile_columns_parse_as_valid_metadata():
    from trl_length_plugin.shaping.columns import METADATA_COLUMNS
    from trl_length_plugin.shaping.metadata import parse_prompt_metadata

    dataset = tasks.training_dataset(0, size=64)
    questions = sorted({tasks.question(row) for row in dataset})
    profiles = {
        q: {
            "profiled_rewards": [1, 0, 1],
            "profiled_output_lengths": [10, 30, 14],
            "band": {"a": 11.0, "b": 13.0} if i % 2 else None,
        }
        for i, q in enumerate(questions)
    }
    shaped = bench.with_profiles(dataset, profiles, band_floor=0.2)
    parsed = parse_prompt_metadata(
        [{key: row[key] for key in METADATA_COLUMNS if key in row} for row in shaped]
    )
    assert not parsed.invalid.any()
    for row, bands in zip(shaped, parsed.bands, strict=True):
        if profiles[tasks.question(row)]["band"] is None:
            assert math.isnan(bands[0, 0])
        else:
            assert bands[0].tolist() == [11.0, 13.0, 0.2]
    assert parsed.profiled[0].tolist() == [2, 24, 10**2 + 14**2]  # passing count, sum, sum of squares


def fake_record(arm_name: str, seed: int, steps: int, length: float = 20.0, accuracy: float = 0.4) -> dict:
    return dict(
        arm=arm_name,
        seed=seed,
        settings=bench.settings(bench.ARMS_BY_NAME[arm_name], steps),
        train=dict(length=length, accuracy=accuracy),
        eval=dict(length=length, accuracy=accuracy),
        shaping={},
        curve=[],
        seconds=0.0,
    )


def fake_records(figures: dict[str, list[tuple[float, float]]]) -> list[dict]:
    """One ``fake_record`` per arm and seed from arm -> [(held-out length, accuracy) of seeds 0, 1, ...]."""
    return [
        fake_record(name, seed, 5, length, accuracy)
        for name, runs in figures.items()
        for seed, (length, accuracy) in enumerate(runs)
    ]


def test_run_grid_skips_finished_runs(tmp_path):
    calls = []

    def stub(arm_name, seed, steps, out, task_name):
        assert task_name == "arithmetic"
        calls.append((arm_name, seed, steps))
        return fake_record(arm_name, seed, steps)

    arms = bench.ARMS[:3]
    records = bench.run_grid(arms, [0, 1], 5, tmp_path, run=stub)
    assert len(calls) == len(records) == 6
    assert len(list((tmp_path / "runs").glob("*.json"))) == 6

    calls.clear()
    assert len(bench.run_grid(arms, [0, 1], 5, tmp_path, run=stub)) == 6
    assert calls == []  # every run finished: nothing is redone

    bench.run_path(tmp_path, arms[1].name, 1).unlink()
    bench.run_grid(arms, [0, 1], 5, tmp_path, run=stub)
    assert calls == [(arms[1].name, 1, 5)]  # only the missing run

    calls.clear()
    bench.run_grid(arms[:1], [0], 6, tmp_path, run=stub)
    assert calls == [(bench.PLAIN, 0, 6)]  # other settings: the stored run does not count


def test_a_summary_restores_the_run_store_so_the_grid_trains_only_what_it_lacks(tmp_path):
    calls = []

    def stub(arm_name, seed, steps, out, task_name):
        calls.append((arm_name, seed))
        return fake_record(arm_name, seed, steps)

    arms = bench.ARMS[:2]
    records = [fake_record(arm.name, seed, 5) for arm in arms for seed in (0, 1)]
    summary = bench.write_summary(
        records, [{"eval": {}, "weights": "w1"}] * 2, [0, 1], tmp_path / "runs.json"
    )
    store = tmp_path / "store"
    with pytest.raises(ValueError, match="started from warm model w1, not this machine's w2"):
        bench.restore_runs([summary], store, "w2")  # another warm build: its runs are not these
    bench.run_path(store, arms[0].name, 0).write_text(json.dumps(fake_record(arms[0].name, 0, 5, 99.0)))
    assert bench.restore_runs([summary], store, "w1") == 3  # the stored run of arm 0, seed 0 is kept
    assert json.loads(bench.run_path(store, arms[0].name, 0).read_text())["eval"]["length"] == 99.0
    restored = bench.run_grid(bench.ARMS[:3], [0, 1], 5, store, run=stub)
    assert sorted(calls) == [(bench.ARMS[2].name, 0), (bench.ARMS[2].name, 1)]
    assert len(restored) == 6


def test_summary_changes_are_per_seed_and_the_best_trade_off_keeps_accuracy():
    figures = {  # arm: (held-out length, accuracy) for seeds 0 and 1
        bench.PLAIN: [(20.0, 0.40), (22.0, 0.30)],
        "coefficient 2.0": [(10.0, 0.35), (11.0, 0.26)],  # -50%, -4.5 points: too costly
        "group-relative 1.0": [(13.0, 0.39), (14.3, 0.30)],  # -35%, -0.5 points
        "zMAD z>1 0.3": [(18.0, 0.41), (19.8, 0.31)],  # -10%, +1 point
    }
    records = fake_records(figures)
    rows = bench.summarize(records, [bench.ARMS_BY_NAME[name] for name in figures])
    by_name = {row["arm"].name: row for row in rows}
    assert by_name["group-relative 1.0"]["length_change"][0] == pytest.approx(-35.0)
    assert by_name["group-relative 1.0"]["accuracy_change"][0] == pytest.approx(-0.5)
    assert by_name["coefficient 2.0"]["accuracy_change"][0] == pytest.approx(-4.5)
    assert bench.best_trade_off(rows)["arm"].name == "group-relative 1.0"
    assert [row["arm"].name for row in bench.pareto_front(rows)] == [
        "coefficient 2.0",
        "group-relative 1.0",
        "zMAD z>1 0.3",
    ]
    tables = bench.markdown_tables(rows, [{"eval": {"length": 25.0, "accuracy": 0.4}}])
    assert "| group-relative 1.0 | 13.7 ± 0.9 | -35.0 ± 0.0% | 34.5 ± 6.4 | -0.5 ± 0.7 |" in tables


def best_arms(task: tasks.Task) -> tuple[str, str]:
    """The best arm of ours and the best peer arm of ``task``'s committed grid summary, by the best-trade-off
    rule."""
    stored_task, _, rows = bench.stored_rows(json.loads((REPO / "docs" / task.grid_summary).read_text()))
    assert stored_task is task
    ours, peers = ([r for r in rows if bench.is_peer(r["arm"]) == peer] for peer in (False, True))
    return bench.best_trade_off(ours)["arm"].name, bench.best_trade_off(peers)["arm"].name


def test_the_real_overthinking_task_names_its_grids_best_arms():
    """As the embedded tasks do: ``best_name`` and ``best_peer`` are what its committed grid gives."""
    task = real_task.REAL_OVERTHINKING
    assert best_arms(task) == (task.best_name, task.best_peer)
    assert bench.arms_by_name(task)[task.best_name].keys == task.best_keys


@pytest.mark.parametrize("task", list(tasks.TASKS.values()), ids=lambda task: task.name)
def test_demo_trains_each_tasks_best_trade_off_and_prints_the_grids_rows(task):
    """The demo's best arm (of ours) and best peer of each task are those the committed grid summary gives by
    the best-trade-off rule, and the demo finds their seed-0 rows (with plain GRPO's) in that summary."""
    assert bench.arms_by_name(task)[task.best_name].keys == task.best_keys
    assert best_arms(task) == (task.best_name, task.best_peer)
    grid = demo.grid_rows(task, 0, tasks.STEPS)
    assert list(grid) == [demo.PLAIN_NAME, task.best_name, task.best_peer]
    assert all(record["seed"] == 0 and {"train", "eval"} <= set(record) for record in grid.values())
    assert demo.grid_rows(task, 0, tasks.STEPS + 1) == {}
    # a LoRA run is another run
    assert demo.grid_rows(dataclasses.replace(task, lora=16), 0, tasks.STEPS) == {}
    text = (REPO / "docs" / "efficacy.md").read_text()
    arithmetic = text.index("## The arithmetic task")
    section = text[arithmetic:] if task is tasks.ARITHMETIC else text[:arithmetic]
    assert f"**{task.best_name}**" in section and task.best_peer in section


def test_peer_arms_add_their_reward_functions_with_the_runs_settings():
    functions, weights = bench.peer_rewards(bench.ARMS_BY_NAME["TRL soft overlong buffer L/4"])
    (overlong,) = functions
    assert weights == [1.0, 1.0]
    assert (overlong.max_completion_len, overlong.soft_punish_cache) == (bench.MAX_LEN, bench.MAX_LEN // 4)
    functions, weights = bench.peer_rewards(bench.ARMS_BY_NAME["TRL cosine"])
    assert weights == [0.0, 1.0] and functions[0].__name__ == "cosine_reward"
    assert bench.peer_rewards(bench.ARMS_BY_NAME[bench.PLAIN]) == ([], [1.0])
    mask = bench.ARMS_BY_NAME["TRL truncation mask budget 2L/3"]
    assert mask.keys == {"mask_truncated_completions": True, "max_completion_length": 2 * bench.MAX_LEN // 3}


def test_paired_interval_is_the_percentile_bootstrap_of_the_seed_mean():
    assert bench.paired_interval([3.0, 3.0, 3.0]) == (3.0, 3.0, 3.0)
    # two seeds: resampled means are 0, 5 or 10 with probabilities 1/4, 1/2, 1/4
    mean, low, high = bench.paired_interval([0.0, 10.0])
    assert (mean, low, high) == (5.0, 0.0, 10.0)
    mean, low, high = bench.paired_interval([-4.0, -5.0, -6.0, -3.0, -7.0, -5.5, -4.5, -6.5, -5.0, -3.5])
    assert mean == pytest.approx(-5.0) and -6.0 < low < mean < high < -4.0
    assert bench.separates((mean, low, high)) and not bench.separates((0.5, -1.0, 2.0))


def test_interval_table_says_whether_each_claim_separates():
    figures = {
        bench.PLAIN: [(20.0, 0.40), (22.0, 0.30), (21.0, 0.35)],
        "group-relative 1.0": [(13.0, 0.39), (14.3, 0.31), (14.0, 0.35)],
    }
    records = fake_records(figures)
    rows = bench.summarize(records, [bench.ARMS_BY_NAME[name] for name in figures])
    length = rows[1]["length_interval"]
    assert length[0] == pytest.approx(100 * ((13 / 20 + 14.3 / 22 + 14 / 21) / 3 - 1))
    tables = bench.markdown_tables(rows, [{"eval": {"length": 25.0, "accuracy": 0.4}}])
    line = next(line for line in tables.splitlines() if line.startswith("| group-relative 1.0 | 3 |"))
    assert line.endswith("| length separates from 0, accuracy within noise |")
    assert bench.paired_difference(records, "group-relative 1.0", bench.PLAIN, "accuracy")[
        0
    ] == pytest.approx(0.0)


def test_summary_file_regenerates_the_tables_without_training(tmp_path):
    records = [
        fake_record(name, seed, 5, length + seed, accuracy)
        for name, length, accuracy in ((bench.PLAIN, 20.0, 0.4), ("group-relative 1.0", 14.0, 0.38))
        for seed in range(3)
    ]
    warm = [{"eval": {"length": 25.0, "accuracy": 0.4}}] * 3
    summary = bench.write_summary(records, warm, [0, 1, 2], tmp_path / "runs.json")
    bench.main(
        ["--from-summary", str(summary), "--out", str(tmp_path / "out"), "--png", str(tmp_path / "p.png")]
    )
    expected = bench.markdown_tables(
        bench.summarize(records, bench.ARMS[:1] + [bench.ARMS_BY_NAME["group-relative 1.0"]]), warm
    )
    assert (tmp_path / "out" / "table.md").read_text() == expected + "\n"
    assert (tmp_path / "p.png").stat().st_size > 10_000


#: an arithmetic run's stored settings as the grid wrote them before the task switch (copied from that code's
#: output): stored arithmetic runs and warm profiles must stay valid
ARITHMETIC_TRAINING = {
    "per_device_train_batch_size": 32,
    "num_generations": 8,
    "max_completion_length": 48,
    "temperature": 1.0,
    "learning_rate": 0.0001,
    "lr_scheduler_type": "constant",
}


def test_arithmetic_settings_are_unchanged_by_the_task_switch():
    soft = bench.ARMS_BY_NAME["TRL soft overlong buffer L/4"]
    expected = {
        "keys": {},
        "rewards": [["soft_overlong_reward", {"cache": 12}]],
        "correctness_weight": 1.0,
        "band_floor": None,
        "profile_samples": None,
        "steps": 60,
        "training": ARITHMETIC_TRAINING,
        "eval_samples": 64,
    }
    assert bench.settings(soft, 60) == bench.settings(soft, 60, tasks.ARITHMETIC) == expected
    band = bench.ARMS_BY_NAME["profile band f 0.2"]
    assert bench.settings(band, 60) == {
        **expected,
        "keys": {"length_penalty": {"default": {"profile_band_total": True}}},
        "rewards": [],
        "band_floor": 0.2,
        "profile_samples": 16,
    }
    assert bench.warm_settings() == {
        "eval_samples": 64,
        "profile_samples": 16,
        "training": ARITHMETIC_TRAINING,
    }


def test_reasoning_settings_name_their_task_and_longer_completions():
    soft = bench.arms_by_name(tasks.REASONING)["TRL soft overlong buffer L/4"]
    stored = bench.settings(soft, 60, tasks.REASONING)
    assert stored["task"] == "reasoning"
    assert stored["rewards"] == [["soft_overlong_reward", {"cache": 16}]]  # L/4 of 64 tokens
    assert stored["training"] == {
        **ARITHMETIC_TRAINING,
        "max_completion_length": 64,
        "shuffle_dataset": False,
    }
    assert bench.warm_settings(tasks.REASONING)["task"] == "reasoning"
    assert bench.warm_settings(tasks.REASONING) != bench.warm_settings()


def test_a_stored_run_of_one_task_is_not_reused_for_the_other(tmp_path):
    calls = []

    def stub(arm_name, seed, steps, out, task_name):
        calls.append((arm_name, task_name))
        task = tasks.TASKS[task_name]
        record = fake_record(arm_name, seed, steps)
        return {**record, "settings": bench.settings(bench.arms_by_name(task)[arm_name], steps, task)}

    plain = bench.ARMS[:1]
    bench.run_grid(plain, [0], 5, tmp_path, run=stub)
    bench.run_grid(plain, [0], 5, tmp_path, run=stub, task=tasks.REASONING)
    bench.run_grid(plain, [0], 5, tmp_path, run=stub, task=tasks.REASONING)
    assert calls == [(bench.PLAIN, "arithmetic"), (bench.PLAIN, "reasoning")]  # the third finds its run
    assert bench.finished(tmp_path, plain[0], 0, 5, tasks.ARITHMETIC) is None  # overwritten by reasoning


@pytest.mark.parametrize("task", list(tasks.TASKS.values()), ids=lambda task: task.name)
def test_every_arm_of_each_task_builds_a_valid_config_at_its_length(task, tmp_path):
    from trl_length_plugin.embedded import CPU_RUN_ARGS
    from trl_length_plugin.trl_integration import LengthPluginGRPOConfig

    arms = bench.TASK_ARMS[task.name]
    assert [arm.name for arm in arms] == [arm.name for arm in bench.ARMS]  # the same grid on every task
    for arm in arms:
        functions, weights = bench.peer_rewards(arm, task)
        config = LengthPluginGRPOConfig(
            output_dir=str(tmp_path),
            max_steps=tasks.STEPS,
            seed=0,
            **{**task.training, **CPU_RUN_ARGS, "reward_weights": weights, **arm.keys},
        )
        assert len(weights) == 1 + len(functions)
        if "budget 2L/3" in arm.name:
            assert config.max_completion_length == 2 * task.max_length // 3
        else:
            assert config.max_completion_length == task.max_length
        assert config.shuffle_dataset == (task is tasks.ARITHMETIC)
    curriculum = bench.arms_by_name(task)["overlong curriculum L to 3L/4"].keys
    (shrink,) = curriculum["length_schedule"]
    assert [stage["value"] for stage in shrink["stages"]] == [task.max_length, 7 * task.max_length // 8]
    assert curriculum["length_penalty"]["default"]["overlong_max_length"] == 3 * task.max_length // 4
    (overlong,) = bench.peer_rewards(bench.arms_by_name(task)["TRL soft overlong buffer L/2"], task)[0]
    assert (overlong.max_completion_len, overlong.soft_punish_cache) == (
        task.max_length,
        task.max_length // 2,
    )


def level_record(arm_name: str, seed: int, levels: list[tuple[float, float, float, float]]) -> dict:
    """A reasoning-task record whose held-out levels 1.. have (accuracy, length, skipped, redundant)."""
    figures = [
        dict(level=k, samples=64, accuracy=a, length=n, skipped=s, redundant=r)
        for k, (a, n, s, r) in enumerate(levels, start=1)
    ]
    record = fake_record(arm_name, seed, 5)
    record["eval"] = dict(
        length=statistics.fmean(f["length"] for f in figures),
        accuracy=statistics.fmean(f["accuracy"] for f in figures),
        levels=figures,
    )
    return record


def test_per_level_summary_averages_seeds_and_makes_a_table():
    records = [
        level_record(bench.PLAIN, 0, [(0.9, 14.0, 0.05, 0.2), (0.5, 30.0, 0.1, 0.0)]),
        level_record(bench.PLAIN, 1, [(0.8, 16.0, 0.15, 0.4), (0.6, 28.0, 0.3, 0.1)]),
        level_record("group-relative 1.0", 0, [(0.9, 12.0, 0.0, 0.0), (0.4, 22.0, 0.5, 0.0)]),
        level_record("group-relative 1.0", 1, [(1.0, 12.0, 0.0, 0.0), (0.3, 20.0, 0.7, 0.0)]),
    ]
    rows = bench.summarize(
        records, [bench.ARMS_BY_NAME[bench.PLAIN], bench.ARMS_BY_NAME["group-relative 1.0"]]
    )
    plain, best = rows[0]["levels"], rows[1]["levels"]
    assert [f["level"] for f in plain] == [1, 2]
    assert plain[0] == pytest.approx(dict(level=1, accuracy=85.0, length=15.0, skipped=10.0, redundant=0.3))
    assert best[1] == pytest.approx(dict(level=2, accuracy=35.0, length=21.0, skipped=60.0, redundant=0.0))
    warm = [{"eval": records[0]["eval"]}]
    tables = bench.markdown_tables(rows, warm)
    assert "| arm | level 1: accuracy / length / skipping / redundant | level 2: accuracy" in tables
    assert "| warm start, before RL | 90.0 / 14.0 / 5.0 / 0.20 | 50.0 / 30.0 / 10.0 / 0.00 |" in tables
    assert "| group-relative 1.0 | 95.0 / 12.0 / 0.0 / 0.00 | 35.0 / 21.0 / 60.0 / 0.00 |" in tables


def test_no_level_table_for_records_without_levels():
    records = [fake_record(bench.PLAIN, seed, 5) for seed in range(2)]
    rows = bench.summarize(records, bench.ARMS[:1])
    assert rows[0]["levels"] is None
    tables = bench.markdown_tables(rows, [{"eval": {"length": 25.0, "accuracy": 0.4}}])
    assert "level" not in tables and tables.count("\n|---|") == 3


def test_held_out_figures_read_the_reasoning_levels_with_step_report():
    from trl_length_plugin.embedded.reasoning import make_reasoning_dataset, shortest_completion

    dataset = make_reasoning_dataset(4, seed=3, levels=(1, 3))
    level_1 = next(i for i, level in enumerate(dataset["level"]) if level == 1)
    level_3 = next(i for i, level in enumerate(dataset["level"]) if level == 3)
    lean = shortest_completion(tasks.question(dataset[level_3]))
    first_step = lean.split(", ")[0]
    completions = [
        dict(row=level_1, text=shortest_completion(tasks.question(dataset[level_1])), tokens=12, correct=1.0),
        dict(row=level_3, text=lean, tokens=26, correct=1.0),
        dict(
            row=level_3,
            text=f"{first_step}, {first_step.removeprefix('<think>')}, so 4</think>4",
            tokens=20,
            correct=0.0,
        ),
    ]
    figures = tasks.held_out_figures(completions, dataset)
    assert figures["length"] == pytest.approx(58 / 3) and figures["accuracy"] == pytest.approx(2 / 3)
    assert figures["levels"] == [
        dict(level=1, samples=1, length=12.0, accuracy=1.0, skipped=0.0, redundant=0.0),
        dict(level=3, samples=2, length=23.0, accuracy=0.5, skipped=0.5, redundant=0.5),
    ]
    arithmetic = tasks.held_out_figures(
        [dict(row=0, text="", tokens=10, correct=0.0)], tasks.held_out_dataset()
    )
    assert arithmetic == dict(length=10.0, accuracy=0.0)


def test_demo_parses_its_task():
    args = demo.parse_args(["--task", "arithmetic", "--steps", "5"])
    assert (args.task, args.steps, args.output_dir) == ("arithmetic", 5, "outputs/demo-arithmetic")
    args = demo.parse_args([])
    assert (args.task, args.steps, args.output_dir) == ("overthinking", tasks.STEPS, "outputs/demo")
    assert demo.parse_args(["--task", "arithmetic", "--output-dir", "x"]).output_dir == "x"
    with pytest.raises(SystemExit):
        demo.parse_args(["--task", "chess"])


@pytest.mark.parametrize("steps", ["0", "-1"])
def test_the_demo_refuses_steps_below_one_in_one_line(steps, capsys):
    """Issue 42: ``--steps 0`` or ``-1`` became TRL's ``max_steps`` (<= 0: train by epochs, for hours)."""
    with pytest.raises(SystemExit) as ended:
        demo.parse_args(["--steps", steps])
    assert ended.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"python -m trl_length_plugin.tools.demo: error: --steps: at least 1, got {steps}"
    ]


def test_reasoning_task_trains_on_level_blocks_and_keeps_held_out_problems_apart():
    task = tasks.REASONING
    train, held_out = task.training_set(0), task.held_out()
    assert len(train) == tasks.REASONING_TRAINING_SIZE
    assert task.training["shuffle_dataset"] is False
    prompts_per_step = task.training["per_device_train_batch_size"] // task.training["num_generations"]
    levels = train["level"]
    assert all(
        sorted(levels[i : i + prompts_per_step]) == [1, 2, 3, 4]
        for i in range(0, len(levels), prompts_per_step)
    )
    assert not {tasks.question(row) for row in train} & {tasks.question(row) for row in held_out}


def test_a_reasoning_summary_regenerates_its_level_table(tmp_path):
    records = [
        {
            **level_record(name, seed, [(0.9 - 0.1 * seed, 14.0, 0.1, 0.2), (0.5, 30.0 - seed, 0.2, 0.1)]),
            "settings": bench.settings(bench.arms_by_name(tasks.REASONING)[name], 5, tasks.REASONING),
        }
        for name in (bench.PLAIN, "TRL truncation mask budget 2L/3")
        for seed in range(2)
    ]
    warm = [{"eval": records[0]["eval"]}] * 2
    summary = bench.write_summary(records, warm, [0, 1], tmp_path / "runs.json")
    bench.main(
        ["--from-summary", str(summary), "--out", str(tmp_path / "out"), "--png", str(tmp_path / "p.png")]
    )
    table = (tmp_path / "out" / "table.md").read_text()
    assert (
        "| TRL truncation mask budget 2L/3 | 85.0 / 14.0 / 10.0 / 0.20 | 50.0 / 29.5 / 20.0 / 0.10 |" in table
    )
    assert (
        bench.arms_by_name(tasks.REASONING)["TRL truncation mask budget 2L/3"].keys["max_completion_length"]
        == 42
    )


def test_versus_peers_pairs_each_of_ours_with_each_peer_per_seed():
    figures = {  # held-out (length, accuracy) for seeds 0-2
        bench.PLAIN: [(20.0, 0.40), (22.0, 0.30), (21.0, 0.35)],
        "group-relative 1.0": [(13.0, 0.39), (14.3, 0.31), (14.0, 0.35)],
        "TRL soft overlong buffer L/4": [(19.5, 0.40), (20.9, 0.30), (19.95, 0.36)],
    }
    records = fake_records(figures)
    rows = bench.summarize(records, [bench.ARMS_BY_NAME[name] for name in figures])
    table = bench.versus_peers(records, rows)
    (line,) = [line for line in table.splitlines() if line.startswith("| group-relative 1.0 |")]
    length = 100 * ((13 / 19.5 + 14.3 / 20.9 + 14 / 19.95) / 3 - 1)
    assert f"| {length:+.1f} [" in line and line.endswith("| shorter, accuracy tie |")
    assert bench.common_seeds(records, "group-relative 1.0", bench.PLAIN) == [0, 1, 2]
    assert bench.versus_peers(records, rows[:2]) == ""  # no peer arm ran


def test_target_arms_ask_each_prompt_for_its_profiled_target_and_held_out_for_its_levels_median():
    from trl_length_plugin.embedded import reasoning

    train = reasoning.make_reasoning_dataset(8, seed=3)
    held_out = reasoning.make_reasoning_dataset(4, seed=4)
    a_values = [10.4, 20.6, 30.0, 11.0, 21.0, 31.0, None, 40.0]
    profiles = {
        tasks.question(row): {"band": None if a is None else {"a": a, "b": a + 5}}
        for row, a in zip(train, a_values, strict=True)
    }
    arm = bench.arms_by_name(tasks.REASONING)["L1 target max 0.05"]
    assert (
        bench.uses_profiles(arm)
        and bench.settings(arm, 60, tasks.REASONING)["target_prompt"] == arm.target_prompt
    )
    trained, asked = bench.with_targets(train, held_out, profiles, arm.target_prompt)
    assert trained["target_length"] == [10, 21, 30, 11, 21, 31, None, 40]
    first = trained[0]["prompt"][-1]["content"]
    assert first == f"{tasks.question(train[0])} Think for maximum 10 tokens."
    assert tasks.question(trained[6]) == tasks.question(train[6])  # no target: the prompt is unchanged
    medians = {}
    for target, level in zip(trained["target_length"], train["level"], strict=True):
        if target is not None:
            medians.setdefault(level, []).append(target)
    expected = [
        round(statistics.median(medians[level])) if level in medians else None for level in held_out["level"]
    ]
    assert asked["target_length"] == expected
    plain = bench.arms_by_name(tasks.REASONING)[bench.PLAIN]
    assert "target_prompt" not in bench.settings(plain, 60, tasks.REASONING)  # stored runs stay valid


def test_the_pinned_warm_model_is_the_one_the_grid_starts_from(tmp_path, monkeypatch):
    """bench/warm_models holds the reasoning and overthinking warm models under the cache names
    ``embedded_model_dir`` looks up (scripts/setup.sh copies them into the cache), and each is the model its
    committed grid summaries were trained from. A recipe change (a new cache key) fails here until the model is
    rebuilt and pinned again."""
    import shutil

    from trl_length_plugin.embedded import embedded_model_dir

    pinned = [path for path in (REPO / "bench" / "warm_models").iterdir() if path.is_dir()]
    for path in pinned:
        shutil.copytree(path, tmp_path / path.name)
    monkeypatch.setenv("TRL_LENGTH_PLUGIN_CACHE", str(tmp_path))
    summaries = [
        (tasks.REASONING, (tasks.REASONING.grid_summary, "efficacy_reasoning_runs.json")),
        (tasks.OVERTHINKING, (tasks.OVERTHINKING.grid_summary,)),
    ]
    found = {
        task.name: embedded_model_dir(warm_start=True, seed=task.warm_seed, task=task.name)
        for task, _ in summaries
    }
    assert sorted(path.name for path in found.values()) == sorted(path.name for path in pinned)
    for task, names in summaries:
        for name in names:
            summary = json.loads((REPO / "docs" / name).read_text())
            assert {warm["weights"] for warm in summary["warm"]} == {bench.warm_weights(task, 0)}
            assert summary.get("model", found[task.name].name) == found[task.name].name


def test_the_real_task_draws_one_step_problems_apart_from_its_held_out_ones():
    held_out = [tasks.question(row) for row in real_task.real_held_out()]
    assert len(held_out) == len(set(held_out)) == real_task.REAL_HELD_OUT
    training = real_task.real_training_set(0)
    assert not set(map(tasks.question, training)) & set(held_out)
    assert (
        real_task.real_training_set(0)["prompt"]
        == training["prompt"]
        != real_task.real_training_set(1)["prompt"]
    )
    for row in training:
        a, op, b = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\?", tasks.question(row)).groups()
        assert 2 <= int(a) <= 20 and 2 <= int(b) <= 20
        assert int(row["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b)) >= 0


def test_the_real_task_scores_the_last_number_and_logs_it_under_its_own_name():
    completions = ["6 + 20 = 26.", "It is 25", "26 apples, or 3 boxes", "twenty-six"]
    assert real_task.last_number_correctness(completions, ["26"] * 4) == [1.0, 0.0, 0.0, 0.0]
    assert real_task.REAL.accuracy_key == "rewards/last_number_correctness/mean"
    assert tasks.ARITHMETIC.accuracy_key == tasks.REASONING.accuracy_key == demo.ACCURACY_KEY
    assert real_task.REAL.max_length == 48 and real_task.REAL.training["temperature"] == 0.7
    assert (
        set(real_task.GRID_TASKS) == {*tasks.TASKS, "real", "real-overthinking"} and "real" not in tasks.TASKS
    )  # not a demo task


def test_the_real_tasks_stored_settings_name_it_and_its_samples():
    plain = bench.arms_by_name(real_task.REAL)[bench.PLAIN]
    stored = bench.settings(plain, 30, real_task.REAL)
    assert (stored["task"], stored["eval_samples"], stored["training"]) == (
        "real",
        8,
        real_task.REAL_TRAINING,
    )
    assert bench.warm_settings(real_task.REAL, profiled=False)["profile_samples"] == 0
    assert bench.warm_settings(tasks.REASONING) == bench.warm_settings(tasks.REASONING, profiled=True)
    assert bench.described(real_task.REAL) == "smollm2-135m-instruct, one-step arithmetic"


def test_a_lora_tasks_runs_store_the_rank_and_others_stay_as_they_were():
    """A task that trains a LoRA adapter stores its rank (a stored run of the full weights is redone); every other
    task's stored settings are unchanged, so their runs stay valid."""
    plain = bench.arms_by_name(real_task.REAL_OVERTHINKING)[bench.PLAIN]
    full = dataclasses.replace(real_task.REAL_OVERTHINKING, lora=0)
    adapter = dataclasses.replace(real_task.REAL_OVERTHINKING, lora=16)
    assert "lora" not in bench.settings(plain, 30, full)
    for task in (*tasks.TASKS.values(), real_task.REAL):
        assert task.lora == 0 and "lora" not in bench.settings(
            bench.arms_by_name(task)[bench.PLAIN], 30, task
        )
    assert bench.settings(plain, 30, adapter) == {**bench.settings(plain, 30, full), "lora": 16}
    config = adapter.peft_config()
    assert (config.r, config.lora_alpha, config.target_modules) == (16, 32, "all-linear")
    assert full.peft_config() is None


@pytest.mark.slow
def test_a_grid_run_of_a_lora_task_trains_the_adapter(tmp_path):
    """The grid's run (``demo.train_arm``, ``demo.evaluate_arm``) of a task with ``lora`` trains through TRL's
    ``peft_config`` and samples the held-out problems with the adapter (one step on the embedded reasoning
    task)."""
    task = dataclasses.replace(
        tasks.REASONING,
        lora=4,
        eval_samples=1,
        training={**tasks.REASONING.training, "per_device_train_batch_size": 8},
    )
    from transformers import TrainerCallback

    trained = []

    class Seen(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            trained.append(model.peft_config["default"].r)

    result = demo.evaluate_arm(demo.train_arm({}, 0, 1, tmp_path, callbacks=[Seen()], task=task), task)
    assert trained == [4]
    assert [row["step"] for row in result["history"] if "loss" in row] == [1]
    assert sum(level["samples"] for level in result["eval"]["levels"]) == len(task.held_out())
    assert 0 <= result["eval"]["accuracy"] <= 1


def test_the_peers_score_the_real_task_with_its_own_correctness():
    """Kimi's reward and TRL's cosine read correctness: on the real task, the last number (not the embedded
    task's ``<think>`` format, which no completion of the real model has)."""
    arms = bench.arms_by_name(real_task.REAL)
    (kimi,), _ = bench.peer_rewards(arms["Kimi k1.5 length reward 1.0"], real_task.REAL)
    completions, ids = ["It is 26."] + ["27"] * 7, [[0] * 3] + [[0] * 9] * 7
    assert kimi(completions=completions, completion_ids=ids, answer=["26"] * 8) == [0.5] + [-0.5] * 7
    (cosine,), weights = bench.peer_rewards(arms["TRL cosine"], real_task.REAL)
    assert weights == [0.0, 1.0] and cosine(completions=["26"], completion_ids=[[0]], answer=["26"])[0] > 0.5
