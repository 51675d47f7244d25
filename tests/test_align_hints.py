"""Divisibility hints (issue 34, alignment at odd shapes; xeforge/rewrite/align_hints.py and the memory_access
stage's ``divisibility-hints`` tactic): which arguments get one, that the hinted kernel is correct at every shape,
and that the compiler uses it (compiled for sm_90 on the host, no GPU needed)."""

from __future__ import annotations

import collections
import re
from types import SimpleNamespace

import pytest

from stages.memory_access import STAGE
from tests.conftest import ROOT, load_kernel_module, sm90_compiler, tactic_context
from xeforge.problem import load_problem
from xeforge.rewrite import NotApplicable, align_hints

GEMM_SQUARE = ROOT / "kernels" / "gemm_square"
GEMM_TALL_K = ROOT / "kernels" / "gemm_tall_k"
TACTIC = next(t for t in STAGE.tactics if t.name == "divisibility-hints")


def _hinted(p):
    plans = align_hints.plan(p.kernel_source, align_hints.findings(p))
    assert len(plans) == 1
    return plans[0], align_hints.apply(p.kernel_source, plans[0])


def test_the_arguments_that_lose_the_hint_at_the_odd_shape_get_one_passed_per_call():
    p = load_problem(GEMM_SQUARE)
    plan, src = _hinted(p)
    # bench-gpu-2 is 3000 x 4096 x 3000: N and M bound masks, stride_bk and stride_cm stride b and c
    assert plan.args == {"M": "M", "N": "N", "stride_bk": "b.stride(0)", "stride_cm": "c.stride(0)"}
    assert "stride_bk=3000 at bench-gpu-2" in plan.describe()
    assert "if HINT_stride_bk > 1:\n        stride_bk = (stride_bk // HINT_stride_bk) * HINT_stride_bk" in src
    assert "HINT_stride_bk=_xeforge_pow2(b.stride(0))" in src and "HINT_stride_bk: tl.constexpr" in src
    ns: dict = {}
    exec(align_hints.HELPER_CODE, ns)  # the helper as the candidate defines it
    assert [ns[align_hints.HELPER](v) for v in (3000, 4096, 17, 1, 0, 24)] == [8, 16, 1, 1, 1, 8]
    app = TACTIC.check(tactic_context(p))
    assert app.applies and "divisibility hints for M, N, stride_bk, stride_cm" in app.reason


def test_a_users_own_hint_on_an_argument_is_named_as_doing_nothing():
    """``stride_bk = tl.multiple_of(stride_bk, 8)`` in the kernel, as user kernels write it: the compiler drops a hint
    on an argument, so the plan says so and passes its own per call."""
    p = load_problem(GEMM_SQUARE)
    src = p.kernel_source.replace("    pid = tl.program_id(0)\n",
                                  "    stride_bk = tl.multiple_of(stride_bk, 8)\n    pid = tl.program_id(0)\n", 1)
    assert src != p.kernel_source
    (plan,) = align_hints.plan(src, align_hints.findings(p, src))
    line = src[:src.index("tl.multiple_of(stride_bk")].count("\n") + 1
    assert plan.dropped == [f"tl.multiple_of(stride_bk, 8) (line {line})"]
    assert f"its own tl.multiple_of(stride_bk, 8) (line {line}) does nothing" in plan.describe()
    assert align_hints.plan(p.kernel_source, align_hints.findings(p))[0].dropped == []


def test_the_hinted_kernel_is_correct_at_every_shape(verify):
    """The hint is computed from each call's values, so it holds at the ragged shapes too (M = 17: 1, no hint)."""
    p = load_problem(GEMM_SQUARE)
    verdict = verify(p, _hinted(p)[1])
    assert verdict.correct, verdict.feedback()


def test_nothing_to_hint_is_said_with_the_reason(tmp_path):
    with pytest.raises(NotApplicable, match="Triton's own divisibility hint covers them"):
        align_hints.plan("", [])
    odd = {"shape": "bench-gpu-2", "kernel": "matmul_kernel", "arg": "N", "value": 32003,
           "role": "a bound of its masks", "aligned_at": {"bench-gpu": 4096}}
    with pytest.raises(NotApplicable, match="N = 32003 at bench-gpu-2 is odd"):
        align_hints.plan(GEMM_SQUARE.joinpath("kernel.py").read_text(), [odd])
    app = TACTIC.check(tactic_context(load_problem(ROOT / "kernels" / "vector_add")))  # every size a multiple of 16
    assert not app.applies and "Triton's own divisibility hint covers them" in app.reason



