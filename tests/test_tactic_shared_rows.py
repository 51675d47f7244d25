"""Rows that share loads (issue 34: gemv_decode at B = 8 ran 0.25x of cuBLAS on an H100, each row's program
streaming the weight again): one program serves R rows of a grid axis, each row's statements written R times and
what does not depend on the row loaded once. On the interpreter: the rewrite's shape, a load taken out of a copied
statement, a parameter the rows change, its refusals with the reason, dispatches verified against the reference
at the ci shape and the ragged ones (B = 3 under a 4- and an 8-row copy: rows past the end masked), and that the
per-shape tactic proposes it on a stand-in H200 for gemv_decode's B = 8 class only."""

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
from xeforge.rewrite.device_tuning.shared_rows import fit_config, plain_axis, rows_branch, share_rows
from xeforge.rewrite.tiling.dispatch import Branch, dispatch

GEMV = ROOT / "kernels" / "gemv_decode"
GEMM_RELU = ROOT / "kernels" / "gemm_relu"
PER_SHAPE = next(t for t in STAGE.tactics if t.name == "per-shape-config")

#: a GEMV whose weight load sits inside the accumulation, and whose x pointer is a parameter moved per row
INLINE = '''
import torch
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, w_ptr, y_ptr, N, K, sx, sw, sy, BN: tl.constexpr, BK: tl.constexpr):
    """doc"""
    n0 = tl.program_id(0)
    r = tl.program_id(1)
    offs_n = n0 * BN + tl.arange(0, BN)
    x_ptr += r * sx
    acc = tl.zeros((BN,), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        acc += tl.sum(tl.load(w_ptr + offs_n[:, None] * sw + kk[None, :],
                              mask=(offs_n[:, None] < N) & (kk[None, :] < K), other=0.0)
                      * tl.load(x_ptr + kk, mask=kk < K, other=0.0)[None, :], axis=1)
    tl.store(y_ptr + r * sy + offs_n, acc, mask=offs_n < N)


class Model(torch.nn.Module):
    def forward(self, x, w):
        B, K = x.shape
        N = w.shape[0]
        y = torch.empty((B, N), device=x.device, dtype=torch.float32)
        k[(triton.cdiv(N, 16), B)](x, w, y, N, K, x.stride(0), w.stride(0), y.stride(0), BN=16, BK=32)
        return y
'''


