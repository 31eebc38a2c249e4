"""docs/write-a-mode.md: an importance-sampling mode registered from outside the package is accepted by the
config, runs in the estimator with its own coefficients and sampled-token weights, is resolved against each
host's setting by what it declares (the plugin writes its weights where the host allows it), and leaves when
unregistered (docs/reference/score-centering.md §5.1, §5.5)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from trl_length_plugin.score_centering import (
    compute_score_centering_term,
    load_score_centering_config,
    resolve_mode,
    sampled_token_weights,
)
from trl_length_plugin.score_centering.modes import (
    ImportanceSampling,
    get_mode,
    mode_names,
    register_mode,
    unregister_mode,
)


# -- the toy mode: half-way between off and untruncated IS ------------------------------------------------
def half_coefficients(head, window):
    return (head.p + head.q) / 2, (1 + head.rho) / 2


def half_weights(ratio, window):
    return (1 + ratio) / 2


HALF = ImportanceSampling("half-is", half_coefficients, half_weights, written=True)


@pytest.fixture
def half_is():
    """The toy mode registered for one test; removed afterwards, so the other tests never see it."""
    register_mode(HALF)
    yield HALF
    unregister_mode(HALF.name)


def trl_args(**keys) -> SimpleNamespace:
    """TRL's importance-sampling and clip keys: the correction on in token_truncate (tis) in [0, 3]."""
    return SimpleNamespace(
        **{
            "vllm_importance_sampling_correction": True,
            "vllm_importance_sampling_mode": "token_truncate",
            "vllm_importance_sampling_clip_min": None,
            "vllm_importance_sampling_clip_max": 3.0,
            "epsilon": 0.2,
            "epsilon_high": None,
            **keys,
        }
    )


def config(mode: str):
    return load_score_centering_config(
        {"score_centering": True, "score_centering_top_k": 2, "score_centering_importance_sampling": mode}
    )


def test_the_config_accepts_a_registered_mode_and_only_while_it_is_registered(half_is):
    assert mode_names() == ("off", "is", "tis", "icepop", "adaptive-ppo-clip", "half-is")
    assert config("half-is").score_centering_importance_sampling == "half-is"
    with pytest.raises(ValueError, match="registered twice"):
        register_mode(HALF)
    unregister_mode("half-is")
    with pytest.raises(
        ValueError, match=r"score_centering_importance_sampling: Input should be 'auto', 'off', "
    ):
        config("half-is")
    register_mode(HALF)  # for the fixture's removal


def test_the_estimator_runs_the_modes_own_coefficients_and_weights(half_is):
    # q = (0.5, 0.25), p = (0.4, 0.4), rho = 1.25 (test_score_centering_estimator.py's hand case):
    # m = (0.45, 0.325), alpha = 1.125, m - alpha p = (0, -0.125), half-way between off's and is's
    lp = torch.tensor([[[math.log(0.4), math.log(0.4)]]], dtype=torch.float64, requires_grad=True)
    lq = torch.tensor([[[math.log(0.5), math.log(0.25)]]], dtype=torch.float64)
    out = compute_score_centering_term(
        lp,
        sampler_topk_logprobs=lq,
        importance_sampling_mode="half-is",
        is_bounds=None,
        token_mask=torch.ones(1, 1, dtype=torch.bool),
        sampler_replay=False,
    )
    assert out.correction.item() == pytest.approx(-0.125 * math.log(0.4), abs=1e-12)
    (grad,) = torch.autograd.grad(out.correction.sum(), lp)
    assert grad.flatten().tolist() == pytest.approx([0.0, -0.125], abs=1e-12)
    ratio = torch.tensor([0.5, 1.0, 3.0])
    assert sampled_token_weights(ratio, "half-is").tolist() == [0.75, 1.0, 2.0]


def test_each_host_resolves_it_by_what_it_declares(half_is):
    """A written mode runs where the host lets the plugin write the sampled-token weights (TRL with its
    correction on, verl with rollout_is off) and is refused, naming the host's key, where it does not."""
    from trl_length_plugin.trl_integration.score_centering_plan import _host_weights

    trl = trl_args()
    assert resolve_mode(config("half-is"), _host_weights(trl)) == ("half-is", None, None)
    off = trl_args(vllm_importance_sampling_correction=False)
    with pytest.raises(ValueError, match="'half-is' needs vllm_importance_sampling_correction: true"):
        resolve_mode(config("half-is"), _host_weights(off))


