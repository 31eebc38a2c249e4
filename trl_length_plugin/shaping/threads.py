"""The engine runs on one intra-op thread (docs/reference/length-penalties.md §2.6).

Its tensors are small and many: with several OpenMP threads on a busy machine each operation waits for the
pool, and reductions could split differently. One thread makes the engine's speed independent of the
process's setting and its numbers reproducible; the setting is restored afterwards.

A colocated vLLM CPU engine binds the process's OpenMP threads to cores and replaces
``torch.set_num_threads`` with a function that refuses (and warns); the engine then leaves the thread count
alone and runs on the engine's threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(1)`` (nested use is free; a no-op where vLLM's CPU worker
    owns the thread count)."""
    threads = torch.get_num_threads()
    if threads == 1 or torch.set_num_threads is not torch._C.set_num_threads:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
