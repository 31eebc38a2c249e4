"""The rollout file of ``trl-length profile`` and ``trl-length preview`` (docs/profiles.md, "Rollout
format"): one row per rollout, in JSONL (``.jsonl``/``.json``), CSV, Parquet or a saved ``datasets``
directory.

- prompt key: ``prompt_id`` (an integer or a string) or, without it, ``prompt`` (text or chat messages);
- the completion: ``completion`` (text, or chat messages as TRL gives them), and/or ``reasoning_tokens``
  and ``answer_tokens`` (token counts of the two channels of docs/reference/length-penalties.md §2.5,
  used whenever lengths are counted in tokens);
- ``reward``: the correctness reward, a finite number or null (a missing reward, TRL's ``None``);
- optional ``group`` (rows sharing it are one group in ``preview``; default: the prompt key),
  ``completion_tokens`` (the loss-mask token count, for the length coefficient) and any other column.

Rows are read one at a time and handed on in chunks; a row that breaks these rules is reported with its
line (text formats) or row number, skipped and counted by reason. Text files are UTF-8 (a BOM is accepted);
a line that is not is an error naming the file and line, or, with ``skip_invalid_utf8``, skipped and
counted with one warning. Rows of one prompt key that disagree on the prompt or the agent are an error.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trl_length_plugin.config_base import DuplicateKeyError, read_json
from trl_length_plugin.offline.command import CommandError, first_line
from trl_length_plugin.shaping import columns
from trl_length_plugin.shaping.columns import AGENT_COLUMN

#: the columns that describe one rollout (everything else in a row is prompt-level or ignored)
ROLLOUT_COLUMNS = frozenset(columns.ROLLOUT_COLUMNS)
_CSV_NUMBERS = ("reward", "reasoning_tokens", "answer_tokens", "completion_tokens")
CHUNK_ROWS = 4096
SHOWN = 20  # skipped rows reported one by one; the rest are only counted
MAX_COUNT = 2**31 - 1  # the largest token count a row may give
INVALID_UTF8 = "not valid UTF-8"


def id_key(value: Any) -> str:
    """The key of a ``prompt_id`` (an integer or a string; ``3`` and ``"3"`` are the same prompt)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"prompt_id must be an integer or a string, got {type(value).__name__}")
    return f"id:{value}"


def text_key(value: Any) -> str:
    """The key of a ``prompt``: its text, or its chat messages as sorted JSON."""
    if isinstance(value, str):
        return f"text:{value}"
    if isinstance(value, list):
        return "text:" + json.dumps(value, sort_keys=True, ensure_ascii=False)
    raise ValueError(f"prompt must be text or chat messages, got {type(value).__name__}")


@dataclass
class Rollout:
    """One valid row: ``where`` is its line or row number; ``reward`` is NaN for a missing reward;
    ``tokens`` the (reasoning, answer) token counts when given; ``row`` the row as read."""

    where: int
    key: str
    reward: float
    completion: Any
    tokens: tuple[int, int] | None
    completion_tokens: int | None
    group: str | None
    row: dict[str, Any]


def _count(row: dict[str, Any], name: str) -> int | None:
    value = row.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0")
    if value > MAX_COUNT:
        raise ValueError(f"{name} must be at most {MAX_COUNT}")
    return value


def _reward(value: Any) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError("reward must be a finite number or null")
    return float(value)


def _completion(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(message, dict) for message in value):
        return value
    raise ValueError("completion must be text or a list of chat messages")


def parse_rollout(where: int, row: dict[str, Any]) -> Rollout | str:
    """The rollout of one row, or the reason it is skipped."""
    try:
        if row.get("prompt_id") is not None:
            key = id_key(row["prompt_id"])
        elif row.get("prompt") is not None:
            key = text_key(row["prompt"])
        else:
            return "no prompt key (prompt_id or prompt)"
        reward = _reward(row.get("reward"))
        completion = _completion(row.get("completion"))
        reasoning, answer = _count(row, "reasoning_tokens"), _count(row, "answer_tokens")
        tokens = None if reasoning is None or answer is None else (reasoning, answer)
        if completion is None and tokens is None:
            return "no completion (completion, or reasoning_tokens and answer_tokens)"
        group = row.get("group")
        if group is not None and (isinstance(group, bool) or not isinstance(group, int | str)):
            return "group must be an integer or a string"
        group = None if group is None else str(group)
        return Rollout(where, key, reward, completion, tokens, _count(row, "completion_tokens"), group, row)
    except ValueError as err:
        return str(err)


