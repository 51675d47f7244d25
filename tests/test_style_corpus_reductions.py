"""The style corpus, second half: a GEMM followed by a row reduction (logsumexp over N) and a GEMM followed by a
GroupNorm, both in torch after the kernel. The styles, the checks and how the lists work: tests/test_style_corpus.py
(this file runs in the other xdist worker)."""

from __future__ import annotations

from tests.test_style_corpus import CorpusChecks, check_lists, corpus, pytest_generate_tests  # noqa: F401 (fixture, hook)

PROBLEMS = ("linear_logsumexp", "linear_groupnorm")


# starting files that do not verify: (problem, style) -> a fragment of the verdict's feedback
KNOWN_START_FAILURES: dict[tuple[str, str], str] = {}

# tactics that apply to direct.py but not to a style: (problem, style, tactic) -> a fragment of the reason
KNOWN_GAPS: dict[tuple[str, str, str], str] = {}

# ports whose chain breaks or whose final candidate does not verify: (problem, style) -> a fragment of why
KNOWN_CHAIN_FAILURES: dict[tuple[str, str], str] = {}


class Listed(CorpusChecks):
    known_start, known_gaps, known_chain = KNOWN_START_FAILURES, KNOWN_GAPS, KNOWN_CHAIN_FAILURES


class TestLinearLogsumexp(Listed):
    problem = "linear_logsumexp"


class TestLinearGroupnorm(Listed):
    problem = "linear_groupnorm"


def test_the_lists_name_real_cells():
    check_lists(PROBLEMS, KNOWN_GAPS, KNOWN_CHAIN_FAILURES, KNOWN_START_FAILURES)
