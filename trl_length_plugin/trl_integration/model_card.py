"""The model card section of a model trained with the plugin: the length-control settings and, with
LUSPO, its citation (TRL writes the rest of the card, ``GRPOTrainer.create_model_card``)."""

from __future__ import annotations

import json

LUSPO_CITATION = """\
@article{luspo2026,
    title        = {{Length-Unbiased Sequence Policy Optimization: Revealing and Controlling Response Length
                     Variation in RLVR}},
    year         = 2026,
    eprint       = {arXiv:2602.05261},
}"""


def length_card_section(args) -> str:
    """Markdown appended to TRL's card: the tag's meaning, the settings used, the LUSPO citation."""
    settings = args.shaping.model_dump(mode="json", exclude_defaults=True)
    if args.luspo:
        settings["luspo"] = True
        settings.update(
            {
                k: getattr(args, k)
                for k in ("loss_type", "importance_sampling_level", "epsilon", "epsilon_high")
            }
        )
    lines = [
        "",
        "## Length control",
        "",
        "Trained with [trl-length-plugin](https://pypi.org/project/trl-length-plugin/) "
        f"({args.shaping.summary()}{'; LUSPO' if args.luspo else ''}). Settings:",
        "",
        "```json",
        json.dumps(settings, indent=2, sort_keys=True),
        "```",
        "",
    ]
    if args.luspo:
        lines += ["Cite LUSPO as:", "", "```bibtex", LUSPO_CITATION, "```", ""]
    return "\n".join(lines)
