"""The dtype stage's narrow-intermediate tactic: an fp32 buffer between Triton kernels stored in the inputs' dtype.

What the buffer is comes from the traces (allocation, the launches that got it, any torch op that read it); how each
kernel uses it from the kernel's code. Checked on the fusion stage's kb30 result (the GroupNorm kernel reads the
GEMM's fp32 output) and on files whose GEMM runs in a wrapper, an autograd.Function or a launcher method that
allocates the buffer and whose reader loads it without a cast (the cast is added), through the real verifier on the
CPU interpreter in fp16; and the reasons it gives where a buffer does not qualify. On the H200's KB entry the
persistent stage proposes on top of it, unless the port's own trial of it failed the correctness gate.
"""

from __future__ import annotations

import pytest

import stages
from stages.dtype import NarrowIntermediate
from tests.conftest import FIXTURES, ROOT, tactic_context
from xeforge import devices
from stages.base import Candidate, TacticRecord, TrialOutcome
from xeforge.pipeline import StageRecord, _incorrect_tactics, _kb_bases, kb_context
from xeforge.problem import load_problem
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.dtype_narrow import narrow_intermediates
from xeforge.rewrite.fusion.norm import group_norm_kernel
from xeforge.verifier import GateResult, Verdict

KB30 = ROOT / "kernels" / "kb30_gemm_groupnorm_hardtanh"
WRAPPER = FIXTURES / "narrow" / "wrapper.py"
FP32_Y = "y = torch.empty((M, N), device=x.device, dtype=torch.float32)"


def kb30_fused():
    """kb30 after the fusion stage's plain GroupNorm rewrite: the GEMM writes fp32 y, the GroupNorm kernel reads it."""
    p = load_problem(KB30)
    return p, group_norm_kernel(p.kernel_source, p)[0]


def test_kb30_gemm_output_read_by_the_group_norm_kernel_is_narrowed(verify):
    p, src = kb30_fused()
    assert FP32_Y in src
    new, desc = narrow_intermediates(src, p)
    assert "y = torch.empty((M, N), device=x.device, dtype=x.dtype)" in new and FP32_Y not in new
    assert "matmul_bias_kernel writes it, group_norm_kernel reads it" in desc and "instead of fp32" in desc
    assert new.count(".to(tl.float32)") == src.count(".to(tl.float32)")  # the reader already up-casts its loads
    verdict = verify(p, new)  # kb30's ci variant is fp32: there y stays fp32 (x.dtype); the wrapper test runs fp16
    assert verdict.correct, verdict.feedback()


@pytest.mark.parametrize("style,buffer", [("wrapper", "y"), ("autograd", "out"), ("launcher", "buf")])
def test_a_buffer_outside_forward_and_a_reader_without_a_cast(verify, style, buffer):
    """The allocation is in a wrapper, an autograd.Function's forward or a launcher's method (the x in scope there
    names the dtype); the reader (in the autograd file @triton.autotune'd, behind a META grid) gets the up-cast on
    its load, so it computes in fp32 as before."""
    p = load_problem(FIXTURES / "narrow" / f"{style}.py")
    src = p.kernel_source
    new, desc = narrow_intermediates(src, p)
    assert f"{buffer} = torch.empty((M, N), device=x.device, dtype=x.dtype)" in new
    assert "y = tl.load(y_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)" in new
    assert "1 load(s) of it up-cast to fp32 in the reader" in desc
    # the GEMM's own loads of a_ptr / w_ptr are left alone (they feed tl.dot in 16 bits)
    assert "a = tl.load(a_ptrs, mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)\n" in new
    verdict = verify(p, new)
    assert verdict.correct, verdict.feedback()
    if style != "wrapper":
        return
    tactic = NarrowIntermediate()
    ctx = tactic_context(p)
    assert tactic.check(ctx).applies and tactic.propose(ctx)[0].source == new
    assert "narrow-intermediate" in [t.name for t in next(s for s in stages.ALL if s.name == "dtype").tactics]


@pytest.mark.parametrize("edit,reason", [
    # a torch op reads the buffer: kb30's start, where torch's GroupNorm does
    (None, r"torch\.nn\.functional\.group_norm \(line 56\) reads it"),
    # forward returns it: a result, not an intermediate
    (("        return out\n", "        return y\n"), "no fp32 tensor allocated in the traced code is passed"),
    # the reader derives a dtype from it
    (("tl.maximum(y, 0.0) * 2.0 - 1.0,", "(tl.maximum(y, 0.0) * 2.0 - 1.0).to(y_ptr.dtype.element_ty),"),
     r"relu_affine uses y_ptr at line \d+ other than as the address of a tl.load or tl.store"),
    # the buffer's allocation names no fp32 dtype
    (("dtype=torch.float32)", "dtype=torch.float32 if x.dtype == torch.float32 else torch.float32)"),
     r"takes its dtype from torch\.float32 if"),
])
def test_reasons_name_the_construct(edit, reason):
    if edit is None:
        p = load_problem(KB30)
        src = p.kernel_source
    else:
        p = load_problem(WRAPPER)
        assert edit[0] in p.kernel_source
        src = p.kernel_source.replace(edit[0], edit[1])
    with pytest.raises(NotApplicable, match=reason):
        narrow_intermediates(src, p)


STORE = "    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))\n"


