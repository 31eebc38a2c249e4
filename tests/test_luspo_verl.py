"""verl policy loss ``luspo`` (docs/reference/luspo.md §4.1, §4.3) through verl 0.9.1's real registry, call site and config.

The actor config comes from the LUSPO recipe composed with verl's own Hydra config; the loss runs through the
worker-side ``verl.workers.utils.losses.ppo_loss`` on a TensorDict converted by verl's ``left_right_2_no_padding``
(the format the engine hands to the loss). Only the policy network is a stand-in (a tiny float64 token model in
place of the FSDP engine's forward, which needs a GPU); every verl part is real.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

verl = pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl.trainer.ppo.core_algos import get_policy_loss_fn  # noqa: E402
from verl.trainer.ppo.utils import need_critic, need_reference_policy  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass, validate_config  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding  # noqa: E402

import verl_adapter.luspo as adapter  # noqa: E402
from tests.verl_length_helpers import compose_verl, recipe_overrides  # noqa: E402
from trl_length_plugin.losses.luspo import luspo_loss  # noqa: E402
from trl_length_plugin.recipes import RECIPES_DIR  # noqa: E402

RECIPES = {name: RECIPES_DIR / "verl" / f"{name}_qwen2.5-0.5b.sh" for name in ("luspo", "gspo")}


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    return {
        name: compose_verl(recipe_overrides(script, tmp_path_factory.mktemp(name)))
        for name, script in RECIPES.items()
    }


def actor_config(composed_cfg, **changes):
    actor = OmegaConf.create(OmegaConf.to_container(composed_cfg.actor_rollout_ref.actor, resolve=True))
    for key, value in changes.items():
        OmegaConf.update(actor, key, value)
    return omega_conf_to_dataclass(actor)


def test_fresh_process_import_verl_registers_luspo():
    """The ``verl.plugins`` entry point makes ``luspo`` resolvable after a bare ``import verl``."""
    code = (
        "import importlib.metadata as md\n"
        "assert any(ep.value == 'verl_adapter.plugin' for ep in md.entry_points(group='verl.plugins'))\n"
        "import verl\n"
        "from verl.trainer.ppo.core_algos import get_policy_loss_fn\n"
        "print(get_policy_loss_fn('luspo').__module__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "verl_adapter.luspo"


@pytest.mark.filterwarnings("ignore:Disabled critic")
def test_recipes_compose_and_validate(composed):
    luspo = composed["luspo"]
    validate_config(luspo, use_reference_policy=need_reference_policy(luspo), use_critic=need_critic(luspo))
    actor = omega_conf_to_dataclass(luspo.actor_rollout_ref.actor)
    assert type(actor).__name__ == "FSDPActorConfig"
    assert actor.policy_loss.loss_mode == "luspo"
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (2e-3, 2.5e-3)
    assert actor.optim.lr == 1e-6
    rollout = luspo.actor_rollout_ref.rollout
    assert (rollout.n, rollout.temperature, rollout.top_p) == (8, 1.0, 0.7)
    assert luspo.trainer.n_gpus_per_node == 1
    assert get_policy_loss_fn(actor.policy_loss.loss_mode) is adapter.compute_policy_loss_luspo


def test_gspo_twin_differs_only_in_the_loss(composed):
    flat = {
        name: dict(_flatten(OmegaConf.to_container(cfg, resolve=False))) for name, cfg in composed.items()
    }
    differing = {key for key in flat["luspo"] if flat["luspo"][key] != flat["gspo"].get(key)}
    assert differing == {
        "actor_rollout_ref.actor.policy_loss.loss_mode",
        "actor_rollout_ref.actor.loss_agg_mode",
        "trainer.experiment_name",
    }
    assert flat["gspo"]["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-mean"


@pytest.mark.filterwarnings("ignore:Disabled critic")
def test_gspo_twin_validates_and_trains_with_its_own_aggregation(composed):
    """The GSPO twin as shipped (its ``seq-mean-token-mean``) passes verl's config checks and verl's own ``gspo``
    loss runs on it with the plugin installed: finite loss, finite non-zero gradients. (Its ``main_ppo`` run left
    the suite: it exercised no plugin code that the LUSPO run does not.)"""
    gspo = composed["gspo"]
    validate_config(gspo, use_reference_policy=need_reference_policy(gspo), use_critic=need_critic(gspo))
    config = actor_config(gspo)
    assert config.loss_agg_mode == "seq-mean-token-mean"
    assert get_policy_loss_fn(config.policy_loss.loss_mode) is not adapter.compute_policy_loss_luspo
    policy = TinyPolicy()
    loss, grads, _ = run_ppo_loss(config, policy, padded_batch(policy, seed=4), [[[0, 1, 2], [3, 4, 5]]])
    assert torch.isfinite(torch.tensor(loss))
    assert all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


def _flatten(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _flatten(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1], node


class TinyPolicy(torch.nn.Module):
    """Stand-in for the engine's forward: log p(token_{k+1} | token_k), float64, exact gradients."""

    def __init__(self, vocab=17, hidden=6):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab, hidden, dtype=torch.float64)
        self.head = torch.nn.Linear(hidden, vocab, dtype=torch.float64)

    def next_token_log_probs(self, current, following):
        log_probs = torch.log_softmax(self.head(torch.tanh(self.embed(current))), -1)
        return log_probs.gather(-1, following.unsqueeze(-1)).squeeze(-1)


