"""Every key the plugin adds to TRL's config, declared once: the fields of the core's ``LengthShapingConfig``
and ``ScoreCenteringConfig`` and of :class:`HostKeys` (docs/reference/product.md §1.3).

A field holds its key's name, type, default and help (its ``description``). ``LengthPluginGRPOConfig``'s
dataclass fields (:func:`with_plugin_keys`), the command line's key checks and ``--help``, and the verl
adapter's accepted keys are all read from these models. Needs only pydantic: the command line checks a
recipe with it before TRL is imported.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

from trl_length_plugin.config_base import unwrapped
from trl_length_plugin.score_centering.config import ScoreCenteringConfig
from trl_length_plugin.shaping.columns import AGENT_COLUMN
from trl_length_plugin.shaping.config import LengthShapingConfig


class HostKeys(BaseModel):
    """The keys ``LengthPluginGRPOConfig`` adds besides the shaping and score-centering configs (verl reads
    ``length_penalty_log_rollouts`` of them too)."""

    model_config = ConfigDict(extra="forbid")

    correctness_reward: str | None = Field(
        None,
        description="Name of the binary reward function the length shaping acts on (reference §2.4). "
        "Optional when there is a single reward function, required when there are several.",
    )
    agent_column: str = Field(
        AGENT_COLUMN,
        description="Dataset column naming each prompt's agent for `agent_overrides` (reference §2.3).",
    )
    length_penalty_log_file: str | None = Field(
        None,
        description="Write the per-rollout `Length penalty:` records (reference §3.4) as JSON lines to this "
        "file (a relative path is inside output_dir) instead of the console.",
    )
    length_penalty_log_rollouts: bool = Field(
        False,
        description="Log one `Length penalty:` line per rollout (reference §3.4) instead of one summary line "
        "per step.",
    )
    length_curves_png: bool = Field(
        False,
        description="Write a PNG of completion length and reward curves to output_dir when training ends.",
    )
    luspo: bool = Field(
        False, description="Switch on LUSPO with the paper's settings (docs/reference/luspo.md §4)."
    )
    vllm_engine_kwargs: dict | str | None = Field(  # a JSON object string is parsed by the trainer's config
        None,
        description="Extra arguments of the colocated vLLM engine, a mapping or a JSON string (e.g. "
        '{"dtype": "float32", "enforce_eager": true} on CPU); score centering raises max_logprobs to K.',
    )


#: the models whose fields are the plugin's keys
KEY_MODELS: tuple[type[BaseModel], ...] = (LengthShapingConfig, ScoreCenteringConfig, HostKeys)
#: every key of the plugin, as a user writes it
PLUGIN_KEYS = tuple(key for model in KEY_MODELS for key in model.model_fields)
#: the prefixes of the plugin's key families: a key that starts with one and is no key is a typo (TRL and
#: verl have no key that starts with one)
KEY_FAMILIES = ("length_penalty", "score_centering")


def host_field(info: FieldInfo) -> tuple[Any, dict[str, Any]]:
    """The type and default of a key as a dataclass field of TRL's parser: a block of keys is a mapping or a
    list, also written as a JSON string or the path of a YAML file (unset: None); a pair is a list; a choice
    is a string."""
    kind = unwrapped(info.annotation)
    if kind is dict or (isinstance(kind, type) and issubclass(kind, BaseModel)):
        return dict | str | None, {"default": None}
    if get_origin(kind) is tuple:
        item, *rest = get_args(kind)
        if rest == [Ellipsis]:
            return list | str | None, {"default": None}
        default = info.default
        return list[item], {"default_factory": lambda: list(default)}
    if get_origin(kind) is Literal:
        kind = str
    return (kind | None if info.default is None else kind), {"default": info.default}


def plugin_fields() -> dict[str, tuple[Any, dataclasses.Field]]:
    """Every plugin key -> its dataclass type and field (its help in ``metadata``, as TRL's parser reads it)."""
    fields = {}
    for model in KEY_MODELS:
        for name, info in model.model_fields.items():
            kind, default = host_field(info)
            fields[name] = kind, dataclasses.field(**default, metadata={"help": info.description})
    return fields


def field_default(spec: dataclasses.Field) -> Any:
    """A dataclass field's default (its factory's value when it has one)."""
    return spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default


def with_plugin_keys(cls: type) -> type:
    """``cls`` with every plugin key as an annotated class attribute, for ``@dataclass`` to make its fields."""
    annotations = dict(cls.__dict__.get("__annotations__", {}))
    for name, (kind, spec) in plugin_fields().items():
        annotations[name] = kind
        setattr(cls, name, spec)
    cls.__annotations__ = annotations
    return cls
