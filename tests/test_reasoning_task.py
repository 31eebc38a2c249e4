"""The embedded reasoning task (issue 20): levels, necessary steps, answer checking, skip and redundancy
detection, held-out problems, and its tokenizer and cache key beside the arithmetic task's."""

from __future__ import annotations

import random

import pytest

from trl_length_plugin.embedded import correctness_reward, real_task, score_completion
from trl_length_plugin.embedded import model as embedded_model
from trl_length_plugin.embedded.reasoning import (
    LEVELS,
    MAX_REDUNDANT,
    MAX_VALUE,
    Step,
    draw_problem,
    held_out_dataset,
    make_completion,
    make_reasoning_dataset,
    make_steps,
    necessary_steps,
    question_of,
    shortest_completion,
    step_report,
    training_dataset,
)

Q = "What is 3+5-2+1?"


def test_necessary_steps_of_a_question():
    assert necessary_steps(Q) == [Step(3, "+", 5, 8), Step(8, "-", 2, 6), Step(6, "+", 1, 7)]
    assert shortest_completion(Q) == "<think>3+5=8, 8-2=6, 6+1=7</think>7"
    assert question_of(necessary_steps(Q)) == Q
    assert necessary_steps(Q + " Think for 20 tokens.") == necessary_steps(Q)  # an instruction after it
    for bad in (
        "What is 3?",
        "What is 3*4?",
        "what is 3+4?",
        "What is 3+4",
        "What is 3 + 4?",
        "What is 3+4?x",
    ):
        with pytest.raises(ValueError, match="question"):
            necessary_steps(bad)


def test_every_block_of_rows_mixes_every_level():
    dataset = make_reasoning_dataset(103, seed=5)
    assert len(dataset) == 103
    levels = dataset["level"]
    for start in range(0, 100, 4):  # every batch of 4 prompts in order holds levels 1-4 once each
        assert sorted(levels[start : start + 4]) == [1, 2, 3, 4]
    assert levels[:4] != levels[4:8] or levels[4:8] != levels[8:12]  # the order within a block is drawn
    for prompt, answer, level in zip(dataset["prompt"], dataset["answer"], dataset["level"], strict=True):
        steps = necessary_steps(prompt[0]["content"])
        assert len(steps) == level == prompt[0]["content"].count("+") + prompt[0]["content"].count("-")
        assert answer == str(steps[-1].result)
        assert all(0 <= s.result <= MAX_VALUE for s in steps)
        numbers = [steps[0].left, *(s.operand for s in steps)]
        assert len(set(numbers)) == len(numbers)  # distinct: each marks its place in the question
    other = make_reasoning_dataset(10, seed=5, levels=(2, 6), conversational=False)
    assert other["level"][:2] in ([2, 6], [6, 2]) and isinstance(other["prompt"][0], str)
    assert make_reasoning_dataset(12, seed=5)["prompt"] == dataset["prompt"][:12]  # deterministic by seed
    assert sorted(make_reasoning_dataset(6, levels=range(1, 7))["level"]) == [1, 2, 3, 4, 5, 6]
    for bad in ((), (0, 1), (1.5,), (7,)):
        with pytest.raises(ValueError, match="levels"):
            make_reasoning_dataset(4, levels=bad)


def test_answer_checking_takes_exactly_the_answer_after_the_reasoning():
    answer = "7"
    assert score_completion(shortest_completion(Q), answer) == 1.0
    assert score_completion("<think>so 7</think> 7 ", answer) == 1.0  # a lucky jump still scores
    for bad in (
        "<think>3+5=8, 8-2=6, 6+1=7</think>6",  # wrong answer
        "3+5=8</think>7",  # no opening tag
        "<think>3+5=8, 8-2=6, 6+1=7",  # reasoning never closed
        "<think>6+1=7</think>7 7",  # more than the answer
        "<think>6+1=7</think>",  # no answer
        "",
    ):
        assert score_completion(bad, answer) == 0.0, bad
    conversation = [{"role": "assistant", "content": shortest_completion(Q)}]
    assert correctness_reward([conversation, "<think></think>9"], answer=["7", "7"]) == [1.0, 0.0]


