"""Slow, obviously correct reference of the length shaping: plain Python, float64, one loop per group.

Written from docs/reference (length-penalties.md §2, length-coefficient.md §3) independently of the vectorized engine in ``trl_length_plugin.shaping``;
the tests compare the two on random batches (tests/test_shaping_reference.py) and the benchmark times
the engine against it (bench/bench_shaping.py).
"""

from __future__ import annotations

import math
import numbers
import statistics
from collections import defaultdict
from collections.abc import Mapping

import numpy as np
import torch

CHANNELS = ("reasoning", "answer", "total")
BAND_ORDER = ("total", "reasoning", "answer")
GATE_FIELDS = ("a", "b", "f")
MAX_LENGTH = 2.0**53


def groups_in_order(group_index):
    """{group id: [row, ...]} in order of first appearance, rows ascending."""
    groups = {}
    for row, key in enumerate(group_index):
        groups.setdefault(key, []).append(row)
    return groups


def resolve_params(config, agent):
    """Reference §2.3 and §2.12: default, implicit global band channels, then the override's set keys."""
    params = config.default.model_dump()
    for channel in global_bands(config):
        if f"profile_band_{channel}" not in config.default.model_fields_set:
            params[f"profile_band_{channel}"] = True
    override = (config.agent_overrides or {}).get(agent)
    if override is not None:
        params.update(override.model_dump(exclude_unset=True))
    return params


def global_bands(config):
    band = config.profile_band
    if band is None or not band.enabled:
        return {}
    found = {}
    for channel in BAND_ORDER:
        block = getattr(band.defaults, channel)
        if block is not None:
            found[channel] = (block.a, block.b, block.f)
    return found


def as_number(value, bools=False):
    """A finite real number (Python, numpy or 0-d array/tensor scalar) as a float, else None; a bool is a
    number only with ``bools``."""
    if isinstance(value, (np.ndarray, torch.Tensor)):
        if value.ndim != 0:
            return None
        value = value.item()
    if isinstance(value, (bool, np.bool_)):
        return float(value) if bools else None
    if not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def as_length(value):
    number = as_number(value)
    return number if number is not None and abs(number) <= MAX_LENGTH else None


def as_list(values):
    if isinstance(values, (list, tuple)):
        return list(values)
    if isinstance(values, (np.ndarray, torch.Tensor)) and values.ndim == 1:
        return values.tolist()
    return None


def read_band(block):
    """(a, b, f), None when absent, "invalid" when malformed."""
    if block is None:
        return None
    if not isinstance(block, Mapping):
        return "invalid"
    a, b, f = as_length(block.get("a")), as_length(block.get("b")), as_number(block.get("f"))
    if a is None or b is None or f is None:
        return "invalid"
    if a < 0 or b <= a or f < 0 or f > 1:
        return "invalid"
    return (a, b, f)


def read_profile(rewards, lengths):
    """The passing profiled lengths, or "invalid"."""
    r, x = as_list(rewards), as_list(lengths)
    if r is None or x is None or len(r) != len(x):
        return "invalid"
    r = [as_number(v, bools=True) for v in r]
    x = [as_length(v) for v in x]
    if any(v is None for v in r) or any(v is None or v < 0 for v in x):
        return "invalid"
    return [length for reward, length in zip(r, x, strict=True) if reward > 0]


def read_metadata(meta, config, read_bands=True, read_profiles=True):
    """Merged bands per channel, passing profiled lengths (or None) and the set of malformed keys;
    only the parts asked for are read."""
    bands = dict(global_bands(config))
    invalid = set()
    passing = None
    if meta is None:
        return bands, passing, invalid
    if not isinstance(meta, Mapping):
        bad = ({"total", "reasoning", "answer"} if read_bands else set()) | (
            {"profiled"} if read_profiles else set()
        )
        return bands, passing, bad
    row_band = meta.get("profile_band") if read_bands else None
    if row_band is not None and not isinstance(row_band, Mapping):
        invalid |= {"total", "reasoning", "answer"}
    elif row_band is not None:
        if any(name not in BAND_ORDER for name in row_band):
            invalid.add("channel_name")
        for channel in BAND_ORDER:
            block = read_band(row_band.get(channel))
            if block == "invalid":
                invalid.add(channel)
            elif block is not None:
                bands[channel] = block
    rewards, lengths = meta.get("profiled_rewards"), meta.get("profiled_output_lengths")
    if read_profiles and rewards is not None and lengths is not None:
        profile = read_profile(rewards, lengths)
        if profile == "invalid":
            invalid.add("profiled")
        else:
            passing = profile
    return bands, passing, invalid


