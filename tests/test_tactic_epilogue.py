"""The device_tuning stage's epilogue-halves tactic: a GEMM's epilogue on two column halves of its accumulator.

The rewrite runs through the real verifier on the interpreter (ci shapes, ragged N whose second half is partly or
wholly out of bounds), on the style corpus's GELU + residual problem as its start, after fusion and after block_io
(the C descriptor halved, the residual through a descriptor too), and on every style of two problems (the launch is
never what decides); an epilogue it cannot split is left alone with the construct named.
"""

from __future__ import annotations

import pytest

from stages import device_tuning, fusion
from stages.device_tuning import target_site
from stages.device_tuning_epilogue import EpilogueHalves
from tests.conftest import FIXTURES, ROOT, tactic_context
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite import NotApplicable, blockio, persistent
from xeforge.rewrite.device_tuning.epilogue import split_epilogue
from xeforge.rewrite.tiling.configs import apply_config

STYLES = FIXTURES / "styles"
TACTIC = EpilogueHalves(target_site)
STYLE_NAMES = sorted(p.stem for p in (STYLES / "linear_relu").glob("*.py") if p.stem != "reference")


def halved(p, source: str | None = None, kind: str = "cpu"):
    ctx = tactic_context(p, source, kind=kind, target="h200" if kind == "cuda" else None)
    app = TACTIC.check(ctx)
    assert app.applies, app.reason
    cands = TACTIC.propose(ctx)
    assert cands and all(c.tactic == "epilogue-halves" and c.kind == "rewrite" for c in cands)
    return cands


def fused_gelu(p) -> str:
    fuse = next(t for t in fusion.STAGE.tactics if t.name == "fuse-epilogue")
    return fuse.propose(tactic_context(p))[0].source


def test_the_start_kernel_epilogue_runs_on_two_halves(verify):
    p = load_problem(STYLES / "linear_gelu_residual" / "direct.py")
    cand = halved(p)[0]
    src = cand.source
    assert "acc_halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))" in src
    # each half made as the whole was, so the compiler still knows it is contiguous (a split vector is not)
    assert "offs_n_lo = pid_n * BLOCK_N + tl.arange(0, BLOCK_N // 2)" in src
    assert "offs_n_hi = pid_n * BLOCK_N + (BLOCK_N // 2 + tl.arange(0, BLOCK_N // 2))" in src
    assert src.count("tl.store(") == 2 and "offs_n_hi[None, :] < N" in src
    assert "column halves of acc" in cand.description and cand.params["epilogue_halves"] is True
    again = TACTIC.check(tactic_context(p, src))  # never halved twice
    assert not again.applies and "already in halves" in again.reason
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_after_fusion_and_block_io_the_descriptors_are_halved(verify):
    """The fused GELU + residual epilogue, its residual and C through descriptors: both descriptors get a
    [BM, BN // 2] block, the second half's column coordinate moves by BN // 2, and the K loop's descriptors stay."""
    p = load_problem(STYLES / "linear_gelu_residual" / "direct.py")
    fused = fused_gelu(p)
    src, _ = blockio.rewrite(fused, kernel=blockio.choose_kernel(parse_kernel(fused)), epilogue_loads=True)
    new, plan = split_epilogue(src, "linear_bias_kernel")
    assert set(plan.descriptors) >= {"residual_desc"} and len(plan.descriptors) == 2, plan
    assert "block_shape=[BLOCK_M, BLOCK_N // 2]" in new and "block_shape=[BLOCK_N, BLOCK_K]" in new
    assert "pid_n * BLOCK_N + BLOCK_N // 2]" in new and "tl.erf(acc_hi" in new and "tl.erf(acc_lo" in new
    verdict = verify(p, new)
    assert verdict.correct, verdict.feedback()
    # the later rewrites still read the tile axes (the descriptor path's K loop says nothing about them; the halves'
    # masks do, as BLOCK_N//2 vectors): a tile loop and a re-tiled launch, on the H200 the halves were not composable
    looped, _ = persistent.rewrite(new, kernel="linear_bias_kernel")
    assert "tl.range(tl.program_id(0), num_tiles, tl.num_programs(0))" in looped
    assert "triton.cdiv(M, 64), triton.cdiv(N, 128)" in apply_config(new, "linear_bias_kernel",
                                                                      {"BLOCK_M": 64, "BLOCK_N": 128})
    # and wrong halves fail the verifier: the second half stored over the first
    broken = new.replace("pid_n * BLOCK_N + BLOCK_N // 2]", "pid_n * BLOCK_N]")
    assert broken != new and not verify(p, broken).correct


