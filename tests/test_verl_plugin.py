"""verl finds and validates the length shaping on its own (docs/reference/product.md §1.3, §2.1, §3).

- In a fresh process a bare ``import verl`` registers everything, through the ``verl.plugins`` entry point.
- The recipes under ``recipes/verl/`` compose with verl's own Hydra config, pass verl's config
  validation and the trainer's startup validation.
- A bad length-shaping config fails when the trainer starts, naming the key: in the trainer constructor
  (what verl's TaskRunner calls before it launches any worker), and end to end through
  ``python3 -m verl.trainer.main_ppo`` on a local Ray (the run stops before workers are created; no GPU,
  model or data is needed to get there).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

from tests.verl_length_helpers import compose_verl, make_trainer, recipe_overrides
from trl_length_plugin.recipes import RECIPES_DIR
from verl_adapter.length_shaping.advantage import compute_length_grpo_advantage
from verl_adapter.length_shaping.config import shaping_config
from verl_adapter.length_shaping.filter import ShapedReplayBuffer

RECIPES = RECIPES_DIR / "verl"
PENALTY_RECIPE = RECIPES / "grpo_length_penalty_qwen2.5-0.5b.sh"
COEFF_RECIPE = RECIPES / "grpo_length_coeff_qwen2.5-0.5b.sh"


def test_fresh_process_import_verl_registers_everything():
    code = (
        "import verl\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
        "from verl_adapter.plugin import LOAD_ERRORS\n"
        "from verl_adapter.length_shaping.trainer import LengthShapingMixin\n"
        "assert not LOAD_ERRORS, LOAD_ERRORS\n"
        "modes = ('sync', 'colocate_async', 'separate_async')\n"
        "assert all(issubclass(get_trainer_cls(m), LengthShapingMixin) for m in modes)\n"
        "print(get_adv_estimator_fn('length_grpo').__module__)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "verl_adapter.length_shaping.advantage"


def test_penalty_recipe_composes_and_validates(tmp_path):
    config = compose_verl(recipe_overrides(PENALTY_RECIPE, tmp_path))
    validate_config(
        config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    settings = shaping_config(config)
    assert settings.penalties_on and not settings.coefficient_on
    assert settings.penalties.default.group_total_length_penalty_coeff == 0.1
    assert config.actor_rollout_ref.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert config.trainer.n_gpus_per_node == 1
    assert make_trainer(recipe_overrides(PENALTY_RECIPE, tmp_path)).length_shaping == settings


def test_coefficient_recipe_composes_and_validates(tmp_path):
    overrides = recipe_overrides(COEFF_RECIPE, tmp_path)
    config = compose_verl(overrides)
    validate_config(
        config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    settings = shaping_config(config)
    assert (settings.length_penalty_coeff, settings.length_penalty_min_tokens, settings.penalties_on) == (
        0.5,
        64,
        False,
    )
    assert get_adv_estimator_fn(config.algorithm.adv_estimator) is compute_length_grpo_advantage
    assert isinstance(make_trainer(overrides).replay_buffer, ShapedReplayBuffer)


@pytest.mark.parametrize(
    "overrides",
    [
        ["+length_penalty.default.enabled=true", "+length_penalty.default.total_bonus=0.1"],
        ["+length_penalty={default: {enabled: true, total_bonus: 0.1}}"],
    ],
)
def test_hydra_block_forms(overrides):
    settings = shaping_config(compose_verl(overrides))
    assert settings.penalties_on and settings.penalties.default.total_bonus == 0.1


BAD = [
    (["+length_penalty.default.top_percentile=2"], "length_penalty.default.top_percentile"),
    (["+length_penalty.default.lenght_type=tokens"], "length_penalty.default.lenght_type"),
    (["+length_penalty.default.length_type=words"], "length_penalty.default.length_type"),
    (
        ["+length_penalty.profile_band.defaults.total={a: 5, b: 5, f: 0.5}"],
        "length_penalty.profile_band.defaults.total",
    ),
    (["+length_penalty=/no/such/length_penalty.yaml"], "length_penalty: '/no/such"),
    (["+length_penalty=3"], "length_penalty: expected a mapping"),
    (
        ["+length_penalty_coef=1.0"],
        "length_penalty_coef: unknown length-shaping key (did you mean 'length_penalty_coeff'?)",
    ),
    (
        ["+length_penalty_coeff=-1", "algorithm.adv_estimator=length_grpo"],
        "length_penalty_coeff: Input should be greater",
    ),
    (
        ["+length_penalty_min_tokens=1.5", "+length_penalty_coeff=1", "algorithm.adv_estimator=length_grpo"],
        "length_penalty_min_tokens: Input should be a valid integer",
    ),
    (
        ["+length_penalty_coeff=nan", "algorithm.adv_estimator=length_grpo"],
        "length_penalty_coeff: Input should be a finite",
    ),
    (
        ["+length_penalty_coeff=inf", "algorithm.adv_estimator=length_grpo"],
        "length_penalty_coeff: Input should be a finite",
    ),
    (
        ["+length_penalty_coeff_warmup_steps=5"],
        "length_penalty_coeff_warmup_steps: needs length_penalty_coeff > 0",
    ),
    (["+drop_zero_std_groups=true"], "drop_zero_std_groups: in verl use algorithm.filter_groups"),
    (
        ["+length_penalty_log_rollouts=maybe"],
        "length_penalty_log_rollouts: must be true or false, got 'maybe'",
    ),
    (
        ["+length_penalty_log_rollout=true"],
        "length_penalty_log_rollout: unknown length-shaping key (did you mean 'length_penalty_log_rollouts'?)",
    ),
    (["+length_penalty_coeff=1.0"], "algorithm.adv_estimator: length_penalty_coeff > 0 goes with"),
    (["algorithm.adv_estimator=length_grpo"], "algorithm.adv_estimator: length_penalty_coeff > 0 goes with"),
    (
        ["+length_penalty.default.total_bonus=0.1", "algorithm.adv_estimator=gdpo"],
        "algorithm.adv_estimator: gdpo",
    ),
    (
        ["+length_penalty.default.total_bonus=0.1", "algorithm.filter_groups.enable=true"]
        + ["actor_rollout_ref.rollout.n=1"],
        "actor_rollout_ref.rollout.n",
    ),
]


def test_per_rollout_lines_are_behind_the_trl_key():
    """One ``Length penalty:`` summary line per step by default; ``+length_penalty_log_rollouts=true`` (TRL's
    key) switches to one line per rollout (reference §3.4; the lines themselves: test_verl_shaping.py)."""
    coeff = ["+length_penalty_coeff=0.5", "algorithm.adv_estimator=length_grpo"]
    assert make_trainer(coeff).length_log_rollouts is False
    assert make_trainer([*coeff, "+length_penalty_log_rollouts=true"]).length_log_rollouts is True


@pytest.mark.parametrize(("overrides", "key"), BAD, ids=[key for _, key in BAD])
def test_bad_config_fails_in_the_trainer_constructor(overrides, key):
    with pytest.raises(ValueError, match=re.escape(key)):
        make_trainer(overrides)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_bad_block_stops_main_ppo_before_workers(tmp_path):
    """``python3 -m verl.trainer.main_ppo`` with the penalty recipe and a bad key exits with the key path."""
    overrides = recipe_overrides(PENALTY_RECIPE, tmp_path) + [
        "+length_penalty.default.top_percentile=2",
        "ray_kwargs.ray_init.num_cpus=2",
        "+ray_kwargs.ray_init.object_store_memory=200000000",
        "+ray_kwargs.ray_init.include_dashboard=False",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_DEDUP_LOGS": "0"}
    out = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", *overrides],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    log = out.stdout + out.stderr
    assert out.returncode != 0
    assert "length_penalty.default.top_percentile: Input should be less than or equal to 1" in log
    assert "create worker group" not in log and "actor and ref model engine initialized" not in log


def test_length_grpo_refuses_to_run_outside_the_length_shaping_trainer():
    """The legacy ``RayPPOTrainer`` dispatch (``ray_trainer.compute_advantage``) never shapes: it must not
    silently normalize unshaped rewards with the coefficient's rule."""
    data = DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
            "response_mask": torch.ones(2, 2),
        },
        non_tensors={"uid": np.array(["a", "a"], dtype=object)},
    )
    config = compose_verl(["algorithm.adv_estimator=length_grpo"]).algorithm
    with pytest.raises(RuntimeError, match="legacy RayPPOTrainer"):
        compute_advantage(data, adv_estimator="length_grpo", config=config)


