"""policy_logprobs_at_sampler_topk against a full-vocabulary log_softmax gather (docs/reference/score-centering.md §5.4)."""

from __future__ import annotations

import math
from contextlib import contextmanager

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trl_length_plugin.score_centering.topk_logprobs import logprobs_at_ids, policy_logprobs_at_sampler_topk

B, T, H, V, K = 2, 5, 16, 97, 6


def make_inputs(seed=0, dtype=torch.float32, bias=True, vocab=V, k=K):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g).to(dtype).requires_grad_(True)
    weight = (torch.randn(vocab, H, generator=g) * 0.5).to(dtype).requires_grad_(True)
    b = (torch.randn(vocab, generator=g) * 0.1).to(dtype).requires_grad_(True) if bias else None
    ids = torch.stack([torch.randperm(vocab, generator=g)[:k] for _ in range(B * T)]).view(B, T, k)
    sampled = torch.randint(0, vocab, (B, T), generator=g)
    sampled[0, 0] = ids[0, 0, 2]  # the sampled token inside the head at one position
    return hidden, weight, b, ids, sampled


def full_vocabulary_reference(hidden, weight, bias, ids, sampled, temperature=1.0, scale=1.0, softcap=None):
    """log_softmax over the whole vocabulary in float64 from the same (rounded) inputs, then gathered."""
    logits = hidden.double() @ weight.double().t()
    if bias is not None:
        logits = logits + bias.double()
    logits = logits * scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logprobs = (logits / temperature).log_softmax(-1)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    return logprobs.gather(-1, sampled.unsqueeze(-1)).squeeze(-1), logprobs.gather(-1, ids), entropy


def replay_reference(hidden, weight, bias, ids, sampled, sampler_logprobs, temperature=1.0):
    logits = hidden.double() @ weight.double().t()
    if bias is not None:
        logits = logits + bias.double()
    logits = logits / temperature
    kept = torch.isfinite(sampler_logprobs)
    head = logits.gather(-1, ids)
    normalizer = torch.where(kept, head, -math.inf).logsumexp(-1, keepdim=True)
    topk = torch.where(kept, head - normalizer, -math.inf)
    sampled_lp = logits.gather(-1, sampled.unsqueeze(-1)) - normalizer
    p = torch.where(kept, topk.exp(), 0.0)
    entropy = -(p * torch.where(kept, topk, 0.0)).sum(-1)
    return sampled_lp.squeeze(-1), topk, entropy


def grads_of(outputs, weights, inputs):
    """Gradients of a random linear functional of (sampled, topk, entropy); -inf slots weigh 0."""
    sampled, topk, entropy = outputs
    total = (sampled.double() * weights[0]).sum() + (entropy.double() * weights[2]).sum()
    total = total + torch.where(torch.isfinite(topk), topk.double() * weights[1], 0.0).sum()
    return torch.autograd.grad(total, [x for x in inputs if x is not None])


def random_weights(seed=1):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, T, generator=g, dtype=torch.float64),
        torch.randn(B, T, K, generator=g, dtype=torch.float64),
        torch.randn(B, T, generator=g, dtype=torch.float64),
    )


TRANSFORMS = [
    {},
    {"temperature": 0.7},
    {"temperature": 1.3, "logit_scale": 0.8, "final_logit_softcapping": 3.0},
]


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("chunks", [(1024, 32768), (3, 10)])
def test_equals_full_vocabulary_log_softmax_gather_fp32(transform, chunks):
    hidden, weight, bias, ids, sampled = make_inputs()
    out = policy_logprobs_at_sampler_topk(
        hidden,
        weight,
        bias,
        sampled_ids=sampled,
        sampler_topk_ids=ids,
        with_entropy=True,
        token_chunk_size=chunks[0],
        vocab_chunk_size=chunks[1],
        **transform,
    )
    ref = full_vocabulary_reference(
        hidden,
        weight,
        bias,
        ids,
        sampled,
        transform.get("temperature", 1.0),
        transform.get("logit_scale", 1.0),
        transform.get("final_logit_softcapping"),
    )
    assert out.topk.shape == (B, T, K) and out.sampled.shape == (B, T) and out.topk.dtype == torch.float32
    for got, want in zip(out, ref, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    weights = random_weights()
    for got, want in zip(
        grads_of(out, weights, (hidden, weight, bias)),
        grads_of(ref, weights, (hidden, weight, bias)),
        strict=True,
    ):
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-4, atol=1e-5)


