"""verl rollouts (TransferQueue rows) in, shaped sequence scores out: one call of the core's
``shape_rollouts`` per set of finished groups (docs/reference/length-penalties.md §2,
docs/reference/length-coefficient.md §3).

One TransferQueue row ``{uid}_{session}_{index}`` is one rollout; its prompt group is its ``uid`` (any
order, groups of any size, §2.2), its agent its ``data_source`` (§2.3), its correctness reward the scalar
sequence score ``rm_scores.sum()`` (§2.4). A score spread over more than one token (token-level or process
rewards) is a multi-component score: its group is left untouched by both shapers. Lengths (§2.5): the
response tokens the model generated (``response_mask == 1``) are counted and split into reasoning and answer
where the tags lie in them (the core's ``measure_token_ids``: nothing decoded and encoded again); the
coefficient's length is the ``response_mask`` count (§3.2). Per-prompt metadata (§2.14) is read from
top-level dataset columns, else from the same keys under ``extra_info``, once per prompt (a bounded cache
keyed by a fingerprint of the prompt's token ids).

Each group is shaped once: the group filter shapes groups as they finish and keeps the result by ``uid``;
the advantage step takes its groups from there and shapes only the ones the filter did not see.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trl_length_plugin.shaping import (
    GroupLayout,
    GroupRecord,
    LengthShapingConfig,
    RolloutBatch,
    ShapingRun,
    mean_metrics,
    measure_token_ids,
    metadata_columns,
    metadata_entries,
    truncated_rows,
)

_HASH_BASES = (1_000_003, 998_244_353)


def padded(values: torch.Tensor, fill: float = 0) -> torch.Tensor:
    """A TransferQueue field as a right-padded ``(rows, width)`` tensor (nested jagged or already dense)."""
    return values.to_padded_tensor(fill) if values.is_nested else values


def row_lengths(values: torch.Tensor) -> torch.Tensor:
    """Per-row length of a TransferQueue response field."""
    if values.is_nested:
        return values.offsets().diff()
    return torch.full((values.shape[0],), values.shape[1], dtype=torch.long)


def prompt_fingerprints(prompts: torch.Tensor) -> list[tuple[int, int, int]]:
    """A key per row from its prompt token ids: the length and two polynomial hashes (int64 wrap-around),
    vectorized over the batch; equal prompts give equal keys, different ones collide with negligible odds."""
    ids, lengths = padded(prompts).long(), row_lengths(prompts)
    positions = torch.arange(ids.shape[1])
    hashes = []
    for base in _HASH_BASES:
        powers = torch.full_like(positions, base).cumprod(0)  # wraps around in int64, deterministically
        hashes.append(((ids + 1) * powers * (positions < lengths[:, None])).sum(1))
    return list(zip(lengths.tolist(), hashes[0].tolist(), hashes[1].tolist(), strict=True))


def last_values(values: torch.Tensor) -> torch.Tensor:
    """Each row's value at its last position (its first when the row is empty) of a TransferQueue response
    field, in the field's dtype."""
    table, lengths = padded(values), row_lengths(values)
    return table[torch.arange(table.shape[0]), (lengths - 1).clamp(min=0)]


def check_single_output_sessions(keys: Sequence[str]) -> None:
    """Multi-output agent-loop sessions (``index > 0``) would need one length per session: not supported."""
    extra = [key for key in keys if not key.endswith("_0")]
    if extra:
        raise NotImplementedError(
            f"length shaping treats each TransferQueue row as one rollout, but agent-loop sessions with several "
            f"outputs were found (e.g. {extra[0]!r}); use an agent loop that returns one output per session"
        )


