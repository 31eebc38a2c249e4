"""The length-shaping keys of a verl config, validated when the trainer starts (decisions.md §1.3, §2.1, §3).

Top-level keys of verl's Hydra config (added with ``+``):

- ``length_penalty``: the decisions.md §2.1 block, as a Hydra mapping
  (``+length_penalty.default.enabled=true``, ``+length_penalty='{default: {...}}'``) or the path of a
  YAML file (``+length_penalty=recipes/verl/length_penalty_gsm8k.yaml``);
- ``length_penalty_coeff`` (float >= 0, default 0) and ``length_penalty_min_tokens`` (int >= 0, default
  0): the length coefficient of decisions.md §3.1.

Every error names the offending key, and a top-level key that starts with ``length_penalty`` but is none
of these (a typo such as ``length_penalty_coef``) is an error too, so nothing is silently ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from pydantic import ValidationError

from trl_length_plugin.shaping import LengthPenaltyConfig, load_length_penalty_config

PENALTY_KEY = "length_penalty"
COEFF_KEY = "length_penalty_coeff"
MIN_TOKENS_KEY = "length_penalty_min_tokens"
KNOWN_KEYS = (PENALTY_KEY, COEFF_KEY, MIN_TOKENS_KEY)
#: the advantage estimator that carries the coefficient's group normalization (decisions.md §3.3)
LENGTH_GRPO = "length_grpo"
#: the only ``algorithm.filter_groups.metric`` the shaped filter can judge (decisions.md §3.3)
FILTER_METRIC = "reward"


def _pydantic_message(err: ValidationError) -> str:
    parts = []
    for item in err.errors():
        path = ".".join(str(p) for p in (PENALTY_KEY, *item["loc"]))
        parts.append(f"{path}: {item['msg']}")
    return "; ".join(parts)


def parse_length_penalty(value: Any) -> LengthPenaltyConfig | None:
    """The §2.1 block from a mapping or a YAML file path; None when absent or empty."""
    if value is None:
        return None
    if isinstance(value, DictConfig):
        value = OmegaConf.to_container(value, resolve=True)
    try:
        if isinstance(value, str):
            path = Path(value).expanduser()
            if not path.is_file():
                raise ValueError(
                    f"{PENALTY_KEY}: {value!r} is not a YAML file; give a mapping or a file path"
                )
            return load_length_penalty_config(path)
        if not isinstance(value, Mapping):
            raise ValueError(
                f"{PENALTY_KEY}: expected a mapping or a YAML file path, got {type(value).__name__}"
            )
        return load_length_penalty_config(value) if value else None
    except ValidationError as err:
        raise ValueError(f"invalid length shaping config: {_pydantic_message(err)}") from err


def _number(config: DictConfig, key: str, integer: bool) -> float:
    value = config.get(key, 0)
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) or value < 0:
        expected = "an integer >= 0" if integer else "a finite number >= 0"
        raise ValueError(f"{key}: expected {expected}, got {value!r}")
    return value


@dataclass(frozen=True)
class LengthShapingSettings:
    """What a verl run enables: the §2 penalties (``penalty``), the §3 coefficient (``coeff``)."""

    penalty: LengthPenaltyConfig | None = None
    coeff: float = 0.0
    min_tokens: int = 0

    @property
    def penalties_on(self) -> bool:
        return self.penalty is not None and self.penalty.any_enabled

    @property
    def coefficient_on(self) -> bool:
        return self.coeff > 0

    @property
    def enabled(self) -> bool:
        """Nothing enabled: no shaping, no metrics, no length counting (decisions.md §2.15)."""
        return self.penalties_on or self.coefficient_on

    @classmethod
    def from_verl_config(cls, config: DictConfig) -> LengthShapingSettings:
        """Validate the length keys of a full verl config and how they combine with ``algorithm``."""
        unknown = [k for k in config if str(k).startswith(PENALTY_KEY) and k not in KNOWN_KEYS]
        if unknown:
            raise ValueError(
                f"{unknown[0]}: unknown length-shaping key; expected one of {', '.join(KNOWN_KEYS)}"
            )
        settings = cls(
            penalty=parse_length_penalty(config.get(PENALTY_KEY)),
            coeff=float(_number(config, COEFF_KEY, integer=False)),
            min_tokens=int(_number(config, MIN_TOKENS_KEY, integer=True)),
        )
        settings.check_algorithm(config.algorithm, config.actor_rollout_ref.rollout.n)
        return settings

    def check_algorithm(self, algorithm: DictConfig, rollout_n: int) -> None:
        """Reject combinations that would train on something else than the shaped rewards."""
        estimator = str(algorithm.adv_estimator)
        if self.coefficient_on != (estimator == LENGTH_GRPO):
            raise ValueError(
                f"algorithm.adv_estimator: {COEFF_KEY} > 0 goes with algorithm.adv_estimator={LENGTH_GRPO} "
                f"(GRPO with the coefficient's group normalization, decisions.md §3.3) and {LENGTH_GRPO} with "
                f"{COEFF_KEY} > 0; got adv_estimator={estimator!r}, {COEFF_KEY}={self.coeff}"
            )
        if not self.enabled:
            return
        if estimator == "gdpo":
            raise ValueError(
                "algorithm.adv_estimator: gdpo normalizes reward components separately and would ignore the "
                "shaped scalar score; length shaping acts on one scalar score (decisions.md §2.4)"
            )
        filter_groups = algorithm.get("filter_groups") or {}
        if not filter_groups.get("enable", False):
            return
        if filter_groups.get("metric") != FILTER_METRIC:
            raise ValueError(
                f"algorithm.filter_groups.metric: with length shaping the filter judges shaped rewards "
                f"(decisions.md §3.3), so it must be {FILTER_METRIC!r}, got {filter_groups.get('metric')!r}"
            )
        if rollout_n < 2:
            raise ValueError(
                f"actor_rollout_ref.rollout.n: the shaped group filter drops every group whose shaped rewards "
                f"are all equal, which a group of {rollout_n} rollout always is (decisions.md §3.3)"
            )
