"""The overthinking tasks (issue 39): the embedded task's warm-start targets (the reasoning task's problems with
redundant rounds that copy correct work), the redundancy readers and their token counts, and the real model's word
problems with verbose solutions."""

from __future__ import annotations

import random
import statistics

import pytest

from trl_length_plugin.embedded import model as embedded_model
from trl_length_plugin.embedded import overthinking, score_completion
from trl_length_plugin.embedded.reasoning import (
    LEVELS,
    make_steps,
    question_of,
    redundant_tokens,
    shortest_completion,
    step_report,
)
from trl_length_plugin.embedded.task import last_number_score, span_tokens
from trl_length_plugin.embedded.word_problems import (
    MAX_ROUNDS,
    concise_solution,
    draw_word_problem,
    held_out_word_problems,
    parse_word_problem,
    redundant_round,
    solution_report,
    verbose_solution,
    word_problem_training_set,
)

Q = "What is 3+5-2?"


@pytest.mark.parametrize(
    ("completion", "written", "redundant", "spans"),
    [
        ("<think>3+5=8, 8-2=6</think>6", 2, 0, ()),
        ("<think>3+5=8, 8-2=6, wait 3+5-2=6</think>6", 2, 1, (", wait 3+5-2=6",)),
        (
            "<think>3+5=8, 8-2=6, recap 3+5=8, 8-2=6</think>6",
            2,
            2,
            (", recap 3+5=8", ", 8-2=6"),
        ),
        ("<think>3+5=8, check 3+5=8, 8-2=6</think>6", 2, 1, (", check 3+5=8",)),
        ("<think>wait 3+5-2=6, 3+5=8, 8-2=6</think>6", 2, 1, ("wait 3+5-2=6",)),  # the first clause: no comma
        ("<think>3+5=8, wait so 6, 8-2=6</think>6", 2, 0, ()),  # not a restatement: neither
        ("<think>3+5=8, recap 3 + 5 = 8, 8-2=6</think>6", 2, 0, ()),  # not the task's format
        ("<think>so 6, wait 3+5-2=6</think>6", 0, 1, (", wait 3+5-2=6",)),  # a skip overthinks too
    ],
)
def test_step_report_reads_the_overthinking_markers_with_their_spans(completion, written, redundant, spans):
    report = step_report(completion, Q)
    assert (report.written, report.redundant) == (written, redundant)
    assert tuple(completion[a:b] for a, b in report.spans) == spans


def test_redundant_tokens_count_the_tokens_of_the_redundant_clauses_by_hand():
    tokenizer = embedded_model.build_tokenizer(seed=0, task="overthinking")
    lean = shortest_completion(Q)
    padded = "<think>3+5=8, 8-2=6, check 3+5=8, wait 3+5-2=6</think>6"
    assert redundant_tokens(lean, Q, tokenizer) == 0
    extra = len(tokenizer.encode(padded, add_special_tokens=False)) - len(
        tokenizer.encode(lean, add_special_tokens=False)
    )
    assert redundant_tokens(padded, Q, tokenizer) == extra  # every token the two clauses add, and no other
    by_hand = [", check 3+5=8", ", wait 3+5-2=6"]
    assert extra == sum(len(tokenizer.encode(c, add_special_tokens=False)) for c in by_hand)
    assert span_tokens("abc", (), tokenizer) == 0


def test_overthinking_targets_copy_correct_work_and_overthink_easy_problems_most():
    tokenizer = embedded_model.build_tokenizer(seed=0, task="overthinking")
    rng = random.Random(0)
    ratio, share = {k: [] for k in LEVELS}, {k: [] for k in LEVELS}
    for _ in range(2000):
        steps = make_steps(rng, rng.choice(LEVELS))
        completion, question = overthinking.make_completion(steps, rng), question_of(steps)
        report = step_report(completion, question)
        reasoning, answer = completion.removeprefix("<think>").split("</think>")
        written = {step.text() for step in steps[: report.written]}
        # every redundant clause copies a written step or restates the problem with the answer given, and the
        # reasoning ends on that answer
        for a, b in report.spans:
            clause = completion[a:b].removeprefix(",").strip()
            if clause.startswith("wait "):
                assert clause == f"wait {question[8:-1]}={answer}"
            else:
                assert clause.removeprefix("check ").removeprefix("recap ") in written
        assert reasoning.endswith(answer)
        assert report.skipped == ("so " in completion)
        if not report.skipped:
            assert score_completion(completion, str(steps[-1].result)) == 1.0
            assert report.written == report.followed == len(steps)
            tokens = len(tokenizer.encode(completion, add_special_tokens=False)) + 1
            shortest = len(tokenizer.encode(shortest_completion(question), add_special_tokens=False)) + 1
            ratio[len(steps)].append(tokens / shortest)
            share[len(steps)].append(redundant_tokens(completion, question, tokenizer) / tokens)
            assert tokens <= 100  # well within the task's 128-token budget
    means = [statistics.fmean(ratio[k]) for k in LEVELS]
    assert means == sorted(means, reverse=True)  # easy problems overthink most
    assert means[0] > 2.5 and means[-1] > 1.7 and 2.0 < statistics.fmean(means) < 3.0
    assert 0.05 < sum(r == 1.0 for k in LEVELS for r in ratio[k]) / sum(map(len, ratio.values())) < 0.15


