"""The TRL side of ``trl-length-grpo`` (``trl_length_plugin.trl_integration.cli``): the script arguments, TRL's parser with
the plugin's config, and the trainer built from what they hold, like ``trl grpo``'s script.

Every user error here is a ``ValueError``; the command line turns it into one line.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import types
import typing
from dataclasses import dataclass, field

from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, TrlParser

from trl_length_plugin.trl_integration.config import LengthPluginGRPOConfig

EMBEDDED = "embedded"


@dataclass
class LengthGRPOScriptArguments(ScriptArguments):
    """``trl grpo``'s script arguments plus the embedded task's sizes and a dataset mapping."""

    reward_funcs: list[str] | None = field(
        default=None,
        metadata={"help": "Reward functions: dotted import paths or names from `trl.rewards`."},
    )
    reward_model_name_or_path: str | None = field(
        default=None, metadata={"help": "A sequence-classification reward model (path or Hub name)."}
    )
    dataset_map: str | None = field(
        default=None,
        metadata={"help": "Dotted path of a function mapping each example to new columns (e.g. a `prompt`)."},
    )
    dataset_size: int = field(default=256, metadata={"help": "Rows of the embedded training task."})
    eval_dataset_size: int = field(default=32, metadata={"help": "Rows of the embedded evaluation task."})


class Parser(TrlParser):
    """TRL's parser whose argparse errors are ``ValueError`` (the command line prints them as one line)."""

    def error(self, message: str):
        raise ValueError(message)


def make_parser(prog: str, description: str) -> Parser:
    arguments = (LengthGRPOScriptArguments, LengthPluginGRPOConfig, ModelConfig, DatasetMixtureConfig)
    return Parser(arguments, prog=prog, description=description)


def declared_types(hint) -> list:
    """The types a field's annotation allows: each member of a union (``NoneType`` among them), generics by their
    origin (``list[str]`` -> ``list``)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    return [typing.get_origin(kind) or kind for kind in (typing.get_args(hint) if union else (hint,))]


def numeric_keys(parser: Parser) -> dict[str, type]:
    """Key -> ``int`` or ``float`` for every key whose type is that number (or None)."""
    numbers = {}
    for arguments in parser.dataclass_types:
        hints = typing.get_type_hints(arguments)
        for spec in dataclasses.fields(arguments):
            kinds = set(declared_types(hints[spec.name])) - {type(None)}
            if kinds in ({int}, {float}):
                numbers[spec.name] = kinds.pop()
    return numbers


def import_dotted(path: str):
    """``pkg.module.attr`` -> the attribute; the working directory is importable, as in ``trl grpo``."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(f"{path!r} is not a dotted path (module.attribute)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot import {path!r}: {err}") from err


def load_reward_funcs(script_args: LengthGRPOScriptArguments) -> list:
    funcs: list = [script_args.reward_model_name_or_path] if script_args.reward_model_name_or_path else []
    for name in script_args.reward_funcs or []:
        if "." in name:
            funcs.append(import_dotted(name))
        else:
            import trl.rewards

            if not hasattr(trl.rewards, name):
                raise ValueError(
                    f"reward_funcs: unknown reward {name!r}; use a dotted path or a trl.rewards name"
                )
            funcs.append(getattr(trl.rewards, name))
    if not funcs:
        raise ValueError("reward_funcs: give at least one reward function (or reward_model_name_or_path)")
    return funcs


def parse(parser: Parser, argv: list[str]):
    """The parsed arguments, the reward functions and the dataset mapping; a ``ValueError`` names the key."""
    script_args, training_args, model_args, dataset_args = parser.parse_args_and_config(argv)
    reward_funcs = load_reward_funcs(script_args)
    dataset_map = import_dotted(script_args.dataset_map) if script_args.dataset_map else None
    if not model_args.model_name_or_path:
        raise ValueError("model_name_or_path is required")
    if not (script_args.dataset_name or dataset_args.datasets):
        raise ValueError("dataset_name (or datasets) is required")
    return script_args, training_args, model_args, dataset_args, reward_funcs, dataset_map


def resolve_model(name: str):
    """The model path and, for the embedded model, its tokenizer (never AutoTokenizer for it)."""
    if name in (EMBEDDED, f"{EMBEDDED}-random"):
        from trl_length_plugin.embedded import embedded_model_dir, load_tokenizer

        path = embedded_model_dir(warm_start=name == EMBEDDED)
        return str(path), load_tokenizer(path)
    return name, None


def load_datasets(script_args, training_args, dataset_args, dataset_map):
    """(train, eval or None): the embedded task, a local file or saved dataset, a Hub dataset or a mixture."""
    import datasets

    name = script_args.dataset_name
    want_eval = training_args.eval_strategy != "no"
    if dataset_args.datasets:
        from trl import get_dataset

        splits = get_dataset(dataset_args)
    elif name == EMBEDDED:
        from trl_length_plugin.embedded import make_task_dataset

        seed = training_args.seed
        splits = {
            script_args.dataset_train_split: make_task_dataset(script_args.dataset_size, seed=seed),
            script_args.dataset_test_split: make_task_dataset(script_args.eval_dataset_size, seed=seed + 1),
        }
    elif os.path.isdir(name) and os.path.exists(os.path.join(name, "dataset_dict.json")):
        splits = datasets.load_from_disk(name)
    elif os.path.isdir(name) and os.path.exists(os.path.join(name, "dataset_info.json")):
        splits = {script_args.dataset_train_split: datasets.load_from_disk(name)}
    elif os.path.isfile(name):
        builder = {"jsonl": "json"}.get(name.rsplit(".", 1)[-1], name.rsplit(".", 1)[-1])
        splits = datasets.load_dataset(builder, data_files=name, streaming=script_args.dataset_streaming)
    else:
        splits = datasets.load_dataset(
            name, name=script_args.dataset_config, streaming=script_args.dataset_streaming
        )
    train = splits[script_args.dataset_train_split]
    if script_args.dataset_streaming and not isinstance(train, datasets.IterableDataset):
        train = train.to_iterable_dataset()  # the embedded task or a saved dataset, streamed as asked
    evaluation = splits[script_args.dataset_test_split] if want_eval else None
    if dataset_map is not None:
        train = train.map(dataset_map)
        evaluation = evaluation.map(dataset_map) if evaluation is not None else None
    return train, evaluation


def build_trainer(script_args, training_args, model_args, dataset_args, reward_funcs, dataset_map):
    """The ``LengthPluginGRPOTrainer`` of the parsed arguments (the model loads here)."""
    from trl import get_peft_config, get_quantization_config

    from trl_length_plugin.trl_integration import LengthPluginGRPOTrainer

    model_path, tokenizer = resolve_model(model_args.model_name_or_path)
    model_init_kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
    }
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs
    train, evaluation = load_datasets(script_args, training_args, dataset_args, dataset_map)
    return LengthPluginGRPOTrainer(
        model=model_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train,
        eval_dataset=evaluation,
        processing_class=tokenizer,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )
