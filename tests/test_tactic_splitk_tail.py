"""The tail split (xeforge/rewrite/device_tuning/splitk_tail.py) and its place in the split-K tactic.

Whole waves of output tiles run the kernel as written, a part-filled last wave runs in slices of K whose partial
tiles the slice that counts itself last adds in slice order. Each rewrite is verified on the CPU interpreter with a
core count small enough that the ci shapes have whole waves and a tail (the real counts only matter on a GPU)."""

from __future__ import annotations

import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stages.device_tuning_splitk import SplitK
from tests.conftest import ROOT, tactic_context
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite import blockio
from xeforge.rewrite.device_tuning import splitk, splitk_tail
from xeforge.rewrite.tiling import NotApplicable

KERNELS = ROOT / "kernels"


def _copy(tmp_path, name: str, old: str, new: str):
    """A copy of a bundled problem whose ci shape is ``new`` (``old`` as the spec writes it)."""
    folder = tmp_path / name
    shutil.copytree(next(KERNELS.glob(f"{name}*")), folder)
    spec = folder / "spec.yaml"
    text = spec.read_text()
    assert old in text
    spec.write_text(text.replace(old, new))
    return load_problem(folder)


def test_a_third_wave_of_24_tiles_is_split_five_ways_after_two_whole_ones():
    """gemm_square at 3000 x 4096 x 3000 in 128 x 256 tiles on an H100's 132 cores: 288 tiles, 2 whole waves (264
    programs as written) and 24 tiles in 5 slices of 64 K steps (120 programs). A decode step's 16 tiles split 8
    ways with no whole wave before them; 3.9 waves (4096^3) and exact waves run as written; a 2D grid keeps whole
    rows of axis 0 in the waves."""
    assert splitk_tail.size((288,), 64, 132) == (264, 5)
    assert splitk_tail.size((16,), 64, 132) == (0, 8)
    assert splitk_tail.size((512,), 64, 132) == (0, 1)
    assert splitk_tail.size((264,), 64, 132) == (0, 1)
    assert splitk_tail.size((12, 24), 64, 132) == (11, 5)
    assert splitk_tail.size((288,), 12, 132) == (264, 3)  # 4 K steps a slice at least
    assert splitk_tail.size((6 * 132 + 10,), 64, 132) == (0, 1)  # more whole waves than MAX_WAVES


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 400), min_size=1, max_size=2), st.one_of(st.none(), st.integers(0, 5000)),
       st.integers(1, 200))
