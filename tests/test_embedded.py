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
from trl_length_plugin.embedded.model import _chat_corpus
from trl_length_plugin.embedded.task import make_completion, make_problem

TEXT = "<think>3 + 4 hmm, hmm, so 7</think>7"
#: task text as the trainer sees it (chat template, special tokens, two-digit answers) and a little more
TASK_TEXTS = [*_chat_corpus(64, seed=11), "<think>12 + 5 hmm, so 17</think>17", " héllo  wörld\n\n 123 "]


def assert_same_tokenizer(loaded, trained):
    """Same ids, text and special tokens as the trained tokenizer on the task's text."""
    for text in TASK_TEXTS:
        ids = trained.encode(text, add_special_tokens=False)
        assert loaded.encode(text, add_special_tokens=False) == ids, text
        assert loaded.encode(text) == ids, text  # no BOS/EOS added either
        assert loaded.decode(ids) == trained.decode(ids) == text
        assert loaded.decode(ids, skip_special_tokens=True) == trained.decode(ids, skip_special_tokens=True)
    assert (loaded.eos_token_id, loaded.pad_token_id, loaded.bos_token, loaded.unk_token) == (
        2,
        3,
        None,
        None,
    )
    assert loaded.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>"]) == [0, 1]
    assert len(loaded) == len(trained) and loaded.padding_side == "left"
    chat = [{"role": "user", "content": "What is 9 + 8?"}]
    assert (
        loaded.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"]
        == (trained.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"])
    )


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


def test_every_transformers_loader_gives_the_trained_ids(random_model_dir):
    """AutoTokenizer builds a Qwen2Tokenizer for any qwen2 directory and rebuilds its pre-tokenizer from
    the class; the embedded tokenizer is trained with that pipeline, so every loader agrees."""
    import tokenizers
    from transformers import AutoProcessor, AutoTokenizer, PreTrainedTokenizerFast

    trained = build_tokenizer(seed=0)
    auto = AutoTokenizer.from_pretrained(random_model_dir)
    assert type(auto).__name__ == "Qwen2Tokenizer"
    for loaded in (
        auto,
        PreTrainedTokenizerFast.from_pretrained(random_model_dir),  # reads tokenizer.json as saved
        AutoProcessor.from_pretrained(random_model_dir, padding_side="left"),  # GRPOTrainer(model=path)
        load_tokenizer(random_model_dir),
    ):
        assert_same_tokenizer(loaded, trained)
    raw = tokenizers.Tokenizer.from_file(str(random_model_dir / "tokenizer.json"))
    for text in TASK_TEXTS:
        assert raw.encode(text, add_special_tokens=False).ids == trained.encode(
            text, add_special_tokens=False
        )


@pytest.mark.slow
def test_vllm_and_verl_loaders_give_the_trained_ids(random_model_dir):
    vllm_tokenizers = pytest.importorskip("vllm.tokenizers")
    verl_tokenizer = pytest.importorskip("verl.utils.tokenizer")

    trained = build_tokenizer(seed=0)
    assert_same_tokenizer(vllm_tokenizers.get_tokenizer(str(random_model_dir)), trained)
    assert_same_tokenizer(verl_tokenizer.hf_tokenizer(str(random_model_dir)), trained)


@pytest.mark.slow
def test_grpo_trainer_from_the_path_alone_gives_the_explicit_tokenizers_reward(tiny_model_dir, tmp_path):
    """``GRPOTrainer(model=path)`` (so ``trl grpo --model_name_or_path``) loads its own tokenizer: one
    real step gives the same prompts, completions and reward as with the tokenizer passed explicitly."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_length_plugin.embedded import CPU_RUN_ARGS

    def one_step(**tokenizer):
        args = GRPOConfig(
            output_dir=str(tmp_path), per_device_train_batch_size=16, num_generations=4,
            max_completion_length=48, max_steps=1, seed=0, **CPU_RUN_ARGS,
        )  # fmt: skip
        trainer = GRPOTrainer(
            model=str(tiny_model_dir),
            reward_funcs=[correctness_reward],
            args=args,
            train_dataset=make_task_dataset(16),
            **tokenizer,
        )
        trainer.train()
        return trainer, trainer.state.log_history[0]

    alone, alone_log = one_step()
    explicit, explicit_log = one_step(processing_class=build_tokenizer(seed=0))
    assert_same_tokenizer(alone.processing_class, explicit.processing_class)
    assert 0 < alone_log["rewards/correctness_reward/mean"] < 1
    for key in ("rewards/correctness_reward/mean", "completions/mean_length", "loss"):
        assert alone_log[key] == explicit_log[key], key


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


def test_supervised_batch_labels_the_completion_and_its_end_of_turn_only():
    """``supervised_batch``: each question as a chat prompt, the loss on the completion plus EOS, padding with
    the pad id and mask 0; no examples is a named error."""
    from trl_length_plugin.embedded.model import supervised_batch

    tok = build_tokenizer(seed=0)
    examples = [("3+4", "3+4=7"), ("12+30", "12+30=42 done")]
    ids, mask, labels = supervised_batch(tok, examples)
    for row, (question, completion) in enumerate(examples):
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        prompt_ids = tok.encode(prompt, add_special_tokens=False)
        target = tok.encode(completion + tok.eos_token, add_special_tokens=False)
        n = len(prompt_ids) + len(target)
        assert ids[row, :n].tolist() == prompt_ids + target
        assert (
            labels[row, : len(prompt_ids)].eq(-100).all()
            and labels[row, len(prompt_ids) : n].tolist() == target
        )
        assert mask[row, :n].eq(1).all() and mask[row, n:].eq(0).all() and labels[row, n:].eq(-100).all()
        assert ids[row, n:].eq(tok.pad_token_id).all()
    with pytest.raises(ValueError, match="no examples"):
        supervised_batch(tok, [])
