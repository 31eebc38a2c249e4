"""verl's own trainer end to end on CPU with the plugin: LUSPO and GSPO beside it (``trl-length verl-smoke``; the setting and
what every test asserts: ``tests/verl_e2e_helpers.py``). Nothing is faked."""

from __future__ import annotations

import pytest

from tests.verl_e2e_helpers import RECIPES, assert_trained, smoke

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.mark.parametrize(
    "recipe, prefix",
    [("luspo_qwen2.5-0.5b.sh", "actor/luspo_"), ("gspo_qwen2.5-0.5b.sh", "actor/pg_loss")],
    ids=["luspo", "gspo"],
)
def test_luspo_and_gspo_beside_it(tmp_path, recipe, prefix):
    done, metrics, _ = smoke(tmp_path, str(RECIPES / recipe))
    assert_trained(done, metrics, prefix)
