"""``trl-length verl-check [RECIPE.sh] [OVERRIDES...]``: a verl run's config checked on a laptop, in seconds,
without Ray or GPUs (docs/verl.md, "Check a verl config on a laptop").

The config is the one ``python3 -m verl.trainer.main_ppo`` composes: verl's ``ppo_trainer`` Hydra config with
the run's overrides, given on the command line or read from a recipe script. A script is run with bash up to
its ``python3 -m verl.trainer.main_ppo`` command, which a shell function replaces: the function records the
arguments after shell expansion (variables, line continuations, ``"$@"``) and ends the script, so nothing
trains; a script whose text has no plain ``python3 -m verl.trainer.main_ppo`` (or ``python``) is not run.
Then the checks the driver and the TaskRunner run before any worker starts: verl's own ``validate_config``
(main_ppo's, before Ray), the length keys (docs/reference/length-penalties.md §2.1, docs/reference/length-coefficient.md §3), LUSPO's KL
aggregation (docs/reference/luspo.md §4.1) and score centering with sampling and rollout correction
(docs/reference/score-centering.md §5.5, §5.7, §5.8). A top-level key that is close to a plugin key but none
of them (``+length_penalty_coef``) is named with the closest key. One line per error, exit code 2;
otherwise one ``OK`` line, exit code 0.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import io
import logging
import os
import re
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

from trl_length_plugin.plugin_keys import KEY_FAMILIES
from trl_length_plugin.tools.sessions import run_session
from verl_adapter.keys import PLUGIN_KEYS
from verl_adapter.setup_checks import TASK_RUNNER_CHECKS

PROG = "trl-length verl-check"
#: the config ``verl.trainer.main_ppo`` composes (its ``@hydra.main``)
CONFIG_MODULE, CONFIG_NAME = "verl.trainer.config", "ppo_trainer"
ENTRY = "verl.trainer.main_ppo"
#: the interpreter names whose ``-m verl.trainer.main_ppo`` a recipe check intercepts
_PYTHON = "python3?"
#: a recipe script's limit up to its training command; past it, the script's whole session is ended
SCRIPT_TIMEOUT_S = 60


def _capture(python: str) -> str:
    """A bash function for ``python``: ``python -m verl.trainer.main_ppo ARGS`` writes ARGS NUL-separated to
    ``$TRL_LENGTH_VERL_ARGS`` and ends the script; ``python -m verl_adapter.tools.check`` (a recipe that checks
    itself first: that check is this one) returns at once; any other call runs the real command."""
    return (
        f'() {{ if [ "${{1-}}" = -m ] && [ "${{2-}}" = {ENTRY} ]; then shift 2; '
        f'printf "%s\\0" "$@" > "$TRL_LENGTH_VERL_ARGS"; exit 0; fi; '
        f'if [ "${{1-}}" = -m ] && [ "${{2-}}" = verl_adapter.tools.check ]; then return 0; fi; command {python} "$@"; }}'
    )


_SHIMS = {
    "BASH_FUNC_python3%%": _capture("python3"),
    "BASH_FUNC_python%%": _capture("python"),
    "BASH_FUNC_trl-length%%": '() { [ "${1-}" = verl-check ] && return 0; command trl-length "$@"; }',
}
USAGE = f"usage: {PROG} [RECIPE.sh] [OVERRIDES...]\n\n" + __doc__.split("\n\n")[0].replace("``", "")


class CheckError(Exception):
    """A problem that stops the check before the config exists (one line)."""


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


#: the file endings that make an argument a recipe script, not a Hydra override
SCRIPT_SUFFIXES = (".sh", ".bash")


def split_scripts(args: list[str]) -> tuple[list[Path], list[str]]:
    """The leading recipe scripts of ``args`` (a name ending in ``SCRIPT_SUFFIXES``, no ``=``) and the rest."""
    rest = list(args)
    scripts = []
    while rest and rest[0].endswith(SCRIPT_SUFFIXES) and "=" not in rest[0]:
        scripts.append(Path(rest.pop(0)))
    return scripts, rest


def recipe_overrides(script: Path, extra: list[str]) -> list[str]:
    """The overrides ``script`` (run with ``extra`` as its arguments) passes to ``python3 -m verl.trainer.main_ppo``."""
    if not script.is_file():
        raise CheckError(f"{script}: no such recipe script")
    try:
        text = script.read_text(encoding="utf-8")
    except OSError as err:
        raise CheckError(f"{script}: cannot read it: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise CheckError(f"{script}: not UTF-8 text; a recipe is a bash script") from None
    if "\0" in text:
        raise CheckError(f"{script}: a binary file (it holds NUL bytes); a recipe is a bash script")
    if re.search(rf"\bexec\s+(\S*/)?{_PYTHON}\s+-m\s+{re.escape(ENTRY)}\b", text):
        raise CheckError(
            f"{script}: 'exec python3 -m {ENTRY}' cannot be intercepted; drop 'exec' or pass the overrides"
        )
    if not re.search(rf"(^|[\s;&|(]){_PYTHON}\s+-m\s+{re.escape(ENTRY)}\b", text, re.M):
        raise CheckError(
            f"{script}: no 'python3 -m {ENTRY}' command to intercept; pass the overrides instead"
        )
    with tempfile.TemporaryDirectory() as folder:
        captured = Path(folder) / "args"
        env = {**os.environ, **_SHIMS, "TRL_LENGTH_VERL_ARGS": str(captured)}
        try:
            done = run_session(["bash", str(script), *extra], SCRIPT_TIMEOUT_S, env=env)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise CheckError(f"{script}: could not run it with bash: {one_line(err)}") from None
        if not captured.exists():
            said = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
            raise CheckError(f"{script}: ended without running python3 -m {ENTRY} ({said[0]})")
        try:
            return captured.read_bytes().decode("utf-8").split("\0")[:-1]
        except UnicodeDecodeError:
            raise CheckError(f"{script}: passes overrides that are not UTF-8 text") from None


def _quiet_import() -> None:
    """Import verl (its config module, ``validate_config``) and the checks, without verl's import-time warnings
    about engines a laptop lacks and without the ``verl.plugins`` entry points: the checks import the plugin's
    config modules themselves (``setup_checks``), and none of its registrations is needed."""
    os.environ["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            import verl.utils.config  # noqa: F401

            import verl_adapter.score_centering.config  # noqa: F401
        finally:
            logging.disable(logging.NOTSET)


def _close_key(override: str, base) -> str:
    """`` (did you mean 'x'?)`` for a Hydra override whose key is not in verl's config."""
    from omegaconf import OmegaConf

    key = override.lstrip("+~").split("=", 1)[0]
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(base, parent) if parent else base
    close = difflib.get_close_matches(leaf, [str(k) for k in node], n=1) if hasattr(node, "keys") else []
    if not close:
        return ""
    suggestion = f"{parent}.{close[0]}" if parent else close[0]
    return f" (did you mean {suggestion!r}?)"


