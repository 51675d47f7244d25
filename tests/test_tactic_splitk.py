"""The device_tuning stage's split-K tactic, sized for a stand-in H200 (132 SMs), verified on the CPU interpreter.

gemm_tall_k (64 output tiles at bench-gpu) gets SPLIT_K programs per tile over slices of its K loop, with the
block-pointer loop as written and after the block_io stage (descriptor and pointer loops in one kernel). Every
candidate passes ``Verifier.verify`` on ci and the ragged shapes: K=160 with BLOCK_K=32 is 5 steps, so SPLIT_K=2
leaves a short last slice and SPLIT_K=8 empty ones, and a split that drops the short slice is rejected. A GEMM
with an epilogue gets a second kernel that sums the slices and runs it; a 1D grid takes the slices on axis 1.
GEMMs with enough tiles, without ``tl.dot``, persistent or 3D-gridded, and epilogues a second kernel cannot run, are
left alone with the reason; ``xeforge port --dry-run`` lists the tactic. On a GPU the split is sized per call
(``forward`` computes SPLIT_K from its grid and K): the helper's bounds are a property test, and copies whose ci K is
608 (19 steps of 32) make the sized split split on the interpreter, with and without an epilogue, after block_io
too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stages import device_tuning, fusion
from stages.device_tuning_splitk import SplitK, split_values
from tests.conftest import ROOT, load_kernel_module, sm90_compiler, tactic_context
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite import blockio, persistent
from xeforge.rewrite.device_tuning import splitk
from xeforge.rewrite.device_tuning.splitk import EPILOGUE
from xeforge.rewrite.tiling import NotApplicable
from xeforge.rewrite.tiling.configs import apply_config

KERNELS = ROOT / "kernels"
TALL_K = KERNELS / "gemm_tall_k"
TACTIC = SplitK()


def h200(p, source: str | None = None):
    return tactic_context(p, source, kind="cuda", cores=132)


def candidates(p, source: str | None = None):
    ctx = h200(p, source)
    app = TACTIC.check(ctx)
    assert app.applies, app.reason
    return TACTIC.propose(ctx)


def test_gemm_tall_k_is_split_and_every_candidate_is_correct(verify):
    p = load_problem(TALL_K)
    cands = candidates(p)
    assert [c.params[splitk.PARAM] for c in cands] == [2, 4, 8]  # 2 x 64 tiles: one wave of 132 SMs, 97% full
    assert [c.kind for c in cands] == ["rewrite", "search", "search"]
    assert "64 output tiles at bench-gpu for 132 cores" in cands[0].description
    assert "128 programs, 1024 of 2048 K steps each" in cands[0].description
    # on a GPU each candidate is sized per call: about 2 x 64 programs at every shape, the kernel as written at 1
    assert "sized per call for about 128 programs at every shape" in cands[0].description
    src = cands[0].source
    for text in ("pid_k = tl.program_id(2)", "c_ptr = c_ptr + pid_k * stride_ck", "k_hi = min(num_k, k_lo + k_per)",
                 "a_block = tl.advance(a_block, (0, k_lo * BLOCK_K))", "for _ in range(k_lo, k_hi):",
                 "tl.store(c_block, acc, boundary_check=(0, 1))",
                 "split_k = splitk_size((triton.cdiv(M, 128), triton.cdiv(N, 128)), triton.cdiv(K, 32), 128)",
                 "if split_k > 1:", "matmul_kernel_splitk[(triton.cdiv(M, 128), triton.cdiv(N, 128), split_k)]",
                 "stride_ck=c_partials.stride(0), SPLIT_K=split_k", "matmul_kernel[grid](a, b, c,",
                 "c_partials = torch.empty((split_k, *c.shape), device=c.device, dtype=torch.float32)"):
        assert text in src, text
    assert "atomic" not in src
    assert [s.kernel for s in parse_kernel(src).launches] == ["matmul_kernel_splitk", splitk.SUM_KERNEL,
                                                              "matmul_kernel"]
    # at ci's 5 K steps the sized split keeps SPLIT_K = 1, so the branch as written runs here; the split itself is
    # verified on the copies below whose ci K is 608
    for c in cands:
        verdict = verify(p, c.source)
        assert verdict.correct, (c.params, verdict.feedback())


def _split_size():
    """The helper a sized split adds to forward, as the file defines it."""
    env: dict = {}
    exec(splitk.SIZE_FN_CODE.format(name="size", most=splitk.MOST, min_steps=splitk.MIN_SLICE_STEPS), env)
    return env["size"]


def test_a_split_sized_per_call_fills_the_programs_at_every_shape():
    """gemm_tall_k sized at M = 1024 (64 tiles of 128 x 128, SPLIT_K = 4: 256 programs): at M = 16 (8 tiles) the
    split is 32, at 1000 x 1000 4 again, and a square 4096^3 GEMM (1024 tiles) runs unsplit; a short K loop keeps 4
    steps a slice."""
    size = _split_size()
    assert size((8, 8), 2048, 256) == 4
    assert size((1, 8), 2048, 256) == 32
    assert size((8, 8), 2048, 256) == size((-(-1000 // 128), -(-1000 // 128)), 2048, 256)
    assert size((32, 32), 2048, 256) == 1
    assert size((1, 8), 12, 256) == 2 and size((1, 8), None, 256) == 32


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 64), min_size=1, max_size=3), st.one_of(st.none(), st.integers(0, 5000)),
       st.integers(1, 4096))
def test_the_sized_split_is_the_largest_power_of_two_within_its_bounds(grid, steps, programs):
    size = _split_size()
    s = size(tuple(grid), steps, programs)
    tiles = 1
    for g in grid:
        tiles *= g
    assert s >= 1 and s & (s - 1) == 0 and s <= splitk.MOST

    def ok(k: int) -> bool:
        return k <= splitk.MOST and tiles * k <= programs and (steps is None or steps // k >= splitk.MIN_SLICE_STEPS)

    assert s == 1 or ok(s)
    assert not ok(2 * s)


def test_a_split_sized_per_call_splits_and_verifies_where_the_shape_asks(verify, tmp_path):
    """A copy of gemm_tall_k whose ci K is 608 (19 steps of 32): sized for 256 programs, the one ci tile splits 4
    ways (slices of 5, 5, 5 and 4 steps) and the result matches the reference, at the ragged shapes too; a slice
    bound that drops the short last slice is caught."""
    folder = tmp_path / "gemm_tall_k"
    shutil.copytree(TALL_K, folder)
    spec = folder / "spec.yaml"
    spec.write_text(spec.read_text().replace("dims: {M: 32, K: 160, N: 32}", "dims: {M: 32, K: 608, N: 32}"))
    p = load_problem(folder)
    plan = splitk.find(p.kernel_source, p)
    src = splitk.apply(p.kernel_source, plan, 4, programs=256)
    assert splitk.SIZE_FN in src and "if split_k > 1:" in src
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()
    bad = src.replace("k_per = tl.cdiv(num_k, SPLIT_K)", "k_per = num_k // SPLIT_K")
    assert bad != src and not verify(p, bad).correct


def test_a_1d_grid_split_sized_per_call_takes_its_slices_on_axis_1(verify, tmp_path):
    """gemm_square (one program id, the grouped tile order) with its ci K at 608: sized for 64 programs, the one ci
    tile splits 4 ways on the grid's second axis and the result matches the reference."""
    folder = tmp_path / "gemm_square"
    shutil.copytree(KERNELS / "gemm_square", folder)
    spec = folder / "spec.yaml"
    spec.write_text(spec.read_text().replace("dims: {M: 64, K: 64, N: 64}", "dims: {M: 64, K: 608, N: 64}"))
    p = load_problem(folder)
    plan = splitk.find(p.kernel_source, p)
    src = splitk.apply(p.kernel_source, plan, 4, programs=64)
    assert "split_k = splitk_size((triton.cdiv(M, 128) * triton.cdiv(N, 128),), triton.cdiv(K, 32), 64)" in src
    assert "matmul_kernel_splitk[(triton.cdiv(M, 128) * triton.cdiv(N, 128), split_k)]" in src
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_a_split_sized_per_call_runs_the_epilogue_once_on_the_sum(verify, tmp_path):
    """kb09 (bias in the kernel, its tail in a second kernel) with its ci K at 608: sized for 256 programs, the
    split and epilogue copies run at ci (19 steps of 32: 4 slices) and the result matches the reference."""
    folder = tmp_path / "kb09"
    shutil.copytree(next(KERNELS.glob("kb09_*")), folder)
    spec = folder / "spec.yaml"
    spec.write_text(spec.read_text().replace("dims: {M: 32, K: 64, N: 48}", "dims: {M: 32, K: 608, N: 48}"))
    p = load_problem(folder)
    plan = splitk.find(p.kernel_source, p)
    assert plan.epilogue is not None
    src = splitk.apply(p.kernel_source, plan, 4, programs=256)
    k = plan.kernel
    assert [s.kernel for s in parse_kernel(src).launches if s.kernel.startswith(k)] == \
        [f"{k}_splitk", f"{k}_epilogue", k]
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


