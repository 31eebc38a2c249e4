"""docs/write-a-term.md: a term from outside the package registers before the length-shaping config is built
(through the ``trl_length_plugin.terms`` entry-point group, or imported before the config), runs in the §2.6
order with its own key, its outputs in the verbose records and its metric in the metrics; a term with a
per-prompt column of its own gets it through every host's row builder, the run's cache and the engine
(docs/reference/length-penalties.md §2.6, §2.14, §2.15). The parameter model is built once: a term registered
after that is refused in one line.

The toy terms (``tests/toy_terms``) run in fresh interpreters (``tests/write_a_term_cases.py``), each with one of
them registered through a real entry point: this interpreter built its config long ago, without them."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import Field, ValidationError

from trl_length_plugin.shaping import LengthPenaltyConfig, LengthPenaltyParams, PromptColumn, metadata_columns
from trl_length_plugin.shaping import terms as terms_package
from trl_length_plugin.shaping.terms import ENTRY_POINT_GROUP, Parameter, register_term, terms

REPO = Path(__file__).resolve().parents[1]
TOY_TERMS = ("tax", "budget", "window")
#: where ``toy_terms`` imports from (verl's wheel installs a top-level ``tests`` package of its own)
TOY_PATH = (str(REPO / "tests"), str(REPO))


def entry_point(tmp_path: Path, module: str) -> dict[str, str]:
    """An installed distribution (its ``.dist-info`` only) whose ``trl_length_plugin.terms`` entry point is
    ``module``; the environment of an interpreter that sees it."""
    info = tmp_path / "toy_terms-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-terms\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\ntoy = {module}\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join((str(tmp_path), *TOY_PATH))}


@pytest.mark.parametrize("toy", TOY_TERMS)
def test_a_toy_term_from_its_entry_point(tmp_path, toy):
    """Every case of ``write_a_term_cases.py`` passes (or skips, another toy term's) where the toy term is the
    entry point of an installed package."""
    env = entry_point(tmp_path, f"toy_terms.{toy}")
    cases = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/write_a_term_cases.py"]
    done = subprocess.run(cases, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout.splitlines()[-1], done.stdout[-1000:]


def test_a_term_imported_before_the_config_registers():
    """The explicit registration phase: a term module imported before anything builds the config."""
    code = (
        "import toy_terms.tax\n"
        "from trl_length_plugin.shaping import LengthPenaltyParams\n"
        "print('toy_tax' in LengthPenaltyParams.model_fields)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(TOY_PATH)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "True", done.stderr[-2000:]


def test_a_term_registered_after_the_config_is_built_is_refused_in_one_line():
    """Once the parameter model is built no term joins it (the config would not know its keys)."""
    late = register_term("toy_late", kind="additive", order=13, parameters={}, switches=())
    with pytest.raises(ValueError, match="registered after the length-shaping config was built") as refused:
        late(lambda view, inputs: {})
    assert "\n" not in str(refused.value) and "docs/write-a-term.md" in str(refused.value)
    assert "toy_late" not in {term.name for term in terms()}


def test_a_failing_entry_point_is_named(tmp_path):
    env = entry_point(tmp_path, "toy_terms.missing")
    code = "from trl_length_plugin.shaping import LengthPenaltyParams"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode != 0
    assert f"{ENTRY_POINT_GROUP} entry point 'toy' (toy_terms.missing) failed to load" in done.stderr


def test_an_unregistered_key_is_unknown():
    assert "toy_tax" not in LengthPenaltyParams.model_fields
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        LengthPenaltyConfig.model_validate({"default": {"toy_tax": 0.01}})


def test_every_module_of_the_package_is_a_term():
    """The registry finds the modules itself: one term per module, none listed by hand."""
    modules = {module.name for module in pkgutil.iter_modules(terms_package.__path__)}
    assert {term.compute.__module__.rsplit(".", 1)[-1] for term in terms()} == modules
    assert len(terms()) == len(modules)


def test_an_unregistered_column_is_not_read():
    assert "toy_budget" not in metadata_columns()
    with pytest.raises(ValueError, match="must be new dataset column names"):
        register_term(
            "toy_band",
            kind="additive",
            order=12,
            parameters={},
            switches=(),
            columns=(PromptColumn("profile_band", float, "§2.12"),),
        )(lambda view, inputs: {})


def test_the_guides_table_lists_the_registered_terms_in_order():
    """docs/write-a-term.md's table of the §2.6 order names the package's terms of each kind as the registry
    orders them, with their orders."""
    import re

    table = dict(
        re.findall(r"^\| `(\w+)` \|.*\| ([^|]*) \|$", (REPO / "docs" / "write-a-term.md").read_text(), re.M)
    )
    assert set(table) == {term.kind for term in terms()}
    for kind, listed in table.items():
        assert listed.strip() == ", ".join(f"{term.name} ({term.order})" for term in terms(kind)), kind


#: a key of a toy term that is not switched on by default
def toy_key(default=0.0, annotation=float) -> Parameter:
    return Parameter(annotation, default, "a toy key")


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"parameters": {"enabled": toy_key(True, bool)}}, "key 'enabled' is a key every agent block shares"),
        (
            {"parameters": {"top_percentile": toy_key(0.5)}},
            "key 'top_percentile' is a key every agent block shares",
        ),
        ({"parameters": {"cosine": toy_key()}}, "key 'cosine' is another term's output"),
        ({"parameters": {"group_total": toy_key()}}, "key 'group_total' is another term's output"),
        ({"outputs": ("overlong",)}, "its outputs ['overlong'] must be new names, each once"),
        ({"outputs": ("cosine_max_length",)}, "its outputs ['cosine_max_length'] must be new names"),
        ({"outputs": ("toy_a", "toy_a")}, "its outputs ['toy_a', 'toy_a'] must be new names, each once"),
        (
            {"parameters": {"toy_rate": toy_key(-1.0, Annotated[float, Field(ge=0)])}},
            "key 'toy_rate': its default -1.0 breaks its own type or constraints (Input should be greater than or",
        ),
        (
            {"parameters": {"toy_mode": toy_key("c", Literal["a", "b"])}},
            "key 'toy_mode': its default 'c' breaks its own",
        ),
        (
            {"columns": (PromptColumn("reward", float, "x"),)},
            "must be new dataset column names (not one a host or tool",
        ),
        ({"columns": (PromptColumn("prompt_id", float, "x"),)}, "must be new dataset column names"),
    ],
)
def test_a_term_that_would_break_the_built_ins_is_refused_in_one_line(declared, message):
    """Issue 42: a term's key named like a shared key or another term's output, an output named like another
    term's, a default its own constraints refuse or a column a tool reads was registered, and broke the
    built-ins (the agent block's keys, the verbose records' columns, the offline tools' rows) or the config."""
    before = [term.name for term in terms()]
    with pytest.raises(ValueError) as refused:
        register_term("toy_bad", kind="additive", order=99, switches=(), **{"parameters": {}, **declared})(
            lambda view, inputs: {}
        )
    assert str(refused.value).startswith("length term 'toy_bad': ") and message in str(refused.value)
    assert "\n" not in str(refused.value) and [term.name for term in terms()] == before


@pytest.mark.parametrize("name", ["", "  ", None])
def test_a_term_without_a_name_is_refused(name):
    """Issue 42: an empty name registered a term whose single output was named ``''``."""
    with pytest.raises(ValueError, match=r"^length term: a name is needed \(a non-empty string\), got "):
        register_term(name, kind="additive", order=99, parameters={}, switches=())


def test_an_installed_term_that_would_break_the_built_ins_is_one_line_at_the_command_line(tmp_path):
    """Issue 42: through an entry point, the refusal reached the command line as a traceback."""
    package = tmp_path / "bad_terms"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from trl_length_plugin.shaping.terms import Parameter, register_term\n"
        "register_term('toy_shared', kind='additive', order=50, switches=('enabled',),\n"
        "              parameters={'enabled': Parameter(bool, False, 'x')})(lambda view, inputs: {})\n"
    )
    env = entry_point(tmp_path, "bad_terms")
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text('{"prompt_id": 0, "completion": "a", "reward": 1}\n')
    command = [sys.executable, "-m", "trl_length_plugin.tools.commands", "preview", str(rollouts)]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"trl-length preview: error: {ENTRY_POINT_GROUP} entry point 'toy' (bad_terms) failed to load: ValueError: "
        "length term 'toy_shared': key 'enabled' is a key every agent block shares; choose another name"
    ]


def test_the_shared_keys_are_the_agent_blocks():
    from trl_length_plugin.shaping.config import SharedParams
    from trl_length_plugin.shaping.terms import SHARED_KEYS

    assert tuple(SharedParams.model_fields) == SHARED_KEYS
