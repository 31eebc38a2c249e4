"""What a host module checks of the host internals it relies on (docs/write-a-host.md, "The host module"): a
callable's parameter names, and which of the expected internals changed them. Every host's module uses these,
so a changed host fails closed the same way in TRL and verl."""

from __future__ import annotations

import inspect
from collections.abc import Iterable


def parameters(function, ignore: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The parameter names of ``function`` without ``ignore`` (None when it is not callable: it is gone)."""
    if not callable(function):
        return None
    return tuple(name for name in inspect.signature(function).parameters if name not in ignore)


def changed(
    expected: Iterable[tuple[object, str, tuple[str, ...]]], ignore: tuple[str, ...] = ()
) -> list[str]:
    """``Owner.name(parameters now)``, or ``Owner.name (gone)``, for each ``(owner, name, parameters)`` whose
    callable no longer has them."""
    found = []
    for owner, name, params in expected:
        now = parameters(getattr(owner, name, None), ignore)
        if now != params:
            found.append(f"{getattr(owner, '__name__', owner)}.{name}{' (gone)' if now is None else now}")
    return found
