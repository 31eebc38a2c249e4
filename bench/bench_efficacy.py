"""Which length control to pick: every shaping algorithm, the coefficient, GSPO and LUSPO on the embedded tasks and
on a real chat model.

Each arm trains the task's warm model with the task's GRPO settings (``trl_length_plugin.embedded.tasks``: 60 steps of 4
prompts x 8 completions on the embedded tasks) on the task ``--task`` names (the embedded arithmetic task, the
embedded reasoning task whose held-out figures are also recorded per difficulty level, or ``real``: one-step
arithmetic on SmolLM2-135M-Instruct, 2 prompts x 8 completions at temperature 0.7, docs/efficacy.md "On a real
chat model"), then samples the held-out problems (never trained on) at the training temperature. Baseline: plain GRPO of
the same seeds, in the same grid. Per run it records the mean completion length and accuracy of the last logged steps and of the held-out
samples, and the means of TRL's ``length_penalty/*`` metrics. The profile arms read per-prompt profiles
made from the warm model's own rollouts (``warm_reference``).

One JSON per finished run lands in ``--out``/runs; a finished run is not redone, so an interrupted grid
resumes and a second invocation only summarizes; ``--restore`` seeds the run store from committed summaries
(a fresh clone then trains only the arms and seeds they lack), refused when the warm model rebuilt here is
not the one they started from (its weights' fingerprint is in the summary). ``--jobs 2`` (the default) trains one run per core in
worker processes. At the end: the tables (``--out``/table.md), ``case | measured | baseline | ratio``
lines, the Pareto PNG and the best trade-off. Recorded in docs/efficacy.md:

    OMP_NUM_THREADS=1 python -m bench.bench_efficacy --png docs/images/efficacy_pareto.png
        [--task arithmetic|reasoning|real] [--seeds 0,1,2,3,4] [--steps 60] [--jobs 2] [--arms NAME,...]
        [--out outputs/efficacy, or outputs/efficacy-reasoning] [--restore SUMMARY.json,...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "TOKENIZERS_PARALLELISM"):
    os.environ.setdefault(_var, "false" if _var == "TOKENIZERS_PARALLELISM" else "1")

from bench._harness import header, report  # noqa: E402
from trl_length_plugin.embedded import real_task, tasks  # noqa: E402
from trl_length_plugin.figures import pyplot, save_figure  # noqa: E402
from trl_length_plugin.shaping.columns import PROFILE_BAND, PROFILED_OUTPUT_LENGTHS, PROFILED_REWARDS  # noqa: E402
from trl_length_plugin.tools import demo  # noqa: E402

#: completions per training problem in the warm model's profiles
PROFILE_SAMPLES = 16
#: logged steps averaged for the training-side figures
TAIL = 10
#: accuracy loss (points, held out) the best trade-off may cost; issue 14's target
MAX_ACCURACY_LOSS = 2.0
TARGET_LENGTH_CUT = 30.0
CLIP = {"epsilon": 2e-3, "epsilon_high": 2.5e-3}  # LUSPO's clip range (docs/reference/luspo.md §4.2)
#: the penalty keys that read per-prompt profiles or bands (docs/reference/length-penalties.md §2.14)
PROFILE_KEYS = ("profiled_length_penalty", "profile_band_total", "group_length_penalty_profile_gate")
MARKERS = "osD^vP*Xh<>p"
#: accuracy loss (points) beyond which an arm is named beside the Pareto plot instead of drawn in it
OFF_CHART = 20.0
#: TRL's shaping metrics shown per arm, averaged over steps (reference §2.15, length-coefficient.md §3.1)
STATS = {
    "length_penalty/reward_delta_mean": "penalties: reward change / rollout",
    "length_penalty/adjusted_frac": "penalties: rollouts adjusted (%)",
    "length_penalty/wiped_correct_frac": "penalties: correct wiped to 0 (%)",
    "length_penalty/coeff_reward_reduction_mean": "coefficient: reward reduction / rollout",
    "length_penalty/coeff_penalized_frac": "coefficient: rollouts penalized (%)",
}


@dataclass(frozen=True)
class Arm:
    """One configuration: its ``LengthPluginGRPOConfig`` keys, for profile bands the band floor f, for a
    peer arm the reward functions added to the correctness reward (``bench/peer_arms.py``: builder name and
    arguments) with the correctness reward's weight (0 where the peer's reward replaces it), and for a
    target-length arm the instruction that asks each prompt for its target (``target_prompt``, with ``{n}``)."""

    family: str
    strength: str
    keys: dict = field(default_factory=dict)
    band_floor: float = 0.5
    rewards: tuple[tuple[str, dict], ...] = ()
    correctness_weight: float = 1.0
    target_prompt: str = ""

    @property
    def name(self) -> str:
        return f"{self.family} {self.strength}".strip()


def penalty(**params) -> dict:
    return {"length_penalty": {"default": params}}


def peer_arms(max_len: int) -> list[Arm]:
    """The length controls TRL and verl ship, and two without shipped code (bench/peer_arms.py), as arms of
    runs whose longest completion is ``max_len`` tokens (L)."""
    return [
        Arm("TRL soft overlong", "buffer L/4", rewards=(("soft_overlong_reward", dict(cache=max_len // 4)),)),
        Arm("TRL soft overlong", "buffer L/2", rewards=(("soft_overlong_reward", dict(cache=max_len // 2)),)),
        Arm("TRL cosine", "", rewards=(("cosine_reward", {}),), correctness_weight=0.0),
        Arm(
            "TRL truncation mask",
            "budget 2L/3",
            {"mask_truncated_completions": True, "max_completion_length": 2 * max_len // 3},
        ),
        Arm(
            "verl DAPO overlong buffer",
            "L/4",
            rewards=(("dapo_overlong_reward", dict(buffer_len=max_len // 4)),),
        ),
        Arm("Kimi k1.5 length reward", "1.0", rewards=(("kimi_length_reward", dict(weight=1.0)),)),
        Arm("per-token penalty", "0.005", rewards=(("per_token_penalty", dict(alpha=0.005)),)),
        Arm("per-token penalty", "0.01", rewards=(("per_token_penalty", dict(alpha=0.01)),)),
    ]


#: the longest completion of an arithmetic-task run (the peers' maximum length there), and its peer arms
MAX_LEN = tasks.ARITHMETIC.max_length
PEER_ARMS = peer_arms(MAX_LEN)
#: the arguments each peer builder takes from the run's task: its GRPO settings and its correctness reward
PEER_CONTEXT = {
    "soft_overlong_reward": lambda task: dict(max_completion_len=task.max_length),
    "dapo_overlong_reward": lambda task: dict(max_resp_len=task.max_length),
    "cosine_reward": lambda task: dict(max_len=task.max_length, correctness=task.correctness),
    "kimi_length_reward": lambda task: dict(
        num_generations=task.training["num_generations"], correctness=task.correctness
    ),
    "per_token_penalty": lambda task: {},
}


def peer_rewards(arm: Arm, task: tasks.Task = tasks.ARITHMETIC) -> tuple[list, list[float]]:
    """The reward functions an arm adds to the correctness reward on ``task``, and every reward's weight."""
    from bench import peer_arms

    functions = [getattr(peer_arms, name)(**PEER_CONTEXT[name](task), **args) for name, args in arm.rewards]
    return functions, [arm.correctness_weight] + [1.0] * len(functions)


