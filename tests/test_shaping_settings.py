"""The settings lines of a run (docs/reference/length-coefficient.md §3.4): one line per length feature that
is on, each key it set with its value."""

from __future__ import annotations

from trl_length_plugin.shaping import load_shaping_config
from trl_length_plugin.shaping.settings import shaping_settings_lines


def test_one_line_per_feature_with_values():
    config = load_shaping_config(
        {
            "length_penalty": {
                "default": {"group_total_length_penalty_coeff": 0.1, "length_type": "chars"},
                "agent_overrides": {"math": {"total_bonus": 0.05}, "code": None},
                "profile_band": {"enabled": True, "defaults": {"total": {"a": 10, "b": 20, "f": 0.5}}},
            },
            "length_penalty_coeff": 0.5,
            "length_penalty_min_tokens": 8,
            "drop_zero_std_groups": True,
        }
    )
    assert shaping_settings_lines(config) == [
        "trl-length-plugin: group length penalties: length_penalty.agent_overrides.code=null, "
        "length_penalty.agent_overrides.math.total_bonus=0.05, "
        "length_penalty.default.group_total_length_penalty_coeff=0.1, length_penalty.default.length_type=chars, "
        "length_penalty.profile_band.defaults.total.a=10.0, length_penalty.profile_band.defaults.total.b=20.0, "
        "length_penalty.profile_band.defaults.total.f=0.5, length_penalty.profile_band.enabled=true",
        "trl-length-plugin: length coefficient: length_penalty_coeff=0.5, length_penalty_min_tokens=8, "
        "length_penalty_coeff_warmup_steps=0",
        "trl-length-plugin: zero-std filter: drop_zero_std_groups=true",
    ]


def test_no_feature_is_no_line_and_a_block_of_defaults_says_so():
    assert shaping_settings_lines(load_shaping_config({})) == []
    assert shaping_settings_lines(load_shaping_config({"length_penalty": {"default": {}}})) == [
        "trl-length-plugin: group length penalties: length_penalty={} (the defaults)"
    ]


def test_score_centering_line_adds_the_keys_with_values_to_the_plan():
    """The plan's resolved summary, then each key the config changed from its default, as ``key=value``."""
    from trl_length_plugin.score_centering.config import ScoreCenteringConfig
    from trl_length_plugin.shaping.settings import score_centering_settings_line

    config = ScoreCenteringConfig(
        score_centering=True, score_centering_top_k=16, score_centering_importance_sampling="tis"
    )
    assert score_centering_settings_line(config, "score centering: K=16, mode tis in [0, 3]") == (
        "trl-length-plugin: score centering: K=16, mode tis in [0, 3]; score_centering=true, "
        "score_centering_importance_sampling=tis, score_centering_top_k=16"
    )
