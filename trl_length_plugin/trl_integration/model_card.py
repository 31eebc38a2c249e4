"""The model card of a model trained with the plugin: TRL's card (``create_model_card``, which adds the
``trl-length-plugin`` tag from ``_tag_names``) with a "Length control" section before its citations: what
was on, the settings used (score centering's too) as JSON, and the citations of every method used and of
the plugin (docs/trl.md, "Model card").

``LengthPluginGRPOTrainer`` writes it wherever TRL writes a card (each checkpoint, ``push_to_hub``) and with
every ``save_model``; ``LengthCardCallback`` writes the wrapper's section on TRL's stock trainer."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from transformers import TrainerCallback

from trl_length_plugin import __version__

TAG = "trl-length-plugin"
SECTION = "## Length control"
CITATIONS = "## Citations"
LUSPO_KEYS = ("loss_type", "importance_sampling_level", "epsilon", "epsilon_high")


@dataclass(frozen=True)
class Citation:
    """One method's source: a sentence for the card and a BibTeX entry."""

    method: str
    source: str
    bibtex: str


PLUGIN = Citation(
    "trl-length-plugin",
    "the length-control plugin for TRL and verl this model was trained with (`CITATION.cff`)",
    f"""\
@software{{trl_length_plugin,
    title        = {{{{trl-length-plugin: length control for GRPO-style RL post-training}}}},
    author       = {{{{trl-length-plugin developers}}}},
    version      = {{{__version__}}},
    year         = 2026,
    url          = {{https://pypi.org/project/trl-length-plugin/}},
}}""",
)
GROUP_PENALTIES = Citation(
    "group length penalties",
    'the group length penalties of NVIDIA NeMo RL (`nemo_rl/utils/length_penalty.py`, guide "Length '
    'Penalties for GRPO (NeMo-Gym)"), docs/reference/length-penalties.md §2',
    """\
@misc{nemo_rl_length_penalty,
    title        = {{Length Penalties for GRPO (NeMo-Gym)}},
    author       = {{NVIDIA NeMo RL}},
    howpublished = {\\url{https://docs.nvidia.com/nemo/rl/nightly/guides/length-penalty.html}},
}""",
)
COEFFICIENT = Citation(
    "length coefficient",
    "the length coefficient relative to the shortest correct rollout of each group, with its group "
    "normalization and zero-std filter, as specified in docs/reference/length-coefficient.md §3 of "
    "trl-length-plugin (cite the plugin)",
    "",
)
LUSPO = Citation(
    "LUSPO",
    "Liu et al., Length-Unbiased Sequence Policy Optimization (arXiv:2602.05261), docs/reference/luspo.md §4",
    """\
@misc{liu2026luspo,
    title        = {{Length-Unbiased Sequence Policy Optimization: Revealing and Controlling Response Length Variation in RLVR}},
    author       = {Fanfan Liu and Youyang Yin and Peng Shi and Siqi Yang and Zhixiong Zeng and Haibo Qiu},
    year         = 2026,
    eprint       = {2602.05261},
    archivePrefix = {arXiv},
    primaryClass = {cs.CL},
    url          = {https://arxiv.org/abs/2602.05261},
}""",
)
SCORE_CENTERING = Citation(
    "score centering",
    'score centering of NVIDIA NeMo RL (guide "Score Centering"), docs/reference/score-centering.md §5',
    """\
@misc{nemo_rl_score_centering,
    title        = {{Score Centering}},
    author       = {{NVIDIA NeMo RL}},
    howpublished = {\\url{https://docs.nvidia.com/nemo/rl/nightly/guides/score-centering.html}},
}""",
)
#: the method's paper, which NeMo RL's implementation cites (its API reference: "arXiv:2609.20807, Eq. 14")
SCORE_CENTERING_PAPER = Citation(
    "score centering (the method)",
    "Marek and Ryabinin, Score Centering Stabilizes Off-policy Reinforcement Learning (arXiv:2609.20807)",
    """\
@misc{marek2026scorecentering,
    title        = {{Score Centering Stabilizes Off-policy Reinforcement Learning}},
    author       = {Martin Marek and Max Ryabinin},
    year         = 2026,
    eprint       = {2609.20807},
    archivePrefix = {arXiv},
    url          = {https://arxiv.org/abs/2609.20807},
}""",
)


@dataclass(frozen=True)
class LengthCard:
    """What the section says: the summary of what was on, the settings, the methods to cite."""

    summary: str
    settings: dict
    citations: tuple[Citation, ...]