PROMPT_LENS = [3, 1, 2, 3, 2, 1]
RESPONSE_LENS = [4, 1, 3, 2, 4, 3]


def padded_batch(policy, seed=0):
    """Left-padded prompts and right-padded responses, as verl's rollout produces them; old log-probs near the policy's."""
    g = torch.Generator().manual_seed(seed)
    batch, prompt_width, response_width = len(PROMPT_LENS), 3, 4
    prompts = torch.zeros(batch, prompt_width, dtype=torch.long)
    responses = torch.zeros(batch, response_width, dtype=torch.long)
    attention = torch.zeros(batch, prompt_width + response_width, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS, strict=True)):
        prompts[i, prompt_width - p :] = torch.randint(1, 17, (p,), generator=g)
        responses[i, :r] = torch.randint(1, 17, (r,), generator=g)
        attention[i, prompt_width - p : prompt_width + r] = 1
    response_mask = attention[:, prompt_width:]
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        previous = torch.cat([prompts[:, -1:], responses[:, :-1]], -1)
        old = policy.next_token_log_probs(previous, responses)
        old += 0.05 * torch.randn(batch, response_width, generator=g, dtype=torch.float64)
    advantages = torch.randn(batch, generator=g, dtype=torch.float64).unsqueeze(-1).expand(-1, response_width)
    weights = torch.rand(batch, response_width, generator=g, dtype=torch.float64) + 0.5
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], -1),
        "attention_mask": attention,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "old_log_probs": old,
        "advantages": advantages.contiguous(),
        "rollout_is_weights": weights,
    }


def worker_data(batch, rows, global_batch_size, dp_size, with_weights=False):
    """One rank's micro-batch in the engine's format, with the global numbers the engine assigns."""
    fields = {k: v[rows] for k, v in batch.items() if with_weights or k != "rollout_is_weights"}
    data = left_right_2_no_padding(TensorDict(fields, batch_size=[len(rows)]))
    tu.assign_non_tensor(
        data,
        dp_size=dp_size,
        global_batch_size=global_batch_size,
        batch_num_tokens=int(batch["response_mask"].sum()),
    )
    return data


def engine_forward(policy, data):
    """model_output['log_probs'] as the engine returns it: a nested tensor over the unpadded sequences."""
    ids = data["input_ids"]
    values = policy.next_token_log_probs(ids.values(), ids.values().roll(-1))
    return {"log_probs": torch.nested.nested_tensor_from_jagged(values, offsets=ids.offsets())}


def padded_log_probs(policy, batch, rows):
    previous = torch.cat([batch["prompts"][rows, -1:], batch["responses"][rows, :-1]], -1)
    return policy.next_token_log_probs(previous, batch["responses"][rows])


def run_ppo_loss(config, policy, batch, shards, dp_size=1, with_weights=False):
    """Sum of micro-batch losses per rank, gradients averaged over ranks (as verl's FSDP engine does)."""
    grads = [torch.zeros_like(p) for p in policy.parameters()]
    total, metrics = 0.0, None
    for rank_rows in shards:
        policy.zero_grad()
        for rows in rank_rows:
            data = worker_data(batch, rows, len(PROMPT_LENS), dp_size, with_weights)
            loss, metrics = ppo_loss(config, engine_forward(policy, data), data)
            loss.backward()
            total += loss.item() / dp_size
        for g, p in zip(grads, policy.parameters(), strict=True):
            g += p.grad / dp_size
    return total, grads, metrics


def core_reference(policy, batch, config, with_weights=False):
    rows = list(range(len(PROMPT_LENS)))
    policy.zero_grad()
    loss, _ = luspo_loss(
        padded_log_probs(policy, batch, rows),
        batch["old_log_probs"],
        batch["advantages"],
        batch["response_mask"],
        config.clip_ratio_low,
        config.clip_ratio_high,
        token_weights=batch["rollout_is_weights"] if with_weights else None,
    )
    loss.backward()
    return loss.item(), [p.grad.clone() for p in policy.parameters()]


def assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("with_weights", [False, True])
def test_worker_ppo_loss_equals_core(composed, with_weights):
    config = actor_config(composed["luspo"])
    policy = TinyPolicy()
    batch = padded_batch(policy)
    loss, grads, metrics = run_ppo_loss(config, policy, batch, [[list(range(6))]], with_weights=with_weights)
    ref_loss, ref_grads = core_reference(policy, batch, config, with_weights)
    assert loss == pytest.approx(ref_loss, rel=1e-10)
    assert_same(grads, ref_grads)
    assert metrics["actor/luspo_loss_agg_mode_ignored"].aggregate() == 0.0
    assert 0.0 < metrics["actor/pg_clipfrac"].aggregate() < 1.0  # the paper's clip range: both branches run