def read_target(meta):
    """Reference §2.20: (target length or None, malformed)."""
    if meta is None:
        return None, False
    if not isinstance(meta, Mapping):
        return None, True
    value = meta.get("target_length")
    if value is None:
        return None, False
    number = as_length(value)
    if number is None or number <= 0:
        return None, True
    return number, False


def band_multiplier(length, band):
    a, b, f = band
    if length <= a:
        return 1.0
    if length >= b:
        return f
    return 1 - (length - a) / (b - a) * (1 - f)


def rollout_reward(p, correct, lengths, truncated, target=None):
    """Reference §2.17-2.20: (rollout reward, {term: value}) of one rollout of correctness ``correct``
    (``target``: its prompt's target length, or None)."""
    value, terms = correct, {}
    if p["cosine_max_length"]:
        t = min(lengths[p["cosine_channel"]] / p["cosine_max_length"], 1.0)
        if correct > 0:
            low, high = p["cosine_min_value_correct"], p["cosine_max_value_correct"]
        else:
            low, high = p["cosine_max_value_wrong"], p["cosine_min_value_wrong"]
        cosine = low + 0.5 * (high - low) * (1.0 + math.cos(t * math.pi))
        terms["cosine"], value = cosine - value, cosine
    if p["overlong_max_length"]:
        start = p["overlong_max_length"] - p["overlong_buffer"]
        excess = (lengths[p["overlong_channel"]] - start) / p["overlong_buffer"]
        terms["overlong"] = -p["overlong_factor"] * min(max(excess, 0.0), 1.0)
        value += terms["overlong"]
    if p["target_length"] != "none" and target is not None:
        n, alpha = lengths[p["target_length_channel"]], p["target_length_alpha"]
        if p["target_length"] == "exact":
            terms["target_length"] = -alpha * abs(n - target)
        elif correct > 0:
            budget = min(max(alpha * (target - n) + p["target_length_delta"], 0.0), 1.0)
            terms["target_length"] = max(value, 0.0) * (budget - 1.0)
        else:
            terms["target_length"] = 0.0
        value += terms["target_length"]
    if p["truncation"] == "penalty" and truncated:
        terms["truncation"] = max(value, 0.0) * (p["truncation_penalty_factor"] - 1.0)
        value += terms["truncation"]
    return value, terms


