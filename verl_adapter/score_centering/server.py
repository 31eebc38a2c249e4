"""The sampler's top-k head from verl's vLLM rollout server (docs/reference/score-centering.md §5.2, §5.3).

verl 0.9.1's ``vLLMHttpServer.generate`` turns any requested ``logprobs`` into 0 (the sampled token only).
:class:`ScoreCenteringVLLMHttpServer` keeps verl's ``generate`` and wraps the engine's: a request whose
``logprobs`` is a count K (what the score-centering agent-loop worker sends for training sessions; verl's
own requests send ``True``) gets ``SamplingParams.logprobs = K`` and flat logprobs, is checked with
``validate_score_centering_request`` against the engine's logprobs mode, and its final ``RequestOutput`` is
kept for that request; verl still picks the sampled token's logprob by id (``rollout_log_probs``). The head,
``extract_score_centering_samples`` of that output (``ids int32 [T, K]``, ``logprobs float32 [T, K]``), goes
back in ``TokenOutput.extra_fields``. An aborted request returns the head of the tokens it generated.

:class:`ScoreCenteringVLLMReplica` launches that server. The score-centering trainer registers it as
``"vllm"`` in verl's ``RolloutReplicaRegistry`` in the TaskRunner before any replica exists, and raises the
engine's ``max_logprobs`` to K through ``engine_kwargs.vllm`` (verl passes it to vLLM).

Importing this module imports vLLM (through verl's server module).
"""

from __future__ import annotations

import functools
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import ray
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from trl_length_plugin.score_centering import (
    extract_score_centering_samples,
    validate_score_centering_request,
)
from verl_adapter.score_centering.loss import SAMPLER_IDS, SAMPLER_LOGPROBS


@dataclass
class _Request:
    """One capturing request: its K, the engine's logprobs mode, and the engine's last output."""

    top_k: int
    logprobs_mode: str
    final: Any = None


_REQUEST: ContextVar[_Request | None] = ContextVar("score_centering_request", default=None)


def requested_top_k(sampling_params: dict) -> int | None:
    """K when the request asks for a head (an int ``logprobs``; verl's own requests send a bool)."""
    value = sampling_params.get("logprobs")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def capturing(engine_generate):
    """The engine's ``generate`` that, inside a capturing request, asks for the head and keeps the output."""

    @functools.wraps(engine_generate)
    def generate(*args, sampling_params, **kwargs):
        request = _REQUEST.get()
        if request is None:
            return engine_generate(*args, sampling_params=sampling_params, **kwargs)
        sampling_params.logprobs, sampling_params.flat_logprobs = request.top_k, True
        validate_score_centering_request(sampling_params, request.top_k, logprobs_mode=request.logprobs_mode)
        return _kept(engine_generate(*args, sampling_params=sampling_params, **kwargs), request)

    return generate


async def _kept(outputs, request: _Request):
    async for output in outputs:
        request.final = output
        yield output


class ScoreCenteringVLLMHttpServer(vLLMHttpServer):
    """verl's vLLM server that returns the sampler's head of the requests that ask for one."""

    async def run_server(self, args):
        await super().run_server(args)
        self.engine.generate = capturing(self.engine.generate)

    async def generate(self, prompt_ids, sampling_params, request_id, **kwargs):
        top_k = requested_top_k(sampling_params)
        if top_k is None:
            return await super().generate(prompt_ids, sampling_params, request_id, **kwargs)
        request = _Request(top_k, self.config.logprobs_mode)
        token = _REQUEST.set(request)
        try:
            output = await super().generate(prompt_ids, sampling_params, request_id, **kwargs)
        finally:
            _REQUEST.reset(token)
        if output.token_ids:
            ids, logprobs = extract_score_centering_samples(request.final.outputs[0], top_k)
            output.extra_fields[SAMPLER_IDS], output.extra_fields[SAMPLER_LOGPROBS] = ids, logprobs
        return output


class ScoreCenteringVLLMReplica(vLLMReplica):
    """verl's vLLM replica with :class:`ScoreCenteringVLLMHttpServer`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(ScoreCenteringVLLMHttpServer)
