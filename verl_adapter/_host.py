"""The verl version this adapter was written for, checked once at import (docs/reference/product.md §1.5)."""

from __future__ import annotations

import verl
from packaging.version import Version

SUPPORTED_VERL = (Version("0.9.1"), Version("0.10"))
EXPECTED = f"verl >={SUPPORTED_VERL[0]},<{SUPPORTED_VERL[1]} (written for 0.9.1)"


def require_supported_verl(feature: str) -> None:
    """Raise ImportError naming the expected verl version when the installed one is outside it."""
    if not SUPPORTED_VERL[0] <= Version(verl.__version__) < SUPPORTED_VERL[1]:
        raise ImportError(
            f"{feature} supports {EXPECTED}; found verl {verl.__version__}. "
            "Install 'trl-length-plugin[verl]'."
        )
