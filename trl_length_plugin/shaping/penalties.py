"""The group length penalties, vectorized over a batch (docs/reference/length-penalties.md §2).

Per group, in the order of §2.6: agent, binary check, lengths, then the registered terms by kind and order
(``terms``: one module per algorithm, which declares what it reads; nothing here names a term): rollout,
gate, additive, the sum clamped at 0, multiplier. Groups are packed
into slot-major ``[width, groups]`` matrices (``groups.GroupLayout``) and every step is a tensor operation
over all of them; the only Python loops run over distinct agents and over buckets. Sums over a group run
in row order (``groups.row_sum``) so they equal a plain loop bit for bit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from typing import Any

import torch

from .agents import AgentParams
from .batch import RolloutBatch
from .columns import BAND_KEYS, PROFILE_BAND
from .config import LengthPenaltyConfig
from .correctness import GroupKinds, classify_groups
from .fields import CHANNELS
from .groups import Bucket, GroupLayout, all_set, any_set, row_any, weights
from .metadata import GroupMetadata, merge_group_metadata
from .metrics import mean_metrics
from .records import GroupRecord, build_records
from .terms import GATE_OPEN, REWARD, Kind, Metadata, Term, TermInputs, metadata_keys, prompt_columns, terms
from .threads import single_threaded
from .view import GroupView

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
    "length_penalty/pct_unscorable",
)


@dataclass
class ShapingTrace:
    """What the terms did (the data of the verbose records and of the preview, §2.15): per row, by output
    name, the outputs of the rollout and additive terms that ran (``changes``) and of the multiplier terms
    (``multipliers``); per group, by term, its ``prepare`` values and a gate's outputs (``groups``)."""

    changes: dict[str, torch.Tensor]
    multipliers: dict[str, torch.Tensor]
    groups: dict[str, dict[str, torch.Tensor]]


@dataclass
class LengthPenaltyResult:
    """``rewards``: shaped, one per row, in the input's dtype (rows of skipped groups are the input,
    bit for bit); ``env_rewards``: the input; ``row_metrics``: §2.15 per row, whose means are ``metrics``
    (empty when nothing is enabled). With ``verbose`` on, ``trace`` holds what the terms did and ``groups``
    the per-group records, built from it when first read."""

    rewards: torch.Tensor
    env_rewards: torch.Tensor
    row_metrics: dict[str, torch.Tensor]
    trace: ShapingTrace | None = None
    build_groups: Callable[[], list[GroupRecord]] | None = field(default=None, repr=False)

    @property
    def metrics(self) -> dict[str, float]:
        return mean_metrics(self.row_metrics)

    @cached_property
    def groups(self) -> list[GroupRecord]:
        """The verbose records, one per group (empty without ``verbose``)."""
        return [] if self.build_groups is None else self.build_groups()


@dataclass
class _Terms:
    """The terms some agent of the batch turns on, in §2.6 order, with their per-group inputs (G,) from
    ``prepare``; ``kept``: the terms whose returned values leave the buckets (verbose, or read by their
    ``metrics``)."""

    used: list[Term]
    prepared: dict[str, dict[str, torch.Tensor]]
    kept: set[str]

    def of(self, kind: Kind) -> list[Term]:
        return [term for term in self.used if term.kind == kind]

    def inputs(
        self, term: Term, bucket: Bucket, gate_open: torch.Tensor, adjustment: torch.Tensor
    ) -> TermInputs:
        prepared = {name: bucket.take(value) for name, value in self.prepared.get(term.name, {}).items()}
        return TermInputs(gate_open, adjustment, prepared)


@dataclass
class _Part:
    """One bucket's packed results: the shaped reward and masks ``[width, Gb]``, each kept term's returned
    per-row values and each gate's per-group values (Gb,)."""

    shaped: torch.Tensor
    processed: torch.Tensor
    positive: torch.Tensor
    rows: dict[str, dict[str, torch.Tensor]]
    groups: dict[str, dict[str, torch.Tensor]]


def _read_metadata(
    batch: RolloutBatch, config: LengthPenaltyConfig, used: list[Term]
) -> tuple[GroupMetadata, set[Metadata]]:
    """The per-prompt metadata the used terms read (§2.10, §2.12-2.14, §2.20), merged per group, and what
    was read."""
    columns = [column.name for term in used for column in term.columns]
    needs = {need for term in used for need in term.metadata}
    meta = merge_group_metadata(
        batch.group_metadata() if needs or columns else None,
        config.global_bands,
        batch.layout.num_groups,
        "bands" in needs,
        "profiles" in needs,
        "target" in needs,
        columns,
    )
    return meta, needs