def reference_penalties(
    rewards, group_index, reasoning, answer, config, agents=None, metadata=None, multi=None, truncated=None
):
    """Returns (shaped rewards, metrics, {group id: info}) exactly as reference §2 describes (with the
    per-rollout terms of §2.17-2.19; ``truncated``: the hosts' per-row flags)."""
    n_rows = len(rewards)
    shaped = [float(r) for r in rewards]
    total = [reasoning[i] + answer[i] for i in range(n_rows)]
    groups = groups_in_order(group_index)
    agent_of = {
        key: (agents[rows[0]] if agents is not None else None) or "default" for key, rows in groups.items()
    }
    params_of = {agent: resolve_params(config, agent) for agent in set(agent_of.values())}
    any_enabled = config.default.enabled or any(
        o is not None and "enabled" in o.model_fields_set and o.enabled
        for o in (config.agent_overrides or {}).values()
    )
    if not any_enabled or n_rows == 0:
        return shaped, {}, {}
    read_bands = any(
        p["group_length_penalty_profile_gate"]
        or p["profile_band_total"]
        or p["profile_band_reasoning"]
        or p["profile_band_answer"]
        for p in params_of.values()
    )
    read_profiles = any(p["profiled_length_penalty"] for p in params_of.values())
    read_targets = any(p["target_length"] != "none" for p in params_of.values())
    processed_rows, skipped_rows, invalid_rows = set(), set(), set()  # skipped: non-binary, not missing
    target_rows = {"scope": [], "ratios": [], "errors": [], "within": []}  # §2.20 metrics
    info = {}
    for key, rows in groups.items():
        p = params_of[agent_of[key]]
        n = len(rows)
        r = [float(rewards[i]) for i in rows]
        if not p["enabled"]:
            info[key] = {"status": "disabled"}
            continue
        if any(math.isnan(x) for x in r):
            info[key] = {"status": "missing"}
            continue
        binary = all(abs(x) <= 1e-6 or abs(x - 1) <= 1e-6 for x in r)
        if not binary or (multi is not None and any(multi[i] for i in rows)):
            skipped_rows.update(rows)
            info[key] = {"status": "non_binary"}
            continue
        processed_rows.update(rows)
        lengths = {
            "reasoning": [reasoning[i] for i in rows],
            "answer": [answer[i] for i in rows],
            "total": [total[i] for i in rows],
        }
        meta = metadata[rows[0]] if metadata is not None else None
        bands, passing, invalid = read_metadata(meta, config, read_bands, read_profiles)
        target, bad_target = read_target(meta) if read_targets else (None, False)
        if invalid or bad_target:
            invalid_rows.update(rows)
        if p["target_length"] != "none":
            target_rows["scope"] += [target is not None] * n
            for k in range(n):
                if target is not None:
                    n_k = lengths[p["target_length_channel"]][k]
                    error = abs(n_k - target) / target
                    target_rows["ratios"].append(n_k / target)
                    target_rows["errors"].append(error)
                    target_rows["within"].append(error <= p["target_length_tolerance"])
        pos = [k for k in range(n) if r[k] > 0]
        correct = list(r)  # positive and the top scorers are the correctness; the group terms add to r
        rollout_on = bool(
            p["cosine_max_length"]
            or p["overlong_max_length"]
            or p["truncation"] == "penalty"
            or p["target_length"] != "none"
        )
        rollout_terms = defaultdict(lambda n=n: [0.0] * n)
        if rollout_on:
            for k, row in enumerate(rows):
                flag = truncated is not None and bool(truncated[row])
                lengths_k = {c: lengths[c][k] for c in CHANNELS}
                r[k], parts = rollout_reward(p, correct[k], lengths_k, flag, target)
                for name, value in parts.items():
                    rollout_terms[name][k] = value

        # Profile gate (§2.13).
        gate_open, reason = True, "disabled"
        if p["group_length_penalty_profile_gate"]:
            channel = p["group_length_penalty_profile_gate_channel"]
            field = p["group_length_penalty_profile_gate_field"]
            members = pos if p["group_length_penalty_profile_gate_positive_only"] else list(range(n))
            if channel not in bands:
                reason = "missing_profile_limit"
            elif not members:
                reason = "no_lengths"
            else:
                limit = bands[channel][GATE_FIELDS.index(field)]
                mean = statistics.mean([lengths[channel][k] for k in members])
                reason = "mean_gt_limit" if mean > limit else "mean_le_limit"
            gate_open = reason == "mean_gt_limit"

        terms = defaultdict(lambda n=n: [0.0] * n)

        if len(pos) >= 2:
            ranked = sorted((correct[k] for k in pos), reverse=True)
            top_threshold = ranked[max(0, int(len(pos) * p["top_percentile"]) - 1)]
            top = [k for k in pos if correct[k] >= top_threshold]
            running = list(correct)
            for channel in CHANNELS:  # shortest bonus (§2.7)
                bonus = p[f"{channel}_bonus"]
                candidates = [k for k in pos if lengths[channel][k] > 0]
                if bonus > 0 and candidates:
                    winner = min(candidates, key=lambda k: (lengths[channel][k], k))
                    if running[winner] >= top_threshold:
                        running[winner] += bonus
                        terms[f"{channel}_bonus"][winner] = bonus
            for channel in CHANNELS:  # longest penalty (§2.7)
                penalty = p[f"longest_{channel}_penalty"]
                candidates = [k for k in top if lengths[channel][k] > 0]
                if penalty > 0 and len(candidates) >= 2:
                    loser = max(candidates, key=lambda k: (lengths[channel][k], -k))
                    terms[f"longest_{channel}"][loser] = -penalty
            for channel in CHANNELS:  # group-relative scaling (§2.8)
                coeff = p[f"group_{channel}_length_penalty_coeff"]
                if coeff > 0 and gate_open:
                    values = [lengths[channel][k] for k in pos]
                    low, high = min(values), max(values)
                    raw = [1 - (v - low) / (high - low) if high > low else 0.0 for v in values]
                    mean = 0.0
                    for w in raw:
                        mean += w
                    mean /= len(raw)
                    for k, w in zip(pos, raw, strict=True):
                        terms[f"group_{channel}"][k] = (w - mean) * coeff
            for channel in CHANNELS:  # zMAD (§2.9)
                threshold, penalty = p[f"{channel}_zmad_threshold"], p[f"{channel}_zmad_penalty"]
                if threshold > 0 and penalty > 0:
                    values = [lengths[channel][k] for k in pos]
                    median = statistics.median(values)
                    mad = statistics.median([abs(v - median) for v in values])
                    if mad != 0 and mad / max(median, 1e-9) >= 0.015:
                        for k, v in zip(pos, values, strict=True):
                            if 0.6745 * (v - median) / mad > threshold:
                                terms[f"zmad_{channel}"][k] = -penalty
        adjustment = [0.0] * n
        for name in [f"{c}_bonus" for c in CHANNELS] + [
            f"{kind}_{c}" for kind in ("longest", "group", "zmad") for c in CHANNELS
        ]:
            for k in range(n):
                adjustment[k] += terms[name][k]

        # Profiled-length penalty (§2.10).
        plp = p["profiled_length_penalty"]
        threshold = None
        if passing is not None and len(passing) >= p["profiled_length_min_samples"]:
            std = math.sqrt(statistics.variance(passing)) if len(passing) >= 2 else 0.0
            threshold = statistics.mean(passing) + p["profiled_length_n_std"] * std
            if plp > 0:
                for k in range(n):
                    if lengths["total"][k] >= threshold and adjustment[k] >= 0:
                        terms["profiled"][k] = -plp
        # Pass-rate penalty (§2.11).
        weight = p["pass_rate_length_penalty_weight"]
        if weight > 0 and pos:
            rho = len(pos) / n
            l_max = max(lengths["total"][k] for k in pos)
            if l_max > 0:
                for k in pos:
                    terms["pass_rate"][k] = -weight * rho * lengths["total"][k] / l_max

        for k, row in enumerate(rows):
            value = r[k] + (adjustment[k] + terms["profiled"][k] + terms["pass_rate"][k])
            value = max(value, min(r[k], 0.0) if rollout_on else 0.0)
            if correct[k] > 0 and value > 0:  # profile band (§2.12)
                for channel in BAND_ORDER:
                    if p[f"profile_band_{channel}"] and channel in bands:
                        value *= band_multiplier(lengths[channel][k], bands[channel])
            shaped[row] = value
        info[key] = {
            "status": "shaped",
            "gate_reason": reason,
            "terms": {**rollout_terms, **terms},
            "rollout_terms": rollout_terms,
            "profiled_threshold": threshold,
        }

    n = n_rows
    valid = [float(x) for x in rewards if not math.isnan(x)]
    mix = {"wrong": 0, "correct": 0, "mixed": 0, "unscorable": 0}
    for rows in groups.values():
        positives = sum(1 for i in rows if rewards[i] > 0)
        if any(math.isnan(rewards[i]) for i in rows):
            mix["unscorable"] += len(rows)
        elif positives == 0:
            mix["wrong"] += len(rows)
        elif positives == len(rows):
            mix["correct"] += len(rows)
        else:
            mix["mixed"] += len(rows)
    metrics = {
        "length_penalty/env_reward_mean": sum(valid) / len(valid) if valid else math.nan,
        "length_penalty/reward_delta_mean": sum(shaped[i] - rewards[i] for i in processed_rows) / n,
        "length_penalty/wiped_correct_frac": sum(
            1 for i in processed_rows if rewards[i] > 0 and shaped[i] <= 0
        )
        / n,
        "length_penalty/adjusted_frac": sum(1 for i in processed_rows if shaped[i] != rewards[i]) / n,
        "length_penalty/skipped_non_binary_frac": len(skipped_rows) / n,
        "length_penalty/invalid_metadata_frac": len(invalid_rows & processed_rows) / n,
        "length_penalty/pct_all_wrong": mix["wrong"] / n,
        "length_penalty/pct_all_correct": mix["correct"] / n,
        "length_penalty/pct_mixed": mix["mixed"] / n,
        "length_penalty/pct_unscorable": mix["unscorable"] / n,
    }
    for name, metric in (("overlong", "overlong_penalty_mean"), ("cosine", "cosine_delta_mean")):
        if any(p[f"{name}_max_length"] for p in params_of.values()):
            values = [v for i in info.values() if "rollout_terms" in i for v in i["rollout_terms"][name]]
            metrics[f"length_penalty/{metric}"] = sum(values) / n
            if name == "overlong":
                metrics["length_penalty/overlong_frac"] = sum(1 for v in values if v < 0) / n
    if read_targets:
        values = [
            v for i in info.values() if "rollout_terms" in i for v in i["rollout_terms"]["target_length"]
        ]
        metrics["length_penalty/target_delta_mean"] = sum(values) / n
        scope, errors, within = target_rows["scope"], target_rows["errors"], target_rows["within"]
        metrics["length_penalty/target_frac"] = sum(scope) / len(scope) if scope else math.nan
        metrics["length_penalty/target_rel_error_mean"] = sum(errors) / len(errors) if errors else math.nan
        ratios = target_rows["ratios"]
        metrics["length_penalty/target_ratio_mean"] = sum(ratios) / len(ratios) if ratios else math.nan
        metrics["length_penalty/target_within_tolerance_frac"] = (
            sum(within) / len(within) if within else math.nan
        )
    return shaped, metrics, info


