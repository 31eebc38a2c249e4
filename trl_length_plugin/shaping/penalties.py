"""The eight group length algorithms of ``length-penalties.md``, vectorized over a batch (decisions.md §2).

Per group, in the order of decisions.md §2.6: agent, binary check, profile gate, shortest bonus, longest
penalty, group-relative scaling and zMAD (at least two positive rollouts), profiled-length penalty,
pass-rate penalty, sum and clamp at 0, profile-band multipliers. Groups are packed into slot-major ``[width,
groups]`` matrices (``groups.GroupLayout``) and every step is a tensor operation over all of them; the
only Python loops run over distinct agents and over bucket widths (one when groups have equal sizes).
The per-channel algorithms run on the channels stacked as ``[width, channel, groups]`` (one pass for all
channels). Sums over a group run in row order (``groups.row_sum``) so they equal a plain loop bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .band import GATE_FIELDS, band_multiplier, gate_limits, profile_gate
from .batch import RolloutBatch
from .config import BAND_CHANNELS, CHANNELS, DEFAULT_AGENT, LengthPenaltyConfig, LengthPenaltyParams
from .groups import (
    Bucket,
    row_any,
    row_count,
    row_first_extreme,
    row_max,
    row_median,
    row_min,
    row_pick,
    row_sorted,
    row_sum,
    weights,
)
from .metadata import METADATA_KEYS, GroupMetadata, group_metadata
from .records import GroupRecord, build_records

BINARY_TOLERANCE = 1e-6  # §2.4
ZMAD_SCALE = 0.6745  # Iglewicz-Hoaglin, §2.9
ZMAD_MIN_RELATIVE_MAD = 0.015

METRIC_KEYS = (
    "length_penalty/env_reward_mean",
    "length_penalty/reward_delta_mean",
    "length_penalty/wiped_correct_frac",
    "length_penalty/adjusted_frac",
    "length_penalty/skipped_non_binary_frac",
    "length_penalty/invalid_metadata_frac",
    "length_penalty/pct_all_wrong",
    "length_penalty/pct_all_correct",
    "length_penalty/pct_mixed",
)
_CHOICES = {
    "group_length_penalty_profile_gate_channel": BAND_CHANNELS,
    "group_length_penalty_profile_gate_field": GATE_FIELDS,
}
_BAND_TO_CHANNEL = torch.tensor([CHANNELS.index(channel) for channel in BAND_CHANNELS])
TERMS = (
    *(f"{channel}_bonus" for channel in CHANNELS),
    *(f"{kind}_{channel}" for kind in ("longest", "group", "zmad") for channel in CHANNELS),
    "profiled",
    "pass_rate",
)


@dataclass
class LengthPenaltyResult:
    """``rewards``: shaped, one per row, in the input's dtype (rows of skipped groups are the input,
    bit for bit); ``env_rewards``: the input; ``metrics``: §2.15 (empty when nothing is enabled);
    ``groups``: per-group records, built only when ``verbose`` is on."""

    rewards: torch.Tensor
    env_rewards: torch.Tensor
    metrics: dict[str, float]
    groups: list[GroupRecord] = field(default_factory=list)


class AgentParams:
    """The merged parameters of the agents in a batch as per-group tensors (a loop over agents only)."""

    def __init__(self, config: LengthPenaltyConfig, group_agents: list[Any] | None, num_groups: int):
        if group_agents is None:
            keys: list[Any] = [None]
            self.codes = torch.zeros(num_groups, dtype=torch.long)
        else:
            keys = list(dict.fromkeys(group_agents))
            lookup = {key: code for code, key in enumerate(keys)}
            codes = np.fromiter(map(lookup.__getitem__, group_agents), dtype=np.int64, count=num_groups)
            self.codes = torch.from_numpy(codes)
        self.names = [DEFAULT_AGENT if key is None else str(key) for key in keys]
        self.params: list[LengthPenaltyParams] = [config.for_agent(name) for name in self.names]
        self._cache: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        """Per-group values of a parameter: bool, float64, or for a string its index in its options."""
        if name not in self._cache:
            values = [getattr(params, name) for params in self.params]
            if name in _CHOICES:
                tensor = torch.tensor([_CHOICES[name].index(value) for value in values])
            else:
                tensor = torch.tensor(
                    values, dtype=torch.bool if isinstance(values[0], bool) else torch.float64
                )
            self._cache[name] = tensor.index_select(0, self.codes)
        return self._cache[name]

    def uses(self, *names: str) -> bool:
        """Whether any agent sets one of these parameters to a non-zero value."""
        return any(getattr(p, name) for p in self.params for name in names)

    def agents_where(self, flags: torch.Tensor) -> list[str]:
        """Names of the agents owning at least one flagged group."""
        return [self.names[code] for code in torch.unique(self.codes[flags]).tolist()]


@dataclass
class _Packed:
    """One bucket of groups: row matrices ``[width, Gb]`` and per-group parameters ``p(name)`` (Gb,)."""

    bucket: Bucket
    params: AgentParams
    rewards: torch.Tensor
    lengths: dict[str, torch.Tensor]  # views into ``channel_lengths``
    channel_lengths: torch.Tensor  # [width, len(CHANNELS), Gb]
    positive: torch.Tensor  # rows of shaped groups with reward > 0
    eligible: torch.Tensor  # positive rows of groups with at least two positives (§2.6)

    def p(self, name: str) -> torch.Tensor:
        return self.bucket.take(self.params[name])

    def on(self, name: str) -> bool:
        """Whether a group of this bucket sets the parameter above 0."""
        return bool((self.p(name) > 0).any())

    def stacked(self, template: str, channels: list[str]) -> torch.Tensor:
        """The parameter ``template.format(channel)`` of each channel, (C, Gb)."""
        return torch.stack([self.p(template.format(channel)) for channel in channels])

    def stacked_lengths(self, channels: list[str]) -> torch.Tensor:
        """``[width, C, Gb]`` lengths: the channels run through one set of tensor operations."""
        if tuple(channels) == CHANNELS:
            return self.channel_lengths
        return self.channel_lengths[:, [CHANNELS.index(channel) for channel in channels]]


def _top_threshold(g: _Packed, n_positive: torch.Tensor) -> torch.Tensor:
    """The positive reward at index max(0, int(n_pos * top_percentile) - 1) sorted descending."""
    highest = row_max(g.rewards, g.eligible)
    varied = row_min(g.rewards, g.eligible) < highest
    if not bool(varied.any()):
        return highest
    descending = ((n_positive * g.p("top_percentile")).floor().long() - 1).clamp(min=0)
    picked = row_pick(row_sorted(g.rewards, g.eligible), n_positive - 1 - descending)
    return torch.where(varied, picked, highest)


def _shortest_bonus(g: _Packed, threshold: torch.Tensor) -> dict[str, torch.Tensor]:
    """§2.7: per channel, the shortest non-empty positive rollout (lowest index on ties) gets the bonus
    when its running adjusted reward (reward plus the bonuses before it) is at least the top threshold."""
    channels = [channel for channel in CHANNELS if g.on(f"{channel}_bonus")]
    if not channels:
        return {}
    x = g.stacked_lengths(channels)
    winners = row_first_extreme(x, g.eligible[:, None] & (x > 0), False)
    bonus = g.stacked("{}_bonus", channels)
    running, terms = g.rewards, {}
    for i, channel in enumerate(channels):
        terms[f"{channel}_bonus"] = weights(winners[:, i] & (running >= threshold)).mul_(bonus[i])
        running = running + terms[f"{channel}_bonus"]
    return terms


def _longest_penalty(g: _Packed, top: torch.Tensor) -> dict[str, torch.Tensor]:
    """§2.7: per channel, the longest non-empty top scorer (lowest index on ties) loses the penalty when
    there are at least two such top scorers."""
    channels = [channel for channel in CHANNELS if g.on(f"longest_{channel}_penalty")]
    if not channels:
        return {}
    x = g.stacked_lengths(channels)
    candidates = top[:, None] & (x > 0)
    loser = row_first_extreme(x, candidates, True)
    penalty = g.stacked("longest_{}_penalty", channels)
    lost = weights(loser & (row_count(candidates) >= 2)).mul_(-penalty)
    return {f"longest_{channel}": lost[:, i] for i, channel in enumerate(channels)}


def _group_relative(g: _Packed, gate_open: torch.Tensor) -> dict[str, torch.Tensor]:
    """§2.8: ``coeff * (w - mean(w))``, ``w = 1 - (x - min) / (max - min)`` over the positives (0 when
    all lengths are equal); a closed profile gate zeroes it (§2.13)."""
    channels = [channel for channel in CHANNELS if g.on(f"group_{channel}_length_penalty_coeff")]
    if not channels:
        return {}
    member = (g.eligible & gate_open)[:, None]
    count = row_count(member).clamp(min=1)
    x = g.stacked_lengths(channels)
    low = row_min(x, member)
    span = row_max(x, member) - low
    spread = span > 0
    weight = (x - low).div_(torch.where(spread, span, 1.0)).neg_().add_(1).mul_(weights(member & spread))
    coeff = g.stacked("group_{}_length_penalty_coeff", channels)
    weight.sub_(row_sum(weight) / count).mul_(coeff).mul_(weights(member))
    return {f"group_{channel}": weight[:, i] for i, channel in enumerate(channels)}


def _zmad(g: _Packed) -> dict[str, torch.Tensor]:
    """§2.9: subtract the penalty where 0.6745 (x - median) / MAD > threshold among the positives;
    nothing when MAD is 0 or MAD / max(median, 1e-9) < 0.015."""
    channels = [
        channel
        for channel in CHANNELS
        if bool(((g.p(f"{channel}_zmad_threshold") > 0) & (g.p(f"{channel}_zmad_penalty") > 0)).any())
    ]
    if not channels:
        return {}
    threshold, penalty = g.stacked("{}_zmad_threshold", channels), g.stacked("{}_zmad_penalty", channels)
    member = g.eligible[:, None] & (threshold > 0) & (penalty > 0)
    count = row_count(member)
    x = g.stacked_lengths(channels)
    median = row_median(x, member, count)
    deviation = x - median
    above = deviation > 0  # z > threshold > 0 needs it; then |z| is z
    mad = row_median(deviation.abs_(), member, count)
    usable = (mad != 0) & (mad / median.clamp(min=1e-9) >= ZMAD_MIN_RELATIVE_MAD)
    z = deviation.mul_(ZMAD_SCALE).div_(torch.where(usable, mad, 1.0))
    flagged = weights(member & usable & above & (z > threshold)).mul_(-penalty)
    return {f"zmad_{channel}": flagged[:, i] for i, channel in enumerate(channels)}


def _pass_rate(g: _Packed, n_positive: torch.Tensor, terms: dict[str, torch.Tensor]) -> None:
    """§2.11: ``-w * rho * total / l_max`` on correct rows, l_max the longest correct total."""
    weight = g.p("pass_rate_length_penalty_weight")
    if bool((weight > 0).any()):
        rho = n_positive.double() / row_count(g.bucket.valid).double()
        longest = row_max(g.lengths["total"], g.positive)
        on = (rho > 0) & (longest > 0)
        term = (g.lengths["total"] * (-weight * rho)).div_(torch.where(on, longest, 1.0))
        terms["pass_rate"] = term.mul_(g.positive & on)


def _shape_bucket(
    bucket: Bucket,
    params: AgentParams,
    rows: dict[str, torch.Tensor],
    meta: GroupMetadata,
    limits: torch.Tensor,
    profiled_threshold: torch.Tensor,
    keep_terms: bool,
) -> dict[str, torch.Tensor]:
    """All algorithms for the groups of one bucket; returns packed row outputs and per-group outputs
    (the per-algorithm terms and band multipliers only with ``keep_terms``, for verbose records)."""
    valid = bucket.valid
    rewards = bucket.pack(rows["rewards"])
    clean = rewards.nan_to_num(0.0)
    non_binary = torch.isnan(rewards) | (
        (rewards.abs() > BINARY_TOLERANCE) & ((rewards - 1).abs() > BINARY_TOLERANCE)
    )
    if "multi_component" in rows:
        non_binary |= bucket.pack(rows["multi_component"], False)
    enabled = bucket.take(params["enabled"])
    skipped = enabled & row_any(non_binary & valid)
    shaped_groups = enabled & ~skipped
    processed = valid & shaped_groups
    positive = processed & (clean > 0)
    n_positive = row_count(positive)
    channel_lengths = bucket.pack(torch.stack([rows[channel] for channel in CHANNELS]))
    lengths = {channel: channel_lengths[:, i] for i, channel in enumerate(CHANNELS)}
    eligible = positive & (n_positive >= 2)
    g = _Packed(bucket, params, clean, lengths, channel_lengths, positive, eligible)

    gate_open = torch.ones_like(shaped_groups)
    gate_mean = torch.full(gate_open.shape, math.nan, dtype=torch.float64)
    gate_reason = torch.zeros(gate_open.shape, dtype=torch.long)
    if params.uses("group_length_penalty_profile_gate"):
        channel_of = _BAND_TO_CHANNEL[g.p("group_length_penalty_profile_gate_channel")]
        chosen = channel_lengths.gather(1, channel_of.expand(bucket.width, 1, -1)).squeeze(1)
        gate_open, gate_mean, gate_reason = profile_gate(
            g.p("group_length_penalty_profile_gate") & shaped_groups,
            bucket.take(limits),
            g.p("group_length_penalty_profile_gate_positive_only"),
            chosen,
            positive,
            processed,
        )

    terms: dict[str, torch.Tensor] = {}
    adjustment = torch.zeros_like(clean)

    def add(step: dict[str, torch.Tensor]) -> None:
        """Sum the terms in algorithm order as each one finishes; keep them only for the verbose records,
        so each algorithm's ``[width, channel, groups]`` temporaries are freed before the next one."""
        for term in step.values():
            adjustment.add_(term)
        if keep_terms:
            terms.update(step)

    threshold = _top_threshold(g, n_positive)
    add(_shortest_bonus(g, threshold))
    add(_longest_penalty(g, eligible & (clean >= threshold)))
    add(_group_relative(g, gate_open))
    add(_zmad(g))
    plp = g.p("profiled_length_penalty")
    if bool((plp > 0).any()):
        limit = bucket.take(profiled_threshold)
        terms["profiled"] = (processed & (lengths["total"] >= limit) & (adjustment >= 0)) * -plp
    _pass_rate(g, n_positive, terms)
    additive = adjustment + terms.get("profiled", 0.0) + terms.get("pass_rate", 0.0)
    shaped = additive.add_(clean).clamp_(min=0)

    banded = positive & (shaped > 0)  # §2.12: originally correct and still above 0 after the clamp
    multipliers = {}
    for channel in BAND_CHANNELS:
        if params.uses(f"profile_band_{channel}"):
            apply = banded & g.p(f"profile_band_{channel}")
            multiplier = band_multiplier(lengths[channel], bucket.take(meta.bands[channel]), apply)
            shaped.mul_(multiplier)
            if keep_terms:
                multipliers[channel] = multiplier
    return {
        "shaped": shaped,
        "processed": processed,
        "positive": positive,
        **{f"term:{name}": value for name, value in terms.items()},
        **{f"band:{name}": value for name, value in multipliers.items()},
        "group:skipped": skipped,
        "group:shaped": shaped_groups,
        "group:gate_open": gate_open,
        "group:gate_mean": gate_mean,
        "group:gate_reason": gate_reason,
    }


