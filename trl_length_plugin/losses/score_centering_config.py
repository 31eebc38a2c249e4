"""The score-centering keys every host shares (docs/reference/score-centering.md §5.5, §5.7, §5.8).

Host-independent rules only: the top-k count, the mode, ``force_on_policy_ratio`` and the adaptive
controller's keys, validated together. Each host adds its own checks (its importance-sampling settings,
sampling filters, the optimizer-update rule) and resolves ``auto``. Needs only pydantic.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field, model_validator

from trl_length_plugin.shaping.config import _STRICT, Count, Number, _not_bool

Mode = Literal["auto", "off", "is", "tis", "icepop", "adaptive-ppo-clip"]
CONTROLLER_KEYS = (
    "score_centering_adaptive_outer_bound",
    "score_centering_adaptive_k_init",
    "score_centering_adaptive_target",
    "score_centering_adaptive_k_delta",
    "score_centering_adaptive_k_min",
    "score_centering_adaptive_k_max",
)


class ScoreCenteringConfig(BaseModel):
    """``score_centering`` and its keys (reference §5.5, §5.7, §5.8); field names are the keys a user writes."""

    model_config = _STRICT

    score_centering: bool = False
    score_centering_top_k: Count = 0
    score_centering_importance_sampling: Mode = "auto"
    force_on_policy_ratio: bool = False
    score_centering_adaptive_outer_bound: Annotated[float, Field(gt=0), BeforeValidator(_not_bool)] = 10.0
    score_centering_adaptive_k_init: Number = 0.0
    score_centering_adaptive_target: Annotated[float, Field(gt=0, lt=1), BeforeValidator(_not_bool)] = 0.02
    score_centering_adaptive_k_delta: Annotated[float, Field(gt=0), BeforeValidator(_not_bool)] = 0.05
    score_centering_adaptive_k_min: Number = 0.0
    score_centering_adaptive_k_max: Number = 1.0

    @model_validator(mode="after")
    def _dependent_keys(self) -> ScoreCenteringConfig:
        k = self.score_centering_top_k
        if self.score_centering and k < 1:
            raise ValueError("score_centering_top_k: required (>= 1) with score_centering: true")
        if not self.score_centering:
            given = [key for key in self.model_fields_set if key != "score_centering" and getattr(self, key)]
            if k > 0 or given:
                raise ValueError(f"{sorted(given)[0]}: needs score_centering: true")
        adaptive = self.score_centering_importance_sampling == "adaptive-ppo-clip"
        if adaptive and not self.force_on_policy_ratio:
            raise ValueError(
                "score_centering_importance_sampling: adaptive-ppo-clip needs force_on_policy_ratio: true"
            )
        controller = sorted(self.model_fields_set & set(CONTROLLER_KEYS))
        if controller and not adaptive:
            raise ValueError(
                f"{controller[0]}: a key of the adaptive-ppo-clip controller; set "
                "score_centering_importance_sampling: adaptive-ppo-clip"
            )
        low, high = self.score_centering_adaptive_k_min, self.score_centering_adaptive_k_max
        if high < low:
            raise ValueError(
                f"score_centering_adaptive_k_max: must be >= score_centering_adaptive_k_min ({low})"
            )
        if not low <= self.score_centering_adaptive_k_init <= high:
            raise ValueError(f"score_centering_adaptive_k_init: must lie in [k_min, k_max] = [{low}, {high}]")
        return self

    @property
    def enabled(self) -> bool:
        return self.score_centering


#: the keys of ``ScoreCenteringConfig``, as a user writes them
SCORE_CENTERING_KEYS = tuple(ScoreCenteringConfig.model_fields)
