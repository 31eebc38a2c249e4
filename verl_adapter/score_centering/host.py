"""Every verl internal score centering relies on, named and checked against verl 0.9.1 (docs/verl.md,
"Score centering in verl"; the behaviour is docs/reference/score-centering.md §5).

:func:`check_verl_internals` runs when the plugin registers its trainers (right after verl imports
``verl.trainer.ppo.v1``; it imports no vLLM): the trainer, worker, engine, loss and agent-loop methods the
integration overrides, wraps or calls, with their parameters; the engine's top-k logits hook and its Ulysses
label roll-then-slice (which the loss's sampler fields copy); and, observed by running verl's own
``TaskRunnerV1.init_agent_loop_manager`` on a stand-in runner and a probe manager, the TaskRunner building
the class ``agent.agent_loop_manager_class`` names with ``create``, which builds the workers after
``__init__`` (the plugin's manager swaps the worker class in between). :func:`check_vllm_server` runs when a
score-centering trainer starts, in the
TaskRunner before any worker: verl's vLLM server and replica. A mismatch raises ``ImportError`` naming the
internal and the verl release this was written for.
"""

from __future__ import annotations

import inspect
import re
from types import SimpleNamespace

from trl_length_plugin import host_checks
from verl_adapter.platform.host import EXPECTED

#: Ray's tracing adds this parameter to actor methods; it is not verl's
_RAY_TRACE = "_ray_trace_ctx"


def _parameters(function) -> tuple[str, ...] | None:
    return host_checks.parameters(function, ignore=(_RAY_TRACE,))


def _changed(expected: list[tuple[object, str, tuple[str, ...]]]) -> list[str]:
    return host_checks.changed(expected, ignore=(_RAY_TRACE,))


def _raise(changed: list[str]) -> None:
    if changed:
        raise ImportError(
            f"the verl internals score centering relies on changed ({'; '.join(changed)}); "
            f"this verl_adapter supports {EXPECTED}"
        )


def _source(function) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def _missing_in_source(expected: list[tuple[str, object, tuple[str, ...]]]) -> list[str]:
    """``name (what)`` for each function whose source lacks one of its patterns (regular expressions, in order)."""
    changed = []
    for what, function, patterns in expected:
        source, start = _source(function), 0
        for pattern in patterns:
            found = re.compile(pattern).search(source, start)
            if found is None:
                changed.append(what)
                break
            start = found.end()
    return changed


#: what the TaskRunner does with the configured manager class, in order (the plugin's manager swaps the
#: worker class between its ``__init__`` and ``_init_agent_loop_workers``)
_MANAGER_SETUP = ["__init__", "_init_agent_loop_workers", "assigned"]


def _manager_setup(runner: type, base: type) -> list[str]:
    """Run verl's own ``TaskRunnerV1.init_agent_loop_manager`` on a stand-in runner whose config names a probe
    subclass of ``AgentLoopManagerTQ`` (no Ray, no worker): what verl called on it, in order, and
    ``assigned`` when the runner kept the instance ``create`` built."""
    from omegaconf import OmegaConf

    calls: list[str] = []

    class Probe(base):
        def __init__(self, *args, **kwargs):
            calls.append("__init__")

        async def _init_agent_loop_workers(self):
            calls.append("_init_agent_loop_workers")

    trainer = SimpleNamespace(
        get_llm_client=lambda: None, get_teacher_client=lambda: None, get_reward_handles=lambda: None
    )
    agent = {"agent_loop_manager_class": f"{__name__}.{_PROBE}"}
    stand_in = SimpleNamespace(
        config=OmegaConf.create({"actor_rollout_ref": {"rollout": {"agent": agent}}}), trainer=trainer
    )
    globals()[_PROBE] = Probe  # load_class_from_fqn imports it by name
    try:
        runner.init_agent_loop_manager(stand_in)
    except Exception as err:  # noqa: BLE001 - any failure means verl's setup changed
        return [*calls, f"raised {type(err).__name__}"]
    finally:
        del globals()[_PROBE]
    manager = getattr(stand_in, "agent_loop_manager", None)
    if inspect.iscoroutine(manager):  # a create verl no longer runs to completion
        manager.close()
    return [*calls, "assigned"] if isinstance(manager, Probe) else calls


_PROBE = "_AgentLoopManagerProbe"