def test_the_writers_cast_to_its_pointer_type_before_the_store():
    """``c = acc.to(c_ptr.dtype.element_ty)`` and then ``tl.store(c_ptrs, c)`` is the store's own cast (a common
    style); the same value also stored elsewhere is not, and says where."""
    p = load_problem(WRAPPER)
    assert STORE in p.kernel_source
    split = p.kernel_source.replace(STORE, "    c = acc.to(c_ptr.dtype.element_ty)\n"
                                    "    tl.store(c_ptrs, c, mask=(rm[:, None] < M) & (rn[None, :] < N))\n")
    new, _ = narrow_intermediates(split, p)
    assert "y = torch.empty((M, N), device=x.device, dtype=x.dtype)" in new
    reused = split.replace("    tl.store(c_ptrs, c, mask=(rm[:, None] < M) & (rn[None, :] < N))\n",
                           "    tl.store(c_ptrs, c, mask=(rm[:, None] < M) & (rn[None, :] < N))\n"
                           "    tl.store(a_ptr + rm, tl.sum(c, axis=1), mask=rm < 0)\n")
    with pytest.raises(NotApplicable, match=r"matmul_bias uses c_ptr at line \d+ other than as the address"):
        narrow_intermediates(reused, p)


def test_a_buffer_fp32_only_where_the_inputs_are_is_left_alone():
    """``dtype=x.dtype`` is fp32 at an fp32 variant: not an fp32 intermediate (gemm_relu's GEMM output)."""
    p = load_problem(ROOT / "kernels" / "gemm_relu")
    with pytest.raises(NotApplicable, match="no fp32 tensor allocated in the traced code is passed"):
        narrow_intermediates(p.kernel_source, p)


def test_a_result_that_takes_the_buffers_dtype_keeps_it_fp32():
    """``out = torch.empty_like(y)`` makes forward's result fp32 (it follows y): nothing to narrow to. (An
    allocation that takes y's dtype and is not the result is pinned to fp32: kb75's partials,
    tests/test_tactic_fusion.py.)"""
    p = load_problem(WRAPPER)
    src = p.kernel_source.replace("out = torch.empty(y.shape, device=y.device, dtype=x.dtype)",
                                  "out = torch.empty_like(y)")
    assert "torch.empty_like(y)" in src
    with pytest.raises(NotApplicable, match="forward's result is fp32 in every variant"):
        narrow_intermediates(src, p)


def test_the_persistent_stage_proposes_on_top_of_it_on_the_h200():
    """KB ``dtype-narrow-intermediate-with-descriptor-stores-on-hopper``: on the H200's entry the narrowed kb30
    is a basis of the persistent stage; elsewhere (the interpreter's entry) it is not."""
    p, src = kb30_fused()
    persistent = next(s for s in stages.ALL if s.name == "persistent")
    h200 = devices.DeviceInfo("cuda", "NVIDIA H200", cores=132)
    ctx = tactic_context(p, source=src, kind="cuda", target="h200", cores=132)
    bases = _kb_bases(persistent, ctx, kb_context(h200), {"dtype", "fusion", "persistent"})
    narrowed = [(s, what) for s, what in bases if "narrow-intermediate" in what]
    assert len(narrowed) == 1
    assert "dtype-narrow-intermediate-with-descriptor-stores-on-hopper" in narrowed[0][1]
    assert "y = torch.empty((M, N), device=x.device, dtype=x.dtype)" in narrowed[0][0]
    assert not [w for _, w in _kb_bases(persistent, ctx, kb_context(h200), {"fusion", "persistent"})
                if "narrow-intermediate" in w]  # --stages without dtype: not this port's rewrite
    cpu = tactic_context(p, source=src)
    assert not _kb_bases(persistent, cpu, kb_context(devices.describe("cpu")), None)


def test_no_basis_where_the_tactic_failed_the_correctness_gate():
    """kb94 on the H200: its bf16 GEMM output before a GroupNorm failed gate 2 at the dtype stage's trial and under
    all six persistent candidates built on it. A tactic whose trial failed gate 2 in this port is no basis."""
    p, src = kb30_fused()
    persistent = next(s for s in stages.ALL if s.name == "persistent")
    h200 = devices.DeviceInfo("cuda", "NVIDIA H200", cores=132)
    ctx = tactic_context(p, source=src, kind="cuda", target="h200", cores=132)
    rejected = Verdict("x", [GateResult("0-isolation", "pass", ""), GateResult("2-correctness", "fail", "outside")],
                       correct=False)
    slower = Verdict("y", [GateResult("2-correctness", "pass", ""), GateResult("3-performance", "fail", "")],
                     correct=True)
    rec = StageRecord("dtype", 2, "", tactics=[
        TacticRecord("narrow-intermediate", True, "", outcomes=[
            TrialOutcome("0005-dtype-narrow-intermediate", Candidate("", "narrow-intermediate", ""), rejected)]),
        TacticRecord("drop-upcast-before-dot", True, "", outcomes=[
            TrialOutcome("0001-dtype-drop-upcast-before-dot", Candidate("", "drop-upcast-before-dot", ""), slower)])])
    incorrect = _incorrect_tactics([rec])
    assert incorrect == {"narrow-intermediate": "0005-dtype-narrow-intermediate"}
    notes: list[str] = []
    bases = _kb_bases(persistent, ctx, kb_context(h200), None, incorrect, notes)
    assert not [w for _, w in bases if "narrow-intermediate" in w]
    assert notes and "0005-dtype-narrow-intermediate failed the correctness gate" in notes[0]
