"""The tasks the demo and the grids train on (docs/embedded.md, docs/efficacy.md): each embedded task's GRPO
settings, training and held-out problems and warm model (``Task``), and how a model's completions of the held-out
problems are sampled and read (``sample``, ``held_out_figures``). The real chat model's tasks are in
``real_task``; ``trl_length_plugin.tools.demo`` and ``bench/bench_efficacy.py`` train them."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trl_length_plugin.embedded import reasoning
from trl_length_plugin.embedded.task import span_tokens

#: GRPO settings of the demo and of every arm of bench/bench_efficacy.py: 4 prompts x 8 completions a step
TRAINING = dict(
    per_device_train_batch_size=32,
    num_generations=8,
    max_completion_length=48,
    temperature=1.0,
    learning_rate=1e-4,
    lr_scheduler_type="constant",
)
STEPS = 60
#: the held-out problems: the distinct questions of this draw, removed from every training set
HELD_OUT_DRAW, HELD_OUT_SEED = 64, 10_000
#: completions sampled per held-out problem at the training temperature
EVAL_SAMPLES = 64
#: the reasoning task's GRPO settings: ``TRAINING`` with room for its longest warm-start targets (57 tokens,
#: docs/embedded.md) and batches in the dataset's order, so every step holds one problem of each level
REASONING_TRAINING = {**TRAINING, "max_completion_length": 64, "shuffle_dataset": False}
#: the reasoning task's training problems per seed: 128 steps of 4 prompts (a longer run starts them again)
REASONING_TRAINING_SIZE = 512
#: the overthinking task's GRPO settings: the reasoning task's with room for its longest warm-start targets (about
#: 100 tokens, docs/embedded.md "The overthinking task"), so truncation stays rare
OVERTHINKING_TRAINING = {**REASONING_TRAINING, "max_completion_length": 128}


@dataclass(frozen=True)
class Task:
    """A task to train on: the warm model of ``name`` (``embedded_model_dir(task=name)``, or the packaged
    ``real_model``), its GRPO ``training`` settings, its ``held_out`` problems (``eval_samples`` completions
    each) and its ``training_set(seed)``. The embedded tasks score with ``correctness_reward``
    (docs/embedded.md), another task with its ``reward``. ``warm_seed``: the one warm model every seed's run starts
    from (its seed), or None for a warm model per seed. ``lora``: GRPO trains a LoRA adapter of this rank on every
    linear layer (alpha twice the rank) instead of the full weights (0). The task's best trade-off of docs/efficacy.md
    (``best_name``, ``best_keys``: bench/bench_efficacy.py names and keys it the same way), its best peer arm
    and the grid summary committed beside the doc, from which the demo prints their rows."""

    name: str
    training: dict
    held_out: Callable[[], object]
    training_set: Callable[[int], object]
    best_name: str
    best_keys: dict
    best_peer: str
    grid_summary: str
    warm_seed: int | None = None
    real_model: str = ""
    reward: Callable | None = None
    eval_samples: int = EVAL_SAMPLES
    report: Callable = reasoning.step_report
    lora: int = 0

    @property
    def max_length(self) -> int:
        return self.training["max_completion_length"]

    @property
    def correctness(self) -> Callable:
        """The task's correctness reward (TRL's reward-function signature)."""
        from trl_length_plugin.embedded import correctness_reward

        return self.reward or correctness_reward

    @property
    def accuracy_key(self) -> str:
        """The logged mean of the correctness reward (``ACCURACY_KEY`` on the embedded tasks)."""
        return f"rewards/{self.correctness.__name__}/mean"

    def peft_config(self):
        """The LoRA adapter GRPO trains (TRL's ``peft_config``), or None: the full weights."""
        if not self.lora:
            return None
        from trl_length_plugin._optional import require

        peft = require("peft", "trl")
        return peft.LoraConfig(
            r=self.lora, lora_alpha=2 * self.lora, target_modules="all-linear", task_type="CAUSAL_LM"
        )

    def model_dir(self, seed: int) -> Path:
        from trl_length_plugin.embedded import embedded_model_dir, real_model_dir

        if self.real_model:
            return real_model_dir(self.real_model)
        warm_seed = seed if self.warm_seed is None else self.warm_seed
        return embedded_model_dir(warm_start=True, seed=warm_seed, task=self.name)


def question(row: dict) -> str:
    return row["prompt"][0]["content"]


def distinct_problems(dataset):
    """The first row of each distinct question of ``dataset``."""
    first: dict[str, int] = {}
    for i, row in enumerate(dataset):
        first.setdefault(question(row), i)
    return dataset.select(list(first.values()))


def held_out_dataset():
    """One row per held-out problem, the same for every seed and arm."""
    from trl_length_plugin.embedded import make_task_dataset

    return distinct_problems(make_task_dataset(HELD_OUT_DRAW, seed=HELD_OUT_SEED))


def training_dataset(seed: int, size: int = 2048):
    """The task's problems drawn with ``seed``, held-out problems removed."""
    from trl_length_plugin.embedded import make_task_dataset

    held_out = {prompt[0]["content"] for prompt in held_out_dataset()["prompt"]}
    return make_task_dataset(size, seed=seed).filter(lambda row: question(row) not in held_out)


def reasoning_training_dataset(seed: int):
    """The reasoning task's training problems of ``seed``, in level blocks (docs/embedded.md)."""
    return reasoning.training_dataset(seed, size=REASONING_TRAINING_SIZE)


#: the best trade-off of ours on the arithmetic and reasoning grids (docs/efficacy.md): group-relative 1.0
GROUP_RELATIVE = dict(length_penalty={"default": {"group_total_length_penalty_coeff": 1.0}})
#: the best trade-off of ours on the overthinking grid (docs/efficacy.md): the shortest bonus and the longest
#: penalty at 0.5
SHORTEST_LONGEST = dict(length_penalty={"default": {"total_bonus": 0.5, "longest_total_penalty": 0.5}})
ARITHMETIC = Task(
    "arithmetic",
    TRAINING,
    held_out_dataset,
    training_dataset,
    best_name="group-relative 1.0",
    best_keys=GROUP_RELATIVE,
    best_peer="per-token penalty 0.01",
    grid_summary="efficacy_peers_runs.json",
)
#: the reasoning task's warm model costs about 9 min of CPU to build, so every seed starts from seed 0's; a
#: seed still draws its own training problems and samples (docs/efficacy.md, "Setup")
REASONING = Task(
    "reasoning",
    REASONING_TRAINING,
    reasoning.held_out_dataset,
    reasoning_training_dataset,
    best_name="group-relative 1.0",
    best_keys=GROUP_RELATIVE,
    best_peer="Kimi k1.5 length reward 1.0",
    grid_summary="efficacy_reasoning10_runs.json",
    warm_seed=0,
)
#: the reasoning task's problems under the overthinking warm start (docs/embedded.md, "The overthinking task"):
#: one warm model (seed 0's) for every seed, as on the reasoning task
OVERTHINKING = Task(
    "overthinking",
    OVERTHINKING_TRAINING,
    reasoning.held_out_dataset,
    reasoning_training_dataset,
    best_name="shortest bonus / longest penalty 0.5",
    best_keys=SHORTEST_LONGEST,
    best_peer="per-token penalty 0.005",
    grid_summary="efficacy_overthinking_runs.json",
    warm_seed=0,
)
TASKS = {task.name: task for task in (ARITHMETIC, REASONING, OVERTHINKING)}


def sampling_config(
    tokenizer, samples: int = 1, max_new_tokens: int | None = None, temperature: float | None = None
):
    """The sampling settings of training (TRL's defaults at ``TRAINING``'s temperature and length, or
    ``temperature`` and ``max_new_tokens``), ``samples`` completions per prompt."""
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=max_new_tokens or TRAINING["max_completion_length"],
        do_sample=True,
        temperature=temperature or TRAINING["temperature"],
        top_p=1.0,
        top_k=0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        num_return_sequences=samples,
    )