def _shape_bucket(
    bucket: Bucket,
    params: AgentParams,
    rows: dict[str, torch.Tensor],
    shaped_groups: torch.Tensor,
    found: _Terms,
) -> _Part:
    """Every used term for the groups of one bucket, in §2.6 order (``terms``' module docstring)."""
    rewards = bucket.pack(rows["rewards"])
    processed = bucket.valid & bucket.take(shaped_groups)
    clean = rewards.nan_to_num(0.0)
    channel_lengths = bucket.pack([rows[channel] for channel in CHANNELS])
    truncated = None if rows.get("truncated") is None else bucket.pack(rows["truncated"], False)
    view = GroupView(bucket, params, clean, channel_lengths, processed, clean, truncated)
    kept_rows: dict[str, dict[str, torch.Tensor]] = {}
    kept_groups: dict[str, dict[str, torch.Tensor]] = {}

    def run(term: Term, gate_open: torch.Tensor, adjustment: torch.Tensor) -> dict[str, torch.Tensor]:
        values = term.compute(view, found.inputs(term, bucket, gate_open, adjustment))
        if term.name in found.kept:
            kept = {name: value for name, value in values.items() if name != REWARD}
            (kept_groups if term.kind == "gate" else kept_rows)[term.name] = kept
        return values

    reward = clean
    for term in found.of("rollout"):
        values = run(term, view.shaped_groups, reward)
        for name, value in values.items():
            if name in term.outputs:
                reward = reward + value
        reward = values.get(REWARD, reward)  # the new reward itself replaces the sum, exactly
    if reward is not clean:  # the group terms add to the rollout reward; they compare correctness (§2.6)
        view = replace(view, rewards=reward)
    gate_open = torch.ones(view.shaped_groups.shape, dtype=torch.bool)
    for term in found.of("gate"):
        gate_open = run(term, gate_open, view.rewards)[GATE_OPEN]
    adjustment = torch.zeros_like(reward)
    for term in found.of("additive"):
        for name, value in run(term, gate_open, adjustment).items():
            if name in term.outputs:
                adjustment.add_(value)  # summed as each term finishes, so its temporaries are freed early
    # the group terms stop at 0, or at a negative rollout reward where a rollout term is on (§2.6)
    signed = [term.on(view) for term in found.of("rollout")]
    signed = torch.stack(signed).any(0) if signed else None
    if signed is not None and any_set(signed):
        shaped = torch.maximum(adjustment.add_(reward), torch.where(signed, reward.clamp(max=0), 0.0))
    else:
        shaped = adjustment.add_(reward).clamp_(min=0)
    for term in found.of("multiplier"):
        for name, multiplier in run(term, gate_open, shaped).items():
            if name in term.outputs:
                shaped = shaped * multiplier
    return _Part(shaped, processed, view.positive, kept_rows, kept_groups)


def _unpack(parts: list[_Part], layout: GroupLayout, term: Term) -> dict[str, torch.Tensor]:
    """One kept term's values over the batch, per row (a gate: per group); a row value some bucket lacks
    (no group of it turned it on) is zero there."""
    if term.kind == "gate":
        side = [part.groups[term.name] for part in parts]
        return {key: layout.per_group([values[key] for values in side]) for key in side[0]}
    side = [part.rows[term.name] for part in parts]
    keys = dict.fromkeys(key for values in side for key in values)
    return {
        key: layout.unpack(
            [
                values[key] if key in values else torch.zeros_like(part.shaped)
                for values, part in zip(side, parts, strict=True)
            ]
        )
        for key in keys
    }


def _trace(found: _Terms, values: dict[str, dict[str, torch.Tensor]]) -> ShapingTrace:
    """The verbose trace: the terms' per-row outputs by kind, each term's per-group values."""

    def outputs(*kinds: Kind) -> dict[str, torch.Tensor]:
        return {
            name: value
            for kind in kinds
            for term in found.of(kind)
            for name, value in values[term.name].items()
            if name in term.outputs
        }

    groups = {name: dict(prepared) for name, prepared in found.prepared.items()}
    for term in found.of("gate"):
        groups.setdefault(term.name, {}).update(values[term.name])
    return ShapingTrace(outputs("rollout", "additive"), outputs("multiplier"), groups)


def _warn(
    config: LengthPenaltyConfig,
    params: AgentParams,
    kinds: GroupKinds,
    shaped_groups: torch.Tensor,
    meta: GroupMetadata,
    read_bands: bool,
    invalid: torch.Tensor,
) -> None:
    """The once-per-agent warnings of §2.4 and §2.12, and the once-per-run one when no band can apply
    (``invalid``: the shaped groups with malformed metadata; each check runs only where one can fire)."""
    if not all_set(kinds.binary):
        _warn_unscorable(config, params, kinds)
    if read_bands and not config.global_bands:
        flagged = any(any_set(meta.invalid[key]) for key in BAND_KEYS)
        found = flagged or any(not all_set(band[:, 0].isnan()) for band in meta.bands.values())
        warning = config.band_source_warning(found, f"no prompt of the batch has a {PROFILE_BAND!r}")
        if warning:
            logging.getLogger("trl_length_plugin").warning(warning)
    if not any_set(invalid):
        return
    cites = {column.name: column.cite for column in prompt_columns()}
    for key in metadata_keys():
        for agent in params.agents_where(meta.invalid[key] & shaped_groups):
            config.warn_once(
                ("invalid_metadata", agent, key),
                "length_penalty: ignoring malformed %s metadata of agent %r, counted in "
                "length_penalty/invalid_metadata_frac (%s)",
                key,
                agent,
                cites.get(key, "docs/reference/length-penalties.md §2.12, §2.14"),
            )