@pytest.mark.parametrize("problem_name", ["linear_relu", "linear_gelu_residual"])
@pytest.mark.parametrize("style", STYLE_NAMES)
def test_applies_in_every_style(problem_name, style):
    """Wrappers, META grids, @triton.autotune, autograd.Function, launcher classes, torch.library ops, module
    constants, backward kernels beside forward's: the rewrite reads the kernel forward really launches."""
    p = load_problem(STYLES / problem_name / f"{style}.py")
    ctx = tactic_context(p)
    site = target_site(ctx.model)
    _, plan = split_epilogue(ctx.source, site.kernel)  # the rewrite itself, whatever the start's tile
    assert plan.kernel == site.kernel and plan.statements >= 2
    app = TACTIC.check(ctx)  # a start launched with 16 columns is refused for that alone (the tuned tile is wider)
    assert app.applies or "columns are too narrow to gain" in app.reason, app.reason


def test_a_row_reduction_in_the_epilogue_is_left_alone():
    """The split logsumexp's per-tile partial is a max and a sum over the tile's columns: half a row is not the
    partial of the tile (and on the H200 its halves ran slower anyway)."""
    p = load_problem(STYLES / "linear_logsumexp" / "direct.py")
    split = next(t for t in fusion.STAGE.tactics if t.name == "fuse-split-row-reduction")
    src = split.propose(tactic_context(p))[-1].source
    assert "row_part" in src
    app = TACTIC.check(tactic_context(p, src))
    assert not app.applies and "the epilogue calls tl.max" in app.reason


def _with_tile_before_the_loop(src: str, extra: str = "") -> str:
    """linear_relu with its output pointers as a [BM, BN] tile built before the K loop (the serving libraries'
    ``c_ptrs = ...`` made with the A and B pointers), ``extra`` after it."""
    ptrs = "y_ptr + rm[:, None] * sym + rn[None, :] * syn"
    tiled = src.replace("    for k in range(", f"    out_tile = {ptrs}\n{extra}    for k in range(", 1)
    tiled = tiled.replace(f"tl.store({ptrs},", "tl.store(out_tile,", 1)
    assert tiled.count("out_tile") >= 2, "fixture drifted: the store's pointer expression changed"
    return tiled


def test_a_tile_made_once_before_the_loop_is_made_again_per_half(verify):
    p = load_problem(STYLES / "linear_relu" / "direct.py")
    kernel = target_site(parse_kernel(p.kernel_source)).kernel
    new, plan = split_epilogue(_with_tile_before_the_loop(p.kernel_source), kernel)
    assert "out_tile" in plan.columns
    assert "out_tile_lo = y_ptr + rm[:, None] * sym + rn_lo[None, :] * syn" in new
    assert "out_tile_hi = y_ptr + rm[:, None] * sym + rn_hi[None, :] * syn" in new
    verdict = verify(p, new)
    assert verdict.correct, verdict.feedback()


def test_a_tile_assigned_twice_and_narrow_halves_are_refused():
    p = load_problem(STYLES / "linear_relu" / "direct.py")
    src = p.kernel_source
    kernel = target_site(parse_kernel(src)).kernel
    tiled = _with_tile_before_the_loop(src, "    out_tile += 0\n")
    with pytest.raises(NotApplicable, match=r"reads out_tile, a \[\.\., BN\] tile assigned more than once"):
        split_epilogue(tiled, kernel)
    app = TACTIC.check(tactic_context(p))  # the start launches BN=16: halves of 8 columns
    assert app.applies is False and "halves of 8 columns are too narrow" in app.reason


