"""The typed length-shaping config: the ``length_penalty`` block and ``LengthShapingConfig``, which holds
it with the coefficient, its floor and warm-up, the reasoning tags and the zero-std filter switch
(docs/reference/product.md §1.4; docs/reference/length-penalties.md §2.1, §2.3, §2.12;
docs/reference/length-coefficient.md §3.1).

Unknown keys, misspelled values, NaN and infinities, fractions for integer keys, booleans for numbers and
out-of-range numbers are rejected when the config is loaded (the strict base of ``config_base``, whose
``config_error`` turns pydantic's error into one line naming the key path, for example
``length_penalty.default.top_percentile``); ``schedule_keys`` holds the ``length_schedule`` entries.

Needs only pydantic (and PyYAML for files): the command line validates a recipe with it before torch or
TRL are imported.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from trl_length_plugin.config_base import STRICT, config_error, not_bool, read_json, read_yaml

from .fields import BAND_CHANNELS, MAX_LENGTH, Count, NonNegative
from .schedule import check_schedule
from .schedule_keys import KeySchedule, schedule_entries
from .terms import idle_key_errors, registered_parameters, switched_on, switches_reading, terms

DEFAULT_AGENT = "default"
DEFAULT_REASONING_TAGS = ("<think>", "</think>")
BandBound = Annotated[float, Field(ge=0, le=MAX_LENGTH), BeforeValidator(not_bool)]  # a length (§2.12)


class _WarnOnce:
    """``warn_once``: a warning logged the first time its key is seen by this config instance (one run)."""

    _warned: set[tuple[str, ...]]

    def first_time(self, key: tuple[str, ...]) -> bool:
        """Whether ``key`` is seen for the first time (it is remembered)."""
        seen = key in self._warned
        self._warned.add(key)
        return not seen

    def warn_once(self, key: tuple[str, ...], message: str, *args: Any) -> None:
        """Log ``message`` on the ``trl_length_plugin`` logger the first time ``key`` is seen."""
        if self.first_time(key):
            logging.getLogger("trl_length_plugin").warning(message, *args)


class SharedParams(BaseModel):
    """The per-agent keys every term shares (docs/reference/length-penalties.md §2.1, §2.5, §2.7)."""

    model_config = STRICT

    enabled: bool = True
    length_type: Literal["tokens", "chars"] = "tokens"
    top_percentile: Annotated[float, Field(gt=0, le=1), BeforeValidator(not_bool)] = 0.5


#: The per-agent parameters: ``length_penalty.default`` and every ``agent_overrides.<agent>``: the shared keys,
#: then every registered term's keys in §2.6 order, built once, when this module is imported
#: (``terms.registered_parameters``, docs/write-a-term.md). In an override only the keys it sets replace
#: ``default`` (``model_fields_set``, docs/reference/length-penalties.md §2.3).
LengthPenaltyParams = create_model(
    "LengthPenaltyParams",
    __base__=SharedParams,
    __module__=__name__,
    __doc__="The per-agent parameters: the shared keys and every registered term's (docs/write-a-term.md).",
    **registered_parameters(),
)


def term_errors(params: Mapping[str, Any], given: set[str]) -> list[str]:
    """The terms' dependent-key errors of one agent's merged parameters, ``key: message``; ``given``: the
    keys ``default`` or the agent's block sets (docs/reference/length-penalties.md §2.17-2.20)."""
    checks = [error for term in terms() if term.check is not None for error in term.check(params, given)]
    return checks + idle_key_errors(params, given)


class ProfileBandChannel(BaseModel):
    """One ``{a, b, f}`` band: multiplier 1 up to ``a``, linear down to ``f`` at ``b``, ``f`` beyond."""

    model_config = STRICT

    a: BandBound
    b: BandBound
    f: Annotated[float, Field(ge=0, le=1), BeforeValidator(not_bool)]

    @model_validator(mode="after")
    def _b_above_a(self) -> ProfileBandChannel:
        if self.b <= self.a:
            raise ValueError(f"profile band needs b > a, got a={self.a}, b={self.b}")
        return self


