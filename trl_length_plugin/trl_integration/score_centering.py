"""Score centering in TRL's ``GRPOTrainer`` (docs/reference/score-centering.md §5).

:func:`resolve_plan` turns a ``LengthPluginGRPOConfig`` into what the trainer does (the mode and its bounds
derived from TRL's importance-sampling keys, sampler replay, the on-policy ratio), with every check the config
alone decides, at load time. :class:`ScoreCenteringMixin` is the trainer side, in front of ``GRPOTrainer``:

1. generation (``_generate``): the sampler's heads (``vllm_topk.TopkCapture``) padded to ``[B, T, K]``; TRL's
   sampled-token logprob is picked by id; under replay TRL's old-logprob pass is kept-set normalized too;
2. ``_generate_and_score_completions``: the heads join TRL's batch (its shuffle and micro-batch split carry
   them to the loss);
3. ``_compute_loss``: for ``is`` and ``adaptive-ppo-clip`` the sampled-token importance weights of the mode
   replace TRL's (from the batch's final advantages); the trainer's logprobs at the K ids come from the
   loss's own forward (``topk_head``); ``A * C`` is masked and normalized like the base loss
   (``loss_aggregation.aggregate``); C and the metrics of §5.6 from one head computation
   (``score_centering_outputs``); the adaptive controller's counts, its step at each optimizer step, its
   state in checkpoints.

Every rule lives in the core (``trl_length_plugin.score_centering``); this module translates TRL's keys,
batch and hooks.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
from dataclasses import dataclass

import torch

from trl_length_plugin.score_centering.capture import check_sampling_settings
from trl_length_plugin.score_centering.config import (
    SAMPLING_FILTER_RULES,
    HostWeights,
    ScoreCenteringPlanBase,
    check_base_clip,
    check_engine_cap,
    check_is_bounds,
    check_model_vocabulary,
    check_sampling_filters,
    refuse_sequence_ratio,
    resolve_mode,
)
from trl_length_plugin.score_centering.controller import AdaptiveClipController
from trl_length_plugin.score_centering.estimator import (
    batch_means,
    plan_sampled_token_weights,
    score_centering_outputs,
)
from trl_length_plugin.shaping.settings import score_centering_settings_line
from trl_length_plugin.trl_integration import vllm_topk
from trl_length_plugin.trl_integration.loss_aggregation import aggregate
from trl_length_plugin.trl_integration.topk_head import HeadRequest, install_topk_head

TOKEN_MODES = {"token_truncate": "tis", "token_mask": "icepop"}
SEQUENCE_MODES = ("sequence_mask", "sequence_truncate")
#: TRL's ``vllm_importance_sampling_mode`` values (``GRPOConfig``'s documented options)
TRL_IS_MODES = (*TOKEN_MODES, *SEQUENCE_MODES)
#: TRL loss types whose importance ratio is per sequence whatever ``importance_sampling_level`` says
SEQUENCE_RATIO_LOSS_TYPES = ("luspo", "vespo")
#: generation_kwargs that would change what vLLM returns for the head
CAPTURE_KWARGS = ("logprobs", "prompt_logprobs", "logprob_token_ids", "flat_logprobs", "detokenize")
logger = logging.getLogger("trl_length_plugin")


@dataclass(frozen=True)
class ScoreCenteringPlan(ScoreCenteringPlanBase):
    """What the trainer does: the shared plan (K, the mode and its bounds, the outer bound, the on-policy
    ratio) and sampler replay. TRL has no ``is`` or ``adaptive-ppo-clip`` mode: the plugin writes those
    sampled-token weights."""

    replay: bool = False

    @property
    def detail(self) -> str:
        return "sampler replay" if self.replay else "full vocabulary"


def _sampling(args) -> dict:
    """The effective sampling settings (``generation_kwargs`` override TRL's own keys)."""
    kwargs = args.generation_kwargs or {}
    names = ("temperature", "top_k", "top_p", "min_p")
    return {name: kwargs.get(name, getattr(args, name)) for name in names}


def check_trl_sampling_filters(args) -> None:
    """TRL's sampling filters and their ``generation_kwargs`` overrides in vLLM's ranges, with or without score
    centering (reference §5.2): a NaN or out-of-range value would fail only in vLLM, after the model loads."""
    own = {name: getattr(args, name) for name in SAMPLING_FILTER_RULES}
    check_sampling_filters({"": own, "generation_kwargs.": args.generation_kwargs or {}})


def _check_token_ratio(args) -> None:
    """The base loss's importance ratio must be per token (reference §5.5): no LUSPO, VESPO or GSPO."""
    if args.luspo:
        refuse_sequence_ratio("luspo: true")
    if args.loss_type in SEQUENCE_RATIO_LOSS_TYPES:
        refuse_sequence_ratio(f"loss_type: {args.loss_type!r}")
    if args.importance_sampling_level == "sequence":
        refuse_sequence_ratio("importance_sampling_level: 'sequence'")


def _host_weights(args) -> HostWeights:
    """TRL's importance-sampling keys in the plugin's terms (reference §5.5, §5.7): the correction off gives
    ``off``; on, its token-level mode gives tis or icepop, and the plugin's weights replace TRL's ratio."""
    correction, trl_mode = args.vllm_importance_sampling_correction, args.vllm_importance_sampling_mode
    if trl_mode not in TRL_IS_MODES:
        close = difflib.get_close_matches(str(trl_mode).lower(), TRL_IS_MODES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"vllm_importance_sampling_mode: {trl_mode!r} is not one of {', '.join(TRL_IS_MODES)}{hint}"
        )
    if correction and trl_mode in SEQUENCE_MODES:
        raise ValueError(
            f"vllm_importance_sampling_mode: {trl_mode!r} (TRL's default) is sequence-level; score centering needs "
            "a token-level mode: set vllm_importance_sampling_mode: token_truncate (tis) or token_mask (icepop), "
            "or vllm_importance_sampling_correction: false (off)"
        )

    def needs(mode: str) -> str:
        if mode == "off":
            return "needs vllm_importance_sampling_correction: false (TRL would weight the base loss)"
        if not correction:
            return "needs vllm_importance_sampling_correction: true (with a token-level vllm_importance_sampling_mode)"
        wanted = next(name for name, value in TOKEN_MODES.items() if value == mode)
        return f"needs vllm_importance_sampling_mode: {wanted}, got {trl_mode!r}"

    def bounds(mode: str) -> tuple[float, float]:
        low, high = args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max
        if high is None or (isinstance(high, float) and not math.isfinite(high)):
            raise ValueError(
                f"vllm_importance_sampling_clip_max: {mode} needs a finite upper bound, got {high}"
            )
        low_key, high_key = "vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max"
        return check_is_bounds(0.0 if low is None else low, high, low_key, high_key)

    high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    return HostWeights(
        derived=TOKEN_MODES[trl_mode] if correction else "off",
        carries_written=bool(correction),
        needs=needs,
        bounds=bounds,
        clip=(args.epsilon, high, "epsilon", "epsilon_high"),
    )


def resolve_plan(args) -> ScoreCenteringPlan | None:
    """Check the config and resolve the plan (None when score centering is off); every error names a key."""
    check_trl_sampling_filters(args)
    config = args.score_centering_config
    if not config.enabled:
        return None
    top_k = config.score_centering_top_k
    _check_token_ratio(args)
    high_key = "epsilon" if args.epsilon_high is None else "epsilon_high"
    clip = {"epsilon": args.epsilon, "epsilon_high": args.epsilon_high}
    check_base_clip(config, clip, "epsilon", high_key)
    check_engine_cap(
        (args.vllm_engine_kwargs or {}).get("max_logprobs"), top_k, "vllm_engine_kwargs.max_logprobs"
    )
    if not args.use_vllm:
        raise ValueError("score_centering: needs use_vllm: true (the sampler's head comes from vLLM)")
    if args.max_tool_calling_iterations is not None:
        raise ValueError(
            "max_tool_calling_iterations: tool-calling loops are not supported with score_centering"
        )
    captured = sorted(set(args.generation_kwargs or {}) & set(CAPTURE_KWARGS))
    if captured:
        raise ValueError(f"generation_kwargs.{captured[0]}: score centering sets what vLLM returns; drop it")
    keys = {name: name for name in ("temperature", "top_k", "top_p", "min_p")}
    replay = check_sampling_settings(_sampling(args), top_k, keys, replay_supported=True)
    mode, bounds, outer = resolve_mode(config, _host_weights(args))
    if config.force_on_policy_ratio:
        accumulation, per_generation = args.gradient_accumulation_steps, args.steps_per_generation
        if args.num_iterations != 1 or accumulation % per_generation:
            raise ValueError(
                "force_on_policy_ratio: needs one optimizer update per rollout batch: num_iterations: 1 and "
                f"steps_per_generation dividing gradient_accumulation_steps (got num_iterations="
                f"{args.num_iterations}, steps_per_generation={per_generation}, "
                f"gradient_accumulation_steps={accumulation})"
            )
    return ScoreCenteringPlan(top_k, mode, bounds, outer, config.force_on_policy_ratio, replay=replay)


class ScoreCenteringMixin:
    """The trainer side of score centering; in front of ``GRPOTrainer`` in the MRO. ``_score_plan`` is the
    resolved plan (None: every hook passes through)."""

    _score_plan: ScoreCenteringPlan | None = None
    _controller: AdaptiveClipController | None = None

    # -- setup --------------------------------------------------------------------------------------------
    def _check_score_centering_inputs(self, model, args, kwargs: dict) -> None:
        """Before the model loads: what the trainer's arguments and the model's config decide."""
        for name in ("tools", "environment_factory", "rollout_func"):
            if kwargs.get(name) is not None:
                raise ValueError(
                    f"score_centering: {name} is not supported (the sampler's head comes from vLLM)"
                )
        init_kwargs = args.model_init_kwargs if isinstance(args.model_init_kwargs, dict) else {}
        options = {key: init_kwargs[key] for key in ("revision", "trust_remote_code") if key in init_kwargs}
        check_model_vocabulary(self._score_plan.top_k, model, **options)

    def _install_score_centering(self) -> None:
        """After ``GRPOTrainer.__init__``: capture, the top-k head, the server check, the controller."""
        from accelerate.utils import broadcast_object_list, is_peft_model

        from trl_length_plugin.trl_integration._host import check_score_centering_host

        check_score_centering_host(self)
        plan = self._score_plan
        peft = is_peft_model(self.model)
        target = self.model.get_base_model() if peft else self.model
        if peft:
            from peft.tuners.tuners_utils import BaseTunerLayer

            if isinstance(target.get_output_embeddings(), BaseTunerLayer):
                raise ValueError(
                    "score_centering: an adapter on the LM head is not supported (leave lm_head out of LoRA)"
                )
        if self.aux_loss_enabled:
            raise ValueError(
                "score_centering: the MoE router auxiliary loss is not supported (router_aux_loss_coef)"
            )
        if plan.replay and self.beta != 0.0 and not peft:
            raise ValueError(
                "beta: under sampler replay the reference logprobs would be full-vocabulary; use beta: 0 or PEFT"
            )
        generation = self.vllm_generation
        if generation.mode == "server":
            verdict = [None]
            if self.accelerator.is_main_process:
                try:
                    vllm_topk.check_server(
                        generation, plan.top_k, raw_allowed=not plan.replay and self.temperature == 1
                    )
                except ValueError as err:
                    verdict = [str(err)]
            broadcast_object_list(verdict, from_process=0)
            if verdict[0] is not None:
                raise ValueError(verdict[0])
        self._capture = vllm_topk.TopkCapture(generation, plan.top_k)
        self._head_request: HeadRequest | None = None
        self._generation_request: HeadRequest | None = None
        self._generation_heads: tuple[torch.Tensor, torch.Tensor] | None = None
        install_topk_head(target, lambda: self._head_request)
        self._controller = None
        if plan.mode == "adaptive-ppo-clip":
            self._controller = AdaptiveClipController.from_config(self.args.score_centering_config)
        summary = f"{plan.summary()} (vLLM {generation.mode})"
        logger.info("%s", score_centering_settings_line(self.args.score_centering_config, summary))

    # -- generation ---------------------------------------------------------------------------------------
    def _generate(self, prompts):
        output = super()._generate(prompts)
        if self._score_plan is None:
            return output
        from trl.trainer.utils import pad

        heads = self._capture.take()
        device, multiple = self.accelerator.device, self.pad_to_multiple_of
        ids = pad(
            [ids.long() for ids, _ in heads],
            padding_value=0,
            padding_side="right",
            pad_to_multiple_of=multiple,
        )
        logprobs = pad(
            [logprobs for _, logprobs in heads],
            padding_value=-math.inf,
            padding_side="right",
            pad_to_multiple_of=multiple,
        )
        self._generation_heads = (ids.to(device), logprobs.to(device))
        if self._score_plan.replay:  # TRL's old logprobs must be kept-set normalized like vLLM's
            self._generation_request = HeadRequest(*self._generation_heads, replay=True)
        return output

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self._score_plan is None:
            return output
        self._generation_request = None
        ids, logprobs = self._generation_heads
        self._generation_heads = None
        if ids.shape[:2] != output["completion_ids"].shape:
            raise RuntimeError(
                f"score centering: heads {tuple(ids.shape)} for completions {tuple(output['completion_ids'].shape)}"
            )
        output["sampler_topk_ids"], output["sampler_topk_logprobs"] = ids, logprobs
        return output

    @property
    def _adaptive_k(self) -> float:
        """The controller's current offset k (0 without the adaptive-ppo-clip controller)."""
        return self._controller.k if self._controller is not None else 0.0

    def _sampled_token_weights(self, inputs: dict) -> torch.Tensor:
        """The sampled-token weights of ``is`` / ``adaptive-ppo-clip`` from TRL's old and sampler logprobs (the
        ratio TRL computes, before its own truncation)."""
        advantages = inputs["advantages"]
        return plan_sampled_token_weights(
            self._score_plan,
            self._adaptive_k,
            inputs["old_per_token_logps"],
            inputs["sampling_per_token_logps"],
            inputs["completion_mask"] * inputs.get("tool_mask", 1),
            advantages.unsqueeze(1) if advantages.dim() == 1 else advantages,
        )

    # -- the forward --------------------------------------------------------------------------------------
    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
    ):
        request = None
        if self._score_plan is not None:
            request = self._loss_request if kwargs.get("compute_entropy") else self._generation_request
        self._head_request = request
        try:
            result = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        finally:
            self._head_request = None
        if request is not None and request is self._loss_request:
            self._loss_topk, self._loss_logps, self._loss_entropies = request.collect(), result[0], result[1]
        elif request is not None:
            request.collect()
        return result

    _loss_request: HeadRequest | None = None

    # -- the loss -----------------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        plan = self._score_plan
        if plan is None:
            return super()._compute_loss(model, inputs)
        self._loss_request = HeadRequest(
            inputs["sampler_topk_ids"], inputs["sampler_topk_logprobs"], plan.replay
        )
        base_inputs = dict(inputs)
        if plan.writes_weights:
            base_inputs["importance_sampling_ratio"] = self._sampled_token_weights(inputs)
        if plan.force_on_policy:  # TRL then takes the detached current policy as the old one
            base_inputs.pop("old_per_token_logps", None)
        try:
            loss = super()._compute_loss(model, base_inputs)
        finally:
            self._loss_request = None
        return loss + self._centering_loss(inputs)

    def _centering_loss(self, inputs) -> torch.Tensor:
        """``A * C`` of this micro-batch with the base loss's masks and normalization; logs the metrics."""
        plan = self._score_plan
        mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)
        advantages = inputs["advantages"]
        advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
        outputs = score_centering_outputs(
            plan,
            self._adaptive_k,
            self._loss_topk,
            sampler_topk_logprobs=inputs["sampler_topk_logprobs"],
            token_mask=mask.bool(),
            advantages=advantages,
            sampler_replay=plan.replay,
        )
        per_token = advantages * outputs.correction * self._sample_masks(inputs, mask, advantages)
        training = self.model.training
        loss = aggregate(
            per_token,
            mask,
            self.loss_type,
            training=training,
            accumulation_steps=self.current_gradient_accumulation_steps,
            num_items_in_batch=inputs["num_items_in_batch"],
            num_processes=self.accelerator.num_processes,
            steps_per_generation=self.args.steps_per_generation,
            max_completion_length=self.max_completion_length,
        )
        self._log_score_centering(inputs, outputs.token_metrics, mask, advantages, training)
        return loss

    def _sample_masks(self, inputs, mask: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor | float:
        """TRL's entropy and off-policy sequence masks of the base loss, recomputed from the same tensors."""
        masks = 1.0
        if self.top_entropy_quantile < 1.0:
            masks = self.get_high_entropy_mask(self._loss_entropies, mask, 1 - self.top_entropy_quantile)
        if self.off_policy_mask_threshold is not None:
            logps = self._loss_logps.detach()
            old = inputs.get("old_per_token_logps", logps)
            masks = masks * self.get_off_policy_mask(
                advantages=advantages,
                per_token_logps=logps,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", old),
                mask=mask,
                off_policy_threshold=self.off_policy_mask_threshold,
            )
        return masks

    def _log_score_centering(self, inputs, token_metrics, mask, advantages, training: bool) -> None:
        mode = "train" if training else "eval"
        for key, value in batch_means(token_metrics, mask).items():
            self._metrics[mode][key].append(self.accelerator.gather(value).nanmean().item())
        if self._controller is None or not training:
            return
        upper = self._score_plan.bounds_at(self._adaptive_k)[1]
        counts = self._controller.counts_from_logprobs(
            self._loss_logps, inputs["sampling_per_token_logps"], advantages, mask, upper
        )
        self._controller.accumulate(self.accelerator.reduce(counts, reduction="sum"))
        if (
            self.accelerator.sync_gradients
        ):  # the step's last micro-batch: one controller step per optimizer step
            for key, value in self._controller.step_metrics().items():
                self._metrics[mode][key].append(value)

    # -- checkpoints ----------------------------------------------------------------------------------------
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self._controller is not None and self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            self._controller.save(folder)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if self._controller is not None and checkpoint is not None:
            self._controller.restore(checkpoint)
