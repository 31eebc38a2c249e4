"""Imports on demand: optional hosts with an error that names the extra to install (docs/reference/product.md
§1.2), and a package's names exported lazily, so that importing one part imports only what it needs."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
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


def lazy_exports(
    package: str, exports: Mapping[str, str], before: Callable[[], object] | None = None
) -> Callable:
    """The ``__getattr__`` of ``package``, whose names ``exports`` maps to its modules: a module is imported when
    one of its names is first read, after ``before`` (a check that a host is installed)."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if before is not None:
            before()
        return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)

    return __getattr__
