"""The target-length reward's tools (docs/reference/length-penalties.md §2.20): the dataset helper that writes
the target into each prompt (plain, conversational, seeded ranges, targets from ``trl-length profile``,
streaming datasets), ``trl-length profile --targets`` (hand-computed quantiles) and ``trl-length preview``
with the term on (hand-computed rewards and its target line)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.test_offline_preview import ROWS as PREVIEW_ROWS
from tests.test_offline_preview import preview
from tests.test_offline_profile import RULES, profile, read_jsonl, write_rollouts
from trl_length_plugin.shaping import add_target_lengths, prompt_with_target
from trl_length_plugin.shaping.targets import sampled_target

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "And 2 + 4?"},
]


def test_the_instruction_goes_to_the_last_user_message():
    assert prompt_with_target("What is 2 + 3?", 512) == "What is 2 + 3? Think for 512 tokens."
    assert (
        prompt_with_target("Q", 2.5, "Answer in about {n} characters.") == "Q Answer in about 2.5 characters."
    )
    chat = prompt_with_target(CHAT, 64.0)
    assert [m["content"] for m in chat] == [
        "Be brief.",
        "What is 2 + 3?",
        "5",
        "And 2 + 4? Think for 64 tokens.",
    ]
    assert CHAT[3]["content"] == "And 2 + 4?"  # the input is not modified
    parts = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is shown?"}]}]
    assert prompt_with_target(parts, 8)[0]["content"][-1] == {"type": "text", "text": "Think for 8 tokens."}
    with pytest.raises(ValueError, match="needs a user message"):
        prompt_with_target([{"role": "system", "content": "x"}], 8)
    with pytest.raises(ValueError, match="string or a list of messages"):
        prompt_with_target(42, 8)


def test_rows_get_seeded_targets_from_a_range():
    rows = [{"prompt": f"Q{i}"} for i in range(200)]
    out = add_target_lengths(rows, (100, 4000), seed=3)
    targets = [row["target_length"] for row in out]
    assert targets == [sampled_target(3, i, 100, 4000) for i in range(200)]
    assert all(100 <= t <= 4000 for t in targets) and len(set(targets)) > 150
    assert out[7]["prompt"] == f"Q7 Think for {targets[7]} tokens."
    assert add_target_lengths(rows, (100, 4000), seed=3) == out  # seeded
    assert [row["target_length"] for row in add_target_lengths(rows, (100, 4000), seed=4)] != targets
    assert rows[0] == {"prompt": "Q0"}


def test_datasets_map_style_and_streaming_get_the_same_targets():
    import datasets

    from trl_length_plugin.embedded import make_task_dataset

    dataset = make_task_dataset(6, seed=0)
    mapped = add_target_lengths(dataset, (10, 40), seed=1)
    streamed = list(add_target_lengths(dataset.to_iterable_dataset(), (10, 40), seed=1))
    assert mapped["target_length"] == [row["target_length"] for row in streamed]
    assert mapped["prompt"] == [row["prompt"] for row in streamed]
    first = mapped[0]["prompt"][-1]["content"]
    assert first == f"{dataset[0]['prompt'][-1]['content']} Think for {mapped[0]['target_length']} tokens."
    assert mapped["answer"] == dataset["answer"]
    assert isinstance(mapped, datasets.Dataset)


def test_targets_given_or_read_from_the_column():
    rows = [{"prompt": "A", "target_length": 30}, {"prompt": "B", "target_length": None}]
    assert add_target_lengths(rows) == [
        {"prompt": "A Think for 30 tokens.", "target_length": 30},
        {"prompt": "B", "target_length": None},
    ]
    assert [r["prompt"] for r in add_target_lengths(rows, targets=[5, 6])] == [
        "A Think for 5 tokens.",
        "B Think for 6 tokens.",
    ]
    for bad, message in (
        ({"targets": [1]}, "targets has 1 values for 2 rows"),
        ({"targets": [0, 1]}, "row 0: target_length must be finite and in"),
        ({"targets": [True, 1]}, "row 0: target_length must be a number"),
        ({"target_range": (0, 10)}, "target_range must be two integers 1 <= low <= high"),
        ({"target_range": (10, 5)}, "target_range must be two integers"),
        ({"target_range": (1, 5), "targets": [1, 2]}, "not both"),
        ({"template": "Think hard."}, "template must contain {n}"),
    ):
        with pytest.raises(ValueError, match=message):
            add_target_lengths(rows, **bad)


def test_profile_writes_targets_from_passing_lengths(tmp_path, capsys):
    """Passing totals: prompt 0 10, 20, 30, 50 (q0.25 at position 0.75: 17.5, rounded half to even: 18);
    prompt 1 has 2 passing (< 3: none); the text prompt 11, 23, 35 (q0.25 at 0.5: 17). Its answers
    1, 3, 5 give q0.5 = 3; prompt 0's answers are all 2."""
    rollouts = write_rollouts(tmp_path, "jsonl")
    out = tmp_path / "profiled.jsonl"
    status, stdout, _ = profile(capsys, rollouts, "-o", out, *RULES, "--targets", "0.25")
    assert status == 0
    assert [row["target_length"] for row in read_jsonl(out)] == [18, None, 17]
    assert "target_length total: q0.25 (at least 3 passing)" in stdout and "2 with a target" in stdout
    status, _, _ = profile(capsys, rollouts, "-o", out, "--overwrite", *RULES, "--targets", "answer=0.5")
    assert [row["target_length"] for row in read_jsonl(out)] == [2, None, 3]
    status, stdout, _ = profile(capsys, rollouts, "-o", out, "--overwrite", *RULES)
    assert "target_length" not in read_jsonl(out)[0] and "with a target" not in stdout
    # the profiled dataset feeds the helper: its targets go into the prompts
    with_targets = tmp_path / "t.jsonl"
    profile(capsys, rollouts, "-o", with_targets, *RULES, "--targets", "0.25")
    rows = add_target_lengths(read_jsonl(with_targets))
    assert [row["prompt"] for row in rows] == [
        "What is 2 + 3? Think for 18 tokens.",
        "What is 7 - 4?",
        "What is 1 + 1? Think for 17 tokens.",
    ]


