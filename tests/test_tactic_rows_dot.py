"""Rows on the matrix unit (issue 34: gemv_decode at B = 8 stayed at 0.53-0.61x of cuBLAS with copies serving 8 rows
a program, their sums on the CUDA cores): a GEMV written one row a program becomes a GEMM over 16 rows a program,
its ``tl.sum(w * x[None, :], axis=1)`` a ``tl.dot``. On the interpreter, in fp32 (the interpreter's 16-bit
``tl.dot`` is not numpy's: bf16 products come out as garbage there, so the 16-bit path is the GPU's to verify): the
rewrite's shape, the up-casts dropped only in pairs, its refusals with the reason, dispatches verified against the
reference at the ci shape and the ragged ones (B = 3, rows past the end masked), every row count in a fresh
interpreter, and the per-shape tactic proposing it first for gemv_decode's B = 8 class."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from stages.device_tuning import STAGE
from tests.conftest import ROOT, tactic_context
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.device_tuning.rows_dot import ROWS, dot_branch, dot_rows
from xeforge.rewrite.tiling.dispatch import Branch, dispatch

GEMV = ROOT / "kernels" / "gemv_decode"
GEMM_RELU = ROOT / "kernels" / "gemm_relu"
PER_SHAPE = next(t for t in STAGE.tactics if t.name == "per-shape-config")

#: a GEMV with a bias and a scale read per column, its operands' up-casts at their loads, x's row pointer moved first
KERNEL = '''
import torch
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, w_ptr, b_ptr, y_ptr, N, K, sx, sw, sy, scale, BN: tl.constexpr, BK: tl.constexpr):
    n0 = tl.program_id(0)
    r = tl.program_id(1)
    offs_n = n0 * BN + tl.arange(0, BN)
    x_row = x_ptr + r * sx
    acc = tl.zeros((BN,), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        x = tl.load(x_row + kk, mask=kk < K, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs_n[:, None] * sw + kk[None, :], mask=(offs_n[:, None] < N) & (kk[None, :] < K),
                    other=0.0).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)
    bias = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0)
    out = tl.maximum(acc * scale + bias, 0.0)
    tl.store(y_ptr + r * sy + offs_n, out, mask=offs_n < N)


class Model(torch.nn.Module):
    def forward(self, x, w, b):
        B, K = x.shape
        N = w.shape[0]
        y = torch.empty((B, N), device=x.device, dtype=torch.float32)
        k[(triton.cdiv(N, 16), B)](x, w, b, y, N, K, x.stride(0), w.stride(0), y.stride(0), 0.5, BN=16, BK=32)
        return y
'''

CHECK = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("m", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
torch.manual_seed(0)
for B, K, N in [(1, 40, 20), (3, 33, 17), (8, 64, 32), (16, 31, 16), (17, 70, 40)]:
    x, w, b = torch.randn(B, K), torch.randn(N, K), torch.randn(N)
    torch.testing.assert_close(m.Model()(x, w, b), torch.relu((x @ w.T) * 0.5 + b), rtol=1e-4, atol=1e-4)
print("ok")
"""


def test_the_rows_become_the_dot_s_m_side_and_the_pair_of_up_casts_is_dropped():
    out, plan = dot_rows(KERNEL, "k", 1)
    body = out.split("def k(", 1)[1].split("\nclass ", 1)[0]
    assert f"r = tl.program_id(1) * {ROWS} + tl.arange(0, {ROWS})[:, None]" in body
    assert "row_ok = r < N_ROWS" in body and f"acc = tl.zeros(({ROWS}, BN), dtype=tl.float32)" in body
    assert 'acc += tl.dot(x, tl.trans(w).to(x.dtype), input_precision="ieee" if x.dtype == tl.float32 else None)' \
        in body and "tl.sum" not in body
    assert "x = tl.load(x_row + kk, mask=(kk < K) & row_ok, other=0.0)\n" in body  # masked, no up-cast
    assert ".to(tl.float32)" not in body
    assert "tl.store(y_ptr + r * sy + offs_n, out, mask=(offs_n < N) & row_ok)" in body
    assert "bias = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0)" in body  # shared: no row mask
    assert plan.dropped == ("x", "w") and (plan.acc, plan.x, plan.w) == ("acc", "x", "w")


def test_one_up_cast_alone_is_kept_with_its_partner():
    """x read again after the sum keeps its up-cast, so w keeps its too: tl.dot takes one dtype."""
    src = KERNEL.replace("    bias = tl.load(", "    last = x\n    bias = tl.load(")
    out, plan = dot_rows(src, "k", 1)
    assert plan.dropped == () and out.count(".to(tl.float32)") == 2
    assert 'acc += tl.dot(x, tl.trans(w), input_precision="ieee" if x.dtype == tl.float32 else None)' in out


