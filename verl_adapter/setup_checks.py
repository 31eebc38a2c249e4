"""The plugin's checks of a verl config at setup: what the mixins' ``__init__`` run in verl's TaskRunner when
the trainer is built, before any worker starts, and what ``trl-length verl-check`` runs on a laptop
(``TASK_RUNNER_CHECKS``): LUSPO's KL aggregation (docs/reference/luspo.md §4.1), the length keys
(docs/reference/length-penalties.md §2.1, docs/reference/length-coefficient.md §3) and score centering's
keys, K against the model's vocabulary and the adaptive controller's keys (docs/reference/score-centering.md
§5.5, §5.7, §5.8). Each check imports only config readers, no trainer.
"""

from __future__ import annotations

from collections.abc import Callable

from trl_length_plugin.score_centering import ScoreCenteringRun
from verl_adapter.length_shaping.config import shaping_config
from verl_adapter.score_centering.config import (
    check_model_vocabulary,
    resolve_settings,
    score_centering_config,
)


def check_luspo(config) -> None:
    """With ``loss_mode=luspo``, LUSPO's KL aggregation against the actor's ``loss_agg_mode``."""
    from verl_adapter.luspo import check_kl_aggregation

    actor = config.actor_rollout_ref.actor
    if (actor.get("policy_loss") or {}).get("loss_mode") == "luspo":
        check_kl_aggregation(bool(actor.get("use_kl_loss", False)), actor.get("loss_agg_mode"))


def score_centering_run(config) -> ScoreCenteringRun | None:
    """The run of the ``score_centering`` keys, checked against verl's config and K against the model's
    vocabulary (None when off)."""
    settings = resolve_settings(config)
    if settings is None:
        return None
    check_model_vocabulary(config, settings)
    return ScoreCenteringRun(score_centering_config(config), settings)


#: every check, in the order the mixins run them (each on its own in ``verl-check``, so each failing one
#: reports)
TASK_RUNNER_CHECKS: tuple[Callable, ...] = (check_luspo, shaping_config, score_centering_run)
