"""``LengthPluginGRPOConfig``: TRL's ``GRPOConfig`` plus the length-control keys (docs/reference/product.md
§1.3).

Every key works from a YAML recipe, from command-line flags and from Python. The length-shaping keys are
validated together into the core's ``LengthShapingConfig`` in ``__post_init__``, so a bad key fails while
the arguments are parsed, before any model is loaded, with one line naming the key.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import MISSING, dataclass, field, fields

from trl import GRPOConfig

from trl_length_plugin.score_centering.config import SCORE_CENTERING_KEYS, load_score_centering_config
from trl_length_plugin.shaping.config import (
    DEFAULT_REASONING_TAGS,
    SHAPING_KEYS,
    LengthConfigError,
    LengthPenaltyConfig,
    LengthShapingConfig,
    load_shaping_config,
)
from trl_length_plugin.trl_integration.score_centering_plan import resolve_plan
from trl_length_plugin.trl_keys import TRL_KEYS, check_trl_keys

logger = logging.getLogger("trl_length_plugin")

#: TRL loss types whose denominator counts sequences; see ``LengthPluginGRPOTrainer._compute_loss``
SEQUENCE_MEAN_LOSSES = ("grpo", "sapo", "dr_grpo", "luspo")

#: the keys a recipe or the command line set explicitly (the command line knows; Python does not)
_EXPLICIT_KEYS: ContextVar[frozenset[str] | None] = ContextVar("explicit_keys", default=None)


@contextmanager
def explicit_keys(keys: frozenset[str]) -> Iterator[None]:
    """Mark ``keys`` as written by the user while configs are built (``luspo: true`` keeps them)."""
    token = _EXPLICIT_KEYS.set(frozenset(keys))
    try:
        yield
    finally:
        _EXPLICIT_KEYS.reset(token)


def _json_mapping(key: str, text: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{key}: not valid JSON ({err})") from None


def _default(spec):
    return spec.default_factory() if spec.default_factory is not MISSING else spec.default


@dataclass
class LengthPluginGRPOConfig(GRPOConfig):
    """``GRPOConfig`` with group length penalties (docs/reference/length-penalties.md §2), the length
    coefficient (docs/reference/length-coefficient.md §3) and LUSPO (docs/reference/luspo.md §4).

    The validated length-shaping keys are ``shaping`` (a ``LengthShapingConfig``).
    """

    length_penalty: dict | str | None = field(
        default=None,
        metadata={
            "help": "Group length penalties (docs/reference/length-penalties.md §2.1): a YAML mapping in a "
            "recipe, a JSON string or the path of a YAML file on the command line. A --length_penalty flag "
            "replaces the recipe's whole block. Validated before any model is loaded."
        },
    )
    correctness_reward: str | None = field(
        default=None,
        metadata={
            "help": "Name of the binary reward function the length shaping acts on (reference §2.4). "
            "Optional when there is a single reward function, required when there are several."
        },
    )
    agent_column: str = field(
        default="agent",
        metadata={
            "help": "Dataset column naming each prompt's agent for `agent_overrides` (reference §2.3)."
        },
    )
    reasoning_tags: list[str] = field(
        default_factory=lambda: list(DEFAULT_REASONING_TAGS),
        metadata={"help": "Opening and closing tag of the reasoning channel (reference §2.5)."},
    )
    length_penalty_coeff: float = field(
        default=0.0,
        metadata={
            "help": "Length coefficient c >= 0 relative to the shortest correct rollout "
            "(docs/reference/length-coefficient.md §3.1); 0 is off."
        },
    )
    length_penalty_min_tokens: int = field(
        default=0,
        metadata={"help": "Floor m of the coefficient's reference length (reference §3.1)."},
    )
    length_penalty_coeff_warmup_steps: int = field(
        default=0,
        metadata={
            "help": "Raise the coefficient linearly from 0 to `length_penalty_coeff` over this many steps."
        },
    )
    length_schedule: list | str | None = field(
        default=None,
        metadata={
            "help": "Move numeric length-shaping keys through stages by optimizer step "
            "(docs/reference/length-coefficient.md §3.7): a YAML list in a recipe, a JSON array or the path "
            "of a YAML file on the command line; each entry is {key: <dotted key>, stages: [{until_step, "
            "value | start, end}]}."
        },
    )
    drop_zero_std_groups: bool = field(
        default=False,
        metadata={
            "help": "Drop groups whose shaped rewards are all equal from the loss, masks and denominators "
            "(reference §3.3)."
        },
    )
    length_penalty_log_file: str | None = field(
        default=None,
        metadata={
            "help": "Write the per-rollout `Length penalty:` records (reference §3.4) as JSON lines to this file "
            "(a relative path is inside output_dir) instead of the console."
        },
    )
    length_penalty_log_rollouts: bool = field(
        default=False,
        metadata={
            "help": "Log one `Length penalty:` line per rollout (reference §3.4) instead of one summary line "
            "per step."
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
        metadata={"help": "Switch on LUSPO with the paper's settings (docs/reference/luspo.md §4)."},
    )
    score_centering: bool = field(
        default=False,
        metadata={
            "help": "Add the score-centering correction A * C to the loss, from the vLLM sampler's top-k head "
            "(docs/reference/score-centering.md §5). Needs use_vllm."
        },
    )
    score_centering_top_k: int = field(
        default=0,
        metadata={
            "help": "K, the candidates captured per generated token (required >= 1 with score_centering)."
        },
    )
    score_centering_importance_sampling: str = field(
        default="auto",
        metadata={
            "help": "auto | off | is | tis | icepop | adaptive-ppo-clip; auto derives it from "
            "vllm_importance_sampling_correction / vllm_importance_sampling_mode (reference §5.5)."
        },
    )
    force_on_policy_ratio: bool = field(
        default=False,
        metadata={"help": "The sampled-token ratio uses the detached current policy (reference §5.5)."},
    )
    score_centering_adaptive_outer_bound: float = field(
        default=10.0, metadata={"help": "adaptive-ppo-clip's outer bound o, above 1 + epsilon_high (§5.7)."}
    )
    score_centering_adaptive_k_init: float = field(
        default=0.0, metadata={"help": "adaptive-ppo-clip's initial offset k (§5.7)."}
    )
    score_centering_adaptive_target: float = field(
        default=0.02, metadata={"help": "adaptive-ppo-clip's target clip fraction, in (0, 1) (§5.7)."}
    )
    score_centering_adaptive_k_delta: float = field(
        default=0.05, metadata={"help": "adaptive-ppo-clip's step of k per optimizer step (§5.7)."}
    )
    score_centering_adaptive_k_min: float = field(default=0.0, metadata={"help": "Lower bound of k (§5.7)."})
    score_centering_adaptive_k_max: float = field(default=1.0, metadata={"help": "Upper bound of k (§5.7)."})
    vllm_engine_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "Extra arguments of the colocated vLLM engine, a mapping or a JSON string (e.g. "
            '{"dtype": "float32", "enforce_eager": true} on CPU); score centering raises max_logprobs to K.'
        },
    )

    def __post_init__(self):
        check_trl_keys({key: getattr(self, key) for key in TRL_KEYS})
        try:
            self.shaping: LengthShapingConfig = load_shaping_config(self._given(SHAPING_KEYS))
        except LengthConfigError as err:
            raise ValueError(str(err)) from None
        self.score_centering_config = load_score_centering_config(self._given(SCORE_CENTERING_KEYS))
        if isinstance(self.vllm_engine_kwargs, str):
            self.vllm_engine_kwargs = _json_mapping("vllm_engine_kwargs", self.vllm_engine_kwargs)
        if self.vllm_engine_kwargs is not None and not isinstance(self.vllm_engine_kwargs, dict):
            raise ValueError("vllm_engine_kwargs: expected a mapping or a JSON object string")
        if isinstance(self.length_penalty, str) and self.length_penalty.strip().startswith("{"):
            self.length_penalty = json.loads(self.length_penalty)  # stored as a mapping for loggers
        self._check_combinations()
        if self.luspo:
            from trl_length_plugin.trl_integration.luspo import apply_luspo_defaults

            apply_luspo_defaults(self, _EXPLICIT_KEYS.get())
        super().__post_init__()
        self.score_centering_plan = resolve_plan(self)
        if self.vllm_engine_kwargs and self.vllm_mode != "colocate":
            raise ValueError(
                "vllm_engine_kwargs: only a colocated engine is built by the trainer (vllm_mode: colocate)"
            )

    def _given(self, keys: tuple[str, ...]) -> dict:
        """The keys that differ from their defaults: what the user set (so dependent-key rules see them)."""
        defaults = {f.name: _default(f) for f in fields(self) if f.name in keys}
        return {key: getattr(self, key) for key in keys if getattr(self, key) != defaults[key]}

    @property
    def length_penalty_config(self) -> LengthPenaltyConfig | None:
        """The validated penalty block (None when absent)."""
        return self.shaping.length_penalty

    def _check_combinations(self) -> None:
        if self.shaping.enabled and self.multi_objective_aggregation == "normalize_then_sum":
            raise ValueError(
                "multi_objective_aggregation: 'normalize_then_sum' cannot be combined with length shaping "
                "(docs/reference/length-coefficient.md §3.5): it normalizes each reward column apart and would "
                "undo the length_penalty column; use 'sum_then_normalize'"
            )
