"""What the subclass and the reward wrapper share: measure rollouts on each rank, gather them across
processes, and run the group length penalties on whole groups of the gathered batch.

TRL splits a prompt group across ranks whenever ``per_device_train_batch_size * steps_per_generation``
is not a multiple of ``num_generations`` (host-trl.md §2.3), so nothing group-level may run before the
gather. The gathered batch is in sampler order, so its groups are consecutive blocks of
``num_generations`` rows (decisions.md §2.2).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from accelerate.utils import gather, gather_object

from trl_length_plugin.shaping import (
    LengthPenaltyConfig,
    LengthPenaltyResult,
    RolloutBatch,
    apply_length_penalties,
    log_group_records,
    measure_lengths,
)

logger = logging.getLogger("trl_length_plugin")

#: per-prompt metadata columns read from the top level of each dataset row (decisions.md §2.14)
METADATA_COLUMNS = ("profiled_rewards", "profiled_output_lengths", "profile_band")
NESTED_METADATA_KEY = "extra_env_info"


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
        "top-level columns and will be ignored (decisions.md §2.14). Move them to top-level columns."
    )


def resolve_reasoning_tags(config: LengthPenaltyConfig | None, tags: Sequence[str]) -> tuple[str, str]:
    """The reasoning tags: the TRL ``reasoning_tags`` key, or the block's own when only it sets them."""
    tags = (tags[0], tags[1])
    if config is None or "reasoning_tags" not in config.model_fields_set:
        return tags
    if tags != LengthPenaltyConfig.model_fields["reasoning_tags"].default and tags != config.reasoning_tags:
        raise ValueError(
            f"reasoning_tags {list(tags)} disagrees with length_penalty.reasoning_tags "
            f"{list(config.reasoning_tags)}; set one of them"
        )
    return config.reasoning_tags


def uses_tokens(config: LengthPenaltyConfig) -> bool:
    """Whether some agent measures lengths in tokens (then a tokenizer is required, decisions.md §2.5)."""
    overrides = [o for o in (config.agent_overrides or {}).values() if o is not None]
    return config.default.length_type == "tokens" or any(
        "length_type" in o.model_fields_set and o.length_type == "tokens" for o in overrides
    )


@dataclass
class LocalRollouts:
    """One rank's rollouts: agents and metadata (None when the dataset has no such column)."""

    completions: Sequence[Any]
    agents: list[Any] | None
    metadata: list[dict[str, Any]] | None

    @classmethod
    def from_columns(
        cls, completions: Sequence[Any], columns: Mapping[str, Sequence[Any]], agent_column: str
    ) -> LocalRollouts:
        """From reward-function kwargs: one list per dataset column."""
        agents = list(columns[agent_column]) if agent_column in columns else None
        present = [key for key in METADATA_COLUMNS if key in columns]
        metadata = None
        if present:
            metadata = [{key: columns[key][i] for key in present} for i in range(len(completions))]
        return cls(completions, agents, metadata)

    @classmethod
    def from_inputs(cls, completions: Sequence[Any], inputs: Sequence[Mapping[str, Any]], agent_column: str):
        """From TRL's per-example input dicts."""
        first = inputs[0] if inputs else {}
        columns = {
            key: [x.get(key) for x in inputs] for key in (agent_column, *METADATA_COLUMNS) if key in first
        }
        return cls.from_columns(completions, columns, agent_column)


@dataclass
class GatheredRollouts:
    """The whole batch across processes: ``values`` (N, k) float64 per-row numbers, agents, metadata."""

    values: torch.Tensor
    agents: list[Any] | None
    metadata: list[dict[str, Any]] | None


def measure_channels(
    local: LocalRollouts, config: LengthPenaltyConfig, tokenizer: Any, reasoning_tags: tuple[str, str]
) -> torch.Tensor:
    """(n, 2) reasoning and answer lengths of this rank's completions in each row's agent's unit (§2.5)."""
    agents = local.agents if local.agents is not None else [None] * len(local.completions)
    lengths = measure_lengths(local.completions, config.length_types(agents), tokenizer, reasoning_tags)
    return torch.stack([lengths.reasoning, lengths.answer], dim=1)


def gather_rollouts(local: LocalRollouts, values: torch.Tensor, device: torch.device) -> GatheredRollouts:
    """Gather per-row ``values`` (n, k) and the agent/metadata columns in sampler (rank) order.

    Every rank must call this with the same columns present, which holds because all ranks read the
    same dataset; ranks hold equally many rows in TRL, so rank r's rows are ``[r*n, (r+1)*n)``.
    """
    gathered = gather(values.to(device=device, dtype=torch.float64)).cpu()
    agents = gather_object(local.agents) if local.agents is not None else None
    metadata = gather_object(local.metadata) if local.metadata is not None else None
    return GatheredRollouts(gathered, agents, metadata)


def group_penalties(
    correctness: torch.Tensor,
    num_generations: int,
    rollouts: GatheredRollouts,
    config: LengthPenaltyConfig,
    is_main_process: bool,
) -> LengthPenaltyResult:
    """§2 on the gathered batch: groups are consecutive blocks of ``num_generations`` rows (§2.2);
    ``rollouts.values[:, :2]`` are the reasoning and answer lengths."""
    rows = correctness.numel()
    if rows % num_generations:
        raise ValueError(
            f"the gathered batch has {rows} rows, not a multiple of num_generations={num_generations}"
        )
    batch = RolloutBatch(
        rewards=correctness.detach().double().cpu(),
        group_index=torch.arange(rows) // num_generations,
        reasoning_lengths=rollouts.values[:, 0],
        answer_lengths=rollouts.values[:, 1],
        agents=rollouts.agents,
        metadata=rollouts.metadata,
    )
    result = apply_length_penalties(batch, config)
    log_group_records(result.groups, is_main_process=is_main_process)
    return result
