"""The score-centering keys of a verl config, validated in the TaskRunner before any worker starts
(docs/reference/score-centering.md §5.5, §5.7, §5.8): every rejection names its key, in the trainer
constructor (what verl's TaskRunner calls before ``init()``) and end to end through ``python3 -m
verl.trainer.main_ppo``; ``auto`` reads the mode from ``algorithm.rollout_correction``; a valid config
registers the capturing replica and sets what the run needs."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.ppo.utils import need_critic, need_reference_policy  # noqa: E402
from verl.utils.config import validate_config  # noqa: E402
from verl.workers.rollout.replica import RolloutReplicaRegistry  # noqa: E402

from tests.verl_length_helpers import compose_verl, make_trainer, recipe_overrides  # noqa: E402
from tests.verl_score_centering_helpers import MODES, composed, with_overrides  # noqa: E402
from trl_length_plugin.recipes import RECIPES_DIR  # noqa: E402
from verl_adapter.score_centering.config import MANAGER_CLASS, resolve_settings  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECIPE = RECIPES_DIR / "verl" / "grpo_score_centering_qwen2.5-0.5b.sh"
TOKEN_IS = ["algorithm.rollout_correction.rollout_is=token"]
FORCE = ["+force_on_policy_ratio=true"]

BAD = [
    (["+score_centering_top_k=0"], "score_centering_top_k: required (>= 1)"),
    (["+score_centering_topk=3"], "score_centering_topk: unknown score-centering key (did you mean 'score_centering_top_k'?)"),
    (["+score_centering_importance_sampling=sis"], "score_centering_importance_sampling: Input should be"),
    (["+score_centering_adaptive_target=0.5"], "score_centering_adaptive_target: a key of the adaptive"),
    (["+score_centering_importance_sampling=adaptive-ppo-clip"], "adaptive-ppo-clip needs force_on_policy_ratio"),
    (MODES["adaptive-ppo-clip"] + ["+score_centering_adaptive_outer_bound=1.1"],
     "score_centering_adaptive_outer_bound: must be above hi = 1 + actor_rollout_ref.actor.clip_ratio_high = 1.2"),
    (MODES["adaptive-ppo-clip"] + ["actor_rollout_ref.actor.clip_ratio_low=1.5"],
     "actor_rollout_ref.actor.clip_ratio_low: adaptive-ppo-clip's lower bound lo = 1 - "),
    (MODES["adaptive-ppo-clip"] + ["actor_rollout_ref.actor.clip_ratio=1.5", "actor_rollout_ref.actor.clip_ratio_low=null"],
     "actor_rollout_ref.actor.clip_ratio: adaptive-ppo-clip's lower bound lo = 1 - "),
    (["actor_rollout_ref.actor.clip_ratio=null", "actor_rollout_ref.actor.clip_ratio_high=null"],
     "actor_rollout_ref.actor.clip_ratio: must be a finite number, got None"),
    (FORCE + ["actor_rollout_ref.actor.ppo_epochs=2"], "force_on_policy_ratio: needs one optimizer update"),
    (FORCE + ["actor_rollout_ref.actor.ppo_mini_batch_size=2"], "ppo_mini_batch_size=4 (data.train_batch_size"),
    (["actor_rollout_ref.rollout.name=sglang"], "actor_rollout_ref.rollout.name: score centering captures"),
    (["actor_rollout_ref.rollout.calculate_log_probs=false"], "actor_rollout_ref.rollout.calculate_log_probs"),
    (["actor_rollout_ref.rollout.disaggregation.enabled=true"], "actor_rollout_ref.rollout.disaggregation.enabled"),
    (["actor_rollout_ref.rollout.temperature=0"], "actor_rollout_ref.rollout.temperature: score centering needs"),
    (["actor_rollout_ref.rollout.top_p=0.9"], "actor_rollout_ref.rollout.top_p: sampling filters"),
    (["actor_rollout_ref.rollout.top_k=20"], "actor_rollout_ref.rollout.top_k: sampling filters"),
    (["actor_rollout_ref.rollout.logprobs_mode=raw_logprobs", "actor_rollout_ref.rollout.temperature=0.7"],
     "actor_rollout_ref.rollout.logprobs_mode"),
    (["actor_rollout_ref.rollout.logprobs_mode=processed_logits"], "actor_rollout_ref.rollout.logprobs_mode"),
    (["+actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs=2"],
     "actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs: 2 is below score_centering_top_k=4"),
    (["+actor_rollout_ref.rollout.agent.agent_loop_manager_class=my.Manager"],
     "actor_rollout_ref.rollout.agent.agent_loop_manager_class"),
    (["actor_rollout_ref.model.use_fused_kernels=true"], "actor_rollout_ref.model.use_fused_kernels"),
    (["actor_rollout_ref.actor.strategy=veomni"], "actor_rollout_ref.actor.strategy"),
    (["actor_rollout_ref.actor.pad_to_length=true"], "actor_rollout_ref.actor.pad_to_length"),
    (["distillation.enabled=true"], "distillation.enabled"),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean"], "actor_rollout_ref.actor.policy_loss.loss_mode"),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=score_centering"], "loss_mode: 'score_centering' is set by"),
    (["algorithm.rollout_correction.bypass_mode=true"], "algorithm.rollout_correction.bypass_mode"),
    (["algorithm.rollout_correction.rollout_rs=token_k1"], "algorithm.rollout_correction.rollout_rs"),
    (["algorithm.rollout_correction.rollout_is=sequence"], "algorithm.rollout_correction.rollout_is: 'sequence'"),
    (TOKEN_IS + ["algorithm.rollout_correction.rollout_is_batch_normalize=true"],
     "algorithm.rollout_correction.rollout_is_batch_normalize"),
    (TOKEN_IS + ["+score_centering_importance_sampling=off"], "score_centering_importance_sampling: 'off' leaves"),
    (TOKEN_IS + ["+score_centering_importance_sampling=is"], "score_centering_importance_sampling: 'is' writes"),
    (TOKEN_IS + FORCE + ["+score_centering_importance_sampling=adaptive-ppo-clip"],
     "'adaptive-ppo-clip' writes the sampled-token weights"),
    (TOKEN_IS + ["algorithm.rollout_correction.rollout_is_threshold='0.5_2.0'", "+score_centering_importance_sampling=tis"],
     "'tis' needs algorithm.rollout_correction.rollout_is=token with rollout_is_threshold a float"),
    (["+score_centering_importance_sampling=icepop"], "'icepop' needs algorithm.rollout_correction.rollout_is=token"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[m.split(":")[0][:60] for _, m in BAD])
def test_a_bad_config_fails_in_the_trainer_constructor_naming_the_key(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        make_trainer(with_overrides(overrides))
    assert "\n" not in str(err.value)


def test_keys_without_score_centering_are_refused():
    for key in ("+score_centering_top_k=4", "+force_on_policy_ratio=true"):
        with pytest.raises(ValueError, match=rf"{key[1:].split('=')[0]}: needs score_centering: true"):
            make_trainer([key])
    assert make_trainer(["+score_centering=false"]).score_centering is None


@pytest.mark.parametrize(
    ("overrides", "mode", "bounds"),
    [
        ([], "off", None),
        (TOKEN_IS, "tis", (0.0, 2.0)),  # verl's TIS: a float threshold clamps above only
        (TOKEN_IS + ["algorithm.rollout_correction.rollout_is_threshold=3"], "tis", (0.0, 3.0)),
        (TOKEN_IS + ["algorithm.rollout_correction.rollout_is_threshold='0.5_2.5'"], "icepop", (0.5, 2.5)),
        (["+score_centering_importance_sampling=is"], "is", None),
        (MODES["adaptive-ppo-clip"] + ["actor_rollout_ref.actor.clip_ratio_high=0.28"], "adaptive-ppo-clip", (0.8, 1.28)),
    ],
)  # fmt: skip
def test_auto_and_explicit_modes_follow_verls_rollout_correction(overrides, mode, bounds):
    settings = resolve_settings(composed(overrides))
    assert (settings.mode, settings.bounds) == (mode, bounds)
    kept = [o for o in overrides if not o.startswith("+score_centering_importance_sampling=")]
    explicit = resolve_settings(composed([*kept, f"+score_centering_importance_sampling={mode}"]))
    assert explicit == settings


def test_a_valid_config_registers_the_capturing_replica_and_sets_what_the_run_needs(vllm_for_verl, caplog):
    caplog.set_level(logging.INFO, logger="trl_length_plugin")
    trainer = make_trainer(with_overrides(MODES["tis"]))
    from verl_adapter.score_centering.server import ScoreCenteringVLLMReplica

    assert RolloutReplicaRegistry.get("vllm") is ScoreCenteringVLLMReplica
    rollout = trainer.config.actor_rollout_ref.rollout
    assert rollout.agent.agent_loop_manager_class == MANAGER_CLASS
    assert rollout.engine_kwargs.vllm.max_logprobs == 20  # vLLM's default, which admits K = 4
    assert trainer.score_centering.summary() in caplog.text
    assert (
        "score centering: K=4, mode tis in [0, 1.5], base loss vanilla; score_centering=true, " in caplog.text
    )
    assert "score_centering_top_k=4" in caplog.text  # the keys with their values (reference §3.4)
    assert trainer._score_centering_actor.policy_loss.loss_mode == "score_centering"
    assert trainer.score_centering_controller is None
    wide = make_trainer(with_overrides(MODES["off"] + ["+score_centering_top_k=64"]))
    assert wide.config.actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs == 64


def test_the_legacy_trainer_refuses_score_centering():
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    with pytest.raises(
        NotImplementedError, match=r"score centering needs verl's V1 trainer .*trainer\.use_v1=false"
    ):
        RayPPOTrainer(composed([]), tokenizer=None, role_worker_mapping={}, resource_pool_manager=None)


def test_the_recipe_composes_with_verls_config_and_passes_both_validations(tmp_path, vllm_for_verl):
    overrides = recipe_overrides(RECIPE, tmp_path)
    config = compose_verl(overrides)
    validate_config(
        config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    settings = resolve_settings(config)
    assert (settings.top_k, settings.mode, settings.bounds, settings.base_loss_mode) == (
        16,
        "tis",
        (0.0, 2.0),
        "vanilla",
    )
    assert config.trainer.n_gpus_per_node == 1 and config.actor_rollout_ref.rollout.n == 8
    assert make_trainer(overrides).score_centering == settings
    raw = OmegaConf.to_container(config.algorithm.rollout_correction)
    assert raw["rollout_is"] == "token" and raw["rollout_rs"] is None


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_bad_key_stops_main_ppo_before_workers(tmp_path, vllm_for_verl):
    """``python3 -m verl.trainer.main_ppo`` with the recipe and a sampling filter exits naming the key (this
    checkout first on ``PYTHONPATH``, so verl's Ray actors load its adapter)."""
    overrides = recipe_overrides(RECIPE, tmp_path) + [
        "actor_rollout_ref.rollout.top_p=0.9",
        "ray_kwargs.ray_init.num_cpus=2",
        "+ray_kwargs.ray_init.object_store_memory=200000000",
        "+ray_kwargs.ray_init.include_dashboard=False",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_DEDUP_LOGS": "0", "HYDRA_FULL_ERROR": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    out = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", *overrides],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    log = out.stdout + out.stderr
    assert out.returncode != 0
    assert "actor_rollout_ref.rollout.top_p: sampling filters need sampler replay" in log, log[-4000:]
    assert "create worker group" not in log and "actor and ref model engine initialized" not in log
