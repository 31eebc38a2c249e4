"""The offline tools lose nothing (issue 19 §2), through the real commands: an output that resolves to an
input (a symlink, ``..``, a hard link, a directory holding it) is refused; an existing output is replaced
only with ``--overwrite``, through a temporary file renamed at the end (a failed write leaves the old one
whole); text that is not UTF-8 is an error naming file and line, or skipped and counted behind a flag, and a
BOM is accepted; rows of one ``prompt_id`` that disagree are an error; bad flags, counts and column types
are one line with exit status 2. The CLI cases that matter most also run as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.test_offline_preview import preview
from tests.test_offline_preview import write_rollouts as write_preview_rollouts
from tests.test_offline_profile import EXPECTED, METADATA, ROWS, RULES, profile, read_jsonl, write_jsonl
from trl_length_plugin.offline.outputs import replacing

COEFF = ("--length_penalty_coeff", "0.5")


def command(*argv, cwd=None) -> subprocess.CompletedProcess:
    """``trl-length ARGV`` as a real process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "trl_length_plugin.tools.commands", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env=env,
    )


def one_error(stderr: str, prog: str) -> str:
    """The one error line of ``stderr`` (a progress bar may precede it), no traceback."""
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0] == stderr.strip().splitlines()[-1]
    assert errors[0].startswith(f"trl-length {prog}: error: ")
    return errors[0]


def profiled(out) -> list[dict]:
    return [{k: row[k] for k in METADATA} for row in read_jsonl(out)]


# -- outputs --------------------------------------------------------------------------------------------
def test_an_output_that_resolves_to_an_input_is_refused(tmp_path, capsys):
    rollouts = write_jsonl(tmp_path / "rollouts.jsonl", ROWS)
    before = rollouts.read_bytes()
    (tmp_path / "link.jsonl").symlink_to(rollouts)
    os.link(rollouts, tmp_path / "hard.jsonl")
    (tmp_path / "sub").mkdir()
    cases = {
        rollouts: "is the input",
        tmp_path / "link.jsonl": "is the input",
        tmp_path / "sub" / ".." / "rollouts.jsonl": "is the input",
        tmp_path / "hard.jsonl": "is the input",
        tmp_path: "holds the input",  # a directory output would replace the folder holding the rollouts
    }
    for out, message in cases.items():
        status, _, err = profile(capsys, rollouts, "-o", out, "--overwrite")
        assert status == 2 and f"--output {out} {message} {rollouts}: write it to another path" in err
        assert len(err.strip().splitlines()) == 1
    assert rollouts.read_bytes() == before and (tmp_path / "hard.jsonl").read_bytes() == before
    # the prompt dataset is an input too, and so is a datasets directory an output would land in
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt_id": 0, "prompt": "What is 2 + 3?"}])
    status, _, err = profile(capsys, rollouts, "-o", prompts, "--prompts", prompts, "--overwrite")
    assert status == 2 and f"is the input {prompts}" in err
    import datasets

    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    status, _, err = profile(capsys, tmp_path / "saved", "-o", tmp_path / "saved" / "out.jsonl")
    assert status == 2 and f"is inside the input {tmp_path / 'saved'}" in err


def test_preview_outputs_are_not_its_inputs_nor_each_other(tmp_path, capsys):
    """The issue's case: ``preview R --output R`` emptied R while printing "wrote 9 rows"."""
    rollouts = write_preview_rollouts(tmp_path / "r.jsonl")
    before = rollouts.read_bytes()
    png = tmp_path / "p.png"
    (tmp_path / "link.png").symlink_to(rollouts)
    for argv, message in [
        (["--output", rollouts, "--png", png], f"--output {rollouts} is the input {rollouts}"),
        (["--png", tmp_path / "link.png"], f"--png {tmp_path / 'link.png'} is the input {rollouts}"),
        (["--png", png, "--output", png.with_suffix(".jsonl")], None),
    ]:
        status, _, err = preview(capsys, rollouts, *COEFF, *argv)
        if message is None:
            assert status == 0
            continue
        assert status == 2 and message in err and len(err.strip().splitlines()) == 1
    assert rollouts.read_bytes() == before
    done = command("preview", rollouts, *COEFF, "--output", rollouts, "--png", tmp_path / "q.png")
    assert done.returncode == 2 and "is the input" in one_error(done.stderr, "preview")
    assert rollouts.read_bytes() == before and not (tmp_path / "q.png").exists()


