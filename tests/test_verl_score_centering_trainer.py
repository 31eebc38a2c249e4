"""The verl trainer mixin at run time (verl_adapter/score_centering/trainer.py; docs/reference/score-centering.md
§5.6, §5.7): ``on_init_end`` gives the actor the score-centering loss and arms ``update_actor``; each
``_update_actor`` carries the hook flags and the controller's k to the workers, moves the actor's
``score_centering/*`` metrics, steps the controller from the global counts and logs k after the step; the
controller's state is saved into the checkpoint folder and restored on resume.

Stand-ins: the actor worker group is a stub (:class:`StubWorkerGroup`) that records ``set_loss_fn`` and the
extra info of each update and returns canned worker metrics in the shape verl's worker returns them; the
checkpoint manager whose weight sync verl's ``on_init_end`` calls, and verl's own ``_save_checkpoint`` /
``_load_checkpoint`` (all need real workers), are stubs too. The trainer,
its config and its ``_update_actor`` are verl's.
"""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

pytest.importorskip("verl")

from tests.verl_length_helpers import make_trainer  # noqa: E402
from tests.verl_score_centering_helpers import MODES, with_overrides  # noqa: E402
from trl_length_plugin.score_centering.controller import STATE_FILE  # noqa: E402
from verl_adapter.score_centering.loss import ADAPTIVE_K, CLIPPED, LOSS_MODE, POSITIVE  # noqa: E402
from verl_adapter.score_centering.trainer import ScoreCenteringMixin  # noqa: E402

CONTROLLER = [
    "+score_centering_adaptive_k_init=0.2",
    "+score_centering_adaptive_target=0.1",
    "+score_centering_adaptive_k_delta=0.05",
]


class StubWorkerGroup:
    """Stands in for verl's actor worker group: records the loss and each update's extra info; each update
    returns the next canned (clipped, positive) global means with a head mass, per micro-batch lists."""

    def __init__(self, counts: list[tuple[float, float]]):
        self.counts, self.seen, self.loss_fn = list(counts), [], None

    def set_loss_fn(self, loss_fn):
        self.loss_fn = loss_fn

    def update_actor(self, batch):
        self.seen.append(dict(batch.extra_info))
        clipped, positive = self.counts.pop(0)
        metrics = {"score_centering/head_mass": [0.8, 0.9], CLIPPED: [clipped], POSITIVE: [positive]}
        return {"metrics": {**metrics, "pg_loss": [0.5], "mfu": [0.1]}}


def trainer(tmp_path, counts=()):
    made = make_trainer(
        with_overrides(MODES["adaptive-ppo-clip"] + CONTROLLER + [f"trainer.default_local_dir={tmp_path}"])
    )
    made.actor_rollout_wg = StubWorkerGroup(counts)
    made.checkpoint_manager = SimpleNamespace(
        update_weights=lambda step: None
    )  # verl's on_init_end syncs weights
    made.on_init_end()
    return made


def verl_base(made) -> type:
    """The verl trainer class after the mixin in the MRO (whose checkpoint methods the stubs replace)."""
    mro = type(made).__mro__
    return mro[mro.index(ScoreCenteringMixin) + 1]


def test_updates_carry_k_move_the_metrics_and_step_the_controller(tmp_path, vllm_for_verl):
    made = trainer(tmp_path, counts=[(0.3, 1.0), (0.05, 1.0)])
    loss = made.actor_rollout_wg.loss_fn
    assert loss.keywords["settings"] is made.score_centering
    assert loss.keywords["config"].policy_loss.loss_mode == LOSS_MODE
    logged = []
    for _ in range(2):
        metrics = {}
        made._update_actor(SimpleNamespace(extra_info={}), metrics)
        logged.append(metrics)
    first, second = made.actor_rollout_wg.seen
    assert first["distillation_use_topk"] and first["distillation_only"]  # over verl's own False
    assert first[ADAPTIVE_K] == 0.2 and second[ADAPTIVE_K] == pytest.approx(0.25)  # k before each update
    assert logged[0]["score_centering/adaptive_clip_frac"] == pytest.approx(0.3)
    assert logged[0]["score_centering/adaptive_k"] == pytest.approx(0.25)  # after the step: 0.3 > target
    assert logged[1]["score_centering/adaptive_k"] == pytest.approx(0.2)  # 0.05 <= target lowers it
    assert logged[0]["score_centering/head_mass"] == pytest.approx(0.85)
    assert logged[0]["actor/pg_loss"] == 0.5
    assert not any(key.startswith("actor/score_centering") or "_adaptive_" in key for key in logged[0])


def test_an_update_without_the_counts_fails(tmp_path, vllm_for_verl):
    made = trainer(tmp_path)
    made.actor_rollout_wg.update_actor = lambda batch: {"metrics": {"mfu": [0.1]}}
    with pytest.raises(RuntimeError, match="returned no adaptive-ppo-clip counts"):
        made._update_actor(SimpleNamespace(extra_info={}), {})


def test_the_controller_is_saved_before_verls_checkpoint_and_restored(
    tmp_path, vllm_for_verl, monkeypatch, caplog
):
    made = trainer(tmp_path, counts=[(0.5, 1.0), (0.5, 1.0)])
    for _ in range(2):
        made._update_actor(SimpleNamespace(extra_info={}), {})
    assert made.score_centering_controller.k == pytest.approx(0.3)
    path = tmp_path / "global_step_2" / STATE_FILE
    written_first = []
    monkeypatch.setattr(verl_base(made), "_save_checkpoint", lambda self: written_first.append(path.exists()))
    made.global_steps = 2
    made._save_checkpoint()
    assert written_first == [True] and json.loads(path.read_text())["k"] == pytest.approx(0.3)

    def resume_at(step):
        def load(self):
            self.global_steps = step

        return load

    monkeypatch.setattr(verl_base(made), "_load_checkpoint", resume_at(2))
    resumed = trainer(tmp_path)
    resumed._load_checkpoint()
    assert resumed.score_centering_controller.k == pytest.approx(0.3)

    monkeypatch.setattr(verl_base(made), "_load_checkpoint", resume_at(5))
    fresh = trainer(tmp_path)
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        fresh._load_checkpoint()
    assert fresh.score_centering_controller.k == 0.2 and "restarts from k_init" in caplog.text