def test_the_tail_fits_one_wave_and_the_head_is_whole_waves(grid, steps, cores):
    start, split = splitk_tail.size(tuple(grid), steps, cores)
    inner = grid[1] if len(grid) > 1 else 1
    tiles = grid[0] * inner
    if split == 1:
        assert start == 0
        return
    assert 2 <= split <= splitk_tail.MOST and 0 <= start < grid[0]
    assert start * inner <= (tiles // cores) * cores and tiles // cores <= splitk_tail.MAX_WAVES
    tail = (grid[0] - start) * inner
    assert tail * split <= cores
    assert steps is None or steps // split >= splitk_tail.MIN_SLICE_STEPS
    assert tail * (split + 1) > cores or split == splitk_tail.MOST or \
        (steps is not None and steps // (split + 1) < splitk_tail.MIN_SLICE_STEPS)


def _launches(src: str) -> list[str]:
    return [s.kernel for s in parse_kernel(src).launches]


def test_a_grouped_1d_grid_runs_its_whole_waves_as_written_and_its_tail_in_slices(verify, tmp_path):
    """gemm_square (one program id, the grouped tile order) at a ci shape of 300 x 608 x 260 on 4 cores: 9 tiles of
    128 x 128 are 2 whole waves (8 programs as written) and 1 tile in 4 slices of 19 K steps. Verified at ci and the
    ragged shapes; a fix-up that sums when the first slice arrives, not the last, is caught."""
    p = _copy(tmp_path, "gemm_square", "dims: {M: 64, K: 64, N: 64}", "dims: {M: 300, K: 608, N: 260}")
    plan = splitk.find(p.kernel_source, p)
    assert splitk_tail.size((9,), 19, 4) == (8, 4)
    src = splitk_tail.apply(p.kernel_source, plan, 4)
    for text in ("pid = (tl.program_id(0) + tail_start)", "pid_k = tl.program_id(1)",
                 "arrived = tl.atomic_add(lock_ptr + tail_tile, 1)", "if arrived == SPLIT_K - 1:",
                 "tail_start, split_k = splitk_tail_size(tail_grid, triton.cdiv(K, 32), 4)",
                 "matmul_kernel[(tail_start,)](", "matmul_kernel_tail[(tail_grid[0] - tail_start, split_k)](",
                 "c_ws = torch.empty(((tail_grid[0] - tail_start) * split_k * 128 * 128,), device=c.device, "
                 "dtype=torch.float32)"):
        assert text in src, text
    assert _launches(src) == ["matmul_kernel", "matmul_kernel_tail", "matmul_kernel"]
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()
    first = src.replace("if arrived == SPLIT_K - 1:", "if arrived == 0:")
    assert first != src and not verify(p, first).correct


def test_a_2d_grid_keeps_whole_rows_of_tiles_in_the_waves(verify, tmp_path):
    """gemm_tall_k (pid_m, pid_n; block pointers) at 300 x 608 x 300 on 7 cores: a 3 x 3 grid is one whole wave of
    2 rows (6 tiles as written) and a row of 3 tiles in 2 slices each."""
    p = _copy(tmp_path, "gemm_tall_k", "dims: {M: 32, K: 160, N: 32}", "dims: {M: 300, K: 608, N: 300}")
    plan = splitk.find(p.kernel_source, p)
    assert splitk_tail.size((3, 3), 19, 7) == (2, 2)
    src = splitk_tail.apply(p.kernel_source, plan, 7)
    assert "pid_m = (tl.program_id(0) + tail_start)" in src and "pid_k = tl.program_id(2)" in src
    assert "tail_tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)" in src
    assert "matmul_kernel[(tail_start, tail_grid[1])](" in src
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_an_epilogue_runs_once_on_the_summed_tile(verify, tmp_path):
    """kb09 (a bias added in the kernel, a tail kernel after it) at 96 x 608 x 80 on 7 cores: the bias is added by
    the slice that sums, once; verified."""
    p = _copy(tmp_path, "kb09", "dims: {M: 32, K: 64, N: 48}", "dims: {M: 96, K: 608, N: 80}")
    plan = splitk.find(p.kernel_source, p)
    src = splitk_tail.apply(p.kernel_source, plan, 7)
    tail_fn = src[src.index(f"def {plan.kernel}_tail("):]
    tail_fn = tail_fn[:tail_fn.index("\n\n\n")]
    fixup = tail_fn[tail_fn.index("if arrived == SPLIT_K - 1:"):]
    assert "bias" in fixup and "tl.store(" in fixup
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_after_block_io_both_k_loops_are_sliced_and_the_descriptor_store_runs_once(verify, tmp_path):
    p = _copy(tmp_path, "gemm_square", "dims: {M: 64, K: 64, N: 64}", "dims: {M: 300, K: 608, N: 260}")
    src, _ = blockio.rewrite(p.kernel_source)
    plan = splitk.find(src, p)
    out = splitk_tail.apply(src, plan, 4)
    assert out.count("in range(k_lo, k_hi):") == 2
    fixup = out[out.index("if arrived == SPLIT_K - 1:"):]
    assert "c_desc.store(" in fixup[:fixup.index("\n\n\n")]
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()


def test_an_accumulator_of_unnamed_block_sizes_is_left_alone_with_the_reason():
    p = load_problem(KERNELS / "gemm_square")
    src = p.kernel_source.replace("acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
                                  "acc = tl.zeros((BLOCK_M, 2 * BLOCK_K), dtype=tl.float32)")
    assert src != p.kernel_source
    with pytest.raises(NotApplicable, match="not a 2D tile of named block sizes"):
        splitk_tail.apply(src, splitk.find(src, p), 132)


def test_the_tactic_proposes_the_tail_split_where_a_shape_ends_in_a_part_filled_wave():
    """gemm_square on a 132-core GPU: at 3000 x 4096 x 3000 its 128 x 128 tiles are 576, 4 whole waves and 48
    more; the tail split comes second, timed at every shape, after the first split-K candidate for the decode
    shape."""
    p = load_problem(KERNELS / "gemm_square")
    ctx = tactic_context(p, kind="cuda", cores=132)
    tactic = SplitK()
    app = tactic.check(ctx)
    assert app.applies and "split-K, SPLIT_K programs per output tile" in app.reason and \
        "tail split, whole waves of tiles as written" in app.reason, app.reason
    cands = tactic.propose(ctx)
    tail = cands[1]
    assert f"def {splitk_tail.kernel_name('matmul_kernel')}(" in tail.source and tail.time_all_shapes
    assert "tail split" in tail.description and "576 output tiles at bench-gpu-2 are 4 whole wave(s)" in \
        tail.description and "48 run in 2 slices of K" in tail.description, tail.description
    assert [("_tail(" in c.source) for c in cands].count(True) == 1 and "if split_k > 1:" in cands[0].source


def test_a_kernel_whose_only_idle_cores_are_a_last_wave_gets_the_tail_split_alone(tmp_path):
    """gemm_square with its decode shape removed: every timed shape's tiles fill the cores, so no split-K
    candidate is sized, and the tail split (for 3000 x 4096 x 3000) is the tactic's one candidate."""
    p = _copy(tmp_path, "gemm_square", "dims: {M: 16, K: 4096, N: 4096}", "dims: {M: 2048, K: 4096, N: 4096}")
    cands = SplitK().propose(tactic_context(p, kind="cuda", cores=132))
    assert len(cands) == 1 and "_tail(" in cands[0].source and cands[0].time_all_shapes


def test_the_interpreter_gets_no_tail_split():
    """On the interpreter the core count is not the device's: the tail split is a GPU candidate only."""
    p = load_problem(KERNELS / "gemm_square")
    ctx = tactic_context(p)
    assert all("_tail(" not in c.source for c in SplitK().propose(ctx))


def _dispatched(p, source: str | None = None) -> str:
    """The kernel behind the decode branch per-shape-config writes (``if M <= 128:`` a 16 x 64 tile)."""
    from xeforge.rewrite.tiling.dispatch import Branch, dispatch

    return dispatch(p.kernel_source if source is None else source, "matmul_kernel",
                    [Branch("M <= 128", {"BLOCK_M": 16, "BLOCK_N": 64})])


def test_behind_a_per_shape_dispatch_the_else_launch_gets_the_tail_split(verify, tmp_path):
    """gemm_square after per-shape-config: split-K refuses a kernel launched from two places, the tail split rewrites
    the else branch's launch (the one 3000 x 4096 x 3000 runs) and leaves the decode branch as it was. Verified at a
    ci shape of 300 x 608 x 260 on 4 cores (the else branch: 2 whole waves, 1 tile in 4 slices)."""
    p = _copy(tmp_path, "gemm_square", "dims: {M: 64, K: 64, N: 64}", "dims: {M: 300, K: 608, N: 260}")
    src = _dispatched(p)
    with pytest.raises(NotApplicable, match="launched from 2 places"):
        splitk.find(src, p)
    found = splitk_tail.behind_dispatch(src)
    assert found is not None
    base, kernel, line = found
    assert kernel == "matmul_kernel" and "if M <= 128:" not in base
    out = splitk_tail.apply(src, splitk.find(base, p), 4, line=line)
    host = out[out.index("def forward"):]
    decode = host[host.index("if M <= 128:"):host.index("else:")]
    assert "BLOCK_M=16" in decode and "_tail" not in decode
    assert "matmul_kernel_tail[(tail_grid[0] - tail_start, split_k)](" in host[host.index("else:"):]
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()
    # the tactic finds it too, on a GPU: its one candidate, at the else launch
    cands = SplitK().propose(tactic_context(load_problem(KERNELS / "gemm_square"), _dispatched(
        load_problem(KERNELS / "gemm_square")), kind="cuda", cores=132))
    assert len(cands) == 1 and "_tail(" in cands[0].source and "the per-shape dispatch's else branch" in \
        cands[0].description
