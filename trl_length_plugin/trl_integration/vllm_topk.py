"""Capturing the sampler's top-k head through TRL's vLLM generation (docs/reference/score-centering.md §5.2,
§5.3). Every host behaviour this needs is one helper here; the TRL and vLLM internals they touch are named and
checked in ``_host.py``.

- :func:`engine_kwargs`: TRL builds the colocated ``LLM(...)`` itself with fixed arguments; while
  ``GRPOTrainer.__init__`` runs, the name it calls is replaced by a partial adding the plugin's engine
  arguments (``max_logprobs`` >= K, ``vllm_engine_kwargs``).
- :class:`TopkCapture`: wraps the colocated engine's ``generate`` (extract each completion's head from the
  raw ``FlatLogprobs`` with the core extractors, then leave only the sampled token's own logprob, chosen by
  id, where TRL reads entry 0) and ``VLLMGeneration.generate`` (collect this rank's heads; in server mode
  build them from TRL's lists). The heads of the last generation are then read with :meth:`take`.
- :func:`check_server`: at trainer start, the server's engine returns K candidates in the processed mode.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from trl_length_plugin.score_centering import (
    ScoreCenteringCaptureError,
    engine_logprob_cap,
    extract_flat_score_centering_samples,
    extract_listed_score_centering_samples,
    extract_sampled_token_logprobs,
)


@contextmanager
def engine_kwargs(extra: dict[str, Any]) -> Iterator[None]:
    """While the block runs, TRL's colocated ``LLM(...)`` call also receives ``extra``."""
    from trl.generation import vllm_generation

    original = vllm_generation.LLM
    vllm_generation.LLM = functools.partial(original, **extra)
    try:
        yield
    finally:
        vllm_generation.LLM = original


def colocate_engine_kwargs(user: dict[str, Any], top_k: int) -> dict[str, Any]:
    """The engine arguments of a colocated engine: the user's ``vllm_engine_kwargs`` and, with score
    centering (``top_k`` > 0), the core's logprob cap (``engine_logprob_cap``: one that admits K)."""
    extra = dict(user)
    if top_k:
        extra["max_logprobs"] = engine_logprob_cap(
            user.get("max_logprobs"), top_k, "vllm_engine_kwargs.max_logprobs"
        )
    return extra


def _sampled_only(output: Any, sampled: torch.Tensor) -> Any:
    """``FlatLogprobs`` holding only each position's sampled token and its logprob."""
    from vllm.logprobs import FlatLogprobs

    positions = len(output.token_ids)
    return FlatLogprobs(
        start_indices=list(range(positions)),
        end_indices=list(range(1, positions + 1)),
        token_ids=list(output.token_ids),
        logprobs=sampled.tolist(),
        ranks=[None] * positions,
        decoded_tokens=[None] * positions,
    )


class TopkCapture:
    """The K-candidate heads of the completions TRL generated last, in TRL's order (one per completion of
    this rank): ``(ids int32 [T, K], logprobs float32 [T, K])``."""

    def __init__(self, generation: Any, top_k: int):
        self.generation, self.top_k = generation, top_k
        self._engine_heads: list | None = None
        self._heads: list | None = None
        generation.logprobs = top_k  # TRL sends it with every request, both modes
        if generation.mode == "colocate":
            kwargs = dict(generation.generation_kwargs)
            kwargs["flat_logprobs"] = True
            if not kwargs.get("stop"):  # TRL decodes the token ids itself; stop strings need vLLM's text
                kwargs["detokenize"] = False
            generation.generation_kwargs = kwargs
            generation.llm.generate = self._engine_generate(generation.llm.generate)
        generation.generate = self._generate(generation.generate)

    def _engine_generate(self, engine_generate):
        @functools.wraps(engine_generate)
        def generate(*args, **kwargs):
            outputs = engine_generate(*args, **kwargs)
            heads = []
            for completion in (output for request in outputs for output in request.outputs):
                try:
                    heads.append(extract_flat_score_centering_samples(completion, self.top_k))
                    sampled = extract_sampled_token_logprobs(completion)
                except ScoreCenteringCaptureError as err:
                    raise err.of_completion(len(heads)) from None
                completion.logprobs = _sampled_only(completion, sampled)  # TRL's entry 0: the sampled token
            self._engine_heads = heads
            return outputs

        return generate

    def _generate(self, trl_generate):
        @functools.wraps(trl_generate)
        def generate(*args, **kwargs):
            prompt_ids, completion_ids, logprobs, token_ids = trl_generate(*args, **kwargs)
            if self.generation.mode == "colocate":
                heads, self._engine_heads = self._engine_heads, None
                if self.generation.tensor_parallel_size > 1:  # TRL keeps this rank's share of the TP group
                    rank = torch.distributed.get_rank(group=self.generation.tp_group)
                    heads = heads[rank * len(completion_ids) : (rank + 1) * len(completion_ids)]
            else:
                heads, logprobs = self._listed(completion_ids, logprobs, token_ids)
            if len(heads) != len(completion_ids):
                raise ScoreCenteringCaptureError(
                    "generated_token_count",
                    f"{len(heads)} captured heads for {len(completion_ids)} completions",
                )
            self._heads = heads
            return prompt_ids, completion_ids, logprobs, token_ids

        return generate

    def _listed(self, completion_ids, logprobs, token_ids):
        """Server mode: heads from TRL's per-position lists, and the sampled tokens' logprobs by id."""
        heads, sampled = [], []
        for i, (ids, values, candidates) in enumerate(zip(completion_ids, logprobs, token_ids, strict=True)):
            try:
                head_ids, head_logprobs, own = extract_listed_score_centering_samples(
                    list(ids), values, candidates, self.top_k
                )
            except ScoreCenteringCaptureError as err:
                raise err.of_completion(i) from None
            heads.append((head_ids, head_logprobs))
            sampled.append([[value] for value in own.tolist()])
        return heads, sampled

    def take(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The heads of the last generation (once)."""
        heads, self._heads = self._heads, None
        if heads is None:
            raise RuntimeError(
                "score centering: no captured heads for this batch (was it generated by vLLM?)"
            )
        return heads


def check_server(generation: Any, top_k: int, raw_allowed: bool) -> None:
    """The server's engine must return K candidates in the processed mode (raw only where ``raw_allowed``:
    temperature 1 and no filters); the error says which ``trl vllm-serve`` option to set."""
    info = generation.vllm_client.get_server_info()["model_config"]
    mode, cap = info.get("logprobs_mode"), info.get("max_logprobs")
    problems = []
    if mode != "processed_logprobs" and not (mode == "raw_logprobs" and raw_allowed):
        problems.append(f"its logprobs mode is {mode!r}: start it with --logprobs-mode processed_logprobs")
    if cap is not None and cap != -1 and cap < top_k:
        problems.append(f"it returns at most {cap} logprobs: start it with --max-logprobs -1 (or >= {top_k})")
    if problems:
        raise ValueError(
            f"score_centering_top_k={top_k}: the vLLM server cannot return the sampler's head: "
            + "; ".join(problems)
            + " (`trl vllm-serve` sets both by default; options after its own override them)"
        )
