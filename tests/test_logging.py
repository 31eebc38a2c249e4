"""The plugin's logger (docs/trl.md, "Logs"): at INFO with its own stderr handler by default, never inside a
progress bar, the TRL trainer's level rule, and the command line's dropped accelerator notices."""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys

import tqdm

from trl_length_plugin._logging import (
    LOGGER_NAME,
    _DefaultHandler,
    drop_accelerator_notices,
    plugin_log_level,
)


def test_plugin_lines_show_by_default_without_logging_setup():
    """A bare script: the logger is at INFO and its handler writes to stderr; the root logger is untouched."""
    code = (
        "import logging, trl_length_plugin; logging.getLogger('trl_length_plugin').info('settings line');"
        "print(len(logging.getLogger().handlers), logging.getLogger().level)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "[INFO|trl_length_plugin] settings line\n"
    assert done.stdout.split() == ["0", str(logging.WARNING)]


def test_a_line_never_lands_inside_a_progress_bar(monkeypatch):
    """While a tqdm bar is on the stream, the handler clears it first: the line starts a segment of its own."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as with no logging configured
    stream = io.StringIO()
    handler = _DefaultHandler(stream)
    handler.setFormatter(logging.Formatter("[%(levelname)s|%(name)s] %(message)s"))
    record = logging.LogRecord(LOGGER_NAME, logging.INFO, __file__, 1, "Length penalty: step=0", None, None)
    with tqdm.tqdm(total=2, file=stream, ascii=True) as bar:
        bar.update(1)
        handler.emit(record)
    segments = re.split(r"[\r\n]", stream.getvalue())
    (line,) = [segment for segment in segments if "Length penalty" in segment]
    assert line == "[INFO|trl_length_plugin] Length penalty: step=0"
    handler.emit(record)  # no bar: a plain line
    assert stream.getvalue().endswith("\n[INFO|trl_length_plugin] Length penalty: step=0\n")


def test_trainer_level_is_info_while_log_level_is_passive(tmp_path):
    from transformers import TrainingArguments

    def level(**kwargs) -> int:
        return plugin_log_level(TrainingArguments(output_dir=str(tmp_path), report_to="none", **kwargs))

    assert level() == logging.INFO
    assert level(log_level="warning") == logging.WARNING and level(log_level="debug") == logging.DEBUG


def test_accelerator_notices_are_dropped_and_nothing_else(caplog):
    drop_accelerator_notices()
    drop_accelerator_notices()  # once per logger, however often called
    deepspeed = logging.getLogger("DeepSpeed")
    assert len(deepspeed.filters) == 1
    with caplog.at_level(logging.WARNING):
        deepspeed.warning("Setting accelerator to CPU. If you have GPU or other accelerator, ...")
        logging.getLogger("vllm.triton_utils.importing").warning("Triton is installed, but ...")
        deepspeed.warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]
