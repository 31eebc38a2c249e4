"""The length schedule in verl's real V1 trainer (docs/reference/length-coefficient.md §3.7): the mixin's
``_compute_advantage`` (verl's call site, on verl's replay buffer, padding and ``length_grpo``) shapes with
the value of ``trainer.global_steps``, logs it as ``length_schedule/<key>`` in verl's metrics dict and gives
the numbers of the same config written with that value; ``+length_schedule`` is validated at load naming the
key; the schedule is recorded in each checkpoint folder and said on resume.

Stand-ins (as in tests/test_verl_shaping.py): rollouts are put into TransferQueue as the agent loop puts them
(no generation, no reward workers); verl's own ``_save_checkpoint`` / ``_load_checkpoint`` need real workers
and are replaced by stubs, as in tests/test_verl_score_centering_trainer.py."""

from __future__ import annotations

import json
import logging

import pytest
import torch

pytest.importorskip("verl")

from tests.test_verl_shaping import rollouts, run_advantage_step  # noqa: E402
from tests.verl_length_helpers import make_trainer  # noqa: E402
from trl_length_plugin.shaping.schedule import STATE_FILE  # noqa: E402
from verl_adapter.length_shaping.trainer import LengthShapingMixin  # noqa: E402

SCHEDULE = "+length_schedule=[{key: length_penalty_coeff, stages: [{until_step: 3, value: 0.25}]}]"
COEFFICIENT = [
    "+length_penalty_coeff=1.0",
    "algorithm.adv_estimator=length_grpo",
    "actor_rollout_ref.rollout.n=5",
]
METRIC = "length_schedule/length_penalty_coeff"


def shaped_step(overrides, tokenizer, step):
    trainer = make_trainer(overrides, tokenizer, step=step)
    _, rows, index, metrics = run_advantage_step(trainer, rollouts(), tokenizer, groups=6)
    rewards = [
        float(r.sum()) for r, i in zip(rows["token_level_rewards"], index, strict=True) if i is not None
    ]
    return torch.tensor(rewards, dtype=torch.float64), metrics


@pytest.mark.slow
def test_the_advantage_step_shapes_with_the_steps_value(store, tokenizer):
    for step, value in [(1, 0.25), (2, 0.25), (3, 1.0)]:
        rewards, metrics = shaped_step([*COEFFICIENT, SCHEDULE], tokenizer, step)
        assert metrics[METRIC] == value and metrics["length_penalty/coeff"] == value
        written, _ = shaped_step(
            [f"+length_penalty_coeff={value}", *COEFFICIENT[1:]], tokenizer, step
        )  # the same rollouts, the value written in the config
        assert torch.equal(rewards, written)
    first, _ = shaped_step([*COEFFICIENT, SCHEDULE], tokenizer, 1)
    assert not torch.equal(first, rewards)  # the stage boundary changed the shaped rewards


def test_a_bad_schedule_is_refused_when_the_trainer_is_built():
    with pytest.raises(
        ValueError, match=r"length_schedule.0.key: length_penalty_cof: unknown key \(did you mean"
    ):
        make_trainer([*COEFFICIENT, SCHEDULE.replace("length_penalty_coeff", "length_penalty_cof")])


def verl_base(made) -> type:
    mro = type(made).__mro__
    return mro[mro.index(LengthShapingMixin) + 1]


def test_the_schedule_is_recorded_in_the_checkpoint_and_said_on_resume(tmp_path, monkeypatch, caplog):
    overrides = [*COEFFICIENT, SCHEDULE, f"trainer.default_local_dir={tmp_path}"]
    made = make_trainer(overrides)
    monkeypatch.setattr(verl_base(made), "_save_checkpoint", lambda self: None)
    made.global_steps = 2
    made._save_checkpoint()
    saved = json.loads((tmp_path / "global_step_2" / STATE_FILE).read_text())
    assert saved == {
        "step": 2,
        "schedules": [{"key": "length_penalty_coeff", "stages": [{"until_step": 3, "value": 0.25}]}],
        "values": {"length_penalty_coeff": 0.25},
    }

    def resume_at(step):
        def load(self):
            self.global_steps = step

        return load

    monkeypatch.setattr(verl_base(made), "_load_checkpoint", resume_at(2))
    with caplog.at_level(logging.INFO, logger="trl_length_plugin"):
        make_trainer(overrides)._load_checkpoint()
    assert "trl-length-plugin: length_schedule: resumed at step 2: length_penalty_coeff=0.25" in caplog.text
    changed = [
        *COEFFICIENT,
        SCHEDULE.replace("until_step: 3", "until_step: 4"),
        f"trainer.default_local_dir={tmp_path}",
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        make_trainer(changed)._load_checkpoint()
    assert "differs from the config's" in caplog.text
