"""Every TRL internal the integration relies on, named and checked (docs/reference/product.md §1.5).

``LengthPluginGRPOTrainer`` (its two mixins, ``length_shaping`` and ``score_centering``) overrides private
``GRPOTrainer`` methods, calls some of its helpers and reads or writes some of its data; each is named here.
:func:`check_trl_host` checks at setup that TRL is the release line we built for and that each overridden or
called method still has the signature we use; :func:`check_trainer_attributes` and
:func:`check_score_centering_host` check after ``GRPOTrainer.__init__`` the attributes each feature reads;
the other ``check_*`` functions check, on first use, what exists only then: the shapes of the data we read
(the tuple ``_generate`` returns, the keys of the scored batch, the ``_logs`` deque we rewrite) and the
attributes of TRL's training loop. A mismatch fails closed with a message naming the internal and the supported TRL,
instead of training on silently wrong rewards.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping

from packaging.version import Version

from trl_length_plugin._optional import require
from trl_length_plugin.host_checks import parameters
from trl_length_plugin.vllm_cpu import check_cpu_dispatch

#: the TRL release this integration was written and tested against, and the range it accepts
BUILT_FOR_TRL = "1.16.0"
SUPPORTED_TRL = (Version("1.16.0"), Version("1.17"))

#: the private GRPOTrainer methods the subclass overrides, with the parameters it relies on
OVERRIDDEN_METHODS = {
    "_generate": ("self", "prompts"),
    "_calculate_rewards": ("self", "inputs", "prompts", "completions", "completion_ids_list"),
    "_generate_and_score_completions": ("self", "inputs"),
    "_compute_loss": ("self", "model", "inputs"),
    "_get_per_token_logps_and_entropies": (
        "self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
        "compute_aux_loss", "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask",
        "spatial_shapes", "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids",
        "image_position_ids",
    ),
    "_save_checkpoint": ("self", "model", "trial"),
    "_load_optimizer_and_scheduler": ("self", "checkpoint"),
}  # fmt: skip
#: the GRPOTrainer helpers score centering calls (the base loss's entropy and off-policy masks), with their
#: parameters
CALLED_METHODS = {
    "get_high_entropy_mask": ("self", "entropies", "mask", "threshold"),
    "get_off_policy_mask": (
        "advantages", "per_token_logps", "sampling_per_token_logps", "mask", "off_policy_threshold",
    ),
}  # fmt: skip
#: what score centering reads of TRL's vLLM generation, its fused head and its helpers
VLLM_GENERATION_ATTRIBUTES = ("mode", "logprobs", "generation_kwargs", "tensor_parallel_size")
#: what each mode adds: the colocated engine on every process, or the server's client on the main one
VLLM_MODE_ATTRIBUTES = {"colocate": ("llm",), "server": ("vllm_client",)}
VLLM_GENERATE = ("self", "prompts", "images", "num_generations", "profiler")
TRL_HELPERS = ("FusedCausalLMOutput", "maybe_gather_lm_head_ctx", "pad", "add_fused_lm_head")
#: the flat logprobs the colocated engine is given
FLAT_LOGPROBS_FIELDS = ("start_indices", "end_indices", "token_ids", "logprobs", "ranks", "decoded_tokens")
#: the tuple ``GRPOTrainer._generate`` returns; the integration reads ``tool_mask``
GENERATE_OUTPUT = (
    "prompt_ids",
    "completion_ids",
    "tool_mask",
    "completions",
    "logprobs",
    "extra_fields",
    "images",
    "tool_images",
)
TOOL_MASK = GENERATE_OUTPUT.index("tool_mask")
COMPLETION_IDS = GENERATE_OUTPUT.index("completion_ids")
#: keys of ``_generate_and_score_completions``' batch the integration reads or rewrites
SCORED_KEYS = ("completion_mask", "advantages", "num_items_in_batch")
#: what score centering's loss reads of that batch (``tool_mask`` too, when TRL sets it), and what it reads
#: and rewrites where it writes the sampled-token weights (``is``, ``adaptive-ppo-clip``)
SCORE_CENTERING_KEYS = (*SCORED_KEYS, "completion_ids", "sampling_per_token_logps")
WEIGHT_KEYS = ("old_per_token_logps", "importance_sampling_ratio")
#: ``GRPOTrainer.__init__`` attributes the integration reads (both features)
TRAINER_ATTRIBUTES = (
    "reward_funcs",
    "reward_func_names",
    "reward_processing_classes",
    "reward_weights",
    "_metrics",
    "_logs",
    "num_generations",
    "eos_token_ids",
    "_tokenizer",
    "scale_rewards",
    "mask_truncated_completions",
    "loss_type",
    "aux_loss_enabled",
    "accelerator",
    "state",
    "_get_output_dir",
)
#: ``GRPOTrainer.__init__`` attributes score centering reads besides those
SCORE_CENTERING_ATTRIBUTES = (
    "vllm_generation",
    "beta",
    "temperature",
    "pad_to_multiple_of",
    "max_completion_length",
    "top_entropy_quantile",
    "off_policy_mask_threshold",
)
#: what transformers' training loop sets before the first loss, which score centering's loss reads
TRAINING_LOOP_ATTRIBUTES = ("current_gradient_accumulation_steps",)


class TRLHostError(RuntimeError):
    """The installed TRL differs from what the integration was built for."""

    def __init__(self, problem: str):
        super().__init__(
            f"trl-length-plugin's TRL integration was built for trl=={BUILT_FOR_TRL} (supports "
            f">={SUPPORTED_TRL[0]},<{SUPPORTED_TRL[1]}) and relies on GRPOTrainer internals; {problem}. "
            f"Install trl=={BUILT_FOR_TRL}."
        )


def check_trl_host() -> None:
    """At setup: the TRL version and the signature of every overridden method."""
    trl = require("trl", "trl")
    problems = []
    installed = Version(trl.__version__)
    if not SUPPORTED_TRL[0] <= installed < SUPPORTED_TRL[1]:
        problems.append(f"installed trl {trl.__version__} is outside the supported range")
    for name, expected in {**OVERRIDDEN_METHODS, **CALLED_METHODS}.items():
        method = getattr(trl.GRPOTrainer, name, None)
        if method is None:
            problems.append(f"GRPOTrainer.{name} no longer exists")
            continue
        params = parameters(method)
        if params != expected:
            problems.append(f"GRPOTrainer.{name}{params} differs from the expected {expected}")
    if problems:
        raise TRLHostError("; ".join(problems))


def check_vllm_host() -> None:
    """Before TRL builds a colocated engine: the names the plugin wraps in TRL's generation and in vLLM."""
    from trl.generation import vllm_generation

    problems = []
    if not callable(getattr(vllm_generation, "LLM", None)):
        problems.append("trl.generation.vllm_generation.LLM (the engine class TRL builds) is gone")
    if parameters(getattr(vllm_generation.VLLMGeneration, "generate", None)) != VLLM_GENERATE:
        problems.append(f"VLLMGeneration.generate no longer takes {VLLM_GENERATE}")
    try:
        from vllm.logprobs import FlatLogprobs
    except ImportError as err:
        problems.append(f"vLLM's internals moved ({err})")
    else:
        problems += filter(None, [check_cpu_dispatch()])
        if tuple(getattr(FlatLogprobs, "__dataclass_fields__", {})) != FLAT_LOGPROBS_FIELDS:
            problems.append(f"vllm.logprobs.FlatLogprobs no longer has the fields {FLAT_LOGPROBS_FIELDS}")
    if problems:
        raise TRLHostError("; ".join(problems))