def test_bf16_matches_reference_from_the_same_rounded_inputs():
    hidden, weight, bias, ids, sampled = make_inputs(dtype=torch.bfloat16)
    out = policy_logprobs_at_sampler_topk(
        hidden, weight, bias, sampled_ids=sampled, sampler_topk_ids=ids, temperature=0.7, vocab_chunk_size=32
    )
    assert out.topk.dtype == torch.float32
    ref = full_vocabulary_reference(hidden, weight, bias, ids, sampled, 0.7)
    # bf16 tiles round the logits (8 bits of mantissa); log-probabilities of magnitude ~5 stay within 0.05
    torch.testing.assert_close(out.topk.double(), ref[1], rtol=0, atol=5e-2)
    torch.testing.assert_close(out.sampled.double(), ref[0], rtol=0, atol=5e-2)
    weights = random_weights()
    outputs = (out.sampled, out.topk, torch.zeros(B, T))
    got = torch.autograd.grad(
        (out.sampled.double() * weights[0]).sum() + (out.topk.double() * weights[1]).sum(),
        [hidden, weight, bias],
    )
    want = torch.autograd.grad(
        (ref[0] * weights[0]).sum() + (ref[1] * weights[1]).sum(), [hidden, weight, bias]
    )
    del outputs
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g.double(), w.double(), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_replay_normalizes_over_the_kept_head_slots(temperature):
    hidden, weight, bias, ids, sampled = make_inputs(seed=3)
    g = torch.Generator().manual_seed(4)
    sampler = torch.randn(B, T, K, generator=g).log_softmax(-1)
    sampler[..., 4:] = -math.inf  # filtered out by top-k/top-p
    sampler[1, 2, 1:] = -math.inf
    sampled = ids[..., 0].clone()  # under replay the sampled token is in the kept set
    out = policy_logprobs_at_sampler_topk(
        hidden,
        weight,
        bias,
        sampled_ids=sampled,
        sampler_topk_ids=ids,
        sampler_topk_logprobs=sampler,
        sampler_replay=True,
        temperature=temperature,
        with_entropy=True,
    )
    ref = replay_reference(hidden, weight, bias, ids, sampled, sampler, temperature)
    assert torch.equal(torch.isfinite(out.topk), torch.isfinite(sampler))
    for got, want in zip(out, ref, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        torch.where(torch.isfinite(out.topk), out.topk.exp(), 0).sum(-1), torch.ones(B, T)
    )
    weights = random_weights()
    for got, want in zip(
        grads_of(out, weights, (hidden, weight, bias)),
        grads_of(ref, weights, (hidden, weight, bias)),
        strict=True,
    ):
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("replay", [False, True])
def test_gradcheck_small_vocabulary(replay):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(9, 4, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(9, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.stack([torch.randperm(9, generator=g)[:3] for _ in range(6)]).view(2, 3, 3)
    sampler = torch.randn(2, 3, 3, generator=g, dtype=torch.float64)
    sampler[0, 1, 2] = -math.inf

    def outputs(h, w, b):
        out = policy_logprobs_at_sampler_topk(
            h,
            w,
            b,
            sampled_ids=ids[..., 1],
            sampler_topk_ids=ids,
            sampler_topk_logprobs=sampler,
            sampler_replay=replay,
            temperature=0.8,
            final_logit_softcapping=2.5,
            logit_scale=1.2,
            with_entropy=True,
            token_chunk_size=4,
            vocab_chunk_size=4,
        )
        return out.sampled, torch.where(torch.isfinite(out.topk), out.topk, 0.0), out.entropy

    assert torch.autograd.gradcheck(outputs, (hidden, weight, bias))


def test_no_tokens_by_vocabulary_tensor_is_saved_or_materialized():
    """Saved tensors and tiles stay far below tokens x vocabulary (here 4096 x 2000 would be 32 MiB)."""
    n, vocab = 4096, 2000
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, 8, generator=g, requires_grad=True)
    weight = torch.randn(vocab, 8, generator=g, requires_grad=True)
    ids = torch.randint(0, vocab, (n, 4), generator=g)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x.numel()) or x, lambda x: x):
        out = policy_logprobs_at_sampler_topk(
            hidden,
            weight,
            sampled_ids=ids[:, 0],
            sampler_topk_ids=ids,
            token_chunk_size=256,
            vocab_chunk_size=512,
        )
    assert max(saved) <= max(hidden.numel(), weight.numel(), ids.numel() + n)
    out.topk.sum().backward()
    assert hidden.grad.shape == hidden.shape and weight.grad.shape == weight.shape


