"""``trl-length preview``: what a length-shaping config does to saved rollouts (docs/profiles.md).

The config is the trainer's: the ``length_penalty`` block and the coefficient keys of a recipe
(``--config``) and/or flags of the same names, validated into the same ``LengthShapingConfig`` before
torch is imported; ``scale_rewards`` and ``agent_column`` are read as the trainer reads them. Every other
recipe key is left to ``trl-length grpo``. Prints per agent and overall the metrics of
docs/reference/length-penalties.md §2.15, the reward deltas, the groups each algorithm touched, the profile
gate's outcomes and the skipped groups; writes a PNG and, with ``--output``, the rows with their shaped
reward and advantage.
"""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path
from typing import Any

from trl_length_plugin.config_base import read_yaml
from trl_length_plugin.offline.command import CommandError, Parser, run
from trl_length_plugin.offline.outputs import OUTPUTS_HELP, Outputs, replacing
from trl_length_plugin.shaping.columns import AGENT_COLUMN
from trl_length_plugin.shaping.config import SHAPING_KEYS, LengthShapingConfig, load_shaping_config
from trl_length_plugin.shaping.schedule import schedule_end

PROG = "trl-length preview"
HOST_KEYS = {"scale_rewards": "group", "agent_column": AGENT_COLUMN}  # the trainer's defaults
SCALE_REWARDS = {"group": "group", "batch": "batch", "none": "none", True: "group", False: "none"}


def make_parser() -> Parser:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0].replace("``", ""), epilog=OUTPUTS_HELP)
    parser.add_argument("rollouts", help="rollout file (.jsonl, .csv, .parquet or a datasets directory)")
    keys = parser.add_argument_group("the trainer's keys (flags override the recipe)")
    keys.add_argument("--config", help="a trl-length grpo recipe: a YAML file or recipe:NAME")
    keys.add_argument("--length_penalty", help="the block: a JSON object or the path of a YAML file")
    for key in ("length_penalty_coeff", "length_penalty_min_tokens", "length_penalty_coeff_warmup_steps"):
        keys.add_argument(f"--{key}")
    keys.add_argument("--length_schedule", help="the schedule: a JSON array or the path of a YAML file")
    keys.add_argument("--drop_zero_std_groups")
    keys.add_argument("--reasoning_tags", nargs=2, metavar=("OPEN", "CLOSE"))
    keys.add_argument("--scale_rewards", choices=("group", "batch", "none"))
    keys.add_argument("--agent_column")
    parser.add_argument(
        "--step",
        type=int,
        help="optimizer step (>= 0) for the coefficient warm-up and length_schedule (default: after them)",
    )
    parser.add_argument(
        "--prompts", help="prompt dataset with the metadata (e.g. trl-length profile's output)"
    )
    parser.add_argument("--dataset-size", type=int, default=256, help="rows of --prompts embedded")
    parser.add_argument("--seed", type=int, default=0, help="seed of --prompts embedded")
    parser.add_argument("--tokenizer", help="tokenizer path (or 'embedded') to count completion tokens")
    parser.add_argument("--png", default="length_preview.png", help="the PNG to write (default %(default)s)")
    parser.add_argument("--output", help="write the rows with shaped_reward and advantage to this .jsonl")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --png or --output; without it they are refused (never an input's path). "
        "Files are written to a temporary path and renamed at the end",
    )
    parser.add_argument(
        "--skip-invalid-utf8",
        action="store_true",
        help="skip (and count) rollout lines that are not UTF-8 instead of stopping at the first",
    )
    return parser


def _read_recipe(value: str) -> dict[str, Any]:
    """The recipe as the trainer's CLI reads it (``read_yaml``: a key written twice is refused)."""
    from trl_length_plugin.recipes import resolve_config

    try:
        path = resolve_config(value)
        recipe = read_yaml(path)
    except ValueError as err:
        raise CommandError(str(err)) from None
    if recipe is None:
        return {}
    if not isinstance(recipe, dict):
        raise CommandError(f"{path}: a recipe is a mapping of keys, got {type(recipe).__name__}")
    for key in recipe:
        close = difflib.get_close_matches(str(key), SHAPING_KEYS, n=1, cutoff=0.85)
        if key not in SHAPING_KEYS and close:
            raise CommandError(f"{path}: unknown key {key!r}; did you mean {close[0]!r}?")
    return recipe


def _flag_value(key: str, text: Any) -> Any:
    """A flag as the trainer's parser reads it: the block as given (JSON or a path), scalars as YAML."""
    if key in ("length_penalty", "length_schedule", "reasoning_tags"):
        return text
    import yaml

    return yaml.safe_load(text)


def _given(key: str, value: Any) -> bool:
    """Whether a key differs from its default: the trainer validates only those (``_dependent_keys``)."""
    default = LengthShapingConfig.model_fields[key].default
    return not (value == default or isinstance(default, tuple) and list(value) == list(default))


