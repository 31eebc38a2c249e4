"""Prompt datasets and output files of the offline tools.

A prompt dataset is ``embedded`` (the embedded task, as ``trl-length grpo --dataset_name embedded`` builds
it), a JSONL, CSV or Parquet file, or a saved ``datasets`` directory. Its row ``i`` has the keys
``id:<prompt_id>`` (the ``prompt_id`` column, else ``i``) and ``text:<prompt>`` (the ``prompt`` column), so
rollouts may name their prompt either way (``rollouts.id_key`` / ``rollouts.text_key``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trl_length_plugin.offline.command import CommandError
from trl_length_plugin.offline.rollouts import id_key, text_key

EMBEDDED = "embedded"
#: the per-prompt metadata columns (docs/reference/length-penalties.md §2.14)
METADATA_COLUMNS = ("profiled_rewards", "profiled_output_lengths", "profile_band")
_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
OUTPUT_FORMATS = ".jsonl, .parquet or a directory (datasets save_to_disk)"


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
    import datasets

    return datasets.load_dataset(builder, data_files=str(path), split="train")


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
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


def check_output(path: str | Path) -> Path:
    """The output path, if its format is one the tools write."""
    path = Path(path)
    if path.suffix and path.suffix.lower() not in (".jsonl", ".parquet"):
        raise CommandError(f"--output {path}: unknown format; use {OUTPUT_FORMATS}")
    return path


def write_dataset(rows: dict[str, list[Any]] | Any, path: Path) -> None:
    """Write a dataset (or columns) as JSONL, Parquet or a ``datasets`` directory, by ``path``."""
    import datasets

    datasets.disable_progress_bars()
    dataset = rows if isinstance(rows, datasets.Dataset) else datasets.Dataset.from_dict(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        dataset.to_json(str(path), lines=True, force_ascii=False)
    elif suffix == ".parquet":
        dataset.to_parquet(str(path))
    else:
        dataset.save_to_disk(str(path))
