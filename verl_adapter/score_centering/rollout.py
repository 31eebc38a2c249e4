"""The sampler's heads from verl's rollout to TransferQueue (docs/reference/score-centering.md §5.2, §5.5).

- :class:`ScoreCenteringAgentLoopManager` (``actor_rollout_ref.rollout.agent.agent_loop_manager_class``, set
  by the trainer) runs :class:`ScoreCenteringAgentLoopWorker` instead of verl's ``AgentLoopWorkerTQ``.
- For each training session the worker asks for K candidates, ``logprobs=K`` instead of verl's ``True``, and
  checks the sampling settings (the plan's ``capture_request``). Validation sessions keep ``True`` and
  capture nothing.
- The worker's LLM client records every server call's sampled tokens and heads, below verl's abort/resume
  loop (``FullyAsyncLLMServerClient``) and below agent loops that keep only their first turn's extra fields;
  the server (``score_centering_server``) returns the heads in ``TokenOutput.extra_fields``.
- When the session ends, :func:`token_aligned_heads` lays the recorded heads on the row's tokens, and the
  row written to TransferQueue gains ``sampler_topk_ids`` (int32) and ``sampler_topk_logprobs`` (float32), each
  ``[prompt + response, K]``: row j holds the head of token j for the tokens the model generated
  (``response_mask`` 1), zeros at prompt, tool and inserted tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from typing import NamedTuple

import ray
import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.workers.rollout.llm_server import LLMServerClient

from trl_length_plugin.score_centering import ScoreCenteringCaptureError
from verl_adapter.score_centering.config import resolve_settings
from verl_adapter.score_centering.loss import SAMPLER_IDS, SAMPLER_LOGPROBS


class ServerCall(NamedTuple):
    """One generate call of a session: the tokens it sampled and their heads ``[t, K]``."""

    token_ids: list[int]
    ids: torch.Tensor
    logprobs: torch.Tensor


class _Session(NamedTuple):
    """A training session's K and the calls its client recorded so far."""

    top_k: int
    calls: list[ServerCall]


_SESSION: ContextVar[_Session | None] = ContextVar("score_centering_session", default=None)


def token_aligned_heads(
    prompt_len: int,
    response_ids: Sequence[int],
    response_mask: Sequence[int],
    calls: Sequence[ServerCall],
    top_k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids int32, logprobs float32)``, ``[prompt_len + len(response_ids), K]``, from a session's calls.

    Each run of generated tokens (``response_mask`` 1) must be what the calls sampled next, in order; what a
    run leaves of a call (verl trimmed a turn's end, or truncated the response) is dropped, the next run
    starting at the next call. A mismatch raises ``ScoreCenteringCaptureError`` (``sampled_token`` at the
    response position, or ``generated_token_count`` when the calls end first).
    """
    ids = torch.zeros(prompt_len + len(response_ids), top_k, dtype=torch.int32)
    logprobs = torch.zeros(prompt_len + len(response_ids), top_k, dtype=torch.float32)
    call, offset = 0, 0
    previous = 0
    for position, (token, generated) in enumerate(zip(response_ids, response_mask, strict=True)):
        if not generated:
            previous = 0
            continue
        if not previous and offset:  # a new run starts with the next call
            call, offset = call + 1, 0
        while call < len(calls) and offset == len(calls[call].token_ids):
            call, offset = call + 1, 0
        if call == len(calls):
            raise ScoreCenteringCaptureError(
                "generated_token_count",
                f"the response has more generated tokens than its {len(calls)} generate calls returned",
                position,
            )
        captured = calls[call]
        if captured.token_ids[offset] != token:
            raise ScoreCenteringCaptureError(
                "sampled_token",
                f"response token {token} is not the token the sampler returned next ({captured.token_ids[offset]})",
                position,
            )
        ids[prompt_len + position] = captured.ids[offset]
        logprobs[prompt_len + position] = captured.logprobs[offset]
        offset += 1
        previous = 1
    return ids, logprobs


class ScoreCenteringClient(LLMServerClient):
    """Inserted right above ``LLMServerClient`` in the worker's client class: records each server call."""

    async def generate(self, request_id, **kwargs):
        output = await super().generate(request_id, **kwargs)
        ids = output.extra_fields.pop(SAMPLER_IDS, None)
        logprobs = output.extra_fields.pop(SAMPLER_LOGPROBS, None)
        session = _SESSION.get()
        if session is not None and output.token_ids:
            if ids is None:
                raise ScoreCenteringCaptureError(
                    "logprobs_present",
                    "the rollout server returned no sampler heads (verl_adapter's vLLM replica is not the one "
                    "registered as 'vllm')",
                )
            session.calls.append(ServerCall(list(output.token_ids), ids, logprobs))
        return output


def with_capture(client: LLMServerClient) -> LLMServerClient:
    """The same client whose server calls also go through :class:`ScoreCenteringClient` (same state)."""
    cls = type(client)
    if not issubclass(cls, ScoreCenteringClient):
        capture = (
            ScoreCenteringClient
            if cls is LLMServerClient
            else type(cls.__name__, (cls, ScoreCenteringClient), {})
        )
        client.__class__ = capture
    return client


class _OutputWithHeads(AgentLoopOutput):
    """An agent-loop output whose TransferQueue row also carries the session's heads."""

    def as_dict(self):
        row = super().as_dict()
        session = _SESSION.get()
        row[SAMPLER_IDS], row[SAMPLER_LOGPROBS] = token_aligned_heads(
            len(self.prompt_ids), self.response_ids, self.response_mask, session.calls, session.top_k
        )
        return row


class ScoreCenteringAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):
    """verl's TransferQueue agent-loop worker that captures the sampler's heads of training sessions."""

    def __init__(self, config, llm_client, *args, **kwargs):
        super().__init__(config, llm_client, *args, **kwargs)
        self.llm_client = with_capture(self.llm_client)
        self.score_centering = resolve_settings(config)  # the run's one plan, as the TaskRunner's

    async def _run_agent_loop(self, sampling_params, trajectory, **kwargs):
        if trajectory["validate"]:
            return await super()._run_agent_loop(sampling_params, trajectory, **kwargs)
        plan = self.score_centering
        request = plan.capture_request(sampling_params, logprobs_mode=self.rollout_config.logprobs_mode)
        token = _SESSION.set(_Session(plan.top_k, []))
        try:
            return await super()._run_agent_loop(request, trajectory, **kwargs)
        finally:
            _SESSION.reset(token)

    async def _agent_loop_postprocess(self, output, validate, **kwargs):
        if _SESSION.get() is not None:
            outputs = output if isinstance(output, list) else [output]
            if len(outputs) != 1:
                raise NotImplementedError(
                    f"score centering: agent loops returning {len(outputs)} outputs per session are not supported"
                )
            outputs[0].__class__ = _OutputWithHeads
        return await super()._agent_loop_postprocess(output, validate, **kwargs)


class ScoreCenteringAgentLoopManager(AgentLoopManagerTQ):
    """verl's TransferQueue agent-loop manager with :class:`ScoreCenteringAgentLoopWorker`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = ray.remote(ScoreCenteringAgentLoopWorker)
