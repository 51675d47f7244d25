"""The device_tuning stage's GROUP_SIZE_M swizzle tactic on the CPU interpreter, through the real verifier.

A 2D-grid GEMM becomes a 1D grid in grouped order (fixture with 5 x 3 tiles, so GROUP_SIZE_M=2 leaves a
short last group); a persistent tile loop gets the same grouped mapping. Rewrites pass ``Verifier.verify``
with the KB's gate-1 constraints; GROUP_SIZE_M is a literal at the launch that the launch-parameter search
tunes; the starting value comes from the device's KB space; other shapes are left alone with a reason.
"""

from __future__ import annotations

import ast

import pytest

from stages.device_tuning import LaunchParamSearch
from xeforge.rewrite.tiling.configs import tunable_names
from stages.device_tuning_swizzle import GroupedTileOrder, group_size
from tests.conftest import tactic_context, FIXTURES, ROOT
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite import blockio, persistent
from xeforge.rewrite.device_tuning import swizzle

KERNELS = ROOT / "kernels"
HERE = FIXTURES / "tactics" / "swizzle"
TACTIC = GroupedTileOrder()



def context(p, source: str | None = None, kind: str = "cpu", target: str | None = None):
    return tactic_context(p, source, kind, target, cores=20)


def with_group(source: str, group: int) -> str:
    """The swizzled source with GROUP_SIZE_M set to ``group`` at the launch (what the search would try)."""
    site = next(s for s in parse_kernel(source).launches if swizzle.PARAM in s.constexprs)
    from xeforge.rewrite.tiling.edit import LaunchEdit, edit_launch

    return edit_launch(source, LaunchEdit(site.kernel, site.line, set_kwargs={swizzle.PARAM: repr(group)}))


def test_2d_grid_becomes_a_grouped_1d_grid(verify):
    p = load_problem(HERE / "gemm_grid2d")
    ctx = context(p)
    app = TACTIC.check(ctx)
    assert app.applies and "1D grid" in app.reason, app.reason
    src = TACTIC.propose(ctx)[0].source
    model = parse_kernel(src)
    site = model.launches[0]
    assert site.constexprs[swizzle.PARAM] == group_size(ctx)[0]
    assert "lambda META: (triton.cdiv(M, META['BLOCK_M']) * triton.cdiv(N, META['BLOCK_N']),)" in src
    fn = model.functions["matmul_kernel"].node
    assert sum(isinstance(n, ast.Call) and ast.unparse(n.func) == "tl.program_id" for n in ast.walk(fn)) == 1
    # GROUP_SIZE_M=2 over 5 tile rows: groups of 2, 2 and a short one of 1
    verdict = verify(p, with_group(src, 2))
    assert verdict.correct, verdict.feedback()
    # the launch-parameter search can tune the group size and the blocks of the swizzled kernel
    names, _ = tunable_names(model, site)
    assert {swizzle.PARAM, "BLOCK_M", "BLOCK_N"} <= set(names)


def test_a_wrong_group_mapping_is_caught(verify):
    """The fixture's shapes see every tile: dropping the group's row offset must fail verification."""
    p = load_problem(HERE / "gemm_grid2d")
    src, _ = swizzle.rewrite(p.kernel_source, group=2)
    bad = src.replace("pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)",
                      "pid_m = (pid % num_pid_in_group) % group_size_m")
    assert bad != src
    assert not verify(p, bad).correct


def test_persistent_loop_gets_the_grouped_order(verify):
    p = load_problem(HERE / "gemm_grid2d")
    src, _ = persistent.rewrite(p.kernel_source)
    ctx = context(p, src)
    app = TACTIC.check(ctx)
    assert app.applies and "persistent tile loop" in app.reason, app.reason
    out = with_group(TACTIC.propose(ctx)[0].source, 2)
    assert "tile_id % num_pid_in_group" in out and "pid_m = tile_id % num_pid_m" not in out
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()


def test_search_candidates_on_the_swizzled_kernel_are_correct(verify):
    p = load_problem(HERE / "gemm_grid2d")
    src, _ = swizzle.rewrite(p.kernel_source, group=2)
    cands = LaunchParamSearch().propose(context(p, src))
    assert cands
    verdict = verify(p, cands[0].source)
    assert verdict.correct, (cands[0].description, verdict.feedback())


def test_group_size_comes_from_the_device_kb_space():
    p = load_problem(KERNELS / "gemm_relu")
    assert group_size(context(p, kind="xpu", target="arc-b580"))[0] == 4
    assert group_size(context(p, kind="cuda", target="h200"))[0] == 8
    cands = TACTIC.propose(context(p, kind="cuda", target="h200"))
    assert len(cands) >= 2 and cands[1].params.get("BLOCK_M") == 128  # the rewrite with the KB's tile seeds


def test_descriptor_kernel_can_be_swizzled_too(verify):
    p = load_problem(KERNELS / "gemm_relu")
    src, _ = blockio.rewrite(p.kernel_source)
    out = TACTIC.propose(context(p, src))[0].source
    assert "USE_BLOCK_IO=use_block_io" in out and f"{swizzle.PARAM}=" in out
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()


@pytest.mark.parametrize("folder,reason", [
    (KERNELS / "gemm_square", "already has a GROUP_SIZE_M swizzle"),
    (KERNELS / "vector_add", "no tl.dot"),
    (KERNELS / "flash_attn_fwd", "grid axis 1 (off_bh) is not a tile axis"),
], ids=["already-swizzled", "elementwise", "attention-batch-axis"])
def test_other_shapes_are_left_alone_with_a_reason(folder, reason):
    ctx = context(load_problem(folder))
    app = TACTIC.check(ctx)
    assert not app.applies and reason in app.reason, app.reason
    assert TACTIC.propose(ctx) == []
