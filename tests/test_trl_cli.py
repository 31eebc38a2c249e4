"""``trl-length-grpo`` / ``trl-length grpo`` (docs/reference/product.md §1.3): every error is one line
``trl-length-grpo: error: ...`` with exit status 2 and no traceback; the plugin's keys are rejected before TRL
or torch are imported; ``recipe:NAME`` names a shipped recipe; the keys a user wrote count for ``luspo: true``;
the plugin's log lines appear by default; a CPU recipe trains through the console command."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from trl_length_plugin import __version__
from trl_length_plugin.recipes import RECIPES_DIR, trl_recipes
from trl_length_plugin.trl_integration import cli, cli_help

BIN = Path(sys.executable).parent
MISSING_MODEL = "/nonexistent/model"  # loading it would fail with another message: proves nothing loaded
ERROR = "trl-length-grpo: error: "
#: makes TRL, torch and transformers unimportable, then runs the command line
BLOCKED = (
    "import sys; sys.modules.update(dict.fromkeys(['trl', 'torch', 'transformers']));"
    "from trl_length_plugin.tools.commands import main; main()"
)


@pytest.fixture(autouse=True)
def _plugin_log_level():
    """The command line sets the plugin logger's level; put it back for the other tests."""
    plugin_logger = logging.getLogger("trl_length_plugin")
    level = plugin_logger.level
    yield
    plugin_logger.setLevel(level)


def write_recipe(tmp_path, base="group_relative_cpu", **changes) -> Path:
    recipe = yaml.safe_load((RECIPES_DIR / "trl" / f"{base}.yaml").read_text())
    recipe.update(model_name_or_path=MISSING_MODEL, output_dir=str(tmp_path / "out"), **changes)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def assert_one_error_line(stderr: str, *fragments: str) -> str:
    """The command's stderr ends in exactly one error line holding ``fragments``, with no traceback (other
    lines can only be library notices printed while TRL is imported)."""
    errors = [line for line in stderr.splitlines() if line.startswith(ERROR)]
    assert len(errors) == 1 and stderr.strip().endswith(errors[0]), stderr[-3000:]
    assert "Traceback" not in stderr and all(f in errors[0] for f in fragments), stderr[-3000:]
    return errors[0]


