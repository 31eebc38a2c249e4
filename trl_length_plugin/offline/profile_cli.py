"""``trl-length profile``: per-prompt profiles and bands from a reference model's rollouts
(docs/profiles.md).

Reads a rollout file (``rollouts.py``; or samples it first with ``--generate``), streams it and writes the
prompt dataset with ``profiled_rewards``, ``profiled_output_lengths`` and ``profile_band`` added per prompt
(docs/reference/length-penalties.md §2.14; rules in ``profiles.py``), with ``--targets`` also
``target_length`` (§2.20), then prints what it did.
"""

from __future__ import annotations

import math
from pathlib import Path

from trl_length_plugin.offline.command import CommandError, Parser, run
from trl_length_plugin.offline.outputs import OUTPUTS_HELP, Outputs
from trl_length_plugin.offline.profiles import DEFAULT_RULE, BandRule, ProfileBuilder, Profiles, TargetRule
from trl_length_plugin.offline.rollouts import MAX_COUNT, ROLLOUT_COLUMNS, RolloutReader, channel_lengths
from trl_length_plugin.offline.tables import (
    EMBEDDED,
    OUTPUT_FORMATS,
    check_output,
    dataset_of,
    load_prompts,
    prompt_keys,
    resolve_tokenizer,
)
from trl_length_plugin.shaping.config import DEFAULT_REASONING_TAGS, load_shaping_config
from trl_length_plugin.shaping.targets import DEFAULT_TEMPLATE

PROG = "trl-length profile"


def make_parser() -> Parser:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0].replace("``", ""), epilog=OUTPUTS_HELP)
    parser.add_argument(
        "rollouts",
        help="rollout file (.jsonl, .csv, .parquet, datasets dir); with --generate, "
        "the new .jsonl file the generated rollouts are written to (an existing one needs --overwrite)",
    )
    parser.add_argument(
        "--output",
        "-o",
        required=True,
        help=f"the profiled prompt dataset: {OUTPUT_FORMATS}; never an input's path",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --output (and, with --generate, rollout file); without it they are "
        "refused. Files are written to a temporary path and renamed at the end",
    )
    parser.add_argument(
        "--skip-invalid-utf8",
        action="store_true",
        help="skip (and count) rollout lines that are not UTF-8 instead of stopping at the first",
    )
    parser.add_argument(
        "--prompts",
        help="prompt dataset to add the columns to (file, datasets dir or "
        "'embedded'); without it, one row per prompt of the rollouts",
    )
    parser.add_argument("--dataset-size", type=int, default=256, help="rows of --prompts embedded")
    parser.add_argument("--seed", type=int, default=0, help="seed of --prompts embedded and of --generate")
    parser.add_argument("--length-type", choices=("tokens", "chars"), default="tokens")
    parser.add_argument("--tokenizer", help="tokenizer path (or 'embedded') to count completion tokens")
    parser.add_argument(
        "--reasoning-tags", nargs=2, default=list(DEFAULT_REASONING_TAGS), metavar=("OPEN", "CLOSE")
    )
    parser.add_argument(
        "--band",
        action="append",
        metavar="CHANNEL=QA,QB,F",
        help=f"a band rule (repeatable; default {DEFAULT_RULE}; 'none': no bands)",
    )
    parser.add_argument(
        "--min-passing", type=int, default=4, help="passing rollouts a band (or target) needs"
    )
    parser.add_argument(
        "--targets",
        metavar="[CHANNEL=]Q",
        help="also write target_length: the Q quantile of each prompt's passing CHANNEL lengths (default "
        "channel total), rounded to an integer; none below --min-passing passing rollouts",
    )
    parser.add_argument(
        "--target-prompt",
        nargs="?",
        const=DEFAULT_TEMPLATE,
        metavar="TEMPLATE",
        help=f"with --targets: also ask for the target in each prompt, TEMPLATE ({{n}}: the target; default "
        f"{DEFAULT_TEMPLATE!r}) appended to the last user message",
    )
    generate = parser.add_argument_group("generating the rollouts first")
    generate.add_argument(
        "--generate",
        choices=("embedded", "vllm"),
        help="embedded: transformers generate on CPU; vllm: a vLLM engine (GPU)",
    )
    generate.add_argument("--model", default=EMBEDDED, help="model path or Hub name (default: embedded)")
    generate.add_argument("--samples", type=int, default=8, help="rollouts per prompt")
    generate.add_argument(
        "--reward-func",
        help="dotted path of a TRL-style correctness reward function "
        "(default for --prompts embedded: the embedded task's)",
    )
    generate.add_argument("--max-new-tokens", type=int, default=48, help="tokens per completion (>= 1)")
    generate.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (> 0)")
    return parser


