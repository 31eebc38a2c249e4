"""The real chat model's task of docs/efficacy.md, "On a real chat model": one-step arithmetic in words on
SmolLM2-135M-Instruct, the answer checked as the last number of the completion, and the grids' tasks (the
embedded ones and this one). ``bench/bench_efficacy.py --task real`` trains it; the demo does not."""

from __future__ import annotations

from trl_length_plugin.embedded.real_model import OVERTHINKING
from trl_length_plugin.embedded.task import last_number_score
from trl_length_plugin.embedded.tasks import (
    GROUP_RELATIVE,
    HELD_OUT_SEED,
    TASKS,
    TRAINING,
    Task,
    distinct_problems,
    question,
)
from trl_length_plugin.embedded.word_problems import (
    held_out_word_problems,
    solution_report,
    word_problem_training_set,
)

#: the real chat model's GRPO settings (docs/efficacy.md, "On a real chat model"): 2 prompts x 8 completions a
#: step on two CPU cores, sampled at 0.7, where the model has a correctness signal (1.0 has little)
REAL_TRAINING = {**TRAINING, "per_device_train_batch_size": 16, "temperature": 0.7, "learning_rate": 1e-5}
#: the real task's held-out problems (distinct) and completions sampled per problem
REAL_HELD_OUT, REAL_EVAL_SAMPLES = 32, 8


def word_arithmetic(n: int, seed: int):
    """``n`` one-step problems written "What is a + b?" or "What is a - b?" (operands 2-20, no negative results) with
    their ``answer``, drawn with ``seed``: where the real chat model has some correctness signal."""
    import random

    import datasets

    rng = random.Random(seed)
    prompts, answers = [], []
    for _ in range(n):
        a, b, op = rng.randint(2, 20), rng.randint(2, 20), rng.choice("+-")
        if op == "-" and b > a:
            a, b = b, a
        prompts.append([{"role": "user", "content": f"What is {a} {op} {b}?"}])
        answers.append(str(a + b if op == "+" else a - b))
    return datasets.Dataset.from_dict({"prompt": prompts, "answer": answers})


def real_held_out():
    """The real task's held-out problems: the first ``REAL_HELD_OUT`` distinct ones of their draw."""
    problems = distinct_problems(word_arithmetic(4 * REAL_HELD_OUT, HELD_OUT_SEED))
    return problems.select(range(REAL_HELD_OUT))


def real_training_set(seed: int):
    """The real task's training problems of ``seed``, held-out problems removed."""
    held_out = set(map(question, real_held_out()))
    return word_arithmetic(512, seed).filter(lambda row: question(row) not in held_out)


def last_number_correctness(completions: list, answer: list[str], **kwargs) -> list[float]:
    """The real task's reward in TRL's form: 1.0 when the completion's last number is the answer."""
    return [last_number_score(c, a) for c, a in zip(completions, answer, strict=True)]


#: one-step arithmetic on SmolLM2-135M-Instruct (docs/efficacy.md, "On a real chat model"): every seed starts
#: from the same pretrained model; the answer is the last number of the completion. Its best arm and best peer
#: are the reasoning grid's, the two arms its grid compares with plain GRPO (the demo does not run this task)
REAL = Task(
    "real",
    REAL_TRAINING,
    real_held_out,
    real_training_set,
    best_name="group-relative 1.0",
    best_keys=GROUP_RELATIVE,
    best_peer="Kimi k1.5 length reward 1.0",
    grid_summary="efficacy_real_runs.json",
    warm_seed=0,
    real_model="smollm2-135m-instruct",
    reward=last_number_correctness,
    eval_samples=REAL_EVAL_SAMPLES,
)
#: the real model's overthinking task (docs/embedded.md, "The real model's overthinking task"): one- and two-step
#: word problems on SmolLM2-135M-Instruct after the supervised pass on verbose solutions; the real task's batch
#: and sampling with room for its longest solutions (87 tokens), so truncation stays rare, 4 held-out samples a
#: problem (its completions cost about three times the real task's), and the regime that holds: GRPO trains a
#: LoRA adapter (rank 16) at lr 3e-5 (the full weights at 2 prompts a step lost 10 points of accuracy)
REAL_OVERTHINKING = Task(
    "real-overthinking",
    {**REAL_TRAINING, "max_completion_length": 96, "learning_rate": 3e-5},
    held_out_word_problems,
    word_problem_training_set,
    # its grid's best arm of ours and best peer by the best-trade-off rule (docs/efficacy.md; a tie with the
    # shortest bonus / longest penalty 0.5 by the intervals): Kimi's reward, as short, loses more than 2 points
    best_name="pass-rate penalty 1.0",
    best_keys=dict(length_penalty={"default": {"pass_rate_length_penalty_weight": 1.0}}),
    best_peer="TRL soft overlong buffer L/4",
    grid_summary="efficacy_real_overthinking_runs.json",
    warm_seed=0,
    real_model=OVERTHINKING,
    reward=last_number_correctness,
    eval_samples=4,
    report=solution_report,
    lora=16,
)
#: every task of bench/bench_efficacy.py's grids: the embedded ones and the real chat model's
GRID_TASKS = {**TASKS, REAL.name: REAL, REAL_OVERTHINKING.name: REAL_OVERTHINKING}
