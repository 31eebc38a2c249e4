"""Reasoning / answer / total lengths of completions (docs/reference/length-penalties.md §2.5), with the embedded tokenizer."""

from __future__ import annotations

import pytest
import torch

from trl_length_plugin.shaping import completion_channels, measure_lengths, measure_token_ids, split_reasoning


@pytest.fixture(scope="module")
def tokenizer(random_model_dir):
    from trl_length_plugin.embedded import load_tokenizer

    return load_tokenizer(random_model_dir)


@pytest.mark.parametrize(
    ("text", "reasoning", "answer"),
    [
        ("The answer is 4.", "", "The answer is 4."),
        ("<think>2+2=4</think>The answer is 4.", "2+2=4", "The answer is 4."),
        ("Intro <think>a</think> mid <think>b</think> end", "ab", "Intro  mid  end"),
        ("Sure. <think>still thinking", "still thinking", "Sure. "),  # unterminated: rest is reasoning
        ("thinking already</think>Answer", "thinking already", "Answer"),  # opened in the prompt
        ("<think></think>", "", ""),
        ("", "", ""),
        ("a</think>b<think>c", "ac", "b"),
    ],
)
def test_split_reasoning(text, reasoning, answer):
    assert split_reasoning(text) == (reasoning, answer)


def test_custom_reasoning_tags():
    assert split_reasoning("[r]why[/r]what", ("[r]", "[/r]")) == ("why", "what")
    assert split_reasoning("<think>x</think>y", ("[r]", "[/r]")) == ("", "<think>x</think>y")


def test_conversational_completion_counts_assistant_and_roleless_messages_only():
    completion = [
        {"role": "assistant", "content": "<think>plan</think>call tool", "reasoning_content": "deep "},
        {"role": "tool", "content": "tool output that must not count"},
        {"role": "user", "content": "environment observation"},
        {"content": [{"type": "text", "text": "final "}, {"type": "image"}, "answer"]},
        {"role": "assistant", "content": None},
    ]
    assert completion_channels(completion) == ("deep plan", "call toolfinal answer")


def test_chars_lengths_and_total():
    lengths = measure_lengths(
        ["<think>abc</think>de", "xyz", [{"role": "assistant", "content": "hi"}]], "chars"
    )
    assert lengths.reasoning.tolist() == [3, 0, 0]
    assert lengths.answer.tolist() == [2, 3, 2]
    assert lengths.total.tolist() == [5, 3, 2]
    assert lengths.reasoning.dtype == torch.long


def test_tokens_without_tokenizer_is_an_error():
    with pytest.raises(ValueError, match="needs a tokenizer"):
        measure_lengths(["abc"], "tokens")
    with pytest.raises(ValueError, match="needs a tokenizer"):
        measure_lengths(["abc", "d"], ["chars", "tokens"])
    with pytest.raises(ValueError, match="'tokens' or 'chars'"):
        measure_lengths(["abc"], "words")
    with pytest.raises(ValueError, match="one per completion"):
        measure_lengths(["abc"], ["chars", "chars"])


def test_tokens_count_each_channel_with_the_tokenizer(tokenizer):
    texts = ["<think>Let me add 2 and 2.</think>The answer is 4.", "Just 4.", "<think>hmm"]
    lengths = measure_lengths(texts, "tokens", tokenizer)
    for text, reasoning, answer in zip(texts, lengths.reasoning, lengths.answer, strict=True):
        thought, said = split_reasoning(text)
        assert reasoning == len(tokenizer.encode(thought, add_special_tokens=False))
        assert answer == len(tokenizer.encode(said, add_special_tokens=False))
    assert lengths.answer[2] == 0


def test_per_row_length_types(tokenizer):
    texts = ["<think>abc def</think>ghi", "<think>abc def</think>ghi"]
    lengths = measure_lengths(texts, ["chars", "tokens"], tokenizer)
    assert lengths.reasoning[0] == 7
    assert lengths.reasoning[1] == len(tokenizer.encode("abc def", add_special_tokens=False))


