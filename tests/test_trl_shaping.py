"""LengthPluginGRPOTrainer on the real GRPOTrainer (trl 1.16, CPU, embedded model): every length algorithm
and the coefficient switched on through the config give, in a real training step, the engine's output
for the same gathered batch, and the logged metrics match (docs/reference/length-penalties.md §2.2-2.5, §2.14-2.15, §3)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from tests.trl_length_helpers import (
    RecordingTrainer,
    column,
    deterministic_rollout,
    expected_shaping,
    tiny_config,
)
from trl_length_plugin.embedded import correctness_reward, load_tokenizer, make_task_dataset
from trl_length_plugin.shaping import METRIC_KEYS
from trl_length_plugin.shaping import metadata as metadata_module
from trl_length_plugin.trl_integration import LengthPluginGRPOTrainer
from trl_length_plugin.trl_integration import _host as host
from trl_length_plugin.trl_integration.length_shaping import resolve_correctness

BAND = {"total": {"a": 14.0, "b": 30.0, "f": 0.5}}


def with_columns(dataset, **columns):
    """Add per-prompt columns; each value is a function of the row index."""
    for name, value in columns.items():
        dataset = dataset.add_column(name, [value(i) for i in range(len(dataset))])
    return dataset


CASES = {
    "group_relative": ({"default": {"group_total_length_penalty_coeff": 0.2}}, {}),
    "zmad": (
        {
            "default": {
                "total_zmad_threshold": 0.3,
                "total_zmad_penalty": 0.1,
                "reasoning_zmad_threshold": 0.3,
                "reasoning_zmad_penalty": 0.05,
            }
        },
        {},
    ),
    "shortest_bonus_longest_penalty": (
        {
            "default": {
                "total_bonus": 0.1,
                "reasoning_bonus": 0.05,
                "longest_total_penalty": 0.1,
                "longest_answer_penalty": 0.05,
            }
        },
        {},
    ),
    "profiled": (
        {"default": {"profiled_length_penalty": 0.2, "profiled_length_n_std": 0.0}},
        {
            "profiled_rewards": lambda i: [1, 1, 0, 1],
            "profiled_output_lengths": lambda i: [10, 14 + i % 9, 30, 12],
        },
    ),
    "profile_band": (
        {
            "default": {"profile_band_total": True},
            "profile_band": {"enabled": True, "defaults": {"reasoning": {"a": 4.0, "b": 16.0, "f": 0.6}}},
        },
        {"profile_band": lambda i: {"total": {**BAND["total"], "a": 8.0 + i % 10}}},
    ),
    "profile_gate": (
        {"default": {"group_total_length_penalty_coeff": 0.2, "group_length_penalty_profile_gate": True}},
        {"profile_band": lambda i: {"total": {**BAND["total"], "a": 40.0 if i % 8 == 7 else 8.0, "b": 60.0}}},
    ),
    "pass_rate": ({"default": {"pass_rate_length_penalty_weight": 0.3}}, {}),
    "agent_overrides": (
        {
            "default": {"group_total_length_penalty_coeff": 0.2},
            "agent_overrides": {
                "math": {"length_type": "chars", "total_bonus": 0.1},
                "judge": {"enabled": False},
            },
        },
        {"agent": lambda i: "judge" if i % 3 == 0 else "math"},
    ),
}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_each_algorithm_matches_the_engine(case, tiny_model_dir, tokenizer, tmp_path):
    block, columns = CASES[case]
    evaluate = case == "group_relative"
    args = tiny_config(
        tmp_path,
        length_penalty=block,
        per_device_train_batch_size=16,
        max_completion_length=48,
        # zMAD needs positives of different lengths in one group: at 0.5 the warm model's correct answers
        # of a group are often identical on some CPUs' kernels, which leaves it nothing to flag
        temperature=1.0 if case == "zmad" else 0.5,
        **(dict(eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8) if evaluate else {}),
    )
    trainer = RecordingTrainer(
        model=str(tiny_model_dir),
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=with_columns(make_task_dataset(32), **columns),
        eval_dataset=make_task_dataset(8, seed=1) if evaluate else None,
        processing_class=tokenizer,
    )
    trainer.train()
    (record,) = [r for r in trainer.records if r.mode == "train"]
    raw = record.rewards_per_func[:, 0].double()
    shaped, metrics, _, _ = expected_shaping(record, args, tokenizer)
    written = raw + record.rewards_per_func[:, column(trainer, "length_penalty")].double()
    torch.testing.assert_close(written, shaped, rtol=0, atol=1e-6)
    assert not torch.equal(shaped, raw), f"{case}: the batch gave the algorithm nothing to do"
    logged = trainer.state.log_history[0]
    for key in METRIC_KEYS:
        assert logged[key] == pytest.approx(metrics[key], abs=1e-9), key
    assert logged["rewards/length_penalty/mean"] == pytest.approx(float((shaped - raw).mean()), abs=1e-6)
    if evaluate:  # evaluation batches are never shaped and log no length metrics (§2.15)
        evals = [r for r in trainer.records if r.mode == "eval"]
        assert evals and all(bool((r.rewards_per_func[:, 1] == 0).all()) for r in evals)
        eval_logs = [h for h in trainer.state.log_history if "eval_reward" in h]
        assert eval_logs and not any(k.startswith("eval_length_penalty/") for k in eval_logs[0])


def coefficient_plan(question, group, member):
    """Groups 0..3 of each batch: all correct with varied lengths, all wrong, mixed, all correct and equal."""
    return [(2 * member, True), (member, False), (member, member % 2 == 0), (3, True)][group % 4]


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_coefficient_normalization_and_filter(loss_type, random_model_dir, tmp_path):
    """The coefficient (§3.1), its group normalization and the non-zero-std filter (§3.3) on TRL's
    advantages, masks and denominators. Completions come from a deterministic TRL ``rollout_func`` so the
    batch holds every kind of group; the rest of the step is the real trainer. Two accumulation steps: TRL
    shuffles rows before the micro-batch split, so kept rows land unevenly, and the summed micro-batch
    losses must still average over the kept rows of the whole generation batch (§3.3, §4.1)."""
    tokenizer = load_tokenizer(random_model_dir)
    args = tiny_config(
        tmp_path,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        length_penalty_coeff=1.0,
        length_penalty_min_tokens=2,
        drop_zero_std_groups=True,
        loss_type=loss_type,
        length_penalty={"default": {"group_total_length_penalty_coeff": 0.1}},
    )
    trainer = RecordingTrainer(
        model=str(random_model_dir),
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=make_task_dataset(32),
        processing_class=tokenizer,
        rollout_func=deterministic_rollout(tokenizer, 4, coefficient_plan),
    )
    trainer.train()
    (record,) = trainer.records
    raw = record.rewards_per_func[:, 0].double()
    shaped, _, advantages, keep = expected_shaping(record, args, tokenizer)
    torch.testing.assert_close(raw + record.rewards_per_func[:, 1].double(), shaped, rtol=0, atol=1e-6)
    # dropped: the all-wrong group (all equal) and the all-correct group of equal lengths (range 0)
    assert keep.tolist() == [True] * 4 + [False] * 4 + [True] * 4 + [False] * 4
    torch.testing.assert_close(record.output["advantages"].double(), advantages, rtol=0, atol=1e-5)
    # mixed groups keep TRL's own normalization on the shaped rewards; all-correct groups are only centred
    mixed = shaped[8:12]
    stock = (mixed - mixed.mean()) / (mixed.std() + 1e-4)
    torch.testing.assert_close(record.output["advantages"][8:12].double(), stock, rtol=0, atol=1e-5)
    correct = shaped[0:4]
    torch.testing.assert_close(
        record.output["advantages"][0:4].double(), correct - correct.mean(), rtol=0, atol=1e-6
    )
    assert bool((record.output["advantages"][4:8] == 0).all())
    # filtered rows leave the loss mask through tool_mask; completion_mask (TRL's attention mask) stays whole
    assert bool((record.output["completion_mask"].sum(1) > 0).all())
    mask = record.output["completion_mask"] * record.output["tool_mask"]
    assert bool((mask[~keep] == 0).all()) and bool((mask[keep].sum(1) > 0).all())
    assert int(record.output["num_items_in_batch"]) == int(mask.sum())
    logged = trainer.state.log_history[0]
    assert logged["length_penalty/zero_std_filtered_frac"] == pytest.approx(0.5)
    assert logged["length_penalty/coeff"] == 1.0
    # filtered rows leave the denominator: the summed micro-batch losses equal stock TRL's loss on the kept
    # rows of the whole generation batch, as one batch (grpo divides it by the accumulation steps once more)
    micro_batches = list(trainer.loss_inputs)  # _compute_loss below records again
    kept = [(inputs["completion_mask"] * inputs["tool_mask"]).sum(1) > 0 for inputs in micro_batches]
    assert [int(k.sum()) for k in kept] != [4, 4]  # uneven: a per-micro-batch rescaling would be wrong
    rows = kept[0].numel()
    subset = {
        key: torch.cat([inputs[key][k] for inputs, k in zip(micro_batches, kept, strict=True)])
        if torch.is_tensor(value) and value.dim() and value.shape[0] == rows
        else value
        for key, value in micro_batches[0].items()
    }
    subset.pop("length_keep_scale", None)
    if loss_type == "dapo":
        assert int(subset["num_items_in_batch"]) == int(subset["completion_mask"].sum())
    accumulation = trainer.current_gradient_accumulation_steps
    assert accumulation == 2
    with torch.no_grad():
        plugin_loss = sum(trainer._compute_loss(trainer.model, inputs) for inputs in micro_batches)
        stock_loss = GRPOTrainer._compute_loss(trainer, trainer.model, subset)
    factor = accumulation if loss_type == "grpo" else 1
    torch.testing.assert_close(plugin_loss, stock_loss * factor, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_coefficient_log_lines(random_model_dir, tmp_path, caplog):
    """One ``Length penalty:`` INFO summary line per step from the main process, with the step's numbers
    (docs/reference/length-coefficient.md §3.4; the per-rollout lines are behind
    ``length_penalty_log_rollouts``, tests/test_trl_model_card.py)."""
    tokenizer = load_tokenizer(random_model_dir)
    args = tiny_config(tmp_path, length_penalty_coeff=0.5)
    trainer = LengthPluginGRPOTrainer(
        model=str(random_model_dir),
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=make_task_dataset(16),
        processing_class=tokenizer,
        rollout_func=deterministic_rollout(tokenizer, 4),
    )
    with caplog.at_level("INFO", logger="trl_length_plugin"):
        trainer.train()
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Length penalty:")]
    assert line.startswith("Length penalty: step=0 coeff=0.5 rollouts=8 groups=2 penalized=")
    multipliers = [float(m) for m in re.findall(r"multiplier_(?:mean|min)=([0-9.]+)", line)]
    assert len(multipliers) == 2 and 0 < multipliers[1] <= multipliers[0] <= 1


@pytest.mark.slow
def test_warmup_schedule_and_curves(random_model_dir, tmp_path):
    """``length_penalty_coeff_warmup_steps`` raises c linearly (a length schedule); the callback writes the PNG."""
    tokenizer = load_tokenizer(random_model_dir)
    args = tiny_config(
        tmp_path,
        max_steps=3,
        length_penalty_coeff=1.0,
        length_penalty_coeff_warmup_steps=2,
        length_curves_png=True,
    )
    trainer = LengthPluginGRPOTrainer(
        model=str(random_model_dir),
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=make_task_dataset(16),
        processing_class=tokenizer,
        rollout_func=deterministic_rollout(tokenizer, 4),
    )
    trainer.train()
    coeffs = [h["length_penalty/coeff"] for h in trainer.state.log_history if "length_penalty/coeff" in h]
    assert coeffs == [0.0, 0.5, 1.0]
    assert (tmp_path / "length_curves.png").stat().st_size > 0


@pytest.mark.slow
def test_nested_metadata_warns_at_setup(random_model_dir, tmp_path, caplog):
    """Metadata nested under ``extra_env_info`` is ignored, with one warning at setup (docs/reference/length-penalties.md §2.14)."""
    nested = with_columns(make_task_dataset(8), extra_env_info=lambda i: {"profile_band": BAND})
    with caplog.at_level("WARNING", logger="trl_length_plugin"):
        LengthPluginGRPOTrainer(
            model=str(random_model_dir),
            reward_funcs=[correctness_reward],
            args=tiny_config(tmp_path, length_penalty={"default": {"profile_band_total": True}}),
            train_dataset=nested,
            processing_class=load_tokenizer(random_model_dir),
        )
    assert sum("extra_env_info" in r.getMessage() for r in caplog.records) == 1


# -- rejected at setup, before any model loads (the model path does not exist) -----------------------------
MISSING_MODEL = "/nonexistent/model"


def two_rewards():
    def format_reward(completions, **kwargs):
        return [0.0] * len(completions)

    return [correctness_reward, format_reward]


@pytest.mark.parametrize(
    ("overrides", "funcs", "message"),
    [
        ({"length_penalty_coeff": 1.0}, two_rewards(), "correctness_reward: required"),
        ({"length_penalty_coeff": 1.0, "correctness_reward": "nope"}, two_rewards(), "matches no"),
        (
            {"correctness_reward": "correctness_reward", "length_penalty_coeff": 1.0},
            [correctness_reward] * 2,
            "ambiguous",
        ),
        (
            {
                "length_penalty_coeff": 1.0,
                "drop_zero_std_groups": True,
                "loss_type": "grpo",
                "entropy_coef": 0.01,
            },
            [correctness_reward],
            "entropy",
        ),
    ],
)
def test_trainer_rejections_before_model_load(overrides, funcs, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        LengthPluginGRPOTrainer(
            model=MISSING_MODEL, reward_funcs=funcs, args=tiny_config(tmp_path, **overrides)
        )


def test_named_correctness_reward_among_several(tmp_path):
    with pytest.raises(OSError):  # the names resolved; only the missing model stops it
        LengthPluginGRPOTrainer(
            model=MISSING_MODEL,
            reward_funcs=two_rewards(),
            args=tiny_config(tmp_path, length_penalty_coeff=1.0, correctness_reward="correctness_reward"),
        )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"length_penalty": {"default": {"length_type": "token"}}}, "default.length_type"),
        ({"length_penalty": {"default": {"totl_bonus": 0.1}}}, "default.totl_bonus"),
        (
            {
                "length_penalty": {
                    "profile_band": {"enabled": True, "defaults": {"total": {"a": 9, "b": 3, "f": 1}}}
                }
            },
            "profile_band.defaults.total",
        ),
        ({"length_penalty": '{"verbose": true, "default": {"top_percentile": 2}}'}, "default.top_percentile"),
        (
            {"length_penalty_coeff": 1.0, "multi_objective_aggregation": "normalize_then_sum"},
            "normalize_then_sum",
        ),
        ({"length_penalty_coeff": -1.0}, "length_penalty_coeff"),
        ({"reasoning_tags": ["<t>", "<t>"]}, "reasoning_tags"),
    ],
)
def test_config_rejections(overrides, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        tiny_config(tmp_path, **overrides)


def test_block_from_json_string_and_yaml_file(tmp_path):
    from_json = tiny_config(tmp_path, length_penalty='{"default": {"total_bonus": 0.1}}')
    assert from_json.length_penalty == {"default": {"total_bonus": 0.1}}  # stored as a mapping for loggers
    path = tmp_path / "block.yaml"
    path.write_text("length_penalty:\n  default:\n    total_bonus: 0.1\n")
    from_file = tiny_config(tmp_path, length_penalty=str(path))
    assert from_file.length_penalty_config == from_json.length_penalty_config
    assert from_file.shaping.enabled and "length_penalty_config" not in from_file.to_dict()


def test_luspo_flag_sets_the_loss_before_grpo_post_init(tmp_path):
    args = tiny_config(tmp_path, luspo=True)
    assert (args.loss_type, args.importance_sampling_level) == ("luspo", "sequence")


def test_stock_config_is_refused(tmp_path):
    with pytest.raises(TypeError, match="LengthPluginGRPOConfig"):
        LengthPluginGRPOTrainer(
            model=MISSING_MODEL,
            reward_funcs=[correctness_reward],
            args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False),
        )


def test_host_check_names_the_trl_version(monkeypatch):
    import trl

    host.check_trl_host()
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with pytest.raises(RuntimeError, match="built for trl==1.16.0"):
        host.check_trl_host()
    monkeypatch.setattr(trl, "__version__", "1.16.0")
    monkeypatch.setattr(GRPOTrainer, "_calculate_rewards", lambda self, inputs, prompts: None)
    with pytest.raises(RuntimeError, match="_calculate_rewards"):
        host.check_trl_host()


def unscorable_first_row(completions, answer, **kwargs):
    """The embedded correctness reward with ``None`` (TRL: unscorable) on the batch's first row."""
    scores = correctness_reward(completions, answer, **kwargs)
    return [None if i == 0 else score for i, score in enumerate(scores)]


