"""The embedded overthinking task: the reasoning task's problems, taught the way R1-style models answer them.

The problems, held-out set, scoring and necessary steps are the reasoning task's (``reasoning``). What differs is
the warm start's targets: after its steps, a completion overthinks in rounds of redundant work, each an exact copy
of what it already wrote: a re-check of every step (``check 4+5=9, 9-2=7``), a "wait" restatement of the whole
problem with its result (``wait 4+5-2=7``) or a recap of the steps (``recap 4+5=9, 9-2=7``). A round of steps
names its kind once, before its first step, so every copy of the steps reads the same after its first clause
(a tiny model copies them by induction without counting where it is); every round ends on the answer already
found, so it costs length and nothing else; easy problems get the most rounds, as
reasoning models overthink easy problems most (Chen et al., arXiv 2412.21187). Skipping steps still costs
accuracy (the jump ``so X`` to a guess), so RL has accuracy to gain while the redundancy stays reward-neutral
(docs/embedded.md, "The overthinking task").
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from trl_length_plugin.embedded.reasoning import (
    CHECK,
    GUESS_ERROR,
    LEVELS,
    MAX_VALUE,
    RECAP,
    SKIP_PROB,
    WAIT,
    Step,
    make_steps,
    question_of,
)
from trl_length_plugin.embedded.task import REASONING_CLOSE, REASONING_OPEN

#: the chance a target stops after its steps with no redundant round at all
LEAN_PROB = 0.1
#: after the first redundant round, the chance of one more, by level (at most MAX_ROUNDS[level] rounds): targets
#: that write their steps are 2.8x (level 1) to 1.9x (level 4) the shortest correct completion (docs/embedded.md)
MORE_ROUNDS_PROB = {1: 0.72, 2: 0.58, 3: 0.45, 4: 0.35}
MAX_ROUNDS = {1: 6, 2: 4, 3: 3, 4: 2}
ROUNDS = ("check", "wait", "recap")


def redundant_round(kind: str, written: Sequence[Step], question: str, answer: int) -> list[str]:
    """One round of redundant clauses over the ``written`` steps, which end on ``answer``; a ``wait`` (and any
    round of a completion whose steps do not reach ``answer``, as a guess's) restates ``question``'s expression
    with ``answer``. Every round ends on ``answer``."""
    if kind == "wait" or not written or written[-1].result != answer:
        expression = question.removeprefix("What is ").removesuffix("?")
        return [f"{WAIT}{expression}={answer}"]
    marker = CHECK if kind == "check" else RECAP
    return [marker + written[0].text(), *(step.text() for step in written[1:])]


def make_completion(steps: Sequence[Step], rng: random.Random) -> str:
    """A warm-start target: the reasoning task's steps (or, with chance ``SKIP_PROB``, the first few steps
    and a jump ``so X`` to a guess), then redundant rounds (``redundant_round``) whose number falls with the
    level; the number and kinds of rounds are drawn the same way whether the steps were skipped or not."""
    level, answer = len(steps), steps[-1].result
    written = rng.randrange(level) if rng.random() < SKIP_PROB else level
    clauses = [step.text() for step in steps[:written]]
    if written < level:
        answer = min(MAX_VALUE, max(0, answer + rng.randint(-GUESS_ERROR, GUESS_ERROR)))
        clauses.append(f"so {answer}")
    rounds = 0
    if rng.random() >= LEAN_PROB:
        rounds = 1
        while rounds < MAX_ROUNDS[level] and rng.random() < MORE_ROUNDS_PROB[level]:
            rounds += 1
    question = question_of(steps)
    for _ in range(rounds):
        clauses += redundant_round(rng.choice(ROUNDS), steps[:written], question, answer)
    return f"{REASONING_OPEN}{', '.join(clauses)}{REASONING_CLOSE}{answer}"


def draw_problem(rng: random.Random, levels: Sequence[int] = LEVELS) -> tuple[str, str]:
    """A warm-start example: a problem of a random level and its overthinking target."""
    steps = make_steps(rng, rng.choice(levels))
    return question_of(steps), make_completion(steps, rng)