@pytest.mark.parametrize("style", ["wrapper", "meta_grid"])
def test_a_lambda_grid_whose_meta_parameters_the_launch_passes_is_sized_per_call(verify, tmp_path, style):
    """The style corpus's linear_relu as a wrapper (`lambda META: (cdiv(M, META["BM"]), ...)` launched with
    `BM=BLOCK_M`, module constants) and with a META grid: the host counts the tiles with what the launch passes.
    Its bench shape made few-tiled (M = 16, N = 256) and its ci K 608, the sized split runs at ci and verifies."""
    folder = tmp_path / "linear_relu"
    shutil.copytree(ROOT / "tests" / "fixtures" / "styles" / "linear_relu", folder)
    spec = folder / "spec.yaml"
    spec.write_text(spec.read_text().replace("dims: {M: 1024, K: 4096, N: 4096}", "dims: {M: 16, K: 8192, N: 256}")
                    .replace("dims: {M: 24, K: 64, N: 48}", "dims: {M: 24, K: 608, N: 48}"))
    (folder / "kernel.py").write_text((folder / f"{style}.py").read_text())
    p = load_problem(folder)
    cand = candidates(p)[0]
    assert "sized per call" in cand.description and "lambda META: (*(grid)(META), split_k)" in cand.source
    size_call = next(ln for ln in cand.source.splitlines() if "= splitk_size(" in ln)
    assert "META" not in size_call, size_call
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()
    if style == "meta_grid":  # the split launch retiled (literal block sizes): the K steps counted follow its BK
        assert "triton.cdiv(K, 32), 128)" in size_call
        tuned = splitk.follow(apply_config(cand.source, "fc_relu_splitk", {"BK": 64}))
        assert "splitk_size((triton.cdiv(M, 16), triton.cdiv(N, 16)), triton.cdiv(K, 64), 128)" in tuned


