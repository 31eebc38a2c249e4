"""The model card of a model trained with ``LengthPluginGRPOTrainer``: TRL's card with the
``trl-length-plugin`` tag, a "Length control" section holding the settings used as JSON, and the LUSPO
citation only when ``luspo: true`` (docs/reference/luspo.md §4.3)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.trl_length_helpers import tiny_config
from trl_length_plugin.embedded import correctness_reward, make_task_dataset
from trl_length_plugin.trl_integration import LengthPluginGRPOTrainer

BLOCK = {"default": {"total_bonus": 0.1, "length_type": "chars"}}
SETTINGS = {"length_penalty": BLOCK, "length_penalty_coeff": 0.5}
LUSPO = {
    "luspo": True,
    "loss_type": "luspo",
    "importance_sampling_level": "sequence",
    "epsilon": 2e-3,
    "epsilon_high": 2.5e-3,
}


def read_card(path):
    """(front-matter metadata, settings JSON of the Length control section, whole text)."""
    text = path.read_text(encoding="utf-8")
    metadata = yaml.safe_load(text.split("---\n")[1])
    section = text[text.index("## Length control") :]
    settings = json.loads(re.search(r"```json\n(.*?)\n```", section, re.S).group(1))
    return metadata, settings, text


@pytest.mark.slow
@pytest.mark.parametrize("luspo", [False, True], ids=["grpo", "luspo"])
def test_model_card_has_tag_settings_and_luspo_citation(luspo, random_model_dir, tmp_path):
    args = tiny_config(
        tmp_path,
        length_penalty=BLOCK,
        length_penalty_coeff=0.5,
        luspo=luspo,
        save_strategy="steps",  # TRL writes the card with every checkpoint
        save_steps=1,
    )
    trainer = LengthPluginGRPOTrainer(
        model=str(random_model_dir),
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=make_task_dataset(16),
    )
    trainer.train()
    card = tmp_path / "README.md"
    assert read_card(card)[1] == {**SETTINGS, **(LUSPO if luspo else {})}  # the checkpoint's card
    trainer.create_model_card()
    metadata, settings, text = read_card(card)
    assert {"trl", "grpo", "trl-length-plugin"} <= set(metadata["tags"])
    assert settings == {**SETTINGS, **(LUSPO if luspo else {})}
    assert "length shaping: group penalties (length_type, total_bonus); length coefficient 0.5" in text
    assert text.count("## Length control") == 1
    assert text.index("## Length control") < text.index("## Citations") < text.index("Cite TRL as:")
    assert ("arXiv:2602.05261" in text) is luspo and ("Cite LUSPO as:" in text) is luspo
    assert "Cite GRPO as:" in text  # TRL's own citations stay
