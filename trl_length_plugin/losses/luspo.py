"""LUSPO: GSPO's sequence-level clipped loss with each sequence's term multiplied by its length.

docs/reference/luspo.md §4.1. With s_i = exp(mean_t log(pi / pi_old)) over the valid tokens of sequence i,
l_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i) and |y_i| its loss-mask length:

    loss = (1 / N_seq) * sum_i |y_i| l_i

N_seq is the number of sequences in the global mini-batch, so summing this loss over micro-batches
(and averaging gradients over data-parallel ranks after scaling by their count) gives the same
gradient however the mini-batch is split. Unclipped, each token's gradient weight is s_i A_i / N_seq
(GSPO's is s_i A_i / (|y_i| N_seq)); a clipped sequence contributes no gradient.

Framework-free: torch only (docs/reference/product.md §1.2).
"""

from __future__ import annotations

import math

import torch

__all__ = ["luspo_loss"]


def luspo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    num_sequences: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """LUSPO loss of one (micro-)batch and its metrics (docs/reference/luspo.md §4.1).

    Args:
        log_prob: ``(B, T)`` log-probs of the sampled tokens under the current policy (with grad).
        old_log_prob: ``(B, T)`` log-probs under the behaviour policy.
        advantages: ``(B,)`` one advantage per sequence, or ``(B, T)`` per token.
        response_mask: ``(B, T)`` loss mask (bool or 0/1); its row sums are the lengths |y_i|.
        clip_ratio_low, clip_ratio_high: the clip range ``[1 - low, 1 + high]`` of s_i.
        num_sequences: N_seq, the sequence count this batch's share is normalized by: the global
            mini-batch count divided by the number of data-parallel ranks whose gradients are
            averaged. Default: the local batch size ``B``.
        token_weights: optional ``(B, T)`` per-token weights (e.g. rollout importance weights),
            multiplying each token's term as verl's GSPO does.

    Returns:
        The scalar loss and detached metrics: ``luspo/clip_frac_low`` and ``luspo/clip_frac_high``
        (fraction of sequences whose clipped branch is active below / above the range) and
        ``luspo/seq_ratio_mean`` (mean s_i), all over sequences with at least one valid token.
    """
    if num_sequences is None:
        num_sequences = log_prob.shape[0]
    if not (num_sequences > 0 and math.isfinite(num_sequences)):  # inf would zero the loss and its gradient
        raise ValueError(f"luspo_loss: num_sequences must be a finite number above 0, got {num_sequences}")
    valid = response_mask.bool()
    lengths = valid.sum(-1)
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages

    token_log_ratio = torch.where(valid, log_prob - old_log_prob, 0.0)
    seq_log_ratio = token_log_ratio.sum(-1) / lengths.clamp(min=1)
    # Every token carries the value s_i, with the gradient of its own log-prob only (GSPO-token form):
    # sum_t d/dtheta = s_i * sum_t grad log pi_t = |y_i| * grad s_i, so the sum over a sequence's tokens
    # is exactly |y_i| l_i, and per-token weights act on their own token as in verl's GSPO.
    ratio = torch.exp(
        torch.where(valid, log_prob - log_prob.detach(), 0.0) + seq_log_ratio.detach().unsqueeze(-1)
    )
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    per_token = torch.maximum(unclipped, clipped)
    if token_weights is not None:
        per_token = per_token * token_weights
    loss = torch.where(valid, per_token, 0.0).sum() / num_sequences

    with torch.no_grad():
        has_tokens = lengths > 0
        count = has_tokens.sum().clamp(min=1)
        seq_ratio = seq_log_ratio.exp().unsqueeze(-1)
        low = (seq_ratio < 1.0 - clip_ratio_low) & (adv < 0)
        high = (seq_ratio > 1.0 + clip_ratio_high) & (adv > 0)

        def sequence_fraction(flags: torch.Tensor) -> torch.Tensor:
            per_seq = (flags.expand_as(valid) & valid).sum(-1).to(log_prob.dtype) / lengths.clamp(min=1)
            return per_seq.sum() / count

        metrics = {
            "luspo/clip_frac_low": sequence_fraction(low),
            "luspo/clip_frac_high": sequence_fraction(high),
            "luspo/seq_ratio_mean": torch.where(has_tokens, seq_ratio.squeeze(-1), 0.0).sum() / count,
        }
    return loss, metrics