# -- before TRL is imported ------------------------------------------------------------------------------
PRE_IMPORT = {
    "missing file": (lambda p: ["--config", str(p / "none.yaml")], ["none.yaml", "No such file"]),
    "unreadable file": (lambda p: ["--config", str(p)], ["cannot read", "Is a directory"]),
    "--config without a value": (lambda p: ["--config"], ["--config needs a value"]),
    "--config= without a value": (lambda p: ["--config=", "--max_steps", "1"], ["--config needs a value"]),
    "YAML syntax": (lambda p: ["--config", yaml_file(p, "a: [1, 2\nb: 3\n")], ["recipe.yaml", "line 2"]),
    "not a mapping": (lambda p: ["--config", yaml_file(p, "- a\n")], ["recipe.yaml", "a YAML mapping"]),
    "wrong type": (
        lambda p: ["--config", yaml_file(p, "length_penalty_coeff: [1, 2]\n")],
        ["length_penalty_coeff"],
    ),
    "NaN flag": (lambda p: ["--length_penalty_coeff=nan"], ["length_penalty_coeff", "finite"]),
    "fraction for an integer": (
        lambda p: ["--length_penalty_min_tokens", "1.5"],
        ["length_penalty_min_tokens"],
    ),
    "misspelt plugin key": (
        lambda p: ["--config", yaml_file(p, "length_penalty_cof: 1.0\n")],
        ["'length_penalty_cof'", "did you mean 'length_penalty_coeff'"],
    ),
    "bad block key": (
        lambda p: ["--length_penalty", '{"default": {"length_type": "token"}}'],
        ["length_penalty.default.length_type"],
    ),
    "bad band": (
        lambda p: [
            "--config",
            yaml_file(
                p,
                "length_penalty:\n  profile_band:\n    enabled: true\n    defaults: {total: {a: 20, b: 10, f: 0.5}}\n",
            ),
        ],
        ["length_penalty.profile_band.defaults.total"],
    ),
    "conflicting reasoning tags": (
        lambda p: [
            "--reasoning_tags",
            "<a>",
            "</a>",
            "--length_penalty",
            '{"reasoning_tags": ["<b>", "</b>"]}',
        ],
        ["reasoning_tags", "disagrees"],
    ),
    "plugin key of a wrong type": (lambda p: ["--luspo", "maybe"], ["luspo"]),
    "misspelt score-centering key": (
        lambda p: ["--config", "recipe:score_centering_cpu", "--score_centering_topk", "8"],
        ["'score_centering_topk'", "did you mean 'score_centering_top_k'"],
    ),
    "score-centering key without score_centering": (
        lambda p: ["--score_centering_top_k", "16"],
        ["score_centering_top_k: needs score_centering: true"],
    ),
    "fraction for K": (
        lambda p: ["--config", "recipe:score_centering_cpu", "--score_centering_top_k", "1.5"],
        ["score_centering_top_k"],
    ),
    "fractional top_k flag": (
        lambda p: ["--config", "recipe:coefficient_cpu", "--top_k", "1.5"],
        ["top_k: must be a whole number: -1 or 0 (off) or >= 1, got 1.5"],
    ),
    "TRL choice key": (
        lambda p: ["--config", "recipe:group_relative_cpu", "--loss_type", "dr-grpo"],
        ["loss_type: 'dr-grpo' is not one of", "(did you mean 'dr_grpo'?)"],
    ),
    "TRL integer key in a recipe": (
        lambda p: ["--config", yaml_file(p, "num_iterations: 0\n")],
        ["num_iterations: must be an integer >= 1, got 0"],
    ),
    "key written twice": (
        lambda p: ["--config", yaml_file(p, "max_steps: 1\nlearning_rate: 1.0e-5\nmax_steps: 2\n")],
        ["recipe.yaml: key 'max_steps' written twice (line 1 and line 3)"],
    ),
    "nested typo": (
        lambda p: ["--length_penalty", '{"default": {"group_totl_length_penalty_coeff": 0.1}}'],
        [
            "length_penalty.default.group_totl_length_penalty_coeff: unknown key (did you mean 'group_total_length_penalty_coeff'?)"
        ],
    ),
    # issue 31: a stage the loader would refuse as a base configuration; numbers beyond their range
    "schedule stage past a band bound": (
        lambda p: [
            "--length_penalty",
            '{"profile_band": {"enabled": true, "defaults": {"total": {"a": 100, "b": 200, "f": 0.5}}}}',
            "--length_schedule",
            '[{"key": "length_penalty.profile_band.defaults.total.a", "stages": [{"until_step": 5, "value": 300}]}]',
        ],
        [
            "length_schedule.0.stages.0: the config of step 0 is refused",
            "profile_band.defaults.total",
            "b > a",
        ],
    ),
    "schedule stage below the overlong buffer": (
        lambda p: [
            "--length_penalty",
            '{"default": {"overlong_max_length": 4096, "overlong_buffer": 512}}',
            "--length_schedule",
            '[{"key": "length_penalty.default.overlong_max_length", "stages": [{"until_step": 5, "value": 256}]}]',
        ],
        ["length_schedule.0.stages.0", "length_penalty.default.overlong_buffer"],
    ),
    "float key beyond its range": (
        lambda p: [
            "--length_penalty",
            '{"default": {"target_length": "exact", "target_length_alpha": 1e308}}',
        ],
        ["length_penalty.default.target_length_alpha: Input should be less than or equal to 1000000"],
    ),
    "coefficient beyond its range": (lambda p: ["--length_penalty_coeff", "1e308"], ["length_penalty_coeff"]),
    "JSON key written twice": (
        lambda p: ["--length_penalty", '{"default": {"total_bonus": 0.1, "total_bonus": 0.2}}'],
        ["length_penalty: key 'total_bonus' written twice (values 0.1 and 0.2)"],
    ),
    "JSON schedule key written twice": (
        lambda p: [
            "--length_penalty_coeff",
            "1.0",
            "--length_schedule",
            '[{"key": "length_penalty_coeff", "stages": [{"until_step": 2, "value": 0.5, "value": 5}]}]',
        ],
        ["length_schedule: key 'value' written twice (values 0.5 and 5)"],
    ),
    "streaming without max_steps": (
        lambda p: ["--dataset_streaming", "true"],
        ["dataset_streaming: true needs max_steps > 0", "max_steps=-1"],
    ),
    "streaming with max_steps 0 in a recipe": (
        lambda p: ["--config", yaml_file(p, "dataset_streaming: true\nmax_steps: 0\n")],
        ["dataset_streaming: true needs max_steps > 0", "max_steps=0"],
    ),
    "K beyond the capture's cap": (
        lambda p: ["--config", "recipe:score_centering_cpu", "--score_centering_top_k", str(2**40)],
        ["score_centering_top_k: Input should be less than or equal to 2147483647"],
    ),
    "unknown recipe": (lambda p: ["--config", "recipe:nope"], ["no recipe named 'nope'", "coefficient_cpu"]),
    "valid keys, then TRL missing": (
        lambda p: ["--config", "recipe:coefficient_cpu"],
        ["'trl' is needed", "pip install 'trl-length-plugin[trl]'"],
    ),
}


