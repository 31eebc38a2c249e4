"""The TRL host contract (trl_integration/_host.py): every internal the integration touches is checked and
fails closed with a clear message when TRL differs (simulated by patching TRL), and every TRL behaviour the
integration re-derives equals TRL's own result on real training steps of the embedded model."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomllib
import torch
from trl import GRPOTrainer

from tests.trl_length_helpers import RecordingTrainer, deterministic_rollout, tiny_config
from trl_length_plugin.embedded import correctness_reward, load_tokenizer, make_task_dataset
from trl_length_plugin.trl_integration import _host as host
from trl_length_plugin.trl_integration.length_shaping import reward_name


def test_generate_output_check():
    ids = [[5, 6, 7], [8]]
    host.check_generate_output(("p", ids, [[1, 1, 0], [1]], "c", None, {}, None, []))
    host.check_generate_output(("p", ids, None, "c", None, {}, None, []))
    with pytest.raises(host.TRLHostError, match="expected the tuple"):
        host.check_generate_output(("p", ids, None, "c", None, {}, None))
    with pytest.raises(host.TRLHostError, match="element 2 is no longer the tool mask"):
        host.check_generate_output(("p", ids, ["text a", "text b"], [[1, 1, 0], [1]], None, {}, None, []))


def test_scored_output_check():
    host.check_scored_output({"completion_mask": 0, "advantages": torch.zeros(4), "num_items_in_batch": 1}, 4)
    with pytest.raises(host.TRLHostError, match="no longer returns \\['num_items_in_batch'\\]"):
        host.check_scored_output({"completion_mask": 0, "advantages": torch.zeros(4)}, 4)
    with pytest.raises(host.TRLHostError, match="shape \\(4, 1\\)"):
        host.check_scored_output(
            {"completion_mask": 0, "advantages": torch.zeros(4, 1), "num_items_in_batch": 1}, 4
        )


def test_logged_advantages_are_replaced_not_appended():
    logs = deque([0.1, 0.2, 0.3, 0.4], maxlen=8)
    host.replace_logged(logs, [1.0, 2.0])
    assert list(logs) == [0.1, 0.2, 1.0, 2.0]
    with pytest.raises(host.TRLHostError, match="holds 4 entries after a batch of 6"):
        host.replace_logged(logs, [0.0] * 6)


def test_trainer_attributes_check():
    complete = {name: None for name in host.TRAINER_ATTRIBUTES}
    complete.update(_metrics={"train": {}, "eval": {}}, _logs={"advantages": deque()})
    host.check_trainer_attributes(SimpleNamespace(**complete))
    with pytest.raises(host.TRLHostError, match="no longer sets \\['eos_token_ids'\\]"):
        host.check_trainer_attributes(
            SimpleNamespace(**{k: v for k, v in complete.items() if k != "eos_token_ids"})
        )
    with pytest.raises(host.TRLHostError, match="_logs\\['advantages'\\] is no longer a deque"):
        host.check_trainer_attributes(SimpleNamespace(**{**complete, "_logs": {"advantages": []}}))


def test_score_centering_batch_and_training_loop_checks():
    full = {key: None for key in host.SCORE_CENTERING_KEYS + host.WEIGHT_KEYS}
    host.check_score_centering_batch(full, writes_weights=True)
    unweighted = {key: None for key in host.SCORE_CENTERING_KEYS}
    host.check_score_centering_batch(unweighted, writes_weights=False)
    with pytest.raises(host.TRLHostError, match="\\['old_per_token_logps', 'importance_sampling_ratio'\\]"):
        host.check_score_centering_batch(unweighted, writes_weights=True)
    with pytest.raises(host.TRLHostError, match="\\['sampling_per_token_logps'\\] of GRPOTrainer's scored"):
        host.check_score_centering_batch(
            {k: v for k, v in unweighted.items() if k != "sampling_per_token_logps"}, writes_weights=False
        )
    host.check_training_loop(SimpleNamespace(current_gradient_accumulation_steps=2))
    with pytest.raises(host.TRLHostError, match="no longer sets \\['current_gradient_accumulation_steps'\\]"):
        host.check_training_loop(SimpleNamespace())


def test_called_helpers_have_the_parameters_the_plugin_passes(monkeypatch):
    """TRL 1.16's entropy and off-policy masks take what score centering passes; a changed one fails closed."""
    host.check_trl_host()
    monkeypatch.setattr(GRPOTrainer, "get_off_policy_mask", staticmethod(lambda advantages, mask: mask))
    with pytest.raises(host.TRLHostError, match="GRPOTrainer.get_off_policy_mask\\('advantages', 'mask'\\)"):
        host.check_trl_host()


def test_supported_range_equals_pyproject():
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    trl = next(dep for dep in project["project"]["optional-dependencies"]["trl"] if dep.startswith("trl"))
    assert trl == f"trl>={host.SUPPORTED_TRL[0]},<{host.SUPPORTED_TRL[1]}"


