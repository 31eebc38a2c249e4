"""The recipes shipped with the package: ``trl/NAME.yaml`` for ``trl-length-grpo`` and ``verl/`` scripts.

In the repository they live in the top-level ``recipes/`` (``trl/`` and ``verl/`` here are links to it,
docs/reference/product.md §1.1); the wheel carries a copy here. ``trl-length-grpo --config recipe:NAME`` runs
``trl/NAME.yaml``; ``trl-length recipes`` lists every recipe with its path.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: the folder holding ``trl/`` and ``verl/``: the top-level ``recipes/`` of a checkout, this package's in a wheel
RECIPES_DIR = (Path(__file__).resolve().parent / "trl").resolve().parent
PREFIX = "recipe:"


def trl_recipes() -> dict[str, Path]:
    """Name -> path of every TRL recipe."""
    return {path.stem: path for path in sorted((RECIPES_DIR / "trl").glob("*.yaml"))}


def resolve_config(value: str) -> Path:
    """The recipe file of a ``--config`` value: ``recipe:NAME`` names a shipped recipe, anything else is a path."""
    if not value.startswith(PREFIX):
        return Path(value)
    name = value.removeprefix(PREFIX)
    recipes = trl_recipes()
    if name not in recipes:
        raise ValueError(f"--config {value}: no recipe named {name!r}; the recipes are {', '.join(recipes)}")
    return recipes[name]


def main(argv: list[str] | None = None) -> None:
    """``trl-length recipes``: print every recipe and its path."""
    if argv and argv[0] in ("-h", "--help"):
        print("usage: trl-length recipes\n\nList the recipes shipped with the package and their paths.")
        return
    if argv:
        print(f"trl-length recipes: error: unexpected arguments: {' '.join(argv)}", file=sys.stderr)
        raise SystemExit(2)
    recipes = trl_recipes()
    width = max(map(len, recipes))
    print("TRL recipes, run with: trl-length-grpo --config recipe:NAME")
    print("\n".join(f"  {name:<{width}}  {path}" for name, path in recipes.items()))
    print("verl recipes, run with: bash PATH")
    print("\n".join(f"  {path}" for path in sorted((RECIPES_DIR / "verl").glob("*.sh"))))
