"""verl rollouts (TransferQueue rows) in, shaped sequence scores out: the engine calls of decisions.md §2-3.

One TransferQueue row ``{uid}_{session}_{index}`` is one rollout; its prompt group is its ``uid`` (any
order, groups of any size, §2.2), its agent its ``data_source`` (§2.3), its correctness reward the scalar
sequence score ``rm_scores.sum()`` (§2.4). A score spread over more than one token (token-level or
process rewards) is a multi-component score: its group is left untouched by both shapers. Lengths (§2.5):
the response tokens the model generated (``response_mask == 1``) are decoded and split into reasoning and
answer by the engine; the coefficient's length is the ``response_mask`` count (§3.2). Per-prompt metadata
(§2.14) is read from top-level dataset columns, else from the same keys under ``extra_info``.

Both the advantage hook and the group filter call :meth:`RolloutShaper.shape`, so they see the same
shaped rewards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trl_length_plugin.shaping import (
    LengthCoefficientResult,
    LengthPenaltyResult,
    RolloutBatch,
    apply_length_coefficient,
    apply_length_penalties,
    log_group_records,
    log_length_coefficient,
    measure_token_ids,
)

from .length_config import LengthShapingSettings

#: per-prompt metadata keys (decisions.md §2.14)
METADATA_KEYS = ("profiled_rewards", "profiled_output_lengths", "profile_band")


def padded(values: torch.Tensor, fill: float = 0) -> torch.Tensor:
    """A TransferQueue field as a right-padded ``(rows, width)`` tensor (nested jagged or already dense)."""
    return values.to_padded_tensor(fill) if values.is_nested else values


def row_lengths(values: torch.Tensor) -> torch.Tensor:
    """Per-row length of a TransferQueue response field."""
    if values.is_nested:
        return values.offsets().diff()
    return torch.full((values.shape[0],), values.shape[1], dtype=torch.long)


def check_single_output_sessions(keys: Sequence[str]) -> None:
    """Multi-output agent-loop sessions (``index > 0``) would need one length per session: not supported."""
    extra = [key for key in keys if not key.endswith("_0")]
    if extra:
        raise NotImplementedError(
            f"length shaping treats each TransferQueue row as one rollout, but agent-loop sessions with several "
            f"outputs were found (e.g. {extra[0]!r}); use an agent loop that returns one output per session"
        )


@dataclass
class ShapedScores:
    """Sequence scores of every row of a batch: ``raw`` (the reward before shaping) and ``shaped`` (float64).

    ``group_ids`` numbers the ``uid`` groups; ``shaped_rows`` are the rows given to the engine (padding
    rows excluded); ``metrics`` are decisions.md §2.15 and §3 metrics for verl's metrics dict.
    """

    raw: torch.Tensor
    shaped: torch.Tensor
    group_ids: np.ndarray
    shaped_rows: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    penalties: LengthPenaltyResult | None = None
    coefficient: LengthCoefficientResult | None = None

    @property
    def changed(self) -> torch.Tensor:
        """Rows whose score the shaping changed (only these are ever written back)."""
        return ~torch.isclose(self.shaped, self.raw, rtol=0, atol=0, equal_nan=True)


class RolloutShaper:
    """Runs the engine on TransferQueue data; ``tokenizer`` is set once verl has built it."""

    def __init__(self, settings: LengthShapingSettings, tokenizer: Any = None):
        self.settings = settings
        self.tokenizer = tokenizer

    @property
    def fields(self) -> list[str]:
        """The TransferQueue fields :meth:`shape` reads (fields a dataset lacks are simply absent)."""
        fields = ["uid", "rm_scores", "response_mask", "data_source"]
        if self.settings.penalties_on:
            fields += ["responses", "extra_info", *METADATA_KEYS]
        return fields

    def shape(
        self,
        data: Mapping[str, Any],
        keys: Sequence[str],
        padding: np.ndarray | None = None,
        step: int | None = None,
        log: bool = False,
    ) -> ShapedScores:
        """Shape the rows of ``data`` (read with :attr:`fields` for ``keys``); ``log`` emits the §3.4 lines
        and the verbose group records (the advantage hook only: filtering never logs them)."""
        check_single_output_sessions(keys)
        scores = padded(data["rm_scores"]).double()
        lengths = row_lengths(data["rm_scores"])
        rows = torch.arange(scores.shape[0])
        raw = scores.sum(-1)
        last = scores[rows, (lengths - 1).clamp(min=0)]
        multi_component = ((scores != 0).sum(-1) - (last != 0).long()) > 0
        uids = np.asarray(list(data["uid"]), dtype=object)
        group_ids = np.unique(uids, return_inverse=True)[1]

        real = torch.ones_like(raw, dtype=torch.bool) if padding is None else ~torch.as_tensor(padding)
        active = torch.nonzero(real).flatten()
        index = active.numpy()
        agents = (
            np.asarray(list(data["data_source"]), dtype=object)[index]
            if "data_source" in set(data.keys())
            else None
        )
        groups = group_ids[index]
        shaped_active = raw[active]
        result = ShapedScores(raw, raw.clone(), group_ids, active)

        if self.settings.penalties_on:
            batch = RolloutBatch(
                rewards=raw[active],
                group_index=groups,
                agents=agents,
                metadata=RowMetadata(data, index),
                multi_component=multi_component[active],
                **self._channel_lengths(data, index, agents),
            )
            result.penalties = apply_length_penalties(batch, self.settings.penalty)
            result.metrics.update(result.penalties.metrics)
            shaped_active = result.penalties.rewards.double()
            if log and self.settings.penalty.verbose:
                log_group_records(result.penalties.groups)

        if self.settings.coefficient_on:
            skipped = np.isin(groups, groups[multi_component[active].numpy()])  # whole multi-component groups
            correctness = torch.where(torch.from_numpy(skipped), torch.nan, raw[active])
            loss_lengths = padded(data["response_mask"]).sum(-1)[active]
            result.coefficient = apply_length_coefficient(
                shaped_active,
                loss_lengths,
                groups,
                self.settings.coeff,
                self.settings.min_tokens,
                correctness,
            )
            shaped_active = result.coefficient.rewards.double()
            result.metrics.update(result.coefficient.metrics())
            if log:
                session_ids = [f"step{step}/{uid}" for uid in uids[index]]
                log_length_coefficient(result.coefficient, step=step, session_ids=session_ids)

        result.shaped[active] = shaped_active
        return result

    def _channel_lengths(self, data: Mapping[str, Any], index: np.ndarray, agents: np.ndarray | None) -> dict:
        """Reasoning/answer lengths of the model-generated response tokens (decisions.md §2.5)."""
        responses = padded(data["responses"])[index]
        mask = padded(data["response_mask"])[index].bool()
        generated = torch.split(responses[mask], mask.sum(-1).tolist())
        config = self.settings.penalty
        names = agents.tolist() if agents is not None else [None] * len(index)
        lengths = measure_token_ids(
            [ids.tolist() for ids in generated],
            self.tokenizer,
            length_type=config.length_types(names),
            reasoning_tags=config.reasoning_tags,
        )
        return {"reasoning_lengths": lengths.reasoning, "answer_lengths": lengths.answer}


class RowMetadata(Sequence):
    """Per-row metadata mappings (decisions.md §2.14), built lazily: the engine reads only the first row of
    each group, and only when an agent uses metadata. Top-level dataset columns win over ``extra_info``."""

    def __init__(self, data: Mapping[str, Any], index: np.ndarray):
        self.index = index
        present = set(data.keys())  # a TensorDict refuses ``key in td``
        self.columns = {key: list(data[key]) for key in METADATA_KEYS if key in present}
        self.extra_info = list(data["extra_info"]) if "extra_info" in present else None

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, Any] | None:
        row = int(self.index[i])
        info = self.extra_info[row] if self.extra_info is not None else None
        info = info if isinstance(info, Mapping) else {}
        meta = {key: self.columns[key][row] if key in self.columns else None for key in METADATA_KEYS}
        meta = {key: info.get(key) if value is None else value for key, value in meta.items()}
        return meta if any(value is not None for value in meta.values()) else None