@pytest.mark.parametrize("change, says", [
    (("acc += tl.sum(w * x[None, :], axis=1)", "acc += tl.sum(w * x[None, :], axis=1)\n        first = x[0]"),
     "indexed"),
    (("acc += tl.sum(w * x[None, :], axis=1)", "acc += tl.sum(w * x[None, :], axis=1)\n        acc += 1.0"),
     "assigned by more than"),
    (("    bias = tl.load(", "    top = tl.max(acc, axis=0)\n    bias = tl.load("), "reduces"),
    (("    out = tl.maximum(acc * scale + bias, 0.0)", "    out = tl.maximum(acc * scale + bias, 0.0) + "
                                                        "tl.sum(w, axis=0)"), "reduces"),
    (("acc += tl.sum(w * x[None, :], axis=1)", "acc += tl.sum(w * x[None, :], axis=0)"), "0 statement"),
    (("    acc = tl.zeros((BN,), dtype=tl.float32)", "    acc = tl.full((BN,), 1.0, tl.float32)"), "tl.zeros"),
    (("    out = tl.maximum(acc * scale + bias, 0.0)", "    out = tl.maximum(acc * scale + bias, 0.0) + w"), "2-D"),
])
def test_what_would_change_meaning_is_refused_with_the_reason(change, says):
    with pytest.raises(NotApplicable, match=says):
        dot_rows(KERNEL.replace(*change), "k", 1)


def test_every_row_count_on_the_interpreter(tmp_path):
    src = dot_branch(dispatch(KERNEL, "k", [Branch("B > 1", {})]), KERNEL, "k", "B > 1", 1)
    assert f"k_dotrows[(triton.cdiv(N, 16), triton.cdiv(B, {ROWS}))](" in src and "N_ROWS=B" in src
    (tmp_path / "kernel.py").write_text(src)
    (tmp_path / "check.py").write_text(CHECK)
    done = subprocess.run([sys.executable, str(tmp_path / "check.py"), str(tmp_path / "kernel.py")],
                          env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


def test_the_dot_branch_verifies_at_the_shapes_it_serves(verify):
    """gemv_decode through the real verifier: ci (B = 1) takes the kernel, the ragged B = 3 (K = 129, N = 33) the
    copy, 13 of its 16 rows masked."""
    p = load_problem(GEMV)
    src = p.kernel_source
    out = dot_branch(dispatch(src, "gemv_kernel", [Branch("B > 2", {"BLOCK_N": 16, "BLOCK_K": 32})]), src,
                     "gemv_kernel", "B > 2", 1)
    kernels = [s.kernel for s in parse_kernel(out).launches]
    assert kernels.count("gemv_kernel_dotrows") == 1 and kernels.count("gemv_kernel") == 1
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()


def test_the_per_shape_tactic_proposes_it_first_for_a_class_of_more_rows():
    """gemv_decode on a stand-in H200: the class B > 2 gets the dot copy first, with the KB's tiles for few rows
    (16 x 64 x 256 and 16 x 32 x 256, 4 warps, 5 stages, by role onto BLOCK_N and BLOCK_K), then the row copies, then
    the class's configurations. gemm_relu (a GEMM already) gets none."""
    ctx = tactic_context(load_problem(GEMV), kind="cuda", target="h200", cores=132)
    cands = [c for c in PER_SHAPE.propose(ctx) if "(bench-gpu-1)" in c.description]  # the odd 4000 x 4000's take turns
    kinds = ["dot" if c.params.get("dot_rows") else "rows" if c.params.get("shared_rows") else "other" for c in cands]
    assert kinds[:4] == ["dot", "dot", "rows", "rows"] and "dot" not in kinds[4:]
    assert [(c.params["BLOCK_N"], c.params["BLOCK_K"], c.params["num_stages"]) for c in cands[:2]] == \
        [(64, 256, 5), (32, 256, 5)]
    assert all(c.time_all_shapes and re.search(r"if B > 2 \(bench-gpu-1\): gemv_kernel_dotrows", c.description)
               for c in cands[:2])
    ctx = tactic_context(load_problem(GEMM_RELU), kind="cuda", target="h200", cores=132)
    assert not [c for c in PER_SHAPE.propose(ctx) if c.params.get("dot_rows")]


def test_sm90_code_takes_the_matrix_unit_at_16_bits_and_stays_exact_at_fp32(tmp_path):
    """gemv_decode's copy compiled for sm_90 on this host: with bf16 operands the product is a tensor-core mma, with
    fp32 ones fused multiply-adds (ieee, no tf32)."""
    import triton

    from tests.conftest import load_kernel_module, sm90_compiler

    GPUTarget, ASTSource = sm90_compiler()
    out, _ = dot_rows(load_problem(GEMV).kernel_source, "gemv_kernel", 1)
    fn = load_kernel_module(tmp_path / "dot_sm90.py", out, "xeforge_test_dot_sm90").gemv_kernel
    consts = {"BLOCK_N": 64, "BLOCK_K": 256}
    const_idx = {(fn.arg_names.index(k),): v for k, v in consts.items()}

    def ptx(dtype: str) -> str:
        sig = {a: "constexpr" if a in consts else (f"*{dtype}" if a.endswith("_ptr") else "i32") for a in fn.arg_names}
        return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const_idx), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4, "num_stages": 5}).asm["ptx"]

    half, single = ptx("bf16"), ptx("fp32")
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in half
    assert not re.search(r"\bmma\.", single) and "fma.rn.f32" in single