class ProfileBandDefaults(BaseModel):
    model_config = STRICT

    total: ProfileBandChannel | None = None
    reasoning: ProfileBandChannel | None = None
    answer: ProfileBandChannel | None = None


class ProfileBandConfig(BaseModel):
    """Global bands for rows without per-prompt ``profile_band`` (the document's "Global Defaults")."""

    model_config = STRICT

    enabled: bool = False
    defaults: ProfileBandDefaults = Field(default_factory=ProfileBandDefaults)


class LengthPenaltyConfig(_WarnOnce, BaseModel):
    """``length_penalty``: the group length shaping (docs/reference/length-penalties.md §2.1).

    ``reasoning_tags`` are the opening and closing tags of the reasoning channel (docs/reference/length-penalties.md §2.5).
    Warnings that the spec wants once per agent are remembered on the instance, i.e. once per run.
    """

    model_config = STRICT

    verbose: bool = False
    default: LengthPenaltyParams = Field(default_factory=LengthPenaltyParams)
    agent_overrides: dict[str, LengthPenaltyParams | None] | None = None
    profile_band: ProfileBandConfig | None = None
    reasoning_tags: tuple[str, str] = DEFAULT_REASONING_TAGS

    _warned: set[tuple[str, ...]] = PrivateAttr(default_factory=set)
    _resolved: dict[str, LengthPenaltyParams] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _dependent_keys(self) -> LengthPenaltyConfig:
        """Each agent's merged keys, checked at load by their terms (docs/reference/length-penalties.md §2.17).
        A block is judged on the keys it sets itself: an override may switch off a term whose keys
        ``default`` sets (§2.3)."""
        for path, (block, merged) in self.merged_blocks().items():
            errors = term_errors(merged, block.model_fields_set)
            if errors:
                raise ValueError(f"{path}.{errors[0]}")
        return self

    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> LengthPenaltyConfig:
        """A copy (the schedule's config of a step, §3.7): the warn-once memory stays shared, the per-agent
        merge cache starts afresh."""
        copy = super().model_copy(update=update, deep=deep)
        copy._resolved = {}
        return copy

    def merged_blocks(self) -> dict[str, tuple[LengthPenaltyParams, dict[str, Any]]]:
        """Each block by its key path (``default``, ``agent_overrides.<agent>``), with its keys merged onto
        ``default``'s (docs/reference/length-penalties.md §2.3)."""
        blocks = {
            "default": self.default,
            **{f"agent_overrides.{k}": o for k, o in (self.agent_overrides or {}).items() if o is not None},
        }
        return {
            path: (block, {**self.default.model_dump(), **block.model_dump(exclude_unset=True)})
            for path, block in blocks.items()
        }

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
    def switches_a_term(self) -> bool:
        """Whether some enabled agent switches a term on, or a global band applies (§2.6, §2.12): a block
        that does neither changes no reward."""
        switches = [key for term in terms() for key in term.switches]
        return bool(self.global_bands) or any(
            merged["enabled"] and any(switched_on(merged[key]) for key in switches)
            for _, merged in self.merged_blocks().values()
        )

    @property
    def uses_metadata(self) -> bool:
        """Whether some agent reads per-prompt metadata (a gate, a band, the profiled penalty, the target
        length or a term column, §2.14, §2.20)."""
        params = [self.default, *(o for o in (self.agent_overrides or {}).values() if o is not None)]
        switches = [key for term in terms() if term.metadata or term.columns for key in term.switches]
        return bool(self.global_bands) or any(
            switched_on(getattr(p, key)) for p in params for key in switches
        )

    @property
    def truncation_modes(self) -> set[str]:
        """The ``truncation`` modes the agents set, ``none`` left out (docs/reference/length-penalties.md §2.19)."""
        params = [self.default, *(o for o in (self.agent_overrides or {}).values() if o is not None)]
        return {p.truncation for p in params} - {"none"}

    @property
    def global_bands(self) -> dict[str, ProfileBandChannel]:
        """The channels under ``profile_band.defaults`` when ``profile_band.enabled`` (§2.12)."""
        if self.profile_band is None or not self.profile_band.enabled:
            return {}
        defaults = self.profile_band.defaults
        return {ch: band for ch in BAND_CHANNELS if (band := getattr(defaults, ch)) is not None}

    def band_source_warning(self, has_bands: bool, source: str) -> str | None:
        """The warning, the first time in a run (else None), that the profile gate or a band channel is on
        for some agent but no band can apply: the host found no per-prompt ``profile_band`` (``has_bands``
        False; ``source`` says where it looked) and ``profile_band.defaults`` sets none
        (docs/reference/length-penalties.md §2.12-2.13). Hosts and the engine share it, so it is said once."""
        if has_bands or self.global_bands:
            return None
        params = [self.default, *(o for o in (self.agent_overrides or {}).values() if o is not None)]
        used = sorted({name for p in params for name in switches_reading("bands") if getattr(p, name)})
        if not used or not self.first_time(("no_band_source",)):
            return None
        return (
            f"length_penalty: {', '.join(used)} is on but {source} and length_penalty.profile_band.defaults "
            "sets no band: the gate stays closed and no band applies (docs/reference/length-penalties.md "
            "§2.12-2.13)"
        )

    def for_agent(self, agent: str | None) -> LengthPenaltyParams:
        """The merged parameters of ``agent`` (docs/reference/length-penalties.md §2.3, §2.12).

        Channels of the global band are enabled unless ``default`` sets their ``profile_band_<channel>``;
        an override that sets the flag wins. An agent missing from a non-empty ``agent_overrides`` gets
        ``default`` and one warning.
        """
        name = agent if agent is not None else DEFAULT_AGENT
        if name not in self._resolved:
            self._resolved[name] = self._resolve(name)
        return self._resolved[name]

    def length_types(self, agents: Sequence[str | None]) -> list[str]:
        """Each row's length unit: its agent's ``length_type`` (docs/reference/length-penalties.md §2.5)."""
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


