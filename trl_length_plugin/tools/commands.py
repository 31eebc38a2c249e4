"""``trl-length``: the plugin's command line, one subcommand per tool (like TRL's ``trl grpo|sft|...``).

- ``trl-length grpo``: GRPO from a recipe with the plugin's trainer (``trl-length-grpo`` is the same).
- ``trl-length recipes``: the recipes shipped with the package (``--config recipe:NAME``) and their paths.
- ``trl-length profile``: per-prompt profiles and bands from a reference model's rollouts.
- ``trl-length preview``: what a length-shaping config does to saved rollouts.
- ``trl-length verl-check``: a verl run's overrides (or recipe script) checked without Ray or GPUs.
- ``trl-length verl-smoke``: a verl run's overrides (or recipe script) trained a few steps on this CPU.
- ``trl-length recipe-smoke``: the shipped TRL recipes trained a step each on a real pretrained model on CPU.

A subcommand's module is imported only when it runs, so a mistake in a recipe is reported before TRL or
torch are imported.
"""

from __future__ import annotations

import importlib
import sys

#: subcommand -> (module with ``main(argv)``, one-line help)
SUBCOMMANDS = {
    "grpo": (
        "trl_length_plugin.trl_integration.cli",
        "GRPO from a YAML recipe plus flags, with the plugin's trainer",
    ),
    "recipes": ("trl_length_plugin.recipes", "list the recipes shipped with the package and their paths"),
    "profile": ("trl_length_plugin.offline.profile_cli", "per-prompt profiles and bands from rollouts"),
    "preview": (
        "trl_length_plugin.offline.preview_cli",
        "what a length-shaping config does to saved rollouts",
    ),
    "verl-check": ("verl_adapter.tools.check", "a verl recipe or overrides checked without Ray or GPUs"),
    "verl-smoke": ("verl_adapter.tools.smoke", "a verl recipe or overrides trained a few steps on this CPU"),
    "recipe-smoke": (
        "trl_length_plugin.tools.recipe_smoke",
        "the TRL recipes trained a step each on a real model on CPU",
    ),
}


def usage() -> str:
    lines = ["usage: trl-length {" + ",".join(SUBCOMMANDS) + "} ...", "", "subcommands:"]
    lines += [f"  {name:<12} {text}" for name, (_, text) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return
    if argv[0] == "--version":
        from trl_length_plugin import __version__

        print(f"trl-length {__version__}")
        return
    if argv[0] not in SUBCOMMANDS:
        choices = ", ".join(SUBCOMMANDS)
        print(f"trl-length: error: unknown subcommand {argv[0]!r} (choose from {choices})", file=sys.stderr)
        raise SystemExit(2)
    module, _ = SUBCOMMANDS[argv[0]]
    from trl_length_plugin.shaping.terms import TermLoadError

    try:
        importlib.import_module(module).main(argv[1:])
    except TermLoadError as err:  # an installed package's term, refused at registration
        print(f"trl-length {argv[0]}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
