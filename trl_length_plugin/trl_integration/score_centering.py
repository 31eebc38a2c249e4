"""Score centering in TRL's ``GRPOTrainer`` (docs/reference/score-centering.md §5).

:class:`ScoreCenteringMixin` is the trainer side, in front of ``GRPOTrainer``; it holds the core's
``ScoreCenteringRun`` of the plan ``score_centering_plan.resolve_plan`` resolved from the config at load time:

1. generation (``_generate``): the sampler's heads (``vllm_topk.TopkCapture``) padded to ``[B, T, K]``; TRL's
   sampled-token logprob is picked by id; under replay TRL's old-logprob pass is kept-set normalized too;
2. ``_generate_and_score_completions``: the heads join TRL's batch (its shuffle and micro-batch split carry
   them to the loss);
3. ``_compute_loss``: for ``is`` and ``adaptive-ppo-clip`` the sampled-token importance weights of the mode
   replace TRL's (from the batch's final advantages); the trainer's logprobs at the K ids come from the
   loss's own forward (``topk_head``); ``A * C`` is masked and normalized like the base loss
   (``loss_aggregation.aggregate``); C and the metrics of §5.6 from one head computation (the run's
   ``outputs``); the adaptive controller's counts, its step at each optimizer step, its state in checkpoints.

Every rule lives in the core (``trl_length_plugin.score_centering``); this module translates TRL's keys,
batch and hooks.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from trl_length_plugin.score_centering import ScoreCenteringRun
from trl_length_plugin.trl_integration import _host, vllm_topk
from trl_length_plugin.trl_integration.loss_aggregation import aggregate
from trl_length_plugin.trl_integration.score_centering_plan import ScoreCenteringPlan
from trl_length_plugin.trl_integration.topk_head import HeadRequest, install_topk_head

logger = logging.getLogger("trl_length_plugin")


@dataclass
class _CenteringStep:
    """Score centering's data between TRL's hooks (as length shaping's ``_ShapingStep``)."""

    heads: tuple[torch.Tensor, torch.Tensor] | None = None
    """The last generation's heads ``[B, T, K]``, from ``_generate`` to ``_generate_and_score_completions``."""
    generation_request: HeadRequest | None = None
    """Under replay, TRL's old-logprob pass of that generation (kept-set normalized like vLLM's)."""
    loss_request: HeadRequest | None = None
    """The micro-batch's heads while ``_compute_loss`` runs TRL's loss."""
    armed: HeadRequest | None = None
    """The request the top-k head serves in the running forward (None: TRL's head runs unchanged)."""
    topk: torch.Tensor | None = None
    """The loss forward's trainer logprobs at the K ids ``[B, T, K]``."""
    logps: torch.Tensor | None = None
    """The loss forward's sampled-token logprobs ``[B, T]``."""
    entropies: torch.Tensor | None = None
    """The loss forward's entropies ``[B, T]``."""


class ScoreCenteringMixin:
    """The trainer side of score centering; in front of ``GRPOTrainer`` in the MRO. ``_score_run`` is the
    core's run of the resolved plan (None: every hook passes through); ``_centering`` its per-step record."""

    _score_run: ScoreCenteringRun | None = None

    @property
    def _score_plan(self) -> ScoreCenteringPlan | None:
        """The run's resolved plan (None without score centering)."""
        return self._score_run.plan if self._score_run is not None else None

    # -- setup --------------------------------------------------------------------------------------------
    def _check_score_centering_inputs(self, model, args, kwargs: dict) -> None:
        """Before the model loads: the run of the resolved plan, and what the trainer's arguments and the
        model's config decide."""
        plan = args.score_centering_plan
        self._score_run = None if plan is None else ScoreCenteringRun(args.score_centering_config, plan)
        if self._score_run is None:
            return
        for name in ("tools", "environment_factory", "rollout_func"):
            if kwargs.get(name) is not None:
                raise ValueError(
                    f"score_centering: {name} is not supported (the sampler's head comes from vLLM)"
                )
        init_kwargs = args.model_init_kwargs if isinstance(args.model_init_kwargs, dict) else {}
        options = {key: init_kwargs[key] for key in ("revision", "trust_remote_code") if key in init_kwargs}
        self._score_run.check_vocabulary(model, **options)

    def _install_score_centering(self) -> None:
        """After ``GRPOTrainer.__init__``: capture, the top-k head, the server check, the settings line."""
        if self._score_plan is None:
            return
        from accelerate.utils import broadcast_object_list, is_peft_model

        _host.check_score_centering_host(self)
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
        self._centering = _CenteringStep()
        install_topk_head(target, lambda: self._centering.armed)
        self._score_run.announce(f" (vLLM {generation.mode})")

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
        step = self._centering
        step.heads = (ids.to(device), logprobs.to(device))
        if self._score_plan.replay:  # TRL's old logprobs must be kept-set normalized like vLLM's
            step.generation_request = HeadRequest(*step.heads, replay=True)
        return output

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self._score_plan is None:
            return output
        _host.check_score_centering_batch(output, self._score_plan.writes_weights)
        step = self._centering
        (ids, logprobs), step.heads, step.generation_request = step.heads, None, None
        if ids.shape[:2] != output["completion_ids"].shape:
            raise RuntimeError(
                f"score centering: heads {tuple(ids.shape)} for completions {tuple(output['completion_ids'].shape)}"
            )
        output["sampler_topk_ids"], output["sampler_topk_logprobs"] = ids, logprobs
        return output

    def _sampled_token_weights(self, inputs: dict) -> torch.Tensor:
        """The sampled-token weights of ``is`` / ``adaptive-ppo-clip`` from TRL's old and sampler logprobs (the
        ratio TRL computes, before its own truncation)."""
        advantages = inputs["advantages"]
        return self._score_run.sampled_token_weights(
            inputs["old_per_token_logps"],
            inputs["sampling_per_token_logps"],
            inputs["completion_mask"] * inputs.get("tool_mask", 1),
            advantages.unsqueeze(1) if advantages.dim() == 1 else advantages,
        )

    # -- the forward --------------------------------------------------------------------------------------
    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
    ):
        if self._score_plan is None:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        step = self._centering
        request = step.loss_request if kwargs.get("compute_entropy") else step.generation_request
        step.armed = request
        try:
            result = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        finally:
            step.armed = None
        if request is not None and request is step.loss_request:
            step.topk, step.logps, step.entropies = request.collect(), result[0], result[1]
        elif request is not None:
            request.collect()
        return result

    # -- the loss -----------------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        plan = self._score_plan
        if plan is None:
            return super()._compute_loss(model, inputs)
        _host.check_training_loop(self)
        self._centering.loss_request = HeadRequest(
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
            self._centering.loss_request = None
        return loss + self._centering_loss(inputs)

    def _centering_loss(self, inputs) -> torch.Tensor:
        """``A * C`` of this micro-batch with the base loss's masks and normalization; logs the metrics."""
        mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)
        advantages = inputs["advantages"]
        advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
        outputs = self._score_run.outputs(
            self._centering.topk,
            sampler_topk_logprobs=inputs["sampler_topk_logprobs"],
            token_mask=mask.bool(),
            advantages=advantages,
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
            masks = self.get_high_entropy_mask(self._centering.entropies, mask, 1 - self.top_entropy_quantile)
        if self.off_policy_mask_threshold is not None:
            logps = self._centering.logps.detach()
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
        mode, run = "train" if training else "eval", self._score_run
        for key, value in run.metrics(token_metrics, mask).items():
            self._metrics[mode][key].append(self.accelerator.gather(value).nanmean().item())
        if run.controller is None or not training:
            return
        counts = run.clip_counts(self._centering.logps, inputs["sampling_per_token_logps"], advantages, mask)
        run.accumulate(self.accelerator.reduce(counts, reduction="sum"))
        if (
            self.accelerator.sync_gradients
        ):  # the step's last micro-batch: one controller step per optimizer step
            for key, value in run.step_metrics().items():
                self._metrics[mode][key].append(value)

    # -- checkpoints ----------------------------------------------------------------------------------------
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self._score_run is not None and self.args.should_save:
            self._score_run.save(_host.checkpoint_folder(self, trial))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if self._score_run is not None and checkpoint is not None:
            self._score_run.resume(checkpoint)