# -- reading ----------------------------------------------------------------------------------------------
def utf8_lines(path: Path, skip_invalid: bool = False) -> Iterator[tuple[int, str | None]]:
    """``(line number, text)`` of a UTF-8 file (a BOM on the first line is dropped); a line that is not
    UTF-8 is a ``CommandError`` naming it, or with ``skip_invalid`` comes as ``(number, None)``."""
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, 1):
            try:
                yield number, raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                if not skip_invalid:
                    detail = f"byte {raw[err.start]:#04x} at column {err.start + 1}"
                    raise invalid_utf8(path, number, detail) from None
                yield number, None


def invalid_utf8(path: Path, number: int, detail: str) -> CommandError:
    return CommandError(
        f"{path}: line {number}: {INVALID_UTF8} ({detail}); fix the file, or skip such lines with "
        "--skip-invalid-utf8"
    )


def _lone_surrogate(row: dict) -> bool:
    """Whether a JSON row holds a ``\\udXXX`` escape of half a surrogate pair (text no UTF-8 file holds)."""
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _jsonl_rows(path: Path, skip_invalid: bool) -> Iterator[tuple[int, dict | str]]:
    for number, line in utf8_lines(path, skip_invalid):
        if line is None:
            yield number, INVALID_UTF8
            continue
        if not line.strip():
            continue
        try:
            row = read_json(line)
        except (
            DuplicateKeyError
        ) as err:  # json keeps the second silently: which one the user meant is unknown
            yield number, str(err)
            continue
        except ValueError:
            yield number, "not valid JSON"
            continue
        if "\\ud" in line.lower() and _lone_surrogate(row):
            if not skip_invalid:
                raise invalid_utf8(path, number, "a \\u escape of a lone surrogate")
            yield number, INVALID_UTF8
            continue
        yield number, row if isinstance(row, dict) else "not a JSON object"


def _csv_value(name: str | None, text: Any) -> Any:
    """CSV cells are text: the number columns become numbers, an empty cell is null."""
    if name not in _CSV_NUMBERS or not isinstance(text, str):
        return text
    if not text.strip():
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _csv_rows(path: Path, skip_invalid: bool) -> Iterator[tuple[int, dict | str]]:
    invalid: list[int] = []  # lines not UTF-8, read as empty lines (csv skips those)

    def texts() -> Iterator[str]:
        for number, line in utf8_lines(path, skip_invalid):
            if line is None:
                invalid.append(number)
            yield "" if line is None else line

    reader = csv.DictReader(texts())
    for row in reader:
        while invalid:
            yield invalid.pop(0), INVALID_UTF8
        if None in row:
            yield reader.line_num, "more fields than the header"
            continue
        yield reader.line_num, {name: _csv_value(name, text) for name, text in row.items()}
    yield from ((number, INVALID_UTF8) for number in invalid)