def test_verl_resolves_it_by_what_it_declares(half_is):
    from omegaconf import OmegaConf

    from verl_adapter.score_centering.config import _host_weights

    def verl(rollout_is):
        correction = {"rollout_is": rollout_is, "rollout_is_threshold": 2.0}
        return OmegaConf.create(
            {
                "algorithm": {"rollout_correction": correction},
                "actor_rollout_ref": {"actor": {"clip_ratio": 0.2}},
            }
        )

    assert resolve_mode(config("half-is"), _host_weights(verl(None))) == ("half-is", None, None)
    with pytest.raises(
        ValueError, match="'half-is' writes the sampled-token weights; set algorithm.rollout_corr"
    ):
        resolve_mode(config("half-is"), _host_weights(verl("token")))


def test_a_mode_the_host_does_not_compute_and_the_plugin_does_not_write_is_refused_by_name(half_is):
    from trl_length_plugin.trl_integration.score_centering_plan import _host_weights

    unregister_mode("half-is")
    register_mode(ImportanceSampling("host-only", half_coefficients, half_weights, bounds="host"))
    try:
        trl = trl_args()
        with pytest.raises(
            ValueError, match="'host-only' is not a mode of TRL's vllm_importance_sampling_mode"
        ):
            resolve_mode(config("host-only"), _host_weights(trl))
        assert get_mode("host-only").bounds == "host"
    finally:
        unregister_mode("host-only")
        register_mode(HALF)


@pytest.mark.parametrize(
    ("declarations", "error"),
    [
        (dict(controller=True), "clip bounds go with the adaptive controller"),
        (dict(bounds="clip"), "clip bounds go with the adaptive controller"),
        (dict(bounds="host", written=True), "the host's bound keys belong to its own weights"),
    ],
)
def test_declarations_that_cannot_run_are_refused_at_registration(declarations, error):
    with pytest.raises(ValueError, match=error):
        register_mode(ImportanceSampling("bad", half_coefficients, half_weights, **declarations))
    with pytest.raises(ValueError, match="'auto' is reserved"):
        register_mode(ImportanceSampling("auto", half_coefficients, half_weights))
    assert "bad" not in mode_names() and "auto" not in mode_names()


def test_every_list_of_the_modes_in_the_docs_is_the_registrys():
    """A line of the docs that lists the modes (it names the first and the last, `off` and `adaptive-ppo-clip`)
    names every registered mode, in the registry's order."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    lines = [
        line
        for page in [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]
        for line in page.read_text().splitlines()
        if "`off`" in line and "`adaptive-ppo-clip`" in line
    ]
    assert len(lines) >= 3
    for line in lines:
        assert [name for name in re.findall(r"`([\w-]+)`", line) if name in mode_names()] == list(
            mode_names()
        )


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        (
            ImportanceSampling("", half_coefficients, half_weights),
            "a name is needed (a non-empty string), got ''",
        ),
        (ImportanceSampling("  ", half_coefficients, half_weights), "a name is needed"),
        (
            ImportanceSampling("no-fn", None, half_weights),
            "'no-fn': its coefficients and weights must be functions",
        ),
        (
            ImportanceSampling("no-fn", half_coefficients, None),
            "'no-fn': its coefficients and weights must be",
        ),
        (
            ImportanceSampling("odd", half_coefficients, half_weights, bounds="clamp"),
            "'odd': bounds must be one of ('none', 'host', 'clip'), got 'clamp'",
        ),
    ],
)
def test_a_mode_that_cannot_run_is_refused_at_registration(mode, message):
    """Issue 42: a mode with no name, no functions or an unknown bounds kind was registered and failed later,
    in the middle of a step (or never resolved)."""
    before = mode_names()
    with pytest.raises(ValueError) as refused:
        register_mode(mode)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert mode_names() == before


def test_the_packages_own_modes_cannot_be_unregistered():
    """Issue 42: ``unregister_mode`` removed a built-in mode, which the config, the hosts and their checks name."""
    for name in ("tis", "adaptive-ppo-clip"):
        with pytest.raises(
            ValueError, match=f"'{name}' is one of the package's own; it cannot be unregistered"
        ):
            unregister_mode(name)
        assert get_mode(name).name == name
    with pytest.raises(ValueError, match="'half-is' is not registered; registered: "):
        unregister_mode("half-is")