def test_an_existing_output_is_replaced_only_with_overwrite(tmp_path, capsys):
    rollouts = write_jsonl(tmp_path / "rollouts.jsonl", ROWS)
    out = tmp_path / "profiled.jsonl"
    out.write_text("old\n")
    status, _, err = profile(capsys, rollouts, "-o", out, *RULES)
    assert (
        status == 2
        and err == f"trl-length profile: error: --output {out} exists: pass --overwrite to replace it\n"
    )
    assert out.read_text() == "old\n"
    status, _, _ = profile(capsys, rollouts, "-o", out, *RULES, "--overwrite")
    assert status == 0 and profiled(out)[0]["profiled_output_lengths"] == [10, 20, 40, 30, 50]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profiled.jsonl", "rollouts.jsonl"]  # no temporary
    # preview: its PNG (the default name too) and its rows
    png = tmp_path / "length_preview.png"
    png.write_bytes(b"old")
    rows = write_preview_rollouts(tmp_path / "r.jsonl")
    status, _, err = preview(capsys, rows, *COEFF, "--png", png)
    assert status == 2 and f"--png {png} exists: pass --overwrite to replace it" in err
    assert png.read_bytes() == b"old"
    status, _, _ = preview(capsys, rows, *COEFF, "--png", png, "--overwrite")
    assert status == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_dataset_directory_is_replaced_whole_and_no_other_directory(tmp_path, capsys):
    import datasets

    rollouts = write_jsonl(tmp_path / "rollouts.jsonl", ROWS)
    out = tmp_path / "profiled"
    assert profile(capsys, rollouts, "-o", out, *RULES)[0] == 0
    (out / "stale.txt").write_text("from the old dataset")
    status, _, _ = profile(capsys, rollouts, "-o", out, "--band", "none", "--overwrite")
    assert status == 0 and not (out / "stale.txt").exists()
    assert datasets.load_from_disk(str(out))["profile_band"] == [None, None, None]
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep")
    status, _, err = profile(capsys, rollouts, "-o", other, "--overwrite")
    assert status == 2 and f"--output {other} is a directory that is not a saved dataset: not replaced" in err
    assert (other / "mine.txt").read_text() == "keep"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_failed_write_leaves_the_old_output_whole(tmp_path, capsys, monkeypatch):
    """The write is interrupted half-way (a ``KeyboardInterrupt`` after some bytes): the old file is
    untouched and the temporary file is gone; the same for a directory and for ``replacing`` itself."""
    import datasets

    rollouts = write_jsonl(tmp_path / "rollouts.jsonl", ROWS)
    out = tmp_path / "profiled.jsonl"
    out.write_text("old\n")

    def interrupted(self, path, **kwargs):
        with open(path, "w") as sink:
            sink.write('{"profiled_rewards": [1.0,')
        raise KeyboardInterrupt

    monkeypatch.setattr(datasets.Dataset, "to_json", interrupted)
    with pytest.raises(KeyboardInterrupt):
        profile(capsys, rollouts, "-o", out, "--overwrite")
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profiled.jsonl", "rollouts.jsonl"]
    saved = tmp_path / "saved"
    with replacing(saved) as temporary:
        temporary.mkdir()
        (temporary / "dataset_info.json").write_text("{}")
    for target, make in ((out, lambda t: t.write_text("new")), (saved, lambda t: t.mkdir())):
        with pytest.raises(RuntimeError), replacing(target) as temporary:
            make(temporary)
            raise RuntimeError("disk full")
    assert out.read_text() == "old\n" and (saved / "dataset_info.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profiled.jsonl", "rollouts.jsonl", "saved"]


def test_generate_does_not_replace_existing_rollouts(tmp_path):
    """Refused before the model loads (a real process, in seconds)."""
    rollouts = write_jsonl(tmp_path / "rollouts.jsonl", ROWS)
    before = rollouts.read_bytes()
    start = time.monotonic()
    done = command(
        "profile", rollouts, "--generate", "embedded", "--prompts", "embedded", "-o", tmp_path / "o.jsonl"
    )
    assert done.returncode == 2 and time.monotonic() - start < 60
    assert one_error(done.stderr, "profile") == (
        f"trl-length profile: error: the --generate rollout file {rollouts} exists: pass --overwrite to "
        "replace it"
    )
    assert rollouts.read_bytes() == before


