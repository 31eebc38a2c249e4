"""The model card of a model trained with ``LengthPluginGRPOTrainer``: TRL's card with the
``trl-length-plugin`` tag, a "Length control" section holding the settings used as JSON and the sources of
every method used, and their citations (the plugin's always, LUSPO's with its authors only when
``luspo: true``), written with every checkpoint and with every ``save_model`` (docs/trl.md, "Model card")."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.trl_length_helpers import tiny_config
from trl_length_plugin.embedded import correctness_reward, make_task_dataset
from trl_length_plugin.trl_integration import LengthPluginGRPOTrainer
from trl_length_plugin.trl_integration.model_card import (
    LUSPO,
    PLUGIN,
    add_length_control,
    trainer_card,
    wrapper_card,
)

BLOCK = {"default": {"total_bonus": 0.1, "length_type": "chars"}}
SETTINGS = {"length_penalty": BLOCK, "length_penalty_coeff": 0.5}
LUSPO_ARGS = {
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
    assert read_card(card)[1] == {**SETTINGS, **(LUSPO_ARGS if luspo else {})}  # the checkpoint's card
    trainer.create_model_card()
    metadata, settings, text = read_card(card)
    assert {"trl", "grpo", "trl-length-plugin"} <= set(metadata["tags"])
    assert settings == {**SETTINGS, **(LUSPO_ARGS if luspo else {})}
    assert "length shaping: group penalties (length_type, total_bonus); length coefficient 0.5" in text
    assert text.count("## Length control") == 1
    assert text.index("## Length control") < text.index("## Citations") < text.index("Cite TRL as:")
    assert ("arXiv:2602.05261" in text) is luspo and ("Cite LUSPO as:" in text) is luspo
    assert ("Fanfan Liu and Youyang Yin" in text) is luspo
    assert "Cite trl-length-plugin as:" in text and "@software{trl_length_plugin," in text
    assert "- group length penalties: the group length penalties of NVIDIA NeMo RL" in text
    assert "- length coefficient: the length coefficient relative to the shortest correct rollout" in text
    assert text.index("Cite trl-length-plugin as:") < text.index("Cite GRPO as:")  # TRL's own citations stay


def assert_card(path, settings: dict) -> str:
    """The card at ``path`` has the plugin's tag, exactly ``settings`` and the plugin's citation."""
    metadata, found, text = read_card(path)
    assert "trl-length-plugin" in metadata["tags"] and found == settings
    assert "Cite trl-length-plugin as:" in text and text.count("## Length control") == 1
    return text


@pytest.mark.slow
def test_save_model_writes_the_card_and_rollout_lines_are_behind_a_key(random_model_dir, tmp_path, caplog):
    """``save_strategy: "no"`` (no checkpoint, so TRL writes no card): ``save_model()`` writes it, into
    ``output_dir`` and into another folder given; ``length_penalty_log_rollouts`` gives one ``Length
    penalty:`` line per rollout (1 prompt x 4 generations) instead of the step's summary line."""
    args = tiny_config(
        tmp_path / "out",
        **SETTINGS,
        length_penalty_log_rollouts=True,
        per_device_train_batch_size=4,
        save_strategy="no",
    )
    trainer = LengthPluginGRPOTrainer(
        model=str(random_model_dir),
        reward_funcs=[correctness_reward],
        args=args,
        train_dataset=make_task_dataset(8),
    )
    with caplog.at_level("INFO", "trl_length_plugin"):
        trainer.train()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Length penalty:")]
    assert len(lines) == 4 and all(
        line.startswith("Length penalty: session_id=step0/group0") for line in lines
    )
    assert not (tmp_path / "out" / "README.md").exists()  # TRL wrote none
    trainer.save_model()
    assert_card(tmp_path / "out" / "README.md", SETTINGS)
    trainer.save_model(str(tmp_path / "elsewhere"))
    assert_card(tmp_path / "elsewhere" / "README.md", SETTINGS)
    assert (tmp_path / "elsewhere" / "model.safetensors").exists()


TRL_CARD = """---
tags:
- trl
- grpo
---

# Model Card

## Training procedure

## Citations

Cite GRPO as:

```bibtex
@article{shao2024deepseekmath}
```
"""


def test_card_section_and_citations_are_inserted_once(tmp_path):
    """Into a card shaped like TRL's: the section before the citations, the methods' citations first, the
    plugin's last among ours, TRL's after; a second pass changes nothing."""
    args = tiny_config(tmp_path, **SETTINGS, **LUSPO_ARGS)
    card = trainer_card(args)
    assert [c.method for c in card.citations] == [
        "group length penalties",
        "length coefficient",
        "LUSPO",
        "trl-length-plugin",
    ]
    text = add_length_control(TRL_CARD, card)
    assert add_length_control(text, card) == text
    order = ["## Training procedure", "## Length control", "Methods used and their sources:", "## Citations",
             "Cite group length penalties as:", "Cite LUSPO as:", "Cite trl-length-plugin as:", "Cite GRPO as:"]  # fmt: skip
    assert [text.index(part) for part in order] == sorted(text.index(part) for part in order)
    assert (
        "Cite length coefficient as:" not in text
    )  # the plugin's reference is its source: no entry of its own
    assert LUSPO.bibtex in text and PLUGIN.bibtex in text
    assert (
        "author       = {Fanfan Liu and Youyang Yin and Peng Shi and Siqi Yang and Zhixiong Zeng and Haibo Qiu}"
        in text
    )


def test_wrapper_card_has_its_block_and_sources():
    from trl_length_plugin.shaping import load_shaping_config

    card = wrapper_card(
        load_shaping_config({"length_penalty": {"default": {"group_total_length_penalty_coeff": 0.1}}})
    )
    assert card.settings == {"length_penalty": {"default": {"group_total_length_penalty_coeff": 0.1}}}
    assert [c.method for c in card.citations] == ["group length penalties", "trl-length-plugin"]
    assert "as the reward function `length_penalty` (LengthPenaltyReward)" in card.summary


def test_score_centering_is_in_the_card_section(tmp_path):
    from tests.trl_length_helpers import sc_config
    from trl_length_plugin.trl_integration.model_card import length_card_section

    section = length_card_section(trainer_card(sc_config(tmp_path)))
    assert "score centering: K=16, mode tis in [0, 3], full vocabulary" in section
    assert "- score centering: score centering of NVIDIA NeMo RL" in section
    assert "- score centering (the method): Marek and Ryabinin, Score Centering Stabilizes" in section
    assert "arXiv:2609.20807" in section
    settings = json.loads(re.search(r"```json\n(.*?)\n```", section, re.S).group(1))
    assert settings == {"score_centering": True, "score_centering_top_k": 16}
