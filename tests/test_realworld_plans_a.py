"""Every kernel of the real-world corpus, brought in through `xeforge new`, gets the launch search or autotuning
and every structural tactic its canonical hand-written form gets, for an Intel and an NVIDIA target; the patch
of each tactic's first candidate applies to the original file (issue 32, item 3). Where the corpus form still
blocks a tactic, the test holds the reason to the construct it names (tests/realworld.py: KNOWN_GAPS)."""

from __future__ import annotations

import pytest

from tests.realworld import ENTRIES, TARGETS, check_entry

pytestmark = pytest.mark.slow  # a dry run of every stage per kernel and target: about 10 s each


def test_the_corpus_has_the_kernels_the_issue_asks_for():
    assert len(ENTRIES) >= 24, ENTRIES


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ENTRIES[: len(ENTRIES) // 2])
def test_tactics_of_the_first_half(name, target):
    check_entry(name, target)

