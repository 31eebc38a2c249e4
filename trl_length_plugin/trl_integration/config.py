"""``LengthPluginGRPOConfig``: TRL's ``GRPOConfig`` plus the length-control keys (docs/reference/product.md
§1.3).

Every key works from a YAML recipe, from command-line flags and from Python. The length-shaping keys are
validated together into the core's ``LengthShapingConfig`` in ``__post_init__``, so a bad key fails while
the arguments are parsed, before any model is loaded, with one line naming the key.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields

from trl import GRPOConfig

from trl_length_plugin.config_base import read_json
from trl_length_plugin.plugin_keys import field_default, with_plugin_keys
from trl_length_plugin.score_centering import SCORE_CENTERING_KEYS, load_score_centering_config
from trl_length_plugin.shaping import (
    SHAPING_KEYS,
    LengthConfigError,
    LengthPenaltyConfig,
    LengthShapingConfig,
    length_limit_error,
    load_shaping_config,
)
from trl_length_plugin.trl_integration.keys import TRL_KEYS, check_trl_keys
from trl_length_plugin.trl_integration.score_centering_plan import resolve_plan

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
        return read_json(text)
    except ValueError as err:
        raise ValueError(f"{key}: {err}") from None


@dataclass
@with_plugin_keys
class LengthPluginGRPOConfig(GRPOConfig):
    """``GRPOConfig`` with group length penalties (docs/reference/length-penalties.md §2), the length
    coefficient (docs/reference/length-coefficient.md §3), LUSPO (docs/reference/luspo.md §4) and score
    centering (docs/reference/score-centering.md §5).

    Its fields are the plugin's keys, made from the pydantic models that validate them (``plugin_keys``).
    The validated length-shaping keys are ``shaping`` (a ``LengthShapingConfig``), the score-centering keys
    ``score_centering_config``.
    """

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
            self.length_penalty = read_json(self.length_penalty)  # stored as a mapping for loggers
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
        defaults = {f.name: field_default(f) for f in fields(self) if f.name in keys}
        return {key: getattr(self, key) for key in keys if getattr(self, key) != defaults[key]}

    @property
    def length_penalty_config(self) -> LengthPenaltyConfig | None:
        """The validated penalty block (None when absent)."""
        return self.shaping.length_penalty

    def _check_combinations(self) -> None:
        limit_error = length_limit_error(self.shaping, self.max_completion_length, "max_completion_length")
        if limit_error is not None:
            raise ValueError(limit_error)
        if self.shaping.enabled and self.multi_objective_aggregation == "normalize_then_sum":
            raise ValueError(
                "multi_objective_aggregation: 'normalize_then_sum' cannot be combined with length shaping "
                "(docs/reference/length-coefficient.md §3.5): it normalizes each reward column apart and would "
                "undo the length_penalty column; use 'sum_then_normalize'"
            )