def check_score_centering_host(trainer) -> None:
    """After ``GRPOTrainer.__init__`` with score centering: TRL's vLLM generation object and helpers."""
    from trl.trainer import utils

    missing = [name for name in SCORE_CENTERING_ATTRIBUTES if not hasattr(trainer, name)]
    generation = getattr(trainer, "vllm_generation", None)
    missing += [name for name in VLLM_GENERATION_ATTRIBUTES if not hasattr(generation, name)]
    mode = getattr(generation, "mode", None)
    if mode == "colocate" or trainer.accelerator.is_main_process:
        missing += [name for name in VLLM_MODE_ATTRIBUTES.get(mode, ()) if not hasattr(generation, name)]
    missing += [f"trl.trainer.utils.{name}" for name in TRL_HELPERS if not hasattr(utils, name)]
    if missing:
        raise TRLHostError(f"score centering reads {missing}, which this TRL lacks")


def check_trainer_attributes(trainer) -> None:
    """After ``GRPOTrainer.__init__``: the attributes the integration reads exist, with the right kinds."""
    missing = [name for name in TRAINER_ATTRIBUTES if not hasattr(trainer, name)]
    if missing:
        raise TRLHostError(f"GRPOTrainer no longer sets {missing}")
    if not isinstance(trainer._metrics, Mapping) or "train" not in trainer._metrics:
        raise TRLHostError("GRPOTrainer._metrics is no longer a {'train': ..., 'eval': ...} mapping")
    if not isinstance(trainer._logs, Mapping) or not isinstance(trainer._logs.get("advantages"), deque):
        raise TRLHostError("GRPOTrainer._logs['advantages'] is no longer a deque")