def test_a_grid_of_the_launch_meta_parameters_is_split_at_a_constant():
    """An @triton.autotune'd kernel's grid is a lambda of the tuned block sizes, which the launch does not pass: the
    host cannot count its tiles before the call, so the split is not sized per call and the tactic falls back to a
    constant SPLIT_K."""
    from tests.realworld import problem_dir

    p = load_problem(problem_dir("matmul_autotune_act"))
    plan = splitk.find(p.kernel_source, p)
    with pytest.raises(NotApplicable, match="cannot count the tiles"):
        splitk.apply(p.kernel_source, plan, 4, programs=256)
    assert "split_k = 4" in splitk.apply(p.kernel_source, plan, 4)


def test_a_kernel_that_fills_the_device_at_its_bench_shape_is_split_for_the_decode_shape():
    """gemm_square at 4096^3 has 1024 tiles of 128 x 128 on a 1D grid (it fills 132 cores); at M = 16, 32 tiles
    leave three quarters idle: candidates sized there, each timed at every shape, 4096^3 running the kernel as
    written. (The tail split for its 3000 x 4096 x 3000 shape comes second: tests/test_tactic_splitk_tail.py.)"""
    p = load_problem(KERNELS / "gemm_square")
    cands = [c for c in candidates(p) if "_tail(" not in c.source]
    assert cands and all(c.time_all_shapes for c in cands)
    assert "32 output tiles at bench-gpu-1" in cands[0].description
    assert "the kernel as written runs there" in cands[0].description
    assert "if split_k > 1:" in cands[0].source


def test_the_ragged_shapes_need_the_short_last_slice(verify):
    """At ci K=160 is 5 steps of 32: slices of 3 and 2 steps. A split that rounds the slice length down loses the
    last step and must be rejected."""
    p = load_problem(TALL_K)
    ctx = tactic_context(p)
    (cand,) = TACTIC.propose(ctx)
    bad = cand.source.replace("k_per = tl.cdiv(num_k, SPLIT_K)", "k_per = num_k // SPLIT_K")
    assert bad != cand.source
    assert not verify(p, bad).correct