def apply_length_penalties(
    batch: RolloutBatch, config: LengthPenaltyConfig | Mapping[str, Any]
) -> LengthPenaltyResult:
    """Shape the correctness rewards of ``batch`` per prompt group (decisions.md §2)."""
    if not isinstance(config, LengthPenaltyConfig):
        config = LengthPenaltyConfig.model_validate(config)
    env = batch.rewards
    if not config.any_enabled or env.numel() == 0:
        return LengthPenaltyResult(env.clone(), env, {})
    layout = batch.layout
    params = AgentParams(config, batch.group_rows(batch.agents), layout.num_groups)

    # Per-prompt metadata, read only when an agent uses it (§2.10, §2.12-2.14).
    read_bands = params.uses(
        "group_length_penalty_profile_gate", *(f"profile_band_{channel}" for channel in BAND_CHANNELS)
    )
    read_profiles = params.uses("profiled_length_penalty")
    group_meta = batch.group_rows(batch.metadata) if read_bands or read_profiles else None
    meta = group_metadata(group_meta, config.global_bands, layout.num_groups, read_bands, read_profiles)
    limits = gate_limits(
        meta.bands,
        params["group_length_penalty_profile_gate_channel"].long(),
        params["group_length_penalty_profile_gate_field"].long(),
    )
    profiled_threshold = meta.profiled_threshold(
        params["profiled_length_n_std"], params["profiled_length_min_samples"]
    )
    rewards = env.double()
    rows = {
        "rewards": rewards,
        "reasoning": batch.reasoning_lengths,
        "answer": batch.answer_lengths,
        "total": batch.total_lengths,
    }
    if batch.multi_component is not None:
        rows["multi_component"] = batch.multi_component
    parts = [
        _shape_bucket(b, params, rows, meta, limits, profiled_threshold, config.verbose)
        for b in layout.buckets
    ]
    keys = [  # per-algorithm terms and band multipliers only feed the verbose records
        key
        for key in dict.fromkeys(key for part in parts for key in part)
        if config.verbose or not key.startswith(("term:", "band:"))
    ]
    out = {
        key: (layout.per_group if key.startswith("group:") else layout.unpack)(
            [part[key] if key in part else torch.zeros_like(part["shaped"]) for part in parts]
        )
        for key in keys
    }
    processed, shaped_groups, skipped = out["processed"], out["group:shaped"], out["group:skipped"]
    result = torch.where(processed, out["shaped"].to(env.dtype), env)

    for agent in params.agents_where(skipped):
        config.warn_once(
            ("non_binary", agent),
            "length_penalty: agent %r has groups with non-binary or multi-component correctness rewards; "
            "they are left unshaped (decisions.md §2.4)",
            agent,
        )
    invalid_groups = torch.zeros(layout.num_groups, dtype=torch.bool)
    for key in METADATA_KEYS:
        bad = meta.invalid[key] & shaped_groups
        invalid_groups |= bad
        for agent in params.agents_where(bad):
            config.warn_once(
                ("invalid_metadata", agent, key),
                "length_penalty: ignoring malformed %s metadata of agent %r (decisions.md §2.12)",
                key,
                agent,
            )

    final = result.double()
    n = env.numel()
    positives = torch.zeros(layout.num_groups, dtype=torch.long).index_add_(
        0, layout.gid, (rewards > 0).long()
    )
    metrics = {
        "length_penalty/env_reward_mean": float(torch.nanmean(rewards)),
        "length_penalty/reward_delta_mean": float(((final - rewards).nan_to_num(0.0) * processed).sum()) / n,
        "length_penalty/wiped_correct_frac": int((out["positive"] & (final <= 0)).sum()) / n,
        "length_penalty/adjusted_frac": int(((final != rewards) & processed).sum()) / n,
        "length_penalty/skipped_non_binary_frac": int(layout.sizes[skipped].sum()) / n,
        "length_penalty/invalid_metadata_frac": int(layout.sizes[invalid_groups].sum()) / n,
        "length_penalty/pct_all_wrong": int(layout.sizes[positives == 0].sum()) / n,
        "length_penalty/pct_all_correct": int(layout.sizes[positives == layout.sizes].sum()) / n,
    }
    metrics["length_penalty/pct_mixed"] = (
        1 - metrics["length_penalty/pct_all_wrong"] - metrics["length_penalty/pct_all_correct"]
    )
    records = []
    if config.verbose:
        terms = {name: out.get(f"term:{name}", torch.zeros_like(rewards)) for name in TERMS}
        bands = {name: out.get(f"band:{name}", torch.ones_like(rewards)) for name in BAND_CHANNELS}
        gate = {name: out[f"group:gate_{name}"] for name in ("open", "mean", "reason")}
        gate["limit"] = limits
        records = build_records(
            batch, params, shaped_groups, skipped, gate, profiled_threshold, terms, bands, result
        )
    return LengthPenaltyResult(result, env, metrics, records)
