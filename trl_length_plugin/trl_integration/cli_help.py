"""``trl-length-grpo --help``: the plugin's keys first, grouped by feature, then TRL's (docs/trl.md, "The command line").

The plugin's part needs no TRL: each key's type, default and help come from the pydantic models that
declare the keys (``plugin_keys``, as ``LengthPluginGRPOConfig`` gets them) and from the source of the
script arguments' dataclass, read without importing it.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from trl_length_plugin.plugin_keys import field_default, plugin_fields
from trl_length_plugin.score_centering import SCORE_CENTERING_KEYS

#: (file, class) of the script arguments' dataclass, whose fields are keys of the command
SCRIPT_ARGUMENTS = (Path(__file__).with_name("script.py"), "LengthGRPOScriptArguments")
#: (feature, its keys), in the order of --help
GROUPS = (
    (
        "Group length penalties (docs/reference/length-penalties.md §2)",
        ("length_penalty", "correctness_reward", "agent_column", "reasoning_tags"),
    ),
    (
        "Length coefficient and zero-std filter (docs/reference/length-coefficient.md §3)",
        (
            "length_penalty_coeff",
            "length_penalty_min_tokens",
            "length_penalty_coeff_warmup_steps",
            "length_schedule",
            "drop_zero_std_groups",
            "length_penalty_log_rollouts",
            "length_penalty_log_file",
        ),
    ),
    ("LUSPO (docs/reference/luspo.md §4)", ("luspo",)),
    (
        "Score centering (docs/reference/score-centering.md §5)",
        (*SCORE_CENTERING_KEYS, "vllm_engine_kwargs"),
    ),
    (
        "Rewards, data and output",
        (
            "reward_funcs",
            "reward_model_name_or_path",
            "dataset_map",
            "dataset_size",
            "eval_dataset_size",
            "length_curves_png",
        ),
    ),
)
USAGE = "usage: trl-length-grpo [-h] [--version] [--config FILE | --config recipe:NAME] [--KEY VALUE ...]"


@dataclass(frozen=True)
class KeyHelp:
    name: str
    type: str
    default: str
    help: str


def _literal(node: ast.expr | None) -> str:
    """A field's default as written: a literal's value, else its source (``list(DEFAULT_REASONING_TAGS)``)."""
    if node is None:
        return ""
    if isinstance(node, ast.Lambda):
        node = node.body
    try:
        return repr(ast.literal_eval(node))
    except ValueError:
        return ast.unparse(node)


def _type_name(kind) -> str:
    return kind.__name__ if isinstance(kind, type) and not get_args(kind) else str(kind)


def plugin_keys() -> dict[str, KeyHelp]:
    """Every plugin key with its type, default and help, as ``LengthPluginGRPOConfig`` declares it."""
    keys = {}
    for name, (kind, spec) in plugin_fields().items():
        keys[name] = KeyHelp(name, _type_name(kind), repr(field_default(spec)), spec.metadata["help"])
    return keys


def script_keys() -> dict[str, KeyHelp]:
    """Every field of the script arguments' dataclass with its type, default and help text."""
    path, name = SCRIPT_ARGUMENTS
    tree = ast.parse(path.read_text(encoding="utf-8"))
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
    keys = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Call)):
            continue
        kwargs = {kw.arg: kw.value for kw in node.value.keywords}
        metadata = ast.literal_eval(kwargs["metadata"]) if "metadata" in kwargs else {}
        keys[node.target.id] = KeyHelp(
            node.target.id,
            ast.unparse(node.annotation),
            _literal(kwargs.get("default", kwargs.get("default_factory"))),
            metadata.get("help", ""),
        )
    return keys


def declared_keys() -> dict[str, KeyHelp]:
    """Every key the command adds to TRL's: the plugin's and the script arguments'."""
    return {**plugin_keys(), **script_keys()}


def plugin_help(description: str, docs: Path, width: int = 100) -> str:
    """The plugin's part of ``--help``: usage, what the command does, the docs path, the keys by feature."""
    keys = declared_keys()
    indent = " " * 8
    parts = [USAGE, "", textwrap.fill(description, width), "", f"docs: {docs}", ""]
    parts.append("The plugin's keys (each is a recipe key and a --KEY flag):")
    for title, names in GROUPS:
        parts += ["", f"{title}:"]
        for name in names:
            key = keys[name]
            parts.append(f"  --{name}  ({key.type}, default {key.default or None})")
            parts.append(textwrap.fill(key.help, width, initial_indent=indent, subsequent_indent=indent))
    return "\n".join(parts) + "\n"


def grouped_keys() -> list[str]:
    return [name for _, names in GROUPS for name in names]
