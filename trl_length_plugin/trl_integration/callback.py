"""``LengthPluginCallback``: schedules by global step and length/reward curves at the end of training.

Callbacks see neither rewards nor the trainer (transformers' TrainerCallback API), so a schedule reaches its consumers
through *targets*: objects with ``set_length_schedule(name, value)`` and ``attach_model(model)``.
``LengthPluginGRPOTrainer`` binds itself to every ``LengthPluginCallback`` it is given (and builds one for
``length_curves_png``); a ``LengthPenaltyReward`` wrapper on the stock trainer is passed in ``targets``.
Values are set in ``on_step_begin``, before the step's rollouts are generated, so every rollout of a step
sees one value.

The one schedulable name is ``length_penalty_weight``: TRL's reward weight of the ``length_penalty`` column
(docs/reference/length-penalties.md §2.4: 0 switches the shaping's effect off, 1 is the configured shaping),
a number of the host, not of the shaping config. The config's own numbers (the coefficient and its warm-up
included) move by ``length_schedule`` (docs/reference/length-coefficient.md §3.7), which is checked when the
config loads and saved in checkpoints; a callback schedule of one of them is refused when it is built.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from typing import Protocol

from transformers import TrainerCallback

logger = logging.getLogger("trl_length_plugin")

Schedule = Callable[[int], float]
#: what a callback schedule moves
WEIGHT = "length_penalty_weight"


def check_schedule_name(name: str) -> None:
    """Refuse a callback schedule of anything but the shaping column's weight, naming ``length_schedule``."""
    if name != WEIGHT:
        raise ValueError(
            f"LengthPluginCallback schedules only {WEIGHT}, not {name!r}; the shaping config's numbers move by "
            "length_schedule (docs/reference/length-coefficient.md §3.7), which is checked at load time and saved "
            "in checkpoints"
        )


class ScheduleTarget(Protocol):
    def set_length_schedule(self, name: str, value: float) -> None: ...

    def attach_model(self, model) -> None: ...


def linear_warmup(end: float, steps: int, start: float = 0.0) -> Schedule:
    """``start`` at step 0 rising linearly to ``end`` at ``steps``, then constant."""
    if steps < 0:
        raise ValueError(f"warm-up steps must be >= 0, got {steps}")

    def schedule(step: int) -> float:
        if steps == 0 or step >= steps:
            return end
        return start + (end - start) * step / steps

    return schedule


class LengthPluginCallback(TrainerCallback):
    """Apply ``schedules`` (name -> step -> value) to the bound targets and plot curves at the end.

    ``curves_png``: True writes ``<output_dir>/length_curves.png``, a string is the path, None/False
    writes nothing. Plotting runs on the main process only.
    """

    def __init__(
        self,
        schedules: dict[str, Schedule] | None = None,
        targets: Iterable[ScheduleTarget] = (),
        curves_png: bool | str | None = None,
        title: str | None = None,
    ):
        self.schedules = dict(schedules or {})
        for name in self.schedules:
            check_schedule_name(name)
        self.targets: list[ScheduleTarget] = []
        for target in targets:
            self.bind(target)
        self.curves_png = curves_png
        self.title = title
        self.curves_path: str | None = None

    def bind(self, target: ScheduleTarget) -> None:
        """Deliver this callback's schedules to ``target`` (each target once)."""
        if all(t is not target for t in self.targets):
            self.targets.append(target)

    def _apply(self, step: int) -> None:
        for name, schedule in self.schedules.items():
            value = float(schedule(step))
            for target in self.targets:
                target.set_length_schedule(name, value)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        for target in self.targets:
            target.attach_model(model)
        self._apply(state.global_step)

    def on_step_begin(self, args, state, control, **kwargs):
        self._apply(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if not self.curves_png or not state.is_world_process_zero:
            return
        from trl_length_plugin.trl_integration.plotting import plot_training_curves

        path = (
            self.curves_png
            if isinstance(self.curves_png, str)
            else os.path.join(args.output_dir, "length_curves.png")
        )
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.curves_path = str(
            plot_training_curves(state.log_history, path, title=self.title or args.run_name)
        )
        logger.info("length/reward curves written to %s", self.curves_path)