@pytest.mark.parametrize("with_weights", [False, True])
def test_equals_verl_gspo_with_seq_mean_token_sum(composed, with_weights):
    """LUSPO = GSPO's per-token losses under verl's own ``seq-mean-token-sum`` (docs/luspo.md), weights included."""
    policy = TinyPolicy()
    batch = padded_batch(policy, seed=1)
    luspo = actor_config(composed["luspo"])
    gspo = actor_config(composed["gspo"], loss_agg_mode="seq-mean-token-sum")
    shards = [[[0, 1, 2], [3, 4, 5]]]
    a_loss, a_grads, _ = run_ppo_loss(luspo, policy, batch, shards, with_weights=with_weights)
    b_loss, b_grads, _ = run_ppo_loss(gspo, policy, batch, shards, with_weights=with_weights)
    assert a_loss == pytest.approx(b_loss, rel=1e-10)
    assert_same(a_grads, b_grads)


def test_micro_batch_and_data_parallel_splits_match_full_batch(composed):
    config = actor_config(composed["luspo"])
    policy = TinyPolicy()
    batch = padded_batch(policy, seed=2)
    full_loss, full, _ = run_ppo_loss(config, policy, batch, [[list(range(6))]])
    micro_loss, micro, _ = run_ppo_loss(config, policy, batch, [[[0, 1], [2, 3], [4, 5]]])
    dp_loss, dp, _ = run_ppo_loss(config, policy, batch, [[[0, 4], [2]], [[5, 1], [3]]], dp_size=2)
    assert micro_loss == pytest.approx(full_loss, rel=1e-10)
    assert dp_loss == pytest.approx(full_loss, rel=1e-10)
    assert_same(micro, full)
    assert_same(dp, full)


def test_loss_agg_mode_is_ignored_and_reported_once(composed, caplog, monkeypatch):
    monkeypatch.setattr(adapter, "_reported_agg_modes", set())
    policy = TinyPolicy()
    batch = padded_batch(policy, seed=3)
    own = actor_config(composed["luspo"])
    token_mean = actor_config(composed["luspo"], loss_agg_mode="token-mean")
    with caplog.at_level(logging.WARNING, logger="trl_length_plugin"):
        a, a_grads, _ = run_ppo_loss(own, policy, batch, [[list(range(6))]])
        b, b_grads, metrics = run_ppo_loss(token_mean, policy, batch, [[[0, 1, 2], [3, 4, 5]]])
    assert a == pytest.approx(b, rel=1e-10)
    assert_same(a_grads, b_grads)
    assert metrics["actor/luspo_loss_agg_mode_ignored"].aggregate() == 1.0
    warnings = [r for r in caplog.records if "loss_agg_mode=token-mean is ignored" in r.getMessage()]
    assert len(warnings) == 1


def test_dp_without_global_batch_size_is_an_error():
    with pytest.raises(ValueError, match="global_batch_size"):
        adapter.local_num_sequences({"dp_size": 2, "global_batch_size": None})
    assert adapter.local_num_sequences({"dp_size": 4, "global_batch_size": 64}) == 16
    assert adapter.local_num_sequences({}) is None


def test_version_check_names_the_supported_version(monkeypatch):
    monkeypatch.setattr(verl, "__version__", "0.10.0")
    with pytest.raises(ImportError, match="0.9.1"):
        adapter.check_verl_api()


def test_kl_loss_needs_seq_mean_token_sum_at_startup(composed):
    """The V1 trainer (as verl's TaskRunner builds it, before any worker) refuses ``use_kl_loss`` with an
    aggregation other than LUSPO's: verl aggregates the KL term with ``actor.loss_agg_mode`` (docs/reference/luspo.md §4.1)."""
    from verl.trainer.ppo.v1 import get_trainer_cls

    config = OmegaConf.create(OmegaConf.to_container(composed["luspo"], resolve=False))
    OmegaConf.update(config, "actor_rollout_ref.actor.use_kl_loss", True)
    OmegaConf.update(config, "actor_rollout_ref.actor.loss_agg_mode", "token-mean")
    with pytest.raises(ValueError, match=r"use_kl_loss=true.*actor\.loss_agg_mode='seq-mean-token-sum'"):
        get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)


def test_kl_loss_aggregation_backstop_in_the_loss(composed):
    policy = TinyPolicy()
    batch = padded_batch(policy, seed=4)
    bad = actor_config(composed["luspo"], use_kl_loss=True, loss_agg_mode="token-mean")
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.loss_agg_mode"):
        run_ppo_loss(bad, policy, batch, [[list(range(6))]])
    adapter.check_kl_aggregation(True, "seq-mean-token-sum")
    adapter.check_kl_aggregation(False, "token-mean")
