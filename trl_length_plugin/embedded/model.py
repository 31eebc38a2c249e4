"""The embedded tiny chat model: a BPE tokenizer and a Qwen2-architecture model, built with no Hub.

Everything is deterministic by seed and cached on disk (``$TRL_LENGTH_PLUGIN_CACHE``, default
``~/.cache/trl_length_plugin``). head_dim is 64 because vLLM's CPU attention rejects 16.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from pathlib import Path

from trl_length_plugin._optional import require
from trl_length_plugin.embedded import overthinking, reasoning
from trl_length_plugin.embedded.task import make_completion, make_problem

logger = logging.getLogger("trl_length_plugin")

#: bump when the recipe below changes, so stale caches are not reused
BUILD_VERSION = 2  # 2: Qwen2's pre-tokenizer, saved as Qwen2Tokenizer
VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MODEL_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)
WARM_START = dict(steps=220, batch_size=64, lr=3e-3)
#: the reasoning task's model (docs/embedded.md): its own recipe version and a longer warm start
REASONING_BUILD_VERSION = 2  # 2: compact steps, distinct numbers
REASONING_WARM_START = dict(steps=2000, batch_size=64, lr=3e-3)
#: the overthinking task's model (docs/embedded.md, "The overthinking task"): the reasoning recipe on its targets
OVERTHINKING_BUILD_VERSION = 2  # 2: a round of steps names its kind once
OVERTHINKING_WARM_START = dict(steps=2000, batch_size=64, lr=3e-3)
TASKS = ("arithmetic", "reasoning", "overthinking")
#: each task's warm-start example drawer (a question and its target completion), recipe version and settings
_DRAW = {"reasoning": reasoning.draw_problem, "overthinking": overthinking.draw_problem}
_RECIPES = {
    "reasoning": (REASONING_BUILD_VERSION, REASONING_WARM_START),
    "overthinking": (OVERTHINKING_BUILD_VERSION, OVERTHINKING_WARM_START),
}
#: GRPOConfig settings every CPU run on the embedded model shares (demo, benchmarks, tests): fp32, no
#: checkpointing, a log row per step, nothing saved or reported
CPU_RUN_ARGS = dict(
    use_cpu=True,
    bf16=False,
    gradient_checkpointing=False,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    disable_tqdm=True,
)


def cache_root() -> Path:
    """Where built models are kept."""
    return Path(os.environ.get("TRL_LENGTH_PLUGIN_CACHE", Path.home() / ".cache" / "trl_length_plugin"))


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"task: one of {', '.join(TASKS)} expected, got {task!r}")


def _draw_example(rng: random.Random, task: str) -> tuple[str, str]:
    """A warm-start example of ``task``: a question and its target completion."""
    if task in _DRAW:
        return _DRAW[task](rng)
    question, answer = make_problem(rng)
    return question, make_completion(question, answer, rng)


def _chat_corpus(n: int, seed: int, task: str = "arithmetic") -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        question, completion = _draw_example(rng, task)
        texts.append(
            f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n{completion}<|im_end|>\n"
        )
    return texts


def build_tokenizer(seed: int = 0, task: str = "arithmetic"):
    """A byte-level BPE tokenizer trained on the chat corpus of ``task``, as a ``Qwen2Tokenizer``.

    It uses Qwen2's own normalizer and pre-tokenizer (digits split one by one), because ``AutoTokenizer``
    (so TRL, vLLM and verl) loads any qwen2 directory as a ``Qwen2Tokenizer`` that rebuilds them from its
    class: every loader then gives the same ids (docs/embedded.md).
    """
    tokenizers = require("tokenizers", "trl")
    transformers = require("transformers", "trl")
    from tokenizers import models, pre_tokenizers, trainers

    qwen = transformers.Qwen2Tokenizer().backend_tokenizer  # the pipeline Qwen2Tokenizer always rebuilds
    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.normalizer, bpe.pre_tokenizer, bpe.decoder = qwen.normalizer, qwen.pre_tokenizer, qwen.decoder
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    _check_task(task)
    bpe.train_from_iterator(_chat_corpus(4000, seed, task), trainer=trainer)
    trained = json.loads(bpe.to_str())["model"]
    tok = transformers.Qwen2Tokenizer(
        vocab=trained["vocab"],
        merges=[tuple(pair) for pair in trained["merges"]],
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token=None,
        extra_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("<|im_end|>", "<pad>")],
        padding_side="left",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def load_tokenizer(path: str | os.PathLike):
    """The embedded tokenizer of a model directory: what ``AutoTokenizer.from_pretrained`` returns."""
    transformers = require("transformers", "trl")
    return transformers.AutoTokenizer.from_pretrained(str(path))


def build_model(tokenizer, seed: int = 0):
    """A randomly initialised Qwen2 causal LM sized for CPU tests."""
    torch = require("torch", "trl")
    transformers = require("transformers", "trl")
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        **MODEL_CONFIG,
        bos_token_id=None,  # as the tokenizer: else transformers "aligns" the config with a warning
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = transformers.Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def _sft_batch(tokenizer, rng: random.Random, batch_size: int, task: str = "arithmetic"):
    """Token ids, attention mask and labels (completion tokens only) of one supervised batch."""
    return supervised_batch(tokenizer, [_draw_example(rng, task) for _ in range(batch_size)])


def supervised_batch(tokenizer, examples: list[tuple[str, str]]):
    """Token ids, attention mask and labels of ``examples`` (question, completion): each question as a chat
    prompt, each completion ending with the end-of-turn token, the loss on the completion tokens only."""
    if not examples:
        raise ValueError("supervised_batch: no examples to batch")
    torch = require("torch", "trl")
    rows, prompt_lens = [], []
    for question, completion in examples:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        completion += tokenizer.eos_token
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        rows.append(prompt_ids + tokenizer.encode(completion, add_special_tokens=False))
        prompt_lens.append(len(prompt_ids))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100)
    for i, (row, n_prompt) in enumerate(zip(rows, prompt_lens, strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        labels[i, n_prompt : len(row)] = torch.tensor(row[n_prompt:])
    return ids, mask, labels


def _warm_start_settings(task: str) -> dict:
    return _RECIPES[task][1] if task in _RECIPES else WARM_START


def run_warm_start(
    model, tokenizer, seed: int = 0, steps: int | None = None, task: str = "arithmetic"
) -> list[float]:
    """A short supervised pass on ``task`` so the model answers in format, partly correctly (issue 2).

    Returns the loss curve. Deterministic for a given seed and thread count on one machine.
    """
    torch = require("torch", "trl")
    _check_task(task)
    settings = _warm_start_settings(task)
    steps = settings["steps"] if steps is None else steps
    rng = random.Random(seed + 1)
    torch.manual_seed(seed + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings["lr"], weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 30) * (1 - s / steps)
    )
    model.train()
    losses = []
    for _ in range(steps):
        ids, mask, labels = _sft_batch(tokenizer, rng, settings["batch_size"], task)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


def _build_key(seed: int, warm: bool, task: str = "arithmetic") -> str:
    if task in _RECIPES:
        version, settings = _RECIPES[task]
        recipe = [version, task, seed, warm, MODEL_CONFIG, settings, VOCAB_SIZE]
    else:  # the arithmetic recipe's key as before the reasoning task existed: its caches stay valid
        recipe = [BUILD_VERSION, seed, warm, MODEL_CONFIG, WARM_START, VOCAB_SIZE]
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def embedded_model_dir(warm_start: bool = True, seed: int = 0, task: str = "arithmetic") -> Path:
    """Directory of the embedded chat model of ``task`` (weights, config, tokenizer), built once and cached.

    ``warm_start=False`` gives the untrained model, which builds in about a second.
    """
    _check_task(task)
    name = "tiny-qwen2" if task == "arithmetic" else f"tiny-qwen2-{task}"
    state = "warm" if warm_start else "random"
    target = cache_root() / f"{name}-{state}-{_build_key(seed, warm_start, task)}"
    if cached(target):
        return target
    torch = require("torch", "trl")
    tokenizer = build_tokenizer(seed, task)
    model = build_model(tokenizer, seed)
    if warm_start:
        logger.info("building the embedded warm-started %s model (once, a few minutes)", task)
        # one thread: the same weights on one machine, no oversubscription (torch's own setter: an in-process
        # vLLM CPU engine replaces torch.set_num_threads with a no-op); another machine may build other weights, so
        # the efficacy grid's model is pinned (docs/embedded.md, "The pinned warm model")
        set_threads, threads = torch._C.set_num_threads, torch.get_num_threads()
        set_threads(1)
        try:
            losses = run_warm_start(model, tokenizer, seed, task=task)
        finally:
            set_threads(threads)
        logger.info("warm start done: loss %.3f -> %.3f", losses[0], losses[-1])
    return save_to_cache(target, model, tokenizer)


def safetensors_tensors(file: Path) -> dict[str, dict]:
    """The tensors a safetensors file's header declares (name -> dtype, shape, data_offsets); ``ValueError``
    when the header is unreadable or the file is not as long as the header says (truncated or padded)."""
    with open(file, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        try:
            header = json.loads(handle.read(size))
            tensors = {k: v for k, v in header.items() if k != "__metadata__"}
            end = max((int(t["data_offsets"][1]) for t in tensors.values()), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            raise ValueError(f"{file.name}: not a safetensors file (unreadable header)") from None
    if file.stat().st_size != 8 + size + end:
        raise ValueError(
            f"{file.name}: {file.stat().st_size} bytes, its header needs {8 + size + end} (truncated?)"
        )
    return tensors


def folder_problem(folder: Path, needs: tuple[str, ...] = ()) -> str | None:
    """What keeps ``folder`` from being a complete model folder, or None: a ``config.json`` that is not a JSON
    object naming its ``model_type``, no weights, a safetensors file whose header is unreadable or whose length
    is not the header's, a missing file of ``needs``."""
    if not folder.is_dir():
        return "no such folder"
    config = folder / "config.json"
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except FileNotFoundError:
        return "no config.json"
    except (OSError, ValueError, AttributeError):
        return "config.json is not a JSON object"
    if not isinstance(model_type, str) or not model_type:
        return "config.json names no model_type"
    weights = sorted(folder.glob("*.safetensors"))
    if not weights and not any(f.stat().st_size for f in folder.glob("*.bin")):
        return "no weights (*.safetensors or *.bin)"
    for file in weights:
        try:
            safetensors_tensors(file)
        except (OSError, ValueError) as err:
            return str(err)
    missing = [name for name in needs if not (folder / name).is_file()]
    return f"no {missing[0]}" if missing else None