def yaml_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("case", list(PRE_IMPORT))
def test_errors_before_trl_is_imported_are_one_line(case, tmp_path):
    """Run with TRL, torch and transformers unimportable: each error still names its key or file."""
    argv, fragments = PRE_IMPORT[case]
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED, "grpo", *argv(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1
    assert_one_error_line(done.stderr, *fragments)


# -- after TRL is imported (in this process) ---------------------------------------------------------------
POST_IMPORT = {
    "unknown TRL key": (
        {"learning_rat": 1.0},
        [],
        ["'learning_rat'", "did you mean 'learning_rate'", "recipe.yaml"],
    ),
    "unknown flag": ({}, ["--no_such_flag", "1"], ["'no_such_flag'", "on the command line"]),
    "flag of a wrong type": ({}, ["--num_generations", "four"], ["--num_generations", "invalid int value"]),
    "TRL config check": ({}, ["--num_generations", "3"], ["num_generations"]),
    "TRL key of a wrong type": ({"learning_rate": [1, 2]}, [], ["learning_rate: [1, 2] is not a number"]),
    "fraction for a TRL integer": ({"num_generations": 4.5}, [], ["num_generations: 4.5 is not an integer"]),
    "bad reward path": (
        {"reward_funcs": ["trl_length_plugin.embedded.no_such_reward"]},
        [],
        ["no_such_reward"],
    ),
    "luspo against loss_type": (
        {"luspo": True, "loss_type": "dapo"},
        [],
        ["luspo: true conflicts", "'dapo'"],
    ),
    "luspo against a flag": ({"luspo": True}, ["--importance_sampling_level", "token"], ["'token'"]),
    "overlong maximum above max_completion_length": (
        {"length_penalty": {"default": {"overlong_max_length": 64, "overlong_buffer": 16}}},
        [],
        ["length_penalty.default.overlong_max_length: 64 is above max_completion_length (48)"],
    ),
    "coefficient floor at max_completion_length": (
        {"length_penalty_coeff": 1.0, "length_penalty_min_tokens": 48},
        [],
        ["length_penalty_min_tokens: 48 is at or above max_completion_length (48)"],
    ),
    "JSON engine kwargs key written twice": (
        {},
        ["--vllm_engine_kwargs", '{"max_logprobs": 8, "max_logprobs": 16}'],
        ["vllm_engine_kwargs: key 'max_logprobs' written twice (values 8 and 16)"],
    ),
    "trainer check: correctness_reward": (
        {"correctness_reward": "nope"},
        [],
        ["correctness_reward", "'nope'"],
    ),
    "trainer check: reward column": (
        {"reward_funcs": ["tests.test_trl_cli.length_penalty"], "correctness_reward": None},
        [],
        ["'length_penalty'"],
    ),
}


def length_penalty(prompts, **kwargs):
    """A reward function named like the plugin's own column (rejected by the trainer)."""
    return [0.0] * len(prompts)


@pytest.mark.parametrize("case", list(POST_IMPORT))
def test_errors_after_trl_is_imported_are_one_line(case, tmp_path, capsys):
    changes, flags, fragments = POST_IMPORT[case]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--config", str(write_recipe(tmp_path, **changes)), *flags])
    assert exit_info.value.code == 2
    line = assert_one_error_line(capsys.readouterr().err, *fragments)
    assert MISSING_MODEL not in line


def test_console_command_reports_a_trainer_check_in_one_line(tmp_path):
    """The real command: the trainer's check fails before the model loads, as one line with no traceback."""
    recipe = write_recipe(tmp_path, correctness_reward="nope")
    done = subprocess.run(
        [str(BIN / "trl-length-grpo"), "--config", str(recipe)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2
    assert_one_error_line(done.stderr, "correctness_reward: 'nope' matches no reward functions")


def test_only_the_plugins_own_checks_become_one_line():
    """Errors raised inside TRL, a model or training keep their traceback."""
    with pytest.raises(ValueError) as plugin_error:
        cli.resolve_config("recipe:nope")
    with pytest.raises(ValueError) as other_error:
        int("x")
    assert cli.raised_by_plugin(plugin_error.value) and not cli.raised_by_plugin(other_error.value)


def test_plugin_keys_are_the_configs_own_keys():
    """The keys checked before TRL is imported are exactly what LengthPluginGRPOConfig adds to GRPOConfig."""
    from trl import GRPOConfig

    from trl_length_plugin.trl_integration import LengthPluginGRPOConfig

    added = {f.name for f in dataclasses.fields(LengthPluginGRPOConfig)} - {
        f.name for f in dataclasses.fields(GRPOConfig)
    }
    assert added == set(cli.PLUGIN_KEYS)


# -- what the command does ------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [["trl-length-grpo"], ["trl-length", "grpo"], ["trl-length"]])
def test_version(command):
    done = subprocess.run([str(BIN / command[0]), *command[1:], "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip().endswith(f" {__version__}")


def test_help_lists_the_plugins_keys_first_then_trls(capsys):
    """``--help``: usage, the docs path on one line, the plugin's keys by feature, then TRL's parser with the
    plugin's keys left out (each key is listed once)."""
    cli.main(["--help"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("usage: trl-length-grpo") and f"docs: {cli.DOCS}" in lines
    assert (cli.DOCS / "reference" / "product.md").is_file()
    help_text = " ".join(out.split())
    assert "--length_penalty flag replaces the recipe's whole length_penalty block" in help_text
    titles = [title for title, _ in cli_help.GROUPS]
    at = [out.index(f"\n{title}:\n") for title in titles]
    assert at == sorted(at) and at[-1] < out.index(cli.TRL_HELP_HEADING.split()[0] + " keys (GRPOConfig")
    assert out.index("  --length_penalty_coeff  (float, default 0.0)") < out.index("--learning_rate")
    for key in cli_help.grouped_keys():
        assert len(re.findall(rf"^  --{key}\b", out, re.M)) == 1, key


def test_plugin_help_needs_no_trl():
    """``--plugin-help`` prints the plugin's part with TRL, torch and transformers unimportable."""
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED, "grpo", "--plugin-help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Group length penalties (docs/reference/length-penalties.md §2):" in done.stdout
    assert (
        "  --score_centering_top_k  (int, default 0)" in done.stdout and "--learning_rate" not in done.stdout
    )


def test_help_texts_are_the_configs_own():
    """The help read from the source (no TRL) is the help of the dataclass fields, key by key, and every
    plugin key is in a group."""
    from trl_length_plugin.trl_integration.config import LengthPluginGRPOConfig
    from trl_length_plugin.trl_integration.script import LengthGRPOScriptArguments

    declared = cli_help.declared_keys()
    for arguments in (LengthPluginGRPOConfig, LengthGRPOScriptArguments):
        for spec in dataclasses.fields(arguments):
            if spec.name in declared:
                assert declared[spec.name].help == spec.metadata["help"], spec.name
    assert set(cli.PLUGIN_KEYS) <= set(cli_help.grouped_keys()) <= set(declared)
    assert declared["length_penalty_coeff"].default == "0.0" and declared["dataset_size"].default == "256"


def test_length_penalty_flag_replacing_the_block_is_logged(tmp_path, caplog):
    recipe = write_recipe(tmp_path)  # its block: default.group_total_length_penalty_coeff
    with caplog.at_level(logging.WARNING, "trl_length_plugin"):
        training_args = cli.parse_args(
            ["--config", str(recipe), "--length_penalty", '{"default": {"total_bonus": 0.1}}']
        )[1]
    assert training_args.length_penalty == {"default": {"total_bonus": 0.1}}
    (record,) = [r for r in caplog.records if "replaces" in r.getMessage()]
    assert record.levelno == logging.WARNING and "recipe.yaml (default)" in record.getMessage()


@pytest.mark.parametrize("where", ["recipe", "flag"])
def test_luspo_keeps_what_the_user_wrote(where, tmp_path):
    """``epsilon: 0.2`` equals TRL's default, yet it was written, so ``luspo: true`` keeps it."""
    changes = {"epsilon": 0.2} if where == "recipe" else {}
    flags = ["--epsilon", "0.2"] if where == "flag" else []
    args = cli.parse_args(["--config", str(write_recipe(tmp_path, base="luspo_cpu", **changes)), *flags])[1]
    assert (args.loss_type, args.epsilon, args.epsilon_high) == ("luspo", 0.2, 2.5e-3)


def test_plugin_logs_at_info_and_the_hosts_at_warning_unless_log_level_is_written(tmp_path, monkeypatch):
    """Without ``log_level`` TRL's stays ``passive`` (transformers at WARNING), the plugin logs at INFO and
    the vLLM, DeepSpeed and datasets loggers are set to WARNING; a written ``log_level`` is TRL's as is."""
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    recipe = str(write_recipe(tmp_path))
    plugin = logging.getLogger("trl_length_plugin")
    assert cli.parse_args(["--config", recipe])[1].log_level == "passive"
    assert plugin.level == logging.INFO and os.environ["VLLM_LOGGING_LEVEL"] == "WARNING"
    assert all(logging.getLogger(name).level == logging.WARNING for name in ("vllm", "DeepSpeed", "datasets"))
    assert cli.parse_args(["--config", recipe, "--log_level", "warning"])[1].log_level == "warning"
    assert plugin.level == logging.WARNING


@pytest.mark.parametrize("name", list(trl_recipes()))
def test_every_recipe_parses_by_name(name, tmp_path):
    cpu = ["--bf16", "false", "--use_cpu", "true"]  # the GPU recipes ask for bf16, which this machine lacks
    profiled = ("profiled_cpu", "target_length_cpu")  # trl-length profile's outputs (test_offline_safety)
    if name in profiled:
        cpu += ["--dataset_name", str(tmp_path)]
    parsed = cli.parse_args([f"--config=recipe:{name}", "--output_dir", str(tmp_path), *cpu])
    script_args, training_args = parsed[0], parsed[1]
    assert script_args.reward_funcs and training_args.output_dir == str(tmp_path)


def test_recipes_subcommand_lists_every_recipe():
    done = subprocess.run([str(BIN / "trl-length"), "recipes"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("  ")]  # TRL: name, path
    assert {row[0] for row in rows if len(row) == 2} == set(trl_recipes())
    assert all(Path(row[-1]).is_file() for row in rows) and any(row[-1].endswith(".sh") for row in rows)


@pytest.mark.slow
def test_cpu_recipe_trains_through_the_console_command_and_logs(tmp_path):
    """One short step of ``recipe:coefficient_cpu`` (``save_strategy: "no"``): the plugin's settings lines
    with their values and the step's ``Length penalty:`` summary appear on stderr, each on a line of its own
    beside the progress bar, with no logging set up; transformers' INFO lines and the accelerator notices
    do not; the model card is in the output folder with the tag, the settings and the citations."""
    out = tmp_path / "run"
    small = ["--max_steps", "1", "--dataset_size", "8", "--per_device_train_batch_size", "4"]
    flags = [
        *small,
        "--max_completion_length",
        "16",
        "--length_penalty_coeff_warmup_steps",
        "0",
        "--output_dir",
        str(out),
        "--length_penalty",
        '{"default": {"total_bonus": 0.1}}',
    ]
    done = subprocess.run(
        [str(BIN / "trl-length-grpo"), "--config", "recipe:coefficient_cpu", *flags],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (out / "model.safetensors").exists() and (out / "length_curves.png").exists()
    assert "length_penalty/coeff" in done.stdout and "length_penalty/adjusted_frac" in done.stdout
    lines = done.stderr.splitlines()
    plugin = "[INFO|trl_length_plugin] trl-length-plugin: "
    assert plugin + "group length penalties: length_penalty.default.total_bonus=0.1" in lines
    assert (
        plugin
        + (
            "length coefficient: length_penalty_coeff=1.0, length_penalty_min_tokens=4, "
            "length_penalty_coeff_warmup_steps=0"
        )
        in lines
    )
    assert plugin + "zero-std filter: drop_zero_std_groups=true" in lines
    segments = re.split(r"[\r\n]", done.stderr)  # a progress bar redraws after "\r"
    (summary,) = [segment for segment in segments if "Length penalty:" in segment]
    assert summary.startswith("[INFO|trl_length_plugin] Length penalty: step=0 coeff=1 rollouts=4 groups=1 ")
    for quiet in ("***** Running training *****", "Triton is installed", "Setting accelerator to CPU"):
        assert quiet not in done.stderr + done.stdout, quiet
    card = (out / "README.md").read_text()
    assert "- trl-length-plugin" in card.split("---")[1]  # the front matter's tags
    assert '"length_penalty_coeff": 1.0' in card and '"total_bonus": 0.1' in card
    assert "Cite trl-length-plugin as:" in card and "Cite group length penalties as:" in card


@pytest.mark.slow
def test_score_centering_cpu_recipe_trains_with_a_colocated_engine(tmp_path):
    """One step of ``recipe:score_centering_cpu`` through the console command: the setup line names the mode,
    and the step logs the score-centering metrics."""
    small = ["--max_steps", "1", "--dataset_size", "8", "--per_device_train_batch_size", "8"]
    done = subprocess.run(
        [str(BIN / "trl-length-grpo"), "--config", "recipe:score_centering_cpu", *small, "--gradient_accumulation_steps", "1",
         "--output_dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert (
        "trl-length-plugin: score centering: K=16, mode tis in [0, 3], full vocabulary (vLLM colocate)"
        in done.stderr
    )
    assert "score_centering/head_mass" in done.stdout and "score_centering/correction_abs_mean" in done.stdout


def test_streaming_streams_every_source(tmp_path):
    """``--dataset_streaming true`` streams the embedded task too (it was silently map-style, issue 31)."""
    import datasets

    from trl_length_plugin.trl_integration.script import load_datasets

    args = SimpleNamespace(
        dataset_name="embedded",
        dataset_streaming=True,
        dataset_size=4,
        eval_dataset_size=2,
        dataset_train_split="train",
        dataset_test_split="test",
    )
    train, evaluation = load_datasets(
        args, SimpleNamespace(eval_strategy="no", seed=0), SimpleNamespace(datasets=None), None
    )
    assert isinstance(train, datasets.IterableDataset) and len(list(train)) == 4 and evaluation is None
    cli.read_command_line(["--dataset_streaming", "true", "--max_steps", "3"])  # accepted