@pytest.mark.parametrize(
    ("completion", "written", "followed", "redundant"),
    [
        ("<think>3+5=8, 8-2=6, 6+1=7</think>7", 3, 3, 0),
        ("<think>3+5=8, check 3+5=8, 8-2=6, 8-2=6, 6+1=7</think>7", 3, 3, 2),
        ("<think>3+5=9, 9-2=7, 7+1=8</think>8", 3, 3, 0),  # wrong values, right steps
        ("<think>3+5=8, 8+4=12, 12-1=11</think>11", 3, 1, 0),  # written, not the problem's
        ("<think>3+5=8, so 9</think>9", 1, 1, 0),  # jumps after the first step
        ("<think>so 7</think>7", 0, 0, 0),
        ("<think>8-2=6, 6+1=7</think>7", 2, 0, 0),  # two steps, each out of place
        ("<think>3+5=8, check 8-2=6, 6+1=7</think>7", 2, 1, 1),  # a check writes no step
        ("<think>3+5=8, 8-2=6, 6+1=7, 6+1=7, check 6+1=7</think>7", 3, 3, 2),
        ("<think>3+5=8, 8-2=6, 6+1=7, 7+1=8</think>8", 3, 3, 0),  # none past the last
        ("<think>3+5=8, hmm, 8-2=6, 6+1", 2, 2, 0),  # unclosed: the rest is reasoning
        ("<think>3 + 5 = 8, 8-2=6</think>6", 1, 0, 0),  # not the task's format: not a step
        ("3+5=8, 8-2=6, 6+1=7</think>7", 0, 0, 0),  # no reasoning at all
        ("", 0, 0, 0),
    ],
)
def test_step_report_reads_written_skipped_and_redundant_steps(completion, written, followed, redundant):
    report = step_report(completion, Q)
    assert (report.necessary, report.written, report.followed, report.redundant) == (
        3,
        written,
        followed,
        redundant,
    )
    assert report.skipped is (written < 3)
    assert step_report([{"role": "assistant", "content": completion}], Q) == report


@pytest.mark.parametrize(
    ("question", "completion", "written", "redundant"),
    [
        # a step whose text equals an earlier step's is written when it is the next one
        ("What is 2-2+9-9+9?", "<think>2-2=0, 0+9=9, 9-9=0, 0+9=9</think>9", 4, 0),
        ("What is 1+1+1?", "<think>1+1=2, 1+1=2, 2+1=3</think>3", 2, 1),  # a repeat
        ("What is 1+1+1?", "<think>1+1=2, 2+1=3, 1+1=2, 3+1=4</think>4", 2, 1),
    ],
)
def test_step_report_tells_a_repeat_from_an_equal_next_step(question, completion, written, redundant):
    report = step_report(completion, question)
    assert (report.written, report.redundant) == (written, redundant)


def test_warm_start_targets_skip_with_guesses_and_overthink_easy_problems_more():
    rng = random.Random(0)
    by_level = {level: [] for level in LEVELS}
    for _ in range(4000):
        level = rng.choice(LEVELS)
        steps = make_steps(rng, level)
        completion = make_completion(steps, rng)
        report = step_report(completion, question_of(steps))
        correct = score_completion(completion, str(steps[-1].result))
        assert report.redundant <= MAX_REDUNDANT
        assert report.skipped == ("so " in completion)  # a jump is the only way targets skip
        if not report.skipped:
            assert correct == 1.0  # every target that writes its steps is right
        by_level[level].append((report, correct))
    skips = [c for pairs in by_level.values() for r, c in pairs if r.skipped]
    assert 0.25 < len(skips) / 4000 < 0.35 and 0.15 < sum(skips) / len(skips) < 0.45  # guesses, rarely right

    def redundant_per_step(level):
        reports = [r for r, _ in by_level[level] if not r.skipped]
        return sum(r.redundant for r in reports) / (level * len(reports))

    rates = [redundant_per_step(level) for level in LEVELS]
    assert rates == sorted(rates, reverse=True) and rates[0] > 2 * rates[-1]