def test_after_block_io_both_k_loops_are_split(verify):
    p = load_problem(TALL_K)
    src, _ = blockio.rewrite(p.kernel_source)
    cand = candidates(p, src)[0]
    out = cand.source
    assert out.count("for _ in range(k_lo, k_hi):") == 2  # the descriptor loop and the block-pointer fallback
    assert "c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc)" in out
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()


def test_after_block_io_a_split_sized_per_call_verifies_where_it_splits(verify, tmp_path):
    """The descriptor kernel (block_io) split sized per call, on a copy of gemm_tall_k whose ci K is 608: at ci the
    split copy runs (both of its K loops sliced) and the result matches the reference."""
    folder = tmp_path / "gemm_tall_k"
    shutil.copytree(TALL_K, folder)
    spec = folder / "spec.yaml"
    spec.write_text(spec.read_text().replace("dims: {M: 32, K: 160, N: 32}", "dims: {M: 32, K: 608, N: 32}"))
    p = load_problem(folder)
    src, _ = blockio.rewrite(p.kernel_source)
    plan = splitk.find(src, p)
    out = splitk.apply(src, plan, 4, programs=256)
    assert out.count("for _ in range(k_lo, k_hi):") == 2 and "if split_k > 1:" in out
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()


def test_the_interpreter_gets_one_candidate():
    p = load_problem(TALL_K)
    ctx = tactic_context(p)
    (cand,) = TACTIC.propose(ctx)
    assert cand.kind == "rewrite" and cand.params[splitk.PARAM] == 2
    assert "only checks the rewrite" in cand.description


def test_split_values_fill_the_device_within_bounds():
    assert split_values(64, 2048, 132) == [2, 4, 8]  # 128 programs: one wave of 132 cores, 97% full
    assert split_values(32, 1024, 132) == [4, 2, 8]  # gemm_tall_k's 128 x 256 tiles on an H100: SPLIT_K 4 won there
    assert split_values(40, 2048, 132) == [4, 2, 8]  # 160 programs at 4: none fills one wave, so every core gets one
    assert split_values(100, 2048, 132) == [2, 4]  # 8 x 100 is over 4 programs per core
    assert split_values(64, 12, 132) == [2]  # 4 K steps per slice at least
    assert split_values(64, 4, 132) == []


def test_pointer_loops_start_at_their_slice(verify):
    """gemm_skinny_m advances pointers with +=, loops over range(0, K, BLOCK_K) and masks with K - k0."""
    p = load_problem(KERNELS / "gemm_skinny_m")
    cand = candidates(p)[0]
    src = cand.source
    assert "x_ptrs += k_lo.to(tl.int64) * BLOCK_K * stride_xk" in src
    assert "for k0 in range(k_lo * BLOCK_K, k_hi * BLOCK_K, BLOCK_K):" in src
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def _fused_tail(p):
    tactic = next(t for t in fusion.STAGE.tactics if t.name == "fuse-elementwise-chain")
    return tactic.propose(tactic_context(p))[-1].source


def _fused_gemm_relu(p):
    tactic = next(t for t in fusion.STAGE.tactics if t.name == "fuse-elementwise-chain")
    return tactic.propose(tactic_context(p))[0].source


def _third_axis(p):
    return p.kernel_source.replace("pid_n = tl.program_id(1)\n", "pid_n = tl.program_id(1)\n    pid_b = tl.program_id(2)\n")


def _pointer_after_the_loop(p):
    """The store's pointer and mask built after the K loop, from the program ids (as the tutorial GEMM does)."""
    src = p.kernel_source.replace(
        "    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,",
        "    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)\n    c_ptrs = c_ptr + rows[:, None] * stride_cm + "
        "offs_n[None, :] * stride_cn\n    c_mask = (rows[:, None] < M) & (offs_n[None, :] < N)\n    tl.store(c_ptrs,")
    src = src.replace("             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))\n\n\n@triton.jit\ndef sub_mul",
                      "             mask=c_mask)\n\n\n@triton.jit\ndef sub_mul")
    assert "tl.store(c_ptrs," in src and "mask=c_mask)" in src
    return src


def _mask_from_the_loop(p):
    return p.kernel_source.replace("             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))\n\n\n@triton.jit",
                                   "             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N) & (k0 >= 0))"
                                   "\n\n\n@triton.jit")