def load_config(args) -> tuple[LengthShapingConfig, str, str]:
    """``(config, scale_rewards, agent_column)`` from the recipe and the flags; a bad key is a one-line
    error naming its path (the message of the trainer's config)."""
    recipe = _read_recipe(args.config) if args.config else {}
    values = {key: recipe[key] for key in (*SHAPING_KEYS, *HOST_KEYS) if key in recipe}
    for key in (*SHAPING_KEYS, *HOST_KEYS):
        if getattr(args, key) is not None:
            values[key] = _flag_value(key, getattr(args, key))
    host = {key: values.pop(key, default) for key, default in HOST_KEYS.items()}
    scale = host["scale_rewards"]
    if not isinstance(scale, str | bool) or scale not in SCALE_REWARDS:
        raise CommandError(f"scale_rewards: expected group, batch or none, got {scale!r}")
    config = load_shaping_config({key: value for key, value in values.items() if _given(key, value)})
    penalties = config.penalties is not None and config.penalties.switches_a_term
    if not (penalties or config.coefficient_on or config.drop_zero_std_groups):
        raise CommandError(
            "the config switches no length shaping on (a length_penalty term, length_penalty_coeff or "
            "drop_zero_std_groups)"
        )
    if config.penalties is not None and config.penalties.truncation_modes:
        raise CommandError(
            "length_penalty.truncation: saved rollouts carry no truncated flag (docs/reference/"
            "length-penalties.md §2.19); preview the config without it"
        )
    return config, SCALE_REWARDS[scale], str(host["agent_column"])


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def write_output(source, rows, result, advantages, path: Path) -> None:
    """Every row that was shaped, as read, plus ``shaped_reward``, ``advantage`` (and ``keep``)."""
    lines = iter(rows.lines)
    wanted, k = next(lines, None), 0
    shaped, advantage = result.rewards.tolist(), advantages.tolist()
    keep = None if result.keep is None else result.keep.tolist()
    with replacing(path) as temporary, temporary.open("w", encoding="utf-8") as sink:
        for where, row in source.rows():
            if where != wanted:
                continue
            extra = {"shaped_reward": _number(shaped[k]), "advantage": _number(advantage[k])}
            if keep is not None:
                extra["keep"] = keep[k]
            sink.write(json.dumps({**row, **extra}, ensure_ascii=False, default=str) + "\n")
            wanted, k = next(lines, None), k + 1


def preview(args) -> None:
    config, scale_rewards, agent_column = load_config(args)  # before torch is imported
    if args.step is not None and args.step < 0:
        raise CommandError(f"--step must be >= 0, got {args.step}")
    if Path(args.png).suffix.lower() != ".png":
        raise CommandError(f"--png {args.png}: preview writes PNG (*.png)")
    if args.output is not None and Path(args.output).suffix.lower() != ".jsonl":
        raise CommandError(f"--output {args.output}: preview writes JSONL (*.jsonl)")
    reads = [args.rollouts, args.prompts, args.tokenizer, args.config, args.length_penalty]
    outputs = Outputs(reads, args.overwrite)
    png = outputs.claim(args.png, "--png")
    output = outputs.claim(args.output, "--output") if args.output else None
    import torch

    from trl_length_plugin.offline import preview as core
    from trl_length_plugin.offline.plot import plot_preview
    from trl_length_plugin.offline.rollouts import RolloutReader
    from trl_length_plugin.offline.tables import load_prompts, prompt_keys, resolve_tokenizer
    from trl_length_plugin.shaping.normalization import trl_normalization
    from trl_length_plugin.shaping.records import format_group_record

    table = None
    if args.prompts:
        prompts = load_prompts(args.prompts, args.dataset_size, args.seed)
        table = core.PromptTable(prompts, prompt_keys(prompts), agent_column)
    tokenizer = resolve_tokenizer(args.tokenizer)
    reader = RolloutReader(args.rollouts, PROG, agent_column, args.skip_invalid_utf8)
    rows = core.read_rows(reader, config, tokenizer, table, agent_column)
    reader.check_some_valid(len(rows.rewards))
    step = schedule_end(config) if args.step is None else args.step
    batch, result, advantages = core.shape(rows, config, trl_normalization(scale_rewards), step)
    facts = core.group_facts(batch, result, config)
    print(
        f"{PROG}: {reader.rows_read} rows read from {args.rollouts}: {batch.layout.num_rows} rollouts in "
        f"{batch.layout.num_groups} groups; rows skipped: {reader.skipped_summary()}"
    )
    print(f"{config.summary()}; scale_rewards={scale_rewards}, step {step}")
    if config.penalties is not None and config.penalties.verbose:
        print("\n".join(format_group_record(record) for record in result.penalties.groups))
    print(core.report(batch, result, facts))
    if config.penalties is not None:
        units = sorted(set(config.penalties.length_types(facts.agents)))
        lengths, unit = batch.total_lengths, units[0] if len(units) == 1 else "tokens or chars"
    else:  # nothing measured the channels: the loss-mask token counts
        lengths, unit = torch.tensor(rows.loss.tolist()).nan_to_num(0.0), "completion tokens"
    in_shaped = core.shaped_rows(batch, facts)
    plot_preview(lengths, result.raw, result.rewards, in_shaped, unit, png)
    print(f"wrote {args.png}")
    if output is not None:
        write_output(reader.source, rows, result, advantages, output)
        print(f"wrote {batch.layout.num_rows} rows with shaped_reward and advantage to {args.output}")


def main(argv: list[str] | None = None) -> None:
    args = make_parser().parse_args(argv)
    run(PROG, lambda: preview(args))
