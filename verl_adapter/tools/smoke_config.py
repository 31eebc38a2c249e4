"""What ``trl-length verl-smoke`` replaces for a CPU run (docs/verl.md, "Try your config on a laptop"): the
model, the data, batch sizes, lengths, resources and the CPU settings, each said on the command's first line;
every algorithm, loss and plugin key of the user's configuration is kept."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

#: rows of the parquet written from the embedded task (train and validation)
TRAIN_ROWS, VAL_ROWS = 64, 8
#: the sizes a CPU run uses (a group keeps the user's rollout.n)
PROMPTS_PER_STEP = 4
MAX_PROMPT_LENGTH, MAX_RESPONSE_LENGTH = 64, 48


class SmokeConfigError(Exception):
    """A bad command line or configuration (exit code 2)."""


@dataclass
class Replaced:
    """The overrides a CPU run adds, and a note per group of keys they replace (the command's first line)."""

    overrides: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def set(self, key: str, value, why: str | None = None) -> None:
        self.overrides.append(f"++{key}={value}")
        if why:
            self.notes.append(f"{key}={value} ({why})")


def user_value(overrides: list[str], key: str) -> str | None:
    """The last value ``overrides`` give ``key`` (with or without ``+``/``++``)."""
    found = None
    for override in overrides:
        name, sep, value = override.lstrip("+~").partition("=")
        if sep and name == key:
            found = value.strip("'\"")
    return found


def _data_files_exist(overrides: list[str]) -> bool:
    files = [user_value(overrides, "data.train_files"), user_value(overrides, "data.val_files")]
    return all(f and Path(os.path.expanduser(f)).is_file() for f in files)


#: the data a run writes when it keeps none of the user's: the embedded reasoning task for the embedded model;
#: for a real model, the real chat model's arithmetic task (a real tokenizer reads it, and the model answers
#: some of it, so a group filter finds mixed groups; the embedded task's format it never answers)
SMOKE_TASKS = {"embedded": "embedded/reasoning", "real": "real/arithmetic"}


def _task_rows(task: str) -> tuple:
    """The task's training and held-out problems (``prompt`` and ``answer``; the embedded ones a ``level``)."""
    if task == "embedded":
        from trl_length_plugin.embedded.reasoning import held_out_dataset, training_dataset

        return training_dataset(seed=0, size=TRAIN_ROWS), held_out_dataset().select(range(VAL_ROWS))
    from trl_length_plugin.embedded.real_task import real_held_out, real_training_set

    return real_training_set(0).select(range(TRAIN_ROWS)), real_held_out().select(range(VAL_ROWS))


def write_smoke_data(folder: Path, task: str) -> tuple[Path, Path]:
    """train.parquet and val.parquet of ``task`` (:data:`SMOKE_TASKS`) in verl's row layout: ``prompt`` (a chat),
    ``data_source``, ``reward_model.ground_truth``, ``extra_info.index``."""
    import datasets

    datasets.disable_progress_bars()

    def rows(dataset, split):
        return datasets.Dataset.from_list(
            [
                {
                    "prompt": row["prompt"],
                    "data_source": SMOKE_TASKS[task],
                    "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": row["answer"]},
                    # a target length per prompt, for a target_length term (docs/reference/length-penalties.md §2.20)
                    "extra_info": {
                        "index": i,
                        "split": split,
                        "level": row.get("level", 3),
                        "target_length": 8 + 8 * row.get("level", 3),
                    },
                }
                for i, row in enumerate(dataset)
            ]
        )

    folder.mkdir(parents=True, exist_ok=True)
    train, val = folder / "train.parquet", folder / "val.parquet"
    training, held_out = _task_rows(task)
    rows(training, "train").to_parquet(str(train))
    rows(held_out, "test").to_parquet(str(val))
    return train, val


def model_path(model: str) -> Path:
    """``embedded``: the pinned warm model of the embedded reasoning task; ``smollm2``: the real chat model a
    package ships (docs/embedded.md); else a local folder."""
    if model == "embedded":
        from trl_length_plugin.embedded import embedded_model_dir

        try:
            return embedded_model_dir(warm_start=True, task="reasoning")
        except OSError as err:
            raise SmokeConfigError(f"--model embedded: {err}") from None
    if model == "smollm2":
        from trl_length_plugin.embedded import real_model_dir

        try:
            return real_model_dir("smollm2-135m-instruct")
        except (ImportError, OSError) as err:
            raise SmokeConfigError(f"--model smollm2: {err}") from None
    from trl_length_plugin.embedded.model import local_model_folder

    try:
        return local_model_folder(model)
    except ValueError as err:
        raise SmokeConfigError(f"--model: {err}; use embedded") from None


def response_length(user: list[str]) -> int:
    """``MAX_RESPONSE_LENGTH``, or more where the user's length limits need it: a length limit must fit in the
    response (the coefficient's floor below it, the overlong maximum within it)."""
    needs = [MAX_RESPONSE_LENGTH]
    for key, margin in (("length_penalty_min_tokens", 16), ("length_penalty.default.overlong_max_length", 0)):
        value = user_value(user, key)
        if value is not None and value.isdigit():
            needs.append(int(value) + margin)
    return max(needs)


def _absolute(value: str) -> Path:
    return Path(os.path.expanduser(value)).resolve()


