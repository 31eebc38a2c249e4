"""One- and two-step word problems with verbose worked solutions: the real chat model's overthinking task
(docs/embedded.md, "The real model's overthinking task").

A problem is a short story with one or two operations on numbers 2-20 (results never below 0): "Mia has 7
pencils. She buys 5 more. How many pencils does Mia have now?". The solutions this module writes overthink the
way R1-style models do: a restatement of the problem, the necessary steps, then rounds of a double-check, a
verification backwards or a recap, each an exact copy of correct work that ends on the answer, and every solution
ends with "The answer is N.", so the reward (the last number is the answer, GSM8K's check) cannot see the
redundancy. The solutions are compact (about 2.5x the shortest, at most about 90 tokens) so that a GRPO run on a
135M-parameter model fits a CPU. The supervised pass that
teaches them to SmolLM2-135M-Instruct is ``bench/build_real_overthinking.py``; the adapter it writes ships with
the package (``real_model_dir("smollm2-135m-instruct-overthinking")``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from trl_length_plugin.embedded.reasoning import StepReport
from trl_length_plugin.embedded.task import completion_text

NAMES = ("Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Lily", "Ben", "Emma", "Max", "Nora", "Jack")
MALE = ("Tom", "Leo", "Sam", "Ben", "Max", "Jack")
ITEMS = ("apples", "pencils", "stickers", "marbles", "books", "cookies", "cards", "shells", "coins", "toys")
LOW, HIGH = 2, 20
#: the operations a story can take: (operator, the clause that writes it)
ADD = ("buys {n} more", "finds {n} more", "gets {n} more from a friend")
SUBTRACT = ("gives {n} away", "loses {n}", "uses {n}")
#: the chance a problem has two steps (else one)
TWO_STEP_PROB = 0.5
#: the redundant rounds a solution can add after its steps, and the chance of each further round after the first
#: (at most MAX_ROUNDS); LEAN_PROB of the solutions have none
ROUNDS = ("check", "verify", "recap")
LEAN_PROB = 0.1
MORE_ROUNDS_PROB = 0.4
MAX_ROUNDS = 2


@dataclass(frozen=True)
class Operation:
    op: str  # "+" or "-"
    n: int
    clause: str

    def apply(self, total: int) -> int:
        return total + self.n if self.op == "+" else total - self.n


@dataclass(frozen=True)
class WordProblem:
    """A story: ``name`` starts with ``start`` ``item`` and then does each of ``operations``."""

    name: str
    item: str
    start: int
    operations: tuple[Operation, ...]

    @property
    def totals(self) -> list[int]:
        """The running totals after each operation."""
        totals, total = [], self.start
        for operation in self.operations:
            total = operation.apply(total)
            totals.append(total)
        return totals

    @property
    def answer(self) -> int:
        return self.totals[-1]

    @property
    def question(self) -> str:
        pronoun = "He" if self.name in MALE else "She"
        clauses = " ".join(
            f"{'Then ' + pronoun.lower() if k else pronoun} {o.clause}."
            for k, o in enumerate(self.operations)
        )
        return f"{self.name} has {self.start} {self.item}. {clauses} How many {self.item} does {self.name} have now?"

    def equations(self) -> list[str]:
        """The necessary steps: one equation per operation."""
        left, lines = self.start, []
        for operation, total in zip(self.operations, self.totals, strict=True):
            lines.append(f"{left}{operation.op}{operation.n}={total}")
            left = total
        return lines


def draw_word_problem(rng: random.Random, steps: int | None = None) -> WordProblem:
    """A random story of ``steps`` operations (one or two, drawn when None), every total within 0-``HIGH``."""
    steps = steps or (2 if rng.random() < TWO_STEP_PROB else 1)
    while True:
        start, total, operations = rng.randint(LOW, HIGH), None, []
        total = start
        for _ in range(steps):
            op = rng.choice("+-")
            n = rng.randint(LOW, HIGH)
            result = total + n if op == "+" else total - n
            if not 0 <= result <= HIGH:
                break
            clause = rng.choice(ADD if op == "+" else SUBTRACT).format(n=n)
            operations.append(Operation(op, n, clause))
            total = result
        if len(operations) == steps:
            return WordProblem(rng.choice(NAMES), rng.choice(ITEMS), start, tuple(operations))


def concise_solution(problem: WordProblem) -> str:
    """The shortest solution that writes every step."""
    return " ".join(f"{line}." for line in problem.equations()) + f" The answer is {problem.answer}."


def redundant_round(kind: str, problem: WordProblem) -> str:
    """One round of redundant work, an exact copy of what the steps found (``verify`` runs them backwards); each
    ends on the answer."""
    if kind == "check":
        return f"Check: {', '.join(problem.equations())}."
    if kind == "verify":
        inverse, total = [], problem.answer
        for operation, before in zip(
            reversed(problem.operations), reversed([problem.start, *problem.totals[:-1]]), strict=True
        ):
            inverse.append(f"{total}{'-' if operation.op == '+' else '+'}{operation.n}={before}")
            total = before
        return f"Verify: {', '.join(inverse)}, so {problem.answer}."
    expression = f"{problem.start}" + "".join(f"{o.op}{o.n}" for o in problem.operations)
    return f"Recap: {expression}={problem.answer}."


def verbose_solution(problem: WordProblem, rng: random.Random) -> str:
    """A worked solution that overthinks: a restatement of the problem, the steps, 0 to ``MAX_ROUNDS`` redundant
    rounds (``redundant_round``), then "The answer is N."."""
    parts = [f"Restate: {problem.name} has {problem.start} {problem.item}."]
    parts += [f"{line}." for line in problem.equations()]
    rounds = 0
    if rng.random() >= LEAN_PROB:
        rounds = 1
        while rounds < MAX_ROUNDS and rng.random() < MORE_ROUNDS_PROB:
            rounds += 1
    parts += [redundant_round(rng.choice(ROUNDS), problem) for _ in range(rounds)]
    return " ".join(parts) + f" The answer is {problem.answer}."


_QUESTION = re.compile(
    r"(?P<name>\w+) has (?P<start>\d+) (?P<item>\w+)\. (?P<story>.*) How many .*", re.DOTALL
)
_CLAUSE = re.compile(r"(?:[Tt]hen )?(?:[Hh]e|[Ss]he) (?P<verb>.+?)\.(?: |$)")
_EQUATION = re.compile(r"(\d+)([+-])(\d+)=(-?\d+)")
#: the openings of the redundant sentences ``verbose_solution`` writes
MARKERS = ("Restate:", "Check:", "Verify:", "Recap:")


def parse_word_problem(question: str) -> WordProblem:
    """The story of a ``draw_word_problem`` question; ValueError for a question of another form."""
    match = _QUESTION.fullmatch(question)
    clauses = _CLAUSE.findall(match["story"] + " ") if match else []
    operations = []
    for verb in clauses:
        for op, forms in (("+", ADD), ("-", SUBTRACT)):
            for form in forms:
                found = re.fullmatch(form.replace("{n}", r"(\d+)"), verb)
                if found:
                    operations.append(Operation(op, int(found[1]), verb))
    if not match or not clauses or len(operations) != len(clauses):
        raise ValueError(f"question: not a word problem of this task: {question!r}")
    return WordProblem(match["name"], match["item"], int(match["start"]), tuple(operations))


def solution_report(completion: str | Sequence[dict], question: str) -> StepReport:
    """Read a solution sentence by sentence: an equation ``a + b = c`` writes the next necessary step (``followed``
    when it has the story's operation and number there); a sentence opening with one of ``MARKERS`` and a repeat
    of an equation already written are redundant (their character spans, each with the space before it); the rest
    (the answer, other text) is neither."""
    problem = parse_word_problem(question)
    text = completion_text(completion).strip()
    written, followed, seen, spans, start = 0, 0, set(), [], 0
    for sentence in re.split(r"(?<=\.) ", text):
        span, start = (max(0, start - 1), start + len(sentence)), start + len(sentence) + 1
        equation = _EQUATION.fullmatch(sentence.rstrip("."))
        if sentence.startswith(MARKERS) or (equation and sentence in seen):
            spans.append(span)
        elif equation and written < len(problem.operations):
            operation = problem.operations[written]
            followed += (equation[2], int(equation[3])) == (operation.op, operation.n)
            written += 1
            seen.add(sentence)
    return StepReport(len(problem.operations), written, followed, len(spans), tuple(spans))


def make_word_problem_dataset(n: int, seed: int = 0, exclude=()):
    """A ``datasets.Dataset`` of ``n`` problems: ``prompt`` (one user message), ``answer`` and ``level`` (its
    necessary steps, one or two); questions in ``exclude`` are never drawn."""
    from trl_length_plugin._optional import require

    datasets = require("datasets", "trl")
    rng, excluded = random.Random(seed), set(exclude)
    prompts, answers, steps = [], [], []
    while len(prompts) < n:
        problem = draw_word_problem(rng)
        if problem.question in excluded:
            continue
        prompts.append([{"role": "user", "content": problem.question}])
        answers.append(str(problem.answer))
        steps.append(len(problem.operations))
    return datasets.Dataset.from_dict({"prompt": prompts, "answer": answers, "level": steps})


#: the held-out problems: the distinct questions of this draw, never drawn for training or the supervised pass
HELD_OUT_DRAW, HELD_OUT_SEED = 48, 10_000


def held_out_questions() -> set[str]:
    return set(q[0]["content"] for q in held_out_word_problems()["prompt"])


def held_out_word_problems():
    """One row per held-out problem (the distinct questions of ``HELD_OUT_DRAW`` drawn with ``HELD_OUT_SEED``)."""
    dataset = make_word_problem_dataset(HELD_OUT_DRAW, seed=HELD_OUT_SEED)
    first: dict[str, int] = {}
    for i, prompt in enumerate(dataset["prompt"]):
        first.setdefault(prompt[0]["content"], i)
    return dataset.select(sorted(first.values()))


def word_problem_training_set(seed: int, size: int = 512):
    """``size`` training problems drawn with ``seed``, no held-out problem among them."""
    return make_word_problem_dataset(size, seed=seed, exclude=held_out_questions())