def check_flags(args) -> None:
    """The numeric flags and --generate's own, before anything is read or loaded."""
    if args.min_passing < 1:
        raise CommandError("--min-passing must be >= 1")
    if args.target_prompt is not None and (args.targets is None or "{n}" not in args.target_prompt):
        raise CommandError("--target-prompt needs --targets and a TEMPLATE with {n}")
    if args.prompts == EMBEDDED and args.dataset_size < 1:
        raise CommandError("--dataset-size must be >= 1")
    if not args.generate:
        return
    if args.prompts is None:
        raise CommandError("--generate needs --prompts (the prompts to sample)")
    if Path(args.rollouts).suffix.lower() != ".jsonl":
        raise CommandError(f"--generate writes JSONL: name the rollout file *.jsonl, not {args.rollouts}")
    if args.samples < 1:
        raise CommandError("--samples must be >= 1")
    if not 1 <= args.max_new_tokens <= MAX_COUNT:
        raise CommandError(f"--max-new-tokens must be between 1 and {MAX_COUNT}, got {args.max_new_tokens}")
    if not (math.isfinite(args.temperature) and args.temperature > 0):
        raise CommandError(f"--temperature must be a finite number > 0, got {args.temperature}")
    if args.reward_func is None and args.prompts != EMBEDDED:
        raise CommandError("--generate needs --reward-func (the correctness reward) for these prompts")


def band_rules(values: list[str] | None) -> list[BandRule]:
    if values == ["none"]:
        return []
    try:
        rules = [BandRule.parse(text) for text in values or [DEFAULT_RULE]]
    except ValueError as err:
        raise CommandError(f"--band {err}") from None
    channels = [rule.channel for rule in rules]
    if len(set(channels)) != len(channels):
        raise CommandError("--band: one rule per channel")
    return rules


def target_rule(value: str | None) -> TargetRule | None:
    if value is None:
        return None
    try:
        return TargetRule.parse(value)
    except ValueError as err:
        raise CommandError(f"--targets {err}") from None


def generate(args, prompts, path: Path):
    """Sample the rollouts into ``path`` (``args.rollouts`` resolved); returns the model's tokenizer."""
    from trl_length_plugin.offline.generate import (
        EMBEDDED_REWARD,
        generate_rollouts,
        import_dotted,
        load_model_tokenizer,
    )

    reward = import_dotted(args.reward_func or EMBEDDED_REWARD)
    model_path, tokenizer = load_model_tokenizer(args.model)
    rows = generate_rollouts(
        prompts,
        path,
        backend=args.generate,
        model_path=model_path,
        tokenizer=tokenizer,
        samples=args.samples,
        reward_func=reward,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
    )
    print(f"{PROG}: wrote {rows} rollouts ({args.samples} per prompt, {args.generate}) to {args.rollouts}")
    return tokenizer


def read_profiles(args, tokenizer, allowed: set[str] | None):
    """Stream the rollouts into a ``ProfileBuilder``; without a prompt dataset, also keep each prompt's
    prompt-level columns (those of its first rollout)."""
    reader = RolloutReader(args.rollouts, PROG, skip_invalid_utf8=args.skip_invalid_utf8)
    builder, carried = ProfileBuilder(), {}
    tags = load_shaping_config({"reasoning_tags": args.reasoning_tags}).tags  # validated as the trainer's
    for chunk in reader.chunks():
        kept = []
        for rollout in chunk:
            if math.isnan(rollout.reward):
                reader.skip(rollout.where, "reward is null")
            elif allowed is not None and rollout.key not in allowed:
                reader.skip(rollout.where, "prompt not in --prompts")
            else:
                kept.append(rollout)
        units = [args.length_type] * len(kept)
        for rollout, lengths in zip(
            kept, channel_lengths(kept, units, tokenizer, tags, reader.source.unit), strict=True
        ):
            if isinstance(lengths, str):
                reader.skip(rollout.where, lengths)
                continue
            builder.add(rollout.key, rollout.reward, *lengths)
            if allowed is None and rollout.key not in carried:
                carried[rollout.key] = {k: v for k, v in rollout.row.items() if k not in ROLLOUT_COLUMNS}
    reader.check_some_valid(len(builder))
    return reader, builder, carried


