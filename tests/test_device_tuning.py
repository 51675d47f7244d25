"""The launch-parameter search: which constexprs it may change, and grids that follow the block sizes."""

from __future__ import annotations

import ast

from stages.device_tuning import LaunchParamSearch, target_site, tunable_names
from tests.conftest import ROOT, tactic_context
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem

KERNELS = ROOT / "kernels"


def test_blocks_behind_a_swizzled_grid_are_left_alone_with_a_reason():
    p = load_problem(KERNELS / "gemm_square")
    m = parse_kernel(p.kernel_source)
    names, why = tunable_names(m, target_site(m))
    assert "BLOCK_M" not in names and "BLOCK_N" not in names and "BLOCK_K" in names
    assert "cannot follow" in why["BLOCK_M"]


def test_candidates_resize_the_grid_with_the_blocks():
    p = load_problem(KERNELS / "gemm_relu")
    ctx = tactic_context(p, kind="cuda", target="h200")
    cands = LaunchParamSearch().propose(ctx)
    assert cands
    for c in cands:
        m = parse_kernel(c.source)
        site = target_site(m) or next(s for s in m.launches if s.kernel == "matmul_kernel")
        fn = next(f for f in ast.walk(m.tree) if isinstance(f, ast.FunctionDef) and f.name == site.function)
        grid = next(a.value for a in ast.walk(fn) if isinstance(a, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "grid" for t in a.targets))
        lits = [call.args[1].value for call in ast.walk(grid) if isinstance(call, ast.Call) and len(call.args) == 2]
        assert lits == [site.constexprs["BLOCK_M"], site.constexprs["BLOCK_N"]], c.description


def test_the_kb_seeds_come_first():
    """With a small budget the search must still try the configurations the knowledge base says are good."""
    p = load_problem(KERNELS / "gemm_relu")
    ctx = tactic_context(p, kind="cuda", target="h200")
    space = ctx.kb.space("h200", "gemm", ctx.triton)
    cands = LaunchParamSearch().propose(ctx)
    seeds = space.seeds
    assert seeds and len(cands) >= len(seeds)
    first = cands[0].params
    assert first["BLOCK_M"] == seeds[0]["block_m"] and first["BLOCK_N"] == seeds[0]["block_n"]
    assert first["num_warps"] == seeds[0]["num_warps"]


def test_grid_variable_is_found_by_name_not_by_position():
    from xeforge.codemod import set_grid_block

    src = ("def f(M, N):\n    grid = (triton.cdiv(M, 64),)\n    shape = (3, 4)\n"
           "    k[grid](M, BLOCK=64)\n")
    out = set_grid_block(src, "k", 4, 0, 64, 128)
    assert "grid = (triton.cdiv(M, 128),)" in out and "shape = (3, 4)" in out
