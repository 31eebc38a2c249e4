"""Score centering's host-independent parts (docs/reference/score-centering.md §5): the shared config keys,
the sampled-token importance weights of each mode, the adaptive-ppo-clip controller, and the extractor for
listed (rank-less) server logprobs, against hand-computed values and the other extractors."""

from __future__ import annotations

import json
import math

import pytest
import torch
from pydantic import ValidationError

from trl_length_plugin.score_centering.capture import (
    ScoreCenteringCaptureError,
    extract_listed_score_centering_samples,
    extract_sampled_token_logprobs,
    extract_score_centering_samples,
)
from trl_length_plugin.score_centering.config import ScoreCenteringConfig
from trl_length_plugin.score_centering.controller import STATE_FILE, AdaptiveClipController
from trl_length_plugin.score_centering.estimator import sampled_token_weights


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"score_centering": True}, "score_centering_top_k: required"),
        ({"score_centering_top_k": 8}, "score_centering_top_k: needs score_centering: true"),
        ({"force_on_policy_ratio": True}, "force_on_policy_ratio: needs score_centering: true"),
        ({"score_centering": True, "score_centering_top_k": 2.5}, "score_centering_top_k"),
        ({"score_centering": True, "score_centering_top_k": True}, "score_centering_top_k"),
        ({"score_centering": True, "score_centering_top_k": 4, "score_centering_importance_sampling": "TIS"},
         "score_centering_importance_sampling"),
        ({"score_centering": True, "score_centering_top_k": 4, "score_centering_importance_sampling": "adaptive-ppo-clip"},
         "adaptive-ppo-clip needs force_on_policy_ratio"),
        ({"score_centering": True, "score_centering_top_k": 4, "score_centering_adaptive_target": 0.1},
         "score_centering_adaptive_target: a key of the adaptive-ppo-clip controller"),
        ({"score_centering": True, "score_centering_top_k": 4, "score_centering_importance_sampling": "adaptive-ppo-clip",
          "force_on_policy_ratio": True, "score_centering_adaptive_target": 1.0}, "score_centering_adaptive_target"),
        ({"score_centering": True, "score_centering_top_k": 4, "score_centering_importance_sampling": "adaptive-ppo-clip",
          "force_on_policy_ratio": True, "score_centering_adaptive_k_max": -1.0}, "score_centering_adaptive_k_max"),
        ({"score_centering": True, "score_centering_top_k": 4, "score_centering_importance_sampling": "adaptive-ppo-clip",
          "force_on_policy_ratio": True, "score_centering_adaptive_k_init": 2.0}, "score_centering_adaptive_k_init"),
        ({"score_centering": True, "score_centering_top_k": 4, "score_centering_importance_sampling": "adaptive-ppo-clip",
          "force_on_policy_ratio": True, "score_centering_adaptive_k_delta": math.nan}, "score_centering_adaptive_k_delta"),
    ],
)  # fmt: skip
def test_config_rejections_name_the_key(values, message):
    with pytest.raises(ValidationError, match=message):
        ScoreCenteringConfig.model_validate(values)


def test_sampled_token_weights_by_hand():
    ratio = torch.tensor([0.2, 0.9, 1.5, 4.0, 12.0])
    advantages = torch.tensor([-1.0, 1.0, 1.0, -1.0, 1.0])
    assert sampled_token_weights(ratio, "off").tolist() == [1.0] * 5
    assert sampled_token_weights(ratio, "is").tolist() == ratio.tolist()
    assert sampled_token_weights(ratio, "tis", (0.5, 2.0)).tolist() == pytest.approx(
        [0.5, 0.9, 1.5, 2.0, 2.0]
    )
    assert sampled_token_weights(ratio, "icepop", (0.5, 2.0)).tolist() == pytest.approx(
        [0.0, 0.9, 1.5, 0.0, 0.0]
    )
    # adaptive-ppo-clip: lo 0.8, hi + k = 1.3, outer 10: A < 0 keeps r >= lo, A > 0 keeps r <= hi + k, all r <= o
    kept = sampled_token_weights(ratio, "adaptive-ppo-clip", (0.8, 1.3), advantages, 10.0)
    assert kept.tolist() == pytest.approx([0.0, 0.9, 0.0, 4.0, 0.0])


def test_controller_steps_k_once_per_optimizer_step_within_its_bounds():
    controller = AdaptiveClipController(k=0.0, target=0.25, delta=0.1, k_min=0.0, k_max=0.15)
    ratio = torch.tensor([[1.0, 1.5, 2.5, 0.5]])
    advantages = torch.tensor([[1.0, 1.0, 1.0, -1.0]])
    counts = controller.counts(ratio, advantages, torch.ones(1, 4), upper=1.2)
    assert counts.tolist() == [2.0, 3.0]  # of the three A > 0 tokens, 1.5 and 2.5 exceed 1.2
    controller.accumulate(counts)
    controller.accumulate(torch.tensor([0.0, 1.0]))
    assert controller.step() == pytest.approx(0.5) and controller.k == pytest.approx(0.1)  # 0.5 > 0.25: up
    controller.accumulate(torch.tensor([3.0, 3.0]))
    controller.step()
    assert controller.k == pytest.approx(0.15)  # clamped at k_max
    controller.accumulate(torch.tensor([0.0, 4.0]))
    assert controller.step() == 0.0 and controller.k == pytest.approx(0.05)  # below target: down
    state = controller.state_dict()
    other = AdaptiveClipController(k=0.0, target=0.25, delta=0.1, k_min=0.0, k_max=0.15)
    other.load_state_dict(state)
    assert other == controller
    assert controller.step() == 0.0  # a step without positive tokens counts as below target