@pytest.mark.slow
def test_a_changed_generate_tuple_fails_closed(random_model_dir, tmp_path, monkeypatch):
    """A TRL whose ``_generate`` returns a different tuple stops the first step with a named error."""
    original = GRPOTrainer._generate
    monkeypatch.setattr(GRPOTrainer, "_generate", lambda self, prompts: original(self, prompts)[:-1])
    tokenizer = load_tokenizer(random_model_dir)
    trainer = RecordingTrainer(
        model=str(random_model_dir),
        reward_funcs=[correctness_reward],
        args=tiny_config(tmp_path, length_penalty_coeff=1.0),
        train_dataset=make_task_dataset(16),
        processing_class=tokenizer,
    )
    with pytest.raises(host.TRLHostError, match="GRPOTrainer._generate returned tuple of length 7"):
        trainer.train()


def truncating_plan(question, group, member):
    return (member * 3, member % 2 == 0)


def truncating_rollout(tokenizer):
    """The deterministic rollout with odd rows cut before their EOS (truncated) and the first two tokens of
    every third row marked as environment tokens (TRL's ``env_mask``, its tool mask)."""
    rollout = deterministic_rollout(tokenizer, 4, truncating_plan)

    def cut(prompts, trainer):
        output = rollout(prompts, trainer)
        ids = [row[:-1] if i % 2 else row for i, row in enumerate(output["completion_ids"])]
        masks = [[0, 0] + [1] * (len(row) - 2) if i % 3 == 0 else [1] * len(row) for i, row in enumerate(ids)]
        return {**output, "completion_ids": ids, "env_mask": masks}

    return cut


class TRLAdvantages(RecordingTrainer):
    """Records TRL's own advantages before the integration rewrites them, and the loss-mask lengths the
    coefficient used."""

    def _apply(self, output, result, rows):
        self.trl_advantages = output["advantages"].detach().clone()
        self.loss_lengths = result.coefficient.lengths
        super()._apply(output, result, rows)


@pytest.mark.slow
def test_rederived_trl_behaviour_equals_trls_own(random_model_dir, tmp_path):
    """Re-derived TRL behaviour equals TRL's own result on a real step: the reward column names, the
    loss-mask lengths (``completion_mask * tool_mask`` after ``mask_truncated_completions``; some
    completions are cut at ``max_completion_length``) and the mixed groups' normalization (TRL's std
    epsilon: where the shaping changes nothing, our advantages equal TRL's)."""
    tokenizer = load_tokenizer(random_model_dir)

    def named_reward(completions, **kwargs):
        return [0.0] * len(completions)

    args = tiny_config(
        tmp_path,
        length_penalty_coeff=1e-9,
        mask_truncated_completions=True,
        correctness_reward="correctness_reward",
    )
    trainer = TRLAdvantages(
        model=str(random_model_dir),
        reward_funcs=[correctness_reward, named_reward],
        args=args,
        train_dataset=make_task_dataset(16),
        processing_class=tokenizer,
        rollout_func=truncating_rollout(tokenizer),
    )
    assert [reward_name(f) for f in (correctness_reward, named_reward)] == trainer.reward_func_names[:2]
    trainer.train()
    (record,) = trainer.records
    loss_mask = record.output["completion_mask"] * record.output.get("tool_mask", 1)
    lengths = trainer.loss_lengths
    assert lengths.tolist() == loss_mask.sum(1).double().tolist()
    assert 0.0 in lengths.tolist() and len(set(lengths.tolist())) > 2  # truncated count 0, env tokens not
    mixed = [
        g
        for g in range(record.rewards_per_func.shape[0] // 4)
        if 0 < record.rewards_per_func[4 * g : 4 * g + 4, 0].sum() < 4
    ]
    assert mixed
    rows = [4 * g + k for g in mixed for k in range(4)]
    torch.testing.assert_close(
        record.output["advantages"][rows], trainer.trl_advantages[rows], rtol=0, atol=1e-6
    )


OUTSIDE_THE_RANGE = """
import sys
import trl
trl.__version__ = "1.13.0"
from trl_length_plugin.trl_integration.cli import main
main(sys.argv[1:])
"""


def test_a_trl_outside_the_range_is_one_line_from_the_command(tmp_path):
    """``trl-length-grpo`` with a TRL outside the supported range: one line naming the range (exit 2, no
    traceback), before any model loads (issue 42, class 8)."""
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-c",
            OUTSIDE_THE_RANGE,
            "--config",
            "recipe:coefficient_cpu",
            "--output_dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("trl-length-grpo: error:")]
    assert len(lines) == 1, done.stderr
    low, high = host.SUPPORTED_TRL
    assert f"supports >={low},<{high}" in lines[0] and "installed trl 1.13.0 is outside" in lines[0]
