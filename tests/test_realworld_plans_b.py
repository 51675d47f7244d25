"""The corpus test of tests/test_realworld_plans_a.py over the second half of the corpus (two files, so that
pytest-xdist runs them side by side)."""

from __future__ import annotations

import pytest

from tests.realworld import ENTRIES, TARGETS, check_entry

pytestmark = pytest.mark.slow  # a dry run of every stage per kernel and target: about 10 s each


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ENTRIES[len(ENTRIES) // 2:])
def test_tactics_of_the_second_half(name, target):
    check_entry(name, target)
