"""The ``luspo: true`` recipe flag: TRL's native ``loss_type="luspo"`` with the paper's settings (decisions.md §4).

TRL 1.16 already computes LUSPO (``loss_type="luspo"``, aggregated as ``(per_token_loss * mask).sum(-1).mean()``);
tests/test_luspo_trl.py proves it equals the core ``luspo_loss``. This module only chooses the settings.
"""

from __future__ import annotations

import dataclasses

from trl import GRPOConfig

#: what ``luspo: true`` sets when the user did not (decisions.md §4.2)
LUSPO_SETTINGS = {
    "loss_type": "luspo",
    "importance_sampling_level": "sequence",
    "epsilon": 2e-3,
    "epsilon_high": 2.5e-3,
}


def _grpo_defaults() -> dict:
    return {f.name: f.default for f in dataclasses.fields(GRPOConfig) if f.name in LUSPO_SETTINGS}


def apply_luspo_defaults(args) -> str:
    """Set LUSPO's settings on a GRPOConfig-like ``args`` before ``GRPOConfig.__post_init__`` runs.

    A field still equal to GRPOConfig's dataclass default (``epsilon_high``: None) counts as not set by the
    user and gets the value of ``LUSPO_SETTINGS``; a field the user set is kept. A user ``loss_type`` other
    than ``luspo``, or an ``importance_sampling_level`` other than ``sequence`` (TRL's luspo would then use
    token ratios, not §4.1's s_i), contradicts the flag and is rejected. Returns the one-line description.
    """
    defaults = _grpo_defaults()
    if args.loss_type not in (defaults["loss_type"], "luspo"):
        raise ValueError(f"luspo: true conflicts with loss_type={args.loss_type!r}; drop one of the two keys")
    level = args.importance_sampling_level
    if level not in (defaults["importance_sampling_level"], "sequence"):
        raise ValueError(
            f"luspo: true conflicts with importance_sampling_level={level!r}: LUSPO uses the sequence ratio "
            "s_i (decisions.md §4.1); drop importance_sampling_level or set it to 'sequence'"
        )
    chosen = []
    for name, value in LUSPO_SETTINGS.items():
        if getattr(args, name) == defaults[name]:
            setattr(args, name, value)
            chosen.append(f"{name}={value!r}")
        else:
            chosen.append(f"{name}={getattr(args, name)!r} (user)")
    return "LUSPO (decisions.md §4): " + ", ".join(chosen)
