"""verl's own DAPO reward manager on responses of given lengths (no Ray, no GPU): the numbers the overlong
parity tests compare against (bench/peer_arms.py's peer arm and the core's ``overlong`` term)."""

from __future__ import annotations


def dapo_manager_rewards(
    tokenizer, texts: list[str], lengths: list[int], max_len: int, buffer: int, factor: float
):
    """verl's ``DAPORewardManager`` with ``overlong_buffer_cfg`` (enabled, ``len`` = ``buffer``,
    ``penalty_factor`` = ``factor``) on a real ``DataProto``: row i's response is ``texts[i]``'s tokens padded
    to ``lengths[i]``, scored by the embedded task's correctness against "7". Returns the reward at each
    response's last token, as verl places it."""
    import numpy as np
    import torch
    from omegaconf import OmegaConf
    from verl.protocol import DataProto
    from verl.workers.reward_manager.dapo import DAPORewardManager

    from trl_length_plugin.embedded import score_completion

    prompt_len = 4
    responses = torch.full((len(lengths), max_len), tokenizer.pad_token_id)
    attention = torch.zeros((len(lengths), prompt_len + max_len), dtype=torch.long)
    attention[:, :prompt_len] = 1
    for row, (n, text) in enumerate(zip(lengths, texts, strict=True)):
        encoded = tokenizer.encode(text, add_special_tokens=False)
        responses[row, :n] = torch.tensor((encoded + [tokenizer.pad_token_id] * max_len)[:n])
        attention[row, prompt_len : prompt_len + n] = 1
    data = DataProto.from_dict(
        tensors={
            "prompts": torch.ones((len(lengths), prompt_len), dtype=torch.long),
            "responses": responses,
            "attention_mask": attention,
        },
        non_tensors={
            "reward_model": np.array([{"ground_truth": "7"}] * len(lengths), dtype=object),
            "data_source": np.array(["embedded"] * len(lengths), dtype=object),
        },
    )
    manager = DAPORewardManager(
        tokenizer,
        num_examine=0,
        compute_score=lambda data_source, solution_str, ground_truth, extra_info: score_completion(
            solution_str, ground_truth
        ),
        max_resp_len=max_len,
        overlong_buffer_cfg=OmegaConf.create(
            {"enable": True, "len": buffer, "penalty_factor": factor, "log": False}
        ),
    )
    rewards = manager(data)
    return [float(rewards[row, n - 1]) for row, n in enumerate(lengths)]
