"""The embedded reasoning task: multi-term arithmetic whose intermediate results the reasoning must write.

A problem of level k has k operations on distinct one-digit numbers (``What is 4+5-2-1?``: level 3) and
needs k steps, one per operation: ``<think>4+5=9, 9-2=7, 7-1=6</think>6`` (running totals stay in 0-9, so
every step is a one-digit fact). The warm start is taught completions that sometimes skip steps (they jump
to an answer with ``so …``, a guess near the truth) and sometimes overthink (re-checks ``check 9-2=7`` and
repeated steps, more on easy problems than on hard ones): a length control has necessary steps to keep and
redundant ones to remove (docs/embedded.md).
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from trl_length_plugin.embedded.task import REASONING_CLOSE, REASONING_OPEN, completion_text, span_tokens

#: difficulty levels: the number of operations, so of necessary steps (at most MAX_LEVEL)
LEVELS = (1, 2, 3, 4)
MAX_LEVEL = 6
MAX_VALUE = 9
#: warm-start targets: the chance a completion jumps to the answer before its last step, and the
#: largest error of that jump's guess (uniform in -GUESS_ERROR..GUESS_ERROR, clipped to 0-MAX_VALUE)
SKIP_PROB = 0.3
GUESS_ERROR = 2
#: warm-start targets: the chance of a redundant clause after a written step, by level (another one
#: follows with the same chance, at most MAX_REDUNDANT a completion); half re-check the step, half repeat it
REDUNDANCY_PROB = {1: 0.6, 2: 0.4, 3: 0.25, 4: 0.15}
MAX_REDUNDANT = 3
#: the markers of redundant clauses: a re-check of a step, and the overthinking task's recap of the steps and
#: "wait" restatement of the whole problem (``overthinking``)
CHECK, RECAP, WAIT = "check ", "recap ", "wait "
_STEP = re.compile(r"(\d+)([+-])(\d+)=(-?\d+)")
_RESTATEMENT = re.compile(r"\d+(?:[+-]\d+)+=-?\d+")


@dataclass(frozen=True)
class Step:
    """One operation of a problem: ``left op operand = result``."""

    left: int
    op: str
    operand: int
    result: int

    def text(self) -> str:
        return f"{self.left}{self.op}{self.operand}={self.result}"


def make_steps(rng: random.Random, level: int) -> list[Step]:
    """The ``level`` operations of a random problem: the question's numbers distinct (so each one marks its
    place in the question), every running total within 0-``MAX_VALUE``."""
    while True:
        total = rng.randint(1, MAX_VALUE)
        used, steps = {total}, []
        for _ in range(level):
            choices = [
                (op, d)
                for op in "+-"
                for d in range(1, MAX_VALUE + 1)
                if d not in used and 0 <= (total + d if op == "+" else total - d) <= MAX_VALUE
            ]
            if not choices:
                break
            op, operand = rng.choice(choices)
            result = total + operand if op == "+" else total - operand
            steps.append(Step(total, op, operand, result))
            used.add(operand)
            total = result
        if len(steps) == level:
            return steps


def question_of(steps: Sequence[Step]) -> str:
    return f"What is {steps[0].left}" + "".join(f"{s.op}{s.operand}" for s in steps) + "?"


def necessary_steps(question: str) -> list[Step]:
    """The steps a question needs, in order (one per operation); ValueError for a question of another form.
    Text after the question and a space (an instruction such as a target length's) is ignored."""
    match = re.fullmatch(r"What is (\d+)((?:[+-]\d+)+)\?(?: .*)?", question, flags=re.DOTALL)
    if match is None:
        raise ValueError(f"question: not a reasoning-task question: {question!r}")
    total, steps = int(match[1]), []
    for op, operand in re.findall(r"([+-])(\d+)", match[2]):
        result = total + int(operand) if op == "+" else total - int(operand)
        steps.append(Step(total, op, int(operand), result))
        total = result
    return steps


def make_completion(steps: Sequence[Step], rng: random.Random) -> str:
    """A warm-start target: every step (with up to ``MAX_REDUNDANT`` redundant clauses), or, with chance
    ``SKIP_PROB``, the first few steps then a jump ``so X`` to a guessed answer."""
    level, answer = len(steps), steps[-1].result
    written = rng.randrange(level) if rng.random() < SKIP_PROB else level
    clauses, redundant = [], 0
    for step in steps[:written]:
        clauses.append(step.text())
        while redundant < MAX_REDUNDANT and rng.random() < REDUNDANCY_PROB[min(level, max(REDUNDANCY_PROB))]:
            clauses.append(CHECK + step.text() if rng.random() < 0.5 else step.text())
            redundant += 1
    if written < level:
        answer = min(MAX_VALUE, max(0, answer + rng.randint(-GUESS_ERROR, GUESS_ERROR)))
        clauses.append(f"so {answer}")
    return f"{REASONING_OPEN}{', '.join(clauses)}{REASONING_CLOSE}{answer}"


def shortest_completion(question: str) -> str:
    """The shortest correct completion that writes every necessary step."""
    steps = necessary_steps(question)
    return f"{REASONING_OPEN}{', '.join(s.text() for s in steps)}{REASONING_CLOSE}{steps[-1].result}"


def draw_problem(rng: random.Random, levels: Sequence[int] = LEVELS) -> tuple[str, str]:
    """A warm-start example: a problem of a random level and its target completion."""
    steps = make_steps(rng, rng.choice(levels))
    return question_of(steps), make_completion(steps, rng)


def make_reasoning_dataset(
    n: int,
    seed: int = 0,
    levels: Sequence[int] = LEVELS,
    conversational: bool = True,
    exclude: Collection[str] = (),
):
    """A ``datasets.Dataset`` of ``n`` problems: ``prompt``, ``answer`` and ``level`` (necessary steps).

    Rows come in blocks of ``len(levels)``, each block one problem of every level in random order, so
    with ``shuffle_dataset: false`` every batch of a multiple of ``len(levels)`` prompts mixes every level.
    Questions in ``exclude`` (held-out problems) are never drawn.
    """
    from trl_length_plugin._optional import require

    datasets = require("datasets", "trl")
    if not levels or any(not isinstance(k, int) or not 1 <= k <= MAX_LEVEL for k in levels):
        raise ValueError(f"levels: integers in 1-{MAX_LEVEL} expected, got {levels!r}")
    rng = random.Random(seed)
    excluded = set(exclude)
    prompts, answers, row_levels = [], [], []
    while len(prompts) < n:
        for level in rng.sample(list(levels), len(levels)):
            steps = make_steps(rng, level)
            while question_of(steps) in excluded:
                steps = make_steps(rng, level)
            question = question_of(steps)
            prompts.append([{"role": "user", "content": question}] if conversational else question)
            answers.append(str(steps[-1].result))
            row_levels.append(level)
    return datasets.Dataset.from_dict({"prompt": prompts[:n], "answer": answers[:n], "level": row_levels[:n]})


@dataclass(frozen=True)
class StepReport:
    """What a completion's reasoning writes: ``written`` of its ``necessary`` steps (step clauses in their
    places, whatever their operations and values), ``followed`` of them with the problem's operation and
    operand at that place, and ``redundant`` clauses (re-checks, recaps and repeats of a written step, "wait"
    restatements of the problem) at the character ``spans`` of the completion's text (each clause with the
    ``, `` before it)."""

    necessary: int
    written: int
    followed: int
    redundant: int
    spans: tuple[tuple[int, int], ...] = ()

    @property
    def skipped(self) -> bool:
        return self.written < self.necessary


def _clauses(text: str):
    """The reasoning's clauses of a completion's stripped ``text``, each with the character span it takes
    (with the ``, `` before it, but for the first)."""
    if not text.startswith(REASONING_OPEN):
        return
    reasoning = text.removeprefix(REASONING_OPEN).split(REASONING_CLOSE, 1)[0]
    start = len(REASONING_OPEN)
    for k, clause in enumerate(reasoning.split(",")):
        end = start + len(clause) + (k > 0)
        yield clause.strip(), (start, end)
        start = end


def _marked_redundant(clause: str) -> bool:
    """A re-check or recap of a step, or a "wait" restatement of the problem."""
    if clause.startswith(WAIT):
        return _RESTATEMENT.fullmatch(clause.removeprefix(WAIT)) is not None
    return any(clause.startswith(m) and _STEP.fullmatch(clause.removeprefix(m)) for m in (CHECK, RECAP))


def step_report(completion: str | Sequence[dict], question: str) -> StepReport:
    """Read the reasoning of ``completion`` clause by clause (``, `` separated). ``check a+b=c``,
    ``recap a+b=c``, ``wait <problem>=v``, a repeat of the step just written, and a repeat of an earlier written
    step (unless it has the next step's operation and operand) are redundant; any other clause ``a+b=c`` or
    ``a-b=c`` writes the next necessary step (none past the last); anything else (a jump ``so X``, other text)
    is neither. A completion without ``<think>`` reasoning writes nothing."""
    steps = necessary_steps(question)
    text = completion_text(completion).strip()
    written, followed, seen, last, spans = 0, 0, set(), None, []
    for clause, span in _clauses(text):
        if _marked_redundant(clause):
            spans.append(span)
            continue
        match = _STEP.fullmatch(clause)
        if match is None:
            continue
        follows = written < len(steps) and (match[2], int(match[3])) == (
            steps[written].op,
            steps[written].operand,
        )
        if clause == last or (clause in seen and not follows):
            spans.append(span)
        elif written < len(steps):
            written, followed, last = written + 1, followed + follows, clause
            seen.add(clause)
    return StepReport(len(steps), written, followed, len(spans), tuple(spans))


def redundant_tokens(completion: str | Sequence[dict], question: str, tokenizer, report=step_report) -> int:
    """The tokens of ``completion``'s redundant clauses (the spans of ``report``, ``step_report`` or another
    task's reader) as ``tokenizer`` encodes the completion's text: a token counts when it starts inside a span."""
    text = completion_text(completion).strip()
    return span_tokens(text, report(text, question).spans, tokenizer)


#: the held-out problems: the distinct questions of this draw, never drawn for training
HELD_OUT_DRAW, HELD_OUT_SEED = 64, 10_000


def held_out_dataset():
    """One row per held-out problem (the distinct questions of ``HELD_OUT_DRAW`` rows drawn with
    ``HELD_OUT_SEED``), the same for every seed."""
    dataset = make_reasoning_dataset(HELD_OUT_DRAW, seed=HELD_OUT_SEED)
    first: dict[str, int] = {}
    for i, prompt in enumerate(dataset["prompt"]):
        first.setdefault(prompt[0]["content"], i)
    return dataset.select(sorted(first.values()))


def training_dataset(seed: int, size: int = 2048):
    """``size`` training problems drawn with ``seed`` in level blocks, no held-out problem among them."""
    held_out = {prompt[0]["content"] for prompt in held_out_dataset()["prompt"]}
    return make_reasoning_dataset(size, seed=seed, exclude=held_out)
