"""verl policy loss ``luspo`` (docs/reference/luspo.md §4.3): GSPO's ratio and clipping, aggregated as LUSPO.

Importing this module (``verl_adapter.plugin`` does it on ``import verl``, in every process) registers
``luspo`` with verl's policy-loss registry, so ``actor_rollout_ref.actor.policy_loss.loss_mode=luspo``
is all a user sets. The clip range is ``actor.clip_ratio_low`` / ``actor.clip_ratio_high``.

Normalization (docs/reference/luspo.md §4.1). verl's FSDP engine calls ``backward()`` on each micro-batch loss
(so micro-batch losses add up) and averages gradients over the ``dp_size`` data-parallel ranks. With
``global_batch_size`` = sequences in the global mini-batch (``ppo_mini_batch_size * rollout.n``), each
micro-batch therefore contributes ``sum_i |y_i| l_i / (global_batch_size / dp_size)``, and the total is
``(1 / N_seq) sum_i |y_i| l_i`` over the whole mini-batch: verl's ``seq-mean-token-sum`` convention.

``actor.loss_agg_mode`` is ignored for the policy term (reported once in the log and in the metric
``actor/luspo_loss_agg_mode_ignored``); verl still applies it to the entropy and KL terms, so with
``actor.use_kl_loss`` it must be ``seq-mean-token-sum`` (:func:`check_kl_aggregation`).
"""

from __future__ import annotations

import inspect
import logging

import verl
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig

from trl_length_plugin.losses import luspo_loss
from verl_adapter.platform.host import require_supported_verl

logger = logging.getLogger("trl_length_plugin")

#: the keyword arguments verl 0.9.1's ``verl/workers/utils/losses.py:ppo_loss`` passes to a policy loss
POLICY_LOSS_KEYWORDS = (
    "old_log_prob",
    "log_prob",
    "advantages",
    "response_mask",
    "loss_agg_mode",
    "config",
    "rollout_is_weights",
)
#: verl's aggregation mode that equals LUSPO's (docs/reference/luspo.md §4.1)
LUSPO_AGG_MODE = "seq-mean-token-sum"


def check_verl_api() -> None:
    """Fail with a clear message when the installed verl is not the policy-loss API this was written for."""
    require_supported_verl("verl_adapter.luspo")
    reference = inspect.signature(core_algos.compute_policy_loss_gspo).parameters
    missing = [name for name in POLICY_LOSS_KEYWORDS if name not in reference]
    has_batch_info = "global_batch_info" in getattr(ActorConfig, "__dataclass_fields__", {})
    if missing or not has_batch_info or not hasattr(core_algos, "register_policy_loss"):
        raise ImportError(
            f"verl {verl.__version__}: the policy-loss API differs from verl 0.9.1 (missing keywords {missing}, "
            f"ActorConfig.global_batch_info present: {has_batch_info}); verl_adapter.luspo cannot register 'luspo'."
        )


check_verl_api()

_reported_agg_modes: set[str] = set()


def check_kl_aggregation(use_kl_loss: bool, loss_agg_mode: str) -> None:
    """verl aggregates the KL loss term with ``actor.loss_agg_mode`` (``verl/workers/utils/losses.py``);
    LUSPO's KL term is summed per sequence and divided by N_seq (docs/reference/luspo.md §4.1), so refuse any other mode."""
    if use_kl_loss and loss_agg_mode != LUSPO_AGG_MODE:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode=luspo with actor_rollout_ref.actor.use_kl_loss=true "
            f"needs actor_rollout_ref.actor.loss_agg_mode={LUSPO_AGG_MODE!r} (verl aggregates the KL term with "
            f"it; docs/reference/luspo.md §4.1), got {loss_agg_mode!r}"
        )


def _report_ignored_agg_mode(loss_agg_mode: str) -> None:
    if loss_agg_mode == LUSPO_AGG_MODE or loss_agg_mode in _reported_agg_modes:
        return
    _reported_agg_modes.add(loss_agg_mode)
    logger.warning(
        "luspo: actor.loss_agg_mode=%s is ignored for the policy term, which is always sum_i |y_i| l_i / N_seq "
        "(docs/reference/luspo.md §4.1, verl's %s); the entropy and KL terms still use %s.",
        loss_agg_mode,
        LUSPO_AGG_MODE,
        loss_agg_mode,
    )


def local_num_sequences(global_batch_info: dict) -> float | None:
    """N_seq for one rank: the global mini-batch sequence count over the data-parallel size (see module doc)."""
    dp_size = global_batch_info.get("dp_size") or 1
    global_batch_size = global_batch_info.get("global_batch_size")
    if global_batch_size is None:
        if dp_size > 1:
            raise ValueError(
                "luspo: global_batch_size is required when dp_size > 1 (docs/reference/luspo.md §4.1)"
            )
        return None
    return global_batch_size / dp_size


@core_algos.register_policy_loss("luspo")
def compute_policy_loss_luspo(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode: str = LUSPO_AGG_MODE,
    config: ActorConfig | None = None,
    rollout_is_weights=None,
):
    """verl policy-loss signature around the core ``luspo_loss``; per-token rollout weights multiply as in GSPO."""
    if not isinstance(config, ActorConfig):
        raise TypeError(f"luspo: config must be verl's ActorConfig, got {type(config).__name__}")
    clip_low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    clip_high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    check_kl_aggregation(config.use_kl_loss, config.loss_agg_mode)  # backstop of the trainer's startup check
    _report_ignored_agg_mode(loss_agg_mode)
    loss, core_metrics = luspo_loss(
        log_prob,
        old_log_prob,
        advantages,
        response_mask,
        clip_low,
        clip_high,
        num_sequences=local_num_sequences(config.global_batch_info),
        token_weights=rollout_is_weights,
    )
    metrics = {
        "actor/pg_clipfrac": (
            core_metrics["luspo/clip_frac_low"] + core_metrics["luspo/clip_frac_high"]
        ).item(),
        "actor/luspo_clipfrac_low": core_metrics["luspo/clip_frac_low"].item(),
        "actor/luspo_clipfrac_high": core_metrics["luspo/clip_frac_high"].item(),
        "actor/luspo_seq_ratio_mean": core_metrics["luspo/seq_ratio_mean"].item(),
        "actor/luspo_loss_agg_mode_ignored": float(loss_agg_mode != LUSPO_AGG_MODE),
    }
    return loss, metrics
