"""The group length penalties, vectorized over a batch (docs/reference/length-penalties.md §2).

Per group, in the order of §2.6: agent, binary check, lengths, the gate terms, the additive terms in order,
sum and clamp at 0, the multiplier terms (``terms``: one registered module per algorithm). Groups are packed
into slot-major ``[width, groups]`` matrices (``groups.GroupLayout``) and every step is a tensor operation
over all of them; the only Python loops run over distinct agents and over buckets. Sums over a group run
in row order (``groups.row_sum``) so they equal a plain loop bit for bit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

import torch

from .agents import TRUNCATION_MODES, AgentParams
from .batch import RolloutBatch
from .config import BAND_PARAMETERS, CHANNELS, LengthPenaltyConfig
from .correctness import GroupKinds, classify_groups
from .groups import Bucket, GroupLayout
from .metadata import METADATA_KEYS, PROFILED, TARGET, GroupMetadata, merge_group_metadata
from .metrics import mean_metrics
from .records import GroupRecord, build_records
from .terms import TermInputs, terms
from .terms.profile_gate import gate_limits
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
class LengthPenaltyResult:
    """``rewards``: shaped, one per row, in the input's dtype (rows of skipped groups are the input,
    bit for bit); ``env_rewards``: the input; ``row_metrics``: §2.15 per row, whose means are ``metrics``
    (empty when nothing is enabled). With ``verbose`` on, ``outputs`` holds the engine's own outputs (per
    row ``term:<name>`` and ``band:<channel>``, per group ``group:gate_open``, ``group:gate_mean`` and
    ``group:gate_reason``) and ``groups`` the per-group records, built from them when first read."""

    rewards: torch.Tensor
    env_rewards: torch.Tensor
    row_metrics: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    build_groups: Callable[[], list[GroupRecord]] | None = field(default=None, repr=False)

    @property
    def metrics(self) -> dict[str, float]:
        return mean_metrics(self.row_metrics)

    @cached_property
    def groups(self) -> list[GroupRecord]:
        """The verbose records, one per group (empty without ``verbose``)."""
        return [] if self.build_groups is None else self.build_groups()


@dataclass
class _Shared:
    """Per-group inputs of every bucket: metadata, gate limits and profiled thresholds (G,)."""

    meta: GroupMetadata
    limits: torch.Tensor
    profiled_threshold: torch.Tensor

    def inputs(self, bucket: Bucket, gate_open: torch.Tensor, adjustment: torch.Tensor) -> TermInputs:
        return TermInputs(
            gate_open=gate_open,
            adjustment=adjustment,
            profiled_threshold=bucket.take(self.profiled_threshold),
            bands={channel: bucket.take(band) for channel, band in self.meta.bands.items()},
            limits=bucket.take(self.limits),
            target=bucket.take(self.meta.target),
        )


def _shared_inputs(batch: RolloutBatch, config: LengthPenaltyConfig, params: AgentParams) -> _Shared:
    """Read per-prompt metadata only when an agent uses it (§2.10, §2.12-2.14, §2.20)."""
    read_bands = params.uses(*BAND_PARAMETERS)
    read_profiles = params.uses("profiled_length_penalty")
    read_target = params.uses("target_length")
    layout = batch.layout
    prompts = batch.group_metadata() if read_bands or read_profiles or read_target else None
    meta = merge_group_metadata(
        prompts, config.global_bands, layout.num_groups, read_bands, read_profiles, read_target
    )
    limits = gate_limits(
        meta.bands,
        params["group_length_penalty_profile_gate_channel"].long(),
        params["group_length_penalty_profile_gate_field"].long(),
    )
    threshold = meta.profiled_threshold(
        params["profiled_length_n_std"], params["profiled_length_min_samples"]
    )
    return _Shared(meta, limits, threshold)


def _run_gate(view: GroupView, shared: _Shared) -> dict[str, torch.Tensor]:
    """The gate terms' outputs (open, mean, reason), or an open gate when no agent uses one."""
    width = view.shaped_groups.shape
    out = {
        "open": torch.ones(width, dtype=torch.bool),
        "mean": torch.full(width, float("nan"), dtype=torch.float64),
        "reason": torch.zeros(width, dtype=torch.long),
    }
    for term in terms("gate"):
        if term.used_by(view):
            out.update(term.compute(view, shared.inputs(view.bucket, out["open"], view.rewards)))
    return out