def _epilogue_reads_the_loop(p):
    return p.kernel_source.replace("    acc = acc + bias[None, :]", "    acc = acc + bias[None, :] + k0")


@pytest.mark.parametrize("folder,make", [
    (KERNELS / "kb09_matmul_subtract_multiply_relu", None),  # bias in the kernel, the tail in a second kernel
    (KERNELS / "kb09_matmul_subtract_multiply_relu", _fused_tail),  # the tail kernel folded into the store
    (KERNELS / "gemm_relu", _fused_gemm_relu),  # the relu fused into the store: `y = tl.maximum(acc, 0)`
    (KERNELS / "kb09_matmul_subtract_multiply_relu", _pointer_after_the_loop),  # moved before the sum
], ids=["bias", "fused-tail", "fused-relu", "pointer-after-the-loop"])
def test_a_gemm_with_an_epilogue_is_split_and_its_epilogue_runs_once_on_the_sum(verify, folder, make):
    """The kernel stays; <kernel>_splitk runs the K slices and stores raw fp32 partial tiles where the kernel stored
    its finished one; <kernel>_epilogue sums them in slice order in place of its K loop and runs the epilogue as
    written, on the original grid. Verified on ci and the ragged shapes (K=17: one step, three empty slices)."""
    p = load_problem(folder)
    src = p.kernel_source if make is None else make(p)
    plan = splitk.find(src, p)
    assert plan.epilogue is not None
    out = splitk.apply(src, plan, 4)
    k = plan.kernel
    assert [s.kernel for s in parse_kernel(out).launches if s.kernel.startswith(k)] == \
        [f"{k}_splitk", f"{k}_epilogue"]
    split_fn = out[out.index(f"def {k}_splitk("):out.index(f"def {k}_epilogue(")]
    epi_fn = out[out.index(f"def {k}_epilogue("):]
    epi_fn = epi_fn[:epi_fn.index("\n\n\n")]
    assert "tl.dot" in split_fn and "tl.dot" not in epi_fn and ".to(" not in split_fn.split("tl.store(")[-1]
    assert "for s in tl.static_range(1, SPLIT_K):" in epi_fn and "+ s * stride_pk" in epi_fn
    assert "atomic" not in out and splitk.SUM_KERNEL not in out
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()


@pytest.mark.parametrize("make,reason", [
    (_mask_from_the_loop, "the store's pointer or mask uses k0, which is not fixed before the K loop"),
    (_epilogue_reads_the_loop, "its epilogue reads k0, which the K loop assigns"),
], ids=["mask-from-the-loop", "epilogue-reads-the-loop"])
def test_an_epilogue_a_second_kernel_cannot_run_is_left_alone_with_the_reason(make, reason):
    p = load_problem(KERNELS / "kb09_matmul_subtract_multiply_relu")
    with pytest.raises(NotApplicable) as err:
        splitk.find(make(p), p)
    assert EPILOGUE in str(err.value) and reason in str(err.value), str(err.value)


@pytest.mark.parametrize("folder,make,reason", [
    (KERNELS / "gemm_relu", None, "16384 output tiles at bench-gpu already fill the 132 cores"),
    (TALL_K, lambda p: persistent.rewrite(p.kernel_source)[0], "is persistent (it loops over tiles)"),
    (TALL_K, _third_axis, "already uses a third grid axis"),
    (next(KERNELS.glob("kb09_*")), None, "8192 output tiles at bench-gpu already fill the 132 cores (test cuda), "
     "and so do those of every other timed shape"),
    (KERNELS / "gemv_decode", None, "no launched kernel calls tl.dot"),
    (KERNELS / "flash_attn_fwd", None, "carries m_i from one step to the next"),
], ids=["fills-device", "persistent", "3d-grid", "fills-every-shape", "no-dot", "attention"])
def test_other_kernels_are_left_alone_with_the_reason(folder, make, reason):
    p = load_problem(folder)
    src = p.kernel_source if make is None else make(p)
    ctx = h200(p, src)
    app = TACTIC.check(ctx)
    assert not app.applies and reason in app.reason, app.reason
    assert TACTIC.propose(ctx) == [] and ctx.source == src


def test_a_gpu_without_a_core_count_is_not_guessed():
    p = load_problem(TALL_K)
    ctx = tactic_context(p, kind="cuda", cores=None)
    assert ctx.device_id is None
    app = TACTIC.check(ctx)
    assert not app.applies and "core count is unknown" in app.reason