@pytest.mark.slow
def test_coefficient_skips_groups_with_an_unscorable_row(random_model_dir, tmp_path):
    """A group holding a ``None`` correctness reward is skipped whole by the coefficient (docs/reference/length-penalties.md §2.4),
    as verl skips it, and keeps TRL's own advantages (its unscorable row gets 0, the rest TRL's normalization);
    the other groups are still shaped."""
    tokenizer = load_tokenizer(random_model_dir)
    args = tiny_config(
        tmp_path, per_device_train_batch_size=16, length_penalty_coeff=1.0, length_penalty_min_tokens=2
    )
    trainer = RecordingTrainer(
        model=str(random_model_dir),
        reward_funcs=[unscorable_first_row],
        args=args,
        train_dataset=make_task_dataset(32),
        processing_class=tokenizer,
        rollout_func=deterministic_rollout(tokenizer, 4, coefficient_plan),
    )
    trainer.train()
    (record,) = trainer.records
    correctness, penalty = record.rewards_per_func[:, 0], record.rewards_per_func[:, 1]
    assert bool(torch.isnan(correctness[0])) and bool(torch.isnan(penalty[0]))
    assert penalty[1:4].tolist() == [0.0, 0.0, 0.0]  # all correct, lengths 2..6: shaped if not skipped
    total = correctness[:4].double()
    stock = (total - total.nanmean()) / (total[1:].std() + 1e-4)
    torch.testing.assert_close(
        record.output["advantages"][:4].double(), stock.nan_to_num(0.0), rtol=0, atol=1e-6
    )
    assert bool((penalty[8:12] != 0).any())  # the mixed group is still shaped


