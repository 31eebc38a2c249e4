"""A third host, written against the host contract alone (docs/write-a-host.md): a plain PyTorch GRPO loop
with length shaping, LUSPO's loss and the score-centering term, importing only the core and transformers'
model. The sampler is the model's own ``generate``; its top-K ids and logprobs stand in for vLLM's."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trl_length_plugin.losses.luspo import luspo_loss
from trl_length_plugin.score_centering.estimator import compute_score_centering_term
from trl_length_plugin.score_centering.topk_logprobs import policy_logprobs_at_sampler_topk
from trl_length_plugin.shaping import RolloutBatch, group_advantages, shape_rollouts
from trl_length_plugin.shaping.config import load_shaping_config
from trl_length_plugin.shaping.normalization import GroupNormalization

NORMALIZATION = GroupNormalization(scale_by_std=True, std_eps=1e-4)


@dataclass
class Rollouts:
    """One step's sampled groups: completion ids, mask, the sampler's logprobs and top-K head."""

    inputs: torch.Tensor  # prompt + completion ids, (B, P + T)
    mask: torch.Tensor  # completion tokens before and at EOS, (B, T)
    sampler_logprobs: torch.Tensor  # sampled tokens, (B, T)
    head_ids: torch.Tensor  # (B, T, K)
    head_logprobs: torch.Tensor  # (B, T, K)
    texts: list[str] = field(default_factory=list)


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], group: int, max_new_tokens: int, top_k: int) -> Rollouts:
    """``group`` completions per prompt, with the sampler's logprobs and its top-K head at each position."""
    encoded = tokenizer([p for p in prompts for _ in range(group)], return_tensors="pt", padding=True)
    out = model.generate(
        **encoded, do_sample=True, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
        return_dict_in_generate=True, output_scores=True, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    completion = out.sequences[:, encoded["input_ids"].shape[1] :]
    logprobs = torch.stack(out.scores, 1).log_softmax(-1)  # the sampler's distribution, (B, T, V)
    ended = (completion == tokenizer.eos_token_id).cumsum(-1)
    mask = (ended == 0) | ((ended == 1) & (completion == tokenizer.eos_token_id))
    head_logprobs, head_ids = logprobs.topk(top_k, -1)
    return Rollouts(
        torch.cat([encoded["input_ids"], completion], 1),
        mask,
        logprobs.gather(-1, completion.unsqueeze(-1)).squeeze(-1),
        head_ids,
        head_logprobs,
        tokenizer.batch_decode(completion, skip_special_tokens=True),
    )


def policy_logprobs(model, rollouts: Rollouts) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's logprobs of the sampled tokens and at the sampler's head ids, from the final hidden states
    and the output weights in tiles: no (B, T, V) logits tensor is built."""
    steps = rollouts.mask.shape[1]
    hidden = model.model(rollouts.inputs).last_hidden_state[:, -steps - 1 : -1]
    head = policy_logprobs_at_sampler_topk(
        hidden,
        model.lm_head.weight,
        sampled_ids=rollouts.inputs[:, -steps:],
        sampler_topk_ids=rollouts.head_ids,
    )
    return head.sampled, head.topk


class PlainHost:
    """The loop's plugin side: configs checked before the model is used, then one call per step."""

    def __init__(
        self, shaping: dict, is_bounds: tuple[float, float], clip: tuple[float, float] = (2e-3, 2.5e-3)
    ):
        self.shaping = load_shaping_config(shaping)  # a bad key fails here, in one line naming it
        self.is_bounds, self.clip = is_bounds, clip

    def advantages(self, rewards: list[float], lengths: torch.Tensor, group: int, step: int):
        """Shaped rewards and advantages of the step's groups, and the core's metrics."""
        index = torch.arange(len(rewards)) // group
        batch = RolloutBatch(rewards=rewards, group_index=index, answer_lengths=lengths, loss_lengths=lengths)
        result = shape_rollouts(batch, self.shaping, NORMALIZATION, step=step)
        advantages = result.advantages
        if advantages is None:  # the coefficient off: this host normalizes the shaped rewards itself
            advantages = group_advantages(result.totals, result.raw, index, **vars(NORMALIZATION))
        return result, advantages.float()

    def loss(self, model, rollouts: Rollouts, advantages: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """LUSPO's loss plus the score-centering term ``A * C`` over the completion tokens."""
        sampled, at_head = policy_logprobs(model, rollouts)
        base, metrics = luspo_loss(sampled, rollouts.sampler_logprobs, advantages, rollouts.mask, *self.clip)
        term = compute_score_centering_term(
            at_head, sampler_topk_logprobs=rollouts.head_logprobs, importance_sampling_mode="tis",
            is_bounds=self.is_bounds, token_mask=rollouts.mask, sampler_replay=False,
        )  # fmt: skip
        centering = (advantages[:, None] * term.correction).sum() / rollouts.mask.sum()
        head_mass = term.sampler_head_mass[rollouts.mask]
        return base + centering, {**metrics, "head_mass": head_mass, "correction": term.correction.detach()}