def test_sampled_only_and_leading_shapes():
    hidden, weight, bias, ids, sampled = make_inputs()
    out = policy_logprobs_at_sampler_topk(
        hidden, weight, bias, sampled_ids=sampled, sampler_topk_ids=ids[..., :0]
    )
    assert out.topk.shape == (B, T, 0) and out.entropy is None
    torch.testing.assert_close(
        out.sampled.double(), full_vocabulary_reference(hidden, weight, bias, ids, sampled)[0]
    )
    flat = policy_logprobs_at_sampler_topk(
        hidden.reshape(-1, H),
        weight,
        bias,
        sampled_ids=sampled.reshape(-1),
        sampler_topk_ids=ids.reshape(-1, K),
    )
    full = policy_logprobs_at_sampler_topk(hidden, weight, bias, sampled_ids=sampled, sampler_topk_ids=ids)
    assert torch.equal(flat.topk.view(B, T, K), full.topk)


def test_backward_regathers_the_weight_and_respects_frozen_weight():
    hidden, weight, _, ids, sampled = make_inputs(bias=False)
    weight.requires_grad_(False)
    entered = []

    @contextmanager
    def gather(*params):
        entered.append(len(params))
        yield

    out = policy_logprobs_at_sampler_topk(
        hidden, weight, sampled_ids=sampled, sampler_topk_ids=ids, gather_weight=gather
    )
    out.topk.sum().backward()
    assert entered == [2] and weight.grad is None and hidden.grad is not None


def test_rejects_out_of_range_ids_and_bad_temperature():
    hidden, weight, bias, ids, sampled = make_inputs()
    with pytest.raises(ValueError, match="vocabulary"):
        policy_logprobs_at_sampler_topk(hidden, weight, bias, sampled_ids=sampled, sampler_topk_ids=ids + V)
    with pytest.raises(ValueError, match="temperature"):
        policy_logprobs_at_sampler_topk(
            hidden, weight, bias, sampled_ids=sampled, sampler_topk_ids=ids, temperature=0
        )


# -- from logits (hosts that hand over the logits: verl's actor) ----------------------------------------------
@pytest.mark.parametrize("chunk", [1, 3, 1024])
def test_logprobs_at_ids_equals_log_softmax_gather_values_and_gradients(chunk):
    """Against ``log_softmax(...).gather`` in float64, with duplicate ids (the sampled token inside the head)."""
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(7, V, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    ids = torch.randint(0, V, (7, K + 1), generator=g)
    ids[0, 2] = ids[0, 0]
    weights = torch.randn(7, K + 1, generator=g, dtype=torch.float64)
    out = logprobs_at_ids(logits, ids, token_chunk_size=chunk)
    reference = logits.log_softmax(-1).gather(1, ids)
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad((out * weights).sum(), logits)
    (expected,) = torch.autograd.grad((reference * weights).sum(), logits)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda z: logprobs_at_ids(z, ids, token_chunk_size=chunk), (logits,))


@pytest.mark.parametrize("chunk", [1, 3, 1024])
def test_logprobs_at_ids_inplace_backward_gives_the_same_values_and_gradients(chunk):
    """``inplace_backward`` writes the gradient into the logits it was handed (a non-leaf, like verl's scaled
    logits): the same values and leaf gradient as the float64 reference, the gradient in the logits' storage."""
    g = torch.Generator().manual_seed(4)
    leaf = (torch.randn(7, V, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    ids = torch.randint(0, V, (7, K + 1), generator=g)
    ids[1, 3] = ids[1, 0]
    weights = torch.randn(7, K + 1, generator=g, dtype=torch.float64)
    reference = leaf.log_softmax(-1).gather(1, ids)
    (expected,) = torch.autograd.grad((reference * weights).sum(), leaf)
    logits = leaf / 1.0  # the host's own tensor (verl divides by the temperature)
    out = logprobs_at_ids(logits, ids, token_chunk_size=chunk, inplace_backward=True)
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-12)
    grads = []
    logits.register_hook(lambda grad: grads.append(grad))
    (grad,) = torch.autograd.grad((out * weights).sum(), leaf)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)
    assert grads[0].data_ptr() == logits.data_ptr()  # written in place


def test_logprobs_at_ids_hand_computed_and_low_precision():
    """Two tokens, three ids: log p = z - logsumexp(z); bfloat16 logits give float32 values and a bf16 gradient."""
    logits = torch.tensor([[0.0, math.log(3.0)], [1.0, 1.0]], requires_grad=True)
    out = logprobs_at_ids(logits, torch.tensor([[1, 0], [0, 1]]))
    torch.testing.assert_close(out, torch.tensor([[math.log(0.75), math.log(0.25)], [math.log(0.5)] * 2]))
    out[0, 0].backward()  # d log p_1 / dz = onehot(1) - p = [0 - 0.25, 1 - 0.75]
    torch.testing.assert_close(logits.grad, torch.tensor([[-0.25, 0.25], [0.0, 0.0]]))
    low = torch.randn(5, 11).bfloat16().requires_grad_(True)
    ids = torch.randint(0, 11, (5, 3))
    out = logprobs_at_ids(low, ids)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, low.float().log_softmax(-1).gather(1, ids))
    out.sum().backward()
    assert low.grad.dtype == torch.bfloat16


