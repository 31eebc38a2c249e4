"""Code that runs right after a module is imported (:func:`after_import`): how the entry point registers with
verl lazily and how the CPU patches wait for the modules they patch (docs/reference/product.md §1.5). Imports
nothing of verl's or the adapter's."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable


class _RunAfterImport(importlib.abc.MetaPathFinder):
    """Finds a module of ``_AFTER_IMPORT`` with the other finders and runs its callbacks right after its loader
    has executed it (the module object and its loader stay the host's own)."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _AFTER_IMPORT:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return None

        def exec_then_run(module):
            exec_module(module)
            for callback in _AFTER_IMPORT.get(fullname, ()):
                callback()
            _AFTER_IMPORT.pop(fullname, None)  # after they all ran: a failed one fails every import of it

        loader.exec_module = exec_then_run
        return spec


#: module -> what runs right after it is imported (once)
_AFTER_IMPORT: dict[str, list[Callable[[], None]]] = {}


def after_import(module: str, callback: Callable[[], None]) -> None:
    """Run ``callback`` right after ``module`` is imported in this process, or now when it already is."""
    if module in sys.modules:
        callback()
        return
    if not any(isinstance(finder, _RunAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RunAfterImport())
    _AFTER_IMPORT.setdefault(module, []).append(callback)
