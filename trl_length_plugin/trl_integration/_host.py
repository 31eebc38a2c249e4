"""The one place that knows which TRL this integration was written against (DEVELOPERS.md: host patches).

``LengthPluginGRPOTrainer`` overrides private ``GRPOTrainer`` methods. At setup we check that TRL is the
release line we built for and that each overridden method still has the signature we call, so a TRL
upgrade fails loudly at construction instead of training on silently wrong rewards.
"""

from __future__ import annotations

import inspect

from trl_length_plugin._optional import require

#: the TRL release this integration was written and tested against
BUILT_FOR_TRL = "1.16.0"

#: the private GRPOTrainer methods the subclass overrides, with the parameters it relies on
OVERRIDDEN_METHODS = {
    "_generate": ("self", "prompts"),
    "_calculate_rewards": ("self", "inputs", "prompts", "completions", "completion_ids_list"),
    "_generate_and_score_completions": ("self", "inputs"),
    "_compute_loss": ("self", "model", "inputs"),
}


def _release_line(version: str) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:2])


def check_trl_host() -> None:
    """Raise a RuntimeError naming ``BUILT_FOR_TRL`` when the installed TRL is not compatible."""
    trl = require("trl", "trl")
    installed = trl.__version__
    problems = []
    if _release_line(installed) != _release_line(BUILT_FOR_TRL):
        problems.append(
            f"installed trl {installed} is not in the {'.'.join(_release_line(BUILT_FOR_TRL))}.x line"
        )
    for name, expected in OVERRIDDEN_METHODS.items():
        method = getattr(trl.GRPOTrainer, name, None)
        if method is None:
            problems.append(f"GRPOTrainer.{name} no longer exists")
            continue
        params = tuple(inspect.signature(method).parameters)
        if params != expected:
            problems.append(f"GRPOTrainer.{name}{params} differs from the expected {expected}")
    if problems:
        raise RuntimeError(
            f"trl-length-plugin's TRL integration was built for trl=={BUILT_FOR_TRL} and overrides private "
            f"GRPOTrainer methods; " + "; ".join(problems) + f". Install trl=={BUILT_FOR_TRL}."
        )
