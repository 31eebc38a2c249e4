"""One training step's shaping on saved rollouts, and what it did (docs/profiles.md, ``trl-length preview``).

Rows become one ``RolloutBatch`` (groups: the ``group`` column, else the prompt key), shaped by the core's
``shape_rollouts`` exactly as the TRL trainer shapes its gathered batch, with TRL's normalization for
``scale_rewards``. Per-group facts come from the engine's verbose trace (the data of the verbose records
of docs/reference/length-penalties.md §2.15): the preview always switches ``verbose`` on.

Memory: per rollout its reward, three lengths, group, agent and a reference to its prompt's metadata;
completions are measured chunk by chunk and not held.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from trl_length_plugin.offline.rollouts import Rollout, RolloutReader, channel_lengths
from trl_length_plugin.offline.tables import columns
from trl_length_plugin.shaping import GroupNormalization, LengthShapingConfig, RolloutBatch, shape_rollouts
from trl_length_plugin.shaping.config import DEFAULT_AGENT
from trl_length_plugin.shaping.correctness import classify_groups
from trl_length_plugin.shaping.metrics import mean_metrics
from trl_length_plugin.shaping.normalization import group_advantages
from trl_length_plugin.shaping.pipeline import ShapingResult
from trl_length_plugin.shaping.rows import metadata_entry
from trl_length_plugin.shaping.terms import metadata_columns
from trl_length_plugin.shaping.terms.profile_gate import GATE_REASONS

DELTA_QUANTILES = {"min": 0.0, "p10": 0.1, "p50": 0.5, "p90": 0.9, "max": 1.0}


def with_verbose(config: LengthShapingConfig) -> LengthShapingConfig:
    """``config`` with ``verbose`` on, so the engine keeps its trace (numbers unchanged)."""
    block = config.length_penalty
    if block is None or block.verbose:
        return config
    return config.model_copy(update={"length_penalty": block.model_copy(update={"verbose": True})})


class PromptTable:
    """A prompt dataset's agent and metadata columns by prompt key (``tables.prompt_keys``)."""

    def __init__(self, dataset, keys: list[tuple[str, str | None]], agent_column: str):
        self.index: dict[str, int] = {}
        for row, pair in enumerate(keys):
            for key in pair:
                if key is not None:
                    self.index.setdefault(key, row)
        self.columns = columns(dataset, metadata_columns())
        self.agents = columns(dataset, (agent_column,)).get(agent_column)

    def metadata(self, row: int) -> dict[str, Any] | None:
        return metadata_entry({name: values[row] for name, values in self.columns.items()})


@dataclass
class PreviewRows:
    """The numbers of every valid rollout, in file order; ``lines`` are their positions in the file."""

    rewards: array = field(default_factory=lambda: array("d"))
    reasoning: array = field(default_factory=lambda: array("d"))
    answer: array = field(default_factory=lambda: array("d"))
    loss: array = field(default_factory=lambda: array("d"))
    groups: array = field(default_factory=lambda: array("q"))
    lines: array = field(default_factory=lambda: array("q"))
    agents: list[Any] = field(default_factory=list)
    metadata: list[Any] = field(default_factory=list)
    group_ids: dict[str, int] = field(default_factory=dict)


def _agent(rollout: Rollout, prompts: PromptTable | None, agent_column: str) -> Any:
    agent = rollout.row.get(agent_column)
    if agent is None and prompts is not None and prompts.agents is not None:
        agent = prompts.agents[prompts.index[rollout.key]]
    return agent


def _metadata(rollout: Rollout, prompts: PromptTable | None) -> dict[str, Any] | None:
    if prompts is not None:
        return prompts.metadata(prompts.index[rollout.key])
    return metadata_entry(rollout.row)


def read_rows(
    reader: RolloutReader,
    config: LengthShapingConfig,
    tokenizer: Any,
    prompts: PromptTable | None,
    agent_column: str,
) -> PreviewRows:
    """Stream the rollouts into ``PreviewRows``; skipped rows are counted on ``reader``."""
    rows, block = PreviewRows(), config.penalties
    metadata: dict[str, Any] = {}  # one entry per prompt (its first row's), shared by its rows
    units: dict[Any, str] = {}  # per agent
    for chunk in reader.chunks():
        kept = []
        for rollout in chunk:
            if prompts is not None and rollout.key not in prompts.index:
                reader.skip(rollout.where, "prompt not in --prompts")
            elif config.coefficient_on and rollout.completion_tokens is None:
                reader.skip(rollout.where, "no completion_tokens (the length coefficient needs them)")
            else:
                kept.append((rollout, _agent(rollout, prompts, agent_column)))
                if rollout.key not in metadata:
                    metadata[rollout.key] = _metadata(rollout, prompts)
        if block is not None:
            for _, agent in kept:
                if agent not in units:
                    units[agent] = block.for_agent(agent).length_type
            chunk_units = [units[agent] for _, agent in kept]
            lengths = channel_lengths(
                [r for r, _ in kept], chunk_units, tokenizer, config.tags, reader.source.unit
            )
        else:
            lengths = [(0, 0)] * len(kept)
        for (rollout, agent), pair in zip(kept, lengths, strict=True):
            if isinstance(pair, str):
                reader.skip(rollout.where, pair)
                continue
            rows.rewards.append(rollout.reward)
            rows.reasoning.append(pair[0])
            rows.answer.append(pair[1])
            tokens = rollout.completion_tokens
            rows.loss.append(math.nan if tokens is None else tokens)
            group = rollout.group if rollout.group is not None else rollout.key
            rows.groups.append(rows.group_ids.setdefault(group, len(rows.group_ids)))
            rows.lines.append(rollout.where)
            rows.agents.append(agent)
            rows.metadata.append(metadata[rollout.key])
    return rows


