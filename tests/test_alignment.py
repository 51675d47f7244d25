"""Alignment by shape (xeforge.analysis.alignment): the integer arguments that lose Triton's divisibility-by-16
hint at some timed shapes, read from the traces of the suite's gemm_square (bench-gpu-2 is 3000 x 4096 x 3000)."""

from __future__ import annotations

from tests.conftest import ROOT
from xeforge.analysis.alignment import alignment_by_shape, describe
from xeforge.analysis.observe import traces
from xeforge.problem import load_problem
from xeforge.rewrite.align_hints import findings as alignment_findings


def test_the_odd_shape_names_the_strides_and_bounds_that_lose_the_hint():
    p = load_problem(ROOT / "kernels" / "gemm_square")
    found = {(f["shape"], f["arg"]): f for f in alignment_findings(p)}
    # at 3000 x 4096 x 3000 the row strides of B and C and the bounds M and N are 3000; A's stride is K = 4096
    assert set(found) == {("bench-gpu-2", a) for a in ("M", "N", "stride_bk", "stride_cm")}, sorted(found)
    stride = found[("bench-gpu-2", "stride_bk")]
    assert stride["value"] == 3000 and stride["role"] == "a stride of b_ptr"
    assert stride["aligned_at"] == {"bench-gpu": 4096, "bench-gpu-1": 4096}
    line = describe(stride)
    assert line.startswith("bench-gpu-2: matmul_kernel's stride_bk (a stride of b_ptr) = 3000 is not a multiple of 16")
    assert "16-byte aligned" in line and "tensor descriptors" in line
    # bf16 rows 3000 elements apart are 6000 bytes apart: off a 128-byte line (a measured 10% at that shape)
    assert stride["pitch_bytes"] == 6000 and "its rows are 6000 bytes apart, not a multiple of 128" in line
    assert line.endswith("keep this tensor in a buffer whose rows are padded to a multiple of 64 elements and pass "
                         "a view of it")
    assert "pitch_bytes" not in found[("bench-gpu-2", "M")]
    assert "masks cannot be proven constant" in describe(found[("bench-gpu-2", "M")])


def test_an_argument_unaligned_at_every_shape_is_how_the_kernel_runs_and_is_not_reported():
    p = load_problem(ROOT / "kernels" / "gemm_square")
    shapes = ["bench-gpu-2"]  # alone: 3000 is never a multiple of 16, so nothing is lost against another shape
    assert alignment_by_shape(traces(p), shapes) == []
    # a shape that was not traced (its trace is the reason) or not named is skipped, not an error
    assert alignment_by_shape({**traces(p), "bench-gpu": "could not be traced"}, ["bench-gpu", "bench-gpu-2", "nope"]) \
        == []
