"""Epilogues that are graphs, not chains (issue 33, first step): a value read again after it changed (a residual
through ``clone()``, a gate's input kept by an alias), in-place ops (``y.mul_(s).add_(y0)``), ``torch.where`` with
a comparison, and an activation written out (``y * sigmoid(1.5 * y) + y``). Each is fused into the GEMM's
epilogue, the earlier value kept in a tl variable, and verified against its PyTorch reference on the interpreter.
Then row reductions read back by every element (``y - y.mean(1, keepdim=True)``, softmax written out or called,
a LayerNorm written out), fused where one tile covers the row. Each case comes in two styles: the launch behind a
``linear()`` wrapper, and written in ``forward`` itself. The GEMM and its wrapper are this test's own."""

from __future__ import annotations

import textwrap

import pytest

from stages import fusion
from tests.conftest import tactic_context
from xeforge.problem import load_problem

KERNEL = textwrap.dedent('''\
    import torch
    import torch.nn.functional as F
    import triton
    import triton.language as tl


    @triton.jit
    def _mm_bias(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, sxm, sxk, swk, swn, sym, syn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            a = tl.load(x_ptr + rm[:, None] * sxm + (k + rk)[None, :] * sxk,
                        mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
            b = tl.load(w_ptr + (k + rk)[:, None] * swk + rn[None, :] * swn,
                        mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(a, b)
        acc = acc + tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
        tl.store(y_ptr + rm[:, None] * sym + rn[None, :] * syn, acc.to(y_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))


    def linear(x, weight, bias):
        M, K = x.shape
        N = weight.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
        _mm_bias[grid](x, weight, bias, y, M, N, K, x.stride(0), x.stride(1), weight.stride(1), weight.stride(0),
                       y.stride(0), y.stride(1), BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)
        return y

    ''')

MODEL = '''

class Model(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(out_features, in_features) * 0.05)
        self.bias = torch.nn.Parameter(torch.randn(out_features) * 0.05)
        self.bias2 = torch.nn.Parameter(torch.randn(out_features) * 0.1)  # its shape is the trace's to tell
        self.slope = 0.2  # a Python scalar: the kernel receives it at run time

    def forward(self, x):
        y = LINEAR(x, self.weight, self.bias)
BODY'''

SPEC = '''kind: gemm
inputs:
  x: {shape: [M, K], dtype: bfloat16}
inits:
  - {dim: K}
  - {dim: N}
fixed: [K, N]
ci:
  - {params: [x], dtype: float32, dims: {M: 48, K: 96, N: 96}}
'''

#: forward's statements after the GEMM -> lines the fused epilogue must hold
GRAPHS = {
    "clone-residual": ("original = y.clone()\ny = y * 0.5\ny = y + original\nreturn y",
                       ["original = acc", "acc = acc + original"]),
    "gate-reads-its-input": ("original = y\ny = torch.sigmoid(y)\ny = y * 2.0\ny = y + original\nreturn y",
                             ["original = acc", "acc = tl.sigmoid(acc)", "acc = acc + original"]),
    "in-place": ("y0 = y.clone()\ny.mul_(0.5).add_(y0)\nreturn y", ["acc = (acc * 0.5) + acc"]),
    "where": ("return torch.where(y > 0, y, y * 0.1)", ["acc = tl.where((acc > 0), acc, (acc * 0.1))"]),
    "swish-written-out": ("return y * torch.sigmoid(1.5 * y) + y", ["tl.sigmoid((1.5 * acc))"]),
    "a-parameter-read-from-the-trace": ("y = torch.relu(y) + self.bias2\nreturn y", ["bias2_ptr + rn"]),
    # the spec gives K and N the same size at every shape: the input is a tile of the output's shape
    "the-input-as-residual": ("return x + torch.relu(y)", ["tl.maximum(acc, 0.0)", "x_ptr"]),
    # ops lowered from torch's decompositions, as every op (hardswish: x * clamp(x + 3, 0, 6) / 6)
    "decomposed-ops": ("y = F.hardswish(y)\ny = F.elu(y, 0.5) + F.softsign(y)\nreturn torch.lerp(y, x, 0.25)",
                       ["tl.minimum(", "tl.exp(", "tl.abs("]),
    # the Model's Python scalar: a kernel argument in the code torch's decomposition gives (traced twice to find it)
    "a-model-scalar": ("y = F.leaky_relu(y, self.slope)\nreturn F.hardtanh(y, -self.slope, self.slope)",
                       ["tl.where((acc > 0.0), acc, (acc * slope))", "tl.maximum(acc, (-slope))"]),
    # several outputs: the pre-activation and the activation, each stored by the kernel into its own buffer
    "several-outputs": ("z = F.gelu(y)\nreturn y, z", ["tl.store(y_out_ptr + ", "y_out_ptr.dtype.element_ty"]),
    "several-outputs-one-an-op": ("y = y * 0.5\nreturn torch.sigmoid(y), y", ["tl.store(y_out_ptr + ", "tl.sigmoid(acc)"]),
    "several-outputs-kept-by-an-alias": ("pre = y.clone()\ny = torch.relu(y) * 2.0\nreturn pre, y, pre",
                                         ["tl.store(pre_out_ptr + ", "tl.maximum(acc, 0.0)"]),
}


