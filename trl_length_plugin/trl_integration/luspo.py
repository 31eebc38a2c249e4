"""The ``luspo: true`` recipe flag: TRL's native ``loss_type="luspo"`` with the paper's settings
(docs/reference/luspo.md §4.2, §4.3).

TRL 1.16 already computes LUSPO (``loss_type="luspo"``, aggregated as ``(per_token_loss * mask).sum(-1).mean()``);
tests/test_luspo_trl.py proves it equals the core ``luspo_loss``. This module only chooses the settings.
"""

from __future__ import annotations

import dataclasses
import logging

from trl import GRPOConfig

logger = logging.getLogger("trl_length_plugin")

#: what ``luspo: true`` sets when the user did not (reference §4.2)
LUSPO_SETTINGS = {
    "loss_type": "luspo",
    "importance_sampling_level": "sequence",
    "epsilon": 2e-3,
    "epsilon_high": 2.5e-3,
}


def _grpo_defaults() -> dict:
    return {f.name: f.default for f in dataclasses.fields(GRPOConfig) if f.name in LUSPO_SETTINGS}


def apply_luspo_defaults(args, explicit: frozenset[str] | None = None) -> str:
    """Set LUSPO's settings on a GRPOConfig-like ``args`` before ``GRPOConfig.__post_init__`` runs.

    ``explicit``: the keys the user wrote (a recipe or the command line knows them); each is kept, whatever
    its value. Without it (the Python API) a field still equal to GRPOConfig's dataclass default counts as
    not set, and the values ``luspo`` set are logged at WARNING level. A ``loss_type`` other than ``luspo``
    or an ``importance_sampling_level`` other than ``sequence`` (TRL's luspo would then use token ratios,
    not reference §4.1's s_i) contradicts the flag and is rejected. Returns the one-line description.
    """
    defaults = _grpo_defaults()

    def user_set(name: str) -> bool:
        return name in explicit if explicit is not None else getattr(args, name) != defaults[name]

    if user_set("loss_type") and args.loss_type != "luspo":
        raise ValueError(f"luspo: true conflicts with loss_type={args.loss_type!r}; drop one of the two keys")
    level = args.importance_sampling_level
    if user_set("importance_sampling_level") and level != "sequence":
        raise ValueError(
            f"luspo: true conflicts with importance_sampling_level={level!r}: LUSPO uses the sequence ratio "
            "s_i (docs/reference/luspo.md §4.1); drop importance_sampling_level or set it to 'sequence'"
        )
    chosen, replaced = [], []
    for name, value in LUSPO_SETTINGS.items():
        if user_set(name):
            chosen.append(f"{name}={getattr(args, name)!r} (user)")
        else:
            setattr(args, name, value)
            chosen.append(f"{name}={value!r}")
            replaced.append(f"{name}={value!r}")
    line = "LUSPO (docs/reference/luspo.md §4): " + ", ".join(chosen)
    if explicit is None and replaced:
        logger.warning(
            "luspo: true set %s (values equal to GRPOConfig's defaults count as unset)", ", ".join(replaced)
        )
    else:
        logger.info("%s", line)
    return line