#: our arms, the same on every task
OWN_ARMS = [
    Arm("plain GRPO", ""),
    Arm("shortest bonus / longest penalty", "0.2", penalty(total_bonus=0.2, longest_total_penalty=0.2)),
    Arm("shortest bonus / longest penalty", "0.5", penalty(total_bonus=0.5, longest_total_penalty=0.5)),
    Arm("group-relative", "0.3", penalty(group_total_length_penalty_coeff=0.3)),
    Arm("group-relative", "0.6", penalty(group_total_length_penalty_coeff=0.6)),
    Arm("group-relative", "1.0", penalty(group_total_length_penalty_coeff=1.0)),
    Arm("zMAD", "z>1 0.3", penalty(total_zmad_threshold=1.0, total_zmad_penalty=0.3)),
    Arm("zMAD", "z>0.5 0.5", penalty(total_zmad_threshold=0.5, total_zmad_penalty=0.5)),
    Arm(
        "profiled-length penalty",
        "0.3 above mean",
        penalty(profiled_length_penalty=0.3, profiled_length_n_std=0.0),
    ),
    Arm(
        "profiled-length penalty",
        "0.5 above mean-1sd",
        penalty(profiled_length_penalty=0.5, profiled_length_n_std=-1.0),
    ),
    Arm("profile band", "f 0.5", penalty(profile_band_total=True), band_floor=0.5),
    Arm("profile band", "f 0.2", penalty(profile_band_total=True), band_floor=0.2),
    Arm(
        "profile-gated group-relative",
        "0.6",
        penalty(group_total_length_penalty_coeff=0.6, group_length_penalty_profile_gate=True),
    ),
    Arm(
        "profile-gated group-relative",
        "1.0",
        penalty(group_total_length_penalty_coeff=1.0, group_length_penalty_profile_gate=True),
    ),
    Arm("pass-rate penalty", "0.5", penalty(pass_rate_length_penalty_weight=0.5)),
    Arm("pass-rate penalty", "1.0", penalty(pass_rate_length_penalty_weight=1.0)),
    Arm("coefficient", "0.5", {"length_penalty_coeff": 0.5}),
    Arm("coefficient", "1.0", {"length_penalty_coeff": 1.0}),
    Arm("coefficient", "2.0", {"length_penalty_coeff": 2.0}),
    Arm(
        "group-relative + coefficient",
        "0.3 + 0.5",
        {**penalty(group_total_length_penalty_coeff=0.3), "length_penalty_coeff": 0.5},
    ),
    Arm(
        "group-relative + coefficient",
        "0.6 + 1.0",
        {**penalty(group_total_length_penalty_coeff=0.6), "length_penalty_coeff": 1.0},
    ),
    Arm(
        "profile-gated group-relative + band",
        "0.6 + f 0.5",
        penalty(
            group_total_length_penalty_coeff=0.6,
            group_length_penalty_profile_gate=True,
            profile_band_total=True,
        ),
        band_floor=0.5,
    ),
    Arm(
        "profile-gated group-relative + band",
        "1.0 + f 0.2",
        penalty(
            group_total_length_penalty_coeff=1.0,
            group_length_penalty_profile_gate=True,
            profile_band_total=True,
        ),
        band_floor=0.2,
    ),
    Arm("GSPO", "", {"loss_type": "grpo", "importance_sampling_level": "sequence", **CLIP}),
    Arm("LUSPO", "", {"luspo": True}),
]


