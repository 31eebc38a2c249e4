"""Score centering in verl (docs/reference/score-centering.md §5): importing this module registers
everything with verl.

``verl_adapter.plugin`` imports it right after verl imports ``verl.trainer.ppo.v1`` (the TaskRunner, where
the trainer is built). It

1. checks that the installed verl is 0.9.x and still has every internal the integration relies on
   (``score_centering_host``; verl's vLLM server is checked when a score-centering trainer starts);
2. registers the policy loss ``score_centering`` (``score_centering_loss``), which the actor runs around the
   user's base loss mode;
3. puts :class:`~verl_adapter.score_centering.trainer.ScoreCenteringMixin` in front of each built-in V1
   trainer in verl's trainer registry, so whichever ``trainer.v1.trainer_mode`` a run uses validates and
   applies the ``score_centering`` keys.

The legacy ``RayPPOTrainer`` (``trainer.use_v1=false``) refuses a config that enables score centering
(``verl_adapter.platform.legacy_trainer``).

See ``docs/verl.md`` ("Score centering in verl") for the keys and how the pieces fit.
"""

from __future__ import annotations

from verl_adapter.platform.host import require_supported_verl, wrap_builtin_trainers
from verl_adapter.score_centering import loss  # noqa: F401 - registers the policy loss
from verl_adapter.score_centering.host import check_verl_internals
from verl_adapter.score_centering.trainer import ScoreCenteringMixin


def register() -> None:
    """Wrap the built-in V1 trainers (idempotent)."""
    wrap_builtin_trainers(ScoreCenteringMixin, "ScoreCentering", __name__)


require_supported_verl("verl_adapter.score_centering.register")
check_verl_internals()
register()
