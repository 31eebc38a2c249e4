"""``trl-length-grpo`` (also ``trl-length grpo``): GRPO from a YAML recipe plus flags, with the plugin's
config and trainer.

Like ``trl grpo`` (same parser, same keys), but unknown keys are errors instead of being handed to
``accelerate launch``, and every plugin key (``length_penalty``, ``length_penalty_coeff``, ``luspo``,
...) is understood. Several processes: ``accelerate launch -m trl_length_plugin.trl_integration.cli --config x.yaml``.

- ``--config FILE`` or ``--config recipe:NAME`` (a recipe shipped with the package, ``trl-length recipes``);
  flags override the recipe's keys, and a ``--length_penalty`` flag replaces the recipe's whole block.
- ``reward_funcs``: dotted paths (``pkg.module.func``) or names from ``trl.rewards``.
- ``dataset_name``: ``embedded`` (the embedded arithmetic task), a local file or saved dataset, or a Hub name.
- ``model_name_or_path``: ``embedded`` (warm-started tiny model), ``embedded-random``, a local path or a Hub name.
- ``--help``: the plugin's keys by feature (``cli_help``, printed before TRL is imported), then TRL's;
  ``--plugin-help``: only the plugin's, without importing TRL.

The plugin's own keys are validated with the core config before TRL and torch are imported (that takes
seconds), then everything by TRL's parser and the trainer's own setup checks (docs/reference/product.md §1.3). Each such error ends the command with one line ``trl-length-grpo: error: ...`` and exit status 2;
errors raised inside TRL, a model or training keep their traceback. The plugin's INFO lines (settings, the
per-step ``Length penalty:`` summary) are shown; unless ``log_level`` is written, transformers, datasets,
DeepSpeed and vLLM stay at WARNING (``log_level: info`` or ``debug`` asks for theirs too, docs/trl.md, "Logs").
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import sys
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from trl_length_plugin import __version__
from trl_length_plugin._logging import drop_accelerator_notices, quiet_host_logs
from trl_length_plugin.config_base import config_error, did_you_mean, read_yaml
from trl_length_plugin.plugin_keys import KEY_FAMILIES, PLUGIN_KEYS, HostKeys
from trl_length_plugin.recipes import resolve_config
from trl_length_plugin.score_centering import ScoreCenteringConfig, sampling_filter_error
from trl_length_plugin.shaping import SHAPING_KEYS, load_shaping_config
from trl_length_plugin.trl_integration.cli_help import grouped_keys, plugin_help
from trl_length_plugin.trl_integration.keys import TRL_KEYS, check_trl_keys

PROG = "trl-length-grpo"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
#: the docs/ folder inside the package (in a checkout a symlink to the top-level docs/)
DOCS = Path(__file__).resolve().parents[1] / "docs"
DESCRIPTION = (
    "GRPO with the length-control plugin (docs/trl.md). Keys come from a YAML recipe, --config FILE or "
    "--config recipe:NAME (`trl-length recipes` lists the shipped ones), and from --key value flags, which "
    "override the recipe's keys; a --length_penalty flag replaces the recipe's whole length_penalty block "
    "(nothing of it is merged). Every option below is also a recipe key. Without log_level the plugin logs "
    "at INFO and TRL, transformers, datasets, DeepSpeed and vLLM at WARNING; log_level info or debug shows "
    "theirs too."
)
#: the heading of TRL's part of --help
TRL_HELP_HEADING = (
    "TRL's keys (GRPOConfig, ModelConfig, the script arguments of `trl grpo`; the plugin's keys are above, "
    "`trl-length-grpo --plugin-help` prints only those, without importing TRL):"
)

logger = logging.getLogger("trl_length_plugin")


#: TRL's sampling filters and how its parser reads a flag's value
SAMPLING_FILTERS = {"top_p": float, "min_p": float, "top_k": int}


def fail(message: str) -> NoReturn:
    """End the command with one line ``trl-length-grpo: error: <message>`` and exit status 2 (as argparse)."""
    print(f"{PROG}: error: " + " ".join(line.strip() for line in message.splitlines()), file=sys.stderr)
    raise SystemExit(2)


@dataclass
class CommandLine:
    """What the command line says before TRL reads it: the recipe file and keys, and the flags."""

    config: Path | None
    recipe: dict[str, Any]
    flags: dict[str, list[str]]
    rest: list[str]

    @property
    def written(self) -> frozenset[str]:
        """The keys the user wrote, in the recipe or as flags (``luspo: true`` keeps their values)."""
        return frozenset(self.recipe).union(self.flags) - {"env"}

    def sources(self) -> list[tuple[set[str], str]]:
        """The keys of the recipe and of the flags, each with where it was written."""
        return [(set(self.recipe) - {"env"}, f"in {self.config}"), (set(self.flags), "on the command line")]

    def value(self, key: str) -> Any:
        """``key``'s value, the flag's over the recipe's (a flag's values as written, strings)."""
        if key not in self.flags:
            return self.recipe[key]
        values = self.flags[key]  # reasoning_tags is the one list key
        return values if key == "reasoning_tags" or len(values) != 1 else values[0]

    def trl_argv(self) -> list[str]:
        """The arguments for TRL's parser: the recipe as a path, then the flags."""
        config = ["--config", str(self.config)] if self.config else []
        return [*config, *self.rest]


