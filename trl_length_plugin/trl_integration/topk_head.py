"""The trainer's logprobs at the sampler's K ids, from the same forward as the sampled-token logprobs
(docs/reference/score-centering.md §5.4).

TRL 1.16 replaces the policy's ``forward`` by a fused LM head (``trl.trainer.utils.add_fused_lm_head``) that
returns only the sampled token's logprob and the entropy. :func:`install_topk_head` wraps that forward:
while a :class:`HeadRequest` is armed, one backbone pass and one ``policy_logprobs_at_sampler_topk`` call
over the completion positions give the sampled logprobs, the entropy and the K logprobs, with TRL's own
temperature, logit scale and soft-capping (read from its head) and no ``tokens x vocabulary`` tensor; under
ZeRO-3 the output projection is gathered for the forward and again by the backward. Unarmed, TRL's head
runs unchanged.
"""

from __future__ import annotations

import functools
import inspect
import types
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from trl_length_plugin.score_centering import policy_logprobs_at_sampler_topk

#: the names TRL's fused forward closes over that the top-k head reads
HEAD_SETTINGS = (
    "temperature",
    "final_logit_softcapping",
    "logit_scale",
    "cast_lm_head_to_fp32",
    "backbone_attr",
)


@dataclass
class HeadRequest:
    """The sampler heads ``ids``/``logprobs`` ``[B, T, K]`` of the rows the next forwards score (in row
    order, over any number of chunks); each forward appends its ``[b, T, K]`` trainer logprobs to ``topk``."""

    ids: torch.Tensor
    logprobs: torch.Tensor
    replay: bool
    cursor: int = 0
    topk: list[torch.Tensor] = field(default_factory=list)

    def collect(self) -> torch.Tensor:
        """The trainer logprobs of every scored row, ``[B, T, K]``; resets the request."""
        topk, self.topk, self.cursor = torch.cat(self.topk), [], 0
        return topk


def head_settings(forward) -> dict:
    """The settings TRL's fused head was built with (the names of ``HEAD_SETTINGS``)."""
    from trl_length_plugin.trl_integration._host import TRLHostError

    nonlocals = inspect.getclosurevars(getattr(forward, "__func__", forward)).nonlocals
    missing = [name for name in HEAD_SETTINGS if name not in nonlocals]
    if missing:
        raise TRLHostError(f"TRL's fused LM head (add_fused_lm_head) no longer closes over {missing}")
    return {name: nonlocals[name] for name in HEAD_SETTINGS}


def install_topk_head(target: torch.nn.Module, armed) -> None:
    """Wrap the fused forward TRL installed on ``target``; ``armed()`` returns the current request or None."""
    trl_forward = target.forward
    settings = head_settings(trl_forward)

    @functools.wraps(trl_forward)
    def forward(self, *args, fused_lm_head=False, labels=None, **kwargs):
        request = armed()
        if not fused_lm_head or request is None or kwargs.get("shift_labels") is not None:
            return trl_forward(*args, fused_lm_head=fused_lm_head, labels=labels, **kwargs)
        return _topk_forward(self, request, settings, args, labels, kwargs)

    target.forward = types.MethodType(forward, target)


def _topk_forward(model, request: HeadRequest, settings: dict, args, labels, kwargs):
    from trl.trainer.utils import FusedCausalLMOutput, maybe_gather_lm_head_ctx

    kwargs.pop("num_items_in_batch", None)
    kwargs["use_cache"] = False
    hidden = getattr(model, settings["backbone_attr"])(*args, **kwargs).last_hidden_state[:, :-1]
    labels = labels[:, 1:]
    rows = slice(request.cursor, request.cursor + labels.shape[0])
    request.cursor += labels.shape[0]
    ids, logprobs = request.ids[rows], request.logprobs[rows]
    width, k = ids.shape[1], ids.shape[2]
    valid = labels != -100
    if valid[:, :-width].any():
        raise RuntimeError(
            "score centering: TRL scored positions before the completion (the labels of the prompt are no longer "
            "-100); the top-k head was written for trl 1.16's _get_per_token_logps_and_entropies"
        )
    scored = valid[:, -width:]  # the completion positions
    head = model.get_output_embeddings()
    weight, bias = head.weight, head.bias
    hidden = hidden[:, -width:][scored].to(weight.device)
    context = nullcontext()
    if settings["cast_lm_head_to_fp32"]:
        hidden, context = hidden.float(), torch.autocast(hidden.device.type, enabled=False)
    with context, maybe_gather_lm_head_ctx(weight, bias):
        result = policy_logprobs_at_sampler_topk(
            hidden,
            weight,
            bias,
            sampled_ids=labels[:, -width:][scored].to(weight.device),
            sampler_topk_ids=ids[scored].to(weight.device).long(),
            sampler_topk_logprobs=logprobs[scored].to(weight.device),
            sampler_replay=request.replay,
            temperature=settings["temperature"],
            logit_scale=settings["logit_scale"],
            final_logit_softcapping=settings["final_logit_softcapping"],
            with_entropy=True,
            gather_weight=maybe_gather_lm_head_ctx,
        )
    log_probs = result.sampled.new_zeros(valid.shape).masked_scatter(valid, result.sampled)
    entropy = result.entropy.new_zeros(valid.shape).masked_scatter(valid, result.entropy)
    slots = scored.unsqueeze(-1).expand(-1, -1, k)
    request.topk.append(result.topk.new_zeros((*scored.shape, k)).masked_scatter(slots, result.topk))
    loss = -log_probs.sum() / valid.sum().clamp(min=1)
    return FusedCausalLMOutput(loss=loss, log_probs=log_probs, entropy=entropy, label_mask=valid)
