"""Reading a ``trl-length verl-smoke`` run: the first real error of its output and the process it came from,
its metrics file, and the one screen it ends with (docs/verl.md, "Try your config on a laptop")."""

from __future__ import annotations

import contextlib
import json
import math
import re
from pathlib import Path

#: the metrics of the one screen: (column, verl metric keys, first found is shown)
COLUMNS = (
    ("reward", ("critic/score/mean",)),
    ("shaped", ("critic/rewards/mean",)),
    ("resp len", ("response_length/mean",)),
    ("adjusted", ("length_penalty/adjusted_frac",)),
    ("coeff pen.", ("length_penalty/coeff_penalized_frac",)),
    ("luspo ratio", ("actor/luspo_seq_ratio_mean",)),
    ("pg_loss", ("actor/pg_loss",)),
    ("grad_norm", ("actor/grad_norm",)),
    ("head mass", ("score_centering/head_mass",)),
    ("correction", ("score_centering/correction_mean", "score_centering/correction")),
    ("logp corr", ("training/rollout_actor_probs_pearson_corr",)),
)
#: metric prefixes the plugin writes (shown in the screen's last line of each step)
PLUGIN_PREFIXES = ("length_penalty/", "length_coeff/", "actor/luspo_", "score_centering/")


#: a terminal colour code
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: Ray's prefix of a worker's line: ``(TaskRunner pid=123)``, ``(WorkerDict pid=4, ip=...)``, ``(pid=5)``
_WORKER = re.compile(r"^\((?:(?P<worker>[\w.:-]+) )?pid=(?P<pid>\d+)(?:, ip=[^)]*)?\)\s?")
#: Ray's wrapper of a remote error, naming the actor method it came from
_RAY_TASK = re.compile(r"^ray\.exceptions\.\w+(?:\(\w+\))?: ray::(?P<worker>[\w.]+)\(\) \(pid=(?P<pid>\d+)")
#: vLLM's logger prefix of an error line, with the engine process that wrote it where there is one:
#: ``(Worker pid=7) ERROR 12-04 11:16:17 [multiproc_executor.py:1058] ``
_VLLM_ERROR = re.compile(
    r"^(?:\((?P<worker>[\w.:-]+) pid=(?P<pid>\d+)\)\s)?ERROR \d\d-\d\d [\d:]+ \[[^\]]*\]\s?"
)
#: the line that ends a traceback: ``Name: message`` or a bare ``Name``, not indented
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(?::\s|$)")
#: an exception line outside a traceback
_ERROR = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception)\b:\s")


def first_error(lines: list[str]) -> str | None:
    """The first real error of a run's output, with the process it came from: the exception line that ends the
    first traceback (of each process's output on its own; Ray's ``RayTaskError`` wrappers skipped, the innermost
    actor method they name kept), else the first exception line; ``RewardLoopWorker pid=4410: RuntimeError: ...``."""
    in_traceback: set[str] = set()  # the processes whose output is inside a traceback
    candidate, task = None, None
    for raw in lines:
        raw = _ANSI.sub("", raw)
        match = _WORKER.match(raw)
        line = raw[match.end() :] if match else raw
        source = f"{match['worker'] or 'worker'} pid={match['pid']}" if match else "driver"
        logged = _VLLM_ERROR.match(line)
        if logged:  # a vLLM engine's traceback, logged line by line
            line = line[logged.end() :]
            source = f"{logged['worker']} pid={logged['pid']}" if logged["pid"] else source
        worker = source if match or logged else (task or "driver")
        if line.startswith("Traceback (most recent call last)"):
            in_traceback.add(source)
            continue
        wrapper = _RAY_TASK.match(line)
        if wrapper:
            task = f"{wrapper['worker']} pid={wrapper['pid']}"
            continue
        if source in in_traceback and _RAISED.match(line):
            return f"{worker}: {line.strip()}"
        if candidate is None and _ERROR.match(line.strip()):
            candidate = f"{worker}: {line.strip()}"
    return candidate


def read_metrics(path: Path) -> dict[int, dict[str, float]]:
    """step -> metrics, from verl's file logger."""
    steps: dict[int, dict[str, float]] = {}
    if not path.exists():
        return steps
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            row = json.loads(line)
            steps[int(row["step"])] = row["data"]
    return steps


def cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:.4g}" if isinstance(value, (int, float)) else str(value)


def summary_lines(lines: list[str]) -> list[str]:
    """The plugin's ``Length penalty:`` summary lines of a run's output (docs/reference/length-coefficient.md §3.4)."""
    found = []
    for raw in lines:
        text = _ANSI.sub("", raw)
        at = text.find("Length penalty:")
        if at >= 0:
            found.append(text[at:])
    return found


def screen(metrics: dict[int, dict[str, float]]) -> list[str]:
    """The per-step table, then each step's plugin metrics."""
    shown = [(name, keys) for name, keys in COLUMNS if any(k in m for m in metrics.values() for k in keys)]
    lines = ["step " + " ".join(f"{name:>10}" for name, _ in shown)]
    for step, row in sorted(metrics.items()):
        cells = [next((row[k] for k in keys if k in row), None) for _, keys in shown]
        lines.append(f"{step:>4} " + " ".join(f"{cell(c):>10}" for c in cells))
    for step, row in sorted(metrics.items()):
        plugin = {k: v for k, v in row.items() if k.startswith(PLUGIN_PREFIXES)}
        if plugin:
            lines.append(
                f"step {step} plugin: " + ", ".join(f"{k}={cell(v)}" for k, v in sorted(plugin.items()))
            )
    return lines


def verdict(metrics: dict[int, dict[str, float]], steps: int, plugin_expected: bool) -> str | None:
    """None when the run trained ``steps`` steps with a finite loss and grad norm (and, when the config uses the
    plugin, its metrics at every step); else what is missing."""
    if sorted(metrics) != list(range(1, steps + 1)):
        return f"trained steps {sorted(metrics)}, expected 1-{steps}"
    for step, row in metrics.items():
        for key in ("actor/pg_loss", "actor/grad_norm"):
            value = row.get(key)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                return f"step {step}: {key} is {value!r}"
        if plugin_expected and not any(k.startswith(PLUGIN_PREFIXES) for k in row):
            return f"step {step}: none of the plugin's metrics ({', '.join(PLUGIN_PREFIXES)}) was logged"
    return None


# -- the command -----------------------------------------------------------------------------------------------
