"""The host contract proved by a third host (issue 32, docs/write-a-host.md): a plain PyTorch GRPO loop
(``tests/plain_torch_host.py``) gets length shaping, LUSPO's loss and the score-centering term from the core
alone, on the embedded warm model. Its sampler is the model's own ``generate`` (no vLLM): the top-K head it
returns is the sampler's distribution, as vLLM's logprobs are."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from tests.plain_torch_host import PlainHost, policy_logprobs, sample
from trl_length_plugin.embedded import correctness_reward, load_tokenizer, make_task_dataset
from trl_length_plugin.shaping.config import LengthConfigError

HOST = Path(__file__).with_name("plain_torch_host.py")
SHAPING = {
    "length_penalty": {"default": {"group_total_length_penalty_coeff": 0.2}},
    "length_penalty_coeff": 1.0,
    "length_penalty_min_tokens": 4,
}
CORE = ("trl_length_plugin.shaping", "trl_length_plugin.losses", "trl_length_plugin.score_centering")


def test_the_third_host_imports_only_the_core():
    imported = {
        node.module
        for node in ast.walk(ast.parse(HOST.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module != "__future__"
    }
    plugin = {name for name in imported if name.startswith("trl_length_plugin")}
    assert plugin and all(name.startswith(CORE) for name in plugin), plugin
    assert not {name for name in imported if name.split(".")[0] in ("trl", "verl", "verl_adapter", "vllm")}


def test_a_bad_key_fails_before_the_model_is_used():
    with pytest.raises(LengthConfigError, match="length_penalty.default.top_percentil: unknown key"):
        PlainHost({"length_penalty": {"default": {"top_percentil": 0.5}}}, (0.0, 2.0))


def test_three_steps_of_the_plain_loop_train_with_every_feature(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    host, group = PlainHost(SHAPING, (0.0, 1.05)), 8
    data = make_task_dataset(12, seed=0)
    for step in range(3):
        rows = data.select(range(4 * step, 4 * step + 4))
        prompts = [
            tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
            for p in rows["prompt"]
        ]
        rollouts = sample(model, tokenizer, prompts, group, max_new_tokens=32, top_k=16)
        answers = [a for a in rows["answer"] for _ in range(group)]
        rewards = correctness_reward(rollouts.texts, answers)
        lengths = rollouts.mask.sum(-1)
        result, advantages = host.advantages(rewards, lengths, group, step)
        assert torch.equal(result.raw, torch.tensor(rewards, dtype=torch.float64))
        assert {"length_penalty/coeff", "length_penalty/adjusted_frac"} <= set(result.metrics)
        assert all(torch.isfinite(torch.tensor(v)) for v in result.metrics.values())
        if (
            step == 0
        ):  # the tiled head matches a full log-softmax, and before any update the sampler's logprobs
            with torch.no_grad():
                sampled, at_head = policy_logprobs(model, rollouts)
                steps = rollouts.mask.shape[1]
                full = model(rollouts.inputs).logits[:, -steps - 1 : -1].double().log_softmax(-1)
            mask = rollouts.mask
            taken = full.gather(-1, rollouts.inputs[:, -steps:, None]).squeeze(-1)
            torch.testing.assert_close(sampled.double()[mask], taken[mask], rtol=0, atol=1e-4)
            torch.testing.assert_close(
                at_head.double()[mask], full.gather(-1, rollouts.head_ids)[mask], rtol=0, atol=1e-4
            )
            torch.testing.assert_close(
                rollouts.sampler_logprobs.double()[mask], taken[mask], rtol=0, atol=1e-3
            )
        model.train()
        loss, metrics = host.loss(model, rollouts, advantages)
        optimizer.zero_grad()
        loss.backward()
        assert torch.isfinite(loss) and all(
            torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None
        )
        optimizer.step()
        assert ((metrics["head_mass"] > 0) & (metrics["head_mass"] <= 1.0001)).all()
        assert torch.isfinite(metrics["correction"]).all() and metrics["luspo/seq_ratio_mean"] > 0
    assert sum(rewards) > 0  # the warm model answers some problems: the groups carry a signal
