"""verl on CPU (docs/verl.md, "Try your config on a laptop"): a verl platform named ``cpu``, registered through
verl's ``PlatformRegistry`` and loaded in every verl process by ``VERL_USE_EXTERNAL_MODULES`` (the route verl's
maintainers ask for), with ``VERL_PLATFORM=cpu`` selecting it. Importing this module also applies the CPU
patches of ``verl_adapter.platform.patches``. ``trl-length verl-smoke`` sets all of it up (:data:`ENV`).

What the platform answers, and why:
- ``current_device()`` is the string ``"cpu"``: verl calls ``torch.device(get_device_id())``, where an int
  would name an accelerator;
- ``device_module`` stands in for ``torch.cuda``: what ``torch.cpu`` has, plus no-op or host-memory answers for
  the cache, memory and IPC calls verl makes through ``get_torch_device()``;
- gloo for collectives; Ray's ``GPU`` resource (a run declares one logical GPU per trainer process:
  verl's placement counts only accelerators); no CUDA IPC, so weights reach vLLM through shared memory.
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager

import torch
from verl.plugin.platform import PlatformRegistry
from verl.plugin.platform.platform_base import PlatformBase

from verl_adapter.platform import patches as host_patches

#: what a process needs to run verl on this platform (Ray workers and vLLM inherit it)
ENV = {
    "VERL_PLATFORM": "cpu",
    "VERL_USE_EXTERNAL_MODULES": __name__,
    # verl's FSDP engine is registered for cuda and npu only; on CPU it runs unchanged
    "VERL_ENGINE_DEVICE": "cuda",
    # the one logical GPU Ray schedules the trainer process on (an inherited empty value makes Ray refuse it)
    "CUDA_VISIBLE_DEVICES": "0",
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def _host_memory() -> tuple[int, int]:
    pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return pages * size, os.sysconf("SC_PHYS_PAGES") * size


def _nothing(*args, **kwargs) -> None:
    return None


def _zero(*args, **kwargs) -> int:
    return 0


class CPUDeviceModule(types.ModuleType):
    """``torch.cpu`` with the ``torch.cuda`` calls verl makes through ``get_torch_device()`` that it lacks."""

    empty_cache = ipc_collect = set_per_process_memory_fraction = reset_peak_memory_stats = staticmethod(
        _nothing
    )
    memory_allocated = memory_reserved = max_memory_allocated = max_memory_reserved = staticmethod(_zero)
    get_rng_state, set_rng_state = staticmethod(torch.get_rng_state), staticmethod(torch.set_rng_state)
    mem_get_info = staticmethod(lambda *args: _host_memory())
    get_device_name = staticmethod(lambda *args: "cpu")
    is_available = staticmethod(lambda: True)
    device_count = staticmethod(lambda: 1)

    def __getattr__(self, name: str):
        return getattr(torch.cpu, name)


DEVICE_MODULE = CPUDeviceModule("verl_adapter.platform.cpu.device")


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """verl's platform interface on the host CPU (no accelerator)."""

    device_name = "cpu"
    vendor_name = "cpu"
    device_module = DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"

    def current_device(self):
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        return None

    def synchronize(self, device_index=None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self):
        return None


def check_platform_interface() -> None:
    """verl's ``PlatformBase`` asks nothing this platform lacks (a newer verl may add abstract methods)."""
    missing = sorted(PlatformCPU.__abstractmethods__)
    if missing:
        raise host_patches.VerlHostError(
            f"verl_adapter.platform.cpu: verl's PlatformBase now also asks for {', '.join(missing)}; "
            f"this CPU platform was written for verl 0.9.1"
        )


check_platform_interface()
host_patches.install_cpu()
