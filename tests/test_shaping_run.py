"""The core's run object (``ShapingRun``, docs/write-a-host.md) and the row builder every host shares
(``shaping/rows.py``): the run's step is ``shape_rollouts``, its logs are the §3.4 and §2.15 lines, its
checkpoint state is the schedule's (docs/reference/length-coefficient.md §3.7); the truncated rule and the
metadata entries against plain loops (docs/reference/length-penalties.md §2.14, §2.19)."""

from __future__ import annotations

import json
import logging

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_length_plugin.shaping import TRL_NORMALIZATION, RolloutBatch, load_shaping_config, shape_rollouts
from trl_length_plugin.shaping.columns import METADATA_COLUMNS
from trl_length_plugin.shaping.rows import metadata_entries, truncated_rows
from trl_length_plugin.shaping.run import ShapingRun
from trl_length_plugin.shaping.schedule import STATE_FILE

COEFF = {"length_penalty_coeff": 1.0, "drop_zero_std_groups": True}
VERBOSE = {"length_penalty": {"verbose": True, "default": {"group_total_length_penalty_coeff": 0.1}}}


def batch() -> RolloutBatch:
    """Two mixed groups of two: the coefficient halves the longer correct rollout of group 0."""
    return RolloutBatch(
        rewards=[1.0, 1.0, 1.0, 0.0],
        group_index=[0, 0, 1, 1],
        answer_lengths=[10, 20, 5, 9],
        loss_lengths=[10, 20, 5, 9],
    )


def messages(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def test_the_runs_step_is_shape_rollouts():
    config = load_shaping_config({**COEFF, "length_penalty_coeff_warmup_steps": 4})
    result = ShapingRun(config, TRL_NORMALIZATION).shape(batch(), 2, shaping_weight=0.5)
    expected = shape_rollouts(batch(), config, TRL_NORMALIZATION, step=2, shaping_weight=0.5)
    for name in ("rewards", "totals", "advantages", "keep"):
        torch.testing.assert_close(getattr(result, name), getattr(expected, name), rtol=0, atol=0)
    assert result.metrics == expected.metrics


def test_the_run_logs_a_summary_per_rollout_lines_or_json_lines(caplog, tmp_path):
    config = load_shaping_config(COEFF)
    run = ShapingRun(config)
    result = run.shape(batch(), 3)
    records = run.coefficient_records(result, 3)
    assert [r["session_id"] for r in records] == ["step3/group0"] * 2 + ["step3/group1"] * 2
    with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
        run.log(3, records=records)
        run.log(3, records=records, is_main_process=False)  # other processes say nothing
    assert messages(caplog) == [
        "Length penalty: step=3 coeff=1 rollouts=4 groups=2 penalized=1 generated_tokens_mean=11.0 "
        "multiplier_mean=0.875000 multiplier_min=0.500000 reward_reduction_mean=0.125000"
    ]
    caplog.clear()
    run.log_rollouts = True
    with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
        run.log(3, records=run.coefficient_records(result, 3, ["a", "a", "b", "b"]))
    assert len(caplog.records) == 4 and messages(caplog)[1].startswith(
        "Length penalty: session_id=a rollout_id=1 generated_tokens=20 multiplier=0.500000"
    )
    run.log_file = tmp_path / "logs" / "coefficient.jsonl"
    run.log(3, records=records)
    lines = [json.loads(line) for line in run.log_file.read_text().splitlines()]
    assert [line["multiplier"] for line in lines] == [1.0, 0.5, 1.0, 1.0] and lines[0]["step"] == 3


def test_a_zero_coefficient_has_no_records_and_the_group_records_follow_verbose(caplog):
    warming = ShapingRun(load_shaping_config({**COEFF, "length_penalty_coeff_warmup_steps": 4}))
    assert warming.coefficient_records(warming.shape(batch(), 0), 0) == []  # the warm-up's step 0: coeff 0
    run = ShapingRun(load_shaping_config(VERBOSE))
    result = run.shape(batch(), 0)
    with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
        run.log(0, result.penalties.groups, run.coefficient_records(result, 0))
    assert [m.splitlines()[0] for m in messages(caplog)] == [
        "length_penalty group=0 agent=default status=shaped",
        "length_penalty group=1 agent=default status=shaped",
    ]


def test_the_run_announces_its_settings_and_keeps_its_schedule_across_a_checkpoint(caplog, tmp_path):
    schedule = [{"key": "length_penalty_coeff", "stages": [{"until_step": 4, "value": 0.25}]}]
    run = ShapingRun(load_shaping_config({**COEFF, "length_schedule": schedule}))
    with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
        run.announce(" (reward wrapper)")
    assert messages(caplog)[0] == (
        "trl-length-plugin: length coefficient: length_penalty_coeff=1.0, length_penalty_min_tokens=0, "
        "length_penalty_coeff_warmup_steps=0 (reward wrapper)"
    )
    run.save(str(tmp_path), 2)
    assert json.loads((tmp_path / STATE_FILE).read_text())["values"] == {"length_penalty_coeff": 0.25}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
        run.resume(str(tmp_path), 2)
        run.resume(str(tmp_path / "missing"), 2)
    assert (
        messages(caplog)[0]
        == "trl-length-plugin: length_schedule: resumed at step 2: length_penalty_coeff=0.25"
    )
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.WARNING]