#: reductions over the row whose result is read back by every element: one tile covers the row (N = 96 -> 128)
ROW_GRAPHS = {
    "centred": ("return y - y.mean(dim=1, keepdim=True)",
                ["row_mean = tl.sum(tl.where(rn[None, :] < N, acc, 0.0), axis=1) / N", "acc - row_mean[:, None]"]),
    "softmax-written-out": ("m = y.amax(1, keepdim=True)\ne = torch.exp(y - m)\nreturn e / e.sum(dim=-1, keepdim=True)",
                            ["row_amax[:, None]", "row_sum[:, None]"]),
    "softmax-of-a-gate": ("y = y * torch.sigmoid(y)\nreturn torch.softmax(y, dim=-1) + self.bias2",
                          ["tl.exp(", "bias2_ptr + rn"]),
    "log-softmax": ("return F.log_softmax(y * 0.5, dim=1)", ["row_logsumexp"]),
    "layernorm-written-out": ("mu = y.mean(-1, keepdim=True)\nd = y - mu\nvar = (d * d).mean(-1, keepdim=True)\n"
                              "return d * torch.rsqrt(var + 1e-5)", ["tl.rsqrt("]),
}


#: reductions over the row whose input is read again after them, with no tile covering the row: split, the tile
#: stored as before and one partial per row and column tile beside it, forward reducing the partials
SPLIT_READ_BACK = {
    "centred": ("m = y.mean(1, keepdim=True)\nreturn y - m", "m = row_part.mean(1, keepdim=True)"),
    "scaled-then-centred": ("y = y * 2.0\nmu = torch.mean(y, dim=1, keepdim=True)\nd = y - mu\nreturn d * 3.0",
                            "mu = torch.mean(row_part, dim=1, keepdim=True)"),
    "softmax-numerator": ("m = y.amax(dim=1, keepdim=True)\nreturn torch.exp(y - m)",
                          "m = row_part.amax(dim=1, keepdim=True)"),
}


#: the direct style: the launch written in forward itself (the wrapper's body, with the Model's parameters)
DIRECT = """M, K = x.shape
N = self.weight.shape[0]
y = torch.empty((M, N), device=x.device, dtype=x.dtype)
grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
_mm_bias[grid](x, self.weight, self.bias, y, M, N, K, x.stride(0), x.stride(1), self.weight.stride(1),
               self.weight.stride(0), y.stride(0), y.stride(1), BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)
"""


def _problem(tmp_path, body: str, style: str = "wrapper"):
    lines = "".join(f"        {ln}\n" for ln in body.splitlines())
    if style == "direct":
        launch = "".join(f"        {ln}\n" for ln in DIRECT.splitlines())
        kernel = KERNEL[:KERNEL.index("def linear")] + MODEL.replace("        y = LINEAR(x, self.weight, self.bias)\n", launch)
    else:
        kernel = KERNEL + MODEL.replace("LINEAR", "linear")
    (tmp_path / "kernel.py").write_text(kernel.replace("BODY", lines))
    ref = ("import torch\nimport torch.nn.functional as F\n\n\ndef linear(x, weight, bias):\n"
           "    return torch.nn.functional.linear(x, weight, bias)\n")
    (tmp_path / "reference.py").write_text(ref + MODEL.replace("LINEAR", "linear").replace("BODY", lines))
    (tmp_path / "spec.yaml").write_text(SPEC)
    return load_problem(tmp_path)


