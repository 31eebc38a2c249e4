"""The typed ``length_penalty`` block (decisions.md §2.1, §2.3, §2.12).

Unknown keys, misspelled values and out-of-range numbers are rejected when the block is loaded, and the
pydantic error names the key path (for example ``default.top_percentile`` or
``profile_band.defaults.total``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

Channel = Literal["total", "reasoning", "answer"]
CHANNELS: tuple[Channel, ...] = ("reasoning", "answer", "total")  # bonus / longest / zMAD order (§2.7)
BAND_CHANNELS: tuple[Channel, ...] = ("total", "reasoning", "answer")  # band order (§2.12)
DEFAULT_AGENT = "default"
DEFAULT_REASONING_TAGS = ("<think>", "</think>")

NonNegative = Annotated[float, Field(ge=0)]
_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


class LengthPenaltyParams(BaseModel):
    """The per-agent parameters: ``length_penalty.default`` and every ``agent_overrides.<agent>``.

    In an override only the keys it sets replace ``default`` (``model_fields_set``, decisions.md §2.3).
    """

    model_config = _STRICT

    enabled: bool = True
    length_type: Literal["tokens", "chars"] = "tokens"
    top_percentile: Annotated[float, Field(gt=0, le=1)] = 0.5
    reasoning_bonus: NonNegative = 0.0
    answer_bonus: NonNegative = 0.0
    total_bonus: NonNegative = 0.0
    longest_reasoning_penalty: NonNegative = 0.0
    longest_answer_penalty: NonNegative = 0.0
    longest_total_penalty: NonNegative = 0.0
    group_reasoning_length_penalty_coeff: NonNegative = 0.0
    group_answer_length_penalty_coeff: NonNegative = 0.0
    group_total_length_penalty_coeff: NonNegative = 0.0
    reasoning_zmad_threshold: NonNegative = 0.0
    reasoning_zmad_penalty: NonNegative = 0.0
    answer_zmad_threshold: NonNegative = 0.0
    answer_zmad_penalty: NonNegative = 0.0
    total_zmad_threshold: NonNegative = 0.0
    total_zmad_penalty: NonNegative = 0.0
    profiled_length_penalty: NonNegative = 0.0
    profiled_length_n_std: float = 1.0
    profiled_length_min_samples: Annotated[int, Field(ge=1)] = 2
    pass_rate_length_penalty_weight: NonNegative = 0.0
    profile_band_total: bool = False
    profile_band_reasoning: bool = False
    profile_band_answer: bool = False
    group_length_penalty_profile_gate: bool = False
    group_length_penalty_profile_gate_channel: Channel = "total"
    group_length_penalty_profile_gate_field: Literal["a", "b", "f"] = "a"
    group_length_penalty_profile_gate_positive_only: bool = True


class ProfileBandChannel(BaseModel):
    """One ``{a, b, f}`` band: multiplier 1 up to ``a``, linear down to ``f`` at ``b``, ``f`` beyond."""

    model_config = _STRICT

    a: float
    b: float
    f: Annotated[float, Field(ge=0, le=1)]

    @model_validator(mode="after")
    def _b_above_a(self) -> ProfileBandChannel:
        if self.b <= self.a:
            raise ValueError(f"profile band needs b > a, got a={self.a}, b={self.b}")
        return self


class ProfileBandDefaults(BaseModel):
    model_config = _STRICT

    total: ProfileBandChannel | None = None
    reasoning: ProfileBandChannel | None = None
    answer: ProfileBandChannel | None = None


class ProfileBandConfig(BaseModel):
    """Global bands for rows without per-prompt ``profile_band`` (the document's "Global Defaults")."""

    model_config = _STRICT

    enabled: bool = False
    defaults: ProfileBandDefaults = Field(default_factory=ProfileBandDefaults)


class LengthPenaltyConfig(BaseModel):
    """``length_penalty``: the group length shaping of ``length-penalties.md`` (decisions.md §2.1).

    ``reasoning_tags`` are the opening and closing tags of the reasoning channel (decisions.md §2.5).
    Warnings that the spec wants once per agent are remembered on the instance, i.e. once per run.
    """

    model_config = _STRICT

    verbose: bool = False
    default: LengthPenaltyParams = Field(default_factory=LengthPenaltyParams)
    agent_overrides: dict[str, LengthPenaltyParams | None] | None = None
    profile_band: ProfileBandConfig | None = None
    reasoning_tags: tuple[str, str] = DEFAULT_REASONING_TAGS

    _warned: set[tuple[str, ...]] = PrivateAttr(default_factory=set)
    _resolved: dict[str, LengthPenaltyParams] = PrivateAttr(default_factory=dict)

    @field_validator("reasoning_tags")
    @classmethod
    def _distinct_tags(cls, tags: tuple[str, str]) -> tuple[str, str]:
        if not tags[0] or not tags[1] or tags[0] == tags[1]:
            raise ValueError(f"reasoning_tags needs two different non-empty strings, got {tags!r}")
        return tags

    @property
    def any_enabled(self) -> bool:
        """False when no agent can be shaped: then no metrics and no length counting (§2.15)."""
        overrides = self.agent_overrides or {}
        return self.default.enabled or any(
            o is not None and "enabled" in o.model_fields_set and o.enabled for o in overrides.values()
        )

    @property
    def global_bands(self) -> dict[str, ProfileBandChannel]:
        """The channels under ``profile_band.defaults`` when ``profile_band.enabled`` (§2.12)."""
        if self.profile_band is None or not self.profile_band.enabled:
            return {}
        defaults = self.profile_band.defaults
        return {ch: band for ch in BAND_CHANNELS if (band := getattr(defaults, ch)) is not None}

    def for_agent(self, agent: str | None) -> LengthPenaltyParams:
        """The merged parameters of ``agent`` (decisions.md §2.3, §2.12).

        Channels of the global band are enabled unless ``default`` sets their ``profile_band_<channel>``;
        an override that sets the flag wins. An agent missing from a non-empty ``agent_overrides`` gets
        ``default`` and one warning.
        """
        name = agent if agent is not None else DEFAULT_AGENT
        if name not in self._resolved:
            self._resolved[name] = self._resolve(name)
        return self._resolved[name]

    def length_types(self, agents: Sequence[str | None]) -> list[str]:
        """Each row's length unit: its agent's ``length_type`` (decisions.md §2.5)."""
        return [self.for_agent(agent).length_type for agent in agents]

    def _resolve(self, name: str) -> LengthPenaltyParams:
        merged = self.default.model_dump()
        for channel in self.global_bands:
            key = f"profile_band_{channel}"
            if key not in self.default.model_fields_set:
                merged[key] = True
        overrides = self.agent_overrides or {}
        if overrides and name not in overrides:
            self.warn_once(
                ("missing_override", name),
                "length_penalty: agent %r is not in agent_overrides; using `default`",
                name,
            )
        elif overrides.get(name) is not None:
            merged.update(overrides[name].model_dump(exclude_unset=True))
        return LengthPenaltyParams.model_validate(merged)

    def warn_once(self, key: tuple[str, ...], message: str, *args: Any) -> None:
        """Log ``message`` on the ``trl_length_plugin`` logger the first time ``key`` is seen."""
        if key not in self._warned:
            self._warned.add(key)
            logging.getLogger("trl_length_plugin").warning(message, *args)


def load_length_penalty_config(path_or_mapping: str | Path | Mapping[str, Any]) -> LengthPenaltyConfig:
    """Validate a ``length_penalty`` block from a mapping or a YAML file.

    A file may hold the block itself or a mapping whose only key is ``length_penalty``.
    """
    if isinstance(path_or_mapping, Mapping):
        return LengthPenaltyConfig.model_validate(dict(path_or_mapping))
    try:
        import yaml
    except ImportError as err:
        raise ImportError(
            "Loading a length_penalty YAML file needs PyYAML: pip install 'trl-length-plugin[trl]' "
            "(or pip install pyyaml)"
        ) from err
    data = yaml.safe_load(Path(path_or_mapping).read_text()) or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{path_or_mapping}: expected a mapping with the length_penalty block")
    if set(data) == {"length_penalty"}:
        data = data["length_penalty"] or {}
    return LengthPenaltyConfig.model_validate(data)