def _parquet_rows(path: Path) -> Iterator[tuple[int, dict | str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    number = 0
    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=CHUNK_ROWS):
            for row in batch.to_pylist():
                number += 1
                yield number, row
    except (pa.ArrowException, OSError) as err:
        raise CommandError(f"{path}: row {number + 1}: not readable as Parquet: {first_line(err)}") from None


def load_saved(path: str | Path):
    """A ``datasets`` directory: a ``Dataset``, or the ``train`` (or only) split of a ``DatasetDict``."""
    import datasets

    try:
        saved = datasets.load_from_disk(str(path))
    except FileNotFoundError as err:
        raise CommandError(f"{path}: not a saved datasets directory ({err})") from None
    if isinstance(saved, datasets.DatasetDict):
        if "train" not in saved and len(saved) != 1:
            raise CommandError(f"{path}: a DatasetDict without a train split ({', '.join(saved)})")
        saved = saved["train"] if "train" in saved else next(iter(saved.values()))
    return saved


def _dataset_rows(dataset) -> Iterator[tuple[int, dict | str]]:
    number = 0
    for batch in dataset.iter(batch_size=CHUNK_ROWS):
        names = list(batch)
        for values in zip(*batch.values(), strict=True):
            number += 1
            yield number, dict(zip(names, values, strict=True))


@dataclass
class RolloutSource:
    """A rollout file: ``unit`` names its positions (``line`` or ``row``); ``total`` its row count when
    the format knows it (Parquet, ``datasets``)."""

    path: Path
    unit: str
    total: int | None
    skip_invalid_utf8: bool = False

    @classmethod
    def open(cls, path: str | Path, skip_invalid_utf8: bool = False) -> RolloutSource:
        path = Path(path)
        if path.is_dir():
            return cls(path, "row", len(load_saved(path)))
        if not path.is_file():
            raise CommandError(f"{path}: no such file or directory")
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".json", ".csv"):
            return cls(path, "line", None, skip_invalid_utf8)
        if suffix == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            try:
                return cls(path, "row", pq.ParquetFile(path).metadata.num_rows)
            except pa.ArrowException as err:
                raise CommandError(f"{path}: not a Parquet file: {first_line(err)}") from None
        raise CommandError(
            f"{path}: unknown rollout format; use .jsonl, .csv, .parquet or a datasets directory"
        )

    def rows(self) -> Iterator[tuple[int, dict | str]]:
        """``(position, row)`` for every row, or ``(position, reason)`` for one that cannot be read."""
        if self.path.is_dir():
            return _dataset_rows(load_saved(self.path))
        suffix = self.path.suffix.lower()
        if suffix == ".csv":
            return _csv_rows(self.path, self.skip_invalid_utf8)
        if suffix == ".parquet":
            return _parquet_rows(self.path)
        return _jsonl_rows(self.path, self.skip_invalid_utf8)


