"""docs/reference/product.md §1.2: the core imports with only torch, numpy and pydantic installed."""

from __future__ import annotations

import subprocess
import sys

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
    "trl_length_plugin.config_base",
    "trl_length_plugin.host_checks",
    "trl_length_plugin.shaping",
    "trl_length_plugin.losses",
    "trl_length_plugin.losses.luspo",
    "trl_length_plugin.score_centering",
    "trl_length_plugin.score_centering.config",
    "trl_length_plugin.score_centering.controller",
    "trl_length_plugin.score_centering.estimator",
    "trl_length_plugin.score_centering.topk_logprobs",
    "trl_length_plugin.score_centering.capture",
    "trl_length_plugin.score_centering.sampling_request",
]
#: a meta-path finder that makes every optional host look uninstalled
BLOCKER = f"""\
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {HOSTS!r}:
            raise ImportError(f"blocked optional host {{name}}")
sys.meta_path.insert(0, Block())
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER + code], capture_output=True, text=True, timeout=120)


def test_core_imports_without_any_host():
    result = _run("".join(f"import {m}\n" for m in CORE_MODULES) + "print('ok')\n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"


def test_missing_host_names_the_extra():
    code = """\
try:
    from trl_length_plugin.embedded import make_task_dataset
    make_task_dataset(2)
except ImportError as err:
    print(err)
"""
    result = _run(code)
    assert "pip install 'trl-length-plugin[trl]'" in result.stdout, result.stderr[-2000:]