def test_split_k_runs_first_in_the_stage():
    names = [t.name for t in device_tuning.STAGE.tactics]
    assert names[0] == "split-k" and names.index("group-swizzle") < names.index("launch-params")


def test_the_split_kernel_stays_tunable(verify, tmp_path):
    """After the split the launch-parameter search still tunes the GEMM's tiles: the grid follows BLOCK_M and the
    slices follow BLOCK_K (computed in the kernel). Verified on a copy whose ci K is 608, where the split runs."""
    p = load_problem(TALL_K)
    src = candidates(p)[0].source
    search = next(t for t in device_tuning.STAGE.tactics if t.name == "launch-params")
    app = search.check(h200(p, src))
    assert app.applies and "BLOCK_M, BLOCK_N, BLOCK_K" in app.reason, app.reason
    # the launch the search tunes is the split one (where the traces see the bench shape run); its grid is its own,
    # and the sizing counts the tiles and K steps of that launch as tuned
    tuned = next(c.source for c in search.propose(h200(p, src))
                 if c.params.get("BLOCK_M") == 64 and c.params.get("BLOCK_K") == 64)
    assert "matmul_kernel_splitk[(triton.cdiv(M, 64), triton.cdiv(N, 128), split_k)]" in tuned
    assert "splitk_size((triton.cdiv(M, 64), triton.cdiv(N, 128)), triton.cdiv(K, 64), 128)" in tuned
    folder = tmp_path / "gemm_tall_k"
    shutil.copytree(TALL_K, folder)
    spec = folder / "spec.yaml"
    spec.write_text(spec.read_text().replace("dims: {M: 32, K: 160, N: 32}", "dims: {M: 32, K: 608, N: 32}"))
    verdict = verify(load_problem(folder), tuned)
    assert verdict.correct, verdict.feedback()


def test_a_split_launched_from_two_places_keeps_its_count():
    """A per-shape dispatch of the split launch gives it two configurations: no one count fits both, so the sizing
    stays as it was (while a single launch's retile is followed)."""
    from xeforge.rewrite.tiling.dispatch import Branch, dispatch

    src = candidates(load_problem(TALL_K))[0].source
    size_call = next(ln for ln in src.splitlines() if "= splitk_size(" in ln)
    two = dispatch(src, "matmul_kernel_splitk", [Branch("M <= 64", {"BLOCK_M": 64})])
    assert two.count("matmul_kernel_splitk[") == 2
    assert splitk.follow(two) == two and size_call in two
    one = apply_config(src, "matmul_kernel_splitk", {"BLOCK_M": 64})
    assert size_call not in splitk.follow(one)