def check_verl_internals() -> None:
    """The trainer, worker, engine, loss and agent-loop internals (no vLLM import)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopOutput, AgentLoopWorker
    from verl.trainer import main_ppo
    from verl.trainer.ppo import core_algos, rollout_corr_helper
    from verl.trainer.ppo.v1 import agent_loop_tq, trainer_base
    from verl.utils import ulysses
    from verl.workers import engine_workers
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.replica import RolloutReplicaRegistry
    from verl.workers.utils import losses, padding

    from verl_adapter.luspo import POLICY_LOSS_KEYWORDS
    from verl_adapter.score_centering.config import BASE_LOSS_AGGREGATION

    trainer = trainer_base.PPOTrainer
    worker = getattr(agent_loop_tq.AgentLoopWorkerTQ, "__ray_actor_class__", None)
    runner = getattr(main_ppo.TaskRunnerV1, "__ray_actor_class__", None)
    changed = _changed(
        [
            (trainer, "_update_actor", ("self", "batch", "metrics")),
            (trainer, "on_init_end", ("self",)),
            (trainer, "_save_checkpoint", ("self",)),
            (trainer, "_load_checkpoint", ("self",)),
            (engine_workers.ActorRolloutRefWorker, "set_loss_fn", ("self", "loss_fn")),
            (engine_workers.ActorRolloutRefWorker, "update_actor", ("self", "data")),
            (
                FSDPEngineWithLMHead,
                "prepare_model_outputs",
                ("self", "output", "output_args", "micro_batch", "logits_processor_func"),
            ),
            (losses, "ppo_loss", ("config", "model_output", "data", "dp_group")),
            (padding, "no_padding_2_padding", ("tensor", "data")),
            (
                core_algos,
                "agg_loss",
                ("loss_mat", "loss_mask", "loss_agg_mode", "dp_size", "batch_num_tokens", "global_batch_size")
                + ("loss_scale_factor",),
            ),
            (rollout_corr_helper, "_parse_rollout_is_threshold", ("threshold_spec",)),
            (AgentLoopWorker, "_run_agent_loop", ("self", "sampling_params", "trajectory", "agent_name", "trace")
             + ("kwargs",)),
            (worker, "_agent_loop_postprocess", ("self", "output", "validate", "kwargs")),
            (AgentLoopOutput, "as_dict", ("self",)),
            (LLMServerClient, "generate", ("self", "request_id", "prompt_ids", "sampling_params", "image_data")
             + ("video_data", "audio_data", "mm_processor_kwargs", "kwargs")),
            (RolloutReplicaRegistry, "register", ("name", "loader")),
            (runner, "init_agent_loop_manager", ("self",)),
            (AgentLoopWorker, "__init__", ("self", "config", "llm_client", "teacher_client")
             + ("reward_loop_worker_handles",)),
            (worker, "__init__", ("self", "args", "kwargs")),
            (ulysses, "slice_input_tensor", ("x", "dim", "padding", "group")),
            (ulysses, "ulysses_pad_and_slice_inputs", ("input_ids_rmpad", "position_ids_rmpad", "sp_size")
             + ("skip_position_ids_rmpad", "pad_value")),
        ]
    )  # fmt: skip
    changed += _missing_in_source(
        [
            (
                "AgentLoopManager._init_agent_loop_workers (no longer builds self.agent_loop_workers_class)",
                AgentLoopManager._init_agent_loop_workers,
                (r"self\.agent_loop_workers_class\.options\(",),
            ),
            (
                "FSDPEngineWithLMHead.prepare_model_inputs (its Ulysses label roll, then pad-and-slice)",
                FSDPEngineWithLMHead.prepare_model_inputs,
                (
                    r"torch\.roll\(input_ids_rmpad, shifts=-1",
                    r"ulysses_pad_and_slice_inputs\(\s*input_ids_rmpad_rolled",
                ),
            ),
        ]
    )
    if runner is not None and _manager_setup(runner, agent_loop_tq.AgentLoopManagerTQ) != _MANAGER_SETUP:
        changed.append(
            "TaskRunnerV1.init_agent_loop_manager -> AgentLoopManagerTQ.create (no longer builds the workers after "
            "__init__ of the class agent.agent_loop_manager_class names)"
        )
    hook = inspect.getsource(FSDPEngineWithLMHead.prepare_model_outputs)
    if not all(
        marker in hook for marker in ("distillation_use_topk", "distillation_only", "student_logits=")
    ):
        changed.append("FSDPEngineWithLMHead.prepare_model_outputs (its top-k logits hook)")
    for name in BASE_LOSS_AGGREGATION:
        if name == "luspo":  # registered by this plugin
            continue
        function = core_algos.POLICY_LOSS_REGISTRY.get(name)
        params = _parameters(function) or ()
        if any(keyword not in params for keyword in POLICY_LOSS_KEYWORDS):
            changed.append(f"policy loss {name!r}{params}")
    _raise(changed)


def check_vllm_server() -> None:
    """verl's vLLM server and replica (imports vLLM): the methods the capturing server overrides."""
    from verl.workers.rollout.vllm_rollout import vllm_async_server

    server, replica = vllm_async_server.vLLMHttpServer, vllm_async_server.vLLMReplica
    changed = _changed([(server, "run_server", ("self", "args"))])
    generate = _parameters(getattr(server, "generate", None)) or ()
    if generate[:4] != ("self", "prompt_ids", "sampling_params", "request_id"):
        changed.append(f"vLLMHttpServer.generate{generate}")
    if "self.engine = " not in inspect.getsource(server.run_server):
        changed.append("vLLMHttpServer.run_server (no longer sets self.engine)")
    if "self.server_class = ray.remote(vLLMHttpServer)" not in inspect.getsource(replica.__init__):
        changed.append("vLLMReplica.__init__ (no longer sets server_class)")
    _raise(changed)
