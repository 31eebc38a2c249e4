"""TRL side of LUSPO (docs/reference/luspo.md §4.3): the ``luspo: true`` defaults, and parity of the core ``luspo_loss``
with TRL 1.16's native ``loss_type="luspo"`` on real training steps of the embedded model."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

trl = pytest.importorskip("trl")

from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from trl_length_plugin.losses.luspo import luspo_loss  # noqa: E402
from trl_length_plugin.recipes import RECIPES_DIR  # noqa: E402
from trl_length_plugin.trl_integration.luspo import apply_luspo_defaults  # noqa: E402


def grpo_defaults(**changes):
    """A GRPOConfig-like object holding GRPOConfig's dataclass defaults of the four LUSPO fields."""
    names = ("loss_type", "importance_sampling_level", "epsilon", "epsilon_high")
    values = {f.name: f.default for f in dataclasses.fields(GRPOConfig) if f.name in names}
    return SimpleNamespace(**{**values, **changes})


def test_defaults_fill_every_unset_field():
    args = grpo_defaults()
    line = apply_luspo_defaults(args)
    assert (args.loss_type, args.importance_sampling_level) == ("luspo", "sequence")
    assert (args.epsilon, args.epsilon_high) == (2e-3, 2.5e-3)
    assert "(user)" not in line and "epsilon_high=0.0025" in line
    assert "\n" not in line


def test_user_values_are_kept_and_reported():
    args = grpo_defaults(epsilon=1e-3, epsilon_high=4e-3, loss_type="luspo")
    line = apply_luspo_defaults(args)
    assert (args.epsilon, args.epsilon_high, args.importance_sampling_level) == (1e-3, 4e-3, "sequence")
    assert "epsilon=0.001 (user)" in line and "epsilon_high=0.004 (user)" in line
    assert "loss_type='luspo' (user)" in line


def test_only_epsilon_set_keeps_it_and_fills_epsilon_high():
    args = grpo_defaults(epsilon=1e-3)
    apply_luspo_defaults(args)
    assert (args.epsilon, args.epsilon_high) == (1e-3, 2.5e-3)


def test_conflicting_loss_type_is_rejected():
    with pytest.raises(ValueError, match="loss_type='grpo'"):
        apply_luspo_defaults(grpo_defaults(loss_type="grpo"))


def test_importance_sampling_level_other_than_sequence_is_rejected():
    """LUSPO needs s_i (docs/reference/luspo.md §4.1); GRPOConfig's default ``token`` counts as not set and is replaced."""
    with pytest.raises(ValueError, match="importance_sampling_level='sequences'"):
        apply_luspo_defaults(grpo_defaults(importance_sampling_level="sequences"))
    args = grpo_defaults(importance_sampling_level="token")
    apply_luspo_defaults(args)
    assert args.importance_sampling_level == "sequence"


def test_runs_before_grpo_post_init(tmp_path):
    """On a real GRPOConfig subclass: applied before __post_init__, so epsilon_high is not copied from epsilon."""

    @dataclasses.dataclass
    class FlagConfig(GRPOConfig):
        luspo: bool = False

        def __post_init__(self):
            if self.luspo:
                apply_luspo_defaults(self)
            super().__post_init__()

    args = FlagConfig(output_dir=str(tmp_path), luspo=True, use_cpu=True, bf16=False, report_to="none")
    assert (args.loss_type, args.importance_sampling_level, args.epsilon, args.epsilon_high) == (
        "luspo",
        "sequence",
        2e-3,
        2.5e-3,
    )