def split_config(argv: list[str]) -> tuple[Path | None, list[str]]:
    """The recipe path of ``--config FILE``, ``--config=FILE`` or ``--config recipe:NAME``, and the rest."""
    config, rest = None, []
    tokens = iter(argv)
    for token in tokens:
        if token != "--config" and not token.startswith("--config="):
            rest.append(token)
            continue
        value = token.partition("=")[2] if "=" in token else next(tokens, "")
        if not value or value.startswith("--"):
            raise ValueError("--config needs a value: a YAML file or recipe:NAME")
        if config is not None:
            raise ValueError("--config given more than once")
        config = resolve_config(value)
    return config, rest


def flags_of(argv: list[str]) -> dict[str, list[str]]:
    """Each ``--key`` of ``argv`` (dashes read as underscores) with its values: ``--key=value`` or the tokens
    up to the next ``--``; a bare ``--key`` is ``true``, as for TRL's boolean flags."""
    flags = {}
    for i, token in enumerate(argv):
        if token.startswith("--"):
            name, equals, value = token[2:].partition("=")
            values = (
                [value] if equals else itertools.takewhile(lambda t: not t.startswith("--"), argv[i + 1 :])
            )
            flags[name.replace("-", "_")] = list(values) or ["true"]
    return flags


def read_recipe(path: Path) -> dict[str, Any]:
    recipe = read_yaml(path)
    if not isinstance(recipe, Mapping):
        found = "nothing" if recipe is None else f"a {type(recipe).__name__}"
        raise ValueError(f"{path}: a recipe must be a YAML mapping of keys, found {found}")
    return dict(recipe)


def unknown_keys(keys: Iterable[str], known: Iterable[str], where: str) -> str:
    """The message for ``keys`` that are no key, with the closest known ones."""
    known = list(known)
    parts = [f"{key!r}" + did_you_mean(key, known) for key in sorted(keys)]
    return f"unknown key{'s' if len(parts) > 1 else ''} {', '.join(parts)} {where}"


def read_command_line(argv: list[str]) -> CommandLine:
    """Read the recipe and flags and validate the plugin's keys with the core config (no TRL, no torch)."""
    config, rest = split_config(argv)
    command = CommandLine(config, read_recipe(config) if config else {}, flags_of(rest), rest)
    for keys, where in command.sources():
        misspelt = {key for key in keys if key.startswith(KEY_FAMILIES) and key not in PLUGIN_KEYS}
        if misspelt:
            raise ValueError(unknown_keys(misspelt, PLUGIN_KEYS, where))
    check_trl_keys({key: command.value(key) for key in TRL_KEYS if key in command.written}, command.flags)
    values = {key: command.value(key) for key in PLUGIN_KEYS if key in command.written}
    shaping = load_shaping_config({key: value for key, value in values.items() if key in SHAPING_KEYS})
    if "dataset_name" in command.written:
        from trl_length_plugin.offline.tables import missing_dataset

        reads_profiles = shaping.penalties is not None and shaping.penalties.uses_metadata
        problem = missing_dataset(str(command.value("dataset_name")), reads_profiles)
        if problem:
            raise ValueError(problem)
    try:
        for model in (ScoreCenteringConfig, HostKeys):
            model.model_validate({key: value for key, value in values.items() if key in model.model_fields})
    except ValidationError as err:
        raise ValueError(config_error(err)) from None
    check_sampling_filters(command)
    check_streaming(command)
    return command


def check_streaming(command: CommandLine) -> None:
    """``dataset_streaming: true`` needs ``max_steps`` > 0: a stream has no length to count epochs by
    (docs/trl.md, "Streaming datasets"); the values are read as TRL's parser reads them."""
    if "dataset_streaming" not in command.written:
        return
    streaming = command.value("dataset_streaming")
    if str(streaming).lower() not in ("true", "yes", "t", "y", "1"):
        return
    steps = command.value("max_steps") if "max_steps" in command.written else -1
    try:
        steps = int(steps)
    except (TypeError, ValueError):
        return  # TRL's parser names it
    if steps <= 0:
        raise ValueError(
            f"dataset_streaming: true needs max_steps > 0 (a stream has no length to count epochs by), got "
            f"max_steps={steps}"
        )


def check_sampling_filters(command: CommandLine) -> None:
    """TRL's sampling filters as written, in vLLM's ranges (docs/reference/score-centering.md §5.5): the value
    alone decides. A flag is read as TRL's parser reads it (a fractional ``--top_k`` as the number it is, so it
    is refused here); one that is no number is left to that parser."""
    for name, kind in SAMPLING_FILTERS.items():
        if name not in command.written:
            continue
        value = command.value(name)
        if name in command.flags:
            try:
                value = kind(value)
            except (TypeError, ValueError):
                try:
                    value = float(value)
                except (TypeError, ValueError):
                    continue
        error = sampling_filter_error(name, value)
        if error is not None:
            raise ValueError(f"{name}: {error}")