def block_mapping(value: Any) -> Any:
    """The ``length_penalty`` block from a JSON object string or the path of a YAML file (which may hold
    the block itself or a mapping whose only key is ``length_penalty``); anything else is returned as is."""
    if isinstance(value, Path) or (isinstance(value, str) and not value.strip().startswith("{")):
        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(
                f"{str(value)!r} is neither a JSON object nor the path of a YAML file; give the block as a "
                "mapping, a JSON string or a file path"
            )
        value = read_yaml(path) or {}
        if isinstance(value, Mapping) and set(value) == {"length_penalty"}:
            value = value["length_penalty"] or {}
    elif isinstance(value, str):
        value = read_json(value)
    if isinstance(value, BaseModel) and not isinstance(value, LengthPenaltyConfig):
        raise ValueError(f"expected a mapping, got {type(value).__name__}")
    if not isinstance(value, Mapping | LengthPenaltyConfig):
        raise ValueError(f"expected a mapping, a JSON string or a YAML file path, got {type(value).__name__}")
    return value


def load_length_penalty_config(path_or_mapping: str | Path | Mapping[str, Any]) -> LengthPenaltyConfig:
    """Validate a ``length_penalty`` block from a mapping, a JSON string or a YAML file."""
    block = block_mapping(path_or_mapping)
    return block if isinstance(block, LengthPenaltyConfig) else LengthPenaltyConfig.model_validate(block)


def _block_or_none(value: Any) -> Any:
    if value is None or (isinstance(value, Mapping) and not value):
        return None
    block = block_mapping(value)
    return None if isinstance(block, Mapping) and not block else block