def reference_coefficient(rewards, lengths, group_index, coeff, min_tokens=0, correctness=None):
    """Reference §3.1: (shaped, multipliers) with one loop per group."""
    truth = correctness if correctness is not None else rewards
    shaped, multipliers = [float(r) for r in rewards], [1.0] * len(rewards)
    for rows in groups_in_order(group_index).values():
        correct = [i for i in rows if truth[i] == 1.0]
        if not correct:
            continue
        l_ref = max(min(lengths[i] for i in correct), min_tokens, 1)
        for i in correct:
            if rewards[i] > 0:  # a reward <= 0 keeps multiplier 1: it is never raised (§3.1)
                multipliers[i] = 1 / (1 + coeff * max(0, lengths[i] - l_ref) / l_ref)
            shaped[i] = rewards[i] * multipliers[i]
    return shaped, multipliers


def reference_advantages(
    shaped,
    raw,
    group_index,
    scale_by_std=True,
    std_eps=1e-4,
    std_scope="group",
    single_row_stats=None,
    plain_groups=(),
):
    """§3.3 with the host normalization described in ``shaping.normalization``; groups whose id is in
    ``plain_groups`` get the host normalization whatever their raw rewards."""
    advantages = [0.0] * len(shaped)
    every = [x for x in shaped if not math.isnan(x)]
    batch_std = statistics.stdev(every) if len(every) > 1 else math.nan
    for rows in groups_in_order(group_index).values():
        values = [shaped[i] for i in rows if not math.isnan(shaped[i])]
        plain = group_index[rows[0]] in plain_groups
        if not values or (not plain and all(not raw[i] > 0 for i in rows)):
            continue
        mean = sum(values) / len(values)
        all_correct = not plain and all(raw[i] == 1.0 for i in rows)
        for i in rows:
            if math.isnan(shaped[i]):
                continue
            if all_correct:
                advantages[i] = shaped[i] - mean
            elif len(values) == 1 and single_row_stats is not None:
                advantages[i] = shaped[i] - single_row_stats[0]
                if scale_by_std:
                    advantages[i] /= single_row_stats[1] + std_eps
            elif not scale_by_std:
                advantages[i] = shaped[i] - mean
            else:
                std = (
                    batch_std
                    if std_scope == "batch"
                    else (statistics.stdev(values) if len(values) > 1 else math.nan)
                )
                value = (shaped[i] - mean) / (std + std_eps)
                advantages[i] = 0.0 if math.isnan(value) else value
    return advantages


def reference_keep(shaped, raw, group_index, unshaped=None):
    """Reference §3.3: a group with no correct row is judged on ``unshaped`` (default ``raw``)."""
    unshaped = raw if unshaped is None else unshaped
    keep = [False] * len(shaped)
    for rows in groups_in_order(group_index).values():
        values = [shaped[i] for i in rows if not math.isnan(shaped[i])]
        if all(raw[i] == 1.0 for i in rows):
            kept = bool(values) and max(values) - min(values) > 1e-6
        elif not any(raw[i] > 0 for i in rows):
            plain = [unshaped[i] for i in rows if not math.isnan(unshaped[i])]
            kept = bool(plain) and max(plain) != min(plain)
        else:
            kept = bool(values) and max(values) != min(values)
        for i in rows:
            keep[i] = kept
    return keep