def show_plugin_logs(command: CommandLine) -> None:
    """Set the plugin logger to the run's ``log_level`` (default info) while TRL parses, on the main process
    (the trainer sets it again from ``log_level`` / ``log_level_replica``); unless ``log_level`` is written,
    keep the host libraries at WARNING. The accelerator notices of every CPU run are dropped."""
    written = "log_level" in command.written
    level = str(command.value("log_level") if written else "info")
    if level in LOG_LEVELS and os.environ.get("RANK", "0") == "0":
        logger.setLevel(level.upper())
    if not written:
        quiet_host_logs()
    drop_accelerator_notices()


def warn_if_block_replaced(command: CommandLine) -> None:
    """A ``--length_penalty`` flag replaces the recipe's whole block: say so, naming what is dropped."""
    block = command.recipe.get("length_penalty")
    if "length_penalty" in command.flags and block:
        replaced = ", ".join(block) if isinstance(block, Mapping) else repr(block)
        logger.warning(
            "--length_penalty replaces the whole length_penalty block of %s (%s); nothing of it is merged",
            command.config,
            replaced,
        )


def check_keys(command: CommandLine, known: list[str], numbers: dict[str, type]) -> None:
    """Fail on a recipe key or flag that is no key of TRL's parser (naming the closest known one), and on a
    recipe value that is no number for a numeric key (TRL's parser converts flags, not recipe values)."""
    in_recipe = set(command.recipe) - set(known) - {"env"}
    # argparse also takes an unambiguous prefix of a flag
    in_flags = {flag for flag in command.flags if not any(dest.startswith(flag) for dest in known)}
    for unknown, where in ((in_recipe, f"in {command.config}"), (in_flags, "on the command line")):
        if unknown:
            fail(unknown_keys(unknown, known, where))
    for key, number in numbers.items():
        value = command.recipe.get(key)
        try:
            if value is not None:
                number(str(value))
        except ValueError:
            fail(
                f"{key}: {value!r} is not {'an integer' if number is int else 'a number'} (in {command.config})"
            )


def parse_args(argv: list[str] | None = None):
    """Parse and validate the recipe and flags: the plugin's keys before TRL is imported, then everything with
    TRL's parser. Any error ends the command with one line and exit status 2."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        command = read_command_line(argv)
    except ValueError as err:
        fail(str(err))
    show_plugin_logs(command)
    warn_if_block_replaced(command)
    script = import_script()
    from trl_length_plugin.trl_integration.config import explicit_keys

    parser = script.make_parser(PROG, DESCRIPTION)
    check_keys(command, [action.dest for action in parser._actions], script.numeric_keys(parser))
    try:
        with explicit_keys(command.written):
            return script.parse(parser, command.trl_argv())
    except (ValueError, TypeError) as err:
        fail(str(err))


def import_script():
    """``trl_integration.script`` (imports TRL and torch); a missing TRL is one line naming the extra, and a TRL
    outside the supported range (or whose internals changed) one line naming the range."""
    from trl_length_plugin._optional import require

    try:
        require("trl", "trl")
    except ImportError as err:
        fail(str(err))
    from trl_length_plugin.trl_integration._host import TRLHostError, check_trl_host

    try:
        check_trl_host()
    except TRLHostError as err:
        fail(str(err))
    from trl_length_plugin.trl_integration import script

    return script


def raised_by_plugin(err: BaseException) -> bool:
    """Whether ``err`` is one of the plugin's own checks, not raised inside TRL, a model or a dataset."""
    *_, (frame, _) = traceback.walk_tb(err.__traceback__)
    return frame.f_globals.get("__name__", "").startswith("trl_length_plugin.")


def run(*parsed):
    """Build the trainer from ``parse_args``' result, train and save; the trainer's own setup checks end the
    command with one line, errors from TRL, the model or training surface as they are."""
    script = import_script()
    try:
        trainer = script.build_trainer(*parsed)
    except (ValueError, TypeError) as err:
        if not raised_by_plugin(err):
            raise
        fail(str(err))
    training_args = parsed[1]
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"{PROG}: model saved to {training_args.output_dir}")
    return trainer


def print_help() -> None:
    """The plugin's keys by feature (printed before TRL is imported), then TRL's own keys."""
    print(plugin_help(DESCRIPTION, DOCS), flush=True)
    drop_accelerator_notices()
    parser = import_script().make_parser(PROG, TRL_HELP_HEADING)
    ours = set(grouped_keys())
    for action in parser._actions:
        if action.dest in ours:
            action.help = argparse.SUPPRESS  # listed above; argparse then leaves them out of the usage too
    parser.print_help()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--version" in argv:
        print(f"{PROG} {__version__}")
    elif "--plugin-help" in argv:
        print(plugin_help(DESCRIPTION, DOCS), end="")
    elif "-h" in argv or "--help" in argv:
        print_help()
    else:
        run(*parse_args(argv))


if __name__ == "__main__":
    main()
