"""No tactic tunes a kernel forward never launches (the style corpus's ``backward_kernels`` files, issue 14).

Each ``backward_kernels.py`` holds the direct style plus backward kernels with their own launches (in a function
forward never calls). On a GPU context every applicable tactic of the stages that tune launches proposes its
candidates (re-tiled copies included); in none of them may a launch of a kernel the trace did not see run have
changed (its block sizes, launch options or grid): a tuning written there is lost on the real kernel. On the H200
the dtype stage's copies went to such a launch and the port ended 2.9x slower than its other styles
(docs/measurements/HISTORY.md); this test then found rows-per-program doing the same to logsumexp's backward kernel.
"""

from __future__ import annotations

import ast

import pytest

import stages as stage_registry
from tests.conftest import FIXTURES, tactic_context
from xeforge.analysis.launches import live_kernels
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem

FILES = sorted((FIXTURES / "styles").glob("*/backward_kernels.py"))
#: the stages whose tactics write block sizes, launch options or grids (fusion and memory_access edit code only)
TUNING = ("dtype", "block_io", "persistent", "device_tuning", "autotuning")


def _launches(source: str, kernels: set[str]) -> dict[str, list[str]]:
    """kernel -> the text of each of its launch statements (grid, block sizes, options), for ``kernels``."""
    model = parse_kernel(source)
    lines = source.splitlines()
    out: dict[str, list[str]] = {}
    for site in model.launches:
        if site.kernel in kernels:
            node = next((n for n in ast.walk(model.tree) if isinstance(n, ast.Call) and n.lineno == site.line), None)
            text = ast.get_source_segment(source, node) if node is not None else None
            out.setdefault(site.kernel, []).append(" ".join((text or lines[site.line - 1]).split()))
    return out


@pytest.mark.slow  # the tuning stages' tactics propose on six files (about 60 s): CI runs it with make test-slow
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.parent.name)
def test_no_candidate_retunes_a_kernel_forward_never_launches(path):
    p = load_problem(path)
    ctx = tactic_context(p, kind="cuda", target="h200", cores=132)
    live = live_kernels(ctx.model)
    assert live is not None, "the start was traced"
    dead = {s.kernel for s in ctx.model.launches} - live
    assert dead, f"{path.name} has backward kernels with launches"
    before = _launches(p.kernel_source, dead)
    seen = 0
    for stage in (st for st in stage_registry.ALL if st.name in TUNING):
        for tactic in stage.tactics:
            if not tactic.check(ctx).applies:
                continue
            for cand in tactic.propose(ctx):
                seen += 1
                assert _launches(cand.source, dead) == before, f"{stage.name}/{tactic.name}: {cand.description}"
    assert seen, "the tactics proposed candidates to check"
