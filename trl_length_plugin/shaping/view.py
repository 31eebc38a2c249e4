"""One bucket of prompt groups as slot-major matrices, the input every length algorithm reads
(docs/reference/length-penalties.md §2.6)."""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import torch

from .agents import AgentParams
from .fields import CHANNELS
from .groups import Bucket, any_set, row_any, row_count, row_min_max, row_pick, row_sorted


@dataclass
class GroupView:
    """Row matrices ``[width, Gb]`` of one bucket and per-group parameters ``p(name)`` (Gb,).

    ``processed``: rows of groups being shaped; ``correctness``: the correctness with NaN read as 0;
    ``positive``: rows of groups being shaped with correctness > 0; ``eligible``: positive rows of groups
    with at least two positives (§2.6); ``rewards``: the correctness, for the group terms the rollout reward
    after the per-rollout terms (§2.6). Who is a top scorer is judged on the correctness (§2.7): a
    per-rollout term never moves a row out of the comparisons a shorter one is in.
    """

    bucket: Bucket
    params: AgentParams
    rewards: torch.Tensor
    channel_lengths: torch.Tensor  # [width, len(CHANNELS), Gb]
    processed: torch.Tensor
    correctness: torch.Tensor
    truncated: torch.Tensor | None = None  # [width, Gb] bool, the hosts' truncated flag (§2.19)

    @functools.cached_property
    def positive(self) -> torch.Tensor:
        return self.processed & (self.correctness > 0)

    @functools.cached_property
    def lengths(self) -> dict[str, torch.Tensor]:
        """One ``[width, Gb]`` view per channel."""
        return {channel: self.channel_lengths[:, i] for i, channel in enumerate(CHANNELS)}

    @functools.cached_property
    def shaped_groups(self) -> torch.Tensor:
        """(Gb,) the groups being shaped."""
        return row_any(self.processed)

    @functools.cached_property
    def n_positive(self) -> torch.Tensor:
        return row_count(self.positive)

    @functools.cached_property
    def eligible(self) -> torch.Tensor:
        return self.positive & (self.n_positive >= 2)

    @functools.cached_property
    def threshold(self) -> torch.Tensor:
        """§2.7: the positive correctness at index max(0, int(n_pos * top_percentile) - 1) sorted descending."""
        lowest, highest = row_min_max(self.correctness, self.eligible)
        varied = lowest < highest
        if not any_set(varied):
            return highest
        descending = ((self.n_positive * self.p("top_percentile")).floor().long() - 1).clamp(min=0)
        picked = row_pick(row_sorted(self.correctness, self.eligible), self.n_positive - 1 - descending)
        return torch.where(varied, picked, highest)

    @functools.cached_property
    def top(self) -> torch.Tensor:
        """Top scorers: eligible rows whose correctness is at or above the threshold (§2.7)."""
        return self.eligible & (self.correctness >= self.threshold)

    def p(self, name: str) -> torch.Tensor:
        return self.bucket.take(self.params[name])

    def on(self, *names: str) -> bool:
        """Whether a group of this bucket sets each of these parameters above 0 (read from the agents' own
        values when they agree, so a batch of one agent compares no tensor)."""
        agreed = self.params.agree(names)
        if agreed is not None:
            return agreed
        return any_set(functools.reduce(operator.and_, (self.p(name) > 0 for name in names)))

    def channels_on(self, template: str) -> list[str]:
        """The channels (reasoning, answer, total order) whose ``template.format(channel)`` is on."""
        return [channel for channel in CHANNELS if self.on(template.format(channel))]

    def stacked(self, template: str, channels: list[str]) -> torch.Tensor:
        """The parameter ``template.format(channel)`` of each channel, (C, Gb)."""
        return torch.stack([self.p(template.format(channel)) for channel in channels])

    def channel_of(self, name: str) -> torch.Tensor:
        """``[width, Gb]`` lengths of the channel each group's parameter ``name`` names."""
        index = self.p(name).long()
        return self.channel_lengths.gather(1, index.expand(self.bucket.width, 1, -1)).squeeze(1)

    def stacked_lengths(self, channels: list[str]) -> torch.Tensor:
        """``[width, C, Gb]`` lengths: the channels run through one set of tensor operations."""
        if tuple(channels) == CHANNELS:
            return self.channel_lengths
        return self.channel_lengths[:, [CHANNELS.index(channel) for channel in channels]]
