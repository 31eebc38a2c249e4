"""The model card of a model trained with the plugin: TRL's card (``GRPOTrainer.create_model_card``, which
adds the ``trl-length-plugin`` tag from ``_tag_names``) with a "Length control" section before its
citations, giving the settings used, and LUSPO's citation first among them when LUSPO is on."""

from __future__ import annotations

import json

LUSPO_CITATION = """\
@article{luspo2026,
    title        = {{Length-Unbiased Sequence Policy Optimization: Revealing and Controlling Response Length Variation in RLVR}},
    year         = 2026,
    eprint       = {arXiv:2602.05261},
}"""
CITATIONS = "## Citations"
LUSPO_KEYS = ("loss_type", "importance_sampling_level", "epsilon", "epsilon_high")


def length_settings(args) -> dict:
    """The length-control keys a run set (values other than the defaults), and LUSPO's TRL settings."""
    settings = args.shaping.model_dump(mode="json", exclude_defaults=True)
    if args.luspo:
        settings.update(luspo=True, **{key: getattr(args, key) for key in LUSPO_KEYS})
    return settings


def length_card_section(args) -> str:
    """Markdown of the "Length control" section: what was on, and the settings as JSON."""
    return "\n".join(
        [
            "## Length control",
            "",
            "Trained with [trl-length-plugin](https://pypi.org/project/trl-length-plugin/) "
            f"({args.shaping.summary()}{'; LUSPO' if args.luspo else ''}). Settings other than the defaults:",
            "",
            "```json",
            json.dumps(length_settings(args), indent=2, sort_keys=True),
            "```",
            "",
        ]
    )


def add_length_control(card: str, args) -> str:
    """TRL's card text with the section inserted before its citations (at the end if it has none)."""
    head, found, citations = card.partition(f"\n{CITATIONS}\n")
    luspo = f"Cite LUSPO as:\n\n```bibtex\n{LUSPO_CITATION}\n```\n\n" if args.luspo else ""
    section = length_card_section(args)
    if not found:
        return f"{card.rstrip()}\n\n{section}\n{luspo}"
    return f"{head.rstrip()}\n\n{section}\n{CITATIONS}\n\n{luspo}{citations.lstrip()}"
