"""Trainer-side logprobs at the sampler's top-k ids, from hidden states and the output projection.

docs/reference/score-centering.md §5.4: the logprobs at the K sampler ids come from the same pass as the sampled token's
logprob, normalized over the full vocabulary (or over the sampler's kept set under replay), with exact
gradients, and without a ``tokens x vocabulary`` tensor.

* Full vocabulary (default): one custom autograd function projects ``[tokens, vocab]`` tiles (chunked over
  tokens and vocabulary), folds each into an online logsumexp and gathers the sampled and head logits from
  the tile they fall in. The backward recomputes each tile and turns it into the logit gradient
  ``sum_c g_c [j = id_c] - (sum_c g_c) p_j`` (plus the entropy term when asked) in fp32, then, as the
  materialized path's autograd does, casts it to the projection's dtype for the two matmuls (bf16 tensor
  cores on a GPU; fp32 matmuls made the head 2.5x slower there, docs/benchmarks.md "On a GPU") and adds each
  tile's product into fp32 accumulators.
  Cost: the matmuls of a sampled-token-only chunked head (TRL's fused head), plus ``[tokens, K]`` gathers.
* Sampler replay (``score-centering.md``, "Sampling filters"): p is renormalized over the head slots the
  sampler kept (finite sampler logprob). Only the K head rows of the weight are gathered and a logsumexp over
  the kept ones is taken; no vocabulary pass at all.

Logits go through the same transforms as TRL's fused head: ``* logit_scale``, then
``softcap * tanh(z / softcap)`` when ``final_logit_softcapping`` is set, then ``/ temperature``.

* From logits (:func:`logprobs_at_ids`): for hosts whose forward hands over the ``[tokens, vocab]`` logits
  (verl's actor), the log-softmax at the sampled and head ids without a probability tensor in the forward.

Integration contract: call inside the model forward with the output-projection weight already gathered
(DeepSpeed ZeRO-3), passing ``gather_weight`` (e.g. TRL's ``maybe_gather_lm_head_ctx``) so the backward,
which recomputes tiles, can gather it again. ``[B, T, K]`` ids travel with the batch; any leading shape works.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import NamedTuple

import torch

DEFAULT_TOKEN_CHUNK_SIZE = 1024
DEFAULT_VOCAB_CHUNK_SIZE = 32768
# Replay gathers [tokens, K + 1, hidden] weight rows per chunk; this bounds that workspace.
REPLAY_GATHER_BYTES = 64 * 2**20

GatherWeight = Callable[..., AbstractContextManager]


class PolicyTopkLogprobs(NamedTuple):
    """Outputs of :func:`policy_logprobs_at_sampler_topk`: float32 (float64 for float64 inputs), differentiable."""

    sampled: torch.Tensor
    """``[...]`` logprob of the sampled token."""
    topk: torch.Tensor
    """``[..., K]`` logprobs at the sampler's head ids (``-inf`` at slots the sampler filtered out, replay)."""
    entropy: torch.Tensor | None
    """``[...]`` entropy of the normalized distribution when ``with_entropy``, else None."""


@dataclass(frozen=True)
class _Transform:
    """``z = softcap(raw * logit_scale) / temperature``, applied in place on fp32 tiles."""

    logit_scale: float
    softcap: float | None
    inv_temperature: float

    def apply_(self, z: torch.Tensor) -> torch.Tensor:
        if self.logit_scale != 1.0:
            z.mul_(self.logit_scale)
        if self.softcap is not None:
            z.div_(self.softcap).tanh_().mul_(self.softcap)
        if self.inv_temperature != 1.0:
            z.mul_(self.inv_temperature)
        return z

    def derivative(self, z: torch.Tensor) -> torch.Tensor | None:
        """d z / d raw minus the constant factor (1 - tanh^2 under softcapping), from the transformed z."""
        if self.softcap is None:
            return None
        tanh = z / (self.softcap * self.inv_temperature)
        return tanh.square_().neg_().add_(1.0)

    def backward_(self, grad: torch.Tensor, derivative: torch.Tensor | None) -> torch.Tensor:
        """Turn the gradient with respect to z into the gradient with respect to the raw logits, in place."""
        if derivative is not None:
            grad.mul_(derivative)
        factor = self.logit_scale * self.inv_temperature
        return grad.mul_(factor) if factor != 1.0 else grad


