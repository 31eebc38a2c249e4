"""One training run's length shaping, the object every host holds (docs/write-a-host.md): the config, the
host's normalization, the per-prompt metadata parsed so far, the settings lines, the step, its logs and the
schedule's checkpoint state (docs/reference/length-penalties.md §2.14-2.15,
docs/reference/length-coefficient.md §3.4, §3.6-3.7).

A host builds one :class:`ShapingRun` when its config is loaded, says :meth:`ShapingRun.announce` at setup,
gives each training batch to :meth:`ShapingRun.shape` with the optimizer step, logs it with
:meth:`ShapingRun.log_step` (or, shaped in parts, :meth:`ShapingRun.log`) and the result's ``metrics``
through its own logger, and calls :meth:`ShapingRun.save` and :meth:`ShapingRun.resume` with the checkpoint
folder it names.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .batch import RolloutBatch
from .config import LengthShapingConfig
from .log import length_penalty_records, log_records
from .metadata import MetadataCache
from .normalization import GroupNormalization
from .pipeline import ShapingResult, shape_rollouts
from .records import GroupRecord, log_group_records
from .schedule import coeff_at, resume_message, save_schedule_state
from .settings import PREFIX, shaping_settings_lines

logger = logging.getLogger("trl_length_plugin")


class ShapingRun:
    """The length shaping of one training run.

    ``normalization``: the host's normalization of mixed groups, None when the host computes advantages
    itself (``shape_rollouts``); ``log_file``: the coefficient's records as JSON lines there instead of log
    lines; ``log_rollouts``: one ``Length penalty:`` line per rollout instead of one summary line per step
    (§3.4). ``metadata`` keeps every prompt's parsed metadata for the run (a host looks its prompts up there,
    by whatever key identifies a prompt to it, §2.14).
    """

    def __init__(
        self,
        config: LengthShapingConfig,
        normalization: GroupNormalization | None = None,
        *,
        log_file: str | Path | None = None,
        log_rollouts: bool = False,
    ):
        self.config = config
        self.normalization = normalization
        self.log_file = log_file
        self.log_rollouts = log_rollouts
        self.metadata = MetadataCache()

    def announce(self, origin: str = "") -> None:
        """Log the settings lines, one per feature that is on (§3.4); ``origin`` ends each, e.g. `` (reward
        wrapper)``."""
        for line in shaping_settings_lines(self.config):
            logger.info("%s%s", line, origin)

    def shape(self, batch: RolloutBatch, step: int, *, shaping_weight: float = 1.0) -> ShapingResult:
        """The whole shaping step of one training batch at optimizer step ``step`` (``shape_rollouts``)."""
        return shape_rollouts(
            batch, self.config, self.normalization, step=step, shaping_weight=shaping_weight
        )

    def coefficient_records(
        self, result: ShapingResult, step: int, session_ids: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """The §3.4 record of each rollout (none when the coefficient is off or 0 at this step);
        ``session_ids``: one per row, the host's name of its group (default ``step<step>/group<id>``)."""
        if result.coefficient is None or result.coefficient.coeff == 0:
            return []
        return length_penalty_records(result.coefficient, step, session_ids)

    def log_step(self, result: ShapingResult, step: int, *, is_main_process: bool = True) -> None:
        """Log a training batch shaped in one call: its verbose group records and the coefficient's lines, on
        the main process only, the records built only when they will be written."""
        if not is_main_process:
            return
        groups = result.penalties.groups if result.penalties is not None else []
        writes = self.log_file is not None or logger.isEnabledFor(logging.INFO)
        self.log(step, groups, self.coefficient_records(result, step) if writes else [])

    def log(
        self,
        step: int,
        groups: Sequence[GroupRecord] = (),
        records: Sequence[dict[str, Any]] = (),
        *,
        is_main_process: bool = True,
    ) -> None:
        """Log one training batch, main process only: the verbose group records (§2.15) and the coefficient's
        ``records`` (:meth:`coefficient_records`, possibly of several calls, as verl shapes groups as they
        finish)."""
        log_group_records(list(groups), is_main_process=is_main_process)
        if is_main_process and records:
            log_records(records, coeff_at(self.config, step), step, self.log_file, self.log_rollouts)

    def save(self, folder: str, step: int) -> None:
        """Record the schedule and its values at ``step`` in the checkpoint ``folder`` (§3.7)."""
        save_schedule_state(self.config, step, folder)

    def resume(self, folder: str, step: int) -> None:
        """Say where the schedule continues on resume at ``step`` from ``folder``: a warning when the
        checkpoint's schedule differs from the config's or is missing, else an INFO line (§3.7)."""
        said = resume_message(self.config, step, folder)
        if said is not None:
            (logger.warning if said[0] else logger.info)("%s%s", PREFIX, said[1])
