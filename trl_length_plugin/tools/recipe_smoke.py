"""``trl-length recipe-smoke [NAME ...] [--model smollm2|embedded|PATH] [--steps N]``: each shipped TRL recipe
(all of them without a NAME) trained N steps (default 1) on this CPU through ``trl-length-grpo``, on a real
pretrained chat model by default (docs/embedded.md, "A real chat model").

Only the model, the dataset (the embedded task stays; a Hub dataset becomes a GSM8K-format sample this project
writes, ``tasks.gsm8k_sample``), precision, vLLM's CPU settings and batch/length sizes are replaced; every
algorithm key is kept. Each run passes when it exits 0, its log rows hold the plugin's metrics and they are
finite, the model card is written, and (score centering) the head mass is in (0, 1.0001]; a LUSPO recipe logs its
settings line instead of metrics. One line per recipe
with its wall time, then PASS or FAIL, and below it one line per feature the run logged (the coefficient, group
shaping, score centering): whether it acted, and when it never did, why and what would make it act
(``tools.acted``); exit code 0, or 1 when a recipe failed.
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from trl_length_plugin.offline.command import Parser
from trl_length_plugin.plugin_keys import KEY_FAMILIES
from trl_length_plugin.recipes import trl_recipes
from trl_length_plugin.tools.acted import acted_lines
from trl_length_plugin.tools.sessions import interrupt_on_ending_signals, run_session

PROG = "trl-length recipe-smoke"
#: recipes that read per-prompt data made by ``trl-length profile`` first (docs/profiles.md), with the profile
#: flags their headers give: the run samples the model on the embedded task's prompts and profiles them first
NEEDS_PROFILES = {"profiled_cpu": (), "target_length_cpu": ("--targets", "0.5", "--target-prompt")}
#: the sizes of a CPU run: 2 groups of 4 completions of up to 48 tokens a step
SIZES = {
    "num_generations": "4",
    "per_device_train_batch_size": "8",
    "gradient_accumulation_steps": "1",
    "max_completion_length": "48",
    "dataset_size": "16",
}
#: what a CPU run sets whatever the recipe says
CPU = {"use_cpu": "true", "bf16": "false", "gradient_checkpointing": "false", "report_to": "none",
       "logging_steps": "1", "save_strategy": "no"}  # fmt: skip
VLLM_CPU = {
    "vllm_mode": "colocate",
    "vllm_engine_kwargs": json.dumps({"dtype": "float32", "enforce_eager": True}),
    "vllm_max_model_length": "512",
}
PLUGIN_PREFIXES = ("length_penalty/", "length_schedule/", "score_centering/", "luspo/")
#: one recipe's limit (a step on the real model takes about a minute)
TIMEOUT_S = 900


def model_folder(model: str) -> Path:
    if model == "smollm2":
        from trl_length_plugin.embedded.real_model import real_model_dir

        return real_model_dir("smollm2-135m-instruct")
    if model == "embedded":
        from trl_length_plugin.embedded import embedded_model_dir

        return embedded_model_dir()
    from trl_length_plugin.embedded.model import local_model_folder

    return local_model_folder(model)


def completion_length(recipe: dict) -> int:
    """48 tokens, or more where the recipe's length limits need it: the overlong maximum within the completion,
    the coefficient's floor below it (docs/reference/length-penalties.md §2.1)."""
    block = (recipe.get("length_penalty") or {}).get("default") or {}
    needs = [int(SIZES["max_completion_length"]), int(block.get("overlong_max_length") or 0)]
    needs.append(int(recipe.get("length_penalty_min_tokens") or 0) + 16)
    return max(needs)


def recipe_flags(recipe: dict, model: Path, data: Path, steps: int, output: Path) -> list[str]:
    """The flags that turn ``recipe`` into a CPU run of ``steps`` steps on ``model``."""
    values = {
        "model_name_or_path": str(model),
        **CPU,
        **SIZES,
        "max_steps": str(steps),
        "output_dir": str(output),
    }
    values["max_completion_length"] = str(completion_length(recipe))
    if recipe.get("dataset_name") != "embedded":
        values["dataset_name"] = str(data)
    if recipe.get("use_vllm"):
        values.update(VLLM_CPU)
    return [item for key, value in values.items() for item in (f"--{key}", value)]


def _number(value):
    """A logged value as a float where it is one (transformers prints some as strings: ``'0.1234'``)."""
    try:
        return float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else value
    except ValueError:
        return value


def log_rows(stdout: str) -> list[dict]:
    """The Trainer's printed log rows (``{'loss': ..., ...}``), numbers as floats."""
    rows = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                rows.append({key: _number(value) for key, value in ast.literal_eval(line).items()})
            except (ValueError, SyntaxError, AttributeError):
                continue
    return rows