def _warn_unscorable(config: LengthPenaltyConfig, params: AgentParams, kinds: GroupKinds) -> None:
    """§2.4: once per agent with groups of a missing, or of a non-binary, correctness reward."""
    enabled = params["enabled"]
    for agent in params.agents_where(enabled & kinds.missing):
        config.warn_once(
            ("missing", agent),
            "length_penalty: agent %r has groups with a missing correctness reward (None); they are left "
            "unshaped and counted in length_penalty/pct_unscorable (docs/reference/length-penalties.md §2.4)",
            agent,
        )
    for agent in params.agents_where(enabled & kinds.non_binary & ~kinds.missing):
        config.warn_once(
            ("non_binary", agent),
            "length_penalty: agent %r has groups with non-binary or multi-component correctness rewards; "
            "they are left unshaped (docs/reference/length-penalties.md §2.4)",
            agent,
        )


def _row_metrics(
    env: torch.Tensor,
    final: torch.Tensor,
    processed: torch.Tensor,
    positive: torch.Tensor,
    layout: GroupLayout,
    kinds: GroupKinds,
    enabled: torch.Tensor,
    invalid: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """§2.15 as per-row values (their means are the metrics); the group mix partitions the rollouts."""
    rewards = env.double()
    scored = ~kinds.missing
    per_group = {
        "length_penalty/skipped_non_binary_frac": enabled & kinds.non_binary & scored,
        "length_penalty/invalid_metadata_frac": invalid,
        "length_penalty/pct_all_wrong": scored & (kinds.positives == 0),
        "length_penalty/pct_all_correct": scored & (kinds.positives == layout.sizes),
        "length_penalty/pct_mixed": scored & (kinds.positives > 0) & (kinds.positives < layout.sizes),
        "length_penalty/pct_unscorable": kinds.missing,
    }
    rows = [values.index_select(0, layout.gid) for values in weights(torch.stack(list(per_group.values())))]
    return {
        "length_penalty/env_reward_mean": rewards,
        "length_penalty/reward_delta_mean": (final - rewards).nan_to_num(0.0).mul_(weights(processed)),
        "length_penalty/wiped_correct_frac": weights(positive & (final <= 0)),
        "length_penalty/adjusted_frac": weights((final != rewards) & processed),
        **dict(zip(per_group, rows, strict=True)),
    }


def apply_length_penalties(
    batch: RolloutBatch, config: LengthPenaltyConfig | Mapping[str, Any], kinds: GroupKinds | None = None
) -> LengthPenaltyResult:
    """Shape the correctness rewards of ``batch`` per prompt group (reference §2); ``kinds`` is the batch's
    group classification when the caller has it already."""
    if not isinstance(config, LengthPenaltyConfig):
        config = LengthPenaltyConfig.model_validate(config)
    env = batch.rewards
    if not config.any_enabled or env.numel() == 0:
        return LengthPenaltyResult(env.clone(), env, {})
    with single_threaded():
        layout = batch.layout
        kinds = classify_groups(layout, env, batch.multi_component) if kinds is None else kinds
        params = AgentParams(config, batch.group_rows(batch.agents), layout.num_groups)
        used = [term for term in terms() if term.used_by(params)]
        meta, needs = _read_metadata(batch, config, used)
        found = _Terms(
            used,
            {term.name: term.prepare(params, meta) for term in used if term.prepare is not None},
            {term.name for term in used if config.verbose or term.metrics is not None},
        )
        shaped_groups = params["enabled"] & kinds.binary
        rows = {
            "rewards": env.double(),
            "reasoning": batch.reasoning_lengths,
            "answer": batch.answer_lengths,
            "total": batch.total_lengths,
            "truncated": batch.truncated,
        }
        parts = [_shape_bucket(b, params, rows, shaped_groups, found) for b in layout.buckets]
        processed = layout.unpack([part.processed for part in parts])
        shaped = layout.unpack([part.shaped for part in parts])
        result = torch.where(processed, shaped.to(env.dtype), env)
        invalid = row_any(torch.stack([meta.invalid[key] for key in metadata_keys()])) & shaped_groups
        _warn(config, params, kinds, shaped_groups, meta, "bands" in needs, invalid)
        positive = layout.unpack([part.positive for part in parts])
        metrics = _row_metrics(
            env, result.double(), processed, positive, layout, kinds, params["enabled"], invalid
        )
        kept = [term for term in used if term.name in found.kept]
        values = {term.name: _unpack(parts, layout, term) for term in kept}
        for term in kept:
            if term.metrics is not None and values[term.name]:
                metrics.update(term.metrics(values[term.name]))
        if not config.verbose:
            return LengthPenaltyResult(result, env, metrics)
        trace = _trace(found, values)
        records = partial(build_records, batch, params, kinds, shaped_groups, trace, result)
    return LengthPenaltyResult(result, env, metrics, trace, records)
