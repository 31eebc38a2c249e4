"""Score-centering and sampling values are refused at load, naming the key, whenever a later check would
refuse them (docs/reference/score-centering.md §5.2, §5.5, §5.7): the loss's bounds at every k the
adaptive controller can reach, K against the vocabulary and the engine's cap, vLLM's ranges for the sampling
filters, and no per-sequence importance ratio under score centering. One class at a time through the core,
``LengthPluginGRPOConfig``, the ``trl-length-grpo`` command and verl's composed config; then a hypothesis fuzz
per host: whatever a host accepts at load passes the core's loss-time checks, the controller, the capture
request rules and vLLM's own ``SamplingParams`` validation."""

from __future__ import annotations

import copy
import functools
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("verl")

from omegaconf import open_dict  # noqa: E402
from vllm import SamplingParams  # noqa: E402

from tests.test_trl_cli import BLOCKED  # noqa: E402
from tests.trl_length_helpers import MODES, K, sc_config, tiny_config  # noqa: E402
from tests.verl_score_centering_helpers import MODES as VERL_MODES  # noqa: E402
from tests.verl_score_centering_helpers import composed  # noqa: E402
from trl_length_plugin.embedded import correctness_reward  # noqa: E402
from trl_length_plugin.score_centering.config import (  # noqa: E402
    ScoreCenteringConfig,
    adaptive_ppo_clip_bounds,
    check_base_clip,
    check_engine_cap,
    check_is_bounds,
    sampling_filter_error,
)
from trl_length_plugin.score_centering.controller import AdaptiveClipController  # noqa: E402
from trl_length_plugin.score_centering.estimator import compute_score_centering_term  # noqa: E402
from trl_length_plugin.score_centering.sampling_request import validate_score_centering_request  # noqa: E402
from trl_length_plugin.trl_integration import LengthPluginGRPOTrainer  # noqa: E402
from trl_length_plugin.trl_integration.score_centering_plan import _sampling  # noqa: E402
from trl_length_plugin.trl_integration.vllm_topk import colocate_engine_kwargs  # noqa: E402
from verl_adapter.score_centering.config import (  # noqa: E402
    check_model_vocabulary,
    prepare_config,
    resolve_settings,
    score_centering_config,
)

NAN = math.nan
BIN = Path(sys.executable).parent
ADAPTIVE = MODES["adaptive-ppo-clip"]
FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))


