"""TRL's own keys that the plugin's setup reads are checked when the config loads (docs/reference/product.md
§1.3): a choice key with a value TRL only rejects at its first loss (``loss_type: GRPO``), and an integer key
below 1 (``num_iterations: 0`` trains no step), fail in ``LengthPluginGRPOConfig`` with a ``ValueError``
naming the key and the closest valid value, and on the command line in one line with exit status 2 before
TRL is imported.

The table of valid values (``trl_keys.TRL_CHOICES``) is checked against the values TRL's own code compares
each key with, so a TRL release that adds or drops a value fails here.
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import trl
from hypothesis import given
from hypothesis import strategies as st
from trl import GRPOConfig

from trl_length_plugin.embedded import CPU_RUN_ARGS
from trl_length_plugin.trl_integration import LengthPluginGRPOConfig
from trl_length_plugin.trl_integration.keys import (
    TRL_CHOICES,
    TRL_KEYS,
    TRL_POSITIVE_INTEGERS,
    check_trl_keys,
)

#: the TRL modules that branch on the choice keys (trainer, config, vLLM generation), each with the names it
#: gives a key (vLLM generation keeps ``vllm_mode`` as ``self.mode``; trl 1.14 and 1.15 compare it only there)
TRL_SOURCES = {
    "trainer/grpo_trainer.py": {},
    "trainer/grpo_config.py": {},
    "generation/vllm_generation.py": {"mode": "vllm_mode"},
}
BIN = Path(sys.executable).parent


def compared_values() -> dict[str, set[str]]:
    """Per choice key, every string TRL's code compares it with (``==``, ``!=``, ``in``, ``not in``)."""
    found: dict[str, set[str]] = {key: set() for key in TRL_CHOICES}
    for source, aliases in TRL_SOURCES.items():
        tree = ast.parse((Path(trl.__file__).parent / source).read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            name = getattr(node.left, "attr", getattr(node.left, "id", None))
            name = aliases.get(name, name)
            if name in found:
                found[name].update(
                    c.value
                    for comparator in node.comparators
                    for c in ast.walk(comparator)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                )
    return found


def test_the_table_is_what_trl_accepts():
    assert {key: set(values) for key, values in TRL_CHOICES.items()} == compared_values()
    trl_fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    # the declared types (HfArgumentParser rewrites ``field.type`` in place once a parser is built)
    declared = typing.get_type_hints(GRPOConfig)
    for key in TRL_CHOICES:
        assert declared[key] is str and trl_fields[key].default in TRL_CHOICES[key]
    for key, nullable in TRL_POSITIVE_INTEGERS.items():
        assert declared[key] == (int | None if nullable else int)
    check_trl_keys({key: trl_fields[key].default for key in TRL_KEYS})  # TRL's defaults pass


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"loss_type": "foo"}, "loss_type: 'foo' is not one of 'grpo', 'dr_grpo', 'dapo', 'bnpo', 'cispo', 'sapo', 'luspo', 'vespo'"),
        ({"loss_type": "GRPO"}, "loss_type: 'GRPO' is not one of 'grpo', 'dr_grpo', 'dapo', 'bnpo', 'cispo', 'sapo', 'luspo', 'vespo' (did you mean 'grpo'?)"),
        ({"loss_type": "dr-grpo"}, "loss_type: 'dr-grpo' is not one of 'grpo', 'dr_grpo', 'dapo', 'bnpo', 'cispo', 'sapo', 'luspo', 'vespo' (did you mean 'dr_grpo'?)"),
        ({"importance_sampling_level": "Sequence"}, "importance_sampling_level: 'Sequence' is not one of 'token', 'sequence' (did you mean 'sequence'?)"),
        ({"vllm_mode": "Colocate"}, "vllm_mode: 'Colocate' is not one of 'colocate', 'server' (did you mean 'colocate'?)"),
        ({"vllm_importance_sampling_mode": "Token_Truncate"}, "vllm_importance_sampling_mode: 'Token_Truncate' is not one of 'token_truncate', 'token_mask', 'sequence_truncate', 'sequence_mask' (did you mean 'token_truncate'?)"),
        ({"scale_rewards": "false"}, "scale_rewards: 'false' is not one of 'group', 'batch', 'none'"),
        ({"multi_objective_aggregation": "sum_then_normalise"}, "multi_objective_aggregation: 'sum_then_normalise' is not one of 'sum_then_normalize', 'normalize_then_sum' (did you mean 'sum_then_normalize'?)"),
        ({"num_iterations": 0}, "num_iterations: must be an integer >= 1, got 0"),
        ({"num_iterations": True}, "num_iterations: must be an integer >= 1, got True"),
        ({"gradient_accumulation_steps": -2}, "gradient_accumulation_steps: must be an integer >= 1, got -2"),
        ({"steps_per_generation": 0}, "steps_per_generation: must be an integer >= 1 (or unset), got 0"),
        ({"generation_batch_size": 2.5}, "generation_batch_size: must be an integer >= 1 (or unset), got 2.5"),
    ],
)  # fmt: skip
def test_the_config_refuses_bad_trl_values_naming_the_key(tmp_path, changes, message):
    with pytest.raises(ValueError) as info:
        LengthPluginGRPOConfig(output_dir=str(tmp_path), **changes)
    assert str(info.value) == message