def compose_config(overrides: list[str]):
    """verl's ``ppo_trainer`` config with ``overrides``, as main_ppo's ``@hydra.main`` composes it."""
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException

    with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
        try:
            return compose(config_name=CONFIG_NAME, overrides=overrides)
        except HydraException as err:
            message = one_line(err)
            match = re.search(r"Could not override '([^']+)'", message)
            hint = _close_key(match.group(1), compose(config_name=CONFIG_NAME)) if match else ""
            raise CheckError(message + hint) from None


def added_keys(overrides: list[str]) -> set[str]:
    """The top-level keys the overrides add to verl's config (``+key`` / ``++key``)."""
    return {o.lstrip("+").split("=", 1)[0].split(".", 1)[0] for o in overrides if o.startswith("+")}


def misspelt_keys(added: set[str]) -> dict[str, str]:
    """Added top-level keys that are no plugin key but close to one, or in the ``length_penalty*`` /
    ``score_centering*`` families (whose checks refuse unknown members) -> their error."""
    errors = {}
    for key in sorted(added):
        if key in PLUGIN_KEYS:
            continue
        close = difflib.get_close_matches(key, PLUGIN_KEYS, n=1, cutoff=0.8)
        if close or key.startswith(KEY_FAMILIES):
            hint = f"did you mean {close[0]!r}?" if close else f"expected one of {', '.join(PLUGIN_KEYS)}"
            errors[key] = f"{key}: unknown trl-length-plugin key; {hint}"
    return errors


def _verl_driver(config) -> None:
    """What main_ppo's ``main`` checks before it starts Ray."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        validate_config(
            config=config,
            use_reference_policy=need_reference_policy(config),
            use_critic=need_critic(config),
        )


#: main_ppo's driver check, then the plugin's TaskRunner checks (the mixins' own), each run on its own so that
#: every failing one reports; the plugin's wait until misspelt keys are fixed (their errors would follow from
#: the typo)
VERL_CHECKS: tuple[Callable, ...] = (_verl_driver,)
PLUGIN_CHECKS: tuple[Callable, ...] = TASK_RUNNER_CHECKS


def config_errors(config, added: set[str]) -> list[str]:
    """One line per error in a composed verl config; ``added``: the top-level keys its overrides add."""
    from omegaconf import OmegaConf, open_dict

    misspelt = misspelt_keys(added)
    config = copy.deepcopy(config)
    with open_dict(config):
        for key in misspelt:
            del config[key]
    errors = list(misspelt.values())
    try:
        OmegaConf.resolve(config)  # as the TaskRunner does before it builds the trainer
    except Exception as err:  # noqa: BLE001 - an interpolation error is a config error
        return [*errors, one_line(err)]
    for run_check in VERL_CHECKS if misspelt else VERL_CHECKS + PLUGIN_CHECKS:
        try:
            run_check(config)
        except Exception as err:  # noqa: BLE001 - every check's error is reported, one line each
            errors.append(one_line(err))
    return errors


def overrides_errors(overrides: list[str]) -> list[str]:
    try:
        return config_errors(compose_config(overrides), added_keys(overrides))
    except CheckError as err:
        return [str(err)]


def check(args: list[str]) -> tuple[list[str], list[str]]:
    """(what was checked, one line per error) for ``[RECIPE.sh...] [OVERRIDES...]``."""
    scripts, args = split_scripts(args)
    _quiet_import()
    if not scripts:
        return [f"{len(args)} override{'s' * (len(args) != 1)}"], overrides_errors(args)
    errors = []
    for script in scripts:
        try:
            errors += [f"{script}: {error}" for error in overrides_errors(recipe_overrides(script, args))]
        except CheckError as err:  # names the script itself
            errors.append(str(err))
    return [str(script) for script in scripts], errors


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return
    checked, errors = check(args)
    for error in errors:
        print(f"{PROG}: error: {error}", file=sys.stderr)
    if errors:
        raise SystemExit(2)
    print(f"{PROG}: OK: {', '.join(checked)} (verl's config check and every plugin check)")


if __name__ == "__main__":
    main()
