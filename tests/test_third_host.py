"""The host contract proved by a third host (issue 32, docs/write-a-host.md): a plain PyTorch GRPO loop
(``tests/plain_torch_host.py``) gets length shaping, LUSPO's loss and the score-centering term from the core
alone, on the embedded warm model. Its sampler is the model's own ``generate`` (no vLLM): the top-K head it
returns is the distribution it sampled from, as vLLM's logprobs are."""

from __future__ import annotations

import ast
import importlib
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
    "drop_zero_std_groups": True,
}
CORE = ("trl_length_plugin.shaping", "trl_length_plugin.losses", "trl_length_plugin.score_centering")


def test_the_third_host_imports_only_the_cores_public_names():
    """Every name the host takes from the plugin is in the ``__all__`` of one of the core's three packages (no
    submodule, no private name, no host adapter); nothing else but torch and the standard library."""
    imported, plugin = set(), set()
    for node in ast.walk(ast.parse(HOST.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            imported.add(node.module)
            if node.module.startswith("trl_length_plugin"):
                plugin.update((node.module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    assert plugin, "the host imports nothing of the core"
    for package, name in sorted(plugin):
        assert package in CORE, f"{package}: not one of the core's packages {CORE}"
        assert name in importlib.import_module(package).__all__, f"{package}.{name} is not a public name"
    assert {name for name in imported if not name.startswith("trl_length_plugin")} == {"torch", "dataclasses"}


def test_a_bad_key_fails_before_the_model_is_used():
    with pytest.raises(LengthConfigError, match="length_penalty.default.top_percentil: unknown key"):
        PlainHost({"length_penalty": {"default": {"top_percentil": 0.5}}}, "luspo", (0.0, 2.0))


@pytest.mark.parametrize("loss", ["luspo", "token"])
def test_the_plain_loop_trains_with_shaping_and_each_loss(tiny_model_dir, loss):
    """Two steps: shaping with the coefficient and the group filter, then LUSPO's loss, or the token-level loss
    with TIS and the score-centering term (whose head and sampled logprobs match a full log-softmax)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    host, group = PlainHost(SHAPING, loss, (0.0, 1.05)), 8
    data = make_task_dataset(8, seed=0)
    for step in range(2):
        rows = data.select(range(4 * step, 4 * step + 4))
        chats = [
            tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
            for p in rows["prompt"]
        ]
        rollouts = sample(model, tokenizer, chats, group, max_new_tokens=32, top_k=16)
        rewards = correctness_reward(rollouts.texts, [a for a in rows["answer"] for _ in range(group)])
        result, advantages, kept = host.advantages(rewards, rollouts.mask.sum(-1), group, step)
        assert torch.equal(result.raw, torch.tensor(rewards, dtype=torch.float64))
        assert {"length_penalty/coeff", "length_penalty/adjusted_frac"} <= set(result.metrics)
        assert torch.equal(kept, result.keep)  # the filter's groups leave the loss
        with torch.no_grad():
            old, at_head = policy_logprobs(model, rollouts)
        if (
            step == 0
        ):  # the tiled head equals a full log-softmax; before any update, so do the sampler's logprobs
            steps, mask = rollouts.mask.shape[1], rollouts.mask
            with torch.no_grad():
                positions = (rollouts.attention.cumsum(-1) - 1).clamp(min=0)
                logits = model(
                    rollouts.inputs, attention_mask=rollouts.attention, position_ids=positions
                ).logits
            full = logits[:, -steps - 1 : -1].double().log_softmax(-1)
            taken = full.gather(-1, rollouts.inputs[:, -steps:, None]).squeeze(-1)
            torch.testing.assert_close(old.double()[mask], taken[mask], rtol=0, atol=1e-4)
            torch.testing.assert_close(
                at_head.double()[mask], full.gather(-1, rollouts.head_ids)[mask], rtol=0, atol=1e-4
            )
            torch.testing.assert_close(
                rollouts.sampler_logprobs.double()[mask], taken[mask], rtol=0, atol=1e-3
            )
        model.train()
        loss_value, metrics = host.loss(model, rollouts, old, advantages, kept)
        optimizer.zero_grad()
        loss_value.backward()
        assert torch.isfinite(loss_value)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        optimizer.step()
        if loss == "luspo":
            assert metrics["luspo/seq_ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # on-policy: s_i = 1
        else:
            assert ((metrics["head_mass"] > 0) & (metrics["head_mass"] <= 1.0001)).all()
            assert torch.isfinite(metrics["correction"]).all()
