"""Silent no-ops refused (issue 31, class 3; docs/reference/length-penalties.md §2.1, §2.3, §2.6): a term's key
without the key that switches its term on, for every term alike; an override may switch a term off; a
config that switches nothing on is an error where the docs say so (preview); a length limit that can never
act (docs/reference/length-penalties.md §2.17, docs/reference/length-coefficient.md §3.1)."""

from __future__ import annotations

import pytest

from trl_length_plugin.shaping import LengthConfigError, load_shaping_config
from trl_length_plugin.shaping.config import length_limit_error
from trl_length_plugin.shaping.terms import terms


def other_value(parameter):
    """A valid value of ``parameter`` other than its default."""
    if parameter.choices():
        return next(c for c in parameter.choices() if c != parameter.default)
    if parameter.annotation is bool:
        return not parameter.default
    if isinstance(parameter.default, int):
        return parameter.default + 1
    return parameter.default / 2 if parameter.default else 0.5


IDLE_KEYS = {
    key: (term, parameter)
    for term in terms()
    for key, parameter in term.parameters.items()
    if key not in term.switches
}


@pytest.mark.parametrize("key", sorted(IDLE_KEYS))
def test_a_terms_key_without_its_switch_is_refused_for_every_term(key):
    term, parameter = IDLE_KEYS[key]
    with pytest.raises(LengthConfigError) as err:
        load_shaping_config({"length_penalty": {"default": {key: other_value(parameter)}}})
    message = str(err.value)
    assert message.startswith(f"length_penalty.default.{key}: needs "), message
    assert any(switch in message for switch in term.switches) and "\n" not in message


def test_the_examples_of_the_issue():
    with pytest.raises(
        LengthConfigError, match=r"^length_penalty.default.overlong_factor: needs overlong_max_length > 0"
    ):
        load_shaping_config({"length_penalty": {"default": {"overlong_factor": 0.5}}})
    with pytest.raises(
        LengthConfigError,
        match=r"^length_penalty.default.cosine_min_value_wrong: needs cosine_max_length > 0",
    ):
        load_shaping_config({"length_penalty": {"default": {"cosine_min_value_wrong": -0.5}}})


def test_writing_a_terms_defaults_is_accepted():
    """A block that writes every key at its default (as the source document's example does) is accepted."""
    default = {key: parameter.default for key, (_, parameter) in IDLE_KEYS.items()}
    load_shaping_config({"length_penalty": {"default": {**default, "total_bonus": 0.1}}})


@pytest.mark.parametrize(
    ("default", "override"),
    [
        ({"target_length": "exact", "target_length_alpha": 0.001}, {"target_length": "none"}),
        ({"target_length": "max", "target_length_delta": 0.3}, {"target_length": "exact"}),
        ({"overlong_max_length": 100, "overlong_buffer": 10, "overlong_factor": 0.5}, {"overlong_max_length": 0}),
        ({"cosine_max_length": 100, "cosine_min_value_wrong": -0.5}, {"cosine_max_length": 0}),
        ({"truncation": "penalty", "truncation_penalty_factor": 0.5}, {"truncation": "none"}),
    ],
)  # fmt: skip
def test_an_override_may_switch_a_term_off(default, override):
    block = {"default": default, "agent_overrides": {"coder": override}}
    config = load_shaping_config({"length_penalty": block}).length_penalty
    switch = next(iter(override))
    assert getattr(config.for_agent("coder"), switch) == override[switch]


def test_an_override_is_judged_on_its_own_keys():
    block = {"default": {"overlong_max_length": 0}, "agent_overrides": {"coder": {"overlong_factor": 0.5}}}
    with pytest.raises(
        LengthConfigError, match=r"^length_penalty.agent_overrides.coder.overlong_factor: needs"
    ):
        load_shaping_config({"length_penalty": block})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"length_penalty": {"default": {"overlong_max_length": 600, "overlong_buffer": 100}}},
            "length_penalty.default.overlong_max_length: 600 is above max_completion_length (512): no rollout "
            "reaches it",
        ),
        (
            {"length_penalty": {"default": {"total_bonus": 0.1}, "agent_overrides": {"math": {"overlong_max_length": 900, "overlong_buffer": 8}}}},
            "length_penalty.agent_overrides.math.overlong_max_length: 900 is above max_completion_length (512)",
        ),
        (
            {"length_penalty_coeff": 1.0, "length_penalty_min_tokens": 512},
            "length_penalty_min_tokens: 512 is at or above max_completion_length (512): no rollout is longer",
        ),
    ],
)  # fmt: skip
def test_a_length_limit_that_can_never_act_is_named_with_the_hosts_limit(values, message):
    assert length_limit_error(load_shaping_config(values), 512, "max_completion_length").startswith(message)


@pytest.mark.parametrize(
    "values",
    [
        {"length_penalty": {"default": {"overlong_max_length": 512, "overlong_buffer": 100}}},
        {"length_penalty": {"default": {"overlong_max_length": 2000, "overlong_buffer": 100, "length_type": "chars"}}},
        {"length_penalty": {"default": {"overlong_max_length": 2000, "overlong_buffer": 100, "enabled": False},
                            "agent_overrides": {"math": {"enabled": True, "total_bonus": 0.1, "overlong_max_length": 0}}}},
        {"length_penalty_coeff": 1.0, "length_penalty_min_tokens": 511},
    ],
)  # fmt: skip
def test_limits_that_can_act_pass(values):
    config = load_shaping_config(values)
    assert length_limit_error(config, 512, "max_completion_length") is None
    assert length_limit_error(config, None, "max_completion_length") is None
