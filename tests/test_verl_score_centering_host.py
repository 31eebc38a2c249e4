"""The verl internals score centering relies on are checked when the plugin loads and fail closed with a
clear message (verl_adapter/score_centering/host.py). Each broken host below is a stand-in: the installed
verl with one internal monkeypatched (a changed signature, a method whose source no longer does what the
plugin relies on, or a setup step that behaves otherwise when run on a stand-in runner)."""

from __future__ import annotations

import pytest

verl = pytest.importorskip("verl")

from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: E402
from verl.trainer import main_ppo  # noqa: E402
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ  # noqa: E402
from verl.utils import ulysses  # noqa: E402

from verl_adapter.score_centering.host import check_verl_internals  # noqa: E402


def test_the_installed_verl_passes():
    check_verl_internals()


def test_a_changed_worker_signature_fails_closed(monkeypatch):
    def __init__(self, config, server_manager, teacher_client=None, reward_loop_worker_handles=None):
        pass

    monkeypatch.setattr(AgentLoopWorker, "__init__", __init__)
    with pytest.raises(ImportError, match=r"relies on changed \(AgentLoopWorker\.__init__\(.*server_manager"):
        check_verl_internals()


def test_a_changed_ulysses_helper_fails_closed(monkeypatch):
    monkeypatch.setattr(ulysses, "slice_input_tensor", lambda x, dim, group=None: x)
    with pytest.raises(ImportError, match=r"slice_input_tensor\('x', 'dim', 'group'\).*supports verl"):
        check_verl_internals()


def test_a_manager_that_builds_its_workers_in_init_fails_closed(monkeypatch):
    """The stand-in ``create`` no longer builds the workers after ``__init__``: the plugin's manager, which
    swaps the worker class after ``super().__init__()``, would run verl's workers."""

    async def create(cls, *args, **kwargs):
        return cls(*args, **kwargs)

    monkeypatch.setattr(AgentLoopManagerTQ, "create", classmethod(create))
    with pytest.raises(ImportError, match=r"AgentLoopManagerTQ\.create \(no longer builds the workers after"):
        check_verl_internals()


def test_a_task_runner_that_ignores_the_configured_manager_fails_closed(monkeypatch):
    """verl's own ``init_agent_loop_manager`` is run on a stand-in runner whose config names a probe manager;
    a TaskRunner that builds its default manager instead would never carry the heads."""
    runner = main_ppo.TaskRunnerV1.__ray_actor_class__
    calls = []
    monkeypatch.setattr(runner, "init_agent_loop_manager", lambda self: calls.append(self.config))
    with pytest.raises(
        ImportError, match=r"TaskRunnerV1\.init_agent_loop_manager -> AgentLoopManagerTQ\.create"
    ):
        check_verl_internals()
    assert len(calls) == 1 and calls[0].actor_rollout_ref.rollout.agent.agent_loop_manager_class.endswith(
        "score_centering.host._AgentLoopManagerProbe"
    )
