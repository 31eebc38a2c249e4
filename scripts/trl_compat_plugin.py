"""pytest plugin of scripts/trl_compat.sh: the installed TRL is let through the plugin's version gate
(``trl_integration._host.SUPPORTED_TRL``), so a release outside the supported range can be measured before the
range is widened. Every other check of the gate (each GRPOTrainer internal the integration relies on) stays.
The two tests that compare the range with the project's (pyproject's extra, the command's message in a fresh
process) are then left out: the widened range is this plugin's."""

from __future__ import annotations

RANGE_TESTS = (
    "test_supported_range_equals_pyproject",
    "test_a_trl_outside_the_range_is_one_line_from_the_command",
)
_widened = False


def pytest_configure(config) -> None:
    global _widened
    import trl
    from packaging.version import Version

    from trl_length_plugin.trl_integration import _host

    installed = Version(trl.__version__)
    low, high = _host.SUPPORTED_TRL
    if not low <= installed < high:
        _host.SUPPORTED_TRL = (
            min(low, installed),
            max(high, Version(f"{installed.major}.{installed.minor + 1}")),
        )
        _widened = True


def pytest_collection_modifyitems(config, items) -> None:
    if _widened:
        left = [item for item in items if item.name in RANGE_TESTS]
        config.hook.pytest_deselected(items=left)
        items[:] = [item for item in items if item.name not in RANGE_TESTS]