def local_model_folder(path: str) -> Path:
    """The complete model folder at ``path`` (:func:`folder_problem`); ``ValueError`` saying what is wrong."""
    folder = Path(path).expanduser()
    problem = folder_problem(folder)
    if problem:
        raise ValueError(f"{path} is not a local model folder ({problem})")
    return folder.resolve()


#: the files a cache folder holds besides its config and weights
CACHED_FILES = ("tokenizer_config.json",)


def cached(target: Path) -> bool:
    """Whether the cache folder ``target`` is complete (:func:`folder_problem`). An incomplete one (damaged,
    truncated) is removed, to be built again; a cache that cannot be written is then an ``OSError`` of one line
    naming ``$TRL_LENGTH_PLUGIN_CACHE``, before the build."""
    if target.exists():
        problem = folder_problem(target, CACHED_FILES)
        if problem is None:
            return True
        logger.warning("the cached model %s is incomplete (%s): building it again", target, problem)
        shutil.rmtree(target, ignore_errors=True)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(target.parent, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as err:
        raise OSError(
            f"model cache {target.parent}: cannot write there ({err.strerror or err}); set "
            "TRL_LENGTH_PLUGIN_CACHE to a writable folder"
        ) from None
    return False


def save_to_cache(target: Path, model, tokenizer) -> Path:
    """Save ``model`` and ``tokenizer`` as the cache folder ``target`` (:func:`cached` said it is not there):
    written into a staging folder, verified complete, then made ``target`` in one rename (a complete folder
    another process built at the same time is kept)."""
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".building-"))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        problem = folder_problem(staging, CACHED_FILES)
        if problem:
            raise OSError(f"model cache {target}: the saved folder is incomplete ({problem})")
        try:
            staging.rename(target)
        except OSError:  # built concurrently by another process: keep theirs where it is complete
            if not cached(target):
                staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