# -- encodings ------------------------------------------------------------------------------------------
def test_invalid_utf8_is_an_error_naming_file_and_line(tmp_path):
    lines = [json.dumps(row).encode() for row in ROWS[:5]]
    lines[2] = lines[2].replace(b'"reward"', b'"rew\xffard"')
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_bytes(b"\n".join(lines) + b"\n")
    done = command("profile", rollouts, "-o", tmp_path / "o.jsonl")
    assert done.returncode == 2 and not (tmp_path / "o.jsonl").exists()
    column = lines[2].index(b"\xff") + 1
    assert one_error(done.stderr, "profile") == (
        f"trl-length profile: error: {rollouts}: line 3: not valid UTF-8 (byte 0xff at column {column}); fix "
        "the file, or skip such lines with --skip-invalid-utf8"
    )
    # a JSON escape of half a surrogate pair is no UTF-8 text either (a whole pair, an emoji, is)
    surrogate = {"prompt_id": 0, "completion": "ok", "reward": 1, "note": "\udc80"}
    pair = {"prompt_id": 0, "reasoning_tokens": 1, "answer_tokens": 1, "reward": 1, "note": "\U0001f600"}
    escaped = write_jsonl(tmp_path / "escaped.jsonl", [pair, surrogate])
    done = command("profile", escaped, "-o", tmp_path / "o.jsonl")
    assert done.returncode == 2 and one_error(done.stderr, "profile") == (
        f"trl-length profile: error: {escaped}: line 2: not valid UTF-8 (a \\u escape of a lone surrogate); "
        "fix the file, or skip such lines with --skip-invalid-utf8"
    )
    csv_file = tmp_path / "rollouts.csv"
    csv_file.write_bytes(
        b"prompt_id,reasoning_tokens,answer_tokens,reward,note\n0,1,1,1,ok\n0,2,1,1,caf\xe9\n"
    )
    done = command("preview", csv_file, *COEFF, "--png", tmp_path / "p.png")
    assert done.returncode == 2
    assert f"{csv_file}: line 3: not valid UTF-8 (byte 0xe9" in one_error(done.stderr, "preview")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b'{"prompt_id": 0, "prompt": "a"}\n{"prompt_id": 1, "prompt": "\xc3("}\n')
    done = command("profile", rollouts.with_name("x.jsonl"), "--prompts", prompts, "-o", tmp_path / "o.jsonl")
    assert f"{prompts}: line 2: not valid UTF-8 (byte 0xc3 at column 29)" in one_error(done.stderr, "profile")


def test_skip_invalid_utf8_counts_them_with_one_warning(tmp_path, capsys):
    lines = [json.dumps(row).encode() for row in ROWS]
    bad = [b'{"prompt_id": 0, "completion": "\xff", "reward": 1}', b'{"prompt_id": 1, "x": "\xfe\xfe"}']
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_bytes(b"\n".join([lines[0], bad[0], *lines[1:6], bad[1], *lines[6:]]) + b"\n")
    out = tmp_path / "o.jsonl"
    status, stdout, err = profile(capsys, rollouts, "-o", out, *RULES, "--skip-invalid-utf8")
    assert status == 0 and profiled(out) == [
        {**e, "profile_band": e["profile_band"] and {"answer": None, **e["profile_band"]}} for e in EXPECTED
    ]
    assert err.count("not valid UTF-8") == 1 and f"{rollouts}: line 2: not valid UTF-8; such lines" in err
    assert "13 rows read" in stdout and "rows skipped: 2 (not valid UTF-8: 2)" in stdout