# -- the row builder ---------------------------------------------------------------------------------------
def truncated_loop(ids: list[list[int]], stops: list[int], max_length: int | None) -> list[bool]:
    """§2.19 row by row: tokens, no end-of-sequence last, and the limit reached when there is one."""
    return [
        bool(row) and row[-1] not in stops and (max_length is None or len(row) >= max_length) for row in ids
    ]


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.lists(st.integers(0, 6), max_size=6), max_size=8),
    stops=st.lists(st.one_of(st.none(), st.integers(0, 6)), max_size=3),
    max_length=st.one_of(st.none(), st.integers(1, 7)),
)
def test_truncated_rows_match_a_loop(ids, stops, max_length):
    lengths = torch.tensor([len(row) for row in ids], dtype=torch.long)
    last = torch.tensor([row[-1] if row else -1 for row in ids], dtype=torch.long)
    flags = truncated_rows(last, lengths, stops, max_length)
    assert flags.tolist() == truncated_loop(ids, [s for s in stops if s is not None], max_length)


def test_metadata_entries_read_top_level_columns_first_then_the_nested_mapping():
    band = {"total": {"a": 1, "b": 2, "f": 0.5}}
    columns = {"profile_band": [band, None, None], "target_length": [None, 7, None], "other": [1, 2, 3]}
    nested = [{"target_length": 3, "profile_band": "ignored"}, "not a mapping", None]
    entries = metadata_entries(columns, 3, nested)
    blank = dict.fromkeys(METADATA_COLUMNS)
    assert entries == [
        {**blank, "profile_band": band, "target_length": 3},
        {**blank, "target_length": 7},
        None,
    ]
    assert metadata_entries({"other": [1]}, 1) is None  # nothing to read
    assert metadata_entries({}, 2, [{"target_length": 4}, {}]) == [{**blank, "target_length": 4}, None]


def test_log_step_builds_the_records_only_where_they_are_written(caplog, monkeypatch):
    """A batch shaped in one call: one summary line on the main process; the per-rollout records are not even
    built on another process, or when neither INFO lines nor a JSON file would take them."""
    run = ShapingRun(load_shaping_config(COEFF))
    result = run.shape(batch(), 3)
    with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
        run.log_step(result, 3)
    assert [m.split(" rollouts=")[0] for m in messages(caplog)] == ["Length penalty: step=3 coeff=1"]
    built = []
    monkeypatch.setattr(run, "coefficient_records", lambda *args: built.append(args) or [])
    with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
        run.log_step(result, 3, is_main_process=False)
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        run.log_step(result, 3)
    assert built == []


def test_a_corrupted_schedule_state_is_a_warning_and_the_schedule_follows_the_step(caplog, tmp_path):
    """Issue 42: a corrupted or malformed schedule state in a checkpoint gave a traceback on resume; it is a
    record only (the schedule continues by the step), so it is a one-line warning like a missing one."""
    schedule = [{"key": "length_penalty_coeff", "stages": [{"until_step": 4, "value": 0.25}]}]
    run = ShapingRun(load_shaping_config({**COEFF, "length_schedule": schedule}))
    for content, why in (("{not json", "Expecting property name"), ("[1]", "not a JSON object")):
        (tmp_path / STATE_FILE).write_text(content)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
            run.resume(str(tmp_path), 2)
        [record] = caplog.records
        assert record.levelname == "WARNING" and "\n" not in record.getMessage()
        assert record.getMessage().startswith(
            f"trl-length-plugin: length_schedule: {tmp_path / STATE_FILE} is unreadable ("
        )
        assert why in record.getMessage() and record.getMessage().endswith("the schedule continues by step 2")
