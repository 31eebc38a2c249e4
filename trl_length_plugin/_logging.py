"""The ``trl_length_plugin`` logger: visible by default, silent when the application configured logging.

Like transformers' library logger, it carries its own stderr handler, so its lines appear without any
``logging`` setup; that handler stays quiet whenever the root logger has handlers of its own (the
application's configuration, pytest's capture), and records still propagate to them. Its level is INFO
until the host sets it: the TRL trainer sets it from ``log_level`` / ``log_level_replica`` (INFO on the main
process while ``log_level`` is ``passive``, docs/trl.md, "Logs"). While a tqdm progress bar is on screen the
handler writes through ``tqdm.write``, so a line never lands inside the bar.
"""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "trl_length_plugin"
#: the host libraries the command line keeps at WARNING unless the user asks for more (docs/trl.md, "Logs")
HOST_LOGGERS = ("transformers", "datasets", "DeepSpeed", "vllm", "accelerate")
#: (logger, message start) of the notices every CPU run prints; the command line drops them
ACCELERATOR_NOTICES = (
    ("vllm.triton_utils.importing", "Triton is installed"),
    ("DeepSpeed", "Setting accelerator to CPU"),
)


class _DefaultHandler(logging.StreamHandler):
    """Writes to stderr only while the root logger has no handler (no logging configured)."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return
        tqdm = sys.modules.get("tqdm")
        if tqdm is None or not getattr(tqdm.tqdm, "_instances", None):
            super().emit(record)
            return
        try:
            tqdm.tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


def library_logger() -> logging.Logger:
    """The package logger at INFO (unless a level was set), with its default handler attached once."""
    logger = logging.getLogger(LOGGER_NAME)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not any(isinstance(handler, _DefaultHandler) for handler in logger.handlers):
        handler = _DefaultHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(levelname)s|%(name)s] %(message)s"))
        logger.addHandler(handler)
    return logger


def plugin_log_level(args) -> int:
    """The plugin logger's level for a trainer's ``TrainingArguments``: TRL's process level, but INFO on the
    main process while ``log_level`` is ``passive`` (TRL's default leaves transformers at WARNING)."""
    if args.log_level == "passive" and args.should_log:
        return logging.INFO
    return args.get_process_log_level()


class _DropNotice(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def quiet_host_logs() -> None:
    """Keep the host libraries' loggers at WARNING (for the command line, before TRL is imported). vLLM
    reads its level from ``VLLM_LOGGING_LEVEL`` (also in its engine processes): WARNING unless set."""
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    for name in HOST_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def drop_accelerator_notices() -> None:
    """Drop the accelerator notices every CPU run prints (``ACCELERATOR_NOTICES``), before TRL is imported."""
    for name, start in ACCELERATOR_NOTICES:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNotice) and f.start == start for f in logger.filters):
            logger.addFilter(_DropNotice(start))
