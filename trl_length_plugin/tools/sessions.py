"""The processes a tool starts, as one process session it ends whole: a hung recipe script or trainer leaves no
child running after its time limit or a Ctrl-C (issue 42)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

#: Ctrl-C, kill and a closed terminal: each ends a tool's sessions, then the tool
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def interrupt_on_ending_signals() -> None:
    """Make Ctrl-C, SIGTERM and SIGHUP raise ``KeyboardInterrupt``: a tool interrupted, killed, or whose terminal
    closed still ends its sessions."""
    # SIGINT too: a tool whose parent ignores it (a test runner's worker) inherits that
    for ending in ENDING_SIGNALS:
        signal.signal(ending, _interrupt)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


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


def run_session(command: list[str], timeout_s: float, **options) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, **options)`` in a session of
    its own, ended whole (:func:`end_session`) when it outlives ``timeout_s`` (``TimeoutExpired``) or the caller
    is interrupted (``KeyboardInterrupt``), which is then raised."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        **options,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except BaseException:
        # a second ending signal cannot cut the cleanup short
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, ENDING_SIGNALS)
        try:
            end_session(process.pid, grace_s=2.0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.communicate(timeout=5)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
