"""The trainer's logprobs at the sampler's K ids in verl 0.9.1's actor forward (docs/reference/score-centering.md
§5.4), on the embedded model on CPU.

verl's real ``FSDPEngineWithLMHead.forward_step`` runs (``prepare_model_inputs`` packing or padding the
micro-batch, the model forward, ``prepare_model_outputs`` calling the score-centering hook on the
temperature-scaled logits and unpacking its outputs, then the loss). The engine object itself is a shell built
without ``__init__``: its FSDP wrapping and device setup need CUDA (verl registers the FSDP engines for
cuda/npu only), so the module is the plain HF model and ``get_device_id``/``get_device_name`` answer "cpu". With packing
(``use_remove_padding``) and without, the loss, its parameter gradients and the sampled ``log_probs`` equal a
reference from per-sequence forwards and full log-softmaxes, and ``log_probs`` equal verl's own path (hook off).
"""

from __future__ import annotations

import types
from functools import partial

import pytest
import torch

verl = pytest.importorskip("verl")

import verl.utils.torch_functional as verl_F  # noqa: E402
import verl.workers.engine.fsdp.transformer_impl as transformer_impl  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402

from tests.verl_score_centering_helpers import (  # noqa: E402
    MODES,
    make_rollouts,
    micro_batch,
    reference_loss,
    settings_and_actor,
)
from verl_adapter.score_centering.loss import CORRECTION, score_centering_ppo_loss  # noqa: E402

TEMPERATURE = 0.7
PROMPT_LENS, RESPONSE_LENS = [4, 3, 5], [6, 4, 3]
K = 6


@pytest.fixture(scope="module")
def model(random_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(
        random_model_dir, dtype=torch.float32, attn_implementation="eager"
    )


@pytest.fixture
def engine(model, monkeypatch):
    """verl's engine class around the plain model (see the module docstring)."""
    monkeypatch.setattr(transformer_impl, "get_device_id", lambda: "cpu")
    monkeypatch.setattr(transformer_impl, "get_device_name", lambda: "cpu")
    shell = object.__new__(transformer_impl.FSDPEngineWithLMHead)
    shell.module, shell.pad_to_length, shell.pad_to_length_bucket = model, False, None
    shell.use_ulysses_sp, shell.ulysses_sequence_parallel_size, shell.ulysses_device_mesh = False, 1, None
    shell._autocast_dtype = torch.float32
    shell.engine_config = types.SimpleNamespace(
        entropy_checkpointing=False, entropy_from_logits_with_chunking=False
    )
    shell.compute_entropy_from_logits = verl_F.entropy_from_logits
    return shell


def reference_logits(model, rollouts):
    """One forward per sequence (no packing), temperature-scaled, rows concatenated in order."""
    rows = []
    for prompt, response in zip(rollouts.prompts, rollouts.responses, strict=True):
        ids = torch.cat([prompt, response])
        rows.append(
            model(input_ids=ids[None], position_ids=torch.arange(len(ids))[None]).logits[0] / TEMPERATURE
        )
    return torch.cat(rows)


def engine_step(engine, model, data, loss_fn, packed: bool):
    tu.assign_non_tensor(data, use_remove_padding=packed, use_fused_kernels=False, calculate_entropy=False)
    tu.assign_non_tensor(data, temperature=TEMPERATURE)
    model.zero_grad()
    loss, output = engine.forward_step(data, loss_function=loss_fn, forward_only=False)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()], output["model_output"]


@pytest.mark.parametrize("mode", ["tis", "adaptive-ppo-clip"])
def test_actor_forward_packed_and_unpacked_equal_the_full_log_softmax_reference(engine, model, mode):
    settings, actor, _ = settings_and_actor(MODES[mode])
    vocab = model.config.vocab_size
    rollouts = make_rollouts(PROMPT_LENS, RESPONSE_LENS, vocab, K, seed=1, dtype=torch.float32)
    weights = [torch.ones(len(r)) * 0.9 for r in rollouts.responses] if mode == "tis" else None
    k = 0.1 if mode == "adaptive-ppo-clip" else None
    loss_fn = partial(score_centering_ppo_loss, config=actor, settings=settings)

    model.zero_grad()
    ref_loss, _, ref = reference_loss(
        settings, actor, rollouts, reference_logits(model, rollouts), weights, k or 0.0
    )
    ref_loss.backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    for packed in (True, False):
        data = micro_batch(rollouts, [0, 1, 2], rollout_is_weights=weights, adaptive_k=k)
        loss, grads, output = engine_step(engine, model, data, loss_fn, packed)
        assert loss == pytest.approx(ref_loss.item(), rel=1e-5, abs=1e-6)
        for grad, expected in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-6)
        sampled = torch.nn.utils.rnn.pad_sequence(
            [row[len(p) - 1 : len(p) + len(r) - 1] for row, p, r in zip(output["log_probs"].unbind(), rollouts.prompts, rollouts.responses, strict=True)],
            batch_first=True,
        )  # fmt: skip
        torch.testing.assert_close(
            sampled[ref["mask"]], ref["sampled"].detach()[ref["mask"]], rtol=0, atol=2e-6
        )
        assert output[CORRECTION].values().abs().sum() > 0


def test_sampled_log_probs_equal_verls_own_path(engine, model):
    """With the hook, ``log_probs`` come from the score-centering op; without it, from verl's
    ``logprobs_from_logits``: the same values (here no flash-attn, so both are plain float32 log-softmaxes)."""
    settings, actor, _ = settings_and_actor([])
    rollouts = make_rollouts(
        PROMPT_LENS, RESPONSE_LENS, model.config.vocab_size, K, seed=2, dtype=torch.float32
    )
    data = micro_batch(rollouts, [0, 1, 2])
    _, _, hooked = engine_step(
        engine, model, data, partial(score_centering_ppo_loss, config=actor, settings=settings), True
    )
    plain = micro_batch(rollouts, [0, 1, 2])
    tu.assign_non_tensor(plain, distillation_use_topk=False, distillation_only=False, use_remove_padding=True)
    tu.assign_non_tensor(plain, use_fused_kernels=False, calculate_entropy=False, temperature=TEMPERATURE)
    with torch.no_grad():
        _, own = engine.forward_step(plain, loss_function=None, forward_only=True)
    torch.testing.assert_close(
        hooked["log_probs"].values(), own["model_output"]["log_probs"].values(), rtol=0, atol=2e-6
    )