def shape(rows: PreviewRows, config: LengthShapingConfig, normalization: GroupNormalization, step: int):
    """``(batch, result, advantages)`` of one shaping step on ``rows``; ``advantages`` are the §3.3 ones
    with the coefficient on, else TRL's own normalization of the shaped total."""
    block = config.penalties
    batch = RolloutBatch(
        torch.frombuffer(rows.rewards, dtype=torch.float64),
        torch.frombuffer(rows.groups, dtype=torch.int64),
        torch.frombuffer(rows.reasoning, dtype=torch.float64),
        torch.frombuffer(rows.answer, dtype=torch.float64),
        agents=rows.agents if any(agent is not None for agent in rows.agents) else None,
        metadata=rows.metadata if block is not None and block.uses_metadata else None,
        loss_lengths=torch.frombuffer(rows.loss, dtype=torch.float64) if config.coefficient_on else None,
    )
    result = shape_rollouts(batch, with_verbose(config), normalization, step=step)
    advantages = result.advantages
    if advantages is None:
        plain = torch.ones(batch.layout.num_rows, dtype=torch.bool)
        settings = dataclasses.asdict(normalization)
        advantages = group_advantages(result.totals, result.raw, batch.layout, **settings, plain_rows=plain)
    return batch, result, advantages


@dataclass
class GroupFacts:
    """Per group: agent, status (``shaped`` or why it was skipped), the algorithms that changed a reward,
    the gate's ``(open, reason)`` and whether the zero-std filter dropped it."""

    agents: list[str]
    status: list[str]
    touched: list[set[str]]
    gates: list[tuple[bool, str] | None]
    dropped: list[bool]


def _groups_where(layout, rows: torch.Tensor) -> list[int]:
    """The groups holding at least one of the flagged rows."""
    return torch.unique(layout.gid[rows]).tolist()


def group_facts(batch: RolloutBatch, result: ShapingResult, config: LengthShapingConfig) -> GroupFacts:
    """What happened to each group, from the engine's verbose trace (``LengthPenaltyResult.trace``),
    with the verbose records' rules (``shaping.records``): status, terms and bands that changed a row, the
    gate of shaped groups whose agent has it on."""
    layout = batch.layout
    groups = layout.num_groups
    agents = [
        DEFAULT_AGENT if a is None else str(a) for a in batch.group_rows(batch.agents) or [None] * groups
    ]
    block = config.penalties
    params = {agent: block.for_agent(agent) for agent in set(agents)} if block is not None else {}
    kinds = classify_groups(layout, result.raw)
    status = []
    for agent, missing, non_binary in zip(
        agents, kinds.missing.tolist(), kinds.non_binary.tolist(), strict=True
    ):
        disabled = block is not None and not params[agent].enabled
        status.append(
            "disabled" if disabled else "missing" if missing else "non_binary" if non_binary else "shaped"
        )
    touched: list[set[str]] = [set() for _ in range(groups)]
    gates: list[tuple[bool, str] | None] = [None] * groups
    trace = result.penalties.trace if result.penalties is not None else None
    if trace is not None:
        for name, change in trace.changes.items():
            for g in _groups_where(layout, change != 0):
                touched[g].add(name)
        for name, multiplier in trace.multipliers.items():
            for g in _groups_where(layout, multiplier != 1):
                touched[g].add(f"band_{name}")
        gate = trace.groups.get("profile_gate")
        if gate is not None:
            opened, reasons = gate["open"].tolist(), gate["reason"].tolist()
            for g, agent in enumerate(agents):
                if status[g] == "shaped" and params[agent].group_length_penalty_profile_gate:
                    gates[g] = (opened[g], GATE_REASONS[reasons[g]])
    if result.coefficient is not None:
        for g in _groups_where(layout, result.coefficient.multipliers < 1):
            touched[g].add("coefficient")
    dropped = [False] * groups
    if result.keep is not None:
        for g in _groups_where(layout, ~result.keep):
            dropped[g] = True
    return GroupFacts(agents, status, touched, gates, dropped)


