"""The length-shaping keys of a verl config, validated into the core's ``LengthShapingConfig`` when the
trainer starts (docs/reference/product.md §1.3, docs/reference/length-penalties.md §2.1,
docs/reference/length-coefficient.md §3).

Top-level keys of verl's Hydra config (added with ``+``), named as in every host:

- ``length_penalty``: the §2.1 block, as a Hydra mapping (``+length_penalty.default.enabled=true``,
  ``+length_penalty='{default: {...}}'``) or the path of a YAML file;
- ``length_penalty_coeff``, ``length_penalty_min_tokens``, ``length_penalty_coeff_warmup_steps``: the
  length coefficient of §3.1, its floor and warm-up (by ``trainer.global_steps``);
- ``length_schedule``: numeric keys moved through stages by ``trainer.global_steps`` (§3.7), a Hydra list
  (``+length_schedule='[{key: length_penalty_coeff, stages: [{until_step: 10, value: 0.1}]}]'``) or the path
  of a YAML file;
- ``reasoning_tags``: the reasoning channel's tags (§2.5);
- ``length_penalty_log_rollouts``: one ``Length penalty:`` line per rollout instead of one summary line per
  step (§3.4), as in TRL.

verl filters groups with its own ``algorithm.filter_groups`` (judged on shaped rewards here), so the TRL
key ``drop_zero_std_groups`` is refused with that pointer. A top-level key that starts with
``length_penalty`` but is none of these (a typo such as ``length_penalty_coef``) is an error too, so
nothing is silently ignored. Every error names the key.
"""

from __future__ import annotations

from omegaconf import DictConfig

from trl_length_plugin.config_base import did_you_mean
from trl_length_plugin.shaping import (
    LengthConfigError,
    LengthShapingConfig,
    length_limit_error,
    load_shaping_config,
)
from verl_adapter.config_values import plain
from verl_adapter.keys import DROP_ZERO_STD, LOG_ROLLOUTS, VERL_KEYS

#: the advantage estimator that carries the coefficient's group normalization (reference §3.3)
LENGTH_GRPO = "length_grpo"
#: the ``algorithm.filter_groups.metric`` the shaped filter judges (reference §3.3)
FILTER_METRIC = "reward"


def shaping_config(config: DictConfig) -> LengthShapingConfig:
    """Validate the length keys of a full verl config and how they combine with ``algorithm``."""
    if DROP_ZERO_STD in config:
        raise ValueError(
            f"{DROP_ZERO_STD}: in verl use algorithm.filter_groups.enable=true "
            f"algorithm.filter_groups.metric={FILTER_METRIC} (judged on shaped rewards, reference §3.3)"
        )
    known = (*VERL_KEYS, LOG_ROLLOUTS)
    unknown = [k for k in config if str(k).startswith("length_penalty") and k not in known]
    if unknown:
        hint = did_you_mean(unknown[0], known) or f"; expected one of {', '.join(known)}"
        raise ValueError(f"{unknown[0]}: unknown length-shaping key{hint}")
    log_rollouts(config)
    try:
        shaping = load_shaping_config({key: plain(config[key]) for key in VERL_KEYS if key in config})
    except LengthConfigError as err:
        raise ValueError(f"invalid length shaping config: {err}") from None
    check_algorithm(shaping, config.algorithm, config.actor_rollout_ref.rollout.n)
    limit = (config.get("data") or {}).get("max_response_length")
    limit_error = length_limit_error(shaping, limit, "data.max_response_length")
    if limit_error is not None:
        raise ValueError(f"invalid length shaping config: {limit_error}")
    return shaping


def log_rollouts(config: DictConfig) -> bool:
    """``+length_penalty_log_rollouts=true``: one ``Length penalty:`` line per rollout instead of one summary
    line per step (reference §3.4)."""
    value = config.get(LOG_ROLLOUTS, False)
    if not isinstance(value, bool):
        raise ValueError(f"{LOG_ROLLOUTS}: must be true or false, got {value!r}")
    return value


def shaped_filter(algorithm: DictConfig) -> bool:
    """Whether ``algorithm.filter_groups`` is the shaped filter: on, with ``metric=reward``. Any other metric
    (DAPO's ``acc``) is verl's own filter on that metric, which needs nothing of the shaping (reference §3.3)."""
    filter_groups = algorithm.get("filter_groups") or {}
    return bool(filter_groups.get("enable", False)) and filter_groups.get("metric") == FILTER_METRIC


def check_algorithm(shaping: LengthShapingConfig, algorithm: DictConfig, rollout_n: int) -> None:
    """Reject combinations that would train on something else than the shaped rewards."""
    estimator = str(algorithm.adv_estimator)
    coeff = shaping.length_penalty_coeff
    if shaping.coefficient_on != (estimator == LENGTH_GRPO):
        raise ValueError(
            f"algorithm.adv_estimator: length_penalty_coeff > 0 goes with algorithm.adv_estimator={LENGTH_GRPO} "
            f"(GRPO with the coefficient's group normalization, reference §3.3) and {LENGTH_GRPO} with "
            f"length_penalty_coeff > 0; got adv_estimator={estimator!r}, length_penalty_coeff={coeff}"
        )
    if not shaping.enabled:
        return
    if estimator == "gdpo":
        raise ValueError(
            "algorithm.adv_estimator: gdpo normalizes reward components separately and would ignore the "
            "shaped scalar score; length shaping acts on one scalar score (reference §2.4)"
        )
    if not shaped_filter(algorithm):
        return
    if rollout_n < 2:
        raise ValueError(
            f"actor_rollout_ref.rollout.n: the shaped group filter drops every group whose shaped rewards "
            f"are all equal, which a group of {rollout_n} rollout always is (reference §3.3)"
        )