def test_a_changed_verl_fails_with_a_clear_message(monkeypatch):
    import verl
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    import verl_adapter.length_shaping.register as length_shaping

    monkeypatch.setattr(verl, "__version__", "0.10.2")
    with pytest.raises(ImportError, match=r"supports verl >=0\.9\.1,<0\.10 .* found verl 0\.10\.2"):
        length_shaping.check_verl_hooks()
    monkeypatch.setattr(verl, "__version__", "0.9.1")
    monkeypatch.setattr(ReplayBuffer, "_dapo_filtered_keys", lambda self, partition_id, refill: None)
    with pytest.raises(
        ImportError, match=r"hooks used for length shaping changed \(ReplayBuffer\._dapo_filtered_keys\)"
    ):
        length_shaping.check_verl_hooks()


def test_legacy_trainer_refuses_length_shaping():
    """The legacy ``RayPPOTrainer`` has no group hook: a run that enables shaping there fails at once."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    config = compose_verl(["+length_penalty.default.group_total_length_penalty_coeff=0.1"])
    with pytest.raises(NotImplementedError, match=r"trainer\.use_v1=false"):
        RayPPOTrainer(config, tokenizer=None, role_worker_mapping={}, resource_pool_manager=None)
    plain = compose_verl([])
    with pytest.raises(
        Exception
    ) as err:  # no shaping: verl's own constructor runs (and fails on the dummies)
        RayPPOTrainer(plain, tokenizer=None, role_worker_mapping={}, resource_pool_manager=None)
    assert not isinstance(err.value, NotImplementedError)


FAIL_CLOSED = """
import sys
sys.modules["verl_adapter.length_shaping.register"] = None  # its import fails, as a broken install would
import verl
from hydra import compose, initialize_config_dir
from pathlib import Path
from verl.trainer.ppo.v1 import get_trainer_cls
from verl_adapter.plugin import LOAD_ERRORS
assert "verl_adapter.length_shaping.register" in LOAD_ERRORS
with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
    shaped = compose(config_name="ppo_trainer", overrides=sys.argv[1:])
try:
    get_trainer_cls(shaped.trainer.v1.trainer_mode)(config=shaped)
except RuntimeError as err:
    print("REFUSED", err)
"""


@pytest.mark.parametrize(
    "overrides",
    [
        ["+length_penalty.default.total_bonus=0.1"],
        ["+length_penalty_coeff=1.0", "algorithm.adv_estimator=length_grpo"],
        ["actor_rollout_ref.actor.policy_loss.loss_mode=luspo"],
    ],
)
def test_a_failed_load_fails_closed(overrides):
    """If the adapter cannot load, verl's trainers refuse (in the TaskRunner, before workers) a config that
    needs it, naming the load error, instead of training on raw rewards."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", FAIL_CLOSED, *overrides], capture_output=True, text=True, timeout=180, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REFUSED the config uses" in out.stdout and "failed to load into verl" in out.stdout
    assert "verl_adapter.length_shaping.register" in out.stdout