SPLIT_LSE = """
import triton
import triton.language as tl


@triton.jit
def merge(part_ptr, lse_ptr, out_ptr, n_splits, stride_ph, stride_lh, BLOCK_D: tl.constexpr):
    h = tl.program_id(0)
    d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s in range(0, n_splits):
        w = tl.exp(tl.load(lse_ptr + h * stride_lh + s))
        acc += w * tl.load(part_ptr + h * stride_ph + s * BLOCK_D + d)
    tl.store(out_ptr + h * BLOCK_D + d, acc)
"""


def test_an_argument_whose_alignment_nothing_reads_is_named_for_what_it_is():
    """A split-KV merge's log-sum-exp stride offsets one scalar load, and its split count only counts the loop: losing
    the hint at an odd split count costs neither anything, and the report and the tactic say so."""
    from xeforge.analysis.alignment import LOOP_ROLE, SCALAR_ROLE, describe
    from xeforge.kernel_model import parse_kernel

    roles = align_hints.argument_roles(parse_kernel(SPLIT_LSE))
    assert roles[("merge", "stride_lh")] == SCALAR_ROLE and roles[("merge", "n_splits")] == LOOP_ROLE
    assert roles[("merge", "stride_ph")].startswith("a stride of part_ptr")  # it places a vector load
    found = [{"shape": "bench-gpu", "kernel": "merge", "arg": a, "value": 6, "role": roles[("merge", a)],
              "aligned_at": {"bench-gpu-1": 32}} for a in ("stride_lh", "n_splits")]
    assert all("but nothing is lost" in describe(f) for f in found)
    with pytest.raises(NotApplicable, match="stride_lh is an offset of scalar loads and stores only: no vector"):
        align_hints.plan(SPLIT_LSE, found)

#: gemm_square's integer and pointer arguments that stay multiples of 16 at 3000 x 4096 x 3000 (M, N, stride_bk and
#: stride_cm = 3000 do not)
ODD_ALIGNED = ("a_ptr", "b_ptr", "c_ptr", "K", "stride_am")


def _compile_sm90(fn, aligned: tuple[str, ...], extra: dict | None = None):
    """``fn`` compiled for sm_90 as Triton's JIT specializes it where ``aligned`` are multiples of 16."""
    import triton

    GPUTarget, ASTSource = sm90_compiler()
    consts = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_SIZE_M": 8, "stride_ak": 1, "stride_bn": 1,
              "stride_cn": 1, **(extra or {})}
    consts = {k: v for k, v in consts.items() if k in fn.arg_names}
    sig = {a: "constexpr" if a in consts else ("*bf16" if a.endswith("_ptr") else "i32") for a in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})


def test_the_lost_alignment_is_diagnosed_at_the_odd_shape_only(tmp_path):
    """The compiler facts of the odd shape's compile (as the worker captures them) carry the scalar 16-bit accesses,
    and the knowledge base's diagnosis names them and the divisibility-hints tactic; the aligned shape's do not."""
    import triton

    from xeforge.diagnosis.capture import dump_compiled
    from xeforge.diagnosis.rules import Diagnoser, by_shape, findings_of
    from xeforge.kb import TritonInfo, load_kb

    sm90_compiler()
    fn = load_kernel_module(tmp_path / "k.py", load_problem(GEMM_SQUARE).kernel_source, "xeforge_dx_odd").matmul_kernel
    kb = load_kb()
    h200 = SimpleNamespace(kind="cuda", name="NVIDIA H200", cores=132, interpreter=False)
    dx = Diagnoser(kb, kb.devices["h200"], TritonInfo.parse(triton.__version__, is_xpu=False), h200)
    reads = []
    for shape, aligned in (("bench-gpu", ODD_ALIGNED + ("M", "N", "stride_bk", "stride_cm")),
                           ("bench-gpu-odd", ODD_ALIGNED)):
        dump_compiled("matmul_kernel", _compile_sm90(fn, aligned), tmp_path / shape, triton.__version__, irs=["ptx"])
        reads.append((shape, dx.read(tmp_path / shape)))
    assert "access.scalar16" not in reads[0][1]["kernels"][0]["facts"]
    assert reads[1][1]["kernels"][0]["facts"]["access.scalar16"] > 8
    found = [f for f in findings_of(by_shape(reads)) if f.id == "dx-cuda-scalar-16bit-access"]
    assert len(found) == 1 and found[0].shape == "bench-gpu-odd", found
    assert found[0].stage == "memory_access" and found[0].tactics == ["divisibility-hints"]