def trainer_card(args) -> LengthCard:
    """The card of a ``LengthPluginGRPOConfig`` run: the length-control and score-centering keys it set
    (values other than the defaults), LUSPO's TRL settings, and the citations of what was on."""
    settings = args.shaping.model_dump(mode="json", exclude_defaults=True)
    settings.update(args.score_centering_config.model_dump(mode="json", exclude_defaults=True))
    done = [args.shaping.summary()]
    citations = method_citations(args.shaping)
    if args.luspo:
        settings.update(luspo=True, **{key: getattr(args, key) for key in LUSPO_KEYS})
        done.append("LUSPO")
        citations.append(LUSPO)
    if args.score_centering_plan is not None:
        done.append(args.score_centering_plan.summary())
        citations += [SCORE_CENTERING, SCORE_CENTERING_PAPER]
    return LengthCard("; ".join(done), settings, (*citations, PLUGIN))


def wrapper_card(shaping) -> LengthCard:
    """The card of a ``LengthPenaltyReward`` on TRL's stock trainer: its block, as the ``length_penalty``
    reward function."""
    settings = shaping.model_dump(mode="json", exclude_defaults=True)
    summary = f"{shaping.summary()}, as the reward function `length_penalty` (LengthPenaltyReward)"
    return LengthCard(summary, settings, (*method_citations(shaping), PLUGIN))


def method_citations(shaping) -> list[Citation]:
    """The citations of the length-shaping methods that are on."""
    on = ((GROUP_PENALTIES, shaping.penalties_on), (COEFFICIENT, shaping.coefficient_on))
    return [citation for citation, enabled in on if enabled]


def length_card_section(card: LengthCard) -> str:
    """Markdown of the "Length control" section: what was on, the settings as JSON, the methods' sources."""
    sources = [f"- {citation.method}: {citation.source}" for citation in card.citations]
    return "\n".join(
        [
            SECTION,
            "",
            "Trained with [trl-length-plugin](https://pypi.org/project/trl-length-plugin/) "
            f"({card.summary}). Settings other than the defaults:",
            "",
            "```json",
            json.dumps(card.settings, indent=2, sort_keys=True),
            "```",
            "",
            "Methods used and their sources:",
            "",
            *sources,
            "",
        ]
    )


def citation_blocks(card: LengthCard) -> str:
    """``Cite <method> as:`` and its BibTeX, for every cited method that has an entry."""
    return "".join(
        f"Cite {citation.method} as:\n\n```bibtex\n{citation.bibtex}\n```\n\n"
        for citation in card.citations
        if citation.bibtex
    )


def add_length_control(text: str, card: LengthCard) -> str:
    """TRL's card text with the section inserted before its citations (at the end if it has none), and the
    methods' citations first among them. A card that has the section already is left as it is."""
    if f"\n{SECTION}\n" in text:
        return text
    head, found, citations = text.partition(f"\n{CITATIONS}\n")
    section, cite = length_card_section(card), citation_blocks(card)
    if not found:
        return f"{text.rstrip()}\n\n{section}\n{CITATIONS}\n\n{cite}"
    return f"{head.rstrip()}\n\n{section}\n{CITATIONS}\n\n{cite}{citations.lstrip()}"


def card_model_name(args) -> str:
    """The model name TRL gives its checkpoint cards: the Hub id's last part, else the output folder's name."""
    return args.hub_model_id.split("/")[-1] if args.hub_model_id else Path(args.output_dir).name


def write_card(trainer, card: LengthCard, output_dir: str | None = None) -> Path | None:
    """TRL's card of ``trainer`` (into ``args.output_dir``) with the section; copied into ``output_dir`` when
    that is another folder. Main process only; returns the card's path."""
    trainer.create_model_card(model_name=card_model_name(trainer.args), tags=[TAG])
    path = Path(trainer.args.output_dir, "README.md")
    if not trainer.is_world_process_zero() or not path.exists():
        return None
    text = add_length_control(path.read_text(encoding="utf-8"), card)
    path.write_text(text, encoding="utf-8")
    if output_dir is not None and os.path.abspath(output_dir) != os.path.abspath(trainer.args.output_dir):
        path = Path(output_dir, "README.md")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return path


class LengthCardCallback(TrainerCallback):
    """Adds a ``LengthPenaltyReward``'s section to the card of TRL's stock trainer: after each checkpoint
    (TRL has just written its card) and when training ends (TRL writes none then). The wrapper adds it to
    the calling trainer at its first training call."""

    def __init__(self, trainer, card: LengthCard):
        self.trainer = trainer
        self.card = card

    def on_save(self, args, state, control, **kwargs):
        write_card(self.trainer, self.card)

    def on_train_end(self, args, state, control, **kwargs):
        write_card(self.trainer, self.card)
