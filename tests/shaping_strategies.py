"""Hypothesis strategies for random shaping batches and configs (every key of docs/reference/length-penalties.md §2.1)."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st

BINARY = [0.0] * 5 + [1.0] * 7 + [1 - 5e-7, 1 + 2e-7, 4e-7, -3e-7]
NON_BINARY = [0.5, -1.0, math.nan, 2.0]
CHANNEL_NAMES = ("total", "reasoning", "answer")

small_positive = st.sampled_from([0.0, 0.0, 0.05, 0.1, 0.3])
PARAMS = {
    "enabled": st.sampled_from([True, True, True, False]),
    "length_type": st.sampled_from(["tokens", "chars"]),
    "top_percentile": st.sampled_from([0.1, 0.25, 0.5, 0.75, 1.0]),
    **{f"{c}_bonus": small_positive for c in ("reasoning", "answer", "total")},
    **{f"longest_{c}_penalty": small_positive for c in ("reasoning", "answer", "total")},
    **{f"group_{c}_length_penalty_coeff": small_positive for c in ("reasoning", "answer", "total")},
    **{
        f"{c}_zmad_threshold": st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5])
        for c in ("reasoning", "answer", "total")
    },
    **{f"{c}_zmad_penalty": small_positive for c in ("reasoning", "answer", "total")},
    "profiled_length_penalty": small_positive,
    "profiled_length_n_std": st.sampled_from([0.0, 0.5, 1.0, 2.0, -0.5]),
    "profiled_length_min_samples": st.sampled_from([1, 2, 3]),
    "pass_rate_length_penalty_weight": st.sampled_from([0.0, 0.0, 0.2, 1.0]),
    "profile_band_total": st.booleans(),
    "profile_band_reasoning": st.booleans(),
    "profile_band_answer": st.booleans(),
    "group_length_penalty_profile_gate": st.booleans(),
    "group_length_penalty_profile_gate_channel": st.sampled_from(CHANNEL_NAMES),
    "group_length_penalty_profile_gate_field": st.sampled_from(["a", "b", "f"]),
    "group_length_penalty_profile_gate_positive_only": st.booleans(),
}

params_block = st.fixed_dictionaries({}, optional=PARAMS)


@st.composite
def valid_band(draw, scale=40):
    a = draw(st.integers(0, scale))
    return {"a": a, "b": a + draw(st.integers(1, scale)), "f": draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))}


malformed_band = st.sampled_from(
    [
        {"a": 5, "b": 3, "f": 0.5},
        {"a": -3, "b": 2, "f": 0.5},
        {"a": 1, "b": 2, "f": 1.5},
        {"a": True, "b": 2, "f": 0.5},
        {"a": "1", "b": 2, "f": 0.5},
        {"a": 1, "b": 2},
        {"a": 1, "b": math.inf, "f": 0.5},
        "garbage",
    ]
)


def without_idle_keys(block: dict, merged: dict) -> dict:
    """``block`` without the keys of terms that no switch turns on in ``merged`` (refused at load, §2.6)."""
    from trl_length_plugin.shaping.terms import switched_on, terms

    def on(term) -> bool:
        return any(switched_on(merged.get(key, term.parameters[key].default)) for key in term.switches)

    idle = {key for term in terms() if not on(term) for key in term.parameters if key not in term.switches}
    return {key: value for key, value in block.items() if key not in idle}


@st.composite
def config_dict(draw):
    default = draw(params_block)
    config = {"default": without_idle_keys(default, default), "verbose": draw(st.booleans())}
    if draw(st.booleans()):
        overrides = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "math": st.one_of(st.none(), params_block),
                    "code": st.one_of(st.none(), params_block),
                },
            )
        )
        config["agent_overrides"] = {
            agent: None if block is None else without_idle_keys(block, {**config["default"], **block})
            for agent, block in overrides.items()
        }
    if draw(st.booleans()):
        defaults = draw(st.fixed_dictionaries({}, optional={ch: valid_band() for ch in CHANNEL_NAMES}))
        config["profile_band"] = {"enabled": draw(st.booleans()), "defaults": defaults}
    return config


@st.composite
def metadata_entry(draw, scale=40, numbers="mixed"):
    kind = draw(st.sampled_from(["none", "meta", "meta", "meta", "not_mapping"]))
    if kind == "none":
        return None
    if kind == "not_mapping":
        return "not a mapping"
    meta = {}
    band_kind = draw(st.sampled_from(["absent", "none", "mapping", "mapping", "bad"]))
    if band_kind == "none":
        meta["profile_band"] = None
    elif band_kind == "bad":
        meta["profile_band"] = [1, 2, 3]
    elif band_kind == "mapping":
        meta["profile_band"] = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    ch: st.one_of(st.none(), valid_band(scale), valid_band(scale), malformed_band)
                    for ch in CHANNEL_NAMES
                },
            )
        )
    profile_kind = draw(
        st.sampled_from(["absent", "valid", "valid", "valid", "mismatch", "non_number", "half"])
    )
    if profile_kind != "absent":
        n = draw(st.integers(0, 6))
        # a batch of plain ints takes the engine's struct fast path, anything else its numpy conversion
        reward, length = st.sampled_from([0, 1, 1]), st.integers(0, 2 * scale)
        if numbers == "mixed":
            reward |= st.sampled_from([1.0, 0.0])
            if draw(st.integers(0, 3)) == 0:
                reward |= st.sampled_from([True, False, -1, 0.5, np.int64(1), 2**70])
                length |= st.sampled_from([1.5, True, np.int64(7), 2**70])
        rewards = draw(st.lists(reward, min_size=n, max_size=n))
        lengths = draw(st.lists(length, min_size=n, max_size=n))
        if profile_kind == "mismatch":
            lengths = [*lengths, 3]
        elif profile_kind == "non_number":
            lengths = [*lengths, draw(st.sampled_from(["7", "seven", None, [3]]))]
            rewards = [*rewards, 1]
        elif profile_kind == "half":
            rewards = None
        meta["profiled_rewards"] = rewards
        meta["profiled_output_lengths"] = lengths
    return meta


@st.composite
def shaping_batch(draw, uniform=None, shared_metadata=False):
    """(rewards, group ids, reasoning, answer, agents, metadata, multi_component) as Python lists."""
    noisy = draw(st.integers(0, 3)) == 0
    scale = draw(st.sampled_from([3, 40, 5000]))
    if uniform is None:
        uniform = draw(st.booleans())
    if uniform:
        size = draw(st.sampled_from([1, 2, 4, 8, 6]))
        sizes = [size] * draw(st.integers(1, 6))
    else:
        sizes = draw(st.lists(st.integers(1, 9), min_size=1, max_size=6))
    id_kind = draw(st.sampled_from(["int", "numpy", "sparse"]))
    keys = {"int": list(range(len(sizes))), "numpy": [np.int32(9 - i) for i in range(len(sizes))]}.get(
        id_kind, [7 * i + 3 for i in range(len(sizes))]
    )
    group_index = [keys[g] for g, size in enumerate(sizes) for _ in range(size)]
    if not uniform and draw(st.booleans()):
        group_index = draw(st.permutations(group_index))
    rows = len(group_index)
    rewards = draw(
        st.lists(st.sampled_from(BINARY + NON_BINARY if noisy else BINARY), min_size=rows, max_size=rows)
    )
    length = st.integers(0, scale)
    reasoning = draw(st.lists(length, min_size=rows, max_size=rows))
    answer = draw(st.lists(length, min_size=rows, max_size=rows))
    agent = st.sampled_from(["math", "code", "other", None])
    agents = None
    if draw(st.booleans()):
        if shared_metadata:  # per prompt: every row of a group has the same agent and metadata
            per_group = {key: draw(agent) for key in keys}
            agents = [per_group[key] for key in group_index]
        else:
            agents = draw(st.lists(agent, min_size=rows, max_size=rows))
    metadata = None
    if draw(st.booleans()):
        entry = metadata_entry(scale, draw(st.sampled_from(["ints", "mixed"])))
        if shared_metadata:
            per_group = {key: draw(entry) for key in keys}
            metadata = [per_group[key] for key in group_index]
        else:
            metadata = draw(st.lists(entry, min_size=rows, max_size=rows))
    multi = None
    if noisy and draw(st.booleans()):
        multi = draw(st.lists(st.booleans(), min_size=rows, max_size=rows))
    return rewards, group_index, reasoning, answer, agents, metadata, multi


class Opaque:
    """An object no metadata parser knows."""


_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.just(10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.sampled_from([np.int32(4), np.float32(2.5), np.float64(7.0), np.bool_(True), np.float64("nan")]),
    st.sampled_from([torch.tensor(3), torch.tensor(1.5), torch.tensor(True), np.array(6.0)]),
    st.just(Opaque()),
)
_numbers = st.one_of(
    st.lists(_scalar, max_size=5),
    st.lists(st.integers(-5, 60), max_size=6).map(lambda xs: np.array(xs, dtype=np.int64)),
    st.lists(st.floats(-5, 60), max_size=6).map(lambda xs: torch.tensor(xs, dtype=torch.float64)),
    st.lists(st.integers(0, 60), max_size=6).map(tuple),
    st.just(np.zeros((2, 2))),
)
_block = st.one_of(
    _scalar,
    _numbers,
    st.fixed_dictionaries({}, optional={key: st.one_of(_scalar, _numbers) for key in ("a", "b", "f", "x")}),
    valid_band(),
)
_band = st.one_of(
    _scalar,
    _numbers,
    st.dictionaries(st.sampled_from([*CHANNEL_NAMES, "Total", "all", "answer "]), _block, max_size=4),
)


_length = st.one_of(
    st.integers(0, 60),
    st.integers(-3, -1),
    st.sampled_from([2**53 + 2, 2**70, 1e300, np.int64(9), np.float32(12.0), torch.tensor(15), np.array(8)]),
    st.sampled_from([1.5, True, None, "7"]),
)
_reward = st.one_of(
    st.sampled_from([0, 1, 1, 1.0, True, False, np.int8(1), torch.tensor(1.0), 0.5, -1]), _scalar
)


@st.composite
def _profile(draw):
    """Equal-length profiled lists (sometimes as numpy arrays or tensors) of near-valid numbers."""
    n = draw(st.integers(0, 5))
    rewards = draw(st.lists(_reward, min_size=n, max_size=n))
    lengths = draw(st.lists(_length, min_size=n, max_size=n))
    container = draw(st.sampled_from(["list", "list", "tuple", "numpy", "tensor"]))
    if container == "tuple":
        return tuple(rewards), tuple(lengths)
    plain = all(isinstance(x, int) and not isinstance(x, bool) and abs(x) < 2**53 for x in lengths)
    if container == "numpy" and plain:
        return np.array([1] * n), np.array(lengths, dtype=np.int64)
    if container == "tensor" and plain:
        return torch.ones(n), torch.tensor(lengths, dtype=torch.float64)
    return rewards, lengths


@st.composite
def wild_metadata_entry(draw):
    """Any per-row metadata object: valid entries, near-misses (numpy/tensor numbers, wrong channel names,
    negative or absurd lengths) and garbage of every type (issue 11's fuzzing)."""
    kind = draw(st.sampled_from(["valid", "near", "near", "near", "garbage"]))
    if kind == "valid":
        return draw(metadata_entry(40, "mixed"))
    if kind == "garbage":
        return draw(st.one_of(_scalar, _numbers, st.dictionaries(st.text(max_size=4), _scalar, max_size=3)))
    entry = {}
    if draw(st.booleans()):
        entry["profiled_rewards"], entry["profiled_output_lengths"] = draw(_profile())
    elif draw(st.booleans()):
        entry["profiled_rewards"], entry["profiled_output_lengths"] = draw(_numbers), draw(_numbers)
    if draw(st.booleans()):
        entry["profile_band"] = draw(_band)
    return entry


@st.composite
def rollout_params(draw, scale=60):
    """The per-rollout terms' keys (reference §2.17-2.20) for one block: each term on or off, its keys
    within what the loader accepts."""
    block = {}
    if draw(st.booleans()):
        longest = draw(st.integers(1, scale))
        block |= {"overlong_max_length": longest, "overlong_buffer": draw(st.integers(1, longest)),
                  "overlong_factor": draw(st.sampled_from([0.5, 1.0, 2.0])),
                  "overlong_channel": draw(st.sampled_from(CHANNEL_NAMES))}  # fmt: skip
    if draw(st.booleans()):  # a correct reward falls with the length and stays above every wrong one
        wrong = draw(st.lists(st.sampled_from([-1.0, -0.5, 0.0]), min_size=2, max_size=2))
        low = draw(st.sampled_from([v for v in (-0.5, 0.0, 0.5, 1.0) if v >= max(wrong)]))
        block |= {
            "cosine_max_length": draw(st.integers(1, scale)),
            "cosine_channel": draw(st.sampled_from(CHANNEL_NAMES)),
            "cosine_min_value_wrong": wrong[0],
            "cosine_max_value_wrong": wrong[1],
            "cosine_min_value_correct": low,
            "cosine_max_value_correct": draw(st.sampled_from([low, low + 0.5, 2.0])),
        }
    mode = draw(st.sampled_from(["none", "none", "exact", "max"]))
    if mode != "none":
        block |= {"target_length": mode, "target_length_alpha": draw(st.sampled_from([0.01, 0.05, 0.3])),
                  "target_length_channel": draw(st.sampled_from(CHANNEL_NAMES))}  # fmt: skip
        if mode == "max":
            block["target_length_delta"] = draw(st.sampled_from([0.0, 0.5, 1.0]))
    truncation = draw(st.sampled_from(["none", "none", "mask", "penalty", "incorrect"]))
    if truncation != "none":
        block["truncation"] = truncation
        if truncation == "penalty":
            block["truncation_penalty_factor"] = draw(st.sampled_from([0.0, 0.5, 1.0]))
    return block


@st.composite
def every_term_config(draw):
    """``config_dict`` with the per-rollout terms in ``default`` and in the overrides too."""
    config = draw(config_dict())
    default = {**config["default"], **draw(rollout_params())}
    config["default"] = without_idle_keys(default, default)
    for agent, block in (config.get("agent_overrides") or {}).items():
        if block is not None and draw(st.booleans()):
            merged = {**block, **draw(rollout_params())}
            config["agent_overrides"][agent] = without_idle_keys(merged, {**config["default"], **merged})
    return config


@st.composite
def prompt_entry(draw, scale=60):
    """One prompt's well-formed metadata (§2.14): a profile, a band and a target, each present or not."""
    entry = {}
    if draw(st.booleans()):
        n = draw(st.integers(1, 5))
        entry["profiled_rewards"] = draw(st.lists(st.sampled_from([0, 1, 1]), min_size=n, max_size=n))
        entry["profiled_output_lengths"] = draw(st.lists(st.integers(0, 2 * scale), min_size=n, max_size=n))
    if draw(st.booleans()):
        entry["profile_band"] = draw(
            st.fixed_dictionaries({}, optional={ch: valid_band(scale) for ch in CHANNEL_NAMES})
        )
    if draw(st.booleans()):
        entry["target_length"] = draw(st.integers(1, 2 * scale))
    return entry or None


@st.composite
def ordered_groups(draw, scale=60):
    """A batch of prompt groups whose rows are mostly comparable by length: per group and channel, distinct
    lengths in increasing order over a random ranking of the rows (the shortest ones possibly empty), one
    channel sometimes shuffled. Per prompt: an agent and metadata. Returns the ``RolloutBatch`` fields as
    lists, with truncated flags for the longest totals (truncation is reaching the length limit) and the
    total length as the loss-mask length."""
    rewards, group_index, reasoning, answer, agents, metadata = [], [], [], [], [], []
    cutoff = draw(st.one_of(st.none(), st.integers(1, 2 * scale)))
    for group in range(draw(st.integers(1, 4))):
        size = draw(st.integers(2, 6))
        rank = draw(st.permutations(range(size)))
        channels = []
        for _ in range(2):
            empty = draw(st.integers(0, size))
            values = sorted(
                draw(st.sets(st.integers(1, scale), min_size=size - empty, max_size=size - empty))
            )
            ordered = [0] * empty + values
            if draw(st.integers(0, 4)) == 0:
                ordered = draw(st.permutations(ordered))
            channels.append([ordered[r] for r in rank])
        reasoning += channels[0]
        answer += channels[1]
        values = [0.0, 1.0, 1.0] if draw(st.integers(0, 3)) else [0.0, 1.0, 1 - 5e-7, 0.5]
        rewards += draw(st.lists(st.sampled_from(values), min_size=size, max_size=size))
        group_index += [group] * size
        agent, entry = draw(st.sampled_from(["math", "code", None])), draw(prompt_entry(scale))
        agents += [agent] * size
        metadata += [entry] * size
    totals = [r + a for r, a in zip(reasoning, answer, strict=True)]
    truncated = [cutoff is not None and total >= cutoff for total in totals]
    return rewards, group_index, reasoning, answer, agents, metadata, truncated, totals
