#!/usr/bin/env bash
# Which TRL releases the plugin works with (docs/trl.md, "Supported TRL versions"): for each version, a
# .venv-trl-X.Y with the pinned CPU set (constraints/cpu.txt) and only trl swapped: the TRL extra, the test extra
# and Triton (no vLLM, DeepSpeed or verl), then the TRL test subset in it. Not part of CI: `make trl-compat`.
#
#   TRL_VERSIONS="1.14.2 1.15.0 1.16.0" bash scripts/trl_compat.sh [PYTEST ARGS ...]
#
# Logs go to .cache/trl-compat/<version>.log; the last lines are one PASS/FAIL line per version. The tests run
# with scripts/trl_compat_plugin.py, which lets the installed TRL through the plugin's version gate (its other
# checks stay), so a release outside the supported range can be measured before the range is widened.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
versions=${TRL_VERSIONS:-"1.14.2 1.15.0 1.16.0"}
# the TRL tests that need neither vLLM nor DeepSpeed nor several processes
subset=(tests/test_trl_host.py tests/test_trl_shaping.py tests/test_trl_rollout_terms.py tests/test_trl_wrapper.py
        tests/test_luspo_trl.py tests/test_trl_length_schedule.py tests/test_trl_target_length.py
        tests/test_trl_model_card.py tests/test_trl_keys.py tests/test_all_wrong_groups.py)
mkdir -p .cache/trl-compat
export TRL_LENGTH_PLUGIN_CACHE=${TRL_LENGTH_PLUGIN_CACHE:-$root/.cache/models} OMP_NUM_THREADS=1
results=()
for version in $versions; do
  venv=.venv-trl-${version%.*}
  constraints=.cache/trl-compat/constraints-$version.txt
  sed "s/^trl==.*/trl==$version/" constraints/cpu.txt > "$constraints"
  want=$(cat "$constraints" pyproject.toml "$0" | sha256sum | cut -d' ' -f1)
  if [ ! -f "$venv/.stamp" ] || [ "$(cat "$venv/.stamp")" != "$want" ]; then
    echo "[trl-compat] building $venv (trl==$version)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -c constraints/cpu.txt torch==2.13.0
    # triton: in the pinned set (vLLM's dependencies bring it); TRL 1.15's fused LM head imports it
    "$venv/bin/python" -m pip install -q -c constraints/cpu.txt -e ".[trl,test]" triton
    # then trl alone, against the same pins (pip warns when pyproject's trl extra does not yet allow it)
    "$venv/bin/python" -m pip install -q -c "$constraints" "trl==$version" \
      || { results+=("FAIL trl==$version: does not install with the pinned set"); continue; }
    echo "$want" > "$venv/.stamp"
  fi
  installed=$("$venv/bin/python" -c 'import trl; print(trl.__version__)')
  log=.cache/trl-compat/$version.log
  echo "[trl-compat] trl==$installed: ${#subset[@]} test files -> $log"
  if PYTHONPATH=scripts "$venv/bin/python" -m pytest -q -p no:cacheprovider -p trl_compat_plugin "${subset[@]}" "$@" > "$log" 2>&1; then
    results+=("PASS trl==$installed: $(tail -1 "$log")")
  else
    results+=("FAIL trl==$installed: $(tail -1 "$log")")
  fi
done
printf '%s\n' "${results[@]}"
! printf '%s\n' "${results[@]}" | grep -q '^FAIL'