class ParityTrainer(GRPOTrainer):
    """GRPOTrainer that, on every training micro-step, recomputes the loss with the core ``luspo_loss`` from the
    same per-token log-probs (same graph) and records both losses and their gradients w.r.t. those log-probs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records = []
        self._logps = None

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if torch.is_grad_enabled():
            self._logps = out[0]
        return out

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        logps = self._logps
        mask = inputs["completion_mask"]
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        core, metrics = luspo_loss(
            logps, old, inputs["advantages"], mask, self.epsilon_low, self.epsilon_high
        )
        if self.beta != 0.0:
            # docs/reference/luspo.md §4.1: per-token KL summed per sequence and divided by N_seq like the policy term
            # (TRL's k3 estimator with its default bias correction by the sequence ratio).
            ref = inputs["ref_per_token_logps"]
            seq_ratio = torch.exp(
                ((logps - old) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
            )
            kl = (torch.exp(ref - logps) - (ref - logps) - 1) * seq_ratio
            core = core + self.beta * (kl * mask).sum() / logps.shape[0]
        core = core / self.current_gradient_accumulation_steps
        self.records.append(
            {
                "trl": loss.item(),
                "core": core.item(),
                "trl_grad": torch.autograd.grad(loss, logps, retain_graph=True)[0],
                "core_grad": torch.autograd.grad(core, logps, retain_graph=True)[0],
                "clipped": (metrics["luspo/clip_frac_low"] + metrics["luspo/clip_frac_high"]).item(),
                "advantages": inputs["advantages"].abs().sum().item(),
            }
        )
        return loss


@pytest.mark.slow
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_core_equals_trl_native_luspo(tiny_model_dir, tmp_path, beta):
    from transformers import AutoModelForCausalLM

    from trl_length_plugin.embedded import correctness_reward, load_tokenizer, make_task_dataset

    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to="none",
        seed=0,
        loss_type="luspo",
        importance_sampling_level="sequence",
        epsilon=2e-3,
        epsilon_high=2.5e-3,
        beta=beta,
        learning_rate=3e-4,
        num_generations=4,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_iterations=2,
        max_steps=2,
        max_completion_length=40,
        temperature=1.0,
        logging_steps=1,
        save_strategy="no",
        gradient_checkpointing=False,
    )
    trainer = ParityTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        reward_funcs=correctness_reward,
        args=args,
        train_dataset=make_task_dataset(16, seed=1),
        processing_class=load_tokenizer(tiny_model_dir),
    )
    trainer.train()
    records = trainer.records
    assert len(records) == 4  # 2 optimizer steps x 2 accumulation micro-steps
    for r in records:
        assert r["core"] == pytest.approx(r["trl"], rel=1e-6, abs=1e-6)  # float32 model: |loss| ~ 8 here
        torch.testing.assert_close(r["core_grad"], r["trl_grad"], rtol=1e-5, atol=1e-7)
    # the second pass over the rollouts runs on an updated policy: ratios differ from 1 and some clip
    assert any(r["advantages"] > 0 and abs(r["trl"]) > 1e-4 for r in records)
    assert any(r["clipped"] > 0 for r in records[2:])


RECIPES = RECIPES_DIR / "trl"


def parse_recipe(name, *flags):
    from trl_length_plugin.trl_integration.cli import parse_args

    return parse_args(["--config", str(RECIPES / name), *flags])[1]


def test_gpu_recipes_are_twins_that_differ_only_in_the_loss():
    """Parsed with the plugin's CLI parser (bf16 off: this machine has no GPU)."""
    luspo, gspo = (parse_recipe(name, "--bf16", "false") for name in ("luspo.yaml", "gspo.yaml"))
    assert (luspo.loss_type, gspo.loss_type) == ("luspo", "grpo")
    for args in (luspo, gspo):
        assert (args.importance_sampling_level, args.epsilon, args.epsilon_high) == ("sequence", 2e-3, 2.5e-3)
        assert (args.learning_rate, args.num_generations, args.temperature, args.top_p) == (1e-6, 8, 1.0, 0.7)
    differing = {
        f.name
        for f in dataclasses.fields(luspo)
        if f.name not in ("output_dir", "logging_dir") and getattr(luspo, f.name) != getattr(gspo, f.name)
    }
    assert differing == {"loss_type", "luspo"}


@pytest.mark.slow
def test_cpu_recipe_trains_with_luspo(tmp_path):
    """One step of recipe luspo_cpu through the command line's parse_args and run."""
    from trl_length_plugin.trl_integration.cli import parse_args, run

    parsed = parse_args(
        ["--config", str(RECIPES / "luspo_cpu.yaml"), "--max_steps", "1", "--output_dir", str(tmp_path)]
    )
    trainer = run(*parsed)
    assert (trainer.loss_type, trainer.importance_sampling_level) == ("luspo", "sequence")
    assert (trainer.epsilon_low, trainer.epsilon_high) == (2e-3, 2.5e-3)
    assert trainer.state.global_step == 1