#: runs a kernel file's Model on the interpreter against x @ w.T at several row counts (a fresh process: the
#: interpreter is chosen when triton is imported)
CHECK = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("m", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
torch.manual_seed(0)
for B, K, N in [(1, 40, 20), (3, 33, 17), (8, 64, 32), (9, 31, 16)]:
    x, w = torch.randn(B, K), torch.randn(N, K)
    torch.testing.assert_close(m.Model()(x, w), x @ w.T, rtol=1e-4, atol=1e-4)
print("ok")
"""


def test_each_rows_statements_are_written_per_row_and_the_weight_is_loaded_once():
    src = load_problem(GEMV).kernel_source
    out, plan = share_rows(src, "gemv_kernel", 1, 4)
    body = out.split("def gemv_kernel", 1)[1].split("\nclass ", 1)[0]
    assert body.count("w_ptr + offs_n") == 1  # the weight's tile: shared
    for i in range(4):
        assert f"row_r{i} = tl.program_id(1) * 4 + {i}" in body and f"row_ok_r{i} = row_r{i} < N_ROWS" in body
        assert f"acc_r{i} += tl.sum(w * x_r{i}[None, :], axis=1)" in body
        assert re.search(rf"tl\.store\(y_ptr \+ row_r{i} \* stride_yb.*mask=\(offs_n < N\) & row_ok_r{i}\)", body)
        assert re.search(rf"x_r{i} = tl\.load\(x_ptr \+ row_r{i} \* stride_xb.*mask=\(k < K\) & row_ok_r{i}", body)
    assert "N_ROWS," in body.split("):", 1)[0]  # a runtime parameter before the constexprs
    assert plan.shared_loads == 1 and plan.copied == 4 and set(plan.names) == {"row", "x", "acc"}


def test_a_load_inside_a_copied_statement_is_taken_out_and_a_moved_parameter_starts_from_the_argument():
    out, plan = share_rows(INLINE, "k", 1, 2)
    body = out.split("def k", 1)[1].split("\nclass ", 1)[0]
    assert body.count("tl.load(w_ptr") == 1 and "shared = tl.load(w_ptr" in body
    assert body.count("tl.load(x_ptr") == 2  # each row's x
    assert 'x_ptr_r0 = x_ptr\n    x_ptr_r1 = x_ptr' in body and body.index('"""doc"""') < body.index("x_ptr_r0 =")
    assert "x_ptr_r1 += r_r1 * sx" in body
    assert plan.shared_loads == 1


@pytest.mark.parametrize("rows", [2, 4, 8])
def test_the_copy_computes_every_row_count_on_the_interpreter(rows, tmp_path):
    src = rows_branch(dispatch(INLINE, "k", [Branch("B > 1", {})]), INLINE, "k", "B > 1", 1, rows)
    assert f"k_rows{rows}[(triton.cdiv(N, 16), triton.cdiv(B, {rows}))](" in src and "N_ROWS=B" in src
    (tmp_path / "kernel.py").write_text(src)
    (tmp_path / "check.py").write_text(CHECK)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(tmp_path / "check.py"), str(tmp_path / "kernel.py")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("change, says", [
    (("for k0 in range(0, K, BK):", "for k0 in range(0, K + r, BK):"), "loop bound depends on the row"),
    (("    acc = tl.zeros", "    if K < 0:\n        return\n    acc = tl.zeros"), "returns early"),
    (("    tl.store(y_ptr + r * sy + offs_n", "    tl.store(y_ptr + offs_n"), "does not depend on the row"),
    (("    offs_n = n0 * BN", "    offs_n = (n0 % tl.num_programs(1)) * BN"), "num_programs"),
    (("tl.load(w_ptr + offs_n[:, None] * sw + kk[None, :]", "tl.load(w_ptr + r + offs_n[:, None] * sw + kk[None, :]"),
     "share\nnothing".replace("\n", " ")),
])
def test_what_it_cannot_copy_is_refused_with_the_reason(change, says):
    with pytest.raises(NotApplicable, match=says):
        share_rows(INLINE.replace(*change), "k", 1, 4)


def test_a_tiled_grid_axis_is_no_row_axis():
    with pytest.raises(NotApplicable, match="tiled by a block size"):
        plain_axis(INLINE, "k", 0)
    assert plain_axis(INLINE, "k", 1) == "B"
    with pytest.raises(NotApplicable, match="power of two"):
        share_rows(INLINE, "k", 1, 3)


@pytest.mark.parametrize("rows", [4, 8])
def test_the_rows_branch_verifies_at_the_shapes_it_serves(rows, verify):
    """gemv_decode through the real verifier: ci (B = 1) takes the kernel, the ragged B = 3 (K = 129, N = 33) the
    copy, whose rows past the third are masked."""
    p = load_problem(GEMV)
    src = p.kernel_source
    out = rows_branch(dispatch(src, "gemv_kernel", [Branch("B > 2", {})]), src, "gemv_kernel", "B > 2", 1, rows)
    kernels = [s.kernel for s in parse_kernel(out).launches]
    assert kernels.count(f"gemv_kernel_rows{rows}") == 1 and kernels.count("gemv_kernel") == 1
    assert {v.dims["B"] for v in p.correctness_variants("cpu", True)} >= {1, 3}
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()


def test_the_per_shape_tactic_proposes_it_for_a_class_of_more_rows(tmp_path):
    """gemv_decode on a stand-in H200: B = 8 (bench-gpu-1) is the class ``B > 2`` on the grid's plain axis; its
    candidates launch ``gemv_kernel_rows8`` and ``_rows4`` in that branch only, timed at every shape. gemm_relu's
    class of fewer rows (M = 16) gets none."""
    ctx = tactic_context(load_problem(GEMV), kind="cuda", target="h200", cores=132)
    cands = [c for c in PER_SHAPE.propose(ctx) if c.params.get("shared_rows")]
    assert sorted(re.search(r"gemv_kernel_rows(\d)", c.description).group(1) for c in cands) == ["4", "8"]
    for c in cands:
        assert c.time_all_shapes and c.description.startswith("gemv_kernel: if B > 2 (bench-gpu-1): gemv_kernel_rows")
        kernels = [s.kernel for s in parse_kernel(c.source).launches]
        assert kernels.count("gemv_kernel") == 1 and sum(k.startswith("gemv_kernel_rows") for k in kernels) == 1
    ctx = tactic_context(load_problem(GEMM_RELU), kind="cuda", target="h200", cores=132)
    assert not [c for c in PER_SHAPE.propose(ctx) if c.params.get("shared_rows")]


def test_the_copies_take_the_launch_searchs_fastest_configuration_first(tmp_path):
    """A verified launch-params trial of this run (4 x 1024 tiles, as the H100 port found) goes to the copies first,
    each R; the incumbent's configuration after."""
    import json
    folder = tmp_path / "trials" / "0003-device_tuning-launch-params"
    folder.mkdir(parents=True)
    fast = {"BLOCK_N": 4, "BLOCK_K": 1024, "num_stages": 2}
    (folder / "meta.json").write_text(json.dumps({"stage": "device_tuning", "tactic": "launch-params",
                                                  "description": "gemv_kernel: BLOCK_N=4", "params": fast}))
    (folder / "verdict.json").write_text(json.dumps({"correct": True, "speedup": 2.1}))
    ctx = tactic_context(load_problem(GEMV), kind="cuda", target="h200", cores=132, run_dir=tmp_path)
    cands = [c for c in PER_SHAPE.propose(ctx) if c.params.get("shared_rows")]
    # fitted: a K block of 128 and 8 warps (the H100 probe's fastest for both R); the weight's tile keeps 4096
    # elements; the search's 2 stages first, then the incumbent's tile with its own
    assert [(c.params["BLOCK_N"], c.params["BLOCK_K"], c.params["num_warps"], c.params.get("num_stages"))
            for c in cands] == [(32, 128, 8, 2), (32, 128, 8, 2), (32, 128, 8, None), (32, 128, 8, None)]
    assert "gemv_kernel_rows8" in cands[0].description and "gemv_kernel_rows4" in cands[1].description


def test_a_configuration_is_fitted_for_several_rows_a_program():
    assert fit_config({"BLOCK_N": 4, "BLOCK_K": 1024, "num_warps": 4}) == \
        {"BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 8}
    assert fit_config({"BN": 32, "BK": 64}) == {"BN": 32, "BK": 64}  # fits already, and sets no warps
    assert fit_config({"XBLOCK": 1024, "num_warps": 4}) == {"XBLOCK": 1024, "num_warps": 4}  # no K block