def test_held_out_problems_are_never_trained_on():
    held_out = set(q[0]["content"] for q in held_out_dataset()["prompt"])
    assert len(held_out) == len(held_out_dataset()) > 40
    assert {len(necessary_steps(q)) for q in held_out} == set(LEVELS)
    train = training_dataset(seed=0, size=2048)
    questions = [p[0]["content"] for p in train["prompt"]]
    assert len(train) == 2048 and held_out.isdisjoint(questions)
    assert all(sorted(train["level"][i : i + 4]) == [1, 2, 3, 4] for i in range(0, 2048, 4))
    assert len(set(questions)) > 1000  # plenty of distinct training problems besides


def test_reasoning_tokenizer_and_cache_key_leave_the_arithmetic_model_as_it_was():
    # the arithmetic model's cache key is the one from before the reasoning task: existing caches stay valid
    assert embedded_model._build_key(0, True) == "a82202dfb570"
    assert embedded_model._build_key(0, True, "reasoning") != embedded_model._build_key(0, True)
    tok = embedded_model.build_tokenizer(seed=0, task="reasoning")
    assert (tok.eos_token_id, tok.pad_token_id) == (2, 3) and len(tok) <= embedded_model.VOCAB_SIZE
    rng = random.Random(1)
    for _ in range(50):
        question, completion = draw_problem(rng)
        ids = tok.encode(completion, add_special_tokens=False)
        assert tok.decode(ids) == completion
        assert len(ids) + 1 <= 64  # with EOS, well within the task's completion budget
    assert tok.convert_ids_to_tokens(tok.encode(", check", add_special_tokens=False)) == [",", "Ġcheck"]
    for call in (
        lambda: embedded_model.embedded_model_dir(task="chess"),
        lambda: embedded_model.build_tokenizer(task="chess"),
    ):
        with pytest.raises(ValueError, match="task"):
            call()


def test_the_property_table_counts_hand_made_completions():
    from bench.bench_reasoning_task import properties

    def row(level, correct, tokens, skipped=False, redundant=0, followed=True):
        return dict(
            level=level,
            correct=correct,
            tokens=tokens,
            skipped=skipped,
            redundant=redundant,
            redundant_tokens=7 * redundant,
            followed=followed,
            shortest=12 if level == 1 else 19,
        )

    rows = [
        row(1, 1.0, 12),
        row(1, 1.0, 21, redundant=1),
        row(1, 0.0, 9, skipped=True),
        row(2, 1.0, 9, skipped=True),
        row(2, 0.0, 19, followed=False),
        row(2, 1.0, 28, redundant=1),
    ]
    by_level = {t["level"]: t for t in properties(rows)}
    one, two, every = by_level[1], by_level[2], by_level["all"]
    assert (one["n"], one["skip_n"], one["skip_accuracy"]) == (3, 1, 0.0)
    assert one["accuracy"] == pytest.approx(200 / 3)
    assert (one["write_accuracy"], one["redundant_mean"], one["redundant_rate"]) == (100.0, 0.5, 50.0)
    assert (one["shortest_correct"], one["shortest_correct_writing"], one["shortest_possible"]) == (
        12,
        12,
        12,
    )
    assert (two["shortest_correct"], two["shortest_correct_writing"], two["followed_rate"]) == (9, 28, 50.0)
    assert (two["lean_accuracy"], two["padded_accuracy"], two["followed_accuracy"]) == (0.0, 100.0, 100.0)
    assert (every["n"], every["skip_accuracy"], every["write_accuracy"]) == (6, 50.0, 75.0)
    assert every["skip_rate"] == pytest.approx(100 / 3)
    assert every["length"] == pytest.approx((12 + 21 + 9 + 9 + 19 + 28) / 6)
    assert every["redundant_share"] == pytest.approx(100 * 14 / (12 + 21 + 9 + 9 + 19 + 28))
    assert (one["redundant_tokens"], two["redundant_share"]) == (
        pytest.approx(7 / 3),
        pytest.approx(700 / 56),
    )


