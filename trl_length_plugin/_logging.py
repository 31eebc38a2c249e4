"""The ``trl_length_plugin`` logger: visible by default, silent when the application configured logging.

Like transformers' library logger, it carries its own stderr handler, so its lines appear without any
``logging`` setup; that handler stays quiet whenever the root logger has handlers of its own (the
application's configuration, pytest's capture), and records still propagate to them. Its level follows the
host: the TRL trainer sets it from ``log_level`` / ``log_level_replica`` (docs/trl.md, "Logs").
"""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "trl_length_plugin"


class _DefaultHandler(logging.StreamHandler):
    """Writes to stderr only while the root logger has no handler (no logging configured)."""

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


def library_logger() -> logging.Logger:
    """The package logger, with its default handler attached once."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(handler, _DefaultHandler) for handler in logger.handlers):
        handler = _DefaultHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(levelname)s|%(name)s] %(message)s"))
        logger.addHandler(handler)
    return logger
