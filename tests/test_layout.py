"""The layout shows the architecture (docs/write-a-host.md, README "Layout"): the package's top level holds only
modules every part shares and imports no host; no two modules import each other, directly or around a loop (the
imports a module runs, at its top or inside a function; ``if TYPE_CHECKING:`` blocks are not run); the hosts take
score centering through its package's public names; every name of every ``__all__`` imports.

Read from the source with ``ast`` (nothing is imported but the modules whose ``__all__`` is checked)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("trl_length_plugin", "verl_adapter")
#: the hosts and the tools that drive them
HOSTS = ("trl_length_plugin.trl_integration", "verl_adapter", "trl_length_plugin.tools", "trl", "verl")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(test)


def runtime_imports(name: str) -> set[str]:
    """The modules ``name`` imports when it runs (at its top or in a function), as imported names resolve:
    ``from a.b import c`` is ``a.b.c`` when that is a module, else ``a.b``."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking(node):
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def graph() -> dict[str, set[str]]:
    """Each module -> the package modules it imports, with the packages above them that Python runs first (not
    its own: they are running already when it does)."""
    edges = {}
    for name in MODULES:
        parts = name.split(".")
        own = {".".join(parts[:i]) for i in range(1, len(parts))}
        targets = set()
        for imported in runtime_imports(name):
            steps = imported.split(".")
            targets.update(".".join(steps[:i]) for i in range(1, len(steps) + 1))
        edges[name] = {t for t in targets - own if t in MODULES and t != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return found


def test_no_module_is_in_an_import_cycle():
    assert cycles(graph()) == []


def test_the_cycle_check_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_top_level_and_the_core_import_no_host():
    """``trl_length_plugin/*.py`` and the core's packages (shaping, score centering, losses) import no host, no
    tool, and neither TRL nor verl."""
    shared = [name for name, path in MODULES.items() if path.parent == REPO / "trl_length_plugin"]
    core = [
        name
        for name in MODULES
        if name.startswith(
            ("trl_length_plugin.shaping", "trl_length_plugin.score_centering", "trl_length_plugin.losses")
        )
    ]
    assert "trl_length_plugin.config_base" in shared and len(shared) < 10  # only what every part shares
    for name in shared + core:
        hosts = sorted(
            i for i in runtime_imports(name) if i in HOSTS or i.startswith(tuple(f"{h}." for h in HOSTS))
        )
        assert not hosts, f"{name} imports {hosts}"


def test_the_hosts_take_score_centering_through_its_public_names():
    """No host module imports a module of ``trl_length_plugin.score_centering``: each imports the package's
    ``__all__`` names (the run object, the plan, the keys and the capture functions)."""
    for name in MODULES:
        if name.startswith(("trl_length_plugin.trl_integration", "verl_adapter")):
            inner = sorted(
                i for i in runtime_imports(name) if i.startswith("trl_length_plugin.score_centering.")
            )
            assert not inner, f"{name} imports {inner}"


PUBLIC = sorted(
    name
    for name, path in MODULES.items()
    if any(
        isinstance(n, ast.Assign) and "__all__" in ast.unparse(n.targets)
        for n in ast.parse(path.read_text()).body
    )
)


def test_the_public_modules_are_found():
    assert {
        "trl_length_plugin.shaping",
        "trl_length_plugin.score_centering",
        "trl_length_plugin.losses",
    } <= set(PUBLIC)


@pytest.mark.parametrize("module", PUBLIC)
def test_every_name_of_every_all_imports(module):
    imported = importlib.import_module(module)
    missing = [name for name in imported.__all__ if not hasattr(imported, name)]
    assert not missing, f"{module}.__all__ names {missing}, which do not import"


def core_definitions() -> dict[str, str]:
    """Each public name defined at the top of a module of the core's three packages -> its package (the term
    modules left out: their functions share their keys' names)."""
    names = {}
    for package in ("shaping", "score_centering", "losses"):
        for path in (REPO / "trl_length_plugin" / package).rglob("*.py"):
            if path.parent.name == "terms" and path.name != "__init__.py":
                continue
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.FunctionDef | ast.ClassDef):
                    defined = [node.name]
                elif isinstance(node, ast.Assign | ast.AnnAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    defined = [target.id for target in targets if isinstance(target, ast.Name)]
                else:
                    defined = []
                names.update((name, f"trl_length_plugin.{package}") for name in defined if name[0] != "_")
    return names


def test_every_core_name_the_host_guide_uses_is_exported():
    """docs/write-a-host.md names the core's functions and classes as a host imports them: each is in its
    package's ``__all__``."""
    defined, used = core_definitions(), set()
    for span in re.findall(r"`([^`]+)`", (REPO / "docs" / "write-a-host.md").read_text()):
        name = re.match(r"([A-Za-z_]\w*)(\(.*\))?$", span.strip(), re.S)
        if name and name.group(1) in defined:
            used.add(name.group(1))
    assert {"ScoreCenteringRun", "resolve_plan", "HostSettings", "ShapingRun", "luspo_loss"} <= used
    missing = sorted(
        f"{defined[n]}.{n}" for n in used if n not in importlib.import_module(defined[n]).__all__
    )
    assert not missing, f"docs/write-a-host.md uses names their packages do not export: {missing}"