@dataclass
class ShapedRows:
    """Shaping results by TransferQueue key: the correctness the shaping judged (the raw sequence score, 0
    for a truncated row under ``truncation: incorrect``) and the shaped scores (float64), the rows the
    coefficient skipped (``host_rows``), the rows whose tokens stay in the loss (``loss_keep``, ``truncation:
    mask``, §2.19), per-row metrics, and what the logs need (verbose group records, the §3.4 records)."""

    keys: list[str]
    correctness: torch.Tensor
    shaped: torch.Tensor
    host_rows: torch.Tensor
    loss_keep: torch.Tensor
    row_metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    records: list[GroupRecord] = field(default_factory=list)
    lines: list[dict] = field(default_factory=list)

    @property
    def metrics(self) -> dict[str, float]:
        return mean_metrics(self.row_metrics)

    def take(self, keys: Sequence[str]) -> ShapedRows:
        """These rows, in this order (each group's records when all its rows are taken)."""
        position = {key: i for i, key in enumerate(self.keys)}
        index = torch.tensor([position[key] for key in keys], dtype=torch.long)
        uids = {key.split("_")[0] for key in keys}
        return ShapedRows(
            list(keys),
            self.correctness[index],
            self.shaped[index],
            self.host_rows[index],
            self.loss_keep[index],
            {name: values[index] for name, values in self.row_metrics.items()},
            [record for record in self.records if str(record.group) in uids],
            [self.lines[i] for i in index.tolist()] if self.lines else [],
        )

    @staticmethod
    def concat(parts: Sequence[ShapedRows]) -> ShapedRows:
        metrics = {
            name: torch.cat([part.row_metrics[name] for part in parts]) for name in parts[0].row_metrics
        }
        return ShapedRows(
            [key for part in parts for key in part.keys],
            torch.cat([part.correctness for part in parts]),
            torch.cat([part.shaped for part in parts]),
            torch.cat([part.host_rows for part in parts]),
            torch.cat([part.loss_keep for part in parts]),
            metrics,
            [record for part in parts for record in part.records],
            [line for part in parts for line in part.lines],
        )