def test_token_ids_give_the_numbers_of_the_decoded_text(tokenizer):
    """The completion ids (with eos and padding, as a trainer holds them) measure like their text."""
    texts = ["<think>Let me add 2 and 2.</think>The answer is 4.", "Just 4."]
    ids = [tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id] for text in texts]
    width = max(map(len, ids))
    padded = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in ids])
    from_ids = measure_token_ids(padded, tokenizer, "tokens")
    from_text = measure_lengths(texts, "tokens", tokenizer)
    assert torch.equal(from_ids.reasoning, from_text.reasoning)
    assert torch.equal(from_ids.answer, from_text.answer)
    assert measure_token_ids(ids, tokenizer, "chars").total.tolist() == [len(t) - 15 for t in texts[:1]] + [7]
    with pytest.raises(ValueError, match="tokenizer"):
        measure_token_ids(ids, None)


def decoded_and_encoded_again(ids: list[list[int]], tokenizer):
    """The text path the token-id path replaces: each completion decoded, split, each channel encoded again."""
    return measure_lengths(
        [tokenizer.decode(row, skip_special_tokens=True) for row in ids], "tokens", tokenizer
    )


@pytest.fixture(scope="module")
def reasoning_tokenizer():
    """The reasoning task's tokenizer (verl's end-to-end model), trained on its chats."""
    from trl_length_plugin.embedded import embedded_model_dir, load_tokenizer

    return load_tokenizer(embedded_model_dir(warm_start=True, task="reasoning"))


def test_token_ids_split_where_a_tag_merged_with_the_text_after_it(reasoning_tokenizer):
    """In the reasoning tokenizer ``<think>`` is two tokens whose ``>`` merges with a following word; tags
    that open in the prompt, open without closing or repeat, and special tokens, count as their text does."""
    tokenizer = reasoning_tokenizer
    texts = [
        "<think>so 9</think>9",
        "<think>hmm, so 12</think>12",
        "thinking already</think>Answer",
        "Sure. <think>still thinking",
        "Intro <think>a</think> mid <think>b</think> end",
        "<think></think>",
        "",
    ]
    ids = [tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id] for text in texts]
    opening = tokenizer.encode("<think>", add_special_tokens=False)
    assert len(opening) > 1 and ids[0][: len(opening)] != opening  # the tag's ">" merged with "so"
    from_ids, from_text = measure_token_ids(ids, tokenizer), decoded_and_encoded_again(ids, tokenizer)
    assert from_ids.reasoning.tolist() == from_text.reasoning.tolist()
    assert from_ids.answer.tolist() == from_text.answer.tolist()


def test_token_ids_count_as_the_text_on_the_warm_models_samples(reasoning_tokenizer):
    """The verl host counts the tokens the model generated, split where the tags lie in them, nothing encoded
    again: on 512 samples of the warm reasoning model (verl's end-to-end model) every count equals the
    decode/re-encode path's (docs/reference/length-penalties.md §2.5)."""
    from transformers import AutoModelForCausalLM

    from trl_length_plugin.embedded import embedded_model_dir, make_reasoning_dataset

    folder, tokenizer = embedded_model_dir(warm_start=True, task="reasoning"), reasoning_tokenizer
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(folder)
    chats = [
        tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        for prompt in make_reasoning_dataset(64, seed=3)["prompt"]
    ]
    encoded = tokenizer(chats, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    out = model.generate(
        **encoded, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=48,
        num_return_sequences=8, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    ids = out[:, encoded["input_ids"].shape[1] :].tolist()  # with eos and padding, as verl's responses
    from_ids, from_text = measure_token_ids(ids, tokenizer), decoded_and_encoded_again(ids, tokenizer)
    assert from_ids.reasoning.tolist() == from_text.reasoning.tolist()
    assert from_ids.answer.tolist() == from_text.answer.tolist()
    assert (from_ids.reasoning > 0).float().mean() > 0.9  # the samples reason, in tags