def test_a_utf8_bom_is_accepted(tmp_path, capsys):
    plain = write_jsonl(tmp_path / "plain.jsonl", ROWS)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    csv_bom = tmp_path / "bom.csv"
    csv_bom.write_bytes(b"\xef\xbb\xbfprompt_id,reasoning_tokens,answer_tokens,reward\n0,8,2,1\n0,18,2,1\n")
    prompts = tmp_path / "prompts.csv"
    prompts.write_bytes(b"\xef\xbb\xbfprompt_id,prompt\n0,What is 2 + 3?\n")
    results = []
    for name, rollouts in (("plain", plain), ("bom", bom)):
        assert profile(capsys, rollouts, "-o", tmp_path / f"{name}.out.jsonl", *RULES)[0] == 0
        results.append(read_jsonl(tmp_path / f"{name}.out.jsonl"))
    assert results[0] == results[1] and len(results[0]) == 3
    status, _, _ = profile(
        capsys, csv_bom, "--prompts", prompts, "-o", tmp_path / "c.jsonl", "--min-passing", "1"
    )
    (row,) = read_jsonl(tmp_path / "c.jsonl")
    assert status == 0 and row["prompt_id"] == 0 and row["profiled_output_lengths"] == [10, 20]


# -- conflicting rows -----------------------------------------------------------------------------------
def test_rows_of_one_prompt_id_that_disagree_are_an_error(tmp_path, capsys):
    rows = [dict(row) for row in ROWS]
    rows[3]["prompt"] = "What is 9 + 9?"  # prompt 0's first row says "What is 2 + 3?"
    rollouts = write_jsonl(tmp_path / "prompt.jsonl", rows)
    status, _, err = profile(capsys, rollouts, "-o", tmp_path / "o.jsonl")
    assert status == 2 and err == (
        f"trl-length profile: error: {rollouts}: line 4: prompt_id 0 has prompt 'What is 9 + 9?', but line 1 "
        "has 'What is 2 + 3?': the rows of one prompt must agree (give different prompts different prompt_ids)\n"
    )
    assert not (tmp_path / "o.jsonl").exists()
    rows = [
        json.loads(line) for line in write_preview_rollouts(tmp_path / "r.jsonl").read_text().splitlines()
    ]
    rows[7]["agent"] = "math"  # group c's first row is the judge's
    done = command(
        "preview", write_jsonl(tmp_path / "agent.jsonl", rows), *COEFF, "--png", tmp_path / "p.png"
    )
    assert done.returncode == 2 and not (tmp_path / "p.png").exists()
    assert "line 8: prompt_id c has agent 'math', but line 7 has 'judge'" in one_error(done.stderr, "preview")
    # rows that name the prompt once, or the same way, are one prompt (as before)
    assert profile(capsys, write_jsonl(tmp_path / "ok.jsonl", ROWS), "-o", tmp_path / "ok.out.jsonl")[0] == 0


# -- bad flags, counts and types ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (["preview", "{rollouts}", *COEFF, "--step", "-1"], "--step must be >= 0, got -1"),
        (
            ["preview", "{rollouts}", *COEFF, "--tokenizer", "{tmp}/no-tokenizer"],
            "--tokenizer {tmp}/no-tokenizer: cannot load it (no such local path; a Hub name): ",
        ),
        (
            ["profile", "{rollouts}", "-o", "{tmp}/o.jsonl", "--generate", "embedded", "--prompts", "embedded",
             "--temperature", "0"],
            "--temperature must be a finite number > 0, got 0.0",
        ),
        (
            ["profile", "{tmp}/new.jsonl", "-o", "{tmp}/o.jsonl", "--generate", "embedded", "--prompts",
             "embedded", "--temperature", "nan"],
            "--temperature must be a finite number > 0, got nan",
        ),
        (
            ["profile", "{tmp}/new.jsonl", "-o", "{tmp}/o.jsonl", "--generate", "embedded", "--prompts",
             "embedded", "--max-new-tokens", "0"],
            "--max-new-tokens must be between 1 and 2147483647, got 0",
        ),
        (
            ["profile", "{tmp}/new.jsonl", "-o", "{tmp}/o.jsonl", "--generate", "embedded", "--prompts",
             "embedded", "--model", "{tmp}/no-model"],
            "--model {tmp}/no-model: cannot load it (no such local path; a Hub name): ",
        ),
        (["preview", "{rollouts}", *COEFF, "--png", "{tmp}/p.jpg"], "--png {tmp}/p.jpg: preview writes PNG"),
        (["profile", "{rollouts}", "-o", "{tmp}/o.jsonl", "--prompts", "embedded", "--dataset-size", "0"],
         "--dataset-size must be >= 1"),
    ],
)  # fmt: skip
def test_bad_flags_are_one_line(argv, message, tmp_path, capsys):
    rollouts = write_preview_rollouts(tmp_path / "r.jsonl")
    argv = [arg.format(rollouts=rollouts, tmp=tmp_path) for arg in argv]
    runner = preview if argv[0] == "preview" else profile
    status, _, err = runner(capsys, *argv[1:])
    assert status == 2 and err.startswith(f"trl-length {argv[0]}: error: {message.format(tmp=tmp_path)}")
    assert len(err.strip().splitlines()) == 1


