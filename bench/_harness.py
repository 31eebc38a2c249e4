"""Shared benchmark harness: medians of repeated runs and one printed line per case.

Every benchmark compares against a baseline measured in the same run and prints
``case | measured | baseline | ratio`` so results read the same on any machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timeit(fn: Callable[[], object], repeat: int = 7, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeat`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def header(title: str) -> None:
    """Print the column header of a benchmark table."""
    print(f"# {title}")
    print(f"{'case':<48} {'measured':>14} {'baseline':>14} {'ratio':>9}")


def report(case: str, measured: float, baseline: float, unit: str = "ms") -> float:
    """Print one case: measured figure, same-run baseline and measured/baseline; returns the ratio."""
    ratio = measured / baseline if baseline else float("inf")
    print(f"{case:<48} {measured:>11.3f} {unit:<2} {baseline:>11.3f} {unit:<2} {ratio:>9.3f}")
    return ratio


def _status(field: str) -> int:
    """A field of this process's ``/proc/self/status`` in bytes (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> int:
    """Reset this process's peak RSS (``clear_refs`` 5 resets ``VmHWM``) and return the RSS now, in bytes."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    return _status("VmRSS:")


def peak_since(reset_rss: int) -> int:
    """The bytes the peak RSS rose above ``reset_rss`` (what :func:`reset_peak` returned) since the reset."""
    return _status("VmHWM:") - reset_rss
