"""The embedded model/tokenizer factory and the embedded task (issue 2)."""

from __future__ import annotations

import random
import statistics

import pytest
import torch

from trl_length_plugin.embedded import (
    build_model,
    build_tokenizer,
    correctness_reward,
    load_tokenizer,
    make_task_dataset,
    score_completion,
)
from trl_length_plugin.embedded.task import make_completion, make_problem

TEXT = "<think>3 + 4 hmm, hmm, so 7</think>7"


def test_tokenizer_round_trip_keeps_ids(tmp_path):
    tok = build_tokenizer(seed=0)
    tok.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert again.encode(TEXT, add_special_tokens=False) == ids
    assert again.decode(ids) == TEXT
    assert again.eos_token == "<|im_end|>" and again.pad_token == "<pad>"
    assert again.pad_token_id != again.eos_token_id
    chat = again.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_build_is_deterministic_by_seed():
    a, b = build_tokenizer(seed=0), build_tokenizer(seed=0)
    assert a.get_vocab() == b.get_vocab()
    wa, wb = build_model(a, seed=3).state_dict(), build_model(b, seed=3).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    wc = build_model(a, seed=4).state_dict()
    assert not torch.equal(wa["model.embed_tokens.weight"], wc["model.embed_tokens.weight"])


def test_model_saves_reloads_and_generates(random_model_dir):
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(random_model_dir)
    model = AutoModelForCausalLM.from_pretrained(random_model_dir)
    assert model.config.model_type == "qwen2" and model.config.head_dim == 64
    ids = torch.tensor([tok.encode(TEXT, add_special_tokens=False)])
    reloaded = AutoModelForCausalLM.from_pretrained(random_model_dir)
    assert torch.equal(model(ids).logits, reloaded(ids).logits)
    out = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape == (1, ids.shape[1] + 5) or out[0, -1].item() == tok.eos_token_id


def test_reward_is_exactly_binary_on_hand_made_answers():
    good = ["<think>3 + 4 so 7</think>7", "<think>x</think> 7 ", [{"role": "assistant", "content": TEXT}]]
    wrong = ["<think>3 + 4 so 8</think>8", "<think>x</think>70"]
    malformed = [
        "7",
        "<think>3 + 4 so 7 7",
        "<think>x</think>",
        "<think>x</think>7 apples",
        "",
        "so <think>x</think>7",
    ]
    assert correctness_reward(good, ["7"] * len(good)) == [1.0, 1.0, 1.0]
    assert correctness_reward(wrong, ["7"] * len(wrong)) == [0.0, 0.0]
    assert correctness_reward(malformed, ["7"] * len(malformed)) == [0.0] * len(malformed)
    tool_turn = [{"role": "assistant", "content": "<think>x</think>"}, {"role": "user", "content": "7"}]
    assert score_completion(tool_turn, "7") == 0.0


def test_generated_completions_score_one():
    rng = random.Random(0)
    for _ in range(200):
        question, answer = make_problem(rng)
        assert score_completion(make_completion(question, answer, rng), answer) == 1.0


def test_dataset_is_deterministic_and_conversational():
    ds = make_task_dataset(16, seed=5)
    assert ds.column_names == ["prompt", "answer"]
    assert ds["prompt"][0][0]["role"] == "user"
    assert make_task_dataset(16, seed=5)["answer"] == ds["answer"]
    assert isinstance(make_task_dataset(4, conversational=False)["prompt"][0], str)


@pytest.mark.slow
def test_warm_start_answers_in_format_partly_correctly_with_varied_length(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ds = make_task_dataset(32, seed=123)
    prompts = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in ds["prompt"]]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    out = model.generate(**enc, do_sample=True, max_new_tokens=48, num_return_sequences=4)
    completions = tok.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    answers = [a for a in ds["answer"] for _ in range(4)]
    accuracy = statistics.mean(correctness_reward(completions, answers))
    in_format = statistics.mean(c.startswith("<think>") and "</think>" in c for c in completions)
    lengths = [len(tok.encode(c, add_special_tokens=False)) for c in completions]
    assert in_format > 0.9
    assert 0.15 < accuracy < 0.9, accuracy
    assert statistics.pstdev(lengths) > 3, lengths
