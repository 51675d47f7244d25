"""The GEMV form for decode-sized M (issue 34): the K loop's ``tl.dot`` as a multiply and a sum, one row a program,
launched by the per-shape dispatch's branch for a class of one or two rows. On the interpreter: the rewrite of each
accumulation form, its refusals with the reason, its configurations, and dispatches verified against the reference
at the ci shape and the ragged ones (the branch taking M = 17 and 31 with 1- and 8-row tiles, a K and an N that are
not multiples of the tile); on a stand-in H200, that the per-shape tactic proposes it for gemm_skinny_m's M = 1 and
not for gemm_relu's M = 16."""

from __future__ import annotations

import pytest

from stages.device_tuning import STAGE
from tests.conftest import ROOT, tactic_context
from tests.test_tactic_swap_ab import KERNEL  # one GEMM, its K-loop update left to each test (UPDATE)
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.device_tuning.gemv import GEMV_ROWS, PRODUCT_ELEMENTS, gemv_branch, gemv_configs, gemv_form
from xeforge.rewrite.tiling.dispatch import Branch, dispatch

GEMM_RELU = ROOT / "kernels" / "gemm_relu"
SKINNY = ROOT / "kernels" / "gemm_skinny_m"
PER_SHAPE = next(t for t in STAGE.tactics if t.name == "per-shape-config")

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


def test_configurations_take_one_row_a_program_and_keep_the_product_within_the_registers():
    """One row a program (tiles of 8 rows ran 2.5-6x slower on the H100, their product's registers), the K tile
    where a constexpr steps the K loop, the fastest measured tile first."""
    _, plan = gemv_form(KERNEL.replace("UPDATE", "acc += tl.dot(a, b)"), "k")
    current = {"BM": 64, "BN": 64, "BK": 32, "num_warps": 8}
    cfgs = gemv_configs(plan, current, {"BM", "BN", "BK", "num_warps", "num_stages"})
    assert cfgs[0] == {"BM": 1, "BN": 64, "BK": 256, "num_warps": 4, "num_stages": 3}
    for c in cfgs:
        assert c["BM"] == 1 and c["BM"] * c["BN"] * c["BK"] <= PRODUCT_ELEMENTS and c["num_warps"] == 4
    # a launch option the launch may not take is not added
    assert all("num_stages" not in c for c in gemv_configs(plan, current, {"BM", "BN", "BK"}))


@pytest.mark.parametrize("cfg", [{"BLOCK_M": 8, "BLOCK_N": 64, "BLOCK_K": 32}, {"BLOCK_M": 1, "BLOCK_N": 16,
                                                                                "BLOCK_K": 64}])
def test_the_gemv_branch_verifies_at_the_shapes_it_serves(cfg, verify):
    """gemm_relu on the interpreter: ci (M=32) takes the incumbent's launch, the ragged M=31 and 17 the GEMV form
    (the configuration's 1 row a program, and 8 to show the form holds for any rows; the ragged shapes' K and N are
    not multiples of the tile either)."""
    p = load_problem(GEMM_RELU)
    src = p.kernel_source
    out = gemv_branch(dispatch(src, "matmul_kernel", [Branch("M <= 31", cfg)]), src, "matmul_kernel", "M <= 31")
    assert f"matmul_kernel_gemv[(triton.cdiv(M, {cfg['BLOCK_M']}), triton.cdiv(N, {cfg['BLOCK_N']}))](" in out
    assert [s.kernel for s in parse_kernel(out).launches].count("matmul_kernel") == 1
    assert sorted(v.dims["M"] for v in p.correctness_variants("cpu", True)) == [17, 31, 32]  # both branches run
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()


def test_the_per_shape_tactic_proposes_it_for_a_one_row_class(tmp_path):
    """gemm_skinny_m on a stand-in H200: M = 1 (bench-gpu-1) is a class of its own beside M = 16; its GEMV
    candidates launch the copy in that branch only, one row a program, and gate 3 times them at every shape."""
    p = load_problem(SKINNY)
    ctx = tactic_context(p, kind="cuda", target="h200", cores=132)
    cands = [c for c in PER_SHAPE.propose(ctx) if c.params.get("gemv")]
    assert cands
    for c in cands:
        assert c.time_all_shapes and "(bench-gpu-1): the GEMV form" in c.description, c.description
        kernels = [s.kernel for s in parse_kernel(c.source).launches]
        assert kernels.count("skinny_matmul_kernel_gemv") == 1 and kernels.count("skinny_matmul_kernel") == 1
    assert {c.params["BLOCK_M"] for c in cands} == {1}


def test_a_class_of_more_rows_gets_no_gemv_form():
    """gemm_relu's decode shape has M = 16: one row a program would stream the weight 16 times (on the H100 the form
    lost at M = 8 already)."""
    assert GEMV_ROWS < 16
    ctx = tactic_context(load_problem(GEMM_RELU), kind="cuda", target="h200", cores=132)
    every = PER_SHAPE.propose(ctx)
    assert every and not [c for c in every if c.params.get("gemv")]
