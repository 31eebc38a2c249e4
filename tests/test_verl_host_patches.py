"""verl beside TRL 1.16, and the CPU platform's patches (``verl_adapter.platform.patches``, docs/verl.md "verl beside TRL").

verl 0.9.x's FSDP model init (``apply_monkey_patch``) imports TRL's ``AutoModelForCausalLMWithValueHead`` whenever
TRL is installed; TRL 1.16 has no such class. Each test runs verl's own code in a fresh process of the project's
environment (TRL 1.16 and verl 0.9.1 installed together), with and without the plugin's entry point.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from verl_adapter.platform import patches as host_patches

#: verl's own model-init patching on the embedded model, as verl's FSDP engine runs it
MODEL_INIT = (
    "import logging, sys\n"
    "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(name)s %(message)s')\n"
    "import verl, transformers\n"
    "from verl.models.transformers.monkey_patch import apply_monkey_patch\n"
    "model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
    "apply_monkey_patch(model=model, use_remove_padding=False)\n"
    "from verl.utils.import_utils import is_trl_available\n"
    "print('initialized, is_trl_available =', is_trl_available())\n"
)


def run_model_init(model_dir, plugins: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VERL_USE_EXTERNAL_PLUGINS": plugins}
    return subprocess.run(
        [sys.executable, "-c", MODEL_INIT, str(model_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_trl_1_16_lacks_the_value_head_class_verl_imports():
    assert not host_patches.value_head_class_imports()


def test_verl_model_init_fails_beside_trl_without_the_plugin(random_model_dir):
    out = run_model_init(random_model_dir, "none")
    assert out.returncode != 0
    assert "AutoModelForCausalLMWithValueHead" in out.stderr


def test_verl_model_init_works_beside_trl_with_the_plugin(random_model_dir):
    out = run_model_init(random_model_dir, "auto")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "initialized, is_trl_available = False"
    said = [line for line in out.stdout.splitlines() if "AutoModelForCausalLMWithValueHead" in line]
    assert len(said) == 1 and said[0].startswith("trl_length_plugin ") and "TRL 1.16" in said[0]


def test_the_probe_keeps_verls_answer_where_trl_has_the_class(monkeypatch):
    monkeypatch.setattr(host_patches, "value_head_class_imports", lambda: True)
    assert host_patches.trl_probe(lambda: True)() is True
    assert host_patches.trl_probe(lambda: False)() is False


def test_a_changed_internal_fails_closed_naming_verls_version():
    def is_trl_available(strict):
        return True

    with pytest.raises(host_patches.VerlHostError, match=r"is_trl_available.*verl 0\.9\.1.*supports verl"):
        host_patches.checked("verl.utils.import_utils.is_trl_available", is_trl_available)


def test_every_internal_patched_has_the_parameters_named():
    from verl.utils import distributed, import_utils
    from vllm.model_executor.layers import utils

    for name, function in {
        "verl.utils.import_utils.is_trl_available": import_utils.is_trl_available,
        "verl.utils.distributed.initialize_global_process_group_ray": distributed.initialize_global_process_group_ray,
        "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm": utils.dispatch_cpu_unquantized_gemm,
    }.items():
        assert host_patches.checked(name, function) is function


def test_the_cpu_platform_answers_what_verl_asks():
    """In a process loaded as ``trl-length verl-smoke`` loads verl's (``cpu_platform.ENV``): verl's own device
    helpers on the ``cpu`` platform, and the process-group patch applied when verl imports its module."""
    from verl_adapter.platform.cpu import ENV

    code = (
        "import torch, verl\n"
        "from verl.utils.device import get_device_id, get_device_name, get_nccl_backend, get_torch_device\n"
        "from verl.plugin.platform import get_platform\n"
        "from verl.utils import distributed\n"
        "device = get_torch_device()\n"
        "print(type(get_platform()).__name__, torch.device(get_device_id()), get_device_name(), get_nccl_backend())\n"
        "print(device.mem_get_info()[1] > 0, device.memory_allocated(), device.is_available(), device.device_count())\n"
        "print(distributed.initialize_global_process_group_ray.cpu_backend)\n"
    )
    env = {**os.environ, **ENV, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[-4:] == ["PlatformCPU cpu cpu gloo", "True 0 True 1", "True", ""]