def _applying(tmp_path, body: str, style: str, tactic_name: str):
    """(the tactic, its context) on the problem of ``body`` in ``style``, after asserting that the tactic applies."""
    return _applying_to(_problem(tmp_path, body, style), tactic_name)


def _applying_to(p, tactic_name: str):
    ctx = tactic_context(p)
    tactic = next(t for t in fusion.STAGE.tactics if t.name == tactic_name)
    app = tactic.check(ctx)
    assert app.applies, app.reason
    return tactic, ctx


@pytest.mark.slow  # about 10 s a graph (a trace and the verifier on the interpreter)
@pytest.mark.parametrize("style", ["wrapper", "direct"])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_a_graph_epilogue_is_fused_and_correct(name, style, tmp_path, verify):
    body, expected = GRAPHS[name]
    tactic, ctx = _applying(tmp_path, body, style, "fuse-epilogue")
    p = ctx.problem
    src = tactic.propose(ctx)[0].source
    kernel = src[src.index("def _mm_bias"):src.index("def linear")] if "def linear" in src else src
    for line in expected:
        assert line in kernel, (line, kernel)
    assert "torch.sigmoid" not in src[src.index("def forward"):] and "torch.where" not in src
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


@pytest.mark.slow  # about 10 s a graph
@pytest.mark.parametrize("style", ["wrapper", "direct"])
@pytest.mark.parametrize("name", sorted(ROW_GRAPHS))
def test_a_row_reduction_read_back_is_fused_where_one_tile_covers_the_row(name, style, tmp_path, verify):
    body, expected = ROW_GRAPHS[name]
    p = _problem(tmp_path, body, style)
    ctx = tactic_context(p)
    epi = next(t for t in fusion.STAGE.tactics if t.name == "fuse-epilogue").check(ctx)
    assert "the fuse-row-reduction tactic's shape" in epi.reason or "(sigmoid, mul)" in epi.reason  # the prefix
    tactic = next(t for t in fusion.STAGE.tactics if t.name == "fuse-row-reduction")
    app = tactic.check(ctx)
    assert app.applies and "broadcast back" in app.reason, app.reason
    src = tactic.propose(ctx)[0].source
    kernel, fwd = src[:src.index("class Model")], src[src.index("def forward"):]
    for line in expected:
        assert line in kernel, (line, kernel)
    assert "BLOCK_N=max(16, triton.next_power_of_2(N))" in fwd and "(triton.cdiv(M, 32), 1)" in fwd
    assert not any(op in fwd for op in ("mean(", "amax(", "softmax", "torch.exp", ".sum("))
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_a_row_reduction_read_back_is_refused_where_no_tile_covers_the_row(tmp_path):
    body = "return y - y.mean(dim=1, keepdim=True)"
    p = _problem(tmp_path, body)
    (tmp_path / "spec.yaml").write_text(SPEC + "bench-gpu:\n  - {params: [x], dims: {M: 64, K: 512, N: 512}}\n")
    p = load_problem(tmp_path)
    app = next(t for t in fusion.STAGE.tactics if t.name == "fuse-row-reduction").check(tactic_context(p))
    assert not app.applies and "the row mean read back needs one tile to cover a row, but N=512" in app.reason


def test_an_earlier_value_read_after_the_fused_ops_is_refused(tmp_path):
    p = _problem(tmp_path, "original = y.clone()\ny = y * 0.5\nz = original.sum()\nreturn y + z")
    app = next(t for t in fusion.STAGE.tactics if t.name == "fuse-epilogue").check(tactic_context(p))
    assert not app.applies and "original is read after the ops that would be fused" in app.reason


@pytest.mark.slow  # about 10 s a graph
@pytest.mark.parametrize("style", ["wrapper", "direct"])
@pytest.mark.parametrize("name", sorted(SPLIT_READ_BACK))
def test_a_row_reduction_read_back_is_split_when_no_tile_covers_the_row(name, style, tmp_path, verify):
    body, combine = SPLIT_READ_BACK[name]
    tactic, ctx = _applying(tmp_path, body, style, "fuse-split-row-reduction")
    cand = tactic.propose(ctx)[-1]
    assert "the tile is still written" in cand.description, cand.description
    fwd = cand.source[cand.source.index("def forward"):]
    assert combine in fwd, fwd
    kernel = cand.source[:cand.source.index("def forward")]
    assert "tl.store(part_ptr + rm * stride_part" in kernel and "tl.store(y_ptr + rm[:, None]" in kernel
    verdict = verify(ctx.problem, cand.source)
    assert verdict.correct, verdict.feedback()
    # first of all, the chain: then the second pass, the partials' reduction and the read-back in one generated
    # kernel, which loads the tile
    first = tactic.propose(ctx)[0]
    assert "; then " in first.description and "broadcast over the y columns" in first.description, \
        first.description
    second = first.source
    fwd = second[second.index("def forward"):]
    assert "row_combine_kernel[" in fwd and "y_ptr=y" in fwd and "row_part.mean" not in fwd \
        and "torch.mean" not in fwd and "amax" not in fwd, fwd
    verdict = verify(ctx.problem, second)
    assert verdict.correct, verdict.feedback()


