"""The GEMV form for decode-sized M (issue 34): the K loop's ``tl.dot`` as a multiply and a sum, tiles of 1-8 rows,
launched by the per-shape dispatch's branch for a class of at most 16 rows. On the interpreter: the rewrite of each
accumulation form, its refusals with the reason, its configurations, and dispatches verified against the reference
at the ci shape and the ragged ones (the branch taking M = 17 and 31 with 8- and 1-row tiles, a K and an N that are
not multiples of the tile); on a stand-in H200, that the per-shape tactic proposes it for gemm_relu's M = 16."""

from __future__ import annotations

import pytest

from stages.device_tuning import STAGE
from tests.conftest import ROOT, tactic_context
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.device_tuning.gemv import MAX_ROWS, PRODUCT_ELEMENTS, gemv_branch, gemv_configs, gemv_form
from xeforge.rewrite.tiling.configs import current_config
from xeforge.rewrite.tiling.dispatch import Branch, dispatch

GEMM_RELU = ROOT / "kernels" / "gemm_relu"
PER_SHAPE = next(t for t in STAGE.tactics if t.name == "per-shape-config")

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def k(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k0 + rk)[None, :])
        b = tl.load(b_ptr + (k0 + rk)[:, None] * N + rn[None, :])
        UPDATE
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)
'''
SUM = "tl.sum(a.to({t})[:, :, None] * b.to({t})[None, :, :], axis=1)"


@pytest.mark.parametrize("update, summed", [
    ("acc += tl.dot(a, b)", "acc += " + SUM.format(t="tl.float32")),
    ("acc = tl.dot(a, b, acc)", "acc = acc + " + SUM.format(t="tl.float32")),
    ('acc = tl.dot(a, b, acc=acc, input_precision="ieee")', "acc = acc + " + SUM.format(t="tl.float32")),
    ("acc += tl.dot(a, b, out_dtype=tl.int32)", "acc += " + SUM.format(t="tl.int32")),
    ("acc += tl.dot(a * 2, tl.trans(b))", "acc += tl.sum((a * 2).to(tl.float32)[:, :, None] * "
                                          "tl.trans(b).to(tl.float32)[None, :, :], axis=1)"),
])
def test_each_accumulation_form_becomes_a_multiply_and_a_sum(update, summed):
    src, plan = gemv_form(KERNEL.replace("UPDATE", update), "k")
    assert summed in src and "tl.dot" not in src
    assert (plan.rows, plan.cols, plan.depth) == ("BM", "BN", "BK")


@pytest.mark.parametrize("source, says", [
    (KERNEL.replace("UPDATE", "acc += tl.dot(a, b)\n        acc2 = tl.dot(a, b)"), "2 tl.dot call"),
    (KERNEL.replace("UPDATE", "acc += tl.dot(a, b)").replace("    tl.store(", "    acc = tl.dot(acc, acc)\n"
                                                              "    tl.store("), "2 tl.dot call"),
    (KERNEL.replace("UPDATE", "acc += a"), "no K loop"),
    (KERNEL.replace("UPDATE", "acc += tl.dot(a, b)").replace("(BM, BN)", "(16, BN)"), "not sized by constexpr"),
])
def test_what_it_cannot_rewrite_is_refused_with_the_reason(source, says):
    with pytest.raises(NotApplicable, match=says):
        gemv_form(source, "k")


def test_configurations_keep_the_product_within_the_registers_and_fit_the_rows():
    _, plan = gemv_form(KERNEL.replace("UPDATE", "acc += tl.dot(a, b)"), "k")
    current = {"BM": 64, "BN": 64, "BK": 32, "num_warps": 8}
    for size, top in [(1, 1), (4, 4), (16, MAX_ROWS)]:
        cfgs = gemv_configs(plan, size, current, {"BM", "BN", "BK", "num_warps", "num_stages"})
        assert cfgs and cfgs[0]["BM"] == top and {c["BM"] for c in cfgs} <= {top, 1}
        for c in cfgs:
            assert c["BM"] * c["BN"] * c["BK"] <= PRODUCT_ELEMENTS and c["num_warps"] == 4
    # a launch option the launch may not take is not added
    assert all("num_stages" not in c for c in gemv_configs(plan, 4, current, {"BM", "BN", "BK"}))


@pytest.mark.parametrize("cfg", [{"BLOCK_M": 8, "BLOCK_N": 64, "BLOCK_K": 32}, {"BLOCK_M": 1, "BLOCK_N": 16,
                                                                                "BLOCK_K": 64}])
def test_the_gemv_branch_verifies_at_the_shapes_it_serves(cfg, verify):
    """gemm_relu on the interpreter: ci (M=32) takes the incumbent's launch, the ragged M=31 and 17 the GEMV form
    (8 or 1 rows a program; the ragged shapes' K and N are not multiples of the tile either)."""
    p = load_problem(GEMM_RELU)
    src = p.kernel_source
    out = gemv_branch(dispatch(src, "matmul_kernel", [Branch("M <= 31", cfg)]), src, "matmul_kernel", "M <= 31")
    assert f"matmul_kernel_gemv[(triton.cdiv(M, {cfg['BLOCK_M']}), triton.cdiv(N, {cfg['BLOCK_N']}))](" in out
    assert [s.kernel for s in parse_kernel(out).launches].count("matmul_kernel") == 1
    assert sorted(v.dims["M"] for v in p.correctness_variants("cpu", True)) == [17, 31, 32]  # both branches run
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()


def test_the_per_shape_tactic_proposes_it_for_a_decode_class():
    """gemm_relu on a stand-in H200: M = 16 (bench-gpu-1) is a class of its own (M <= 128); its GEMV candidates
    launch the copy in that branch only, with 8 and 1 rows a program, and gate 3 times them at every shape."""
    p = load_problem(GEMM_RELU)
    ctx = tactic_context(p, kind="cuda", target="h200", cores=132)
    cands = [c for c in PER_SHAPE.propose(ctx) if c.params.get("gemv")]
    assert cands
    site = next(s for s in ctx.model.launches if s.kernel == "matmul_kernel")
    assert current_config(ctx.model, site)["BLOCK_M"] == 32
    for c in cands:
        assert c.time_all_shapes and "if M <= 128 (bench-gpu-1): the GEMV form" in c.description
        kernels = [s.kernel for s in parse_kernel(c.source).launches]
        assert kernels.count("matmul_kernel_gemv") == 1 and kernels.count("matmul_kernel") == 1
    assert {c.params["BLOCK_M"] for c in cands} == {8, 1}


def test_a_class_of_more_rows_gets_no_gemv_form(tmp_path):
    """M = 64 at the decode shape: tl.dot's 16-row tile is already full there."""
    import shutil

    folder = tmp_path / "p"
    shutil.copytree(GEMM_RELU, folder)
    spec = folder / "spec.yaml"
    spec.write_text(spec.read_text().replace("dims: {M: 16, K: 4096, N: 4096}", "dims: {M: 64, K: 4096, N: 4096}"))
    ctx = tactic_context(load_problem(folder), kind="cuda", target="h200", cores=132)
    every = PER_SHAPE.propose(ctx)
    assert every and not [c for c in every if c.params.get("gemv")]