class LengthShapingConfig(_WarnOnce, BaseModel):
    """Every length-shaping key of a run: the penalty block (docs/reference/length-penalties.md §2), the
    coefficient with its floor and warm-up (docs/reference/length-coefficient.md §3.1), the reasoning tags
    (§2.5) and the zero-std filter (§3.3). TRL's config and verl's overrides both parse into it.

    The field names are the keys a user writes (recipe, command line, Hydra override), so a validation
    error names the key; each field's description is the key's help. Dependent keys are checked together.
    """

    model_config = STRICT

    length_penalty: Annotated[LengthPenaltyConfig | None, BeforeValidator(_block_or_none)] = Field(
        None,
        description="Group length penalties (docs/reference/length-penalties.md §2.1): a YAML mapping in a "
        "recipe, a JSON string or the path of a YAML file on the command line. A --length_penalty flag "
        "replaces the recipe's whole block. Validated before any model is loaded.",
    )
    length_penalty_coeff: NonNegative = Field(
        0.0,
        description="Length coefficient c >= 0 relative to the shortest correct rollout "
        "(docs/reference/length-coefficient.md §3.1); 0 is off.",
    )
    length_penalty_min_tokens: Count = Field(
        0, description="Floor m of the coefficient's reference length (reference §3.1)."
    )
    length_penalty_coeff_warmup_steps: Count = Field(
        0, description="Raise the coefficient linearly from 0 to `length_penalty_coeff` over this many steps."
    )
    length_schedule: Annotated[tuple[KeySchedule, ...], BeforeValidator(schedule_entries)] = Field(
        (),
        description="Move numeric length-shaping keys through stages by optimizer step "
        "(docs/reference/length-coefficient.md §3.7): a YAML list in a recipe, a JSON array or the path of a "
        "YAML file on the command line; each entry is {key: <dotted key>, stages: [{until_step, value | "
        "start, end}]}.",
    )
    reasoning_tags: tuple[str, str] = Field(
        DEFAULT_REASONING_TAGS,
        description="Opening and closing tag of the reasoning channel (reference §2.5).",
    )
    drop_zero_std_groups: bool = Field(
        False,
        description="Drop groups whose shaped rewards are all equal from the loss, masks and denominators "
        "(reference §3.3).",
    )

    _warned: set[tuple[str, ...]] = PrivateAttr(default_factory=set)

    @field_validator("reasoning_tags")
    @classmethod
    def _distinct_tags(cls, tags: tuple[str, str]) -> tuple[str, str]:
        return LengthPenaltyConfig._distinct_tags(tags)

    @model_validator(mode="after")
    def _dependent_keys(self) -> LengthShapingConfig:
        for key in ("length_penalty_coeff_warmup_steps", "length_penalty_min_tokens"):
            if getattr(self, key) and not self.length_penalty_coeff:
                raise ValueError(f"{key}: needs length_penalty_coeff > 0 (the coefficient it modifies)")
        block = self.length_penalty
        if (
            block is not None
            and "reasoning_tags" in block.model_fields_set
            and "reasoning_tags" in self.model_fields_set
            and block.reasoning_tags != self.reasoning_tags
        ):
            raise ValueError(
                f"reasoning_tags: {list(self.reasoning_tags)} disagrees with length_penalty.reasoning_tags "
                f"{list(block.reasoning_tags)}; set one of them"
            )
        check_schedule(self)
        return self

    @property
    def penalties(self) -> LengthPenaltyConfig | None:
        """The penalty block when it enables some agent, else None."""
        block = self.length_penalty
        return block if block is not None and block.any_enabled else None

    @property
    def penalties_on(self) -> bool:
        return self.penalties is not None

    @property
    def coefficient_on(self) -> bool:
        return self.length_penalty_coeff > 0

    @property
    def enabled(self) -> bool:
        """Whether anything touches rewards or advantages (else no metrics and no length counting, §2.15)."""
        return self.penalties_on or self.coefficient_on or self.drop_zero_std_groups

    @property
    def tags(self) -> tuple[str, str]:
        """The reasoning tags: this key, or the block's own when only the block sets them (§2.5)."""
        block = self.length_penalty
        if block is not None and "reasoning_tags" in block.model_fields_set:
            return block.reasoning_tags
        return self.reasoning_tags

    def summary(self) -> str:
        """One line saying what is switched on, for the setup log."""
        parts = []
        if self.penalties_on:
            block = self.penalties
            params = [block.default, *(o for o in (block.agent_overrides or {}).values() if o is not None)]
            keys = sorted({k for p in params for k in p.model_fields_set if k != "enabled" and getattr(p, k)})
            bands = [f"profile_band.defaults.{channel}" for channel in block.global_bands]
            parts.append(f"group penalties ({', '.join(keys + bands) or 'defaults'})")
        if self.coefficient_on:
            warmup = self.length_penalty_coeff_warmup_steps
            parts.append(
                f"length coefficient {self.length_penalty_coeff:g} (floor {self.length_penalty_min_tokens} tokens"
                + (f", warm-up {warmup} steps)" if warmup else ")")
            )
        if self.drop_zero_std_groups:
            parts.append("zero-std filter")
        if self.length_schedule:
            parts.append(f"schedule ({', '.join(s.key for s in self.length_schedule)})")
        return "length shaping: " + ("; ".join(parts) if parts else "off")

    def uses_tokens(self) -> bool:
        """Whether some agent measures lengths in tokens (a tokenizer is then required, §2.5)."""
        block = self.penalties
        if block is None:
            return False
        overrides = [o for o in (block.agent_overrides or {}).values() if o is not None]
        return block.default.length_type == "tokens" or any(
            "length_type" in o.model_fields_set and o.length_type == "tokens" for o in overrides
        )