@pytest.mark.slow  # about 20 s (the interpreter at N = 600)
def test_few_rows_split_the_read_back_columns_over_programs(tmp_path, verify):
    """The combine kernel's broadcast phase at few rows and a wide row (48 x 600): the grid's second axis gives each
    block of rows three column programs, each writing its share (the last one past N, masked). The verifier runs
    it at the ci shape; a kernel whose programs all write the first share fails (with one column program it would
    pass), so the split is exercised."""
    body, _ = SPLIT_READ_BACK["centred"]
    _problem(tmp_path, body)
    (tmp_path / "spec.yaml").write_text(SPEC.replace("{M: 48, K: 96, N: 96}", "{M: 48, K: 96, N: 600}"))
    p = load_problem(tmp_path)
    tactic, ctx = _applying_to(p, "fuse-split-row-reduction")
    src = tactic.propose(ctx)[0].source
    fwd = src[src.index("def forward"):]
    assert "row_combine_kernel[(triton.cdiv(row_part.shape[0], combine_rows), combine_split)](" in fwd, fwd
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()
    one_share = src.replace("range(tl.program_id(1) * span, tl.program_id(1) * span + span, BLOCK_N)",
                            "range(0, span, BLOCK_N)")
    assert one_share != src and not verify(p, one_share).correct


#: a wrapper as LLM code writes it: leading dims flattened into M, the result reshaped back to them
FLATTENING = '''    def linear(x, weight, bias):
        K = x.shape[-1]
        N = weight.shape[0]
        x2 = x.reshape(-1, K)
        M = x2.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
        _mm_bias[grid](x2, weight, bias, y, M, N, K, x2.stride(0), x2.stride(1), weight.stride(1), weight.stride(0),
                       y.stride(0), y.stride(1), BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)
        return y.reshape(*x.shape[:-1], N)

'''


@pytest.mark.slow  # about 20 s (two traces and the verifier on the interpreter)
def test_ops_after_a_reshape_that_keeps_the_last_dim_run_in_the_epilogue(tmp_path, verify):
    """``return y.reshape(*x.shape[:-1], N)`` in the wrapper, then a GELU, a per-column parameter and a scalar on the
    3D result: the same elements, so the ops run in the tile and forward returns the buffer reshaped as before."""
    p = _problem(tmp_path, "return F.gelu(y) * 2.0 + self.bias2")
    src = KERNEL[:KERNEL.index("def linear")] + textwrap.dedent(FLATTENING) + \
        p.kernel_source[p.kernel_source.index("\n\nclass Model"):]
    (tmp_path / "kernel.py").write_text(src)
    (tmp_path / "spec.yaml").write_text(SPEC.replace("shape: [M, K]", "shape: [B, S, K]").replace(
        "{M: 48, K: 96, N: 96}", "{B: 2, S: 24, K: 96, N: 96}"))
    p = load_problem(tmp_path)
    tactic, ctx = _applying_to(p, "fuse-epilogue")
    out = tactic.propose(ctx)[0].source
    kernel, fwd = out[:out.index("class Model")], out[out.index("def forward"):]
    assert "bias2_ptr + rn" in kernel and "erf(" in kernel, kernel
    assert fwd.rstrip().endswith(".reshape(*x.shape[:-1], N)") and "F.gelu" not in fwd, fwd
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()


def test_a_reshape_that_changes_the_last_dim_stops_the_chain_with_the_reason(tmp_path):
    p = _problem(tmp_path, "y = y.reshape(-1, 2, 48)\nreturn torch.relu(y)")
    app = next(t for t in fusion.STAGE.tactics if t.name == "fuse-epilogue").check(tactic_context(p))
    assert not app.applies and "y.reshape(-1, 2, 48)" in app.reason, app.reason
