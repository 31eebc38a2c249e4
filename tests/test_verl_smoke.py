"""``trl-length verl-smoke``'s parts that need no training run (the runs: ``tests/test_verl_e2e_*.py``): what it
replaces and keeps, the first error line of a failed run's output, config errors in one line before Ray starts,
and the end of a run's process session."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trl_length_plugin.recipes import RECIPES_DIR
from trl_length_plugin.tools.sessions import end_session, session_processes
from verl_adapter.tools import smoke, smoke_config
from verl_adapter.tools.check import recipe_overrides
from verl_adapter.tools.smoke import (
    cpu_overrides,
    first_error,
    leftover_segments,
    run_segments,
    screen,
    train,
    verdict,
)

RECIPES = RECIPES_DIR / "verl"
REPO = Path(__file__).resolve().parents[1]

#: the end of a failed run's output, as Ray prints it (colour codes included)
RAY_FAILURE = """\
\x1b[36m(TaskRunnerV1 pid=3781)\x1b[0m WARNING:2026-12-04 05:05:31:Triton is installed, but doesn't include CPU backend.
\x1b[36m(RewardLoopWorker pid=4410)\x1b[0m Traceback (most recent call last):
\x1b[36m(RewardLoopWorker pid=4410)\x1b[0m   File "/tmp/bad_reward.py", line 2, in compute_score
\x1b[36m(RewardLoopWorker pid=4410)\x1b[0m RuntimeError: planted error in the reward
Traceback (most recent call last):
  File "main_ppo.py", line 90, in run_ppo
ray.exceptions.RayTaskError(RuntimeError): ray::TaskRunnerV1.run() (pid=3781, ip=10.0.0.1)
RuntimeError: planted error in the reward
"""


#: a worker's error that reaches the driver only through Ray's wrappers
RAY_WRAPPED = """\
Error executing job with overrides: ['algorithm.adv_estimator=grpo']
Traceback (most recent call last):
  File "main_ppo.py", line 93, in run_ppo
    raise value.as_instanceof_cause()
ray.exceptions.RayTaskError(MissingMandatoryValue): \x1b[36mray::TaskRunnerV1.run()\x1b[39m (pid=13586, ip=192.0.2.2)
  File "trainer_base.py", line 329, in _setup
ray.exceptions.RayTaskError(MissingMandatoryValue): \x1b[36mray::WorkerDict.actor_rollout_init_model()\x1b[39m (pid=14121, ip=1)
  File "basecontainer.py", line 96, in _resolve_with_default
    raise MissingMandatoryValue("Missing mandatory value: $FULL_KEY")
omegaconf.errors.MissingMandatoryValue: Missing mandatory value: actor_rollout_ref.rollout.name
    full_key: actor_rollout_ref.rollout.name
"""


def test_first_error_is_the_workers_exception_line():
    lines = RAY_FAILURE.splitlines()
    assert first_error(lines) == "RewardLoopWorker pid=4410: RuntimeError: planted error in the reward"
    assert first_error(RAY_WRAPPED.splitlines()) == (
        "WorkerDict.actor_rollout_init_model pid=14121: omegaconf.errors.MissingMandatoryValue: "
        "Missing mandatory value: actor_rollout_ref.rollout.name"
    )
    assert (
        first_error(["Traceback (most recent call last):", "  x", "ValueError: bad"])
        == "driver: ValueError: bad"
    )
    assert first_error(["all fine", "UserWarning: not an error line"]) is None
    # each process's traceback on its own: another worker's line inside it is not its exception line
    interleaved = [
        "(A pid=1) Traceback (most recent call last):",
        "(B pid=2) Done",
        "(A pid=1) KeyError: 'x'",
    ]
    assert first_error(interleaved) == "A pid=1: KeyError: 'x'"
    assert first_error(["(pid=9) Traceback (most recent call last):", "(pid=9) OSError: disk"]) == (
        "worker pid=9: OSError: disk"
    )
    # a vLLM engine logs its worker's traceback line by line behind its logger's prefix (seen on SmolLM2)
    engine = "(vLLMHttpServer pid=5) (Worker pid=7) ERROR 12-04 11:16:17 [multiproc_executor.py:1058] "
    logged = [
        engine + "Traceback (most recent call last):",
        engine + '  File "utils.py", line 461',
        engine + "ValueError: tied",
    ]
    assert first_error(logged) == "Worker pid=7: ValueError: tied"


def test_cpu_overrides_keep_every_algorithm_loss_and_plugin_key(tmp_path):
    user = recipe_overrides(RECIPES / "grpo_score_centering_qwen2.5-0.5b.sh", [])
    replaced = cpu_overrides(user, 3, tmp_path / "model", tmp_path)
    keys = {o.lstrip("+").split("=", 1)[0] for o in replaced.overrides}
    kept = [
        o.lstrip("+").split("=", 1)[0] for o in user if o.lstrip("+").startswith(("algorithm.", "score_"))
    ]
    kept += ["actor_rollout_ref.actor.policy_loss.loss_mode", "actor_rollout_ref.rollout.n"]
    assert kept and not keys & set(kept)
    assert "++trainer.total_training_steps=3" in replaced.overrides
    assert f"++actor_rollout_ref.model.path={tmp_path / 'model'}" in replaced.overrides
    assert (tmp_path / "data" / "train.parquet").is_file()
    assert any(note.startswith("data.train_files=") for note in replaced.notes)


def test_the_response_fits_the_users_length_limits(tmp_path):
    coefficient = recipe_overrides(RECIPES / "grpo_length_coeff_qwen2.5-0.5b.sh", [])  # floor of 64 tokens
    assert "++data.max_response_length=80" in cpu_overrides(coefficient, 2, tmp_path, tmp_path).overrides
    overlong = ["+length_penalty.default.overlong_max_length=100"]
    assert "++data.max_response_length=100" in cpu_overrides(overlong, 2, tmp_path, tmp_path).overrides
    assert "++data.max_response_length=48" in cpu_overrides([], 2, tmp_path, tmp_path).overrides


def test_the_weight_bucket_holds_every_weight_and_a_tied_head_again(tmp_path):
    """vLLM 0.31 refuses a tied head that reaches it in another bucket than its embedding (the real model's
    49,152 x 576 embedding alone is 108 MiB): with tied embeddings one bucket holds all, in float32; untied, the
    largest weight is enough."""
    import json

    import torch
    from safetensors.torch import save_file

    assert (
        smoke_config.weight_bucket_megabytes(tmp_path) == 16
    )  # no weights: verl's CPU default of this command
    weights = {"small": torch.zeros(256, 1024), "embed": torch.zeros(49152, 576, dtype=torch.bfloat16)}
    save_file(weights, tmp_path / "a.safetensors")
    embed, small = 49152 * 576 * 4, 256 * 1024 * 4
    assert smoke_config.weight_bytes(tmp_path) == (embed + small, embed)
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    assert smoke_config.weight_bucket_megabytes(tmp_path) == 108 + 1 + 108 + 1
    overrides = cpu_overrides([], 2, tmp_path, tmp_path / "run").overrides
    assert "++actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=218" in overrides
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    assert smoke_config.weight_bucket_megabytes(tmp_path) == 108 + 1


def test_local_data_and_reward_function_are_kept_with_a_model_of_the_users(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.parquet").write_text(""), (tmp_path / "reward.py").write_text("")
    user = [
        "data.train_files=train.parquet",
        "data.val_files=train.parquet",
        "reward.custom_reward_function.path=reward.py",
    ]
    kept = cpu_overrides(user, 2, tmp_path, tmp_path / "run").overrides
    # verl runs in the run folder: kept relative paths become absolute
    assert f"++data.train_files={tmp_path / 'train.parquet'}" in kept
    assert f"++reward.custom_reward_function.path={tmp_path / 'reward.py'}" in kept
    assert not (tmp_path / "run" / "data").exists()
    # the embedded model's tokenizer knows only its task: its data replaces the user's, the user's reward stays
    replaced = cpu_overrides(user, 2, tmp_path, tmp_path / "run", own_data=False).overrides
    assert f"++data.train_files={tmp_path / 'run' / 'data' / 'train.parquet'}" in replaced
    assert f"++reward.custom_reward_function.path={tmp_path / 'reward.py'}" in replaced
    assert not any("embedded_reward" in o for o in replaced)


def test_a_real_model_without_local_data_trains_on_the_real_task(tmp_path):
    """The embedded task's format is one a real model never answers: with a group filter (DAPO's dynamic
    sampling) every group would be all-zero and verl would sample forever (seen on SmolLM2)."""
    import pandas as pd

    from verl_adapter.tools.embedded_reward import compute_score

    replaced = cpu_overrides([], 2, tmp_path, tmp_path / "run", own_data=True)
    assert any("(data: the real chat model task)" in note for note in replaced.notes)
    rows = pd.read_parquet(tmp_path / "run" / "data" / "train.parquet")
    assert set(rows["data_source"]) == {"real/arithmetic"} and rows["prompt"][0][0]["content"].startswith(
        "What is"
    )
    assert compute_score("real/arithmetic", "It is 29.", "29") == 1.0
    assert compute_score("real/arithmetic", "<think>29</think> 28", "29") == 0.0
    assert compute_score("embedded/reasoning", "It is 29.", "29") == 0.0


def test_verdict_needs_every_step_finite_with_the_plugins_metrics():
    good = {"actor/pg_loss": 0.1, "actor/grad_norm": 1.0, "length_penalty/adjusted_frac": 0.5}
    assert verdict({1: good, 2: good}, 2, plugin_expected=True) is None
    assert "expected 1-2" in verdict({1: good}, 2, plugin_expected=True)
    assert "grad_norm" in verdict({1: good, 2: {**good, "actor/grad_norm": float("nan")}}, 2, True)
    plain = {"actor/pg_loss": 0.1, "actor/grad_norm": 1.0}
    assert "plugin" in verdict({1: plain}, 1, plugin_expected=True)
    assert verdict({1: plain}, 1, plugin_expected=False) is None
    table = screen({1: good})
    assert table[0].split() == ["step", "adjusted", "pg_loss", "grad_norm"] and table[1].split()[0] == "1"


def run_smoke(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "trl_length_plugin.tools.commands", "verl-smoke", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )


def test_a_bad_plugin_key_is_one_line_before_ray_starts():
    done = run_smoke(str(RECIPES / "luspo_qwen2.5-0.5b.sh"), "+length_penalty_coef=0.5")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"trl-length verl-smoke: error: {RECIPES / 'luspo_qwen2.5-0.5b.sh'}: length_penalty_coef: unknown "
        "trl-length-plugin key; did you mean 'length_penalty_coeff'?"
    ]
    assert "Ray" not in done.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--model", "/nonexistent"],
            "--model: /nonexistent is not a local model folder (no such folder); use embedded",
        ),
        (["missing.sh"], "missing.sh: no such recipe script"),
        # issue 42: a bash recipe by its other ending is a script, not a Hydra override
        (["missing.bash"], "missing.bash: no such recipe script"),
        # issue 42: a limit that never ends a run (nan) or ends it before it starts
        *[
            (["--timeout", value], f"argument --timeout: a number of seconds above 0 expected, got {value!r}")
            for value in ("nan", "inf", "0", "-5", "soon")
        ],
    ],
)
def test_bad_command_lines_are_one_line(args, message):
    done = run_smoke(*args)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"trl-length verl-smoke: error: {message}"]


def test_end_session_ends_every_process_of_the_session():
    """A session whose leader and children ignore SIGTERM: all ended (SIGKILL after the grace period)."""
    script = "import signal, subprocess, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    script += "subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, "
    script += "signal.SIG_IGN); time.sleep(60)'])\ntime.sleep(60)\n"
    leader = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 30
    while len(session_processes(leader.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(session_processes(leader.pid)) == 2
    end_session(leader.pid, grace_s=0.5)
    leader.wait(timeout=10)
    assert session_processes(leader.pid) == []
    assert leader.returncode == -signal.SIGKILL


#: a run whose worker failed and that then hangs, as verl's driver did after a vLLM worker died
HANGS_AFTER_AN_ERROR = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print('(vLLMHttpServer pid=77) Traceback (most recent call last):', flush=True)\n"
    "print('(vLLMHttpServer pid=77)   File \"x.py\", line 1', flush=True)\n"
    "print('(vLLMHttpServer pid=77) AttributeError: weight_loader', flush=True)\n"
    "time.sleep(120)\n"
)


def test_a_run_stalled_after_a_worker_error_ends_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(smoke, "STALL_AFTER_ERROR_S", 2.0)
    started = time.monotonic()
    outcome = train([sys.executable, "-c", HANGS_AFTER_AN_ERROR], tmp_path, 60, 2, say=lambda line: None)
    assert time.monotonic() - started < 30
    assert outcome.code == 1
    assert outcome.error == "vLLMHttpServer pid=77: AttributeError: weight_loader (the run stalled after it)"
    assert not processes_in(tmp_path)


#: a run that holds a shared-memory segment (as vLLM's queues do) and outlives its limit
HOLDS_A_SEGMENT = (
    "import time\nfrom multiprocessing import shared_memory\n"
    "segment = shared_memory.SharedMemory(create=True, size=4096)\nprint(segment.name, flush=True)\n"
    "time.sleep(120)\n"
)


def test_a_run_past_its_limit_is_ended_and_leaves_no_segment(tmp_path):
    before = run_segments()
    outcome = train([sys.executable, "-c", HOLDS_A_SEGMENT], tmp_path, 3, 2, say=lambda line: None)
    assert outcome.code == 124 and outcome.error.startswith("timed out after 3 s")
    assert not processes_in(tmp_path)
    name = (tmp_path / "main_ppo.log").read_text().split()[0]
    assert name.startswith("psm_") and not leftover_segments(before)


#: a run that prints a handled error, then goes on printing and finishes
GOES_ON_AFTER_AN_ERROR = (
    "import time\n"
    "print('(WorkerDict pid=5) Traceback (most recent call last):', flush=True)\n"
    "print('(WorkerDict pid=5) ValueError: handled and logged', flush=True)\n"
    "for i in range(8):\n"
    "    time.sleep(0.5)\n"
    "    print('working', i, flush=True)\n"
)


def test_an_error_line_followed_by_progress_does_not_end_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(smoke, "STALL_AFTER_ERROR_S", 2.0)
    outcome = train([sys.executable, "-c", GOES_ON_AFTER_AN_ERROR], tmp_path, 60, 2, say=lambda line: None)
    assert (outcome.code, outcome.error) == (0, None)


def processes_in(run_dir: Path) -> list[int]:
    """Processes still running from ``run_dir`` (the run's working directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd") == str(run_dir):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_run_folder_of_the_users_files_is_refused_and_left_as_it_was(tmp_path):
    """Issue 42: ``--run-dir`` on a folder of the user's own files replaced its ``data/train.parquet`` and deleted
    the rest; the command now refuses it in one line before it starts, and writes nothing there."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.parquet").write_bytes(b"the user's data")
    (tmp_path / "main_ppo.log").write_text("the user's log")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    done = run_smoke("+length_penalty_coeff=0.5", "--run-dir", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"trl-length verl-smoke: error: --run-dir: {tmp_path} holds files this command did not write; "
        "give a new or empty folder"
    ]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "data" / "train.parquet").read_bytes() == b"the user's data"
    file = tmp_path / "main_ppo.log"
    done = run_smoke("+length_penalty_coeff=0.5", "--run-dir", str(file))
    assert done.stderr.strip().splitlines() == [
        f"trl-length verl-smoke: error: --run-dir: {file} is a file, not a folder"
    ]


def test_the_command_writes_only_into_its_own_run_folders(tmp_path):
    """A new or empty folder becomes a run folder (marked), which a later run may write into again; a place
    that cannot be written is one line."""
    new = smoke.claim_run_dir(tmp_path / "new" / "run")
    assert new == tmp_path / "new" / "run" and (new / smoke.RUN_MARK).is_file()
    (new / "main_ppo.log").write_text("an earlier run's log")
    assert smoke.claim_run_dir(new) == new
    (tmp_path / "empty").mkdir()
    assert smoke.claim_run_dir(tmp_path / "empty") == tmp_path / "empty"
    (tmp_path / "file").write_text("")
    with pytest.raises(
        smoke.SmokeConfigError, match=r"--run-dir: cannot write into .*file/run \(Not a directory\)"
    ):
        smoke.claim_run_dir(tmp_path / "file" / "run")