def shaped_rows(batch: RolloutBatch, facts: GroupFacts) -> torch.Tensor:
    """Per row, whether its group was shaped (not skipped)."""
    return torch.tensor([status == "shaped" for status in facts.status], dtype=torch.bool)[batch.layout.gid]


def _counts(counter: Counter) -> str:
    return ", ".join(
        f"{name} {n}" for name, n in sorted(counter.items(), key=lambda item: (-item[1], item[0]))
    )


def target_lines(row_metrics: dict[str, torch.Tensor], rows: torch.Tensor) -> list[str]:
    """Lengths against their prompts' targets when the target-length term ran (reference §2.20): the
    quantiles of length / target over the rollouts with a target, and how many are within the tolerance."""
    ratio = row_metrics.get("length_penalty/target_ratio_mean")
    if ratio is None:
        return []
    scope = rows & ~row_metrics["length_penalty/target_frac"].isnan()
    aimed = scope & ~ratio.isnan()
    line = f"  target length: {int(aimed.sum())} of {int(scope.sum())} rollouts have a target"
    if not bool(aimed.any()):
        return [line]
    marks = torch.quantile(ratio[aimed], torch.tensor(list(DELTA_QUANTILES.values()), dtype=torch.float64))
    spread = " ".join(f"{name} {v:.3f}" for name, v in zip(DELTA_QUANTILES, marks.tolist(), strict=True))
    within = int(row_metrics["length_penalty/target_within_tolerance_frac"][aimed].sum())
    return [line + f"; length / target: {spread}; within tolerance {within}"]


def scope_report(
    title: str, groups: list[int], batch: RolloutBatch, result: ShapingResult, facts: GroupFacts
) -> list[str]:
    """The lines of one scope (all agents, or one): metrics, reward deltas, groups touched, gate, skips."""
    gid = batch.layout.gid
    chosen = torch.zeros(batch.layout.num_groups, dtype=torch.bool)
    chosen[groups] = True
    rows = chosen[gid]
    lines = [f"== {title}: {int(rows.sum())} rollouts, {len(groups)} groups"]
    metrics = mean_metrics(result.row_metrics, rows) if result.row_metrics else {}
    lines += ["  metrics:"] + [f"    {name:<46} {value:.6g}" for name, value in metrics.items()]
    delta = (result.rewards - result.raw)[rows & shaped_rows(batch, facts)]
    if delta.numel():
        marks = torch.quantile(delta, torch.tensor(list(DELTA_QUANTILES.values()), dtype=torch.float64))
        spread = " ".join(f"{name} {v:+.4f}" for name, v in zip(DELTA_QUANTILES, marks.tolist(), strict=True))
        lines.append(f"  reward delta (shaped - correctness), {delta.numel()} rollouts of shaped groups:")
        lines.append(
            f"    mean {float(delta.mean()):+.4f}  {spread}  lowered {int((delta < 0).sum())}, "
            f"unchanged {int((delta == 0).sum())}, raised {int((delta > 0).sum())}"
        )
    lines += target_lines(result.row_metrics, rows)
    touched = Counter(name for g in groups for name in facts.touched[g])
    lines.append(f"  groups touched per algorithm: {_counts(touched) or 'none'}")
    gates = [facts.gates[g] for g in groups if facts.gates[g] is not None]
    if gates:
        opened = Counter(reason for is_open, reason in gates if is_open)
        closed = Counter(reason for is_open, reason in gates if not is_open)
        lines.append(
            f"  profile gate: open {sum(opened.values())} ({_counts(opened) or '-'}), "
            f"closed {sum(closed.values())} ({_counts(closed) or '-'})"
        )
    skipped = Counter(facts.status[g] for g in groups if facts.status[g] != "shaped")
    lines.append(f"  groups skipped: {_counts(skipped) or 'none'}")
    if result.keep is not None:
        lines.append(f"  zero-std filter: {sum(facts.dropped[g] for g in groups)} groups dropped")
    return lines


def report(batch: RolloutBatch, result: ShapingResult, facts: GroupFacts) -> str:
    """Every scope: all agents, then each agent when there are several."""
    by_agent: dict[str, list[int]] = {}
    for g, agent in enumerate(facts.agents):
        by_agent.setdefault(agent, []).append(g)
    lines = scope_report("all agents", list(range(len(facts.agents))), batch, result, facts)
    if len(by_agent) > 1:
        for agent, groups in by_agent.items():
            lines += scope_report(f"agent {agent}", groups, batch, result, facts)
    return "\n".join(lines)