def _rollout_terms(view: GroupView, shared: _Shared) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The rollout reward after the per-rollout terms, in order (§2.17-2.19), and their outputs
    (``term:<name>``, empty when none is used). A term adds its outputs to the running reward, or returns the
    new reward itself as ``reward`` (the cosine reward replaces it, exactly); its ``metric:<name>`` outputs
    are per-row metric values, kept as they are."""
    reward, out = view.rewards, {}
    for term in terms("rollout"):
        if term.used_by(view):
            inputs = shared.inputs(view.bucket, view.shaped_groups, reward)
            outputs = term.compute(view, inputs)
            replaced = outputs.pop("reward", None)
            out.update({name: outputs.pop(name) for name in list(outputs) if name.startswith("metric:")})
            for name, value in outputs.items():
                reward = reward + value
                out[f"term:{name}"] = value
            if replaced is not None:
                reward = replaced
    return reward, out


def _rollout_groups(view: GroupView) -> torch.Tensor:
    """(Gb,) the groups whose agent turns on a per-rollout reward term (§2.6): their rewards may be negative."""
    return (
        (view.p("cosine_max_length") > 0)
        | (view.p("overlong_max_length") > 0)
        | (view.p("truncation") == TRUNCATION_MODES.index("penalty"))
        | (view.p("target_length") > 0)
    )


def _shape_bucket(
    bucket: Bucket,
    params: AgentParams,
    rows: dict[str, torch.Tensor],
    shaped_groups: torch.Tensor,
    shared: _Shared,
    keep_terms: bool,
) -> dict[str, torch.Tensor]:
    """Every term for the groups of one bucket; returns packed row outputs and per-group outputs (each
    term's own outputs only with ``keep_terms``, for verbose records)."""
    rewards = bucket.pack(rows["rewards"])
    processed = bucket.valid & bucket.take(shaped_groups)
    clean = rewards.nan_to_num(0.0)
    channel_lengths = bucket.pack([rows[channel] for channel in CHANNELS])
    truncated = None if rows.get("truncated") is None else bucket.pack(rows["truncated"], False)
    view = GroupView(bucket, params, clean, channel_lengths, processed, processed & (clean > 0), truncated)
    clean, rollout = _rollout_terms(view, shared)
    if rollout:  # the group terms read the rollout reward; positive stays the correctness (§2.6)
        view = GroupView(bucket, params, clean, channel_lengths, processed, view.positive, truncated)
    gate = _run_gate(view, shared)
    adjustment, kept = torch.zeros_like(clean), {}
    for term in terms("additive"):
        if not term.used_by(view):
            continue
        for name, value in term.compute(view, shared.inputs(bucket, gate["open"], adjustment)).items():
            adjustment.add_(value)  # summed as each term finishes, so its temporaries are freed early
            if keep_terms:
                kept[f"term:{name}"] = value
    signed = _rollout_groups(view)
    if bool(signed.any()):  # the group terms stop at 0, or at a negative rollout reward (§2.6)
        shaped = torch.maximum(adjustment.add_(clean), torch.where(signed, clean.clamp(max=0), 0.0))
    else:
        shaped = adjustment.add_(clean).clamp_(min=0)
    for term in terms("multiplier"):
        if term.used_by(view):
            for name, multiplier in term.compute(view, shared.inputs(bucket, gate["open"], shaped)).items():
                shaped = shaped * multiplier
                if keep_terms:
                    kept[f"band:{name}"] = multiplier
    return {
        "shaped": shaped,
        "processed": processed,
        "positive": view.positive,
        **rollout,
        **kept,
        **{f"group:gate_{name}": value for name, value in gate.items()},
    }


def _unpack(parts: list[dict[str, torch.Tensor]], layout: GroupLayout) -> dict[str, torch.Tensor]:
    """Per-row (or per-group, ``group:`` keys) tensors from the buckets' outputs; a key some bucket lacks
    (a term no group of it used) is zero there."""
    keys = dict.fromkeys(key for part in parts for key in part)
    return {
        key: (layout.per_group if key.startswith("group:") else layout.unpack)(
            [part[key] if key in part else torch.zeros_like(part["shaped"]) for part in parts]
        )
        for key in keys
    }


def _warn(
    config: LengthPenaltyConfig,
    params: AgentParams,
    kinds: GroupKinds,
    shaped_groups: torch.Tensor,
    meta: GroupMetadata,
) -> None:
    """The once-per-agent warnings of §2.4 and §2.12, and the once-per-run one when no band can apply."""
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
    if params.uses(*BAND_PARAMETERS):
        flagged = any(bool(meta.invalid[key].any()) for key in METADATA_KEYS if key not in (PROFILED, TARGET))
        found = flagged or any(bool((~band[:, 0].isnan()).any()) for band in meta.bands.values())
        warning = config.band_source_warning(found, "no prompt of the batch has a 'profile_band'")
        if warning:
            logging.getLogger("trl_length_plugin").warning(warning)
    for key in METADATA_KEYS:
        for agent in params.agents_where(meta.invalid[key] & shaped_groups):
            config.warn_once(
                ("invalid_metadata", agent, key),
                "length_penalty: ignoring malformed %s metadata of agent %r, counted in "
                "length_penalty/invalid_metadata_frac (docs/reference/length-penalties.md §2.12, §2.14)",
                key,
                agent,
            )


def _row_metrics(
    env: torch.Tensor,
    final: torch.Tensor,
    out: dict[str, torch.Tensor],
    layout: GroupLayout,
    kinds: GroupKinds,
    enabled: torch.Tensor,
    invalid: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """§2.15 as per-row values (their means are the metrics); the group mix partitions the rollouts."""
    rewards, processed = env.double(), out["processed"]

    def rows(groups: torch.Tensor) -> torch.Tensor:
        return groups.double().index_select(0, layout.gid)

    scored = ~kinds.missing
    return {
        "length_penalty/env_reward_mean": rewards,
        "length_penalty/reward_delta_mean": (final - rewards).nan_to_num(0.0) * processed,
        "length_penalty/wiped_correct_frac": (out["positive"] & (final <= 0)).double(),
        "length_penalty/adjusted_frac": ((final != rewards) & processed).double(),
        "length_penalty/skipped_non_binary_frac": rows(enabled & kinds.non_binary & scored),
        "length_penalty/invalid_metadata_frac": rows(invalid),
        "length_penalty/pct_all_wrong": rows(scored & (kinds.positives == 0)),
        "length_penalty/pct_all_correct": rows(scored & (kinds.positives == layout.sizes)),
        "length_penalty/pct_mixed": rows(scored & (kinds.positives > 0) & (kinds.positives < layout.sizes)),
        "length_penalty/pct_unscorable": rows(kinds.missing),
    }


def _rollout_metrics(out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The per-rollout terms' metrics as per-row values (§2.17-2.18, §2.20), present when the term ran."""
    metrics = {
        f"length_penalty/{key[len('metric:') :]}": value
        for key, value in out.items()
        if key.startswith("metric:")
    }
    if "term:overlong" in out:
        metrics["length_penalty/overlong_frac"] = (out["term:overlong"] < 0).double()
        metrics["length_penalty/overlong_penalty_mean"] = out["term:overlong"].double()
    if "term:cosine" in out:
        metrics["length_penalty/cosine_delta_mean"] = out["term:cosine"].double()
    if "term:target_length" in out:
        metrics["length_penalty/target_delta_mean"] = out["term:target_length"].double()
    return metrics


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
        shared = _shared_inputs(batch, config, params)
        shaped_groups = params["enabled"] & kinds.binary
        rows = {
            "rewards": env.double(),
            "reasoning": batch.reasoning_lengths,
            "answer": batch.answer_lengths,
            "total": batch.total_lengths,
            "truncated": batch.truncated,
        }
        parts = [
            _shape_bucket(b, params, rows, shaped_groups, shared, config.verbose) for b in layout.buckets
        ]
        out = _unpack(parts, layout)
        result = torch.where(out["processed"], out["shaped"].to(env.dtype), env)
        _warn(config, params, kinds, shaped_groups, shared.meta)
        invalid = torch.stack([shared.meta.invalid[key] for key in METADATA_KEYS]).any(0) & shaped_groups
        metrics = _row_metrics(env, result.double(), out, layout, kinds, params["enabled"], invalid)
        metrics.update(_rollout_metrics(out))
        if not config.verbose:
            return LengthPenaltyResult(result, env, metrics)
        records = partial(
            build_records,
            batch,
            params,
            kinds,
            shaped_groups,
            out,
            shared.limits,
            shared.profiled_threshold,
            result,
        )
    return LengthPenaltyResult(result, env, metrics, out, records)
