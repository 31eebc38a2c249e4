"""decisions.md §1.2: the core imports with only torch, numpy and pydantic installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

HOSTS = [
    "trl",
    "transformers",
    "verl",
    "vllm",
    "deepspeed",
    "datasets",
    "accelerate",
    "peft",
    "tokenizers",
    "ray",
]
CORE_MODULES = [
    "trl_length_plugin",
    "trl_length_plugin.shaping",
    "trl_length_plugin.losses",
    "trl_length_plugin.losses.luspo",
    "trl_length_plugin.losses.score_centering",
    "trl_length_plugin.losses.topk_logprobs",
    "trl_length_plugin.vllm_capture",
]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def _blocker(hosts: list[str]) -> str:
    return f"""
        import importlib.abc, sys
        BLOCKED = {hosts!r}
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"blocked optional host {{name}}")
        sys.meta_path.insert(0, Block())
    """


def test_core_imports_without_any_host():
    imports = "\n".join(f"import {m}" for m in CORE_MODULES)
    result = _run(_blocker(HOSTS) + imports + "\nprint('ok')")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"


def test_missing_host_names_the_extra():
    code = (
        _blocker(HOSTS)
        + """
        try:
            from trl_length_plugin.embedded import make_task_dataset
            make_task_dataset(2)
        except ImportError as err:
            print(err)
    """
    )
    result = _run(code)
    assert "pip install 'trl-length-plugin[trl]'" in result.stdout, result.stderr[-2000:]
