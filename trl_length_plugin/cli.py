"""``trl-length-grpo``: GRPO from a YAML recipe plus flags, with the plugin's config and trainer.

Like ``trl grpo`` (same parser, same keys), but unknown keys are errors instead of being handed to
``accelerate launch``, and every plugin key (``length_penalty``, ``length_penalty_coeff``, ``luspo``,
...) is understood. Several processes: ``accelerate launch -m trl_length_plugin.cli --config x.yaml``.

- ``reward_funcs``: dotted paths (``pkg.module.func``) or names from ``trl.rewards``.
- ``dataset_name``: ``embedded`` (the embedded arithmetic task), a local file or saved dataset, or a Hub name.
- ``model_name_or_path``: ``embedded`` (warm-started tiny model), ``embedded-random``, a local path or a Hub name.

Everything is parsed and validated before any model or dataset is loaded, so a bad recipe exits
non-zero at once with a message naming the key (docs/reference/length-penalties.md §2.1).
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field

from trl_length_plugin._optional import require

require("trl", "trl")

from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, TrlParser  # noqa: E402

from trl_length_plugin.trl_integration.config import LengthPluginGRPOConfig  # noqa: E402

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


def make_parser() -> TrlParser:
    return TrlParser((LengthGRPOScriptArguments, LengthPluginGRPOConfig, ModelConfig, DatasetMixtureConfig))


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


def parse_args(argv: list[str] | None = None):
    """Parse and validate the recipe and flags; exit non-zero with the offending key on any error."""
    parser = make_parser()
    try:
        script_args, training_args, model_args, dataset_args = parser.parse_args_and_config(argv)
        reward_funcs = load_reward_funcs(script_args)
        dataset_map = import_dotted(script_args.dataset_map) if script_args.dataset_map else None
    except ValueError as err:
        raise SystemExit(f"trl-length-grpo: error: {err}") from None
    if not model_args.model_name_or_path:
        raise SystemExit("trl-length-grpo: error: model_name_or_path is required")
    if not (script_args.dataset_name or dataset_args.datasets):
        raise SystemExit("trl-length-grpo: error: dataset_name (or datasets) is required")
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
        splits = datasets.load_dataset(builder, data_files=name)
    else:
        splits = datasets.load_dataset(
            name, name=script_args.dataset_config, streaming=script_args.dataset_streaming
        )
    train = splits[script_args.dataset_train_split]
    evaluation = splits[script_args.dataset_test_split] if want_eval else None
    if dataset_map is not None:
        train = train.map(dataset_map)
        evaluation = evaluation.map(dataset_map) if evaluation is not None else None
    return train, evaluation


def run(script_args, training_args, model_args, dataset_args, reward_funcs, dataset_map):
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
    trainer = LengthPluginGRPOTrainer(
        model=model_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train,
        eval_dataset=evaluation,
        processing_class=tokenizer,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"trl-length-grpo: model saved to {training_args.output_dir}")
    return trainer


def main(argv: list[str] | None = None) -> None:
    run(*parse_args(argv))


if __name__ == "__main__":
    main()