def check_generate_output(output) -> None:
    """On every ``_generate``: the tuple layout ``GENERATE_OUTPUT`` (the tool mask at its position)."""
    if not isinstance(output, tuple) or len(output) != len(GENERATE_OUTPUT):
        raise TRLHostError(
            f"GRPOTrainer._generate returned {type(output).__name__} of length "
            f"{len(output) if isinstance(output, tuple) else '?'}, expected the tuple {GENERATE_OUTPUT}"
        )
    mask, ids = output[TOOL_MASK], output[COMPLETION_IDS]
    if mask is None or not ids:
        return
    first = mask[0] if isinstance(mask, list) and len(mask) == len(ids) else None
    if not isinstance(first, list) or len(first) != len(ids[0]) or not set(first) <= {0, 1}:
        raise TRLHostError(
            f"GRPOTrainer._generate's element {TOOL_MASK} is no longer the tool mask (one 0/1 list per "
            "completion token)"
        )


def check_scored_output(output: Mapping, rows: int) -> None:
    """After ``_generate_and_score_completions``: the keys the integration rewrites, per-row advantages."""
    missing = [key for key in SCORED_KEYS if key not in output]
    if missing:
        raise TRLHostError(f"GRPOTrainer._generate_and_score_completions no longer returns {missing}")
    if tuple(output["advantages"].shape) != (rows,):
        raise TRLHostError(
            f"GRPOTrainer's advantages have shape {tuple(output['advantages'].shape)}, expected ({rows},)"
        )


def check_score_centering_batch(output: Mapping, writes_weights: bool) -> None:
    """After ``_generate_and_score_completions`` with score centering: the keys its loss reads."""
    wanted = SCORE_CENTERING_KEYS + (WEIGHT_KEYS if writes_weights else ())
    missing = [key for key in wanted if key not in output]
    if missing:
        raise TRLHostError(
            f"score centering reads {missing} of GRPOTrainer's scored batch, which it no longer has"
        )


def check_training_loop(trainer) -> None:
    """In the first loss: the attributes transformers' training loop sets (``TRAINING_LOOP_ATTRIBUTES``)."""
    missing = [name for name in TRAINING_LOOP_ATTRIBUTES if not hasattr(trainer, name)]
    if missing:
        raise TRLHostError(f"the training loop no longer sets {missing}, which score centering's loss reads")


def checkpoint_folder(trainer, trial) -> str:
    """The folder ``Trainer._save_checkpoint`` writes this step's checkpoint to (transformers' layout:
    ``<output dir>/checkpoint-<global step>``), where the plugin saves its own state beside it."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    return os.path.join(
        trainer._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}"
    )


def replace_logged(logs: deque, values: list) -> None:
    """Replace the last ``len(values)`` entries of one of TRL's ``_logs`` deques (TRL logged its own)."""
    if len(logs) < len(values):
        raise TRLHostError(
            f"GRPOTrainer._logs holds {len(logs)} entries after a batch of {len(values)} (maxlen {logs.maxlen})"
        )
    for _ in values:
        logs.pop()
    logs.extend(values)
