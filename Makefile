# The two commands of the README. Each does its own setup (scripts/setup.sh is idempotent).
PY := .venv/bin/python
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRL_LENGTH_PLUGIN_CACHE ?= $(CURDIR)/.cache/models
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions

.PHONY: setup demo test lint bench recipe-smoke trl-compat

setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m trl_length_plugin.tools.demo

test: setup lint
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

bench: setup
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) -m bench.$$(basename $$b .py) || exit 1; done

recipe-smoke: setup
	OMP_NUM_THREADS=2 $(PY) -m trl_length_plugin.tools.commands recipe-smoke

# Not CI: the TRL test subset in one .venv-trl-X.Y per TRL release, the pinned set with only trl swapped
# (docs/trl.md, "Supported TRL versions"); TRL_VERSIONS="1.14.2 1.15.0 1.16.0" by default.
trl-compat:
	bash scripts/trl_compat.sh