@pytest.mark.slow  # ~26 s on two busy cores: a whole dry run in a subprocess
def test_dry_run_lists_the_tactic(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "xeforge", "port", str(TALL_K), "--device", "cuda", "--target", "h200",
                           "--dry-run", "--stages", "device_tuning", "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "tactic split-k: applies — matmul_kernel: split-K" in proc.stdout
    assert "64 output tiles at bench-gpu for 132 cores (KB h200)" in proc.stdout
    assert "+++ split-k" in proc.stdout


def test_a_1d_grid_in_the_grouped_tile_order_takes_the_slices_on_its_second_axis(verify):
    """gemm_square: one program id, the tile's row and column computed from it (GROUP_SIZE_M); the slices take grid
    axis 1 and the grouped order of the tiles stays as it was. Verified on ci and the ragged shapes (K=17 is one
    step of 32: three of the four slices are empty)."""
    p = load_problem(KERNELS / "gemm_square")
    plan = splitk.find(p.kernel_source, p)
    assert plan.axis == 1
    src = splitk.apply(p.kernel_source, plan, 4)
    for text in ("pid_k = tl.program_id(1)", "grid = (triton.cdiv(M, 128) * triton.cdiv(N, 128), split_k)",
                 "group_id = pid // num_pid_in_group"):
        assert text in src, text
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


@pytest.mark.slow  # six `xeforge new` problems, each verified (about 85 s on 2 cores)
@pytest.mark.parametrize("name,epilogue", [
    ("matmul_bias_gelu_evenk", "float32"),  # 1D grid, EVEN_K from a heuristic, an `if` in the K loop, bias + GELU
    ("w8a8_int8_matmul", "int32"),  # int32 accumulator: int32 partial tiles (exact), the scales in the epilogue
    ("matmul_config_by_m", None),  # a config table keyed on M, no epilogue
    ("matmul_autotune_act", "float32"),  # @triton.autotune'd: both copies keep the decorator and tune their own
    ("int4_dequant_matmul", None),  # @triton.autotune'd with pruning; nibbles unpacked in the K loop
    ("tma_matmul_desc", None),  # descriptors made in the kernel; the tile stored as acc.to(c_desc.dtype)
])
def test_real_world_gemms_are_split_and_correct(verify, name, epilogue):
    """Kernels of the real-world corpus as their projects write them (examples/realworld/), brought in with
    `xeforge new`: split with SPLIT_K=3 (a short last slice at the ragged K) and verified on the interpreter."""
    from tests.realworld import problem_dir

    p = load_problem(problem_dir(name))
    plan = splitk.find(p.kernel_source, p)
    if "autotune" in name:
        assert parse_kernel(p.kernel_source).functions[plan.kernel].is_autotuned
    assert (plan.epilogue.acc_dtype if plan.epilogue else None) == epilogue
    src = splitk.apply(p.kernel_source, plan, 3)
    if epilogue == "int32":
        assert "dtype=torch.int32)" in src and "other=0)" in src
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_a_name_both_branches_of_an_if_assign_is_not_state_the_loop_carries():
    """`if EVEN_K: ... else: k_left = ...; ... k_left ...` in a K loop carries nothing from one step to the next; a
    name only one branch assigns, read after the `if`, is carried (and named)."""
    p = load_problem(KERNELS / "kb09_matmul_subtract_multiply_relu")
    both = p.kernel_source.replace(
        "        k = k0 + offs_k\n",
        "        if K % BLOCK_K == 0:\n            k = k0 + offs_k\n        else:\n            k = offs_k + k0\n")
    assert both != p.kernel_source
    assert splitk.find(both, p).loops[0].increments == []
    one = both.replace("        else:\n            k = offs_k + k0\n", "")
    with pytest.raises(NotApplicable) as err:
        splitk.find(one, p)
    assert "carries k from one step to the next" in str(err.value)


@pytest.mark.slow  # about 11 s: two rewrites verified on the interpreter (tests/test_tactic_persistent.py -k inline is the fast check)
def test_inline_program_ids_are_hoisted_so_split_k_and_the_swizzle_apply(tmp_path, verify):
    """The common form ``rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)``: the program ids get one name each
    at the top of the kernel (no value changes), and the remapping rewrites then apply; each result verifies."""
    from tests.test_fusion_graph import _problem
    from xeforge.rewrite.device_tuning import splitk, swizzle
    from xeforge.rewrite.tiling.pids import hoist_program_ids

    p = _problem(tmp_path, "return y")
    assert "rm = tl.program_id(0) * BLOCK_M" in p.kernel_source  # the fixture's form
    hoisted = hoist_program_ids(p.kernel_source)
    assert "    pid_0 = tl.program_id(0)\n    pid_1 = tl.program_id(1)\n    rm = pid_0 * BLOCK_M" in hoisted
    assert hoist_program_ids(hoisted) == hoisted
    plan = splitk.find(p.kernel_source, p)
    split = splitk.apply(p.kernel_source, plan, 2)
    swizzled, _ = swizzle.rewrite(p.kernel_source, group=4)
    for src in (split, swizzled):
        verdict = verify(p, src)
        assert verdict.correct, verdict.feedback()


def test_a_program_id_name_that_is_reassigned_is_not_reused_for_the_inline_reads():
    from xeforge.rewrite.tiling.pids import hoist_program_ids

    src = ("import torch\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\n"
           "def k(x, y, n, BLOCK: tl.constexpr):\n    pid = tl.program_id(0)\n    pid = pid * 2\n"
           "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n    tl.store(y + offs, tl.load(x + offs))\n\n\n"
           "class Model(torch.nn.Module):\n    def forward(self, x):\n        y = torch.empty_like(x)\n"
           "        k[(4,)](x, y, 4, BLOCK=4)\n        return y\n")
    out = hoist_program_ids(src)
    assert "    pid_0 = tl.program_id(0)\n" in out and "offs = pid_0 * BLOCK" in out and "pid = pid * 2" in out


def test_a_store_through_gathered_rows_is_split_into_zeroed_partials(verify):
    """moe_grouped_gemm (the corpus) stores its tile at rows it loads from an index array (a block's token ids), so
    the analysis reads no tile there, and split-K said "cannot tell which tensor the store writes". The output is
    the pointer parameter the store's sum starts from; its partial tiles are zeroed (gathered rows need not cover
    the output). The split verifies; one slice left out of the sum is caught."""
    from tests.realworld import problem_dir

    p = load_problem(problem_dir("moe_grouped_gemm"))
    plan = splitk.find(p.kernel_source, p)
    assert plan.out == "out_ptr" and plan.gathered
    src = splitk.apply(p.kernel_source, plan, 2)
    assert "out_partials = torch.zeros((split_k, *out.shape)" in src, src
    assert verify(p, src).correct
    assert not splitk.find(ROOT.joinpath("kernels", "gemm_tall_k", "kernel.py").read_text(),
                           load_problem(ROOT / "kernels" / "gemm_tall_k")).gathered
    dropped = src.replace("tl.static_range(1, SPLIT_K)", "tl.static_range(1, 1)")
    assert dropped != src and not verify(p, dropped).correct


def test_the_summing_launch_is_sized_per_call():
    """On an H100 (2026-12-07) gemm_tall_k's port summed its 32 slices at M = 16 in 16 programs (the bench's
    diagnosis: 116 cores without one): the launch now halves the tile's columns until it has about 128 programs, and
    passes the widest aligned access the columns and strides allow."""
    env: dict = {}
    exec(splitk.SUM_CONFIG_FN_CODE.format(name="size", programs=128, block=64, sum_kernel="s"), env)  # noqa: S102
    size = env["size"]
    assert size(1024, 1024, 4 * 1024 * 1024, 1024, 1024) == (64, 64, 16)  # 256 programs already
    assert size(16, 1024, 16 * 1024, 1024, 1024) == (16, 16, 16)  # 64 programs, not 16 (columns stop at 16)
    assert size(1000, 1000, 1000 * 1000, 1000, 1000) == (64, 64, 8)
    assert size(17, 33, 17 * 33, 33, 33)[2] == 1
    src = splitk.apply(load_problem(ROOT / "kernels" / "gemm_tall_k").kernel_source, splitk.find(
        load_problem(ROOT / "kernels" / "gemm_tall_k").kernel_source), 4)
    (launch,) = [s for s in parse_kernel(src).launches if s.kernel == splitk.SUM_KERNEL]
    assert launch.other_kwargs.get("VEC") == "sum_vec" and f"{splitk.SUM_CONFIG_FN}(c.shape[0]" in src


def test_the_summing_kernel_stores_aligned_vectors_at_an_odd_width_with_vec(tmp_path):
    """At M = N = 1000 the H100 bench found the summing kernel's accesses scalar (32 ``st.global.b16``): Triton
    assumes no alignment of an integer that is not a multiple of 16. Compiled for sm_90 on this host as Triton
    specializes it at that shape (16-byte aligned pointers, unit column strides, the row strides 1000 unknown),
    the kernel loads and stores 16-byte vectors with VEC = 8 (1000 = 8 x 125), and single elements without."""
    import triton

    GPUTarget, ASTSource = sm90_compiler()
    src = splitk.SUM_KERNEL_CODE.format(name="sum_kernel", param=splitk.PARAM, cast="tl.bfloat16")
    fn = load_kernel_module(tmp_path / "sum_sm90.py", "import triton\nimport triton.language as tl\n" + src,
                            "xeforge_test_sum_sm90").sum_kernel

    def accesses(vec: int) -> set[str]:
        consts = {splitk.PARAM: 4, "BLOCK_M": 64, "BLOCK_N": 64, "VEC": vec, "stride_pn": 1, "stride_on": 1}
        sig = {a: "constexpr" if a in consts else ("*fp32" if a == "part_ptr" else "*bf16" if a == "out_ptr" else "i32")
               for a in fn.arg_names}
        aligned = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in ("part_ptr", "out_ptr", "stride_pk")}
        const_idx = {(fn.arg_names.index(k),): v for k, v in consts.items()}
        ptx = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const_idx, attrs=aligned),
                             target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
        return set(re.findall(r"(?:ld|st)\.global[.a-z0-9]*", ptx))

    assert accesses(1) == {"ld.global.b32", "st.global.b16"}
    assert accesses(8) == {"ld.global.v4.b32", "st.global.v4.b32"}