def test_no_reward_source_gives_trls_message(tmp_path):
    with pytest.raises(ValueError, match="No reward source provided"):
        LengthPluginGRPOTrainer(
            model=MISSING_MODEL, reward_funcs=[], args=tiny_config(tmp_path, length_penalty_coeff=1.0)
        )


def test_correctness_reward_may_name_an_environments_reward():
    """With an ``environment_factory`` the environment's reward columns exist only after TRL's setup, so a
    name matching no reward function is resolved then (None now), against TRL's column names."""
    assert resolve_correctness(["format_reward"], "MathEnv", has_environment=True) is None
    assert resolve_correctness([], None, has_environment=True) is None
    assert resolve_correctness(["format_reward", "MathEnv"], "MathEnv", has_environment=False) == 1
    with pytest.raises(ValueError, match="matches no"):
        resolve_correctness(["format_reward"], "MathEnv", has_environment=False)


def test_band_without_any_source_warns_at_setup(tmp_path, caplog):
    args = tiny_config(tmp_path, length_penalty={"default": {"group_total_length_penalty_coeff": 0.1,
                                                             "group_length_penalty_profile_gate": True}})  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"), pytest.raises(OSError):
        LengthPluginGRPOTrainer(model=MISSING_MODEL, reward_funcs=[correctness_reward], args=args,
                                train_dataset=make_task_dataset(8))  # fmt: skip
    assert any("no 'profile_band' column" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_metadata_is_parsed_once_per_prompt_across_steps(random_model_dir, tmp_path, monkeypatch, caplog):
    """Four prompts over four steps: each prompt's metadata is parsed the first time it is seen (keyed by the
    entry itself); prompt 3's malformed band is warned about once and counted on each step it
    appears in (reference §2.12, §2.14)."""
    parsed = []
    original = metadata_module.parse_prompt_metadata
    monkeypatch.setattr(
        metadata_module, "parse_prompt_metadata", lambda e: parsed.append(len(e)) or original(e)
    )

    def band(i):
        return {"total": {"a": 30.0, "b": 10.0, "f": 0.5} if i == 3 else {"a": 8.0 + i, "b": 30.0, "f": 0.5}}

    dataset = with_columns(make_task_dataset(4), profile_band=band)
    tokenizer = load_tokenizer(random_model_dir)
    trainer = RecordingTrainer(
        model=str(random_model_dir),
        reward_funcs=[correctness_reward],
        args=tiny_config(tmp_path, max_steps=4, length_penalty={"default": {"profile_band_total": True}}),
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=deterministic_rollout(tokenizer, 4),
    )
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        trainer.train()
    index = {prompt[-1]["content"]: i for i, prompt in enumerate(dataset["prompt"])}
    seen = [sorted({index[x["prompt"][-1]["content"]] for x in record.inputs}) for record in trainer.records]
    assert sum(parsed) == len({i for ids in seen for i in ids}) < sum(map(len, seen))
    invalid = [
        row["length_penalty/invalid_metadata_frac"]
        for row in trainer.state.log_history
        if "length_penalty/invalid_metadata_frac" in row
    ]
    assert invalid == [0.5 if 3 in ids else 0.0 for ids in seen]
    assert sum("malformed total metadata" in r.getMessage() for r in caplog.records) == 1


def graded_first_group(completions, answer, **kwargs):
    """A reward model's scores on group 0 (all <= 0, continuous), the binary correctness elsewhere."""
    scores = correctness_reward(completions, answer, **kwargs)
    return [-0.5 - 0.25 * i if i < 4 else score for i, score in enumerate(scores)]


class KeepsTRLAdvantages(RecordingTrainer):
    def _apply(self, output, result, rows):
        self.trl_advantages = output["advantages"].detach().clone()
        super()._apply(output, result, rows)


@pytest.mark.slow
def test_coefficient_on_a_non_binary_reward_keeps_trls_advantages(random_model_dir, tmp_path, caplog):
    """A continuous score is skipped by the coefficient with one warning and a metric, and its group keeps
    TRL's own (non-zero) advantages instead of the all-wrong group's 0 (reference §3.1)."""
    tokenizer = load_tokenizer(random_model_dir)
    trainer = KeepsTRLAdvantages(
        model=str(random_model_dir),
        reward_funcs=[graded_first_group],
        args=tiny_config(tmp_path, length_penalty_coeff=1.0),
        train_dataset=make_task_dataset(16),
        processing_class=tokenizer,
        rollout_func=deterministic_rollout(tokenizer, 4, coefficient_plan),
    )
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        trainer.train()
    (record,) = trainer.records
    advantages = record.output["advantages"]
    assert torch.equal(advantages[:4], trainer.trl_advantages[:4]) and bool(advantages[:4].abs().sum() > 0)
    assert trainer.state.log_history[0]["length_penalty/coeff_skipped_frac"] == 0.5
    assert sum("non-binary correctness reward" in r.getMessage() for r in caplog.records) == 1


LOG_SCRIPT = """
import sys
from trl_length_plugin.embedded import CPU_RUN_ARGS, correctness_reward, load_tokenizer, make_task_dataset
from trl_length_plugin.trl_integration import LengthPluginGRPOConfig, LengthPluginGRPOTrainer
model, output, level = sys.argv[1:4]
extra = {} if level == "default" else {"log_level": level}
args = LengthPluginGRPOConfig(output_dir=output, per_device_train_batch_size=8, num_generations=4,
    max_completion_length=16, max_steps=1, length_penalty_coeff=1.0, **CPU_RUN_ARGS, **extra)
LengthPluginGRPOTrainer(model=model, reward_funcs=[correctness_reward], args=args,
    train_dataset=make_task_dataset(8), processing_class=load_tokenizer(model)).train()
"""


@pytest.mark.slow
def test_log_lines_follow_trls_log_level(random_model_dir, tmp_path):
    """Without any logging setup, the plugin's INFO lines (one settings line per feature with its values, the
    step's ``Length penalty:`` summary) appear at TRL's default ``log_level`` (passive), which leaves
    transformers at WARNING, each on a line of its own beside the progress bar; ``log_level="warning"``
    hides them."""
    script = tmp_path / "run.py"
    script.write_text(LOG_SCRIPT)
    stderr = {}
    for level in ("default", "warning"):
        out = subprocess.run(
            [sys.executable, str(script), str(random_model_dir), str(tmp_path / level), level],
            capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        stderr[level] = out.stderr
    settings = (
        "[INFO|trl_length_plugin] trl-length-plugin: length coefficient: length_penalty_coeff=1.0, "
        "length_penalty_min_tokens=0, length_penalty_coeff_warmup_steps=0"
    )
    assert settings in stderr["default"].splitlines()
    segments = re.split(r"[\r\n]", stderr["default"])  # a progress bar redraws after "\r"
    (summary,) = [segment for segment in segments if "Length penalty:" in segment]
    assert summary.startswith("[INFO|trl_length_plugin] Length penalty: step=0 coeff=1 rollouts=8 groups=2 ")
    assert "***** Running training *****" not in stderr["default"]  # transformers' INFO
    assert "trl-length-plugin" not in stderr["warning"] and "Length penalty:" not in stderr["warning"]
