"""``LengthPluginGRPOConfig``: TRL's ``GRPOConfig`` plus the length-control keys (decisions.md §1.3).

Every key works from a YAML recipe, from command-line flags and from Python. The ``length_penalty``
block is validated into the engine's ``LengthPenaltyConfig`` in ``__post_init__``, so a bad key fails
while the arguments are parsed, before any model is loaded (decisions.md §2.1).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from trl import GRPOConfig

from trl_length_plugin.shaping import LengthPenaltyConfig, load_length_penalty_config

logger = logging.getLogger("trl_length_plugin")

#: TRL loss types whose denominator counts sequences; see ``LengthPluginGRPOTrainer._compute_loss``
SEQUENCE_MEAN_LOSSES = ("grpo", "sapo", "dr_grpo", "luspo")


def _json_block(text: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"length_penalty: not valid JSON ({err})") from err


def parse_length_penalty(value: dict | str | None) -> LengthPenaltyConfig | None:
    """The §2.1 block from a mapping, a JSON string or the path of a YAML file; None when absent."""
    if value is None or value == {}:
        return None
    if isinstance(value, str):
        if value.strip().startswith("{"):
            value = _json_block(value)
        elif not Path(value).is_file():
            raise ValueError(
                f"length_penalty: {value!r} is neither a JSON object nor the path of a YAML file; "
                "give the decisions.md §2.1 block as a YAML mapping, a JSON string or a file path"
            )
    if not isinstance(value, dict | str):
        raise ValueError(f"length_penalty: expected a mapping, got {type(value).__name__}")
    try:
        return load_length_penalty_config(value)
    except ValueError as err:  # pydantic's ValidationError names the key path
        raise ValueError(f"length_penalty: invalid block: {err}") from err


@dataclass
class LengthPluginGRPOConfig(GRPOConfig):
    """``GRPOConfig`` with group length penalties (decisions.md §2), the length coefficient (§3) and LUSPO (§4).

    The validated penalty block is available as ``length_penalty_config`` (None when absent).
    """

    length_penalty: dict | str | None = field(
        default=None,
        metadata={
            "help": "Group length penalties (decisions.md §2.1): a YAML mapping in a recipe, a JSON string or "
            "the path of a YAML file on the command line. Validated before any model is loaded."
        },
    )
    correctness_reward: str | None = field(
        default=None,
        metadata={
            "help": "Name of the binary reward function the length shaping acts on (decisions.md §2.4). "
            "Optional when there is a single reward function, required when there are several."
        },
    )
    agent_column: str = field(
        default="agent",
        metadata={
            "help": "Dataset column naming each prompt's agent for `agent_overrides` (decisions.md §2.3)."
        },
    )
    reasoning_tags: list[str] = field(
        default_factory=lambda: ["<think>", "</think>"],
        metadata={"help": "Opening and closing tag of the reasoning channel (decisions.md §2.5)."},
    )
    length_penalty_coeff: float = field(
        default=0.0,
        metadata={
            "help": "Length coefficient c >= 0 relative to the shortest correct rollout (decisions.md §3.1)."
        },
    )
    length_penalty_min_tokens: int = field(
        default=0,
        metadata={"help": "Floor m of the coefficient's reference length (decisions.md §3.1)."},
    )
    length_penalty_coeff_warmup_steps: int = field(
        default=0,
        metadata={
            "help": "Raise the coefficient linearly from 0 to `length_penalty_coeff` over this many steps."
        },
    )
    drop_zero_std_groups: bool = field(
        default=False,
        metadata={
            "help": "Drop groups whose shaped rewards are all equal from the loss, masks and denominators "
            "(decisions.md §3.3)."
        },
    )
    length_curves_png: bool = field(
        default=False,
        metadata={
            "help": "Write a PNG of completion length and reward curves to output_dir when training ends."
        },
    )
    luspo: bool = field(
        default=False,
        metadata={"help": "Switch on LUSPO with the paper's settings (decisions.md §4)."},
    )

    def __post_init__(self):
        if isinstance(self.length_penalty, str) and self.length_penalty.strip().startswith("{"):
            self.length_penalty = _json_block(self.length_penalty)
        self.length_penalty_config: LengthPenaltyConfig | None = parse_length_penalty(self.length_penalty)
        self._check_length_keys()
        if self.luspo:
            from trl_length_plugin.trl_integration.luspo import apply_luspo_defaults

            logger.info("luspo: %s", apply_luspo_defaults(self))
        super().__post_init__()

    @property
    def group_penalties_enabled(self) -> bool:
        """Whether any §2 algorithm is switched on for some agent."""
        return self.length_penalty_config is not None and self.length_penalty_config.any_enabled

    @property
    def length_shaping_enabled(self) -> bool:
        """Whether the trainer touches rewards or advantages at all (decisions.md §2.15: else nothing runs)."""
        return self.group_penalties_enabled or self.length_penalty_coeff > 0 or self.drop_zero_std_groups

    def _check_length_keys(self) -> None:
        if self.length_penalty_coeff < 0:
            raise ValueError(f"length_penalty_coeff must be >= 0, got {self.length_penalty_coeff}")
        if self.length_penalty_min_tokens < 0:
            raise ValueError(f"length_penalty_min_tokens must be >= 0, got {self.length_penalty_min_tokens}")
        if self.length_penalty_coeff_warmup_steps < 0:
            raise ValueError(
                f"length_penalty_coeff_warmup_steps must be >= 0, got {self.length_penalty_coeff_warmup_steps}"
            )
        tags = self.reasoning_tags
        if len(tags) != 2 or not all(isinstance(t, str) and t for t in tags) or tags[0] == tags[1]:
            raise ValueError(f"reasoning_tags must be two distinct non-empty strings, got {tags!r}")
        if self.length_shaping_enabled and self.multi_objective_aggregation == "normalize_then_sum":
            raise ValueError(
                "multi_objective_aggregation='normalize_then_sum' cannot be combined with length shaping "
                "(decisions.md §3.5): it normalizes each reward column apart and would undo the length_penalty "
                "column. Use 'sum_then_normalize'."
            )