@dataclass(frozen=True)
class _Tiling:
    transform: _Transform
    token_chunk_size: int
    vocab_chunk_size: int
    compute_dtype: torch.dtype

    @property
    def accumulate_dtype(self) -> torch.dtype:
        """Logit tiles, statistics and gradients: fp32 at least, whatever the projection's dtype."""
        return torch.promote_types(self.compute_dtype, torch.float32)

    def tiles(
        self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> Iterator[tuple[slice, slice, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield (tokens, vocab, hidden chunk, weight tile, transformed fp32 logits tile).

        The logits tile is one reused buffer: consume it before asking for the next tile.
        """
        n_max = min(hidden.shape[0], self.token_chunk_size)
        v_max = min(weight.shape[0], self.vocab_chunk_size)
        logits = torch.empty((n_max, v_max), device=hidden.device, dtype=self.accumulate_dtype)
        projected = (
            logits
            if self.compute_dtype == self.accumulate_dtype
            else torch.empty((n_max, v_max), device=hidden.device, dtype=self.compute_dtype)
        )
        for t0 in range(0, hidden.shape[0], self.token_chunk_size):
            tokens = slice(t0, min(t0 + self.token_chunk_size, hidden.shape[0]))
            h = hidden[tokens].to(self.compute_dtype)
            for v0 in range(0, weight.shape[0], self.vocab_chunk_size):
                vocab = slice(v0, min(v0 + self.vocab_chunk_size, weight.shape[0]))
                w = weight[vocab].to(self.compute_dtype)
                n, v = h.shape[0], w.shape[0]
                tile = projected[:n, :v]
                torch.mm(h, w.t(), out=tile)
                if bias is not None:
                    tile.add_(bias[vocab].to(self.compute_dtype))
                z = logits[:n, :v]
                if z.data_ptr() != tile.data_ptr():
                    z.copy_(tile)
                yield tokens, vocab, h, w, self.transform.apply_(z)


def _local_columns(ids: torch.Tensor, vocab: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns of ``ids`` inside the vocabulary tile, clamped for gather/scatter, and the in-tile mask."""
    local = ids - vocab.start
    inside = (local >= 0) & (local < vocab.stop - vocab.start)
    return local.clamp(0, vocab.stop - vocab.start - 1), inside


def _add_product(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``out += a @ b``: one fused ``addmm_`` when the matmul runs in the accumulator's dtype (fp32 and fp64
    inputs: the same operations as a plain fp32 backward), else the low-precision product added."""
    if a.dtype == out.dtype:
        out.addmm_(a, b)
    else:
        out.add_(a @ b)


class _FullVocabularyLogprobs(torch.autograd.Function):
    """log p at ``ids [N, C]`` normalized over the whole vocabulary, and the entropy; tiled both ways."""

    @staticmethod
    def forward(
        ctx, hidden, weight, bias, ids, with_entropy: bool, tiling: _Tiling, gather_weight: GatherWeight
    ):
        ctx.set_materialize_grads(False)
        n_tokens = hidden.shape[0]
        acc = {"device": hidden.device, "dtype": tiling.accumulate_dtype}
        running_max = torch.full((n_tokens,), -math.inf, **acc)
        sum_exp = torch.zeros((n_tokens,), **acc)
        sum_exp_z = torch.zeros((n_tokens,), **acc)
        target = torch.full(ids.shape, math.nan, **acc)
        for tokens, vocab, _, _, z in tiling.tiles(hidden, weight, bias):
            local, inside = _local_columns(ids[tokens], vocab)
            target[tokens] = torch.where(inside, z.gather(1, local), target[tokens])
            new_max = torch.maximum(running_max[tokens], z.amax(1))
            exp = (z - new_max.unsqueeze(1)).exp_()
            rescale = (running_max[tokens] - new_max).exp_()
            sum_exp[tokens] = sum_exp[tokens] * rescale + exp.sum(1)
            if with_entropy:
                sum_exp_z[tokens] = sum_exp_z[tokens] * rescale + torch.bmm(
                    exp.unsqueeze(1), z.unsqueeze(2)
                ).view(-1)
            running_max[tokens] = new_max
        log_normalizer = running_max + sum_exp.log()
        logprobs = target - log_normalizer.unsqueeze(1)
        entropy = log_normalizer - sum_exp_z / sum_exp if with_entropy else None
        ctx.save_for_backward(hidden, weight, bias, ids, log_normalizer, entropy)
        ctx.tiling, ctx.gather_weight = tiling, gather_weight
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        if grad_logprobs is None and grad_entropy is None:
            return (None,) * 7
        hidden, weight, bias, ids, log_normalizer, entropy = ctx.saved_tensors
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        acc = {"device": hidden.device, "dtype": ctx.tiling.accumulate_dtype}
        grad_hidden = torch.zeros(hidden.shape, **acc) if needs_hidden else None
        acc_dtype = ctx.tiling.accumulate_dtype
        grad_total = grad_logprobs.to(acc_dtype).sum(1) if grad_logprobs is not None else None
        with ctx.gather_weight(
            weight, bias
        ):  # ZeRO-3: the projection's true shape exists only while gathered
            grad_weight = torch.zeros(weight.shape, **acc) if needs_weight else None
            grad_bias = torch.zeros(bias.shape, **acc) if needs_bias else None
            for tokens, vocab, h, w, z in ctx.tiling.tiles(hidden, weight, bias):
                derivative = ctx.tiling.transform.derivative(z)
                grad = z.sub_(log_normalizer[tokens].unsqueeze(1))  # log p, overwritten into the gradient
                if grad_entropy is None:
                    grad.exp_().mul_(-grad_total[tokens].unsqueeze(1))
                else:
                    # d entropy / dz_j = -p_j (log p_j + entropy); d log p_c / dz_j = [j = c] - p_j
                    p = grad.exp()
                    grad.add_(entropy[tokens].unsqueeze(1)).mul_(
                        grad_entropy[tokens].to(acc_dtype).unsqueeze(1)
                    )
                    if grad_total is not None:
                        grad.add_(grad_total[tokens].unsqueeze(1))
                    grad.mul_(p).neg_()
                if grad_logprobs is not None:
                    local, inside = _local_columns(ids[tokens], vocab)
                    grad.scatter_add_(1, local, torch.where(inside, grad_logprobs[tokens].to(acc_dtype), 0.0))
                grad = ctx.tiling.transform.backward_(grad, derivative)
                if grad_bias is not None:
                    grad_bias[vocab].add_(grad.sum(0))
                grad = grad.to(ctx.tiling.compute_dtype)  # the projection's matmuls in its own dtype
                if grad_hidden is not None:
                    _add_product(grad_hidden[tokens], grad, w)
                if grad_weight is not None:
                    _add_product(grad_weight[vocab], grad.t(), h)
        return (
            None if grad_hidden is None else grad_hidden.to(hidden.dtype),
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
            None,
            None,
            None,
            None,
        )


class _KeptSetLogprobs(torch.autograd.Function):
    """log p at ``ids [N, C]`` normalized over the columns flagged in ``kept [N, C]`` (sampler replay).

    Only the ``C`` weight rows of each token are gathered. Columns outside the kept set get their logit minus
    the normalizer (the sampled-token column) or ``-inf`` when ``finite_output`` is false for them.
    """

    @staticmethod
    def _logits(hidden, weight, bias, ids, tiling: _Tiling):
        rows = weight[ids].to(tiling.compute_dtype)  # [n, C, H]
        z = (
            torch.bmm(rows, hidden.to(tiling.compute_dtype).unsqueeze(2))
            .squeeze(2)
            .to(tiling.accumulate_dtype)
        )
        if bias is not None:
            z = z + bias[ids].to(tiling.accumulate_dtype)
        return rows, tiling.transform.apply_(z)

    @staticmethod
    def forward(ctx, hidden, weight, bias, ids, kept, finite_output, tiling: _Tiling, gather_weight):
        chunk = max(1, REPLAY_GATHER_BYTES // max(1, ids.shape[1] * hidden.shape[1] * 4))
        normalizers = []
        logits = []
        for t0 in range(0, hidden.shape[0], chunk):
            tokens = slice(t0, t0 + chunk)
            _, z = _KeptSetLogprobs._logits(hidden[tokens], weight, bias, ids[tokens], tiling)
            normalizer = torch.where(kept[tokens], z, -math.inf).logsumexp(1)
            normalizers.append(torch.where(torch.isfinite(normalizer), normalizer, 0.0))
            logits.append(z)
        log_normalizer = torch.cat(normalizers)
        logprobs = torch.where(finite_output, torch.cat(logits) - log_normalizer.unsqueeze(1), -math.inf)
        ctx.save_for_backward(hidden, weight, bias, ids, kept, finite_output, log_normalizer)
        ctx.tiling, ctx.gather_weight, ctx.chunk = tiling, gather_weight, chunk
        return logprobs

    @staticmethod
    def backward(ctx, grad_logprobs):
        hidden, weight, bias, ids, kept, finite_output, log_normalizer = ctx.saved_tensors
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        acc = {"device": hidden.device, "dtype": ctx.tiling.accumulate_dtype}
        grad_hidden = torch.zeros(hidden.shape, **acc) if needs_hidden else None
        acc_dtype = ctx.tiling.accumulate_dtype
        grad_out = torch.where(finite_output, grad_logprobs.to(acc_dtype), 0.0)
        with ctx.gather_weight(weight, bias):
            grad_weight = torch.zeros(weight.shape, **acc) if needs_weight else None
            grad_bias = torch.zeros(bias.shape, **acc) if needs_bias else None
            for t0 in range(0, hidden.shape[0], ctx.chunk):
                tokens = slice(t0, t0 + ctx.chunk)
                rows, z = _KeptSetLogprobs._logits(hidden[tokens], weight, bias, ids[tokens], ctx.tiling)
                derivative = ctx.tiling.transform.derivative(z)
                softmax = torch.where(kept[tokens], z - log_normalizer[tokens].unsqueeze(1), -math.inf).exp()
                g = grad_out[tokens]
                grad = ctx.tiling.transform.backward_(g - g.sum(1, keepdim=True) * softmax, derivative)
                flat_ids = ids[tokens].reshape(-1)
                if grad_hidden is not None:
                    grad_hidden[tokens] = torch.bmm(grad.unsqueeze(1), rows.to(acc_dtype)).squeeze(1)
                if grad_weight is not None:
                    outer = grad.unsqueeze(2) * hidden[tokens].to(acc_dtype).unsqueeze(1)  # [n, C, H]
                    grad_weight.index_add_(0, flat_ids, outer.reshape(-1, hidden.shape[1]))
                if grad_bias is not None:
                    grad_bias.index_add_(0, flat_ids, grad.reshape(-1))
        return (
            None if grad_hidden is None else grad_hidden.to(hidden.dtype),
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
            None,
            None,
            None,
            None,
            None,
        )


def policy_logprobs_at_sampler_topk(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    sampled_ids: torch.Tensor,
    sampler_topk_ids: torch.Tensor,
    sampler_topk_logprobs: torch.Tensor | None = None,
    sampler_replay: bool = False,
    temperature: float = 1.0,
    logit_scale: float = 1.0,
    final_logit_softcapping: float | None = None,
    with_entropy: bool = False,
    token_chunk_size: int = DEFAULT_TOKEN_CHUNK_SIZE,
    vocab_chunk_size: int = DEFAULT_VOCAB_CHUNK_SIZE,
    gather_weight: GatherWeight | None = None,
) -> PolicyTopkLogprobs:
    """Trainer logprobs of the sampled token and at the sampler's K head ids, in one pass (docs/reference/score-centering.md §5.4).

    Args:
        hidden_states: ``[..., H]`` final hidden states at the positions that predict each token.
        weight: ``[V, H]`` output projection (gathered by the caller under ZeRO-3); ``bias``: ``[V]`` or None.
        sampled_ids: ``[...]`` the sampled (next) token ids.
        sampler_topk_ids: ``[..., K]`` the sampler's head ids (any K >= 0).
        sampler_topk_logprobs: ``[..., K]`` the sampler's head logprobs; required under ``sampler_replay``,
            where the finite ones mark the kept set.
        sampler_replay: normalize over the kept head slots instead of the full vocabulary; slots outside the
            kept set get ``-inf``. Positions with no kept slot give meaningless values: mask them.
        temperature, logit_scale, final_logit_softcapping: the logit transforms of the sampled-token path.
        with_entropy: also return the entropy (full vocabulary, or the kept set under replay).
        token_chunk_size, vocab_chunk_size: tile shape of the full-vocabulary pass.
        gather_weight: ``gather_weight(weight, bias)`` context re-entered by the backward (ZeRO-3).

    Returns:
        ``PolicyTopkLogprobs(sampled, topk, entropy)`` in float32 (float64 for float64 inputs).
    """
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be positive and finite, got {temperature}")
    leading = tuple(sampled_ids.shape)
    if tuple(hidden_states.shape[:-1]) != leading or tuple(sampler_topk_ids.shape[:-1]) != leading:
        raise ValueError(
            f"hidden_states {tuple(hidden_states.shape)}, sampled_ids {leading} and sampler_topk_ids "
            f"{tuple(sampler_topk_ids.shape)} must share their leading dims"
        )
    num_candidates = sampler_topk_ids.shape[-1]
    ids = torch.cat([sampled_ids.unsqueeze(-1), sampler_topk_ids], -1).reshape(-1, num_candidates + 1).long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= weight.shape[0]):
        raise ValueError(f"token ids must lie in [0, {weight.shape[0]}) (the projection's vocabulary)")
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1])
    device = hidden.device
    tiling = _Tiling(
        transform=_Transform(float(logit_scale), final_logit_softcapping, 1.0 / float(temperature)),
        token_chunk_size=token_chunk_size,
        vocab_chunk_size=vocab_chunk_size,
        compute_dtype=torch.get_autocast_dtype(device.type)
        if torch.is_autocast_enabled(device.type)
        else hidden.dtype,
    )
    gather = gather_weight or (lambda *_: nullcontext())
    if sampler_replay:
        if sampler_topk_logprobs is None or sampler_topk_logprobs.shape != sampler_topk_ids.shape:
            raise ValueError("sampler_replay needs sampler_topk_logprobs shaped like sampler_topk_ids")
        head_kept = torch.isfinite(sampler_topk_logprobs).reshape(-1, num_candidates).to(device)
        no_column = torch.zeros_like(head_kept[:, :1])
        kept = torch.cat([no_column, head_kept], 1)
        finite_output = torch.cat([~no_column, head_kept], 1)
        logprobs = _KeptSetLogprobs.apply(hidden, weight, bias, ids, kept, finite_output, tiling, gather)
        topk = logprobs[:, 1:]
        entropy = -torch.where(head_kept, topk.exp() * topk, 0.0).sum(1) if with_entropy else None
    else:
        logprobs, entropy = _FullVocabularyLogprobs.apply(
            hidden, weight, bias, ids, with_entropy, tiling, gather
        )
        topk = logprobs[:, 1:]
    return PolicyTopkLogprobs(
        sampled=logprobs[:, 0].reshape(leading),
        topk=topk.reshape(*leading, num_candidates),
        entropy=entropy.reshape(leading) if with_entropy else None,
    )


class _LogprobsAtIdsFromLogits(torch.autograd.Function):
    """log_softmax(logits) at ``ids [N, C]``, chunked over tokens; saves the logits by reference and the ids,
    never a probability tensor (the backward recomputes the softmax chunk by chunk). Each chunk is one fused
    ``log_softmax``/``softmax`` in fp32 at least, read straight from the logits' dtype. With ``inplace`` the
    backward writes the logit gradient into the saved logits."""

    @staticmethod
    def forward(ctx, logits, ids, chunk_size: int, inplace: bool):
        ctx.set_materialize_grads(False)
        acc = torch.promote_types(logits.dtype, torch.float32)
        logprobs = torch.empty(ids.shape, device=logits.device, dtype=acc)
        for t0 in range(0, logits.shape[0], chunk_size):
            rows = slice(t0, t0 + chunk_size)
            logprobs[rows] = torch.log_softmax(logits[rows], -1, dtype=acc).gather(1, ids[rows])
        ctx.save_for_backward(logits, ids)
        ctx.chunk_size, ctx.inplace = chunk_size, inplace
        return logprobs

    @staticmethod
    def backward(ctx, grad_logprobs):
        if grad_logprobs is None:
            return None, None, None, None
        logits, ids = ctx.saved_tensors
        acc = torch.promote_types(logits.dtype, torch.float32)
        grad_logits = logits if ctx.inplace else torch.empty_like(logits)  # rows are read before written
        for t0 in range(0, logits.shape[0], ctx.chunk_size):
            rows = slice(t0, t0 + ctx.chunk_size)
            g = grad_logprobs[rows].to(acc)
            # d log p_c / dz_j = [j = c] - p_j
            grad = torch.softmax(logits[rows], -1, dtype=g.dtype)
            grad.mul_(-g.sum(1, keepdim=True)).scatter_add_(1, ids[rows], g)
            grad_logits[rows] = grad.to(logits.dtype)
        return grad_logits, None, None, None


def logprobs_at_ids(
    logits: torch.Tensor,
    ids: torch.Tensor,
    *,
    token_chunk_size: int = DEFAULT_TOKEN_CHUNK_SIZE,
    inplace_backward: bool = False,
) -> torch.Tensor:
    """``log_softmax(logits)`` gathered at ``ids`` for hosts that hand over the logits themselves
    (docs/reference/score-centering.md §5.4): ``logits [N, V]`` (already divided by the temperature),
    ``ids [N, C]`` (the sampled token and the K head ids, any C); returns ``[N, C]`` in float32 (float64 for
    float64 logits), differentiable into the logits.

    The forward keeps nothing besides the logits it was given and the ids; the backward writes
    the one ``[N, V]`` logit gradient any log-softmax backward needs, recomputing probabilities per chunk of
    ``token_chunk_size`` rows. ``inplace_backward`` writes that gradient into ``logits`` themselves (no
    ``[N, V]`` buffer), for a host whose logits nothing else uses in its backward (verl's rule for its own
    log-softmax: no entropy from the same logits); ``logits`` then must not be a leaf the caller reads after.
    """
    if logits.dim() != 2 or ids.dim() != 2 or ids.shape[0] != logits.shape[0]:
        raise ValueError(
            f"logits [N, V] and ids [N, C] expected, got {tuple(logits.shape)} and {tuple(ids.shape)}"
        )
    ids = ids.long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= logits.shape[1]):
        raise ValueError(f"token ids must lie in [0, {logits.shape[1]}) (the logits' vocabulary)")
    return _LogprobsAtIdsFromLogits.apply(logits, ids, token_chunk_size, inplace_backward)