def test_every_valid_value_is_accepted(tmp_path):
    """Each loss type and the boolean scale_rewards TRL maps itself still build a config."""
    cpu = {**CPU_RUN_ARGS, "output_dir": str(tmp_path)}
    for loss_type in TRL_CHOICES["loss_type"]:
        assert LengthPluginGRPOConfig(loss_type=loss_type, **cpu).loss_type == loss_type
    assert LengthPluginGRPOConfig(scale_rewards=False, **cpu).scale_rewards == "none"
    args = LengthPluginGRPOConfig(steps_per_generation=2, gradient_accumulation_steps=2, **cpu)
    assert (args.steps_per_generation, args.generation_batch_size) == (2, 16)


ALL_VALUES = sorted({value for values in TRL_CHOICES.values() for value in values})


@given(
    key=st.sampled_from(list(TRL_CHOICES)), value=st.one_of(st.text(max_size=20), st.sampled_from(ALL_VALUES))
)
def test_any_other_text_is_refused(key, value):
    """A key's own values pass; any other text (another key's values among them) is refused."""
    if value in TRL_CHOICES[key]:
        check_trl_keys({key: value})
        return
    with pytest.raises(ValueError) as info:
        check_trl_keys({key: value})
    assert str(info.value).startswith(f"{key}: {value!r} is not one of ")


@given(key=st.sampled_from(list(TRL_POSITIVE_INTEGERS)), value=st.integers(-(10**6), 10**6))
def test_integers_below_one_are_refused_as_values_and_as_text(key, value):
    for given_value, text in ((value, ()), (str(value), (key,))):
        if value >= 1:
            check_trl_keys({key: given_value}, text)
        else:
            with pytest.raises(ValueError, match=f"^{key}: must be an integer >= 1"):
                check_trl_keys({key: given_value}, text)
    with pytest.raises(ValueError, match=f"^{key}: must be an integer"):
        check_trl_keys({key: str(max(value, 1))})  # text counts only where the command line gave it


def test_the_console_command_refuses_a_trl_key_before_trl_loads():
    """The real command on a shipped recipe: one line, exit status 2, in well under TRL's import time."""
    done = subprocess.run(
        [str(BIN / "trl-length-grpo"), "--config", "recipe:group_relative_cpu", "--loss_type", "GRPO"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "trl-length-grpo: error: loss_type: 'GRPO' is not one of 'grpo', 'dr_grpo', 'dapo', 'bnpo', 'cispo', "
        "'sapo', 'luspo', 'vespo' (did you mean 'grpo'?)\n"
    )
