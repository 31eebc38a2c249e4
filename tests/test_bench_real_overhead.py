"""bench/bench_real_overhead.py (issue 30) without training: each feature is measured against an arm that
differs from it only by the feature (stock TRL where it can run the same settings), and every arm's settings are a valid config of its trainer."""

from __future__ import annotations

import pytest

from bench import bench_real_overhead as bench
from trl_length_plugin.embedded import real_task


@pytest.mark.parametrize("feature", list(bench.AGAINST))
def test_each_feature_runs_against_a_stock_arm_of_the_same_family(feature):
    base, target = bench.AGAINST[feature]
    plugin, keys = bench.ARMS[feature]
    _, base_keys = bench.ARMS[base]
    assert plugin and target == (1.10 if feature.startswith("score centering") else 1.02)
    if feature != "LUSPO":  # luspo: true sets stock GSPO's keys itself (the config test below)
        assert {key: keys[key] for key in base_keys} == base_keys  # the feature keeps its baseline's settings


@pytest.mark.parametrize("name", list(bench.ARMS))
def test_every_arm_builds_a_valid_config(name, tmp_path):
    from trl import GRPOConfig

    from trl_length_plugin.embedded import CPU_RUN_ARGS
    from trl_length_plugin.trl_integration import LengthPluginGRPOConfig

    plugin, keys = bench.ARMS[name]
    config = (LengthPluginGRPOConfig if plugin else GRPOConfig)(
        output_dir=str(tmp_path), max_steps=2, **real_task.REAL.training, **CPU_RUN_ARGS, **keys
    )
    assert config.num_generations == 8 and config.max_completion_length == 48
    if name == "LUSPO":  # LUSPO keeps stock GSPO's ratio and clip range, and changes only the loss
        assert (config.importance_sampling_level, config.epsilon, config.epsilon_high) == (
            "sequence",
            2e-3,
            2.5e-3,
        )
        assert config.loss_type == "luspo"


def test_the_shaping_arms_data_carries_the_columns_its_terms_read():
    data = bench.dataset(4, seed=0)
    assert len(data) == 4 and {bench.PROFILED_REWARDS, bench.PROFILE_BAND} <= set(data.column_names)


def test_each_family_alternates_base_and_features_abba():
    assert bench.families(["group shaping", "LUSPO", "coefficient"]) == [
        ["stock GRPOTrainer", "group shaping", "coefficient"],
        ["stock GSPO", "LUSPO"],
    ]
    order = bench.abba(["B", "S", "C"], rounds=2)
    assert order == ["B", "S", "C", "C", "S", "B"] * 2
    assert not bench.uses_vllm("LUSPO") and bench.uses_vllm("score centering off")


def test_each_half_round_pairs_the_feature_with_the_base_trainer_of_its_half_step_by_step():
    order = bench.abba(["B", "S", "C"], rounds=1)  # B S C | C S B
    runs = [{"cpu": cpu} for cpu in ([10, 20], [11, 22], [12, 20], [9, 30], [10, 31], [10, 30])]
    assert bench.pair_ratios(order, runs, "S", "B") == [pytest.approx(1.1), pytest.approx((1 + 31 / 30) / 2)]
    assert bench.pair_ratios(order, runs, "C", "B") == [
        pytest.approx((1.2 + 1.0) / 2),
        pytest.approx((0.9 + 1) / 2),
    ]


def test_the_interval_is_students_over_the_half_rounds():
    mean, low, high = bench.mean_interval([1.0, 1.02, 1.04, 1.02])
    sd = (0.02**2 * 2 / 3) ** 0.5
    assert mean == pytest.approx(1.02) and high - mean == pytest.approx(3.182 * sd / 2, rel=1e-3)
    assert bench.mean_interval([1.0])[1:] == (float("-inf"), float("inf"))  # one unit settles nothing


def test_the_timed_plugin_trainer_wraps_methods_the_trainer_has():
    from bench.bench_trl_overhead import timed_plugin
    from trl_length_plugin.trl_integration import LengthPluginGRPOTrainer

    timed = timed_plugin({})
    wrapped = [name for name, value in vars(timed).items() if callable(value) and not name.startswith("__")]
    assert wrapped and all(hasattr(LengthPluginGRPOTrainer, name) for name in wrapped)