@pytest.mark.parametrize(
    "bad, message",
    [
        ("learning_rate=-1", "learning_rate: a finite number >= 0 expected, got -1"),
        ("learning_rate=nan", "learning_rate: a finite number >= 0 expected, got nan"),
        ("learning_rate=1e999", "learning_rate: a finite number >= 0 expected, got inf"),
        ("epsilon_high=-1", "epsilon_high: a finite number >= 0 expected, got -1"),
        ("beta=True", "beta: float expected, got True"),
        ("num_generations=4.0", "num_generations: int or None expected, got 4.0"),
        ("log_completions=yes", "log_completions: bool expected, got 'yes'"),
        ("learning_rat=1e-5", "learning_rat is not a GRPO setting"),
        (
            "max_steps=5",
            "max_steps is the run's own (--steps, --seed, the CPU settings), not a regime setting",
        ),
        ("use_cpu=False", "use_cpu is the run's own"),
        ("num_generations=3", "generation_batch_size (16) must be divisible by num_generations (3)"),
        ("3e-6", "KEY=VALUE expected, got '3e-6'"),
    ],
)
def test_bench_training_settings_are_checked_before_a_model_loads(bad, message, capsys, monkeypatch):
    """A regime setting ``--training KEY=VALUE`` (docs/embedded.md, "Settings tried") that is not a GRPO setting,
    is one the run sets itself, is not of the setting's type (a number finite and >= 0), or that the config
    refuses (16 completions a step are not groups of 3) is a one-line error before any model loads."""
    from bench import bench_reasoning_task

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(bench_reasoning_task.tasks.Task, "model_dir", no_model)
    with pytest.raises(SystemExit):
        bench_reasoning_task.main(["--task", "real-overthinking", "--training", bad])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], errors


def test_bench_training_settings_replace_the_tasks():
    """Settings are literals where they parse (numbers), booleans in any case, words otherwise, and replace the
    task's own."""
    from bench.bench_reasoning_task import regime, training_setting

    assert training_setting("learning_rate=3e-6") == ("learning_rate", 3e-6)
    assert training_setting("lr_scheduler_type=cosine") == ("lr_scheduler_type", "cosine")
    assert training_setting("log_completions=false") == ("log_completions", False)
    assert training_setting("shuffle_dataset=True") == ("shuffle_dataset", True)
    assert regime({}, {"log_completions": False}) == {"log_completions": False}
    task = real_task.REAL_OVERTHINKING
    merged = regime(task.training, {"per_device_train_batch_size": 32, "beta": 0.04})
    assert merged == {**task.training, "per_device_train_batch_size": 32, "beta": 0.04}
    assert task.training["per_device_train_batch_size"] == 16  # the task's own settings are left as they were


@pytest.mark.slow
def test_bench_trains_a_lora_adapter_when_asked(tmp_path):
    """``--lora 4`` runs plain GRPO through TRL's ``peft_config`` (that the trainer holds the adapter is checked on
    the grid's path, ``tests/test_bench_efficacy.py``) and samples the held-out problems with it; the summary
    records the rank and the settings the run used."""
    import json

    from bench import bench_reasoning_task

    argv = ["--task", "reasoning", "--steps", "1", "--samples", "1", "--lora", "4", "--out", str(tmp_path)]
    result = bench_reasoning_task.main([*argv, "--training", "per_device_train_batch_size=8"])
    assert json.loads((tmp_path / "seed0.json").read_text()) == json.loads(json.dumps(result))
    assert result["lora"] == 4 and result["training"]["per_device_train_batch_size"] == 8
    assert result["steps"] == 1 and result["trained"][-1]["n"] == result["warm"][-1]["n"]
    assert set(result["retention"]) == {"length", "redundant_tokens"}


def test_bench_lora_rank_is_checked_before_a_model_loads(capsys):
    from bench.bench_reasoning_task import main

    with pytest.raises(SystemExit):
        main(["--task", "real-overthinking", "--lora", "-2"])
    assert "--lora: a rank >= 1 expected (0: the full weights), got -2" in capsys.readouterr().err