def test_the_compiler_vectorizes_the_odd_shape_once_hinted(tmp_path):
    """sm_90 code for gemm_square's kernel at 3000 x 4096 x 3000 bf16: without hints the B tile is loaded with scalar
    ``ld.global.b16`` and C stored with scalar ``st.global.b16``; with the hints (8 for each of M, N, stride_bk,
    stride_cm) both are as at an aligned shape: 16-byte ``cp.async`` and ``st.global.v4``."""
    sm90_compiler()
    p = load_problem(GEMM_SQUARE)
    _, hinted = _hinted(p)

    def kernel(src: str, tag: str):
        return load_kernel_module(tmp_path / f"k_{tag}.py", src, f"xeforge_hint_{tag}").matmul_kernel

    def ops(fn, extra: dict, aligned: tuple[str, ...]) -> collections.Counter:
        # Triton's own specialization at that shape: the unit strides are constants, what is a multiple of 16 says so
        ptx = _compile_sm90(fn, aligned, extra).asm["ptx"]
        return collections.Counter(re.findall(r"\b((?:ld|st)\.global[.\w]*|cp\.async\.cg[.\w]*)", ptx))

    odd = ODD_ALIGNED
    square = ops(kernel(p.kernel_source, "o"), {}, odd + ("M", "N", "stride_bk", "stride_cm"))
    before = ops(kernel(p.kernel_source, "b"), {}, odd)
    after = ops(kernel(hinted, "h"), {f"HINT_{a}": 8 for a in ("M", "N", "stride_bk", "stride_cm")}, odd)
    assert before["ld.global.b16"] > 0 and before["st.global.b16"] > 0, before
    assert after["ld.global.b16"] == 0 and after["st.global.b16"] == 0, after
    assert after["cp.async.cg.shared.global"] == square["cp.async.cg.shared.global"] > 0
    assert after["st.global.v4.b32"] == square["st.global.v4.b32"] > 0


def test_a_block_pointer_kernels_strides_and_shape_get_hints_that_the_compiler_uses(tmp_path, verify):
    """gemm_tall_k's kernel reads its tensors through block pointers. At 1000 x 65536 x 1000 (bench-gpu-2) the
    analysis did not read their strides and shapes, so the tactic did not apply, and the H200 port of 2026-12-06
    ran that shape at 0.29x of torch.compile. The block pointers' strides now stride their tensors and their shapes
    bound their checks: sm_90 code at that shape goes from scalar 16-bit loads and stores to vector ones, and the
    hinted kernel is correct at every shape."""
    p = load_problem(GEMM_TALL_K)
    plan, hinted = _hinted(p)
    assert plan.args == {"M": "M", "N": "N", "stride_bk": "b.stride(0)", "stride_cm": "c.stride(0)"}
    assert TACTIC.check(tactic_context(p)).applies

    def ops(src: str, tag: str, extra: dict) -> collections.Counter:
        fn = load_kernel_module(tmp_path / f"t_{tag}.py", src, f"xeforge_tall_{tag}").matmul_kernel
        ptx = _compile_sm90(fn, ODD_ALIGNED, extra).asm["ptx"]
        return collections.Counter(re.findall(r"\b((?:ld|st)\.global[.\w]*|cp\.async\.cg[.\w]*)", ptx))

    before = ops(p.kernel_source, "b", {})
    after = ops(hinted, "h", {f"HINT_{a}": 8 for a in plan.args})
    assert before["ld.global.b16"] + before["st.global.b16"] > 0, before
    assert after["ld.global.b16"] + after["st.global.b16"] == 0, after
    verdict = verify(p, hinted)
    assert verdict.correct, verdict.feedback()


def test_the_later_stages_read_through_the_hints():
    """``x = (x // H) * H`` is the value itself: block I/O, the persistent tile loop and autotuning still read the
    hinted kernel's strides and bounds as its arguments."""
    from stages.autotuning import STAGE as AUTOTUNING
    from xeforge.rewrite import blockio, persistent

    p = load_problem(GEMM_SQUARE)
    _, src = _hinted(p)
    assert "USE_BLOCK_IO" in blockio.rewrite(src)[0]
    assert "_device_core_count(" in persistent.rewrite(src)[0]
    app = AUTOTUNING.tactics[0].check(tactic_context(p, src, kind="cuda", target="h200", cores=132))
    assert app.applies, app.reason