def test_a_column_vector_assigned_twice_is_split_not_made_again(verify):
    """Where the column vector is assigned more than once its definition cannot be replayed at the epilogue: the
    halves are the vector's own, split like the accumulator; still correct."""
    p = load_problem(STYLES / "linear_relu" / "direct.py")
    line = "    rn = pn * BN + tl.arange(0, BN)\n"
    assert line in p.kernel_source, "fixture drifted: the column vector's definition changed"
    src = p.kernel_source.replace(line, line + "    rn = tl.max_contiguous(rn, BN)\n")
    kernel = target_site(parse_kernel(src)).kernel
    new, plan = split_epilogue(src, kernel)
    assert plan.columns == ["rn"] and "rn_lo, rn_hi = tl.split(tl.permute(tl.reshape(rn, (2, BN // 2)), (1, 0)))" in new
    verdict = verify(p, new)
    assert verdict.correct, verdict.feedback()


def test_a_folded_batch_norm_runs_on_two_halves(verify):
    """kb41's fused epilogue: inference batch_norm folded into ``acc * scale + shift`` (per-column temporaries made
    from four column loads), then GELU and ReLU. Its 128 x 256 GEMM still spilled 14 registers on an H100 after the
    fold (call T, 2026-12-07): the halves hold half of each column vector; still correct."""
    p = load_problem(ROOT / "kernels" / "kb41_gemm_batchnorm_gelu_relu")
    fuse = next(t for t in fusion.STAGE.tactics if t.name == "fuse-epilogue")
    src = fuse.propose(tactic_context(p))[0].source
    assert "acc = (acc * scale) + shift" in src, "the fusion stage no longer folds batch_norm"
    cand = halved(p, src)[0]
    assert "scale" in cand.source.split("acc_halves =")[1] and cand.source.count("tl.store(") == 2
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()


def test_tutorial_style_offsets_made_in_the_epilogue_are_halved(verify):
    """linear_logsumexp's GEMM makes its C offsets after the K loop (``offs_cn = pid_n * BLOCK_SIZE_N +
    tl.arange(0, BLOCK_SIZE_N)``, the Triton tutorial's style) and walks pointers along K: each half gets its own
    range there, and the result is correct."""
    p = load_problem(STYLES / "linear_logsumexp" / "direct.py")
    new, plan = split_epilogue(p.kernel_source, "matmul_bias_kernel")
    assert "offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N // 2)" in new
    assert "offs_cn = pid_n * BLOCK_SIZE_N + (BLOCK_SIZE_N // 2 + tl.arange(0, BLOCK_SIZE_N // 2))" in new
    assert plan.columns == ["offs_bn"]  # the bias offsets, made before the loop
    verdict = verify(p, new)
    assert verdict.correct, verdict.feedback()


def test_the_stage_lists_it_after_the_search():
    names = [t.name for t in device_tuning.STAGE.tactics]
    assert names.index("launch-params") < names.index("epilogue-halves") < names.index("rows-per-program")


def test_a_gpu_also_gets_the_kb_top_tile_and_a_tile_loop():
    p = load_problem(STYLES / "linear_gelu_residual" / "direct.py")
    cpu = halved(p)
    gpu = halved(p, kind="cuda")
    assert len(cpu) == 1 and len(gpu) == 3 and "; with BLOCK_M=" in gpu[1].description
    looped = gpu[2]  # and the halves inside a persistent tile loop, the start having one tile per program
    assert looped.params["persistent"] and "inside linear_bias_kernel: persistent loop" in looped.description
    assert "for tile_id in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0)):" in looped.source
    assert looped.source.count("acc_halves = tl.permute(") == 1


def test_the_halves_in_a_tile_loop_are_correct(verify):
    p = load_problem(STYLES / "linear_gelu_residual" / "direct.py")
    looped = halved(p, kind="cuda")[2]
    verdict = verify(p, looped.source)
    assert verdict.correct, verdict.feedback()
