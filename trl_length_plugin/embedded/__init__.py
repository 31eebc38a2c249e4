"""Embedded defaults built by the project's own code with no Hub access (issue 2):
a tiny chat model and tokenizer, a synthetic verifiable arithmetic task, and a reasoning task whose
necessary and redundant steps make length matter (``reasoning``, issue 20)."""

from trl_length_plugin.embedded.model import (
    CPU_RUN_ARGS,
    build_model,
    build_tokenizer,
    embedded_model_dir,
    load_tokenizer,
    run_warm_start,
)
from trl_length_plugin.embedded.real_model import real_model_dir
from trl_length_plugin.embedded.reasoning import make_reasoning_dataset, step_report
from trl_length_plugin.embedded.task import correctness_reward, make_task_dataset, score_completion

__all__ = [
    "CPU_RUN_ARGS",
    "build_model",
    "build_tokenizer",
    "correctness_reward",
    "embedded_model_dir",
    "load_tokenizer",
    "make_reasoning_dataset",
    "make_task_dataset",
    "real_model_dir",
    "run_warm_start",
    "score_completion",
    "step_report",
]
