"""Every documented error example is the error the code raises (issue 31: the docs' statements about errors
stay true). Each entry: a page, the example as the page writes it (wrapped lines joined; ``...`` stands for
text the page leaves out, as does a ``<placeholder>``), and the call that raises it; the test finds the example on the page and in the
message, so a changed message or a changed page fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trl_length_plugin.shaping import (
    RolloutBatch,
    add_target_lengths,
    group_advantages,
    load_shaping_config,
    prompt_with_target,
    shape_rollouts,
)
from trl_length_plugin.shaping.config import length_limit_error

DOCS = Path(__file__).resolve().parents[1] / "docs"
PENALTIES, COEFFICIENT, PRODUCT = (
    "reference/length-penalties.md",
    "reference/length-coefficient.md",
    "reference/product.md",
)


def config(values: dict):
    return lambda: load_shaping_config(values)


def call(function, *args, **kwargs):
    return lambda: function(*args, **kwargs)


def limit(values: dict, limit_value: int, key: str):
    def check():
        raise ValueError(length_limit_error(load_shaping_config(values), limit_value, key))

    return check


GROUP = {"length_penalty": {"default": {"group_total_length_penalty_coeff": 0.4}}}
EXAMPLES = [
    (PRODUCT, "length_penalty.default.top_percentile: Input should be less than or equal to 1",
     config({"length_penalty": {"default": {"top_percentile": 1.5}}})),
    (PRODUCT, "length_penalty_coeff: Input should be a finite number", config({"length_penalty_coeff": float("nan")})),
    (PRODUCT, "length_penalty_cof: unknown key (did you mean 'length_penalty_coeff'?)",
     config({"length_penalty_cof": 1.0})),
    (PRODUCT, "length_penalty.default.group_totl_length_penalty_coeff: unknown key (did you mean "
              "'group_total_length_penalty_coeff'?)",
     config({"length_penalty": {"default": {"group_totl_length_penalty_coeff": 0.1}}})),
    (PRODUCT, "length_penalty_coeff_warmup_steps: needs length_penalty_coeff > 0 (the coefficient it modifies)",
     config({"length_penalty_coeff_warmup_steps": 3})),
    (PRODUCT, "length_penalty_min_tokens: needs length_penalty_coeff > 0 (the coefficient it modifies)",
     config({"length_penalty_min_tokens": 3})),
    (PRODUCT, "length_penalty: key 'total_bonus' written twice (values 0.1 and 0.2)",
     config({"length_penalty": '{"default": {"total_bonus": 0.1, "total_bonus": 0.2}}'})),
    (PENALTIES, "length_penalty.default.target_length_alpha: Input should be less than or equal to 1000000",
     config({"length_penalty": {"default": {"target_length": "exact", "target_length_alpha": 1e308}}})),
    (PENALTIES, "length_penalty.default.overlong_factor: needs overlong_max_length > 0 (the key that switches its "
                "term on)",
     config({"length_penalty": {"default": {"overlong_factor": 0.5}}})),
    (PENALTIES, "length_penalty.default.overlong_max_length: 2048 is above data.max_response_length (1024): no "
                "rollout reaches it, so the penalty would never reach its maximum; set it <= 1024",
     limit({"length_penalty": {"default": {"overlong_max_length": 2048, "overlong_buffer": 256}}}, 1024,
           "data.max_response_length")),
    (COEFFICIENT, "length_penalty_min_tokens: 512 is at or above max_completion_length (512): ...",
     limit({"length_penalty_coeff": 1.0, "length_penalty_min_tokens": 512}, 512, "max_completion_length")),
    (COEFFICIENT, "length_schedule.0.key: length_penalty_coeff: scheduled and by length_penalty_coeff_warmup_steps",
     config({"length_penalty_coeff": 1.0, "length_penalty_coeff_warmup_steps": 3,
             "length_schedule": [{"key": "length_penalty_coeff", "stages": [{"until_step": 2, "value": 0.5}]}]})),
    (COEFFICIENT, "length_schedule.0.stages.1: the config of step 10 is refused: length_penalty.default.overlong_buffer: "
                  "needs 0 < overlong_buffer <= overlong_max_length (256), got 512",
     config({"length_penalty": {"default": {"overlong_max_length": 4096, "overlong_buffer": 512}},
             "length_schedule": [{"key": "length_penalty.default.overlong_max_length", "stages": [
                 {"until_step": 10, "value": 2048}, {"until_step": 20, "value": 256}]}]})),
    (COEFFICIENT, "std_scope: 'grup' is not one of 'group', 'batch' (did you mean 'group'?)",
     call(group_advantages, [1.0, 0.0], [1.0, 0.0], [0, 0], std_scope="grup")),
    (COEFFICIENT, "shaping_weight must be a finite number, got <value>",
     call(shape_rollouts, RolloutBatch([1.0, 0.0], [0, 0]), load_shaping_config(GROUP), None,
          shaping_weight=float("nan"))),
    (PENALTIES, "truncated must be booleans (or 0 and 1), one per row, got <U3 values",
     call(RolloutBatch, [1.0, 0.0], [0, 0], truncated=["no", "yes"])),
    (PENALTIES, "rewards is a meta tensor (no values); the shaping step needs values on the CPU or a GPU",
     lambda: RolloutBatch(__import__("torch").tensor([1.0, 0.0], device="meta"), [0, 0])),
    (PENALTIES, "row 3: target_length must be finite and in (0, 2**53], got nan",
     call(add_target_lengths, [{"prompt": "p"}] * 4, targets=[1, 2, 3, float("nan")])),
    (PENALTIES, "prompt_with_target: ...", call(prompt_with_target, "p", 0)),
    (PENALTIES, "row 1: no 'prompt' column to ask for the target in (prompt_column; the row has 'question')",
     call(add_target_lengths, [{"prompt": "a"}, {"question": "b"}], (10, 20))),
    (PENALTIES, "no target_length column to take targets from; give target_range or targets",
     call(add_target_lengths, [{"prompt": "a"}])),
]  # fmt: skip


def page_text(page: str) -> str:
    """The page with each wrapped line joined to the next by one space."""
    return re.sub(r"\s*\n\s*", " ", (DOCS / page).read_text())


def pieces_in_order(pieces: list[str], text: str) -> bool:
    at = 0
    for piece in pieces:
        at = text.find(piece, at)
        if at < 0:
            return False
        at += len(piece)
    return True


@pytest.mark.parametrize(("page", "example", "raise_it"), EXAMPLES, ids=[e[1][:50] for e in EXAMPLES])
def test_a_documented_error_example_is_on_its_page_and_is_the_codes(page, example, raise_it):
    assert example in page_text(page), f"{page} no longer shows: {example}"
    with pytest.raises(ValueError) as err:
        raise_it()
    message = str(err.value)
    assert "\n" not in message
    pieces = [p.strip() for p in re.split(r"\.\.\.|<[a-z ]+>", example) if p.strip()]
    assert pieces_in_order(pieces, message), message
