"""The engine runs on one intra-op thread (docs/reference/length-penalties.md §2.6).

Its tensors are small and many: with several OpenMP threads on a busy machine each operation waits for the
pool, and reductions could split differently. One thread makes the engine's speed independent of the
process's setting and its numbers reproducible; the setting is restored afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(1)`` (nested use is free)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
