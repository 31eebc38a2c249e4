"""Every file the offline tools write (docs/profiles.md, "Outputs"): the rollouts of ``--generate``, the
profiled dataset (JSONL, Parquet or a ``datasets`` directory), the preview's JSONL and PNG.

- ``Outputs.claim`` checks an output path before any work: it must not resolve (symlinks, ``..``, hard
  links) to an input, into an input directory or onto a directory holding one, nor to another output; an
  existing one is replaced only with ``--overwrite``, and a directory only when it is a saved dataset.
- ``replacing`` writes through a temporary path in the output's own folder and renames it into place at the
  end, so an interrupted or failed run leaves the old output whole (a directory is moved aside, the new one
  renamed in, then the old one deleted).
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from trl_length_plugin.offline.command import CommandError

#: files ``datasets.save_to_disk`` writes; a directory holding one may be replaced by a new dataset
DATASET_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")


def _real(path: str | Path) -> Path:
    return Path(path).expanduser().resolve()


def _same(a: Path, b: Path) -> bool:
    """Whether two resolved paths are one file (hard links too)."""
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


class Outputs:
    """The outputs of one command, checked against its inputs and each other."""

    def __init__(self, inputs: Iterable[str | Path | None], overwrite: bool):
        """``inputs``: the paths the command reads (names that are no path, ``embedded`` or JSON, are
        ignored); ``overwrite``: the ``--overwrite`` flag."""
        self.taken = [
            (f"the input {name}", _real(name)) for name in inputs if name is not None and os.path.exists(name)
        ]
        self.overwrite = overwrite

    def claim(self, path: str | Path, flag: str, directory: bool = False) -> Path:
        """The resolved path to write ``flag``'s output to (``directory``: a ``datasets`` directory)."""
        real = _real(path)
        for what, other in self.taken:
            if _same(real, other):
                raise CommandError(f"{flag} {path} is {what}: write it to another path")
            if other.is_relative_to(real):
                raise CommandError(f"{flag} {path} holds {what}: write it to another path")
            if real.is_relative_to(other) and other.is_dir():
                raise CommandError(f"{flag} {path} is inside {what}: write it to another path")
        if real.exists():
            if not self.overwrite:
                raise CommandError(f"{flag} {path} exists: pass --overwrite to replace it")
            if real.is_dir() and not (directory and _replaceable(real)):
                raise CommandError(f"{flag} {path} is a directory that is not a saved dataset: not replaced")
        self.taken.append((f"{flag} {path}", real))
        return real


def _replaceable(directory: Path) -> bool:
    """An empty directory or a saved dataset."""
    return not any(directory.iterdir()) or any((directory / name).exists() for name in DATASET_MARKERS)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path next to ``path`` (same suffix, so writers that pick a format by it still do);
    renamed to ``path`` when the block ends without an error, deleted when it raises or is interrupted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    temporary = path.with_name(f".{path.name}.{token}.tmp{path.suffix}")
    try:
        yield temporary
        if temporary.is_dir() or path.is_dir():
            _swap_directory(temporary, path, path.with_name(f".{path.name}.{token}.old"))
        else:
            os.replace(temporary, path)
    except BaseException:
        _remove(temporary)
        raise


def _swap_directory(new: Path, path: Path, old: Path) -> None:
    """Move ``path`` aside to ``old``, ``new`` to ``path``, then delete ``old`` (put back if the move fails)."""
    moved = path.exists()
    if moved:
        path.rename(old)
    try:
        new.rename(path)
    except BaseException:
        if moved:
            old.rename(path)
        raise
    _remove(old)


#: the ``--help`` text of both tools on their outputs (docs/profiles.md, "Outputs")
OUTPUTS_HELP = (
    "Outputs: a path that resolves to an input (or a directory holding one) is refused; an existing output "
    "is replaced only with --overwrite (a directory only when it is a saved dataset); every output is "
    "written to a temporary file in its folder and renamed at the end, so an interrupted run leaves the "
    "old one whole. Text inputs are UTF-8 (a BOM is accepted)."
)