def test_controller_counts_from_logprobs_steps_its_metrics_and_restores(tmp_path, caplog):
    """The host-facing helpers: counts of the ratio exp(p - q) over the valid tokens, the step's metrics
    (f, then k after the step), and a checkpoint folder restored, or a warning when it holds no state."""
    controller = AdaptiveClipController(k=0.0, target=0.25, delta=0.1, k_min=0.0, k_max=0.15)
    sampler = torch.log(torch.tensor([[0.4, 0.2, 0.2, 0.5, 0.1]], dtype=torch.float64))
    logprobs = sampler + torch.log(torch.tensor([[1.0, 1.5, 2.5, 0.5, 9.0]], dtype=torch.float64))
    mask = torch.tensor([[1, 1, 1, 1, 0]])  # the last token (ratio 9, A > 0) is padding
    counts = controller.counts_from_logprobs(logprobs, sampler, torch.tensor([[1.0]]), mask, 1.2)
    assert counts.tolist() == [2.0, 4.0]  # A > 0 everywhere: 1.5 and 2.5 of the four valid tokens exceed 1.2
    controller.accumulate(counts)
    assert controller.step_metrics() == {
        "score_centering/adaptive_clip_frac": pytest.approx(0.5),
        "score_centering/adaptive_k": pytest.approx(0.1),
    }
    folder = tmp_path / "checkpoint-3"
    controller.save(str(folder))  # the folder is made
    fresh = AdaptiveClipController(k=0.0, target=0.25, delta=0.1, k_min=0.0, k_max=0.15)
    fresh.restore(str(folder))
    assert fresh == controller
    with caplog.at_level("WARNING", logger="trl_length_plugin"):
        AdaptiveClipController(k=0.0, target=0.25, delta=0.1, k_min=0.0, k_max=0.15).restore(str(tmp_path))
    assert "restarts from k_init" in caplog.text


class Entry:
    def __init__(self, logprob, rank):
        self.logprob, self.rank = logprob, rank


class Output:
    def __init__(self, token_ids, logprobs):
        self.token_ids, self.logprobs = token_ids, logprobs


def test_listed_extractor_equals_the_ranked_extractor():
    """The same positions as a completions response lists them (sampled token included, deduplicated, by
    descending logprob, no ranks) give the ranked extractor's head and the sampled token's logprob by id."""
    positions = [
        {3: Entry(-0.2, 1), 7: Entry(-2.5, 2), 9: Entry(-3.0, 3)},  # sampled 3 is in the head: K entries
        {5: Entry(-0.3, 1), 4: Entry(-1.6, 2), 8: Entry(-2.9, 3), 2: Entry(-4.0, 7)},  # sampled 2 outside
    ]
    sampled = [3, 2]
    ranked = Output(sampled, positions)
    ids, logprobs = extract_score_centering_samples(ranked, 3)
    listed = [sorted(p.items(), key=lambda item: -item[1].logprob) for p in positions]
    head_ids, head_logprobs, own = extract_listed_score_centering_samples(
        sampled, [[e.logprob for _, e in p] for p in listed], [[i for i, _ in p] for p in listed], 3
    )
    assert torch.equal(head_ids, ids) and torch.equal(head_logprobs, logprobs)
    assert torch.equal(own, extract_sampled_token_logprobs(ranked)) and own.tolist() == pytest.approx(
        [-0.2, -4.0]
    )


@pytest.mark.parametrize(
    ("sampled", "logprobs", "token_ids", "check"),
    [
        ([3], [[-0.1]], [[3]], "candidate_count"),
        ([3], [[-0.1, -1.0, -2.0]], [[5, 4, 6]], "sampled_token"),
        ([3], [[-0.1, -1.0, -2.0]], [[3, 4, 4]], "unique_ids"),
        ([3], [[-0.1, 0.5, -2.0]], [[3, 4, 6]], "logprob_max"),
        ([3, 4], [[-0.1, -1.0, -2.0]], [[3, 4, 6]], "generated_token_count"),
    ],
)
def test_listed_extractor_checks(sampled, logprobs, token_ids, check):
    with pytest.raises(ScoreCenteringCaptureError) as info:
        extract_listed_score_centering_samples(sampled, logprobs, token_ids, 2)
    assert info.value.check == check
    assert "of completion 5" in str(info.value.of_completion(5))


#: a controller's saved state
STATE = dict(k=0.1, target=0.25, delta=0.1, k_min=0.0, k_max=0.15, clipped=0.0, positive=0.0)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("{not json", "Expecting property name"),
        ("[]", "a controller state holds exactly"),
        ('{"k": 0.1}', "a controller state holds exactly"),
        (json.dumps({**STATE, "k": "0.1"}), "k must be a finite number, got '0.1'"),
        (json.dumps({**STATE, "delta": float("nan")}), "delta must be a finite number, got nan"),
        (json.dumps({**STATE, "k": 0.5}), "k=0.5 is outside [k_min, k_max] = [0.0, 0.15]"),
    ],
)
def test_a_corrupted_controller_state_is_one_line_and_never_half_taken(tmp_path, content, why):
    """Issue 42: a corrupted or malformed state file in a checkpoint gave a traceback on resume (a JSON error),
    or was taken as it was (a string k, unknown keys, k outside its bounds)."""
    (tmp_path / STATE_FILE).write_text(content)
    controller = AdaptiveClipController(**STATE)
    with pytest.raises(ValueError) as raised:
        controller.restore(str(tmp_path))
    message = str(raised.value)
    assert "\n" not in message and why in message
    assert message.startswith(
        f"score centering: the checkpoint's controller state {tmp_path / STATE_FILE} is unreadable"
    )
    assert controller == AdaptiveClipController(**STATE)