def test_overthinking_task_has_its_own_tokenizer_and_cache_key():
    keys = {task: embedded_model._build_key(0, True, task) for task in embedded_model.TASKS}
    assert (
        len(set(keys.values())) == 3 and keys["reasoning"] == "1cd3c7ad0a8d"
    )  # the reasoning model unchanged
    tok = embedded_model.build_tokenizer(seed=0, task="overthinking")
    rng = random.Random(3)
    for _ in range(50):
        _, completion = overthinking.draw_problem(rng)
        assert tok.decode(tok.encode(completion, add_special_tokens=False)) == completion
    assert tok.convert_ids_to_tokens(tok.encode(", wait", add_special_tokens=False)) == [",", "Ġwait"]


def test_word_problems_parse_back_and_their_verbose_solutions_are_correct_and_marked():
    rng = random.Random(0)
    lengths = {1: [], 2: []}
    for _ in range(1000):
        problem = draw_word_problem(rng)
        assert parse_word_problem(problem.question) == problem
        assert all(0 <= total <= 20 for total in problem.totals)
        verbose = verbose_solution(problem, rng)
        assert last_number_score(verbose, str(problem.answer)) == 1.0
        assert last_number_score(concise_solution(problem), str(problem.answer)) == 1.0
        report = solution_report(verbose, problem.question)
        assert report.written == report.followed == len(problem.operations)
        assert solution_report(concise_solution(problem), problem.question).redundant == 0
        assert (
            1 <= report.redundant <= 2 * MAX_ROUNDS + 1
        )  # the restatement, then the rounds (two sentences at most)
        lengths[len(problem.operations)].append(len(verbose) / len(concise_solution(problem)))
    assert all(2.0 < statistics.fmean(v) < 5.0 for v in lengths.values()), {
        k: statistics.fmean(v) for k, v in lengths.items()
    }
    with pytest.raises(ValueError, match="question"):
        parse_word_problem("What is 3 + 4?")


def test_solution_report_by_hand():
    question = (
        "Mia has 7 pencils. She buys 5 more. Then she gives 3 away. How many pencils does Mia have now?"
    )
    text = "Restate: Mia has 7 pencils. 7+5=12. 12-3=9. 7+5=12. Check: 7+5=12, 12-3=9. The answer is 9."
    report = solution_report(text, question)
    assert (report.necessary, report.written, report.followed, report.redundant) == (2, 2, 2, 3)
    assert [text[a:b] for a, b in report.spans] == [
        "Restate: Mia has 7 pencils.",
        " 7+5=12.",
        " Check: 7+5=12, 12-3=9.",
    ]
    skipping = solution_report("7+5=12. The answer is 9.", question)
    assert skipping.skipped and skipping.written == 1 and skipping.redundant == 0
    wrong_place = solution_report("7-3=4. 4+5=9. The answer is 9.", question)
    assert (wrong_place.written, wrong_place.followed) == (2, 0)
    problem = parse_word_problem(question)
    assert concise_solution(problem) == "7+5=12. 12-3=9. The answer is 9."
    rounds = {kind: redundant_round(kind, problem) for kind in ("check", "verify", "recap")}
    assert rounds == {
        "check": "Check: 7+5=12, 12-3=9.",
        "verify": "Verify: 9+3=12, 12-5=7, so 9.",
        "recap": "Recap: 7+5-3=9.",
    }


def test_word_problem_held_out_set_is_never_trained_on():
    held_out = held_out_word_problems()
    questions = {p[0]["content"] for p in held_out["prompt"]}
    assert len(questions) == len(held_out) >= 40 and set(held_out["level"]) == {1, 2}
    train = word_problem_training_set(seed=0)
    assert len(train) == 512 and questions.isdisjoint(p[0]["content"] for p in train["prompt"])
