"""The memory_access stage's detectors and int64 tactic on the CPU interpreter, through the real verifier.

Fixtures whose bench variants are too large for int32 offsets (3 * 2**30 elements; M = 2**20 rows of 4096)
are flagged from their spec dims alone (``forward`` evaluated statically, parameter shapes from the reference
built on the meta device); the int64 cast of the program ids passes ``Verifier.verify`` on the tiny ci shapes,
survives the persistent rewrite, and is not proposed twice. The uncoalesced detector names the ``W^T``
operand of the naive ports; kernels whose offsets fit are left alone with the reason.
"""

from __future__ import annotations

import pytest

from stages import memory_access as stage
from stages.base import StageContext
from tests.conftest import FIXTURES, ROOT
from xeforge.devices import describe
from xeforge.pipeline import kb_context
from xeforge.problem import load_problem
from xeforge.rewrite import blockio, memory, persistent
from xeforge.kernel_model import parse_kernel
from xeforge.settings import Settings

KERNELS = ROOT / "kernels"
HERE = FIXTURES / "tactics" / "memory_access"
TACTIC = stage.Int64Offsets()



def context(p, source: str | None = None):
    kbc = kb_context(describe("cpu"))
    src = p.kernel_source if source is None else source
    return StageContext(p, src, p.kernel_source, describe("cpu"), kbc.device_id, kbc.kb, kbc.triton, Settings())


@pytest.mark.parametrize("folder,base,offset", [("big_vadd", "x_ptr", 3 * 2**30 - 1),
                                                ("huge_m_gemm", "a_ptr", 2**20 * 4096 - 1)])
def test_overflow_at_the_largest_variant_is_cast_to_int64(verify, folder, base, offset):
    p = load_problem(HERE / folder)
    ctx = context(p)
    issues = [i for i in stage.STAGE.detect(ctx) if i.code == "int32-overflow"]
    assert any(base in i.message and f"{offset:,}" in i.message and "bench-gpu" in i.message for i in issues), \
        [i.render() for i in issues]
    app = TACTIC.check(ctx)
    assert app.applies, app.reason
    cand = TACTIC.propose(ctx)[0]
    assert "tl.program_id(0).to(tl.int64)" in cand.source and "tl.program_id(0)\n" not in cand.source
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()
    # done once: the cast kernel is no longer flagged
    after = context(p, cand.source)
    assert not [i for i in stage.STAGE.detect(after) if i.code == "int32-overflow"]
    assert not TACTIC.check(after).applies


def test_the_cast_survives_block_io_and_the_persistent_rewrite(verify):
    p = load_problem(HERE / "huge_m_gemm")
    cast = memory.int64_program_ids(p.kernel_source, "matmul_kernel")
    # descriptor coordinates must be int32: the ones computed from the int64 program ids are narrowed
    desc, _ = blockio.rewrite(cast)
    assert "a_desc.load([(pid_m * BLOCK_M).to(tl.int32), k0])" in desc
    out, _ = persistent.rewrite(desc)
    assert "tl.range(tl.program_id(0).to(tl.int64), num_tiles, tl.num_programs(0))" in out
    for source in (desc, out):
        verdict = verify(p, source)
        assert verdict.correct, verdict.feedback()


def test_kernel_arguments_come_from_the_trace_and_the_static_reading_agrees():
    p = load_problem(KERNELS / "kb09_matmul_subtract_multiply_relu")
    model = parse_kernel(p.kernel_source)
    site = next(s for s in model.launches if s.kernel == "matmul_bias_kernel")
    traced, grid = memory.launch_facts(model, site, p, p.variant("bench-gpu"))
    static, _ = memory.launch_values(model, site, p, p.variant("bench-gpu"))  # host code the meta device can't run
    for values in (traced, static):
        assert (values["M"], values["N"], values["K"]) == (1024, 8192, 8192)
        assert values["stride_wn"] == 8192 and values["stride_wk"] == 1  # weight shape from the meta-device Model
        assert values["w_ptr"].shape == (8192, 8192) and values["c_ptr"].shape == (1024, 8192)
    assert grid and all(isinstance(g, int) and g > 0 for g in grid)


def test_uncoalesced_weight_operand_is_reported():
    p = load_problem(KERNELS / "gemm_relu")
    issues = [i for i in stage.STAGE.detect(context(p)) if i.code == "uncoalesced"]
    assert len(issues) == 1 and "b_ptr" in issues[0].message and "w.stride(0)" in issues[0].message
    assert issues[0].line == 22


@pytest.mark.parametrize("folder", [KERNELS / "gemm_relu", KERNELS / "vector_add"], ids=["gemm_relu", "vector_add"])
def test_kernels_whose_offsets_fit_are_left_alone(folder):
    p = load_problem(folder)
    ctx = context(p)
    app = TACTIC.check(ctx)
    assert not app.applies and "no access can reach 2**31" in app.reason, app.reason
    assert TACTIC.propose(ctx) == []