def sample(
    model,
    tokenizer,
    dataset,
    samples: int,
    seed: int,
    max_new_tokens: int | None = None,
    task: Task | None = None,
) -> list[dict]:
    """``samples`` completions per row of ``dataset`` with the training sampling settings (of ``task``, default
    ``TRAINING``'s), reproducible by ``seed``: one dict per completion with its row index, text, token count
    (up to and including EOS, as TRL counts ``completions/mean_length``) and correctness (the task's reward)."""
    import torch

    from trl_length_plugin.embedded import correctness_reward

    torch.manual_seed(seed)
    if tokenizer.pad_token is None:  # a model folder of one's own may have none (TRL sets it the same way)
        tokenizer.pad_token = tokenizer.eos_token
    side, tokenizer.padding_side = tokenizer.padding_side, "left"  # prompts end where generation starts
    temperature = task.training["temperature"] if task else None
    config = sampling_config(tokenizer, samples, max_new_tokens, temperature)
    reward = task.correctness if task else correctness_reward
    model.eval()
    results = []
    answers = dataset["answer"]
    step = max(1, 512 // samples)  # about 512 sequences a batch
    for start in range(0, len(dataset), step):
        rows = dataset.select(range(start, min(start + step, len(dataset))))
        prompts = [
            tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            for prompt in rows["prompt"]
        ]
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            output = model.generate(**encoded, generation_config=config)
        for k, ids in enumerate(output[:, encoded["input_ids"].shape[1] :].tolist()):
            length = ids.index(config.eos_token_id) + 1 if config.eos_token_id in ids else len(ids)
            text = tokenizer.decode(ids[:length], skip_special_tokens=True)
            row = start + k // samples
            (correct,) = reward([text], [answers[row]])
            results.append(dict(row=row, text=text, tokens=length, correct=correct))
    tokenizer.padding_side = side
    return results


def held_out_figures(completions: list[dict], dataset, tokenizer=None, report=reasoning.step_report) -> dict:
    """The mean ``length`` and ``accuracy`` of ``sample``'s completions of ``dataset``; where its rows have a
    ``level`` (the reasoning tasks, the word problems), also ``levels``: per level, its samples, mean length and
    accuracy, the fraction that skips necessary steps and the mean redundant clauses (``report``: the task's
    reader, ``step_report``), and with the ``tokenizer`` the ``redundant_share`` of the tokens (over all levels
    too)."""
    figures = dict(
        length=statistics.fmean(c["tokens"] for c in completions),
        accuracy=statistics.fmean(c["correct"] for c in completions),
    )
    if "level" in dataset.column_names:
        figures["levels"] = level_figures(completions, dataset, tokenizer, report)
        if tokenizer is not None:
            redundant = sum(level["redundant_tokens"] for level in figures["levels"])
            figures["redundant_share"] = redundant / sum(c["tokens"] for c in completions)
    return figures


def level_figures(
    completions: list[dict], dataset, tokenizer=None, report=reasoning.step_report
) -> list[dict]:
    problems = dataset.select_columns(["prompt", "level"]).to_list()
    by_level: dict[int, list] = {}
    for c in completions:
        problem = problems[c["row"]]
        by_level.setdefault(problem["level"], []).append((c, report(c["text"], question(problem))))
    figures = []
    for level, rows in sorted(by_level.items()):
        figure = dict(
            level=level,
            samples=len(rows),
            length=statistics.fmean(c["tokens"] for c, _ in rows),
            accuracy=statistics.fmean(c["correct"] for c, _ in rows),
            skipped=statistics.fmean(read.skipped for _, read in rows),
            redundant=statistics.fmean(read.redundant for _, read in rows),
        )
        if tokenizer is not None:
            redundant = sum(span_tokens(c["text"].strip(), read.spans, tokenizer) for c, read in rows)
            figure.update(
                redundant_tokens=redundant, redundant_share=redundant / sum(c["tokens"] for c, _ in rows)
            )
        figures.append(figure)
    return figures
