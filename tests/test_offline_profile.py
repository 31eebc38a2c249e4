"""``trl-length profile`` through the real command: hand-made rollouts give hand-computed profiles and bands
(docs/reference/length-penalties.md §2.14, §2.10 "passing"), in every input format; too few passing rollouts
give no band, nor do passing lengths too close for ``b > a``; malformed rows are reported with their line,
skipped and counted; an empty or all-malformed file ends with one clear error line."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from trl_length_plugin.embedded import load_tokenizer
from trl_length_plugin.shaping import measure_lengths
from trl_length_plugin.tools import commands

ROWS = [
    # prompt 0: totals 10, 20, 40 (wrong), 30, 50; answers all 2
    {"prompt_id": 0, "prompt": "What is 2 + 3?", "answer": "5",
     "reasoning_tokens": 8, "answer_tokens": 2, "reward": 1},
    {"prompt_id": 0, "reasoning_tokens": 18, "answer_tokens": 2, "reward": 1},
    {"prompt_id": 0, "reasoning_tokens": 38, "answer_tokens": 2, "reward": 0},
    {"prompt_id": 0, "reasoning_tokens": 28, "answer_tokens": 2, "reward": 1},
    {"prompt_id": 0, "reasoning_tokens": 48, "answer_tokens": 2, "reward": 1},
    # prompt 1: two passing rollouts only
    {"prompt_id": 1, "prompt": "What is 7 - 4?", "answer": "3",
     "reasoning_tokens": 5, "answer_tokens": 1, "reward": 1},
    {"prompt_id": 1, "reasoning_tokens": 9, "answer_tokens": 1, "reward": 0},
    {"prompt_id": 1, "reasoning_tokens": 7, "answer_tokens": 3, "reward": 1},
    # a prompt keyed by its text: totals 11, 23, 35, answers 1, 3, 5
    {"prompt": "What is 1 + 1?", "answer": "2", "reasoning_tokens": 10, "answer_tokens": 1, "reward": 1},
    {"prompt": "What is 1 + 1?", "reasoning_tokens": 20, "answer_tokens": 3, "reward": 1},
    {"prompt": "What is 1 + 1?", "reasoning_tokens": 30, "answer_tokens": 5, "reward": 1},
]  # fmt: skip
RULES = ["--band", "total=0.5,0.9,0.8", "--band", "answer=0.25,0.75,0.9", "--min-passing", "3"]
# prompt 0, passing totals 10, 20, 30, 50: q0.5 at position 1.5 = 25; q0.9 at 2.7 = 30 + 0.7 * 20 = 44;
# its answers are all 2, so a = b = 2 and no answer band. The text prompt: passing totals 11, 23, 35:
# q0.5 = 23, q0.9 at 1.8 = 23 + 0.8 * 12 = 32.6; answers 1, 3, 5: q0.25 at 0.5 = 2, q0.75 at 1.5 = 4.
EXPECTED = [
    {
        "profiled_rewards": [1.0, 1.0, 0.0, 1.0, 1.0],
        "profiled_output_lengths": [10, 20, 40, 30, 50],
        "profile_band": {"total": {"a": 25.0, "b": 44.0, "f": 0.8}},
    },
    {"profiled_rewards": [1.0, 0.0, 1.0], "profiled_output_lengths": [6, 10, 10], "profile_band": None},
    {
        "profiled_rewards": [1.0, 1.0, 1.0],
        "profiled_output_lengths": [11, 23, 35],
        "profile_band": {"total": {"a": 23.0, "b": 32.6, "f": 0.8}, "answer": {"a": 2.0, "b": 4.0, "f": 0.9}},
    },
]
METADATA = ("profiled_rewards", "profiled_output_lengths", "profile_band")


def write_jsonl(path, rows, extra_lines=()):
    lines = [json.dumps(row) for row in rows] + list(extra_lines)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def write_rollouts(tmp_path, kind: str):
    """``ROWS`` in one of the four input formats."""
    if kind == "jsonl":
        return write_jsonl(tmp_path / "rollouts.jsonl", ROWS)
    if kind == "csv":
        path = tmp_path / "rollouts.csv"
        names = list(dict.fromkeys(name for row in ROWS for name in row))
        with path.open("w", newline="") as sink:
            writer = csv.DictWriter(sink, names)
            writer.writeheader()
            writer.writerows(ROWS)
        return path
    import datasets

    dataset = datasets.Dataset.from_list(ROWS)
    if kind == "parquet":
        dataset.to_parquet(str(tmp_path / "rollouts.parquet"))
        return tmp_path / "rollouts.parquet"
    dataset.save_to_disk(str(tmp_path / "rollouts"))
    return tmp_path / "rollouts"


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def profile(capsys, *argv) -> tuple[int, str, str]:
    """Run ``trl-length profile`` in this process: (exit status, stdout, stderr)."""
    try:
        commands.main(["profile", *map(str, argv)])
        status = 0
    except SystemExit as done:
        status = done.code
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet", "datasets"])
def test_hand_made_rollouts_give_hand_computed_profiles_and_bands(kind, tmp_path, capsys):
    out = tmp_path / "profiled.jsonl"
    status, stdout, _ = profile(capsys, write_rollouts(tmp_path, kind), "-o", out, *RULES)
    assert status == 0
    rows = read_jsonl(out)
    assert [{k: row[k] for k in METADATA} for row in rows] == [
        {**e, "profile_band": e["profile_band"] and {"answer": None, **e["profile_band"]}} for e in EXPECTED
    ]
    # without --prompts: one row per prompt, its key and prompt columns from its first rollout
    assert [(row["prompt"], row["answer"]) for row in rows] == [
        ("What is 2 + 3?", "5"),
        ("What is 7 - 4?", "3"),
        ("What is 1 + 1?", "2"),
    ]
    assert "11 rows read" in stdout and "11 rollouts of 3 prompts profiled, lengths in tokens" in stdout
    assert (
        "band total: a = q0.5, b = q0.9, f = 0.8 (at least 3 passing): 2 prompts; "
        "none for 1 (fewer than 3 passing: 1)" in stdout
    )
    assert "band answer: a = q0.25, b = q0.75, f = 0.9 (at least 3 passing): 1 prompts; none for 2" in stdout
    assert "b <= a (passing lengths too close): 1" in stdout
    assert (
        "rows skipped: 0" in stdout
        and "wrote 3 prompts" in stdout
        and "3 with a profile, 2 with a band" in stdout
    )


def test_min_passing_and_no_bands(tmp_path, capsys):
    """With ``--min-passing 5`` no prompt has enough passing rollouts; ``--band none`` writes no band."""
    rollouts = write_rollouts(tmp_path, "jsonl")
    for flags, bands in ((["--min-passing", "5"], 0), (["--band", "none"], 0), (["--min-passing", "4"], 1)):
        out = tmp_path / "profiled.jsonl"
        status, stdout, _ = profile(capsys, rollouts, "-o", out, "--overwrite", *flags)  # replaced
        rows = read_jsonl(out)
        assert status == 0 and sum(row["profile_band"] is not None for row in rows) == bands
        assert [row["profiled_output_lengths"] for row in rows] == [
            e["profiled_output_lengths"] for e in EXPECTED
        ]
    assert "fewer than 4 passing: 2" in stdout


def test_the_prompt_dataset_gets_the_columns(tmp_path, capsys):
    """``--prompts``: every prompt row is kept, in order, with the columns where rollouts name it (by id or
    by text, here the embedded task's first rows); rollouts of other prompts are skipped and counted."""
    from trl_length_plugin.embedded import make_task_dataset

    prompts = make_task_dataset(3, seed=0)
    question = prompts[2]["prompt"]
    rows = [{"prompt_id": 0, "reasoning_tokens": n, "answer_tokens": 1, "reward": 1} for n in (3, 5, 7)] + [
        {"prompt": question, "reasoning_tokens": 4, "answer_tokens": 1, "reward": 0},
        {"prompt_id": 9, "reasoning_tokens": 4, "answer_tokens": 1, "reward": 1},
    ]
    out = tmp_path / "prompts"
    rollouts = write_jsonl(tmp_path / "rollouts.jsonl", rows)
    status, stdout, stderr = profile(
        capsys, rollouts, "-o", out, "--prompts", "embedded", "--dataset-size", "3", "--min-passing", "3"
    )
    assert status == 0
    import datasets

    written = datasets.load_from_disk(str(out))
    assert written["prompt"] == prompts["prompt"] and written["answer"] == prompts["answer"]
    assert written["profiled_output_lengths"] == [[4, 6, 8], None, [5]]
    assert written["profiled_rewards"] == [[1.0, 1.0, 1.0], None, [0.0]]
    # passing totals 4, 6, 8: a = 6, b = 6 + 0.8 * 2 (default rule total=0.5,0.9,0.8)
    band = written["profile_band"][0]["total"]
    assert band == {"a": 6.0, "b": pytest.approx(7.6), "f": 0.8} and written["profile_band"][1:] == [
        None,
        None,
    ]
    assert "line 5: prompt not in --prompts; skipped" in stderr
    assert "rows skipped: 1 (prompt not in --prompts: 1)" in stdout and "wrote 3 prompts" in stdout


def test_completion_text_in_chars_and_in_tokens(tmp_path, random_model_dir, capsys):
    """Completions are split and measured like the trainer measures them (reference §2.5)."""
    texts = ["<think>3 + 4 hmm, so 7</think>7", "<think>3 + 4 so 8</think>8", "no tags 7"]
    rows = [
        {"prompt_id": "q", "completion": text, "reward": r} for text, r in zip(texts, (1, 0, 1), strict=True)
    ]
    rollouts = write_jsonl(tmp_path / "rollouts.jsonl", rows)
    status, _, _ = profile(capsys, rollouts, "-o", tmp_path / "chars.jsonl", "--length-type", "chars")
    assert status == 0
    # chars: reasoning "3 + 4 hmm, so 7" 15 + answer 1; "3 + 4 so 8" 10 + 1; all answer: 9
    assert read_jsonl(tmp_path / "chars.jsonl")[0]["profiled_output_lengths"] == [16, 11, 9]
    status, _, _ = profile(capsys, rollouts, "-o", tmp_path / "tokens.jsonl", "--tokenizer", "embedded")
    assert status == 0
    tokens = measure_lengths(texts, "tokens", load_tokenizer(random_model_dir))
    assert read_jsonl(tmp_path / "tokens.jsonl")[0]["profiled_output_lengths"] == tokens.total.tolist()
    status, _, err = profile(capsys, rollouts, "-o", tmp_path / "x.jsonl")
    assert status == 2 and err.strip().splitlines()[-1] == (
        "trl-length profile: error: lengths in tokens need --tokenizer to measure completion text (first at "
        "line 1), or reasoning_tokens and answer_tokens in the rows"
    )


MALFORMED = [
    "{not json",
    "[1, 2]",
    json.dumps({"reasoning_tokens": 1, "answer_tokens": 1, "reward": 1}),
    json.dumps({"prompt_id": 0, "reasoning_tokens": 1, "answer_tokens": 1, "reward": "yes"}),
    json.dumps({"prompt_id": 0, "reasoning_tokens": -1, "answer_tokens": 1, "reward": 1}),
    json.dumps({"prompt_id": 0, "reward": 1}),
    json.dumps({"prompt_id": 0, "reasoning_tokens": 1, "answer_tokens": 1, "reward": None}),
]


def test_malformed_lines_are_reported_skipped_and_counted(tmp_path, capsys):
    good = [json.dumps(row) for row in ROWS[:5]]
    lines = [good[0], *MALFORMED[:3], good[1], "", *MALFORMED[3:], *good[2:]]
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text("\n".join(lines) + "\n")
    out = tmp_path / "profiled.jsonl"
    status, stdout, stderr = profile(capsys, rollouts, "-o", out, *RULES)
    assert status == 0
    assert read_jsonl(out) == [{"prompt_id": 0, "prompt": "What is 2 + 3?", "answer": "5", **EXPECTED[0]}]
    where = f"trl-length profile: {rollouts}: line"
    for number, reason in [
        (2, "not valid JSON"),
        (3, "not a JSON object"),
        (4, "no prompt key (prompt_id or prompt)"),
        (7, "reward must be a finite number or null"),
        (8, "reasoning_tokens must be an integer >= 0"),
        (9, "no completion (completion, or reasoning_tokens and answer_tokens)"),
        (10, "reward is null"),
    ]:
        assert f"{where} {number}: {reason}; skipped" in stderr
    assert "12 rows read" in stdout and "5 rollouts of 1 prompts profiled" in stdout
    assert "rows skipped: 7 (" in stdout and "not valid JSON: 1" in stdout and "reward is null: 1" in stdout


def test_empty_and_all_malformed_files_end_with_one_clear_line(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(MALFORMED[:3]) + "\n")
    cases = {
        empty: f"trl-length profile: error: {empty} holds no rollouts (empty file)",
        bad: f"trl-length profile: error: {bad} holds no valid rollout: 3 rows read, skipped 3 (",
    }
    for path, message in cases.items():
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "trl_length_plugin.tools.commands",
                "profile",
                str(path),
                "-o",
                str(tmp_path / "o.jsonl"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith(message)
        assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--band", "total=0.9,0.5,0.8"],
            "--band 'total=0.9,0.5,0.8': needs 0 <= QA < QB <= 1 and 0 <= F <= 1",
        ),
        (["--band", "middle=0.5,0.9,0.8"], "the channel must be one of total, reasoning, answer"),
        (["--min-passing", "0"], "--min-passing must be >= 1"),
        (["--length-type", "words"], "argument --length-type: invalid choice: 'words'"),
    ],
)
def test_bad_flags_exit_2_with_one_line(flags, message, tmp_path, capsys):
    rollouts = write_rollouts(tmp_path, "jsonl")
    status, _, err = profile(capsys, rollouts, "-o", tmp_path / "o.jsonl", *flags)
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("trl-length profile: error: ") and message in err


def test_a_row_with_a_key_written_twice_is_skipped_and_named(tmp_path, capsys):
    """Issue 42: a JSONL row that writes a key twice (``"reward": 1, ..., "reward": 0``) was read with the second
    value, silently; which one the user meant is unknown, so the row is skipped and the key named."""
    good = [json.dumps(row) for row in ROWS[:5]]
    twice = good[1][:-1] + ', "reward": 0}'
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text("\n".join([good[0], twice, *good[2:]]) + "\n")
    status, stdout, stderr = profile(capsys, rollouts, "-o", tmp_path / "profiled.jsonl", *RULES)
    assert status == 0
    assert f"trl-length profile: {rollouts}: line 2: key 'reward' written twice (values" in stderr
    assert "rows skipped: 1 (" in stdout
