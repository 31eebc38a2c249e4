"""Shared fixtures: the embedded model built once per cache (no Hub, docs/reference/product.md §1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TRL_LENGTH_PLUGIN_CACHE", str(REPO / ".cache" / "models"))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))


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
