"""Prompt datasets and output files of the offline tools.

A prompt dataset is ``embedded`` (the embedded task, as ``trl-length grpo --dataset_name embedded`` builds
it), a JSONL, CSV or Parquet file, or a saved ``datasets`` directory (read as a rollout directory is,
``rollouts.load_saved``). Its row ``i`` has the keys ``id:<prompt_id>`` (the ``prompt_id`` column, else
``i``) and ``text:<prompt>`` (the ``prompt`` column), so rollouts may name their prompt either way
(``rollouts.id_key`` / ``rollouts.text_key``). A prompt file that is not UTF-8 (a BOM is accepted) or that
``datasets`` cannot read is a one-line error naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trl_length_plugin.offline.command import CommandError, first_line
from trl_length_plugin.offline.outputs import replacing
from trl_length_plugin.offline.rollouts import id_key, load_saved, text_key, utf8_lines

EMBEDDED = "embedded"
_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
OUTPUT_FORMATS = ".jsonl, .parquet or a directory (datasets save_to_disk)"


def load_prompts(name: str, size: int = 256, seed: int = 0):
    """The prompt dataset ``name`` (``embedded``: ``size`` problems drawn with ``seed``)."""
    if name == EMBEDDED:
        from trl_length_plugin.embedded import make_task_dataset

        return make_task_dataset(size, seed=seed)
    path = Path(name)
    if path.is_dir():
        return load_saved(path)
    if not path.is_file():
        raise CommandError(f"{name}: no such prompt dataset (a file, a datasets directory or 'embedded')")
    builder = _BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise CommandError(
            f"{name}: unknown prompt dataset format; use .jsonl, .csv, .parquet or a directory"
        )
    if builder != "parquet":
        for _ in utf8_lines(path):  # a line that is not UTF-8 is an error naming it
            pass
    import datasets

    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    except (ValueError, datasets.exceptions.DatasetGenerationError) as err:
        cause = err.__cause__ or err
        raise CommandError(f"{name}: not a readable prompt dataset: {first_line(cause)}") from None


def missing_dataset(name: str, reads_profiles: bool) -> str | None:
    """For ``trl-length grpo``'s ``dataset_name``: why a local path that does not exist cannot load (a Hub
    name is ``name`` or ``owner/name``; more slashes, a leading ``.``, ``/`` or ``~`` or a file suffix make
    a local path), naming ``trl-length profile`` when the config reads profiles (docs/profiles.md)."""
    path = Path(name).expanduser()
    local = name.count("/") > 1 or name.startswith((".", "/", "~")) or path.suffix.lower() in _BUILDERS
    if name == EMBEDDED or not local or path.exists():
        return None
    message = f"dataset_name: {name}: no such file or directory"
    if reads_profiles:
        message += (
            "; this config reads per-prompt profiles (docs/profiles.md): make the dataset first with "
            f"`trl-length profile ROLLOUTS --output {name}` (the recipe's comment has the whole command)"
        )
    return message


def columns(dataset, names) -> dict[str, list[Any]]:
    """The dataset's columns among ``names`` as Python lists (one conversion, not one read per row)."""
    present = [name for name in names if name in dataset.column_names]
    return dataset.select_columns(present).to_dict() if present else {}


def prompt_keys(dataset) -> list[tuple[str, str | None]]:
    """Per row, its ``(id key, text key or None)``."""
    values = columns(dataset, ("prompt_id", "prompt"))
    ids = values.get("prompt_id", range(len(dataset)))
    texts = values.get("prompt", [None] * len(dataset))
    try:
        return [(id_key(i), None if t is None else text_key(t)) for i, t in zip(ids, texts, strict=True)]
    except ValueError as err:
        raise CommandError(f"prompt dataset: {err}") from None


def resolve_tokenizer(name: str | None):
    """The tokenizer that counts tokens: a path or Hub name, or ``embedded`` (None: no tokenizer)."""
    if name is None:
        return None
    from trl_length_plugin.embedded import embedded_model_dir, load_tokenizer

    if name == EMBEDDED:
        return load_tokenizer(embedded_model_dir(warm_start=False))  # the same tokenizer as the warm model
    return load_pretrained("--tokenizer", name, "AutoTokenizer")


def load_pretrained(flag: str, name: str, kind: str):
    """``transformers.<kind>.from_pretrained(name)``; a path or Hub name that holds none is one line."""
    import transformers

    try:
        return getattr(transformers, kind).from_pretrained(name)
    except (OSError, ValueError) as err:  # missing files, no such repo (offline too), an invalid name
        where = "a local path" if Path(name).exists() else "no such local path; a Hub name"
        raise CommandError(f"{flag} {name}: cannot load it ({where}): {first_line(err)}") from None


def check_output(path: str | Path) -> Path:
    """The output path, if its format is one the tools write."""
    path = Path(path)
    if path.suffix and path.suffix.lower() not in (".jsonl", ".parquet"):
        raise CommandError(f"--output {path}: unknown format; use {OUTPUT_FORMATS}")
    return path


def dataset_of(columns: dict[str, list[Any]]):
    """A ``datasets.Dataset`` of these columns; a column whose values mix types (an integer in one row, a
    string in another) is a one-line error naming it: JSONL, Parquet and Arrow hold one type per column."""
    import datasets
    import pyarrow as pa

    try:
        return datasets.Dataset.from_dict(columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        for name, values in columns.items():
            try:
                pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
                kinds = sorted({type(v).__name__ for v in values if v is not None})
                raise CommandError(
                    f"column {name!r} mixes types ({', '.join(kinds)}): a written dataset holds one type per "
                    f"column ({first_line(err)})"
                ) from None
        raise


def write_dataset(dataset, path: Path) -> None:
    """Write a dataset as JSONL, Parquet or a ``datasets`` directory, by ``path`` (``outputs.replacing``)."""
    import datasets

    datasets.disable_progress_bars()
    suffix = path.suffix.lower()
    with replacing(path) as temporary:
        if suffix == ".jsonl":
            dataset.to_json(str(temporary), lines=True, force_ascii=False)
        elif suffix == ".parquet":
            dataset.to_parquet(str(temporary))
        else:
            dataset.save_to_disk(str(temporary))