#: the keys of ``LengthShapingConfig``, as a user writes them
SHAPING_KEYS = tuple(LengthShapingConfig.model_fields)


def length_limit_error(config: LengthShapingConfig, limit: Any, limit_key: str) -> str | None:
    """The first length key that cannot act under the host's longest completion ``limit`` (``limit_key``, in
    tokens), as one line naming both keys, else None: an ``overlong_max_length`` above it for an agent that
    counts tokens (no rollout reaches it, docs/reference/length-penalties.md §2.17), a
    ``length_penalty_min_tokens`` at or above it (every L_ref is then the floor, which no rollout exceeds,
    docs/reference/length-coefficient.md §3.1). ``limit`` None (unset) checks nothing."""
    if limit is None or isinstance(limit, bool) or not isinstance(limit, int):
        return None
    floor = config.length_penalty_min_tokens
    if config.coefficient_on and floor >= limit:
        return (
            f"length_penalty_min_tokens: {floor} is at or above {limit_key} ({limit}): no rollout is longer than "
            "the floor, so the coefficient would never act"
        )
    block = config.penalties
    for path, (_, merged) in (block.merged_blocks() if block is not None else {}).items():
        longest = merged["overlong_max_length"]
        if merged["enabled"] and merged["length_type"] == "tokens" and longest > limit:
            return (
                f"length_penalty.{path}.overlong_max_length: {longest} is above {limit_key} ({limit}): no "
                f"rollout reaches it, so the penalty would never reach its maximum; set it <= {limit}"
            )
    return None


class LengthConfigError(ValueError):
    """A length-shaping key failed validation; the message is one line naming the key path."""


def load_shaping_config(values: Mapping[str, Any], prefix: str = "") -> LengthShapingConfig:
    """Validate the length-shaping keys of ``values`` (other keys must have been removed); raise
    :class:`LengthConfigError` with a one-line message naming the key on any error."""
    try:
        return LengthShapingConfig.model_validate(dict(values))
    except ValidationError as err:
        raise LengthConfigError(config_error(err, prefix, LengthShapingConfig)) from None
    except ValueError as err:  # from a before-validator outside pydantic's wrapping (not expected)
        raise LengthConfigError(str(err)) from None