def weight_bytes(model: Path) -> tuple[int, int]:
    """The bytes of the model's weights and of its largest weight, in float32 (the dtype verl syncs here), from
    its safetensors headers; (0, 0) without safetensors files."""
    from trl_length_plugin.embedded.model import safetensors_tensors

    sizes = [0]
    for file in model.glob("*.safetensors"):
        sizes += [4 * math.prod(t["shape"]) for t in safetensors_tensors(file).values()]
    return sum(sizes), max(sizes)


def weight_bucket_megabytes(model: Path) -> int:
    """verl's weight-sync bucket (in ``/dev/shm``): 16 MB, or the model's largest weight where that is larger
    (verl refuses a weight larger than its bucket); for a model with tied embeddings, room for every weight at
    once. vLLM 0.31 loads each bucket on its own and refuses a tied head (``lm_head.weight``, sent beside the
    embedding it is tied to) that arrives in another bucket than its embedding, as a real model's large
    embedding makes happen; safetensors keep a tied head once, so it is counted again as at most the largest
    weight. Plus 1 MiB for alignment."""
    total, largest = weight_bytes(model)
    config = model / "config.json"
    tied = json.loads(config.read_text()).get("tie_word_embeddings", True) if config.is_file() else False
    needed = total + largest if tied else largest
    return max(16, math.ceil(needed / 2**20) + 1 if needed else 0)


def cpu_overrides(user: list[str], steps: int, model: Path, run_dir: Path, own_data: bool = True) -> Replaced:
    """What a CPU run of ``user``'s configuration adds after it (later overrides win). ``own_data`` (a model other
    than the embedded one): keep the user's data files where they exist locally, else write the real task's
    (:data:`SMOKE_TASKS`); without it, the embedded task's, the only one the embedded tokenizer knows. A local
    reward function file is always kept. Kept paths are made absolute (verl runs in ``run_dir``)."""
    out = Replaced()
    out.set("actor_rollout_ref.model.path", model, "the model")
    user_reward = user_value(user, "reward.custom_reward_function.path")
    own_reward = bool(user_reward) and _absolute(user_reward).is_file()
    if own_reward:
        out.set("reward.custom_reward_function.path", _absolute(user_reward))
    if own_data and _data_files_exist(user):
        for key in ("data.train_files", "data.val_files"):
            out.set(key, _absolute(user_value(user, key)))
    else:
        task = "real" if own_data else "embedded"
        train, val = write_smoke_data(run_dir / "data", task)
        out.set("data.train_files", train, f"data: the {'real chat model' if own_data else 'embedded'} task")
        out.set("data.val_files", val)
        if not own_reward:
            reward = Path(__file__).with_name("embedded_reward.py")
            out.set("reward.custom_reward_function.path", reward, "the task's reward")
            out.set("reward.custom_reward_function.name", "compute_score")
    out.set("data.train_batch_size", PROMPTS_PER_STEP, "batch sizes")
    out.set("data.max_prompt_length", MAX_PROMPT_LENGTH, "lengths")
    out.set("data.max_response_length", response_length(user))
    out.set("data.dataloader_num_workers", 0)
    out.set("actor_rollout_ref.actor.ppo_mini_batch_size", PROMPTS_PER_STEP)
    for key in (
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    ):
        out.set(key, 16)
    # the CPU settings (docs/verl.md, "Try your config on a laptop")
    out.set("trainer.device", "cpu", "resources: one CPU trainer process, CPU settings")
    out.set("trainer.n_gpus_per_node", 1)
    out.set("trainer.nnodes", 1)
    out.set("ray_kwargs.ray_init.num_cpus", 8)
    out.set("ray_kwargs.ray_init.num_gpus", 1)
    out.set("ray_kwargs.ray_init.include_dashboard", False)
    out.set("actor_rollout_ref.actor.strategy", "fsdp2")
    out.set("actor_rollout_ref.ref.strategy", "fsdp2")
    out.set("actor_rollout_ref.model.use_remove_padding", False)
    out.set("actor_rollout_ref.model.enable_gradient_checkpointing", False)
    out.set("actor_rollout_ref.model.use_fused_kernels", False)
    out.set("actor_rollout_ref.model.override_config.attn_implementation", "sdpa")
    out.set("actor_rollout_ref.rollout.name", "vllm")
    out.set("actor_rollout_ref.rollout.dtype", "float32")
    out.set("actor_rollout_ref.rollout.enforce_eager", True)
    out.set("actor_rollout_ref.rollout.free_cache_engine", False)
    out.set("actor_rollout_ref.rollout.enable_sleep_mode", False)
    out.set("actor_rollout_ref.rollout.tensor_model_parallel_size", 1)
    out.set(
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
        weight_bucket_megabytes(model),
    )
    out.set("actor_rollout_ref.rollout.agent.num_workers", 1)
    out.set("reward.num_workers", 1)
    out.set("transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    # N steps, nothing saved or validated, metrics to a file this command reads
    out.set("trainer.total_training_steps", steps, f"{steps} steps, no validation or checkpoint")
    out.set("trainer.total_epochs", 1000)
    out.set("trainer.test_freq", -1)
    out.set("trainer.val_before_train", False)
    out.set("trainer.save_freq", -1)
    out.set("trainer.logger", "[console,file]")
    out.set("trainer.default_local_dir", run_dir / "checkpoints")
    return out
