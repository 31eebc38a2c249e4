"""What the offline subcommands share: one-line errors, ``trl-length <sub>: error: ...``, exit status 2,
no traceback (the convention of ``trl-length grpo``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from trl_length_plugin.shaping.config import LengthConfigError


class CommandError(Exception):
    """A problem the user can fix (a bad flag, file or config); reported as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """``argparse`` whose errors are the one line ``<prog>: error: <message>`` (no usage block)."""

    def error(self, message: str):
        fail(self.prog, message)


def first_line(err: BaseException) -> str:
    """An exception's message as one line (the first)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def fail(prog: str, message: str):
    """Print ``<prog>: error: <message>`` on stderr and exit with status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def run(prog: str, body: Callable[[], None]) -> None:
    """Run ``body``; a ``CommandError``, a config error or a file that cannot be read or written ends it
    with one line."""
    try:
        body()
    except (CommandError, LengthConfigError) as err:
        fail(prog, str(err))
    except OSError as err:
        if not err.filename:
            raise
        fail(prog, f"{err.filename}: {err.strerror or err}")
