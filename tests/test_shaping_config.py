"""The typed ``length_penalty`` block: every rejection rule of docs/reference/length-penalties.md §2.1 names its key path,
per-agent merging (§2.3), implicit global-band channels (§2.12), YAML loading."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest
from pydantic import ValidationError

from trl_length_plugin.shaping import LengthPenaltyConfig, LengthPenaltyParams, load_length_penalty_config

DOCUMENT_CONFIG = """
length_penalty:
  verbose: true
  default:
    enabled: true
    length_type: tokens
    top_percentile: 0.5
    reasoning_bonus: 0.0
    answer_bonus: 0.0
    total_bonus: 0.0
    longest_reasoning_penalty: 0.0
    longest_answer_penalty: 0.0
    longest_total_penalty: 0.0
    group_reasoning_length_penalty_coeff: 0.0
    group_answer_length_penalty_coeff: 0.0
    group_total_length_penalty_coeff: 0.0
    reasoning_zmad_threshold: 0.0
    reasoning_zmad_penalty: 0.0
    answer_zmad_threshold: 0.0
    answer_zmad_penalty: 0.0
    total_zmad_threshold: 0.0
    total_zmad_penalty: 0.0
    profiled_length_penalty: 0.0
    profiled_length_n_std: 1.0
    profiled_length_min_samples: 2
    profile_band_total: false
    profile_band_reasoning: false
    profile_band_answer: false
  agent_overrides:
    math_with_judge_simple_agent:
      enabled: true
      group_total_length_penalty_coeff: 0.1
    instruction_following_simple_agent:
      enabled: false
    genrm_simple_agent:
      enabled: false
    code_gen_simple_agent:
      enabled: true
      total_zmad_threshold: 2.0
      total_zmad_penalty: 0.1
"""


def rejected(config: dict) -> str:
    with pytest.raises(ValidationError) as info:
        LengthPenaltyConfig.model_validate(config)
    return str(info.value)


def test_defaults_cover_every_documented_key():
    """docs/reference/length-penalties.md §2.1: the document's keys plus pass-rate weight and the four gate keys."""
    params = LengthPenaltyParams()
    assert params.enabled is True and params.length_type == "tokens" and params.top_percentile == 0.5
    assert params.pass_rate_length_penalty_weight == 0.0
    assert params.profiled_length_n_std == 1.0 and params.profiled_length_min_samples == 2
    assert params.group_length_penalty_profile_gate is False
    assert params.group_length_penalty_profile_gate_channel == "total"
    assert params.group_length_penalty_profile_gate_field == "a"
    assert params.group_length_penalty_profile_gate_positive_only is True
    config = LengthPenaltyConfig()
    assert config.verbose is False and config.agent_overrides is None and config.profile_band is None
    assert config.reasoning_tags == ("<think>", "</think>")