class RolloutShaper:
    """Shapes TransferQueue rows with the core's ``ShapingRun`` (``run``: its config, metadata cache by prompt
    fingerprint, the shaping step); ``tokenizer`` is set once verl has built it.

    ``fetch(keys, fields)`` reads TransferQueue (``tq.kv_batch_get`` of a partition); groups shaped ahead of
    the advantage step (:meth:`shape_groups`) are kept by ``uid`` until :meth:`take` hands them out.
    ``step()`` gives the trainer's current global step (the coefficient's warm-up); ``max_response_length``
    (``data.max_response_length``) defines a truncated rollout (§2.19).
    """

    def __init__(self, run: ShapingRun, tokenizer: Any = None, step: Callable[[], int] = lambda: 0):
        self.run = run
        self.tokenizer = tokenizer
        self.step = step
        self._groups: dict[str, ShapedRows] = {}
        self.max_response_length: int | None = None

    @property
    def config(self) -> LengthShapingConfig:
        return self.run.config

    @property
    def fields(self) -> list[str]:
        """The TransferQueue fields :meth:`shape` reads besides metadata (absent fields are simply absent)."""
        fields = ["uid", "rm_scores", "response_mask", "data_source"]
        if self.config.penalties_on:
            fields += ["responses", "prompts"]
        return fields

    def shape(self, fetch: Callable, keys: Sequence[str]) -> ShapedRows:
        """Shape the rollouts ``keys`` (whole groups) in one call of the core."""
        check_single_output_sessions(keys)
        step = self.step()
        data = fetch(list(keys), self.fields)
        present = set(data.keys())  # a TensorDict refuses ``key in td``
        scores = padded(data["rm_scores"]).double()
        raw = scores.sum(-1)
        last = last_values(data["rm_scores"]).double()
        uids = np.asarray(list(data["uid"]), dtype=object)
        agents = np.asarray(list(data["data_source"]), dtype=object) if "data_source" in present else None
        layout = GroupLayout(np.unique(uids, return_inverse=True)[1])
        batch = RolloutBatch(
            rewards=raw,
            group_index=layout,
            agents=agents,
            multi_component=((scores != 0).sum(-1) - (last != 0).long()) > 0,
            loss_lengths=padded(data["response_mask"]).sum(-1) if self.config.coefficient_on else None,
            truncated=self._truncated(data),
            **(self._penalty_inputs(fetch, keys, data, agents, layout) if self.config.penalties_on else {}),
        )
        result = self.run.shape(batch, step)
        lines = self.run.coefficient_records(result, step, [f"step{step}/{uid}" for uid in uids])
        records = result.penalties.groups if result.penalties is not None else []
        for record in records:
            record.group = uids[record.rows[0]]
        keep = torch.ones_like(raw, dtype=torch.bool) if result.loss_keep is None else result.loss_keep
        return ShapedRows(
            list(keys),
            result.correctness,
            result.rewards,
            result.host_rows,
            keep,
            result.row_metrics,
            records,
            lines,
        )

    def _penalty_inputs(
        self,
        fetch: Callable,
        keys: Sequence[str],
        data: Mapping,
        agents: np.ndarray | None,
        layout: GroupLayout,
    ):
        """Channel lengths of the model-generated response tokens (§2.5) and per-prompt metadata (§2.14)."""
        responses = padded(data["responses"])
        mask = padded(data["response_mask"]).bool()
        generated = torch.split(responses[mask], mask.sum(-1).tolist())
        block = self.config.penalties
        names = agents.tolist() if agents is not None else [None] * len(keys)
        lengths = measure_token_ids(
            [ids.tolist() for ids in generated],
            self.tokenizer,
            length_type=block.length_types(names),
            reasoning_tags=self.config.tags,
        )
        inputs = {"reasoning_lengths": lengths.reasoning, "answer_lengths": lengths.answer}
        if block.uses_metadata:  # one lookup per group: metadata is per prompt
            first_rows = layout.first_row.tolist()
            fingerprints = prompt_fingerprints(data["prompts"])
            prompts = [fingerprints[row] for row in first_rows]
            row_of = {prompt: keys[row] for prompt, row in zip(prompts, first_rows, strict=True)}

            def entries(new: list) -> list:
                rows = [row_of[prompt] for prompt in new]
                names = metadata_columns()
                data = fetch(rows, [*names, "extra_info"])
                present = set(data.keys())  # a TensorDict refuses ``key in td``
                columns = {key: list(data[key]) for key in names if key in present}
                nested = list(data["extra_info"]) if "extra_info" in present else [None] * len(rows)
                return metadata_entries(columns, len(rows), nested)

            inputs["metadata"] = self.run.metadata.lookup(prompts, entries)
        return inputs

    def _truncated(self, data: Mapping) -> torch.Tensor | None:
        """The truncated flag per row when some agent sets ``truncation`` (§2.19)."""
        block = self.config.penalties
        if block is None or not block.truncation_modes:
            return None
        if self.max_response_length is None:
            raise ValueError("length_penalty.truncation needs data.max_response_length")
        stops = [self.tokenizer.eos_token_id, self.tokenizer.pad_token_id]
        responses = data["responses"]
        return truncated_rows(
            last_values(responses).long(), row_lengths(responses), stops, self.max_response_length
        )

    def shape_groups(self, fetch: Callable, keys: Sequence[str]) -> ShapedRows:
        """Shape finished groups ahead of the advantage step and keep them by ``uid``."""
        rows = self.shape(fetch, keys)
        for uid in dict.fromkeys(key.split("_")[0] for key in keys):
            self._groups[uid] = rows.take([key for key in keys if key.split("_")[0] == uid])
        return rows

    def forget(self, uids) -> None:
        """Drop kept groups (filtered out, or cleared by verl)."""
        for uid in uids:
            self._groups.pop(uid, None)

    def take(self, fetch: Callable, keys: Sequence[str]) -> ShapedRows:
        """The rows ``keys`` of an advantage batch: kept groups handed out (and forgotten), the rest shaped."""
        uids = [key.split("_")[0] for key in keys]
        unseen = [key for key, uid in zip(keys, uids, strict=True) if uid not in self._groups]
        parts = [self._groups.pop(uid) for uid in dict.fromkeys(uids) if uid in self._groups]
        if unseen:
            parts.append(self.shape(fetch, unseen))
        return ShapedRows.concat(parts).take(keys) if parts else self.shape(fetch, keys)
