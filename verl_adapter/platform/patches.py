"""Where verl (and, on CPU, vLLM) is patched rather than extended (docs/verl.md, "verl beside TRL" and "verl on a
laptop's CPU"). Every internal a patch relies on is named in ``INTERNALS`` and checked before the patch is
applied; when one changed, :class:`VerlHostError` names it and verl's version (fail closed: nothing is patched).

- **TRL beside verl** (:func:`install`, in every verl process, from the entry point): verl 0.9.x's FSDP model
  init imports TRL's ``AutoModelForCausalLMWithValueHead`` whenever ``verl.utils.import_utils.is_trl_available()``
  answers True, which it does whenever TRL is installed; TRL 1.16 no longer has that class, so every verl run in
  an environment with TRL 1.16 failed with ``ImportError``. verl's probe is made to answer whether that class
  imports. Where TRL still has it, the answer is verl's own.
- **CPU** (:func:`install_cpu`, only in runs on ``verl_adapter.platform.cpu``): verl's process-group init gets
  ``cpu:gloo`` (verl builds ``cpu:gloo,cpu:gloo``, which torch refuses), and vLLM's CPU engine keeps plain linear
  weights so verl's weight sync updates what it computes with (``trl_length_plugin.vllm_cpu``).
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Callable

from trl_length_plugin.vllm_cpu import VLLM_CPU_DISPATCH
from verl_adapter.platform.after_import import after_import

logger = logging.getLogger("trl_length_plugin")

#: every internal patched here -> the parameters the patch relies on
INTERNALS: dict[str, tuple[str, ...]] = {
    "verl.utils.import_utils.is_trl_available": (),
    "verl.utils.distributed.initialize_global_process_group_ray": ("timeout_second", "backend"),
    "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm": VLLM_CPU_DISPATCH,
}
#: the verl modules that import ``is_trl_available`` by name (verl 0.9.1)
TRL_PROBE_USERS = ("verl.models.transformers.monkey_patch", "verl.utils.model")
#: the verl module that imports ``initialize_global_process_group_ray`` by name and calls it without a backend
PROCESS_GROUP_USERS = ("verl.workers.engine_workers",)
CPU_BACKEND = "cpu:gloo"


class VerlHostError(RuntimeError):
    """A verl (or vLLM) internal that a patch relies on changed (not an ImportError: code that tolerates a
    missing module must not take it for one)."""


def _verl_version() -> str:
    verl = sys.modules.get("verl")
    return getattr(verl, "__version__", "unknown")


def checked(name: str, function) -> Callable:
    """``function`` when it is the internal ``name`` with the parameters of ``INTERNALS``, else VerlHostError."""
    found = tuple(inspect.signature(function).parameters) if callable(function) else None
    if found != INTERNALS[name]:
        from verl_adapter.platform.host import EXPECTED

        raise VerlHostError(
            f"trl-length-plugin cannot patch {name}: expected parameters {INTERNALS[name]}, found {found} in "
            f"verl {_verl_version()}; this verl_adapter supports {EXPECTED}"
        )
    return function


def replace(module_name: str, attribute: str, patched: Callable, users: tuple[str, ...]) -> None:
    """Set ``module.attribute`` to ``patched``, and in each already imported module of ``users`` that imported
    the original by name."""
    module = sys.modules[module_name]
    original = getattr(module, attribute)
    setattr(module, attribute, patched)
    for user in users:
        if getattr(sys.modules.get(user), attribute, None) is original:
            setattr(sys.modules[user], attribute, patched)


@functools.cache
def value_head_class_imports() -> bool:
    """Whether TRL's ``AutoModelForCausalLMWithValueHead`` imports from where verl looks for it."""
    try:
        from trl.experimental.ppo import AutoModelForCausalLMWithValueHead  # noqa: F401
    except ImportError:
        try:
            from trl import AutoModelForCausalLMWithValueHead  # noqa: F401
        except ImportError:
            return False
    return True


def trl_probe(original: Callable[[], bool]) -> Callable[[], bool]:
    """verl's ``is_trl_available`` answering whether TRL has the value-head class verl imports after asking."""

    @functools.wraps(original)
    def is_trl_available() -> bool:
        if not original():
            return False
        if value_head_class_imports():
            return True
        _say_trl_hidden()
        return False

    is_trl_available.asks_for_value_head = True
    return is_trl_available


@functools.cache
def _say_trl_hidden() -> None:
    from importlib.metadata import version

    logger.info(
        "trl-length-plugin: TRL %s has no AutoModelForCausalLMWithValueHead, which verl %s imports in its FSDP "
        "model init whenever TRL is installed; verl's is_trl_available() now answers False, so the init runs as "
        "without TRL (only value-head checkpoints need that class)",
        version("trl"),
        _verl_version(),
    )


def install() -> None:
    """TRL beside verl (idempotent); ``verl.utils.import_utils`` is imported by ``import verl`` itself."""
    from verl.utils import import_utils

    original = import_utils.is_trl_available
    if getattr(original, "asks_for_value_head", False):
        return
    checked("verl.utils.import_utils.is_trl_available", original)
    replace("verl.utils.import_utils", "is_trl_available", trl_probe(original), TRL_PROBE_USERS)


def _cpu_process_group() -> None:
    from verl.utils import distributed

    name = "verl.utils.distributed.initialize_global_process_group_ray"
    if getattr(distributed.initialize_global_process_group_ray, "cpu_backend", False):
        return
    original = checked(name, distributed.initialize_global_process_group_ray)

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or CPU_BACKEND)

    initialize_global_process_group_ray.cpu_backend = True

    replace(
        "verl.utils.distributed",
        name.rsplit(".", 1)[1],
        initialize_global_process_group_ray,
        PROCESS_GROUP_USERS,
    )


def _cpu_plain_linears() -> None:
    from trl_length_plugin.vllm_cpu import check_cpu_dispatch, keep_plain_cpu_linears

    changed = check_cpu_dispatch()
    if changed:
        raise VerlHostError(f"trl-length-plugin cannot keep vLLM's CPU linears plain: {changed}")
    keep_plain_cpu_linears()


def install_cpu() -> None:
    """The CPU patches, each applied right after verl or vLLM imports the module it patches."""
    after_import("verl.utils.distributed", _cpu_process_group)
    after_import("vllm.model_executor.layers.utils", _cpu_plain_linears)