def length_arms(max_len: int) -> list[Arm]:
    """Our per-rollout length controls that depend on the run's longest completion L (docs/length-shaping.md
    terms 9-11 and the length schedule): truncated rollouts under a hard budget of 2L/3 tokens (beside the
    TRL truncation mask peer at the same budget), and a ThinkPrune-like curriculum that shrinks the overlong
    maximum (buffer L/4) from L to 7L/8 at step 20 and to 3L/4 at step 40; and L1's target-length rewards
    (reference §2.20: exact at alpha 0.01 a token, max at alpha 0.05 and delta 0.5; the paper's alpha of 3e-4
    is for thousands of tokens), each prompt asking for its target, the 25th percentile of the warm model's
    passing lengths for it (``with_targets``). Our overlong and cosine terms are
    not arms of their own: they give the TRL soft overlong and TRL cosine peers' rewards exactly
    (tests/test_peer_arms.py), so those peer rows are theirs."""
    budget = {"max_completion_length": 2 * max_len // 3}
    overlong = dict(overlong_max_length=3 * max_len // 4, overlong_buffer=max_len // 4)
    shrink = {
        "key": "length_penalty.default.overlong_max_length",
        "stages": [{"until_step": 20, "value": max_len}, {"until_step": 40, "value": 7 * max_len // 8}],
    }
    return [
        Arm("truncation incorrect", "budget 2L/3", {**budget, **penalty(truncation="incorrect")}),
        Arm(
            "truncation penalty",
            "0.5 budget 2L/3",
            {**budget, **penalty(truncation="penalty", truncation_penalty_factor=0.5)},
        ),
        Arm("overlong curriculum", "L to 3L/4", {**penalty(**overlong), "length_schedule": [shrink]}),
        Arm(
            "L1 target exact",
            "0.01",
            penalty(target_length="exact", target_length_alpha=0.01),
            target_prompt="Think for {n} tokens.",
        ),
        Arm(
            "L1 target max",
            "0.05",
            penalty(target_length="max", target_length_alpha=0.05),
            target_prompt="Think for maximum {n} tokens.",
        ),
    ]


#: every arm of the grid on each task: ours, then the peers at the task's maximum length
TASK_ARMS = {
    name: [*OWN_ARMS, *length_arms(task.max_length), *peer_arms(task.max_length)]
    for name, task in real_task.GRID_TASKS.items()
}
ARMS = TASK_ARMS[tasks.ARITHMETIC.name]
ARMS_BY_NAME = {arm.name: arm for arm in ARMS}
PLAIN = ARMS[0].name


def arms_by_name(task: tasks.Task) -> dict[str, Arm]:
    return {arm.name: arm for arm in TASK_ARMS[task.name]}


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def uses_profiles(arm: Arm) -> bool:
    params = arm.keys.get("length_penalty", {}).get("default", {})
    return bool(arm.target_prompt) or any(params.get(key) for key in PROFILE_KEYS)


def profile_target(profile: dict) -> int | None:
    """A prompt's target length: its band's ``a`` (the 25th percentile of the warm model's passing lengths),
    rounded; None without a band (fewer than two passing rollouts)."""
    return None if profile["band"] is None else round(profile["band"]["a"])


def with_targets(dataset, held_out, profiles: dict[str, dict], template: str) -> tuple:
    """The training and held-out rows with a ``target_length`` column and each prompt asking for it
    (``template``, docs/reference/length-penalties.md §2.20): a profiled prompt's own target, and for the
    held-out problems (never profiled) the median target of the training prompts of their level (of all
    training prompts on a task without levels)."""
    from trl_length_plugin.shaping.targets import add_target_lengths

    def levels(rows) -> list[int]:
        return rows["level"] if "level" in rows.column_names else [0] * len(rows)

    targets = [profile_target(profiles[q]) if q in profiles else None for q in map(tasks.question, dataset)]
    by_level: dict[int, list[int]] = {}
    for target, level in zip(targets, levels(dataset), strict=True):
        if target is not None:
            by_level.setdefault(level, []).append(target)
    medians = {level: round(statistics.median(values)) for level, values in by_level.items()}
    held_out_targets = [medians.get(level) for level in levels(held_out)]
    return (
        add_target_lengths(dataset, targets=targets, template=template),
        add_target_lengths(held_out, targets=held_out_targets, template=template),
    )


def warm_reference(seed: int, task: tasks.Task = tasks.ARITHMETIC, profiled: bool = True) -> dict:
    """The warm model of ``task`` and ``seed`` before any RL: its held-out ``eval`` figures
    (``tasks.held_out_figures``), and (``profiled``: for a grid with profile arms) ``profiles`` of its own
    rollouts, ``PROFILE_SAMPLES`` per training problem at the training settings: ``profiled_rewards``, ``profiled_output_lengths`` (total length in
    tokens as the shaping measures it, docs/reference/length-penalties.md §2.5) and a ``band`` from the
    passing lengths (a, b = their 25th and 75th percentiles; none with fewer than two passing rollouts)."""
    from transformers import AutoModelForCausalLM

    from trl_length_plugin.embedded import load_tokenizer
    from trl_length_plugin.shaping import measure_lengths

    model_dir = task.model_dir(seed)
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    held_out_problems = task.held_out()
    held_out = tasks.sample(
        model, tokenizer, held_out_problems, task.eval_samples, tasks.HELD_OUT_SEED, task.max_length, task
    )
    figures = tasks.held_out_figures(held_out, held_out_problems, tokenizer, task.report)
    evaluated = dict(settings=warm_settings(task, profiled), eval=figures)
    if not profiled:
        return {**evaluated, "profiles": {}}
    problems = tasks.distinct_problems(task.training_set(seed))
    rollouts = tasks.sample(model, tokenizer, problems, PROFILE_SAMPLES, seed, task.max_length, task)
    totals = measure_lengths([r["text"] for r in rollouts], "tokens", tokenizer).total.tolist()
    profiles = {}
    for row in range(len(problems)):
        mine = [(r["correct"], total) for r, total in zip(rollouts, totals, strict=True) if r["row"] == row]
        passing = [total for correct, total in mine if correct > 0]
        band = None
        if len(passing) >= 2:
            a, _, b = statistics.quantiles(passing, n=4, method="inclusive")
            band = {"a": float(a), "b": float(max(b, a + 1))}
        profiles[tasks.question(problems[row])] = {
            PROFILED_REWARDS: [correct for correct, _ in mine],
            PROFILED_OUTPUT_LENGTHS: [total for _, total in mine],
            "band": band,
        }
    return {**evaluated, "profiles": profiles}


def described(task: tasks.Task) -> str:
    """The task as the plots' titles name it."""
    if task.real_model:
        return f"{task.real_model}, {'word problems' if task.report is not tasks.reasoning.step_report else 'one-step arithmetic'}"
    return f"the embedded {task.name} task"


def with_task(stored: dict, task: tasks.Task) -> dict:
    """Stored settings naming their task; the arithmetic task's as before the switch, so its stored runs stay
    valid (they differ from the others' in their training settings too)."""
    return stored if task is tasks.ARITHMETIC else {**stored, "task": task.name, "warm_seed": task.warm_seed}


def warm_settings(task: tasks.Task = tasks.ARITHMETIC, profiled: bool = True) -> dict:
    stored = dict(
        eval_samples=task.eval_samples,
        profile_samples=PROFILE_SAMPLES if profiled else 0,
        training=task.training,
    )
    return json.loads(json.dumps(with_task(stored, task)))


def warm_path(out: Path, seed: int) -> Path:
    return out / f"warm-seed{seed}.json"


def with_profiles(dataset, profiles: dict[str, dict], band_floor: float):
    """``dataset`` with the per-prompt metadata columns (docs/reference/length-penalties.md §2.14)."""

    def columns(row):
        profile = profiles[tasks.question(row)]
        band = profile["band"]
        return {
            PROFILED_REWARDS: profile[PROFILED_REWARDS],
            PROFILED_OUTPUT_LENGTHS: profile[PROFILED_OUTPUT_LENGTHS],
            PROFILE_BAND: {"total": {**band, "f": band_floor}} if band else None,
        }

    return dataset.map(columns)


def settings(arm: Arm, steps: int, task: tasks.Task = tasks.ARITHMETIC) -> dict:
    """Everything a run's result depends on, as JSON stores it; a stored run with other settings is redone."""
    profiles = uses_profiles(arm)
    stored = dict(
        keys=arm.keys,
        rewards=[[name, args] for name, args in arm.rewards],
        correctness_weight=arm.correctness_weight,
        band_floor=arm.band_floor if profiles else None,
        profile_samples=PROFILE_SAMPLES if profiles else None,
        steps=steps,
        training=task.training,
        eval_samples=task.eval_samples,
    )
    if arm.target_prompt:  # only then, so the other arms' stored runs stay valid
        stored["target_prompt"] = arm.target_prompt
    if task.lora:  # likewise
        stored["lora"] = task.lora
    return json.loads(json.dumps(with_task(stored, task)))


def train_run(arm_name: str, seed: int, steps: int, out: str, task_name: str = tasks.ARITHMETIC.name) -> dict:
    """One run on the task named ``task_name``: train, sample the held-out problems, return the record stored
    as JSON."""
    task = real_task.GRID_TASKS[task_name]
    arm = arms_by_name(task)[arm_name]
    started = time.perf_counter()
    dataset, held_out = task.training_set(seed), None
    if uses_profiles(arm):
        profiles = json.loads(warm_path(Path(out), seed).read_text())["profiles"]
        if arm.target_prompt:
            dataset, held_out = with_targets(dataset, task.held_out(), profiles, arm.target_prompt)
        else:
            dataset = with_profiles(dataset, profiles, arm.band_floor)
    with tempfile.TemporaryDirectory() as tmp:
        rewards, weights = peer_rewards(arm, task)
        trainer = demo.train_arm(
            arm.keys,
            seed,
            steps,
            tmp,
            train_dataset=dataset,
            extra_rewards=rewards,
            reward_weights=weights,
            task=task,
        )
        result = demo.evaluate_arm(trainer, task, held_out)
    history = [row for row in result["history"] if demo.LENGTH_KEY in row]
    metrics = sorted({key for row in history for key in row if key.startswith("length_penalty/")})
    return dict(
        arm=arm.name,
        seed=seed,
        settings=settings(arm, steps, task),
        train=dict(
            length=demo.tail_mean(history, demo.LENGTH_KEY, TAIL),
            accuracy=demo.tail_mean(history, task.accuracy_key, TAIL),
        ),
        eval=result["eval"],
        shaping={key: statistics.fmean(row[key] for row in history if key in row) for key in metrics},
        curve=[[row["step"], row[demo.LENGTH_KEY], row[task.accuracy_key]] for row in history],
        seconds=time.perf_counter() - started,
    )


def quiet() -> None:
    """One torch thread, no per-run progress bars or tokenizer notices (every worker, and the main process)."""
    import datasets
    import torch
    import transformers

    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def run_path(out: Path, arm_name: str, seed: int) -> Path:
    return out / "runs" / f"{slug(arm_name)}-seed{seed}.json"


def finished(out: Path, arm: Arm, seed: int, steps: int, task: tasks.Task = tasks.ARITHMETIC) -> dict | None:
    """The stored record of this run with these settings, if any."""
    path = run_path(out, arm.name, seed)
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return record if record["settings"] == settings(arm, steps, task) else None


def warm_weights(task: tasks.Task, seed: int) -> str:
    """The fingerprint of the warm model seed ``seed``'s runs start from (sha256 of its weights, 16 hex digits):
    a rebuilt warm model need not equal the one a stored summary was trained from."""
    import hashlib

    weights = task.model_dir(seed) / "model.safetensors"
    return hashlib.sha256(weights.read_bytes()).hexdigest()[:16]


def restore_runs(summaries: list[Path], out: Path, weights: str) -> int:
    """Write each run of the summaries into the run store where it has no record of that arm and seed;
    returns how many were written. A summary whose warm model is not ``weights`` (``warm_weights``; none
    recorded counts as another) is refused: its runs started from another model. A restored record has no
    curve (the summaries keep none); ``finished`` still redoes it when its settings differ from the arm's."""
    (out / "runs").mkdir(parents=True, exist_ok=True)
    written = 0
    for summary in summaries:
        stored = json.loads(summary.read_text())
        recorded = {w.get("weights") for w in stored["warm"]}
        if recorded != {weights}:
            raise ValueError(
                f"{summary}: its runs started from warm model {', '.join(map(str, sorted(recorded, key=str)))}, "
                f"not this machine's {weights}; not restored"
            )
        for record in stored["runs"]:
            path = run_path(out, record["arm"], record["seed"])
            if not path.exists():
                path.write_text(json.dumps(record))
                written += 1
    return written


def run_grid(
    arms: list[Arm],
    seeds: list[int],
    steps: int,
    out: Path,
    jobs: int = 1,
    run: Callable[[str, int, int, str, str], dict] = train_run,
    task: tasks.Task = tasks.ARITHMETIC,
) -> list[dict]:
    """Every (arm, seed) run on ``task``, finished ones skipped; each new record is written as soon as it
    finishes."""
    from tqdm.auto import tqdm

    (out / "runs").mkdir(parents=True, exist_ok=True)
    records, todo = [], []
    for seed in seeds:  # seed by seed, so an interrupted grid leaves every arm with the same seeds
        for arm in arms:
            record = finished(out, arm, seed, steps, task)
            if record is None:
                todo.append((arm.name, seed))
            else:
                records.append(record)
    bar = tqdm(total=len(todo), desc=f"runs ({len(records)} finished before)", unit="run")

    def keep(record: dict) -> None:
        run_path(out, record["arm"], record["seed"]).write_text(json.dumps(record))
        records.append(record)
        bar.set_postfix_str(f"{record['arm']}, seed {record['seed']}: {record['seconds']:.0f} s")
        bar.update(1)

    if jobs == 1:
        for arm_name, seed in todo:
            keep(run(arm_name, seed, steps, str(out), task.name))
    else:
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=quiet) as pool:
            futures = [
                pool.submit(run, arm_name, seed, steps, str(out), task.name) for arm_name, seed in todo
            ]
            for future in as_completed(futures):
                keep(future.result())
    bar.close()
    return records


#: bootstrap resamples of the seeds for each interval (docs/efficacy.md, "Setup")
BOOTSTRAP_RESAMPLES = 10_000


def paired_interval(deltas: list[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple:
    """The mean of per-seed paired differences and its 95% percentile bootstrap interval: ``resamples``
    draws of the seeds with replacement, the 2.5th and 97.5th percentiles of their means."""
    import numpy as np

    values = np.asarray(deltas, dtype=np.float64)
    draws = np.random.default_rng(seed).integers(0, len(values), size=(resamples, len(values)))
    low, high = np.percentile(values[draws].mean(axis=1), [2.5, 97.5])
    return float(values.mean()), float(low), float(high)


def separates(interval: tuple[float, float, float]) -> bool:
    """Whether a paired difference's interval excludes 0 (a claim may be made only then)."""
    return interval[1] > 0 or interval[2] < 0


def common_seeds(records: list[dict], a: str, b: str) -> list[int]:
    """The seeds both arms ran."""
    runs = {(r["arm"], r["seed"]) for r in records}
    return sorted(seed for name, seed in runs if name == a and (b, seed) in runs)


def paired_difference(records: list[dict], a: str, b: str, figure: str) -> tuple[float, float, float]:
    """Arm ``a`` minus arm ``b`` per seed that both ran, with its interval: ``figure`` ``length`` in percent
    of ``b``'s held-out length, ``accuracy`` in points."""
    by_run = {(r["arm"], r["seed"]): r["eval"] for r in records}
    seeds = common_seeds(records, a, b)
    if figure == "length":
        deltas = [100 * (by_run[a, s]["length"] / by_run[b, s]["length"] - 1) for s in seeds]
    else:
        deltas = [100 * (by_run[a, s]["accuracy"] - by_run[b, s]["accuracy"]) for s in seeds]
    return paired_interval(deltas)


def mean_spread(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def level_means(evals: list[dict]) -> list[dict] | None:
    """Per difficulty level, the mean over seeds of the held-out figures ``tasks.held_out_figures`` gives
    (accuracy and skipping in %), or None where a run has no levels (the arithmetic task)."""
    if not evals or any("levels" not in e for e in evals):
        return None
    by_level: dict[int, list[dict]] = {}
    for e in evals:
        for figures in e["levels"]:
            by_level.setdefault(figures["level"], []).append(figures)
    means = []
    for level, runs in sorted(by_level.items()):
        figures = dict(
            level=level,
            accuracy=100 * statistics.fmean(f["accuracy"] for f in runs),
            length=statistics.fmean(f["length"] for f in runs),
            skipped=100 * statistics.fmean(f["skipped"] for f in runs),
            redundant=statistics.fmean(f["redundant"] for f in runs),
        )
        if all("redundant_share" in f for f in runs):
            figures["redundant_share"] = 100 * statistics.fmean(f["redundant_share"] for f in runs)
        means.append(figures)
    return means


def summarize(records: list[dict], arms: list[Arm]) -> list[dict]:
    """Per arm with a run for every seed of plain GRPO: (mean, spread over seeds) of each figure; changes vs
    plain GRPO are taken per seed against the same seed's plain run (held-out length in %, accuracy in
    points), as are the means of the shaping metrics; ``levels``: the per-level means (``level_means``)."""
    by_run = {(r["arm"], r["seed"]): r for r in records}
    seeds = sorted(seed for name, seed in by_run if name == PLAIN)
    rows = []
    for arm in arms:
        if not all((arm.name, seed) in by_run for seed in seeds):
            continue
        pairs = [(by_run[arm.name, seed], by_run[PLAIN, seed]) for seed in seeds]
        row = {"arm": arm}
        for part in ("eval", "train"):
            row[f"{part}_length"] = mean_spread([r[part]["length"] for r, _ in pairs])
            row[f"{part}_accuracy"] = mean_spread([100 * r[part]["accuracy"] for r, _ in pairs])
        row["length_change"] = mean_spread(
            [100 * (r["eval"]["length"] / p["eval"]["length"] - 1) for r, p in pairs]
        )
        row["accuracy_change"] = mean_spread(
            [100 * (r["eval"]["accuracy"] - p["eval"]["accuracy"]) for r, p in pairs]
        )
        row["seeds"] = len(pairs)
        row["length_interval"] = paired_difference(records, arm.name, PLAIN, "length")
        row["accuracy_interval"] = paired_difference(records, arm.name, PLAIN, "accuracy")
        row["shaping"] = {
            key: statistics.fmean(r["shaping"].get(key, 0.0) for r, _ in pairs) for key in STATS
        }
        row["levels"] = level_means([r["eval"] for r, _ in pairs])
        if all("redundant_share" in r["eval"] for r, _ in pairs):
            row["redundant_share"] = mean_spread([100 * r["eval"]["redundant_share"] for r, _ in pairs])
        rows.append(row)
    return rows


def best_trade_off(rows: list[dict]) -> dict | None:
    """The arm with the largest mean held-out length cut whose mean accuracy loss is at most 2 points (None
    when no arm keeps accuracy so)."""
    eligible = [r for r in rows if r["arm"].name != PLAIN and r["accuracy_change"][0] >= -MAX_ACCURACY_LOSS]
    return min(eligible, key=lambda r: r["length_change"][0], default=None)


def _pm(pair: tuple[float, float], digits: int = 1, sign: str = "") -> str:
    return f"{pair[0]:{sign}.{digits}f} ± {pair[1]:.{digits}f}"


def level_table(rows: list[dict], warm: list[dict]) -> list[str]:
    """Accuracy per level (with length, skipping and redundancy) of the warm start and each arm, means over
    seeds; no lines where the runs have no levels."""
    named = [("warm start, before RL", level_means([w["eval"] for w in warm]))]
    named += [(r["arm"].name, r["levels"]) for r in rows]
    named = [(name, levels) for name, levels in named if levels]
    if not named:
        return []
    numbers = [figures["level"] for figures in named[0][1]]
    shares = all("redundant_share" in f for _, levels in named for f in levels)
    lines = [
        "",
        "Accuracy per level (held out, mean over seeds; per level: accuracy %, length in tokens, completions "
        "skipping necessary steps %, redundant clauses per completion"
        + (" (their share of the tokens, %)" if shares else "")
        + "):",
        "",
        "| arm | "
        + " | ".join(f"level {k}: accuracy / length / skipping / redundant" for k in numbers)
        + " |",
        "|---|" + "---|" * len(numbers),
    ]
    for name, levels in named:
        cells = [
            f"{f['accuracy']:.1f} / {f['length']:.1f} / {f['skipped']:.1f} / {f['redundant']:.2f}"
            + (f" ({f['redundant_share']:.0f}%)" if shares else "")
            for f in levels
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def markdown_tables(rows: list[dict], warm: list[dict]) -> str:
    """The results table (warm start first), the table of paired intervals, the table of shaping metrics and,
    where the runs have difficulty levels, the accuracy per level."""
    shares = all("redundant_share" in r for r in rows) and all("redundant_share" in w["eval"] for w in warm)
    share_head, share_rule = (" redundant tokens (%) |", "---|") if shares else ("", "")
    warm_share = (
        f" {_pm(mean_spread([100 * w['eval']['redundant_share'] for w in warm]))} |" if shares else ""
    )
    lines = [
        "| arm | held-out length (tokens) | length vs plain | held-out accuracy (%) | accuracy vs plain "
        f"(points) |{share_head} train length (tokens) | train accuracy (%) |",
        f"|---|---|---|---|---|{share_rule}---|---|",
        f"| warm start, before RL | {_pm(mean_spread([w['eval']['length'] for w in warm]))} | | "
        f"{_pm(mean_spread([100 * w['eval']['accuracy'] for w in warm]))} | |{warm_share} | |",
    ]
    for r in rows:
        share = f" {_pm(r['redundant_share'])} |" if shares else ""
        lines.append(
            f"| {r['arm'].name} | {_pm(r['eval_length'])} | {_pm(r['length_change'], sign='+')}% "
            f"| {_pm(r['eval_accuracy'])} | {_pm(r['accuracy_change'], sign='+')} |{share} {_pm(r['train_length'])} "
            f"| {_pm(r['train_accuracy'])} |"
        )
    lines += [
        "",
        "| arm | seeds | length vs plain (%), mean [95% CI] | accuracy vs plain (points), mean [95% CI] | "
        "intervals |",
        "|---|---|---|---|---|",
    ]
    for r in rows[1:] if rows and rows[0]["arm"].name == PLAIN else rows:
        length, accuracy = r["length_interval"], r["accuracy_interval"]
        verdict = ", ".join(
            f"{what} {'separates from 0' if separates(interval) else 'within noise'}"
            for what, interval in (("length", length), ("accuracy", accuracy))
        )
        lines.append(
            f"| {r['arm'].name} | {r['seeds']} | {length[0]:+.1f} [{length[1]:+.1f}, {length[2]:+.1f}] | "
            f"{accuracy[0]:+.1f} [{accuracy[1]:+.1f}, {accuracy[2]:+.1f}] | {verdict} |"
        )
    lines += [
        "",
        "| arm | " + " | ".join(STATS.values()) + " |",
        "|---|" + "---|" * len(STATS),
    ]
    for r in rows:
        if any(r["shaping"].values()):
            cells = [
                ""
                if v is None
                else f"{100 * v:.1f}"
                if key.endswith("_frac")
                else f"{round(v, 3) + 0.0:+.3f}"
                for key, v in r["shaping"].items()
            ]
            lines.append(f"| {r['arm'].name} | " + " | ".join(cells) + " |")
    return "\n".join(lines + level_table(rows, warm))


def pareto_front(rows: list[dict]) -> list[dict]:
    """The arms no other arm matches or beats on both mean held-out length change and accuracy change."""
    points = [(r["length_change"][0], r["accuracy_change"][0]) for r in rows]

    def beaten(x: float, y: float) -> bool:
        return any(ox <= x and oy >= y and (ox, oy) != (x, y) for ox, oy in points)

    return sorted(
        (r for r, p in zip(rows, points, strict=True) if not beaten(*p)), key=lambda r: r["length_change"][0]
    )


def plot_pareto(rows: list[dict], path: Path, title: str) -> Path:
    """Held-out length change (x) and accuracy change (y) vs plain GRPO, one point per arm with the 95%
    bootstrap intervals of its paired differences, the Pareto front and the target region. Arms that lose more
    than ``OFF_CHART`` accuracy points are named under the title instead, so the others stay readable."""
    plt = pyplot()

    off = [r for r in rows if r["accuracy_change"][0] < -OFF_CHART]
    rows = [r for r in rows if r not in off]
    if off:
        title += "\noff the chart (accuracy): " + ", ".join(
            f"{r['arm'].name} {r['accuracy_change'][0]:+.1f} points, {r['length_change'][0]:+.1f}%"
            for r in off
        )
    fig, ax = plt.subplots(figsize=(13, 7))
    ax.axvspan(-100, -TARGET_LENGTH_CUT, color="tab:green", alpha=0.06)
    ax.axhline(-MAX_ACCURACY_LOSS, color="tab:green", lw=0.8, ls="--")
    ax.axvline(
        -TARGET_LENGTH_CUT, color="tab:green", lw=0.8, ls="--", label="target: >= 30% shorter, >= -2 points"
    )
    families = list(dict.fromkeys(r["arm"].family for r in rows))
    for r in rows:
        (x, x_low, x_high), (y, y_low, y_high) = r["length_interval"], r["accuracy_interval"]
        dx, dy = [[x - x_low], [x_high - x]], [[y - y_low], [y_high - y]]
        k = families.index(r["arm"].family)
        first = r is next(o for o in rows if o["arm"].family == r["arm"].family)
        color = plt.get_cmap("tab20")((2 * k) % 20 + (2 * k) // 20 % 2)  # ten dark hues, then light ones
        ax.errorbar(x, y, xerr=dx, yerr=dy, fmt="none", ecolor=color, alpha=0.3, lw=0.8, capsize=2)
        ax.plot(x, y, MARKERS[k % len(MARKERS)], color=color, ms=7, label=r["arm"].family if first else None)
        ax.annotate(r["arm"].strength, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    front = pareto_front(rows)
    ax.plot(
        [r["length_change"][0] for r in front],
        [r["accuracy_change"][0] for r in front],
        "k-",
        lw=1,
        alpha=0.5,
        label="Pareto front (means)",
    )
    xs = [r["length_change"][0] for r in rows]
    ax.set_xlim(min(*xs, -TARGET_LENGTH_CUT) - 5, max(xs) + 5)
    ax.set_xlabel("held-out mean completion length vs plain GRPO (%)")
    ax.set_ylabel("held-out accuracy vs plain GRPO (points)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return save_figure(fig, path, dpi=110)


def write_summary(
    records: list[dict], warm: list[dict], seeds: list[int], path: Path, task: tasks.Task | None = None
) -> Path:
    """Every run's record (its per-step curve of ``[step, length, accuracy]`` rounded to 4 digits where
    ``task`` is given, else without it, as the earlier summaries), each seed's warm-start figures and, with
    ``task``, the task, its warm model's folder and weights fingerprint, as one JSON file."""

    def kept(record: dict) -> dict:
        if task is None:
            return {key: value for key, value in record.items() if key != "curve"}
        curve = [
            [step, round(length, 4), round(accuracy, 4)] for step, length, accuracy in record.get("curve", [])
        ]
        return {**record, "curve": curve}

    runs = sorted(map(kept, records), key=lambda r: (r["arm"], r["seed"]))
    warm_eval = [
        dict(seed=seed, eval=w["eval"], weights=w.get("weights")) for seed, w in zip(seeds, warm, strict=True)
    ]
    named = {}
    if task is not None:
        named = dict(
            task=task.name, model=task.model_dir(task.warm_seed or 0).name, weights=warm[0].get("weights")
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(dict(**named, warm=warm_eval, runs=runs), indent=1)
    path.write_text(re.sub(r"\[\s+(\d+),\s+([\d.]+),\s+([\d.]+)\s+\]", r"[\1, \2, \3]", text) + "\n")
    return path


def is_peer(arm: Arm) -> bool:
    return arm.family in {peer.family for peer in PEER_ARMS}


def versus_peers(records: list[dict], rows: list[dict]) -> str:
    """Each of our arms against each peer arm, paired per seed: held-out length in percent of the peer's and
    accuracy in points, with 95% intervals; "shorter"/"more accurate" only where the interval excludes 0."""
    ours = [r["arm"].name for r in rows if r["arm"].name != PLAIN and not is_peer(r["arm"])]
    peers = [r["arm"].name for r in rows if is_peer(r["arm"])]
    if not ours or not peers:
        return ""
    lines = [
        "| ours | vs peer | seeds | length vs peer (%), mean [95% CI] | accuracy vs peer (points), mean [95% CI] "
        "| verdict |",
        "|---|---|---|---|---|---|",
    ]
    for peer in peers:
        for arm in ours:
            length = paired_difference(records, arm, peer, "length")
            accuracy = paired_difference(records, arm, peer, "accuracy")
            seeds = len(common_seeds(records, arm, peer))
            verdict = ", ".join(
                (low if interval[0] < 0 else high) if separates(interval) else f"{what} tie"
                for what, interval, low, high in (
                    ("length", length, "shorter", "longer"),
                    ("accuracy", accuracy, "less accurate", "more accurate"),
                )
            )
            lines.append(
                f"| {arm} | {peer} | {seeds} | {length[0]:+.1f} [{length[1]:+.1f}, {length[2]:+.1f}] | "
                f"{accuracy[0]:+.1f} [{accuracy[1]:+.1f}, {accuracy[2]:+.1f}] | {verdict} |"
            )
    return "\n".join(lines)


def all_tables(records: list[dict], rows: list[dict], warm: list[dict]) -> str:
    """Every table of docs/efficacy.md: the results, intervals, shaping metrics, levels and ours vs peers."""
    versus = versus_peers(records, rows)
    return markdown_tables(rows, warm) + (f"\n\n{versus}" if versus else "")


def plot_curves(records: list[dict], arms: list[Arm], path: Path, title: str) -> Path | None:
    """Training length and accuracy per step, mean over seeds, one line per arm (None where the records keep no
    curves)."""
    plt = pyplot()

    if not all(r.get("curve") for r in records):
        return None
    fig, (length_ax, accuracy_ax) = plt.subplots(1, 2, figsize=(15, 5.5))
    for k, arm in enumerate(arms):
        curves = [r["curve"] for r in records if r["arm"] == arm.name]
        if not curves:
            continue
        steps = [row[0] for row in curves[0]]
        style = dict(color=plt.get_cmap("tab20")(k % 20), lw=2.2 if arm.name == PLAIN else 1.0)
        for ax, column, scale in ((length_ax, 1, 1.0), (accuracy_ax, 2, 100.0)):
            values = [scale * statistics.fmean(c[i][column] for c in curves) for i in range(len(steps))]
            ax.plot(steps, smooth(values), label=arm.name, ls="-" if k < 10 else "--", **style)
    length_ax.set_ylabel("training completion length (tokens, 5-step mean)")
    accuracy_ax.set_ylabel("training accuracy (%, 5-step mean)")
    for ax in (length_ax, accuracy_ax):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    accuracy_ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(title)
    return save_figure(fig, path)


def smooth(values: list[float], window: int = 5) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def curves_path(png: Path) -> Path:
    """Where the per-step curves PNG goes beside the Pareto PNG."""
    return png.with_name(png.stem.removesuffix("_pareto") + "_curves.png")


def check_block(doc: Path, name: str) -> tuple[str, str, str]:
    """``doc``'s text and the markers ``<!-- NAME: begin -->``, ``<!-- NAME: end -->`` of its block; a one-line
    error where the doc or the block is missing (checked before a grid starts)."""
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    content = doc.read_text() if doc.is_file() else ""
    if begin not in content or end not in content:
        raise SystemExit(f"error: {doc} has no {begin} ... {end} block to regenerate")
    return content, begin, end


def replace_block(doc: Path, name: str, text: str) -> None:
    """Write ``text`` between the markers of ``doc``'s block ``name`` (``check_block``)."""
    content, begin, end = check_block(doc, name)
    head, rest = content.split(begin, 1)
    doc.write_text(f"{head}{begin}\n{text}\n{end}{rest.split(end, 1)[1]}")


def stored_rows(stored: dict) -> tuple[tasks.Task, list[Arm], list[dict]]:
    """A summary's task, its arms in the grid's order and their rows (``summarize``)."""
    records = stored["runs"]
    names = {r["arm"] for r in records}
    task = real_task.GRID_TASKS[
        stored.get("task") or records[0]["settings"].get("task", tasks.ARITHMETIC.name)
    ]
    arms = [arm for arm in TASK_ARMS[task.name] if arm.name in names]
    return task, arms, summarize(records, arms)


def regenerate(summary: Path, out: Path, png: Path, doc: Path | None = None) -> None:
    """The tables, the Pareto PNG and the per-step curves PNG from a summary file alone, arms in the grid's
    order; with ``doc``, the tables also replace that doc's block named after the summary file."""
    stored = json.loads(summary.read_text())
    records = stored["runs"]
    task, arms, rows = stored_rows(stored)
    tables = all_tables(records, rows, stored["warm"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(tables + "\n")
    print(tables)
    seeds = sorted({r["seed"] for r in records if r["arm"] == PLAIN})
    title = f"length control on {described(task)}: seeds {seeds[0]}-{seeds[-1]}"
    plot_pareto(rows, png, title)
    curves = plot_curves(records, arms, curves_path(png), title + ", per step")
    if doc is not None:
        weights = stored.get("weights") or "not recorded"
        named = (
            f"model {stored.get('model', 'not recorded')} (weights {weights}), task {stored['task']}; "
            if "task" in stored
            else ""
        )
        replace_block(
            doc, summary.name, f"_Generated from `{summary.name}` ({named}{len(records)} runs)._\n\n{tables}"
        )
    print(
        f"# from {summary}: {len(records)} runs; tables: {out / 'table.md'}; Pareto PNG: {png}; curves: {curves}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--task",
        choices=list(real_task.GRID_TASKS),
        default=tasks.ARITHMETIC.name,
        help="the embedded task (docs/embedded.md) or the real chat model's; its runs are stored apart from the others'",
    )
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated; figures are means over seeds")
    parser.add_argument("--steps", type=int, default=tasks.STEPS, help="GRPO optimizer steps per run")
    parser.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="runs trained at once, one worker process each (1: in this process)",
    )
    parser.add_argument(
        "--arms", default="", help="comma-separated arm names (default all); plain GRPO always runs"
    )
    parser.add_argument(
        "--out",
        default="",
        help="run records, warm profiles, the table (default outputs/efficacy, or outputs/efficacy-TASK)",
    )
    parser.add_argument("--png", default="", help="the Pareto PNG (default OUT/efficacy_pareto.png)")
    parser.add_argument(
        "--summary",
        default="",
        help="also write every run's record (no curves) to this JSON file, the summary committed beside the doc",
    )
    parser.add_argument(
        "--restore",
        default="",
        help="comma-separated summary JSON files whose runs seed the run store (runs already there are kept)",
    )
    parser.add_argument(
        "--from-summary",
        default="",
        help="regenerate the tables and the PNGs from such a JSON file alone: no warm models, no training",
    )
    parser.add_argument(
        "--doc",
        default="",
        help="with --from-summary: also write the tables into this doc's block named after the summary file",
    )
    args = parser.parse_args(argv)
    task = real_task.GRID_TASKS[args.task]
    args.out = args.out or (
        "outputs/efficacy" if task is tasks.ARITHMETIC else f"outputs/efficacy-{task.name}"
    )
    args.png = args.png or str(Path(args.out) / "efficacy_pareto.png")
    if args.from_summary:
        return regenerate(
            Path(args.from_summary), Path(args.out), Path(args.png), Path(args.doc) if args.doc else None
        )
    quiet()
    started = time.perf_counter()
    seeds = [int(s) for s in args.seeds.split(",")]
    wanted = [name.strip() for name in args.arms.split(",") if name.strip() and name.strip() != PLAIN]
    by_name = arms_by_name(task)
    arms = [by_name[PLAIN], *(by_name[name] for name in wanted)] if wanted else TASK_ARMS[task.name]
    profiled = any(map(uses_profiles, arms))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.restore:
        weights = warm_weights(task, task.warm_seed or 0)
        restored = restore_runs([Path(p) for p in args.restore.split(",")], out, weights)
        print(f"# restored {restored} runs from {args.restore} into {out / 'runs'}")
    warm = []
    for seed in seeds:
        path = warm_path(out, seed)
        stored = json.loads(path.read_text()) if path.exists() else None
        if stored is None or stored["settings"] != warm_settings(task, profiled):
            if warm and task.warm_seed is not None and not profiled:  # one warm model, no per-seed profiles
                stored = {key: value for key, value in warm[0].items() if key != "weights"}
            else:
                print(
                    f"# warm model of seed {seed}: held-out samples"
                    + (f" and {PROFILE_SAMPLES} rollouts per training problem" if profiled else "")
                )
                stored = warm_reference(seed, task, profiled)
            path.write_text(json.dumps(stored))
        warm.append({**stored, "weights": warm_weights(task, seed)})
    records = run_grid(arms, seeds, args.steps, out, args.jobs, task=task)
    if args.summary:
        write_summary(records, warm, seeds, Path(args.summary), task)
    rows = summarize(records, arms)
    tables = all_tables(records, rows, warm)
    (out / "table.md").write_text(tables + "\n")
    print(
        f"\n# {task.name} task, {args.steps} steps, seeds {args.seeds}; held out: {len(task.held_out())} problems x "
        f"{task.eval_samples} samples at temperature {task.training['temperature']}; train: last {TAIL} steps"
    )
    print(tables)
    header(f"held-out figures, mean over seeds {args.seeds}: each arm (measured) vs plain GRPO (baseline)")
    plain = rows[0]
    for r in rows[1:]:
        report(f"{r['arm'].name}: length", r["eval_length"][0], plain["eval_length"][0], "tk")
        report(f"{r['arm'].name}: accuracy", r["eval_accuracy"][0], plain["eval_accuracy"][0], "%")
    title = f"length control on {described(task)}: {args.steps} steps, seeds {args.seeds}"
    png = plot_pareto(rows, Path(args.png), title)
    plot_curves(records, arms, curves_path(Path(args.png)), title + ", per step")
    best = best_trade_off(rows)
    if best is None:
        print(f"# best trade-off: no arm within {MAX_ACCURACY_LOSS:g} points of plain GRPO's accuracy")
    else:
        cut, change = -best["length_change"][0], best["accuracy_change"][0]
        print(
            f"# best trade-off (largest held-out length cut at <= {MAX_ACCURACY_LOSS:g} points accuracy loss): "
            f"{best['arm'].name}: length {-cut:+.1f}%, accuracy {change:+.1f} points; target (>= "
            f"{TARGET_LENGTH_CUT:g}% shorter) {'met' if cut >= TARGET_LENGTH_CUT else 'not met'}"
        )
    print(
        f"# Pareto PNG: {png}; tables: {out / 'table.md'}; {len(records)} runs, "
        f"{sum(r['seconds'] for r in records) / 60:.1f} min of run time in all; this invocation "
        f"{(time.perf_counter() - started) / 60:.1f} min wall (--jobs {args.jobs})"
    )


if __name__ == "__main__":
    main()
