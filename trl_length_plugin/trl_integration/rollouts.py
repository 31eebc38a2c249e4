"""What the subclass and the reward wrapper share: measure rollouts on each rank, gather them across
processes into one ``RolloutBatch`` of whole groups, and per-prompt metadata parsed once per run.

Metadata is read from the rows themselves, so any dataset works, a streaming ``IterableDataset`` included:
nothing needs a row count or random access (docs/reference/length-penalties.md §2.14).

TRL splits a prompt group across ranks whenever ``per_device_train_batch_size * steps_per_generation``
is not a multiple of ``num_generations`` (docs/trl.md, "How it hooks into TRL"), so nothing group-level may
run before the gather. The gathered batch is in sampler order, so its groups are consecutive blocks of
``num_generations`` rows (docs/reference/length-penalties.md §2.2).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from accelerate.utils import gather, gather_object

from trl_length_plugin.shaping import (
    GroupLayout,
    LengthShapingConfig,
    MetadataCache,
    PromptMetadata,
    RolloutBatch,
    entry_key,
    measure_lengths,
    metadata_entries,
    truncated_rows,
)
from trl_length_plugin.shaping.columns import PROFILE_BAND
from trl_length_plugin.shaping.config import BAND_CHANNELS
from trl_length_plugin.shaping.terms import metadata_columns, metadata_keys, prompt_columns

logger = logging.getLogger("trl_length_plugin")

NESTED_METADATA_KEY = "extra_env_info"


def parsed_widths() -> tuple[int, ...]:
    """The widths of a parsed entry's parts in the gathered tensor: bands, profile statistics, flags, target
    length, then each term column."""
    return (len(BAND_CHANNELS) * 3, 3, len(metadata_keys()), 1, *(c.width for c in prompt_columns()))


def nested_metadata_warning(example: Mapping[str, Any] | None) -> str | None:
    """The §2.14 warning text when ``example`` nests per-prompt metadata under ``extra_env_info``."""
    nested = example.get(NESTED_METADATA_KEY) if example is not None else None
    if not isinstance(nested, Mapping):
        return None
    keys = sorted(k for k in metadata_columns() if k in nested)
    if not keys:
        return None
    return (
        f"length_penalty: the dataset nests {keys} under '{NESTED_METADATA_KEY}'; they are read only from "
        "top-level columns and will be ignored (reference §2.14). Move them to top-level columns."
    )


def band_source_warning(config: LengthShapingConfig, columns: Sequence[str]) -> str | None:
    """The setup warning when a profile gate or band is on but no band can be found anywhere (the core's
    rule, said once per run, §2.12-2.13)."""
    block = config.penalties
    if block is None:
        return None
    return block.band_source_warning(PROFILE_BAND in columns, f"the dataset has no {PROFILE_BAND!r} column")


@lru_cache(maxsize=8)
def consecutive_groups(rows: int, num_generations: int) -> GroupLayout:
    """The gathered batch's groups: consecutive blocks of ``num_generations`` rows (built once per size)."""
    if rows % num_generations:
        raise ValueError(
            f"the gathered batch has {rows} rows, not a multiple of num_generations={num_generations}"
        )
    return GroupLayout(torch.arange(rows) // num_generations)


class RowMetadata:
    """Per-prompt metadata read from the rows each rank holds, parsed once per distinct entry into ``cache``
    (the run's ``MetadataCache``, keyed by ``entry_key``, reference §2.14). Only the parsed table crosses
    processes, as float64 columns of the batch's one gather; no row index or row count is needed, so
    streaming datasets work."""

    def __init__(self, cache: MetadataCache | None = None):
        self.cache = MetadataCache() if cache is None else cache

    def local_columns(self, entries: Sequence[Any]) -> torch.Tensor:
        """(rows, sum(parsed_widths())) float64: each local row's parsed entry, flattened."""
        keys = [entry_key(entry) for entry in entries]
        by_key = dict(zip(keys, entries, strict=True))
        table = self.cache.lookup(keys, lambda new: [by_key[key] for key in new])
        parts = [table.bands.flatten(1), table.profiled, table.invalid.double(), table.target[:, None]]
        return torch.cat([*parts, *(table.columns[column.name] for column in prompt_columns())], 1)

    @staticmethod
    def from_columns(values: torch.Tensor) -> PromptMetadata:
        """The ``PromptMetadata`` of gathered ``local_columns`` rows."""
        bands, profiled, invalid, target, *columns = values.split(parsed_widths(), 1)
        return PromptMetadata(
            bands.reshape(-1, len(BAND_CHANNELS), 3),
            profiled.contiguous(),
            invalid.bool(),
            target[:, 0].clone(),
            {column.name: part.contiguous() for column, part in zip(prompt_columns(), columns, strict=True)},
        )


@dataclass
class LocalRollouts:
    """One rank's rollouts: agents and metadata entries (None when the dataset has no such column)."""

    completions: Sequence[Any]
    agents: list[Any] | None = None
    metadata: list[dict[str, Any] | None] | None = None

    @classmethod
    def from_columns(
        cls, completions: Sequence[Any], columns: Mapping[str, Sequence[Any]], agent_column: str
    ) -> LocalRollouts:
        """From reward-function kwargs or TRL inputs: one list per dataset column."""
        agents = list(columns[agent_column]) if agent_column in columns else None
        return cls(completions, agents, metadata_entries(columns, len(completions)))

    @classmethod
    def from_inputs(cls, completions: Sequence[Any], inputs: Sequence[Mapping[str, Any]], agent_column: str):
        """From TRL's per-example input dicts."""
        first = inputs[0] if inputs else {}
        keys = (agent_column, *metadata_columns())
        columns = {key: [x.get(key) for x in inputs] for key in keys if key in first}
        return cls.from_columns(completions, columns, agent_column)


def truncated_flags(completion_ids: Sequence[Sequence[int]], stop_ids: Sequence[int]) -> torch.Tensor:
    """Per local row, whether the completion is truncated: its last token is not an end-of-sequence or pad
    token (the core's rule without a length limit, TRL's own ``is_truncated``;
    docs/reference/length-penalties.md §2.19)."""
    lengths = torch.tensor([len(ids) for ids in completion_ids], dtype=torch.long)
    last = torch.tensor([int(ids[-1]) if len(ids) else -1 for ids in completion_ids], dtype=torch.long)
    return truncated_rows(last, lengths, stop_ids)


def gathered_batch(
    local: LocalRollouts,
    correctness: torch.Tensor,
    layout: GroupLayout,
    config: LengthShapingConfig,
    *,
    tokenizer: Any,
    loss_lengths: torch.Tensor | None = None,
    base_rewards: torch.Tensor | None = None,
    metadata: RowMetadata | None = None,
    device: torch.device | None = None,
    truncated: torch.Tensor | None = None,
) -> RolloutBatch:
    """The ``RolloutBatch`` of the whole gathered batch, with what ``config`` needs: channel lengths
    (penalties, reference §2.5), loss-mask lengths (coefficient, §3.2), the truncated flags (§2.19), agents
    and, when some agent reads it, metadata (parsed through ``metadata``, the caller's cache kept across steps, else a fresh one).

    Every rank must call this with the same columns present, which holds because all ranks read the
    same dataset; ranks hold equally many rows in TRL, so rank r's rows are ``[r*n, (r+1)*n)``.
    """
    block = config.penalties
    columns = []
    if block is not None:
        agents = local.agents if local.agents is not None else [None] * len(local.completions)
        lengths = measure_lengths(local.completions, block.length_types(agents), tokenizer, config.tags)
        columns += [lengths.reasoning, lengths.answer]
    if loss_lengths is not None:
        columns.append(loss_lengths)
    if truncated is not None:
        columns.append(truncated)
    reads_metadata = block is not None and block.uses_metadata and local.metadata is not None
    if reads_metadata:
        columns.append((metadata or RowMetadata()).local_columns(local.metadata))
    n = len(local.completions)
    values = torch.cat([c.double().reshape(n, -1) for c in columns], 1) if columns else torch.zeros(n, 0)
    values = gather(values.to(device=device)).cpu()
    rows = {}
    if block is not None:
        rows = dict(reasoning_lengths=values[:, 0], answer_lengths=values[:, 1])
        rows["agents"] = gather_object(local.agents) if local.agents is not None else None
        if reads_metadata:  # each group reads its first row: metadata is per prompt
            rows["metadata"] = RowMetadata.from_columns(values[layout.first_row, -sum(parsed_widths()) :])
    column = 2 if block is not None else 0
    if loss_lengths is not None:
        rows["loss_lengths"] = values[:, column]
        column += 1
    if truncated is not None:
        rows["truncated"] = values[:, column] > 0
    return RolloutBatch(correctness.detach().double().cpu(), layout, base_rewards=base_rewards, **rows)