def test_document_config_loads_from_yaml(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(DOCUMENT_CONFIG)
    config = load_length_penalty_config(path)
    assert config.verbose is True
    assert config.for_agent("math_with_judge_simple_agent").group_total_length_penalty_coeff == 0.1
    assert config.for_agent("genrm_simple_agent").enabled is False
    code = config.for_agent("code_gen_simple_agent")
    assert (code.total_zmad_threshold, code.total_zmad_penalty, code.top_percentile) == (2.0, 0.1, 0.5)


def test_yaml_file_may_hold_the_block_itself(tmp_path):
    path = tmp_path / "block.yaml"
    path.write_text("default:\n  total_bonus: 0.1\n")
    assert load_length_penalty_config(path).default.total_bonus == 0.1
    assert load_length_penalty_config({"default": {"total_bonus": 0.2}}).default.total_bonus == 0.2


def test_yaml_error_names_the_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("length_penalty:\n  default:\n    top_percentile: 0\n")
    with pytest.raises(ValidationError, match=r"default\.top_percentile"):
        load_length_penalty_config(path)


def test_missing_pyyaml_gives_a_clear_error(tmp_path, monkeypatch):
    path = tmp_path / "any.yaml"
    path.write_text("default: {}\n")
    monkeypatch.setitem(sys.modules, "yaml", None)
    with pytest.raises(ImportError, match="pyyaml"):
        load_length_penalty_config(path)


@pytest.mark.parametrize(
    ("config", "path"),
    [
        ({"defualt": {}}, "defualt"),
        ({"default": {"total_bonnus": 0.1}}, r"default\.total_bonnus"),
        ({"agent_overrides": {"math": {"zmad": 1}}}, r"agent_overrides\.math\.zmad"),
        ({"profile_band": {"enabled": True, "default": {}}}, r"profile_band\.default"),
        ({"profile_band": {"defaults": {"total": {"a": 1, "b": 2, "f": 0.5, "g": 1}}}}, r"total\.g"),
        ({"default": {"length_type": "token"}}, r"default\.length_type"),
        ({"agent_overrides": {"a": {"length_type": "words"}}}, r"agent_overrides\.a\.length_type"),
        ({"default": {"group_length_penalty_profile_gate_channel": "totl"}}, "gate_channel"),
        ({"default": {"group_length_penalty_profile_gate_field": "c"}}, "gate_field"),
        ({"profile_band": {"defaults": {"totl": {"a": 1, "b": 2, "f": 0.5}}}}, r"defaults\.totl"),
        ({"profile_band": {"defaults": {"total": {"a": 5, "b": 5, "f": 0.5}}}}, r"defaults\.total"),
        ({"profile_band": {"defaults": {"total": {"a": 5, "b": 4, "f": 0.5}}}}, r"defaults\.total"),
        ({"profile_band": {"defaults": {"answer": {"a": 1, "b": 2, "f": 1.5}}}}, r"answer\.f"),
        ({"profile_band": {"defaults": {"answer": {"a": 1, "b": 2, "f": -0.1}}}}, r"answer\.f"),
        ({"profile_band": {"defaults": {"reasoning": {"a": 1, "f": 0.5}}}}, r"reasoning\.b"),
        ({"default": {"top_percentile": 0.0}}, r"default\.top_percentile"),
        ({"default": {"top_percentile": 1.5}}, r"default\.top_percentile"),
        ({"default": {"total_bonus": -0.1}}, r"default\.total_bonus"),
        ({"default": {"longest_answer_penalty": -1}}, r"default\.longest_answer_penalty"),
        ({"default": {"group_total_length_penalty_coeff": -0.1}}, "group_total_length_penalty_coeff"),
        ({"default": {"reasoning_zmad_threshold": -2}}, "reasoning_zmad_threshold"),
        ({"default": {"answer_zmad_penalty": -0.1}}, "answer_zmad_penalty"),
        ({"default": {"profiled_length_penalty": -0.1}}, "profiled_length_penalty"),
        ({"default": {"pass_rate_length_penalty_weight": -0.2}}, "pass_rate_length_penalty_weight"),
        ({"default": {"profiled_length_min_samples": 0}}, "profiled_length_min_samples"),
        (
            {"agent_overrides": {"code": {"total_zmad_penalty": -1}}},
            r"agent_overrides\.code\.total_zmad_penalty",
        ),
        ({"default": {"total_bonus": float("nan")}}, r"default\.total_bonus"),
        ({"reasoning_tags": ["<t>", "<t>"]}, "reasoning_tags"),
    ],
)
def test_every_rejection_rule_names_the_key_path(config, path):
    """docs/reference/length-penalties.md §2.1: rejected at load time, the error names the offending key path."""
    assert re.search(path, rejected(config))


def test_override_replaces_only_the_keys_it_sets():
    config = LengthPenaltyConfig.model_validate(
        {
            "default": {"total_bonus": 0.1, "top_percentile": 0.25},
            "agent_overrides": {"math": {"total_bonus": 0.3}, "code": None},
        }
    )
    math = config.for_agent("math")
    assert (math.total_bonus, math.top_percentile) == (0.3, 0.25)
    assert config.for_agent("code") == config.default  # an override set to null uses default (§2.3)


def test_missing_agent_warns_once(caplog):
    config = LengthPenaltyConfig.model_validate({"agent_overrides": {"math": {"total_bonus": 0.3}}})
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        for _ in range(3):
            assert config.for_agent("other") == config.for_agent(None) == config.default
    warnings = [r.getMessage() for r in caplog.records if "not in agent_overrides" in r.getMessage()]
    assert warnings == [
        "length_penalty: agent 'other' is not in agent_overrides; using `default`",
        "length_penalty: agent 'default' is not in agent_overrides; using `default`",
    ]


def test_no_overrides_means_no_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        LengthPenaltyConfig().for_agent("anything")
    assert not caplog.records


def test_global_band_channels_are_enabled_unless_default_sets_the_flag():
    """docs/reference/length-penalties.md §2.12: defaults channels on; an explicit default flag or an override wins."""
    band = {"a": 10, "b": 20, "f": 0.5}
    config = LengthPenaltyConfig.model_validate(
        {
            "default": {"profile_band_reasoning": False},
            "profile_band": {"enabled": True, "defaults": {"total": band, "reasoning": band}},
            "agent_overrides": {"math": {"profile_band_total": False}},
        }
    )
    default = config.for_agent("x")
    assert (default.profile_band_total, default.profile_band_reasoning, default.profile_band_answer) == (
        True,
        False,
        False,
    )
    assert config.for_agent("math").profile_band_total is False
    disabled = LengthPenaltyConfig.model_validate(
        {"profile_band": {"enabled": False, "defaults": {"total": band}}}
    )
    assert disabled.global_bands == {} and disabled.for_agent(None).profile_band_total is False


def test_any_enabled():
    assert LengthPenaltyConfig().any_enabled
    off = {"default": {"enabled": False}}
    assert not LengthPenaltyConfig.model_validate(off).any_enabled
    assert not LengthPenaltyConfig.model_validate(
        {**off, "agent_overrides": {"a": {"total_bonus": 1}}}
    ).any_enabled
    assert LengthPenaltyConfig.model_validate(
        {**off, "agent_overrides": {"a": {"enabled": True}}}
    ).any_enabled


def test_core_imports_without_hosts():
    """docs/reference/product.md §1.2: the shaping core pulls in no trainer, engine or YAML library."""
    code = (
        "import sys, trl_length_plugin.shaping; "
        "print(sorted(m for m in ('trl', 'verl', 'transformers', 'vllm', 'deepspeed', 'yaml') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