# -- the core's rules ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("low", "high", "message"),
    [
        (-1.0, 3.0, "lo: the importance-sampling lower bound must be >= 0, got -1"),
        (NAN, 3.0, "lo: must be a finite number, got nan"),
        (0.0, 0.0, "hi: the importance-sampling upper bound must be above lo = 0, got 0"),
        (2.0, 1.0, "hi: the importance-sampling upper bound must be above lo = 2, got 1"),
        (0.0, math.inf, "hi: must be a finite number, got inf"),
    ],
)
def test_is_bounds_are_finite_with_lo_below_hi(low, high, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        check_is_bounds(low, high, "lo", "hi")
    assert check_is_bounds(0, 3, "lo", "hi") == (0.0, 3.0)


def test_adaptive_bounds_hold_at_the_lowest_reachable_k():
    """hi + k_min > lo: with k_min = -0.5 the controller would walk hi + k = 0.7 below lo = 0.8."""
    adaptive = dict(score_centering=True, score_centering_top_k=4, force_on_policy_ratio=True,
                    score_centering_importance_sampling="adaptive-ppo-clip")  # fmt: skip
    low_k = ScoreCenteringConfig(**adaptive, score_centering_adaptive_k_min=-0.5)
    with pytest.raises(
        ValueError, match=r"^score_centering_adaptive_k_min: .*hi = 1 \+ eh = 1.2, k_min = -0.5, lo"
    ):
        adaptive_ppo_clip_bounds(low_k, 0.2, 0.2, "e", "eh")
    plain = ScoreCenteringConfig(**adaptive)
    with pytest.raises(ValueError, match=r"^eh: adaptive-ppo-clip needs hi \+ k_min > lo"):
        adaptive_ppo_clip_bounds(plain, 0.2, -0.5, "e", "eh")
    with pytest.raises(ValueError, match="^e: must be a finite number, got nan"):
        adaptive_ppo_clip_bounds(plain, NAN, 0.2, "e", "eh")
    with pytest.raises(ValueError, match="^score_centering_adaptive_k_min: "):
        adaptive_ppo_clip_bounds(low_k, 0.2, 0.28, "e", "eh")  # 1.28 - 0.5 = 0.78 <= 0.8
    near = ScoreCenteringConfig(**adaptive, score_centering_adaptive_k_min=-0.39)
    bounds, outer = adaptive_ppo_clip_bounds(near, 0.2, 0.2, "e", "eh")  # 1.2 - 0.39 = 0.81 > 0.8
    assert bounds == pytest.approx((0.8, 1.2)) and outer == 10.0


def test_base_clip_keys_in_effect_are_set_finite_and_leave_a_range():
    """The clip keys in effect must be set (a null one is refused, naming it), finite, and leave a non-empty
    range [1 - low, 1 + high] except under adaptive-ppo-clip (whose rule is the bounds above)."""
    plain = ScoreCenteringConfig(score_centering=True, score_centering_top_k=4)
    check_base_clip(plain, {"lo": 0.2, "hi": None}, "lo", "lo")  # hi unset: lo serves both sides
    with pytest.raises(ValueError, match="^hi: must be a finite number, got None$"):
        check_base_clip(plain, {"lo": 0.2, "hi": None}, "lo", "hi")
    with pytest.raises(ValueError, match="^hi: must be a finite number, got nan$"):  # set, not in effect
        check_base_clip(plain, {"lo": 0.2, "hi": NAN}, "lo", "lo")
    empty = r"^hi: the base loss's clip range \[1 - lo, 1 \+ hi\] = \[0.8, 0.5\]"
    with pytest.raises(ValueError, match=empty):
        check_base_clip(plain, {"lo": 0.2, "hi": -0.5}, "lo", "hi")
    adaptive = ScoreCenteringConfig(score_centering=True, score_centering_top_k=4, force_on_policy_ratio=True,
                                    score_centering_importance_sampling="adaptive-ppo-clip")  # fmt: skip
    check_base_clip(adaptive, {"lo": 0.2, "hi": -0.5}, "lo", "hi")


@pytest.mark.parametrize(
    ("cap", "message"),
    [("many", "expected an integer \\(-1: no cap\\), got 'many'"), (True, "got True"), (2.5, "got 2.5"),
     (8, "8 is below score_centering_top_k=16")],
)  # fmt: skip
def test_engine_cap_is_an_integer_that_admits_k(cap, message):
    with pytest.raises(ValueError, match=f"^cap: .*{message}"):
        check_engine_cap(cap, 16, "cap")
    for fine in (None, -1, 16, 100):
        check_engine_cap(fine, 16, "cap")


@pytest.mark.parametrize(
    ("name", "bad", "good"),
    [
        ("top_p", [0, 0.0, 1.5, -0.1, NAN, math.inf, True, "0.9"], [1, 1.0, 0.5, 1e-9, None]),
        ("min_p", [-0.1, 1.5, NAN, True], [0, 0.0, 1.0, 0.05, None]),
        ("top_k", [2.5, 5.0, -2, NAN, True, "5"], [-1, 0, 1, 50, None]),  # vLLM: 0 and -1 are off
    ],
)
def test_sampling_filter_values_follow_vllms_ranges(name, bad, good):
    for value in bad:
        assert sampling_filter_error(name, value) is not None, value
        if not isinstance(value, bool):  # vLLM reads True as 1; a filter given as a boolean is a mistake
            with pytest.raises(Exception):  # noqa: B017 (vLLM's own validation error)
                SamplingParams(**{name: value})
    for value in good:
        assert sampling_filter_error(name, value) is None, value
        if value is not None:
            SamplingParams(**{name: value})


# -- TRL: LengthPluginGRPOConfig ----------------------------------------------------------------------------
TRL_BAD = {
    "importance-sampling values": [
        ({"vllm_importance_sampling_mode": "foo"}, "vllm_importance_sampling_mode: 'foo' is not one of"),
        ({"vllm_importance_sampling_mode": "Token_Truncate"}, "did you mean 'token_truncate'?"),
        ({"vllm_importance_sampling_clip_min": -1.0}, "vllm_importance_sampling_clip_min: the importance-sampling lower bound must be >= 0"),
        ({"vllm_importance_sampling_clip_min": NAN}, "vllm_importance_sampling_clip_min: must be a finite number"),
        ({"vllm_importance_sampling_clip_max": 0.0}, "vllm_importance_sampling_clip_max: the importance-sampling upper bound must be above"),
        ({"epsilon": NAN}, "epsilon: must be a finite number, got nan"),
        ({**ADAPTIVE, "epsilon": NAN}, "epsilon: must be a finite number, got nan"),
        ({**ADAPTIVE, "epsilon_high": -0.5}, "epsilon_high: adaptive-ppo-clip needs hi + k_min > lo"),
        ({"epsilon_high": -0.5}, "epsilon_high: the base loss's clip range [1 - epsilon, 1 + epsilon_high] = [0.8, 0.5] is empty"),
        ({**ADAPTIVE, "score_centering_adaptive_k_min": -0.5}, "score_centering_adaptive_k_min: adaptive-ppo-clip needs hi + k_min > lo"),
    ],
    "K": [
        ({"vllm_engine_kwargs": {"max_logprobs": "many"}}, "vllm_engine_kwargs.max_logprobs: expected an integer"),
        ({"vllm_engine_kwargs": {"max_logprobs": 8}}, "vllm_engine_kwargs.max_logprobs: 8 is below score_centering_top_k=16"),
    ],
    "sampling filters": [
        ({"top_p": 0.0}, "top_p: must be a finite number in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "top_p: must be a finite number in (0, 1]"),
        ({"top_p": NAN}, "top_p: must be a finite number in (0, 1], got nan"),
        ({"top_p": -0.5}, "top_p: must be a finite number in (0, 1]"),
        ({"min_p": 1.5}, "min_p: must be a finite number in [0, 1]"),
        ({"min_p": NAN}, "min_p: must be a finite number in [0, 1]"),
        ({"top_k": 2.5}, "top_k: must be a whole number: -1 or 0 (off) or >= 1, got 2.5"),
        ({"generation_kwargs": {"top_p": NAN}}, "generation_kwargs.top_p: must be a finite number in (0, 1]"),
        ({"generation_kwargs": {"top_k": 4.5}}, "generation_kwargs.top_k: must be a whole number"),
    ],
    "sequence-level ratio": [
        ({"importance_sampling_level": "sequence"}, "importance_sampling_level: 'sequence' uses a per-sequence importance ratio, which score_centering: true"),
        ({"luspo": True}, "luspo: true uses a per-sequence importance ratio"),
        ({"loss_type": "luspo", "importance_sampling_level": "sequence"}, "loss_type: 'luspo' uses a per-sequence"),
        ({"loss_type": "vespo"}, "loss_type: 'vespo' uses a per-sequence"),
    ],
}  # fmt: skip


@pytest.mark.parametrize("case", list(TRL_BAD))
def test_trl_config_refuses_each_class_naming_the_key(tmp_path, case):
    for overrides, message in TRL_BAD[case]:
        with pytest.raises(ValueError) as err:
            sc_config(tmp_path, **overrides)
        assert message in str(err.value) and "\n" not in str(err.value), (overrides, str(err.value))


def test_trl_sampling_filters_are_checked_without_score_centering_too(tmp_path):
    with pytest.raises(ValueError, match=r"^top_p: must be a finite number in \(0, 1\], got nan$"):
        tiny_config(tmp_path, top_p=NAN)
    with pytest.raises(ValueError, match=r"^generation_kwargs.min_p: must be a finite number in \[0, 1\]"):
        tiny_config(tmp_path, generation_kwargs={"min_p": -1.0})
    assert tiny_config(tmp_path, top_p=0.9, top_k=-1, min_p=0.1).score_centering_plan is None


def test_trl_accepts_the_edges_the_rules_allow(tmp_path):
    tis = sc_config(tmp_path, vllm_importance_sampling_clip_min=0.0, vllm_importance_sampling_clip_max=1e-3)
    assert tis.score_centering_plan.bounds == (0.0, 1e-3)
    adaptive = sc_config(tmp_path, **ADAPTIVE, score_centering_adaptive_k_min=-0.39,
                         score_centering_adaptive_k_init=0.0).score_centering_plan  # fmt: skip
    assert adaptive.bounds_at(-0.39)[1] - adaptive.bounds[0] == pytest.approx(0.01)
    assert sc_config(tmp_path, vllm_engine_kwargs={"max_logprobs": -1}).score_centering_plan.top_k == K
    assert (
        sc_config(tmp_path, epsilon=0.2, epsilon_high=-0.19).score_centering_plan.mode == "tis"
    )  # [0.8, 0.81]


def test_trl_top_k_above_the_vocabulary_is_refused_before_the_model_loads(tmp_path, random_model_dir):
    """The model's config.json alone decides: the error comes before any weights or engine (the dataset is
    never touched either: there is none)."""
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(random_model_dir).vocab_size
    args = sc_config(tmp_path, score_centering_top_k=vocab + 1, vllm_engine_kwargs={"max_logprobs": -1})
    with pytest.raises(
        ValueError, match=f"^score_centering_top_k: {vocab + 1} is above the model's vocabulary size {vocab}$"
    ):
        LengthPluginGRPOTrainer(model=str(random_model_dir), reward_funcs=[correctness_reward], args=args)


# -- TRL: the command line ----------------------------------------------------------------------------------
CLI_BAD = {
    "importance-sampling values": (["--vllm_importance_sampling_mode", "Token_Truncate"], "vllm_importance_sampling_mode: 'Token_Truncate'"),
    "K": (["--vllm_engine_kwargs", '{"max_logprobs": "many"}'], "vllm_engine_kwargs.max_logprobs: expected an integer"),
    "sampling filters": (["--top_p", "nan"], "top_p: must be a finite number in (0, 1], got nan"),
    "sequence-level ratio": (["--importance_sampling_level", "sequence"], "importance_sampling_level: 'sequence' uses a per-sequence"),
    "empty clip range": (["--epsilon_high", "-0.5"], "epsilon_high: the base loss's clip range [1 - epsilon, 1 + epsilon_high] = [0.8, 0.5] is empty"),
}  # fmt: skip


def test_cli_refuses_a_sampling_filter_before_trl_is_imported(tmp_path):
    """With TRL, torch and transformers unimportable (the value alone decides), flag and recipe alike."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("min_p: .nan\n")
    for argv, line in (
        (["--top_p", "1.5"], "top_p: must be a finite number in (0, 1], got 1.5"),
        (["--config", str(recipe)], "min_p: must be a finite number in [0, 1], got nan"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", BLOCKED, "grpo", *argv], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2 and done.stderr.strip() == f"trl-length-grpo: error: {line}", done.stderr[
            -2000:
        ]


@pytest.mark.parametrize("case", list(CLI_BAD))
def test_cli_refuses_each_class_in_one_line_before_the_model_loads(case, tmp_path):
    flags, fragment = CLI_BAD[case]
    command = [
        str(BIN / "trl-length-grpo"),
        "--config",
        "recipe:score_centering_cpu",
        "--output_dir",
        str(tmp_path),
    ]
    done = subprocess.run([*command, *flags], capture_output=True, text=True, timeout=300)
    errors = [line for line in done.stderr.splitlines() if line.startswith("trl-length-grpo: error: ")]
    assert done.returncode == 2 and len(errors) == 1 and fragment in errors[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and done.stderr.strip().endswith(errors[0])


# -- verl: the composed config ------------------------------------------------------------------------------
LOSS = "actor_rollout_ref.actor.policy_loss.loss_mode"
ROLLOUT = "actor_rollout_ref.rollout"
VERL_ADAPTIVE = VERL_MODES["adaptive-ppo-clip"]
VERL_BAD = {
    "importance-sampling values": [
        (VERL_ADAPTIVE + ["actor_rollout_ref.actor.clip_ratio_low=nan"], "actor_rollout_ref.actor.clip_ratio_low: must be a finite number, got nan"),
        (VERL_ADAPTIVE + ["actor_rollout_ref.actor.clip_ratio_high=-0.5"], "actor_rollout_ref.actor.clip_ratio_high: adaptive-ppo-clip needs hi + k_min > lo"),
        (VERL_ADAPTIVE + ["+score_centering_adaptive_k_min=-0.5"], "score_centering_adaptive_k_min: adaptive-ppo-clip needs hi + k_min > lo"),
        (["actor_rollout_ref.actor.clip_ratio_high=nan"], "actor_rollout_ref.actor.clip_ratio_high: must be a finite number"),
        (["actor_rollout_ref.actor.clip_ratio_high=-0.5"], "actor_rollout_ref.actor.clip_ratio_high: the base loss's clip range [1 - actor_rollout_ref.actor.clip_ratio_low, 1 + actor_rollout_ref.actor.clip_ratio_high] = [0.8, 0.5] is empty"),
        (VERL_MODES["icepop"][:1] + ["algorithm.rollout_correction.rollout_is_threshold='1.5_1.5'"],
         "algorithm.rollout_correction.rollout_is_threshold: the importance-sampling upper bound must be above"),
        (VERL_MODES["icepop"][:1] + ["algorithm.rollout_correction.rollout_is_threshold='nan_2'"],
         "algorithm.rollout_correction.rollout_is_threshold: must be a finite number, got nan"),
    ],
    "K": [
        (["+actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs=many"], f"{ROLLOUT}.engine_kwargs.vllm.max_logprobs: expected an integer"),
        (["+actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs=2"], f"{ROLLOUT}.engine_kwargs.vllm.max_logprobs: 2 is below score_centering_top_k=4"),
    ],
    "sampling filters": [
        ([f"{ROLLOUT}.top_p=0"], f"{ROLLOUT}.top_p: must be a finite number in (0, 1], got 0"),
        ([f"{ROLLOUT}.top_p=nan"], f"{ROLLOUT}.top_p: must be a finite number in (0, 1], got nan"),
        ([f"{ROLLOUT}.top_p=1.5"], f"{ROLLOUT}.top_p: must be a finite number in (0, 1]"),
        ([f"{ROLLOUT}.top_k=2.5"], f"{ROLLOUT}.top_k: must be a whole number"),
        ([f"{ROLLOUT}.val_kwargs.top_p=-1"], f"{ROLLOUT}.val_kwargs.top_p: must be a finite number in (0, 1]"),
        (["+score_centering=false", "+score_centering_top_k=0", f"{ROLLOUT}.top_p=nan"], f"{ROLLOUT}.top_p: must be a finite"),
    ],
    "sequence-level ratio": [
        ([f"{LOSS}=gspo"], f"{LOSS}: 'gspo' uses a per-sequence importance ratio, which score_centering: true"),
        ([f"{LOSS}=luspo"], f"{LOSS}: 'luspo' uses a per-sequence importance ratio"),
        ([f"{LOSS}=geo_mean"], f"{LOSS}: 'geo_mean' uses a per-sequence importance ratio"),
    ],
}  # fmt: skip


@pytest.mark.parametrize("case", list(VERL_BAD))
def test_verl_config_refuses_each_class_naming_the_key(case):
    for overrides, message in VERL_BAD[case]:
        with pytest.raises(ValueError) as err:
            resolve_settings(composed(overrides))
        assert message in str(err.value) and "\n" not in str(err.value), (overrides, str(err.value))


def test_verl_sequence_losses_run_without_score_centering():
    for mode in ("gspo", "luspo", "geo_mean"):
        assert (
            resolve_settings(
                composed(["+score_centering=false", "+score_centering_top_k=0", f"{LOSS}={mode}"])
            )
            is None
        )


def test_verl_top_k_above_the_vocabulary_is_refused_in_the_task_runner(random_model_dir):
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(random_model_dir).vocab_size
    path = f"actor_rollout_ref.model.path={random_model_dir}"
    config = composed([path, f"+score_centering_top_k={vocab + 1}"])
    with pytest.raises(
        ValueError, match=f"^score_centering_top_k: {vocab + 1} is above the model's vocabulary size {vocab}$"
    ):
        check_model_vocabulary(config, resolve_settings(config))
    config = composed([path, f"+score_centering_top_k={vocab}"])
    check_model_vocabulary(config, resolve_settings(config))


# -- fuzz: nothing accepted at load fails a later check -----------------------------------------------------
def numbers(*extra):
    """Floats and ints around the rules' edges, NaN and infinities included."""
    return st.one_of(
        st.sampled_from([0, 0.0, 1, 1.0, -1, -1.0, 0.5, 1.5, 2, 3.0, 1e-3, NAN, math.inf, -math.inf, *extra]),
        st.floats(-2, 4),
        st.integers(-2, 40),
    )


def later_checks(top_k: int, mode: str, bounds_at, outer, controller, sampling: dict, replay: bool) -> None:
    """What runs after load: vLLM's request validation, the capture rules, the controller and the loss at
    every reachable k (k_min, k_max, and where the controller steps from k_init)."""
    SamplingParams(**{name: value for name, value in sampling.items() if value is not None}, logprobs=top_k)
    validate_score_centering_request({"logprobs": top_k, **sampling}, top_k, sampler_replay=replay)
    reachable = [0.0]
    if controller is not None:
        reachable = [controller.k_min, controller.k_max, controller.k]
        for clipped in (1.0, 0.0, 0.0, 1.0):
            controller.accumulate(torch.tensor([clipped, 1.0]))
            controller.step()
            assert controller.k_min <= controller.k <= controller.k_max
            reachable.append(controller.k)
    logprobs = torch.log(torch.tensor([[[0.5, 0.25], [0.6, 0.1]]]))
    mask = torch.ones(1, 2, dtype=torch.bool)
    for k in reachable:
        compute_score_centering_term(
            logprobs.clone().requires_grad_(), sampler_topk_logprobs=logprobs, importance_sampling_mode=mode,
            is_bounds=bounds_at(k), token_mask=mask, sampler_replay=replay,
            adaptive_ppo_clip_advantages=torch.tensor([[1.0, -1.0]]), adaptive_ppo_clip_outer_bound=outer,
        )  # fmt: skip


ADAPTIVE_KEYS = st.fixed_dictionaries(
    {},
    optional={
        "score_centering_adaptive_k_min": numbers(-0.5),
        "score_centering_adaptive_k_max": numbers(),
        "score_centering_adaptive_k_init": numbers(),
        "score_centering_adaptive_outer_bound": numbers(10.0),
    },
)
SAMPLING = {"top_p": numbers(0.9), "min_p": numbers(0.05), "top_k": numbers(8, 16, 17)}


@FUZZ
@given(
    is_mode=st.sampled_from(["token_truncate", "token_mask", "sequence_mask", "Token_Mask", "foo"]),
    centering=st.sampled_from(["auto", "is", "tis", "icepop", "adaptive-ppo-clip"]),
    clip=st.fixed_dictionaries({}, optional={"vllm_importance_sampling_clip_min": st.one_of(st.none(), numbers()),
                                             "vllm_importance_sampling_clip_max": st.one_of(st.none(), numbers()),
                                             "epsilon": numbers(0.2), "epsilon_high": st.one_of(st.none(), numbers(0.28))}),
    adaptive=ADAPTIVE_KEYS,
    sampling=st.fixed_dictionaries({}, optional=SAMPLING),
    generation=st.fixed_dictionaries({}, optional=SAMPLING),
    cap=st.sampled_from([None, -1, 8, 16, 64, "many", 2.5]),
    level=st.sampled_from(["token", "sequence"]),
    centering_on=st.booleans(),
)  # fmt: skip
def test_fuzz_trl_accepts_only_what_the_later_checks_accept(
    tmp_path_factory, is_mode, centering, clip, adaptive, sampling, generation, cap, level, centering_on
):
    force = centering == "adaptive-ppo-clip"
    keys = dict(vllm_importance_sampling_mode=is_mode, score_centering_importance_sampling=centering,
                force_on_policy_ratio=force, importance_sampling_level=level, **clip, **adaptive, **sampling,
                generation_kwargs=generation or None)  # fmt: skip
    if cap is not None:
        keys["vllm_engine_kwargs"] = {"max_logprobs": cap}
    if not centering_on:
        keys = dict(sampling, generation_kwargs=generation or None, use_vllm=True)
    try:
        args = (sc_config if centering_on else tiny_config)(tmp_path_factory.getbasetemp(), **keys)
    except ValueError:  # refused at load (each class's message: the tests above)
        return
    plan = args.score_centering_plan
    effective = _sampling(args)
    if plan is None:
        SamplingParams(**{name: value for name, value in effective.items() if value is not None})
        return
    extra = colocate_engine_kwargs(args.vllm_engine_kwargs or {}, plan.top_k)
    assert extra.get("max_logprobs", 20) == -1 or extra.get("max_logprobs", 20) >= plan.top_k
    controller = AdaptiveClipController.from_config(args.score_centering_config) if force else None
    later_checks(plan.top_k, plan.mode, plan.bounds_at, plan.outer_bound, controller, effective, plan.replay)


@functools.cache
def verl_base():
    """The composed test config (built once; each example changes a copy)."""
    return composed([])


@FUZZ
@given(
    mode=st.sampled_from(["off", "is", "tis", "icepop", "adaptive-ppo-clip"]),
    threshold=st.sampled_from([1.5, 3, 0, -1, NAN, "0.8_1.25", "1.5_1.5", "2_1", "-1_2", "nan_2", "0_inf"]),
    clip=st.fixed_dictionaries({}, optional={name: st.one_of(st.none(), numbers(0.28))
                                             for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high")}),
    adaptive=ADAPTIVE_KEYS,
    rollout=st.fixed_dictionaries({}, optional={"top_p": numbers(0.9), "top_k": numbers(8)}),
    validation=st.fixed_dictionaries({}, optional={"top_p": numbers(0.9), "top_k": numbers(8)}),
    cap=st.sampled_from([None, -1, 2, 4, 64, "many", 2.5]),
    loss_mode=st.sampled_from(["vanilla", "gspo", "luspo", "geo_mean", "sapo", "cispo"]),
)  # fmt: skip
def test_fuzz_verl_accepts_only_what_the_later_checks_accept(
    mode, threshold, clip, adaptive, rollout, validation, cap, loss_mode
):
    config = copy.deepcopy(verl_base())
    actor, sampler = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    with open_dict(config):
        if mode in ("tis", "icepop"):
            config.algorithm.rollout_correction.rollout_is = "token"
            config.algorithm.rollout_correction.rollout_is_threshold = threshold
        else:
            config.score_centering_importance_sampling = mode
        if mode == "adaptive-ppo-clip":
            config.force_on_policy_ratio = True
        config.update(adaptive)
        actor.update(clip)
        actor.policy_loss.loss_mode = loss_mode
        sampler.update(rollout)
        sampler.val_kwargs.update(validation)
        if cap is not None:
            sampler.engine_kwargs.vllm.max_logprobs = cap
    try:
        settings_ = resolve_settings(config)
    except ValueError:  # refused at load (each class's message: the tests above)
        return
    for params in (sampler, sampler.val_kwargs):
        SamplingParams(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k)
    prepare_config(config, settings_)
    final_cap = sampler.engine_kwargs.vllm.max_logprobs
    assert isinstance(final_cap, int) and (final_cap == -1 or final_cap >= settings_.top_k)
    shared = score_centering_config(config)
    controller = AdaptiveClipController.from_config(shared) if settings_.mode == "adaptive-ppo-clip" else None
    sampling = {"temperature": sampler.temperature, "top_p": sampler.top_p, "top_k": sampler.top_k}
    later_checks(
        settings_.top_k,
        settings_.mode,
        settings_.bounds_at,
        settings_.outer_bound,
        controller,
        sampling,
        False,
    )
