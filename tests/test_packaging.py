"""A wheel of the project carries what the docs and the command line use (docs/reference/product.md §1.1):
every module, the recipes, the behaviour reference and the docs pages the README links, the entry points;
installed, it runs a recipe by name."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from trl_length_plugin import __version__

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("trl_length_plugin", "verl_adapter")
ENTRY_POINTS = {
    "console_scripts": {
        "trl-length": "trl_length_plugin.tools.commands:main",
        "trl-length-grpo": "trl_length_plugin.trl_integration.cli:main",
    },
    "verl.plugins": {"trl_length_plugin": "verl_adapter.plugin"},
}


@pytest.fixture(scope="module")
def wheel_path(tmp_path_factory) -> Path:
    """A wheel built from a copy of the checkout's files, so no stale ``build/`` of the checkout gets in."""
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        source, target = REPO / name, src / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        elif source.is_file():
            shutil.copy2(source, target)
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet"]
    subprocess.run([*pip, "--wheel-dir", str(dist), str(src)], check=True, timeout=300)
    (path,) = dist.glob("*.whl")
    return path


@pytest.fixture(scope="module")
def names(wheel_path) -> set[str]:
    with zipfile.ZipFile(wheel_path) as wheel:
        return set(wheel.namelist())


def dist_info(wheel_path: Path, name: str) -> str:
    with zipfile.ZipFile(wheel_path) as wheel:
        return wheel.read(f"trl_length_plugin-{__version__}.dist-info/{name}").decode()


def test_wheel_carries_every_module(names):
    modules = {
        path.relative_to(REPO).as_posix() for package in PACKAGES for path in (REPO / package).rglob("*.py")
    }
    assert modules and modules <= names


def test_wheel_carries_the_recipes(names):
    """The top-level ``recipes/`` is shipped as ``trl_length_plugin/recipes/`` (beside its module)."""
    recipes = REPO / "recipes"
    files = {
        f"trl_length_plugin/{p.relative_to(REPO).as_posix()}"
        for p in recipes.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert {
        "trl_length_plugin/recipes/trl/coefficient_cpu.yaml",
        "trl_length_plugin/recipes/verl/luspo_qwen2.5-0.5b.sh",
    } <= files
    assert files | {"trl_length_plugin/recipes/__init__.py"} <= names


def test_wheel_carries_the_docs_that_readme_code_and_help_cite(names):
    """Inside the package, ``docs/reference/<file>.md`` resolves as code and ``--help`` cite it."""
    linked = set(re.findall(r"`(docs/[\w/.-]+\.md)`", (REPO / "README.md").read_text()))
    cited = {
        match
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        for match in re.findall(r"docs/[\w/.-]+\.md", path.read_text())
    }
    reference = {p.relative_to(REPO).as_posix() for p in (REPO / "docs" / "reference").glob("*.md")}
    images = {p.relative_to(REPO).as_posix() for p in (REPO / "docs" / "images").glob("*.png")}
    assert linked and cited and reference
    assert {f"trl_length_plugin/{doc}" for doc in linked | cited | reference | images} <= names


def test_wheel_carries_the_files_the_shipped_docs_use(names):
    """A path under ``docs/`` that a shipped page names (docs/profiles.md runs ``docs/examples/rollouts.jsonl``)
    is in the wheel beside it."""
    used = {
        match
        for page in (REPO / "docs").rglob("*.md")
        for match in re.findall(r"docs/[\w/.-]+\.(?:md|jsonl|png)", page.read_text())
        if (REPO / match).is_file()
    }
    assert "docs/examples/rollouts.jsonl" in used
    assert {f"trl_length_plugin/{path}" for path in used} <= names


def test_wheel_entry_points_and_version(wheel_path):
    entry_points = configparser.ConfigParser()
    entry_points.read_string(dist_info(wheel_path, "entry_points.txt"))
    assert {group: dict(entry_points[group]) for group in entry_points.sections()} == ENTRY_POINTS
    assert f"\nVersion: {__version__}\n" in dist_info(wheel_path, "METADATA")


def test_installed_wheel_runs_a_recipe_by_name(wheel_path, tmp_path):
    """Installed from the wheel alone: ``recipe:NAME`` and the cited docs resolve inside the installed package,
    and the command rejects a bad key in one line before TRL is imported."""
    target = tmp_path / "site"
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-compile",
        "--quiet",
        "--target",
        str(target),
    ]
    subprocess.run([*pip, str(wheel_path)], check=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = (
        "import trl_length_plugin, pathlib; from trl_length_plugin.recipes import resolve_config;"
        "print(resolve_config('recipe:coefficient_cpu')); print(trl_length_plugin.__file__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    recipe, init = map(Path, done.stdout.split())
    assert recipe.is_file() and recipe.is_relative_to(target) and init.is_relative_to(target)
    assert (init.parent / "docs" / "reference" / "product.md").is_file()
    command = [
        sys.executable,
        "-m",
        "trl_length_plugin.trl_integration.cli",
        "--config",
        "recipe:coefficient_cpu",
    ]
    done = subprocess.run(
        [*command, "--length_penalty_coeff", "-1"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 2 and done.stderr.startswith("trl-length-grpo: error: length_penalty_coeff")


def test_readme_reads_on_a_package_index_page_and_its_python_example_configures():
    """No relative link (a package index page resolves none); the Python example's config builds as written
    (on this CPU machine with ``use_cpu`` added: TRL's default bf16 needs a GPU)."""
    readme = (REPO / "README.md").read_text()
    assert not re.findall(r"\]\((?!https?://)[^)]*\)", readme)
    example = readme.split("```python\n", 1)[1].split("```", 1)[0]
    imports, config = example.split("\n\n")[0], example.split("\n\n")[1].split("trainer =")[0]
    namespace: dict = {}
    config = config.replace("LengthPluginGRPOConfig(", "LengthPluginGRPOConfig(use_cpu=True, bf16=False, ", 1)
    exec(imports + "\n" + config, namespace)  # noqa: S102 - the README's own lines
    args = namespace["args"]
    assert args.shaping.enabled and args.length_penalty_coeff == 0.5
    assert args.length_penalty_config.default.group_total_length_penalty_coeff == 0.3