def with_target_prompts(dataset, template: str):
    """The prompts asking for their targets (``add_target_lengths``, reference §2.20)."""
    from trl_length_plugin.shaping.targets import add_target_lengths

    if "prompt" not in dataset.column_names:
        raise CommandError("--target-prompt needs a prompt column (in --prompts or the rollouts)")
    try:
        return add_target_lengths(dataset, template=template)
    except ValueError as err:
        raise CommandError(f"--target-prompt: {err}") from None


def output_dataset(profiles: Profiles, prompts, carried: dict):
    """The prompt dataset with the three columns, and ``target_length`` when built (null where no rollout
    names a prompt; a column of the same name in the prompts is replaced), and how many of its rows have a
    profile, a band and a target."""
    if prompts is None:
        rows = list(range(len(profiles.keys)))
        names = dict.fromkeys(name for key in profiles.keys for name in carried[key])
        columns = {name: [carried[key].get(name) for key in profiles.keys] for name in names}
        dataset = dataset_of({**columns, **profiles.columns(rows)})
    else:
        index = {key: i for i, key in enumerate(profiles.keys)}
        rows = [index.get(id_key, index.get(text_key)) for id_key, text_key in prompt_keys(prompts)]
        new = profiles.columns(rows)
        dataset = prompts.remove_columns([name for name in new if name in prompts.column_names])
        for name, column in new.items():
            dataset = dataset.add_column(name, column)
    profiled = [i for i in rows if i is not None]
    targeted = None if profiles.targets is None else sum(profiles.targets[i] is not None for i in profiled)
    return dataset, len(profiled), sum(profiles.bands[i] is not None for i in profiled), targeted


def summary(args, reader, builder, profiles: Profiles, rules, written: tuple) -> str:
    lines = [
        f"{PROG}: {reader.rows_read} rows read from {args.rollouts}: {len(builder)} rollouts of "
        f"{len(profiles.keys)} prompts profiled, lengths in {args.length_type}"
    ]
    for rule in rules:
        reasons = profiles.no_band[rule.channel]
        without = sum(reasons.values())
        why = ", ".join(f"{reason}: {n}" for reason, n in reasons.most_common())
        lines.append(
            f"  band {rule} (at least {args.min_passing} passing): {profiles.with_band[rule.channel]} prompts"
            + (f"; none for {without} ({why})" if without else "")
        )
    target = target_rule(args.targets)
    if target is not None:
        lines.append(f"  target_length {target} (at least {args.min_passing} passing)")
    lines.append(f"  rows skipped: {reader.skipped_summary()}")
    dataset, profiled, banded, targeted = written
    lines.append(
        f"  wrote {len(dataset)} prompts to {args.output}: {profiled} with a profile, {banded} with a band"
        + ("" if targeted is None else f", {targeted} with a target")
    )
    return "\n".join(lines)


def profile(args) -> None:
    from trl_length_plugin.offline.tables import write_dataset

    rules = band_rules(args.band)
    target = target_rule(args.targets)
    check_flags(args)
    reads = [args.prompts, args.tokenizer, args.model if args.generate else None]
    outputs = Outputs([*reads, None if args.generate else args.rollouts], args.overwrite)
    rollouts = outputs.claim(args.rollouts, "the --generate rollout file") if args.generate else None
    output = check_output(args.output)
    output = outputs.claim(output, "--output", directory=not output.suffix)
    prompts = load_prompts(args.prompts, args.dataset_size, args.seed) if args.prompts else None
    tokenizer = resolve_tokenizer(args.tokenizer)
    if rollouts is not None:
        model_tokenizer = generate(args, prompts, rollouts)
        tokenizer = tokenizer or model_tokenizer
    elif not Path(args.rollouts).exists():
        raise CommandError(f"{args.rollouts}: no such file or directory")
    allowed = None if prompts is None else {key for pair in prompt_keys(prompts) for key in pair if key}
    reader, builder, carried = read_profiles(args, tokenizer, allowed)
    profiles = builder.build(rules, args.min_passing, target)
    written = output_dataset(profiles, prompts, carried)
    if args.target_prompt is not None:
        written = (with_target_prompts(written[0], args.target_prompt), *written[1:])
    write_dataset(written[0], output)
    print(summary(args, reader, builder, profiles, rules, written))


def main(argv: list[str] | None = None) -> None:
    args = make_parser().parse_args(argv)
    run(PROG, lambda: profile(args))
