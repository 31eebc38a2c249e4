"""A third host, written against the host contract alone (docs/write-a-host.md): a plain PyTorch GRPO loop
with length shaping and either LUSPO's sequence loss or a token-level clipped loss with its own truncated
importance sampling and the score-centering term (score centering needs a per-token ratio, reference §5.5),
importing only the core's public names. The sampler is the model's own ``generate``; its top-K ids and logprobs
stand in for vLLM's. Score centering's plan is resolved from the loop's settings like TRL's and verl's: the
loss reads the mode and its bounds from it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trl_length_plugin.losses import luspo_loss
from trl_length_plugin.score_centering import (
    HostSettings,
    HostWeights,
    ScoreCenteringRun,
    check_is_bounds,
    load_score_centering_config,
    policy_logprobs_at_sampler_topk,
)
from trl_length_plugin.shaping import (
    GroupNormalization,
    RolloutBatch,
    ShapingRun,
    group_advantages,
    load_shaping_config,
)

NORMALIZATION = GroupNormalization(scale_by_std=True, std_eps=1e-4)
#: how the loop samples: temperature 1, no filter (``sample``)
SAMPLING = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


@dataclass
class Rollouts:
    """One step's sampled groups (B rows, T completion positions, the sampler's top K at each)."""

    inputs: torch.Tensor  # prompt + completion ids, (B, P + T)
    attention: torch.Tensor  # the prompts' left padding masked, (B, P + T)
    mask: torch.Tensor  # completion tokens up to and with the end of sequence, (B, T)
    sampler_logprobs: torch.Tensor  # sampled tokens, (B, T)
    head_ids: torch.Tensor  # (B, T, K)
    head_logprobs: torch.Tensor  # (B, T, K)
    texts: list[str]


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], group: int, max_new_tokens: int, top_k: int) -> Rollouts:
    """``group`` completions per prompt at temperature 1 with no filter, the sampler's logprobs and head."""
    encoded = tokenizer([p for p in prompts for _ in range(group)], return_tensors="pt", padding=True)
    out = model.generate(
        **encoded, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
        return_dict_in_generate=True, output_scores=True, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    completion = out.sequences[:, encoded["input_ids"].shape[1] :]
    logprobs = torch.stack(out.scores, 1).float().log_softmax(-1)  # what it sampled from, (B, T, V)
    stops = torch.tensor(model.generation_config.eos_token_id).reshape(-1)
    ended = torch.isin(completion, stops).cumsum(-1)
    mask = (ended == 0) | ((ended == 1) & torch.isin(completion, stops))
    head_logprobs, head_ids = logprobs.topk(top_k, -1)
    return Rollouts(
        torch.cat([encoded["input_ids"], completion], 1),
        torch.cat([encoded["attention_mask"], torch.ones_like(completion)], 1),
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
    positions = (rollouts.attention.cumsum(-1) - 1).clamp(min=0)
    hidden = model.model(rollouts.inputs, attention_mask=rollouts.attention, position_ids=positions)
    head = policy_logprobs_at_sampler_topk(
        hidden.last_hidden_state[:, -steps - 1 : -1], model.lm_head.weight,
        sampled_ids=rollouts.inputs[:, -steps:], sampler_topk_ids=rollouts.head_ids,
    )  # fmt: skip
    return head.sampled, head.topk


def host_settings(is_bounds: tuple[float, float], clip: tuple[float, float]) -> HostSettings:
    """The loop's settings in the plugin's terms, in its own keys: its sampled-token weights are truncated
    importance sampling in ``is_bounds`` (the plugin's ``tis``), its clip ``clip``, its sampler unfiltered."""
    return HostSettings(
        weights=HostWeights(
            derived="tis",
            carries_written=False,
            needs=lambda mode: "needs the plain loop's own truncated weights (is_bounds)",
            bounds=lambda mode: check_is_bounds(*is_bounds, "is_bounds[0]", "is_bounds[1]"),
            clip=(*clip, "clip[0]", "clip[1]"),
        ),
        clip={"clip[0]": clip[0], "clip[1]": clip[1]},
        clip_keys=("clip[0]", "clip[1]"),
        engine_cap=(None, "max_logprobs"),
        sampling=SAMPLING,
        sampling_keys={name: name for name in (*SAMPLING, "logprobs_mode")},
    )


class PlainHost:
    """The loop's plugin side: the configs checked and score centering's plan resolved before the model is
    used, then one call per step."""

    def __init__(self, shaping: dict, loss: str, is_bounds: tuple[float, float], clip=(0.2, 0.28), top_k=16):
        config = load_shaping_config(shaping)  # a bad key fails here, in one line naming it
        self.run = ShapingRun(config, NORMALIZATION)
        self.run.announce()
        self.clip = clip
        self.centering = None  # LUSPO's ratio is per sequence: no score centering (reference §5.5)
        if loss != "luspo":
            keys = load_score_centering_config({"score_centering": True, "score_centering_top_k": top_k})
            self.centering = ScoreCenteringRun.resolve(keys, host_settings(is_bounds, clip))
            self.centering.announce()

    def advantages(self, rewards: list[float], lengths: torch.Tensor, group: int, step: int):
        """The core's result for the step's groups, the advantages and the rows that stay in the loss."""
        index = torch.arange(len(rewards)) // group
        batch = RolloutBatch(rewards=rewards, group_index=index, answer_lengths=lengths, loss_lengths=lengths)
        result = self.run.shape(batch, step)
        self.run.log_step(result, step)
        advantages = result.advantages
        if advantages is None:  # the coefficient off: this host normalizes the totals itself
            advantages = group_advantages(result.totals, result.raw, index, **vars(NORMALIZATION))
        rows = torch.ones(len(rewards), dtype=torch.bool)
        for keep in (result.keep, result.loss_keep):  # the group filter, truncation: mask
            if keep is not None:
                rows &= keep
        return result, advantages.float(), rows

    def loss(
        self, model, rollouts: Rollouts, old: torch.Tensor, advantages: torch.Tensor, rows: torch.Tensor
    ):
        """LUSPO's loss; or the token-level clipped loss with the loop's truncated importance weights (the plan's
        mode and bounds) plus ``A * C``, both over the loss's tokens."""
        mask = rollouts.mask & rows[:, None]
        sampled, at_head = policy_logprobs(model, rollouts)
        if self.centering is None:
            return luspo_loss(sampled, old, advantages, mask, *self.clip)
        ratio, adv = (sampled - old).exp(), advantages[:, None]
        weights = self.centering.sampled_token_weights(old, rollouts.sampler_logprobs, mask, adv)
        clipped = ratio.clamp(1 - self.clip[0], 1 + self.clip[1])
        base = -(torch.minimum(ratio * adv, clipped * adv) * weights)[mask].sum()
        term = self.centering.outputs(at_head, sampler_topk_logprobs=rollouts.head_logprobs, token_mask=mask)
        loss = (base + (adv * term.correction).sum()) / mask.sum().clamp(min=1)
        head_mass = term.token_metrics["score_centering/head_mass"][mask]  # the sampler's, sum_H q (§5.6)
        return loss, {"head_mass": head_mass, "correction": term.correction.detach()}