def test_a_missing_tokenizer_is_one_line_in_a_real_process(tmp_path):
    done = command(
        "profile",
        write_jsonl(tmp_path / "r.jsonl", ROWS),
        "-o",
        tmp_path / "o.jsonl",
        "--tokenizer",
        "nobody/none",
    )
    assert done.returncode == 2
    assert "--tokenizer nobody/none: cannot load it (no such local path; a Hub name)" in one_error(
        done.stderr, "profile"
    )


def test_absurd_token_counts_are_skipped_with_their_reason(tmp_path, capsys):
    """A count past 2**31 - 1 is no token count: the row is skipped and counted, never an overflow."""
    rows = [*ROWS, {"prompt_id": 0, "reasoning_tokens": 10**30, "answer_tokens": 1, "reward": 1}]
    out = tmp_path / "o.jsonl"
    status, stdout, err = profile(capsys, write_jsonl(tmp_path / "r.jsonl", rows), "-o", out, *RULES)
    assert status == 0 and profiled(out)[0]["profiled_output_lengths"] == [10, 20, 40, 30, 50]
    assert "line 12: reasoning_tokens must be at most 2147483647; skipped" in err
    assert "rows skipped: 1 (reasoning_tokens must be at most 2147483647: 1)" in stdout


def test_columns_of_mixed_types_are_one_line(tmp_path, capsys):
    """A prompt-level column that is an integer for one prompt and a string for another cannot be written
    (JSONL through Arrow, Parquet); a prompt file or a Parquet file that cannot be read is one line too."""
    rows = [
        {"prompt_id": 0, "answer": 5, "reasoning_tokens": 3, "answer_tokens": 2, "reward": 1},
        {"prompt_id": 1, "answer": "x", "reasoning_tokens": 3, "answer_tokens": 2, "reward": 1},
    ]
    rollouts = write_jsonl(tmp_path / "r.jsonl", rows)
    for out in (tmp_path / "o.parquet", tmp_path / "o.jsonl"):
        status, _, err = profile(capsys, rollouts, "-o", out)
        assert status == 2 and err.startswith(
            "trl-length profile: error: column 'answer' mixes types (int, str): a written dataset holds one "
            "type per column"
        )
        assert len(err.strip().splitlines()) == 1 and not out.exists()
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt_id": 0}], ["{not json"])
    done = command("profile", rollouts, "--prompts", prompts, "-o", tmp_path / "o.jsonl")
    assert done.returncode == 2
    assert f"{prompts}: not a readable prompt dataset: JSON parse error" in one_error(done.stderr, "profile")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    status, _, err = profile(capsys, broken, "-o", tmp_path / "o.jsonl")
    assert status == 2 and err.startswith(f"trl-length profile: error: {broken}: not a Parquet file: ")


# -- the profiled recipe without its profiles -----------------------------------------------------------
def test_the_profiled_recipe_without_its_profiles_names_trl_length_profile(tmp_path):
    """Before TRL is imported (seconds, not a ``datasets`` traceback after the imports)."""
    start = time.monotonic()
    done = command("grpo", "--config", "recipe:profiled_cpu", cwd=tmp_path)
    assert done.returncode == 2 and time.monotonic() - start < 30
    assert done.stderr == (
        "trl-length-grpo: error: dataset_name: outputs/profiles/prompts: no such file or directory; this config "
        "reads per-prompt profiles (docs/profiles.md): make the dataset first with `trl-length profile ROLLOUTS "
        "--output outputs/profiles/prompts` (the recipe's comment has the whole command)\n"
    )
    done = command(
        "grpo", "--config", "recipe:zmad_cpu", "--dataset_name", "data/missing.jsonl", cwd=tmp_path
    )
    assert done.returncode == 2 and done.stderr == (
        "trl-length-grpo: error: dataset_name: data/missing.jsonl: no such file or directory\n"
    )
