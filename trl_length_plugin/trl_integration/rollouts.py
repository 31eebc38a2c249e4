"""What the subclass and the reward wrapper share: measure rollouts on each rank, gather them across
processes into one ``RolloutBatch`` of whole groups, and per-prompt metadata parsed once per run.

TRL splits a prompt group across ranks whenever ``per_device_train_batch_size * steps_per_generation``
is not a multiple of ``num_generations`` (docs/trl.md, "How it hooks into TRL"), so nothing group-level may
run before the gather. The gathered batch is in sampler order, so its groups are consecutive blocks of
``num_generations`` rows (docs/reference/length-penalties.md §2.2).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from accelerate.utils import gather, gather_object

from trl_length_plugin.shaping import GroupLayout, LengthShapingConfig, RolloutBatch, measure_lengths
from trl_length_plugin.shaping.metadata import MetadataCache, PromptMetadata

logger = logging.getLogger("trl_length_plugin")

#: per-prompt metadata columns read from the top level of each dataset row (reference §2.14)
METADATA_COLUMNS = ("profiled_rewards", "profiled_output_lengths", "profile_band")
NESTED_METADATA_KEY = "extra_env_info"
#: the column the subclass adds to a training dataset: each row's index, the key of its parsed metadata
PROMPT_ID_COLUMN = "length_prompt_id"


def nested_metadata_warning(example: Mapping[str, Any] | None) -> str | None:
    """The §2.14 warning text when ``example`` nests per-prompt metadata under ``extra_env_info``."""
    nested = example.get(NESTED_METADATA_KEY) if example is not None else None
    if not isinstance(nested, Mapping):
        return None
    keys = sorted(k for k in METADATA_COLUMNS if k in nested)
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
    return block.band_source_warning("profile_band" in columns, "the dataset has no 'profile_band' column")


@lru_cache(maxsize=8)
def consecutive_groups(rows: int, num_generations: int) -> GroupLayout:
    """The gathered batch's groups: consecutive blocks of ``num_generations`` rows (built once per size)."""
    if rows % num_generations:
        raise ValueError(
            f"the gathered batch has {rows} rows, not a multiple of num_generations={num_generations}"
        )
    return GroupLayout(torch.arange(rows) // num_generations)


class DatasetMetadata:
    """Per-prompt metadata of a map-style dataset, parsed once per prompt (``MetadataCache``), looked up
    by the ``PROMPT_ID_COLUMN`` the rows carry: no metadata crosses processes, only prompt ids."""

    def __init__(self, dataset: Any, columns: Sequence[str]):
        self.view = dataset.select_columns(list(columns))
        self.columns = list(columns)
        self.cache = MetadataCache()

    def _fetch(self, ids: list[Hashable]) -> list[dict[str, Any]]:
        rows = self.view[[int(i) for i in ids]]
        return [{key: rows[key][i] for key in self.columns} for i in range(len(ids))]

    def lookup(self, prompt_ids: torch.Tensor) -> PromptMetadata:
        return self.cache.lookup(prompt_ids.long().tolist(), self._fetch)


@dataclass
class LocalRollouts:
    """One rank's rollouts: agents, metadata and prompt ids (None when the dataset has no such column)."""

    completions: Sequence[Any]
    agents: list[Any] | None = None
    metadata: list[dict[str, Any]] | None = None
    prompt_ids: list[int] | None = None

    @classmethod
    def from_columns(
        cls, completions: Sequence[Any], columns: Mapping[str, Sequence[Any]], agent_column: str
    ) -> LocalRollouts:
        """From reward-function kwargs or TRL inputs: one list per dataset column."""
        agents = list(columns[agent_column]) if agent_column in columns else None
        present = [key for key in METADATA_COLUMNS if key in columns]
        metadata = None
        if present:
            metadata = [{key: columns[key][i] for key in present} for i in range(len(completions))]
        ids = list(columns[PROMPT_ID_COLUMN]) if PROMPT_ID_COLUMN in columns else None
        return cls(completions, agents, metadata, ids)

    @classmethod
    def from_inputs(cls, completions: Sequence[Any], inputs: Sequence[Mapping[str, Any]], agent_column: str):
        """From TRL's per-example input dicts."""
        first = inputs[0] if inputs else {}
        keys = (agent_column, *METADATA_COLUMNS, PROMPT_ID_COLUMN)
        columns = {key: [x.get(key) for x in inputs] for key in keys if key in first}
        return cls.from_columns(completions, columns, agent_column)


def gathered_batch(
    local: LocalRollouts,
    correctness: torch.Tensor,
    layout: GroupLayout,
    config: LengthShapingConfig,
    *,
    tokenizer: Any,
    loss_lengths: torch.Tensor | None = None,
    base_rewards: torch.Tensor | None = None,
    metadata: DatasetMetadata | None = None,
    device: torch.device | None = None,
) -> RolloutBatch:
    """The ``RolloutBatch`` of the whole gathered batch, with what ``config`` needs: channel lengths
    (penalties, reference §2.5), loss-mask lengths (coefficient, §3.2), agents and metadata.

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
    cached = block is not None and metadata is not None and local.prompt_ids is not None
    if cached:
        columns.append(torch.tensor(local.prompt_ids, dtype=torch.float64))
    values = (
        torch.stack([c.double() for c in columns], 1) if columns else torch.zeros(len(local.completions), 0)
    )
    values = gather(values.to(device=device)).cpu()
    rows = {}
    if block is not None:
        rows = dict(reasoning_lengths=values[:, 0], answer_lengths=values[:, 1])
        rows["agents"] = gather_object(local.agents) if local.agents is not None else None
        if cached:  # one lookup per group: metadata is per prompt
            rows["metadata"] = metadata.lookup(values[layout.first_row, -1])
        elif local.metadata is not None:
            rows["metadata"] = gather_object(local.metadata)
    if loss_lengths is not None:
        rows["loss_lengths"] = values[:, 2 if block is not None else 0]
    return RolloutBatch(correctness.detach().double().cpu(), layout, base_rewards=base_rewards, **rows)