@pytest.mark.parametrize(
    "value, message",
    [
        ("1.5", "--targets '1.5': needs 0 <= Q <= 1"),
        ("middle=0.5", "--targets 'middle=0.5': the channel must be one of total, reasoning, answer"),
        ("total=half", "--targets 'total=half': expected [CHANNEL=]Q"),
    ],
)
def test_bad_targets_flag_exits_2_with_one_line(value, message, tmp_path, capsys):
    status, _, err = profile(
        capsys, write_rollouts(tmp_path, "jsonl"), "-o", tmp_path / "o.jsonl", "--targets", value
    )
    assert status == 2 and len(err.strip().splitlines()) == 1 and message in err
    assert not (tmp_path / "o.jsonl").exists()


def test_preview_shows_targets_against_lengths(tmp_path, capsys):
    """tests/test_offline_preview.py's rollouts (totals: a 20, 60, 5 wrong, 40; b 15, 25; c non-binary),
    group a's prompt asking for 40: exact with alpha 0.01 gives 1 - 0.2, 1 - 0.2, -0.35, 1; b has no target."""
    rollouts = tmp_path / "r.jsonl"
    with rollouts.open("w") as sink:
        for i, (group, agent, reasoning, answer, reward, tokens) in enumerate(PREVIEW_ROWS):
            row = {"prompt_id": group, "agent": agent, "reasoning_tokens": reasoning, "answer_tokens": answer}
            row.update(reward=reward, completion_tokens=tokens, **({"target_length": 40} if i == 0 else {}))
            sink.write(json.dumps(row) + "\n")
    recipe = tmp_path / "recipe.yaml"
    block = {"target_length": "exact", "target_length_alpha": 0.01}
    recipe.write_text(yaml.safe_dump({"length_penalty": {"default": block}}))
    out = tmp_path / "shaped.jsonl"
    status, stdout, _ = preview(
        capsys, rollouts, "--config", recipe, "--output", out, "--png", tmp_path / "p.png"
    )
    assert status == 0
    shaped = [json.loads(line)["shaped_reward"] for line in out.read_text().splitlines()]
    assert shaped == pytest.approx([0.8, 0.8, -0.35, 1.0, 1.0, 1.0, 0.5, 1.0], abs=1e-12)
    line = next(x for x in stdout.splitlines() if "target length:" in x)
    # length / target: 0.5, 1.5, 0.125, 1.0; only 40 is within 10 %
    assert "4 of 6 rollouts have a target" in line and "min 0.125" in line and "max 1.500" in line
    assert line.endswith("within tolerance 1")
    assert "target_length" in stdout  # the groups touched


def test_profile_writes_the_targets_into_the_prompts(tmp_path, capsys):
    """``--targets 0.5 --target-prompt``: prompt 0's passing totals 4, 6, 8 give 6, written into its last user
    message; the prompts without enough passing rollouts keep their text (the embedded task's first rows)."""
    import datasets

    from tests.test_offline_profile import write_jsonl
    from trl_length_plugin.embedded import make_task_dataset

    prompts = make_task_dataset(3, seed=0)
    rows = [{"prompt_id": 0, "reasoning_tokens": n, "answer_tokens": 1, "reward": 1} for n in (3, 5, 7)]
    rollouts, out = write_jsonl(tmp_path / "rollouts.jsonl", rows), tmp_path / "prompts"
    flags = ["--prompts", "embedded", "--dataset-size", "3", "--min-passing", "3", "--targets", "0.5"]
    status, stdout, _ = profile(capsys, rollouts, "-o", out, *flags, "--target-prompt")
    assert status == 0 and "1 with a target" in stdout
    written = datasets.load_from_disk(str(out))
    assert written["target_length"] == [6, None, None]
    asked = [p[-1]["content"] for p in written["prompt"]]
    original = [p[-1]["content"] for p in prompts["prompt"]]
    assert asked == [f"{original[0]} Think for 6 tokens.", *original[1:]]
    status, _, err = profile(capsys, rollouts, "-o", tmp_path / "x", *flags[:-2], "--target-prompt")
    assert status == 2 and "--target-prompt needs --targets and a TEMPLATE with {n}" in err


def test_gsm8k_rows_get_a_seeded_target_in_the_range_and_a_prompt_asking_for_it():
    """The GPU recipe's mapping (recipe:target_length): L1's uniform targets, the same for the same question."""
    from trl_length_plugin.trl_integration.tasks import GSM8K_TARGET_RANGE, gsm8k_prompt_with_target

    rows = [{"question": f"What is {i} + {i}?", "answer": f"... #### {2 * i}"} for i in range(200)]
    mapped = [gsm8k_prompt_with_target(row) for row in rows]
    targets = [row["target_length"] for row in mapped]
    low, high = GSM8K_TARGET_RANGE
    assert all(low <= t <= high for t in targets) and len(set(targets)) > 100
    assert [gsm8k_prompt_with_target(row)["target_length"] for row in rows] == targets
    first = mapped[0]
    assert first["answer"] == "0"
    assert first["prompt"][-1] == {
        "role": "user",
        "content": f"What is 0 + 0? Think for maximum {targets[0]} tokens.",
    }
    assert first["prompt"][0]["role"] == "system"
