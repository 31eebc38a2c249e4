"""TRL's own keys that the plugin's setup reads, checked when the config loads (docs/reference/product.md
§1.3).

TRL 1.16's ``GRPOConfig`` declares its choice keys as plain ``str`` and checks their values only where the
trainer first branches on them (the first loss, after the model, the engine and the first generation), and
takes ``num_iterations: 0`` (no training step, an untrained model saved). ``LengthPluginGRPOConfig`` and the
command line refuse such values at load, naming the key with the closest valid value.

Needs only the standard library and pydantic: the command line checks these keys before TRL is imported.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from trl_length_plugin.config_base import did_you_mean

#: the values TRL 1.16 accepts for each choice key the plugin reads. TRL has no machine-readable list (the
#: fields are plain ``str``); tests/test_trl_keys.py checks this table against the values ``GRPOTrainer``
#: and ``GRPOConfig`` compare each key with, so a TRL change is noticed.
TRL_CHOICES: dict[str, tuple[str, ...]] = {
    "loss_type": ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"),
    "importance_sampling_level": ("token", "sequence"),
    "vllm_mode": ("colocate", "server"),
    "vllm_importance_sampling_mode": ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
    "scale_rewards": ("group", "batch", "none"),
    "multi_objective_aggregation": ("sum_then_normalize", "normalize_then_sum"),
}
#: choice keys that also take a boolean, which ``GRPOConfig`` maps to a value (True: group, False: none)
TRL_BOOLEAN_CHOICES = ("scale_rewards",)
#: TRL's integer keys the plugin's setup reads (``generation_batch_size`` decides ``steps_per_generation``),
#: each >= 1; True where TRL also takes None (then derived from the others)
TRL_POSITIVE_INTEGERS: dict[str, bool] = {
    "num_iterations": False,
    "gradient_accumulation_steps": False,
    "steps_per_generation": True,
    "generation_batch_size": True,
}
TRL_KEYS = (*TRL_CHOICES, *TRL_POSITIVE_INTEGERS)


def _check_choice(key: str, value: Any) -> None:
    valid = TRL_CHOICES[key]
    if (isinstance(value, str) and value in valid) or (
        key in TRL_BOOLEAN_CHOICES and isinstance(value, bool)
    ):
        return
    hint = did_you_mean(value, valid) if isinstance(value, str) else ""
    raise ValueError(f"{key}: {value!r} is not one of {', '.join(map(repr, valid))}{hint}")


def _check_positive_integer(key: str, value: Any, text: bool) -> None:
    if value is None and TRL_POSITIVE_INTEGERS[key]:
        return
    if text and isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"{key}: {value!r} is not an integer") from None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        unset = " (or unset)" if TRL_POSITIVE_INTEGERS[key] else ""
        raise ValueError(f"{key}: must be an integer >= 1{unset}, got {value!r}")


def check_trl_keys(values: Mapping[str, Any], text: Collection[str] = ()) -> None:
    """Raise a ``ValueError`` naming the first key of ``values`` (TRL's keys among them) whose value TRL would
    reject late or run wrongly with; the keys in ``text`` hold command-line text (an integer as written)."""
    for key, value in values.items():
        if key in TRL_CHOICES:
            _check_choice(key, value)
        elif key in TRL_POSITIVE_INTEGERS:
            _check_positive_integer(key, value, key in text)
