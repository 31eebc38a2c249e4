"""verl's own trainer end to end on CPU with the plugin: LUSPO (``trl-length verl-smoke``; the setting and what
every test asserts: ``tests/verl_e2e_helpers.py``). Nothing is faked. Its twin recipe, GSPO, is verl's own loss
and differs in two keys: ``tests/test_luspo_verl.py`` passes the composed GSPO recipe through verl's config checks
and runs verl's GSPO loss on it in process (its own aggregation, and against LUSPO), which a second two-minute
``main_ppo`` run would not add to."""

from __future__ import annotations

import pytest

from tests.verl_e2e_helpers import RECIPES, assert_trained, smoke

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_luspo_trains_through_main_ppo(tmp_path):
    done, metrics, _ = smoke(tmp_path, str(RECIPES / "luspo_qwen2.5-0.5b.sh"))
    assert_trained(done, metrics, "actor/luspo_")