class PromptCheck:
    """Rows under one prompt key must agree on the prompt and the agent where they give them (null or
    empty is not given): the first value of each, with its position, per key."""

    def __init__(self, source: RolloutSource, agent_column: str):
        self.source = source
        self.fields = ("prompt", agent_column)
        self.seen: dict[tuple[str, str], tuple[int, Any]] = {}

    def check(self, rollout: Rollout) -> None:
        for name in self.fields:
            value = rollout.row.get(name)
            if value is None or value == "":  # not given (an empty CSV cell)
                continue
            where, first = self.seen.setdefault((rollout.key, name), (rollout.where, value))
            if first != value:
                kind, _, key = rollout.key.partition(":")
                label = f"prompt_id {key}" if kind == "id" else f"prompt {_short(key)}"
                unit = self.source.unit
                raise CommandError(
                    f"{self.source.path}: {unit} {rollout.where}: {label} has {name} {_short(value)}, but "
                    f"{unit} {where} has {_short(first)}: the rows of one prompt must agree (give different "
                    "prompts different prompt_ids)"
                )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class RolloutReader:
    """Reads a rollout file in chunks of valid rollouts under a progress bar; skipped rows are reported
    (the first ``SHOWN`` of them with their position) and counted by reason in ``skipped``."""

    def __init__(
        self,
        path: str | Path,
        prog: str,
        agent_column: str = AGENT_COLUMN,
        skip_invalid_utf8: bool = False,
    ):
        self.source = RolloutSource.open(path, skip_invalid_utf8)
        self.prompts = PromptCheck(self.source, agent_column)
        self.prog = prog
        self.rows_read = 0
        self.skipped: Counter[str] = Counter()
        self._bar = None

    def skip(self, where: int, reason: str) -> None:
        """Count a skipped row; report it while fewer than ``SHOWN`` have been."""
        shown = sum(self.skipped.values())
        self.skipped[reason] += 1
        if reason == INVALID_UTF8:
            if self.skipped[reason] == 1:
                self._write(
                    f"{self.prog}: warning: {self.source.path}: {self.source.unit} {where}: {reason}; such "
                    "lines are skipped (--skip-invalid-utf8) and counted, not shown"
                )
        elif shown < SHOWN:
            self._write(f"{self.prog}: {self.source.path}: {self.source.unit} {where}: {reason}; skipped")
        elif shown == SHOWN:
            self._write(f"{self.prog}: further skipped rows are counted, not shown")

    def _write(self, message: str) -> None:
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr)

    def chunks(self) -> Iterator[list[Rollout]]:
        """Lists of at most ``CHUNK_ROWS`` valid rollouts, in file order."""
        from tqdm.auto import tqdm

        self._bar = tqdm(
            total=self.source.total,
            desc="rollouts",
            unit=" rows",
            file=sys.stderr,
            mininterval=0.5,
            disable=None,  # shown on a terminal only: errors and warnings stay whole lines in logs
        )
        chunk: list[Rollout] = []
        try:
            for where, row in self.source.rows():
                self.rows_read += 1
                parsed = row if isinstance(row, str) else parse_rollout(where, row)
                if isinstance(parsed, str):
                    self.skip(where, parsed)
                else:
                    self.prompts.check(parsed)
                    chunk.append(parsed)
                if len(chunk) == CHUNK_ROWS:
                    yield chunk
                    chunk = []
                    self._bar.update(self.rows_read - self._bar.n)
            if chunk:
                yield chunk
            self._bar.update(self.rows_read - self._bar.n)
        finally:
            self._bar.close()
            self._bar = None

    def skipped_summary(self) -> str:
        """``N (reason: n, ...)``, most frequent reason first."""
        total = sum(self.skipped.values())
        if not total:
            return "0"
        return f"{total} (" + ", ".join(f"{reason}: {n}" for reason, n in self.skipped.most_common()) + ")"

    def check_some_valid(self, valid: int) -> None:
        """End the command when the file held no rollout at all, or only skipped rows."""
        if self.rows_read == 0:
            raise CommandError(f"{self.source.path} holds no rollouts (empty file)")
        if valid == 0:
            raise CommandError(
                f"{self.source.path} holds no valid rollout: {self.rows_read} rows read, skipped "
                f"{self.skipped_summary()}"
            )


def channel_lengths(
    rollouts: list[Rollout], units: list[str], tokenizer: Any, tags: tuple[str, str], position: str = "row"
) -> list[tuple[int, int] | str]:
    """Each rollout's (reasoning, answer) length in its unit (reference §2.5), or why it has none: token
    counts in the row when the unit is tokens, else the completion measured by the core's
    ``measure_lengths`` (one call per chunk). ``position`` names row positions in errors."""
    out: list[tuple[int, int] | str] = ["token counts only; chars need the completion text"] * len(rollouts)
    texts = []
    for i, (rollout, unit) in enumerate(zip(rollouts, units, strict=True)):
        if unit == "tokens" and rollout.tokens is not None:
            out[i] = rollout.tokens
        elif rollout.completion is not None:
            if unit == "tokens" and tokenizer is None:
                raise CommandError(
                    f"lengths in tokens need --tokenizer to measure completion text (first at "
                    f"{position} {rollout.where}), or reasoning_tokens and answer_tokens in the rows"
                )
            texts.append(i)
    if texts:
        from trl_length_plugin.shaping.lengths import measure_lengths  # torch: only to measure text

        completions = [rollouts[i].completion for i in texts]
        lengths = measure_lengths(completions, [units[i] for i in texts], tokenizer, tags)
        pairs = zip(lengths.reasoning.tolist(), lengths.answer.tolist(), strict=True)
        for i, pair in zip(texts, pairs, strict=True):
            out[i] = pair
    return out