def problems(done: subprocess.CompletedProcess, output: Path, recipe: dict) -> list[str]:
    """What keeps a finished run from passing: a recipe that shapes or centers must log the plugin's metrics, one
    with ``luspo`` its settings line (TRL computes LUSPO's loss, the plugin adds no metric); every logged number
    finite."""
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip()][-1:] or ["no output"]
        return [f"exit code {done.returncode}: {last[0]}"]
    found = []
    rows = [row for row in log_rows(done.stdout) if "loss" in row]
    if not rows:
        return ["no log row"]
    plugin = {k: v for row in rows for k, v in row.items() if k.startswith(PLUGIN_PREFIXES)}
    if any(str(key).startswith(KEY_FAMILIES) for key in recipe) and not plugin:
        found.append("no plugin metric in the log rows")
    if recipe.get("luspo") and "LUSPO (docs/reference/luspo.md §4)" not in done.stderr:
        found.append("no LUSPO settings line")
    numbers = {k: v for row in rows for k, v in row.items() if isinstance(v, float)}
    found += [f"{k}={v}" for k, v in numbers.items() if not math.isfinite(v)]
    if not (output / "README.md").is_file():
        found.append("no model card")
    if recipe.get("score_centering"):
        masses = [row["score_centering/head_mass"] for row in rows if "score_centering/head_mass" in row]
        if not masses or not all(0 < m <= 1.0001 for m in masses):
            found.append(f"score_centering/head_mass {masses}")
    return found


def profile_command(name: str, model: Path, root: Path) -> tuple[list[str], Path]:
    """``trl-length profile`` as the recipe's header runs it, on ``model`` and a few embedded prompts, and the
    prompts folder it writes (the recipe's dataset)."""
    folder = root / f"{name}-profile"
    command = [
        sys.executable,
        "-m",
        "trl_length_plugin.tools.commands",
        "profile",
        str(folder / "rollouts.jsonl"),
    ]
    command += ["--generate", "embedded", "--model", str(model), "--samples", SIZES["num_generations"]]
    command += [
        "--prompts",
        "embedded",
        "--dataset-size",
        SIZES["dataset_size"],
        "--output",
        str(folder / "prompts"),
    ]
    return command + list(NEEDS_PROFILES[name]), folder / "prompts"


def run_recipe(name: str, path: Path, model: Path, data: Path, steps: int, root: Path) -> tuple[bool, str]:
    recipe = yaml.safe_load(path.read_text())
    output = root / name
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    commands = []
    if name in NEEDS_PROFILES:
        profile, data = profile_command(name, model, root)
        recipe["dataset_name"] = str(data)
        commands.append(profile)
    train = [sys.executable, "-m", "trl_length_plugin.trl_integration.cli", "--config", f"recipe:{name}"]
    commands.append(train + recipe_flags(recipe, model, data, steps, output))
    started = time.monotonic()
    stages = (["profile: "] if len(commands) > 1 else []) + [""]
    for stage, command in zip(stages, commands, strict=True):
        try:
            done = run_session(command, TIMEOUT_S, env=env, cwd=root)
        except subprocess.TimeoutExpired:  # the trainer's whole session was ended
            seconds = time.monotonic() - started
            return False, f"{name:<28} {seconds:6.0f} s  FAIL: {stage}timed out after {TIMEOUT_S} s"
        if done.returncode != 0:
            break
    seconds = time.monotonic() - started
    found = [stage + problem for problem in problems(done, output, recipe)]
    verdict = "PASS" if not found else "FAIL: " + "; ".join(found)
    rows = [row for row in log_rows(done.stdout) if "loss" in row]
    acted = acted_lines(rows, float(recipe.get("length_penalty_min_tokens") or 0))
    return not found, "\n    ".join([f"{name:<28} {seconds:6.0f} s  {verdict}", *acted])


def main(argv: list[str] | None = None) -> None:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("names", nargs="*", help="recipes (default: every shipped TRL recipe)")
    parser.add_argument(
        "--model", default="smollm2", help="smollm2 (default), embedded or a local model folder"
    )
    parser.add_argument("--steps", type=int, default=1, help="training steps of each recipe (default 1)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.steps < 1:
        parser.error(f"--steps: at least 1, got {args.steps}")
    recipes = trl_recipes()
    unknown = [name for name in args.names if name not in recipes]
    if unknown:
        parser.error(f"no recipe named {', '.join(unknown)}; `trl-length recipes` lists them")
    names = args.names or list(recipes)
    try:
        model = model_folder(args.model)
    except (ImportError, ValueError, OSError) as err:
        parser.error(f"--model: {err}")
    from trl_length_plugin.trl_integration.tasks import gsm8k_sample

    failed = 0
    with tempfile.TemporaryDirectory(prefix="recipe-smoke-") as folder:
        root = Path(folder)
        data = root / "gsm8k_sample.jsonl"
        data.write_text("".join(json.dumps(row) + "\n" for row in gsm8k_sample(64)))
        print(f"[{PROG}] {len(names)} recipe(s) on {model}, {args.steps} step(s) each", flush=True)
        interrupt_on_ending_signals()
        try:
            for name in names:
                passed, line = run_recipe(name, recipes[name], model, data, args.steps, root)
                failed += not passed
                print(line, flush=True)
        except KeyboardInterrupt:  # the running recipe's session is ended (run_session)
            print(f"{PROG}: interrupted", file=sys.stderr)
            raise SystemExit(1) from None
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
