"""Imports of optional hosts with an error that names the extra to install (docs/reference/product.md §1.2)."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise an ImportError that says which extra provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{module!r} is needed for this feature but could not be imported ({err}). "
            f"Install it with: pip install 'trl-length-plugin[{extra}]'"
        ) from err