def test_logprobs_at_ids_saves_no_probability_tensor_and_checks_ids():
    """Besides the logits it was handed, the forward keeps only the [N, C] ids."""
    logits = torch.randn(512, 300, requires_grad=True)
    ids = torch.randint(0, 300, (512, 4))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x) or x, lambda x: x):
        logprobs_at_ids(logits, ids, token_chunk_size=64)
    assert [x.data_ptr() == logits.data_ptr() for x in saved if x.numel() >= logits.numel()] == [True]
    assert sum(x.numel() for x in saved if x.data_ptr() != logits.data_ptr()) <= ids.numel()
    with pytest.raises(ValueError, match="vocabulary"):
        logprobs_at_ids(logits, ids + 300)
    with pytest.raises(ValueError, match=r"logits \[N, V\] and ids \[N, C\]"):
        logprobs_at_ids(logits, ids[:3])


class _MatmulDtypes(TorchDispatchMode):
    """Records the operand dtypes of every matmul run under it."""

    def __init__(self):
        super().__init__()
        self.dtypes = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_):
            self.dtypes |= {a.dtype for a in args if isinstance(a, torch.Tensor)}
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_backward_multiplies_in_the_projections_dtype(dtype):
    """The backward's matmuls run in the projection's dtype (bf16 tensor cores on a GPU, docs/benchmarks.md
    "On a GPU"), never in an fp32 copy of bf16 operands; fp32 stays fp32."""
    hidden, weight, bias, ids, sampled = make_inputs(dtype=dtype)
    out = policy_logprobs_at_sampler_topk(
        hidden, weight, bias, sampled_ids=sampled, sampler_topk_ids=ids, vocab_chunk_size=32
    )
    with _MatmulDtypes() as matmuls:
        (out.sampled.sum() + out.topk.sum()).backward()
    assert matmuls.dtypes == {dtype}


def test_bf16_gradient_is_as_precise_as_the_hosts_materialized_bf16_head():
    """The tiled backward rounds each tile's logit gradient to bf16 before its matmuls, as autograd through
    materialized logits does (the host's own bf16 head, here under autocast with fp32 leaves, a bias and
    soft-capping): against the float64 gradient from the same bf16-rounded inputs, its relative error stays
    within twice the host's, with small tiles split both ways."""
    g = torch.Generator().manual_seed(0)
    n, h, vocab, k = 96, 64, 1000, 8
    hidden = torch.randn(n, h, generator=g).bfloat16().float().requires_grad_(True)
    weight = (0.1 * torch.randn(vocab, h, generator=g)).bfloat16().float().requires_grad_(True)
    bias = (0.1 * torch.randn(vocab, generator=g)).bfloat16().float().requires_grad_(True)
    ids, sampled = torch.randint(0, vocab, (n, k), generator=g), torch.randint(0, vocab, (n,), generator=g)
    w = torch.randn(n, k + 1, generator=g, dtype=torch.float64)

    def gradients(sampled_logprobs, topk_logprobs):
        loss = (sampled_logprobs.double() * w[:, 0]).sum() + (topk_logprobs.double() * w[:, 1:]).sum()
        return torch.autograd.grad(loss, [hidden, weight, bias])

    def at_ids(logprobs):
        return gradients(logprobs.gather(1, sampled[:, None]).squeeze(1), logprobs.gather(1, ids))

    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = policy_logprobs_at_sampler_topk(
            hidden, weight, bias, sampled_ids=sampled, sampler_topk_ids=ids, final_logit_softcapping=3.0,
            token_chunk_size=8, vocab_chunk_size=128,
        )  # fmt: skip
        logits = torch.nn.functional.linear(hidden, weight, bias)
    assert logits.dtype == torch.bfloat16
    host = (3.0 * torch.tanh(logits.float() / 3.0)).log_softmax(-1)
    exact = (3.0 * torch.tanh((hidden.double() @ weight.double().t() + bias.double()) / 3.0)).log_softmax(-1)
    for ours, hosts, want in zip(gradients(out.sampled, out.topk), at_ids(host), at_ids(exact), strict=True):
        assert ours.dtype == torch.float32
        assert (ours.double() - want).norm() <= 2 * (hosts.double() - want).norm()
