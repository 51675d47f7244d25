"""The fusion stage's tactics on the CPU interpreter, through the real verifier.

Each tactic rewrites its target shape (bundled problems and fixtures under tests/fixtures/tactics/fusion),
the rewrite passes ``Verifier.verify`` (float64 oracle, ragged shapes, gate-1 rule S020 against the
starting kernel), and shapes it does not cover are left untouched with a reason. One test runs the whole
``xeforge port --stages dtype,fusion`` on gemm_relu and checks the rewrites are adopted (unmeasured, on the
CPU) and the final kernel launches fewer kernels; another checks the dry run shows the diffs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stages import fusion
from stages.base import StageContext
from tests.conftest import FIXTURES, ROOT
from xeforge.devices import describe
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.static_checks import torch_compute_calls

KERNELS = ROOT / "kernels"
FUSION = FIXTURES / "tactics" / "fusion"
TACTIC = {t.name: t for t in fusion.STAGE.tactics}


def problem(path: Path):
    return load_problem(path)


def context(p, source: str | None = None) -> StageContext:
    src = p.kernel_source if source is None else source
    return StageContext(p, src, p.kernel_source, describe("cpu"), None)


def propose(tactic: str, p, source: str | None = None):
    ctx = context(p, source)
    app = TACTIC[tactic].check(ctx)
    assert app.applies, app.reason
    cands = TACTIC[tactic].propose(ctx)
    assert cands and all(c.tactic == tactic and c.kind == "rewrite" for c in cands)
    return cands


def launches(source: str) -> list[str]:
    return [s.kernel for s in parse_kernel(source).launches]


# ------------------------------------------------------------------------------------------------ (a) chains
@pytest.mark.parametrize("name,consumer", [  # gemm_relu: see the port test below
    ("kb09_matmul_subtract_multiply_relu", "sub_mul_relu_kernel"),
    pytest.param("kb37_matmul_swish_sum_groupnorm", "swish_bias_kernel",  # names clash (bias_ptr, b, N):
                 marks=pytest.mark.slow),  # renamed/unified; about 17 s: make test-slow
])
def test_consumer_kernel_folds_into_the_gemm_store(verify, name, consumer):
    p = problem(KERNELS / name)
    cand = propose("fuse-elementwise-chain", p)[-1]  # the single step (kb37's first candidate also takes the GroupNorm)
    assert f"def {consumer}" not in cand.source and f"{consumer}[" not in cand.source
    assert consumer in cand.description
    assert len(launches(cand.source)) == len(launches(p.kernel_source)) - 1
    # still masked for ragged tiles, still one store, still casting to the output's element type
    fused = parse_kernel(cand.source).functions
    assert len(fused) == len(parse_kernel(p.kernel_source).functions) - 1
    assert "mask=(offs_m[:, None] < M) & (offs_n[None, :] < N)" in cand.source
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()


def test_chain_of_three_elementwise_kernels_becomes_one(verify):
    p = problem(FUSION / "ew_chain")
    cand = propose("fuse-elementwise-chain", p)[0]
    assert launches(cand.source) == ["add_kernel"]
    assert "scale_kernel" in cand.description and "sigmoid_kernel" in cand.description
    assert "# the kernel computes in fp32" in cand.source  # the consumer's comment travels with its code
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()


# ------------------------------------------------------------------------------------------------ (b) torch ops
def test_torch_tail_ops_become_the_kernels_epilogue(verify):
    p = problem(FUSION / "gemm_tail_ops")
    cand = propose("fuse-epilogue", p)[0]
    for op in ("add", "leaky_relu", "sub", "sigmoid", "silu", "tanh", "gelu", "hardtanh", "clamp_min", "exp", "log",
               "div"):  # gelu: both the tanh and the erf form
        assert op in cand.description, op
    m = parse_kernel(cand.source)
    assert not torch_compute_calls(m), torch_compute_calls(m)  # every op (and the final .to) moved into Triton
    assert "dtype=x.dtype" in cand.source and "linear_bias_ptr + offs_n, mask=offs_n < N" in cand.source
    assert "inv = 1.0 / divisor" in cand.source and " / divisor" not in cand.source.split("inv = 1.0 / divisor")[1]
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()


def test_a_residual_of_the_outputs_shape_in_the_return_is_read_as_a_tile_in_the_epilogue(verify):
    """``return gelu(y) + residual``: a second [M, N] input is loaded with the output's offsets, strides and masks
    (ragged shapes in the verifier cover the masks), and the return's own expression is the chain's last op."""
    p = problem(FIXTURES / "styles" / "linear_gelu_residual" / "direct.py")
    cand = propose("fuse-epilogue", p)[0]
    assert "gelu, add" in cand.description
    assert "residual_ptr + offs_m[:, None] * stride_residual_m + offs_n[None, :] * stride_residual_n" in cand.source
    assert "stride_residual_m=residual.stride(0)" in cand.source and cand.source.rstrip().endswith("return y")
    assert not torch_compute_calls(parse_kernel(cand.source))
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()


def test_an_operand_of_the_outputs_shape_does_not_broadcast_over_a_reduced_row():
    import ast

    from xeforge.rewrite.fusion.tl_ops import EpilogueBuilder, Operand, Unsupported

    tile = Operand("tile", "residual", "residual_ptr", ("stride_rm", "stride_rn"))
    on_tile = EpilogueBuilder("acc", {"y"}, lambda n: tile, lambda b: b + "_1", column=("offs_n", "N"),
                              rows=("offs_m", "M"))
    on_tile.assign(ast.parse("y + residual", mode="eval").body)
    assert "mask=(offs_m[:, None] < M) & (offs_n[None, :] < N)" in on_tile.lines[0]
    assert tile.launch_args() == {"residual_ptr": "residual", "stride_rm": "residual.stride(0)",
                                  "stride_rn": "residual.stride(1)"}
    on_row = EpilogueBuilder("row", {"y"}, lambda n: tile, lambda b: b + "_1", column=None)  # after a row reduction
    with pytest.raises(Unsupported, match="does not broadcast over a reduced row"):
        on_row.assign(ast.parse("y + residual", mode="eval").body)


def test_batchnorm_gelu_relu_fuse_into_the_gemm():
    # same translations as verified in the tail-ops and kb97 tests (erf gelu, inference batch_norm, relu)
    p = problem(KERNELS / "kb41_gemm_batchnorm_gelu_relu")
    cand = propose("fuse-epilogue", p)[0]
    assert "batch_norm, gelu, relu" in cand.description and not torch_compute_calls(parse_kernel(cand.source))
    assert "tl.erf(acc * 0.7071067811865476)" in cand.source and "return y\n" in cand.source
    # batch_norm through torch's decomposition: the statistics are [1, BLOCK_N] columns, so 1 / sqrt(var + eps) is
    # computed per column, and no element is divided
    assert "(1.0 / tl.sqrt((batch_norm_running_var + batch_norm_eps)))" in cand.source
    assert "[None, :]" in next(x for x in cand.source.splitlines() if "batch_norm_running_var =" in x)
    assert not re.search(r"/ \(?acc", cand.source)


def test_torch_op_between_kernels_fuses_then_the_chain_follows(verify):
    # kb97: GEMM, torch batch_norm, Triton bias/div/swish kernel -> one kernel, no torch compute
    p = problem(KERNELS / "kb97_matmul_batchnorm_biasadd_divide_swish")
    assert "bias_div_swish_kernel reads y after" in TACTIC["fuse-elementwise-chain"].check(context(p)).reason
    cands = propose("fuse-epilogue", p)
    full, single = cands[0], cands[-1]
    assert len(cands) == 2 and "then fused bias_div_swish_kernel" in full.description
    assert launches(full.source) == ["matmul_bias_kernel"] and len(launches(single.source)) == 2
    assert not torch_compute_calls(parse_kernel(full.source))
    verdict = verify(p, full.source)
    assert verdict.correct, verdict.feedback()


def test_kb22_fuses_the_elementwise_prefix_and_keeps_the_reduction():
    p = problem(KERNELS / "kb22_matmul_scale_residualadd_clamp_logsumexp_mish")
    cand = propose("fuse-epilogue", p)[-1]  # the single step; the first candidate also splits the reduction
    assert "mul, add, clamp" in cand.description
    assert "torch.logsumexp" in cand.source and "torch.clamp" not in cand.source
    # the logsumexp stays: N = 8192 at bench-gpu needs a tile wider than one kept in registers
    assert "acc = acc + acc" in cand.source  # y + y: the value used twice
    reason = TACTIC["fuse-row-reduction"].check(context(p, cand.source)).reason
    assert reason.startswith("no fusion tactic applies:") and "N=8192 at bench-gpu" in reason


# ------------------------------------------------------------------------------------------------ (c) reductions
def test_row_logsumexp_with_ops_around_it_fuses_when_a_tile_covers_the_row(verify):
    p = problem(FUSION / "gemm_rowlse")
    cand = propose("fuse-row-reduction", p)[0]
    src = cand.source
    assert "BLOCK_N=max(16, triton.next_power_of_2(N))" in src and "grid = (triton.cdiv(M, 16), 1)" in src
    assert "torch.empty((M, 1)" in src and "mask=offs_m < M" in src
    assert not torch_compute_calls(parse_kernel(src))
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_row_max_without_keepdim_fuses(verify):
    p = problem(FUSION / "gemm_rowmax")
    cand = propose("fuse-row-reduction", p)[0]
    assert "return y.squeeze(1)" in cand.source and "float(\"-inf\")" in cand.source
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()


def test_row_reduction_is_not_applicable_when_n_is_too_wide_at_bench_shapes():
    p = problem(KERNELS / "kb64_gemm_logsumexp_leakyrelu_leakyrelu_gelu_gelu")
    ctx = context(p)
    app = TACTIC["fuse-row-reduction"].check(ctx)
    assert not app.applies
    assert app.reason.startswith("no fusion tactic applies:")
    assert "N=8192 at bench-gpu" in app.reason and "BLOCK_N=8192" in app.reason
    assert TACTIC["fuse-row-reduction"].propose(ctx) == []


@pytest.mark.parametrize("name,kind,tail", [
    ("kb64_gemm_logsumexp_leakyrelu_leakyrelu_gelu_gelu", "logsumexp", "F.leaky_relu"),
    ("kb18_matmul_sum_max_avgpool_logsumexp_logsumexp", "sum", "torch.max(y, dim=1, keepdim=True)[0]"),
])
def test_split_row_reduction_writes_tile_partials_and_reduces_them(verify, name, kind, tail):
    """N = 8192 at bench-gpu: no tile covers the row, so each tile reduces its columns into a partials buffer and
    forward runs the same reduction on it; the GEMM's full output is no longer written."""
    p = problem(KERNELS / name)
    cand = propose("fuse-split-row-reduction", p)[-1]  # the split alone ([0] also combines the partials)
    src = cand.source
    assert f"partial {kind} per row" in cand.description
    # every slot is written by a tile (its partial, or the identity where no tile reduces into it): no fill launch
    assert "row_part = torch.empty((y.shape[0], triton.cdiv(y.shape[-1], 16))" in src and "torch.full(" not in src
    assert "fill_slots = pid_n + tl.cdiv(N, BLOCK_N) * (1 + tl.arange(0, BLOCK_N // 16))" in src, src
    assert f"torch.{kind}(row_part, dim=1, keepdim=True)" in src and tail in src  # the rest stays in forward
    assert "tl.store(part_ptr + offs_m * stride_part + pid_n" in src and "c_ptr + offs_m" not in src
    assert torch_compute_calls(parse_kernel(src)) <= torch_compute_calls(parse_kernel(p.kernel_source))
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_kb22_epilogue_then_split_reduction_in_one_candidate(verify):
    p = problem(KERNELS / "kb22_matmul_scale_residualadd_clamp_logsumexp_mish")
    full = propose("fuse-epilogue", p)[0]
    assert "split over matmul_bias_kernel's column tiles" in full.description
    assert "torch.clamp" not in full.source and "def row_combine_kernel(" in full.source
    assert "torch.logsumexp(" not in full.source and "F.mish(" not in full.source  # combined in one kernel
    verdict = verify(p, full.source)
    assert verdict.correct, verdict.feedback()


def test_split_takes_an_avg_pool_inside_the_tile_before_the_row_max(verify):
    """kb98: avg_pool1d over POOL adjacent features, GELU, scale, then the row max: the pool is a reshape-and-mean
    of the tile (POOL a constexpr), the pooled columns get their own mask (odd N drops the last partial window,
    as avg_pool1d does), and the max is split like any other row reduction."""
    p = problem(KERNELS / "kb98_matmul_avgpool_gelu_scale_max")
    cand = propose("fuse-split-row-reduction", p)[-1]
    src = cand.source
    assert "avg_pool1d, gelu, mul, max" in cand.description and "F.avg_pool1d" not in src
    assert "POOL: tl.constexpr" in src and "POOL=self.pool_kernel_size" in src
    assert "offs_pool[None, :] < (N // POOL)" in src and "torch.max(row_part, dim=1).values" in src
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


@pytest.mark.parametrize("name,gone", [
    ("kb18_matmul_sum_max_avgpool_logsumexp_logsumexp", ["torch.sum(", "torch.max(", "torch.mean(", "torch.logsumexp("]),
    ("kb64_gemm_logsumexp_leakyrelu_leakyrelu_gelu_gelu", ["torch.logsumexp(", "F.leaky_relu(", "F.gelu("]),
])
def test_partials_and_the_ops_after_them_become_one_kernel(verify, name, gone):
    """After the split, forward's reduction of the partials and the small ops on its (M, 1) result (kb18: max,
    mean and two logsumexps over the size-1 dim it kept, the identity) run as one generated kernel."""
    p = problem(KERNELS / name)
    cand = propose("fuse-split-row-reduction", p)[0]
    src, fwd = cand.source, cand.source[cand.source.index("def forward"):]
    assert "def row_combine_kernel(" in src and "row_combine_kernel[(triton.cdiv(row_part.shape[0]" in fwd
    assert not [g for g in gone if g in fwd], fwd
    assert "return combined" in fwd and "dtype=x.dtype)" in fwd  # the final cast is the store's
    if name.startswith("kb18"):
        assert "max over a dim of size 1 (identity)" in cand.description
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_a_lone_logsumexp_of_the_partials_becomes_one_kernel(verify):
    """Nothing follows the row logsumexp in linear_logsumexp's direct style, but torch runs a logsumexp as several
    launches (on the H200 35 us of a 133 us call after the split GEMM): the combined candidate reduces the partials
    in one generated kernel; the split alone keeps torch's call. A lone sum stays torch's (one launch already)."""
    from xeforge.rewrite import NotApplicable
    from xeforge.rewrite.fusion.combine import combine_partials

    p = problem(ROOT / "tests" / "fixtures" / "styles" / "linear_logsumexp" / "direct.py")
    cands = propose("fuse-split-row-reduction", p)
    combined, alone = cands[0], cands[-1]
    fwd = combined.source[combined.source.index("def forward"):]
    assert "torch.logsumexp(" not in fwd and "row_combine_kernel[(" in fwd and "return combined" in fwd
    assert "one launch where torch runs a logsumexp as several" in combined.description
    assert "torch.logsumexp(row_part, dim=1, keepdim=True)" in alone.source
    verdict = verify(p, combined.source)
    assert verdict.correct, verdict.feedback()
    summed = alone.source.replace("torch.logsumexp(row_part", "torch.sum(row_part")
    with pytest.raises(NotApplicable, match=r"nothing after torch.sum\(row_part.*would only replace one torch launch"):
        combine_partials(summed, p)


def test_partials_combine_stops_where_the_rows_are_no_longer_a_size_1_dim():
    """A reduction after one that dropped the dim is not the identity: nothing to combine, so it does not apply."""
    from xeforge.rewrite import NotApplicable
    from xeforge.rewrite.fusion.combine import combine_partials

    p = problem(KERNELS / "kb18_matmul_sum_max_avgpool_logsumexp_logsumexp")
    src = p.kernel_source.replace("y = torch.sum(y, dim=1, keepdim=True)", "y = torch.sum(y, dim=1)")
    assert src != p.kernel_source
    with pytest.raises(NotApplicable, match=r"nothing after torch.sum\(y, dim=1\) translates"):
        combine_partials(src, p)  # the max over dim 1 after it is a real reduction now: nothing to combine


@pytest.mark.slow  # about 19 s on 2 cores: make test-slow
def test_row_value_broadcast_over_a_column_vector_is_written_by_the_combine_kernel(verify):
    """kb75: the row min of the GroupNorm's partials plus a [1, N] bias is an (M, N) result; forward built it in
    fp32 and cast it in a second pass. The combine kernel writes the rows in the result's dtype, N columns at a
    time; an injected bug in the column phase fails the verifier, so the ci shapes run it."""
    from xeforge.rewrite.fusion.combine import combine_partials

    kb75 = problem(KERNELS / "kb75_gemm_groupnorm_min_biasadd")
    gn = propose("fuse-group-norm", kb75)[-1].source  # the GroupNorm alone (the first candidate combines too)
    src, why = combine_partials(gn, kb75)
    assert "broadcast over the self.bias columns, written as x.dtype" in why
    fwd = src[src.index("def forward"):]
    assert "torch.min(" not in fwd and "self.bias.float()" not in fwd and "return combined" in fwd
    assert "(gn_part.shape[0], self.bias.shape[-1]), device=gn_part.device, dtype=x.dtype)" in fwd
    assert "for n0 in range(tl.program_id(1) * span, tl.program_id(1) * span + span, BLOCK_N):" in src
    assert "w = w + bias" in src
    # correct as the first fuse-group-norm candidate (test_group_norm_becomes_one_generated_kernel); a wrong column
    # phase must fail
    assert not verify(kb75, src.replace("w = w + bias", "w = w - bias")).correct


def test_a_split_mean_is_the_sum_of_each_tiles_sum_over_n(verify, tmp_path):
    """A row mean too wide for one tile: each tile stores its columns' sum / N times the partials' slot count, and
    forward takes the same mean over the slots (the mean of the tiles' own means would weigh a ragged last tile like
    a full one)."""
    for name in ("kernel.py", "reference.py", "spec.yaml"):  # gemm_rowlse with a row mean for its logsumexp
        text = (FUSION / "gemm_rowlse" / name).read_text()
        (tmp_path / name).write_text(text.replace("torch.logsumexp(y, dim=1, keepdim=True)",
                                                  "torch.mean(y, dim=1, keepdim=True)"))
    rowlse = problem(tmp_path)
    assert "torch.mean(y, dim=1" in rowlse.kernel_source
    ctx = context(rowlse)
    app = TACTIC["fuse-split-row-reduction"].check(ctx)
    assert app.applies, app.reason
    out = TACTIC["fuse-split-row-reduction"].propose(ctx)[-1].source
    fwd = out[out.index("def forward"):]
    assert "torch.mean(row_part, dim=1, keepdim=True)" in fwd, fwd
    assert "axis=1) / N * ((N + 15) // 16)" in out[:out.index("def forward")]
    verdict = verify(rowlse, out)
    assert verdict.correct, verdict.feedback()


@pytest.mark.parametrize("name,tail,run", [  # three run through the verifier (CI time); all six are rewritten
    ("kb30_gemm_groupnorm_hardtanh", "hardtanh", True),  # ragged N=68 with G=4: 17-channel groups, BLOCK=32 masked
    ("kb37_matmul_swish_sum_groupnorm", None, False),  # then the swish kernel folds into the GEMM (verified below)
    pytest.param("kb62_matmul_groupnorm_leakyrelu_sum", None, True,  # the Triton kernel reading it afterwards is
                 marks=pytest.mark.slow),  # folded in; about 22 s: make test-slow
    pytest.param("kb75_gemm_groupnorm_min_biasadd", None, True,  # the row min after it: per-group partials;
                 marks=pytest.mark.slow),  # about 25 s: make test-slow
    pytest.param("kb88_gemm_groupnorm_swish_multiply_swish", None, True,  # folded in, with its per-column weight
                 marks=pytest.mark.slow),  # (offs % N); about 25 s: make test-slow
    ("kb94_gemm_biasadd_hardtanh_mish_groupnorm", None, False),
])
def test_group_norm_becomes_one_generated_kernel(verify, name, tail, run):
    p = problem(KERNELS / name)
    cand = propose("fuse-group-norm", p)[0]
    src = cand.source
    assert "= F.group_norm(" not in src and "def group_norm_kernel(" in src
    assert "group_norm_kernel[(y.shape[0]" in src or "group_norm_kernel[(z.shape[0]" in src
    if tail:
        assert f"({tail})" in cand.description and f"F.{tail}" not in src
    if name.startswith("kb75"):  # the partials' min and the [1, N] bias after it: one combine kernel (verified here)
        assert "partial of torch.min" in cand.description and "def row_combine_kernel(" in src
        assert "broadcast over the self.bias columns" in cand.description
    for folded in ("leaky_relu_double_kernel", "swish_mul_swish_kernel"):
        if folded in p.kernel_source:
            assert f"def {folded}" not in src and f"{folded}[" not in src and f"{folded} (folded in" in cand.description
            assert len(parse_kernel(src).launches) == 2  # the GEMM and the GroupNorm kernel: one launch fewer
    assert torch_compute_calls(parse_kernel(src)) < torch_compute_calls(parse_kernel(p.kernel_source))
    if run:
        verdict = verify(p, src)
        assert verdict.correct, verdict.feedback()


@pytest.mark.slow  # kb30 and kb75, about 20 s each on 2 cores: make test-slow
@pytest.mark.parametrize("name", ["kb30_gemm_groupnorm_hardtanh", "kb75_gemm_groupnorm_min_biasadd"])
def test_group_norm_kernel_batches_groups_and_masks_the_last_block(verify, tmp_path, name):
    """Five 300-channel groups: four a program (BLOCK 512, 2048 elements), so two programs a row and the second
    normalises one group and masks three (store, per-group partial and folded consumer alike)."""
    import re
    import shutil

    root = tmp_path / name
    shutil.copytree(KERNELS / name, root)
    spec = (root / "spec.yaml").read_text()
    spec = re.sub(r"ragged:\n(  - .*\n)+", "", spec).replace("dims: {M: 32, K: 64, N: 64, G: 4}",
                                                                "dims: {M: 4, K: 16, N: 1500, G: 5}")
    assert "N: 1500" in spec and "ragged" not in spec
    (root / "spec.yaml").write_text(spec)
    p = problem(root)
    src = propose("fuse-group-norm", p)[0].source
    assert "GROUPS=gn_groups" in src and "triton.cdiv(" in src
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


@pytest.mark.parametrize("name,buffer,run", [
    ("kb30_gemm_groupnorm_hardtanh", "y = torch.empty((M, N), device=x.device, dtype=x.dtype)", False),
    ("kb37_matmul_swish_sum_groupnorm", "z = torch.empty_like(y, dtype=self.bias.dtype)", True),
    ("kb62_matmul_groupnorm_leakyrelu_sum", "y = torch.empty((M, N), device=x.device, dtype=x.dtype)", False),
    ("kb75_gemm_groupnorm_min_biasadd", "y = torch.empty((M, N), device=x.device, dtype=x.dtype)", True),
])
def test_group_norm_first_candidate_reads_a_buffer_in_the_result_dtype(verify, name, buffer, run):
    """The GEMM's fp32 output that only the GroupNorm kernel reads is allocated in the module's result dtype (what a
    bf16 Linear returns; kb37: the swish kernel's output too, its input bias having that dtype); per-group partials
    stay fp32, pinned where they took their dtype from the buffer. The plain rewrite is still proposed after it."""
    p = problem(KERNELS / name)
    cands = propose("fuse-group-norm", p)
    narrowed, plain = cands[0], cands[1]
    assert buffer in narrowed.source and "instead of fp32" in narrowed.description
    assert buffer not in plain.source and "instead of fp32" not in plain.description
    if name.startswith("kb37"):  # the elementwise-chain tactic's chain reaches the GroupNorm too: same first
        chain = propose("fuse-elementwise-chain", p)
        gemm_out = "y = torch.empty((M, N), device=x.device, dtype=x.dtype)"  # the swish is folded into the GEMM
        assert gemm_out in chain[0].source and "instead of fp32" in chain[0].description
        assert all(gemm_out not in c.source for c in chain[1:])
    if name.startswith("kb75"):
        assert "gn_part = torch.empty((y.shape[0], self.group_norm.num_groups), device=y.device, " \
               "dtype=torch.float32)" in narrowed.source
    if run:
        verdict = verify(p, narrowed.source)
        assert verdict.correct, verdict.feedback()


def test_group_norm_input_stays_fp32_when_the_result_is_fp32_or_it_is_read_again():
    from xeforge.rewrite import NotApplicable
    from xeforge.rewrite.dtype_narrow import narrow_intermediates
    from xeforge.rewrite.fusion.norm import group_norm_kernel

    p = problem(KERNELS / "kb30_gemm_groupnorm_hardtanh")
    fp32 = p.kernel_source.replace("return y.to(x.dtype)", "return y")
    with pytest.raises(NotApplicable, match="forward's result is fp32 in every variant"):
        narrow_intermediates(group_norm_kernel(fp32, p)[0], p)
    assert all("instead of fp32" not in c.description for c in propose("fuse-group-norm", p, fp32))
    p = problem(KERNELS / "kb37_matmul_swish_sum_groupnorm")
    reread = p.kernel_source.replace("z = F.group_norm(z,", "w = F.group_norm(z,").replace(
        "return z.to(x.dtype)", "return (w * z.mean()).to(x.dtype)")
    assert reread.count("w = F.group_norm(z,") == 1 and "z.mean()" in reread
    fused = group_norm_kernel(reread, p)[0]
    assert "def group_norm_kernel(" in fused  # the plain rewrite still applies
    new, desc = narrow_intermediates(fused, p)  # y (GEMM -> swish kernel) is narrowed, z (read by torch) is not
    assert "z = torch.empty_like(y, dtype=torch.float32)" in new and "y = torch.empty((M, N), device=x.device, " \
        "dtype=x.dtype)" in new
    assert "torch.Tensor.mean" in desc and "reads it: only a buffer nothing but Triton kernels read" in desc


# ------------------------------------------------------------------------------------------------ unsupported
def test_groupnorm_between_kernels_is_left_alone_with_reasons():
    """Every tactic but fuse-group-norm (which replaces it) says why it leaves a GroupNorm between two kernels."""
    p = problem(KERNELS / "kb62_matmul_groupnorm_leakyrelu_sum")
    ctx = context(p)
    for tactic in fusion.STAGE.tactics:
        if tactic.name == "fuse-group-norm":
            continue
        app = tactic.check(ctx)
        assert not app.applies and app.reason.startswith("no fusion tactic applies: "), (tactic.name, app.reason)
        assert "group_norm" in app.reason, (tactic.name, app.reason)
        assert tactic.propose(ctx) == []
    issues = fusion.STAGE.detect(ctx)
    assert any(i.code == "torch-ops-in-forward" for i in issues)


def test_single_kernel_without_torch_ops_has_nothing_to_fuse():
    p = problem(FIXTURES / "problems" / "vadd")
    ctx = context(p)
    reasons = {t.name: t.check(ctx) for t in fusion.STAGE.tactics}
    assert all(not a.applies for a in reasons.values())
    assert "one kernel" in reasons["fuse-elementwise-chain"].reason
    assert "forward runs one kernel, add_kernel" in reasons["fuse-epilogue"].reason
    assert "nothing to fuse into it" in reasons["fuse-epilogue"].reason
    assert fusion.STAGE.detect(ctx) == []


def test_detector_flags_a_kernel_that_rereads_another_kernels_output():
    p = problem(KERNELS / "gemm_relu")
    issues = fusion.STAGE.detect(context(p))
    assert [i.code for i in issues] == ["separate-kernel"]
    assert "relu_kernel re-reads c" in issues[0].message and issues[0].line


# ------------------------------------------------------------------------------------------------ CLI
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xeforge", "port", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


@pytest.mark.slow  # a whole port through two stages (about 25 s): CI runs it with make test-slow
def test_port_adopts_dtype_and_fusion_rewrites_and_launches_fewer_kernels(tmp_path):
    run = tmp_path / "run"
    proc = _cli(str(KERNELS / "gemm_relu"), "--device", "cpu", "--stages", "dtype,fusion", "--run-dir", str(run),
                "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    by = {s["name"]: s for s in report["stages"]}
    for stage in ("dtype", "fusion"):
        assert by[stage]["status"] == "ran" and by[stage]["adopted_unmeasured"], by[stage]
        assert by[stage]["speedup"] is None  # nothing is claimed on the CPU
    adopted = {t["name"] for s in report["stages"] for t in s["tactics"] for c in t["candidates"] if c["adopted"]}
    assert {"drop-upcast-before-dot", "dot-accumulate-in-place", "fuse-elementwise-chain"} <= adopted
    final = (run / "final" / "kernel.py").read_text()
    start = (KERNELS / "gemm_relu" / "kernel.py").read_text()
    assert len(launches(final)) == 1 < len(launches(start)) == 2
    assert ".to(tl.float32)" not in final and "acc = tl.dot(a, b, acc)" in final
    assert report["final"]["verdict"]["correct"] and not report["final"]["is_start"]
    assert "not measured" in report["final"]["claim"]


@pytest.mark.parametrize("name,needles", [
    ("gemm_relu", {"fuse-elementwise-chain": "-def relu_kernel",
                   "drop-upcast-before-dot": "-                    mask=(offs_m[:, None] < M) & (k[None, :] < K), "
                                             "other=0.0).to(tl.float32)"}),
    ("kb09_matmul_subtract_multiply_relu", {"fuse-elementwise-chain": "+    y = acc.to(tl.float32)",
                                            "dot-accumulate-in-place": "+        acc = tl.dot(a, b, acc)"}),
])
def test_dry_run_shows_each_tactics_diff(name, needles):
    from xeforge.pipeline import Pipeline, PortOptions

    plan = Pipeline(problem(KERNELS / name), PortOptions(device="cpu", stages=["dtype", "fusion"], dry_run=True,
                                                        engine="rules")).dry_run()
    tactics = {t["name"]: t for s in plan["stages"] for t in s["tactics"]}
    for tactic, needle in needles.items():
        assert tactics[tactic]["applies"], tactics[tactic]
        assert needle in tactics[tactic]["diff"], tactics[tactic]["diff"]
    assert not tactics["fuse-row-reduction"]["applies"]
    assert tactics["fuse-row-reduction"]["reason"].startswith("no fusion tactic applies:")


def test_group_norm_does_not_fold_a_kernel_that_covers_part_of_the_tensor():
    """The fold needs the consumer to cover every element (its bound is the tensor's numel); otherwise it stays a
    separate launch after the generated kernel."""
    p = problem(KERNELS / "kb62_matmul_groupnorm_leakyrelu_sum")
    src = p.kernel_source.replace("n = y.numel()", "n = y.numel() // 2")
    assert src != p.kernel_source
    cand = propose("fuse-group-norm", p, src)[-1]
    assert "folded in" not in cand.description and "leaky_relu_double_kernel[" in cand.source
    assert "def group_norm_kernel(" in cand.source


_AUTOTUNE_RUN = r"""
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("cand", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
tuner = mod.matmul_bias_kernel
times = iter([3.0, 1.0, 3.0, 3.0] + [3.0] * 16)  # the second config (the widest column tile) wins


def bench(fn, quantiles=None):  # every config runs once on the real buffers, as a GPU's benchmark would
    fn()
    t = next(times)
    return [t, t, t]


tuner.do_bench = bench
torch.manual_seed(0)
model = mod.Model(64, 160)
x = torch.randn(24, 64)
with torch.no_grad():
    got = model(x)
    want = torch.logsumexp(x @ model.fc.weight.T + model.fc.bias, dim=1, keepdim=True)
print(len(tuner.configs), float((got - want).abs().max()), tuner.best_config.kwargs["BLOCK_SIZE_N"])
"""


@pytest.mark.slow  # about 12 s on 2 cores (two interpreter runs of every config): make test-slow
def test_split_partials_of_an_autotuned_kernel_survive_its_autotuner(tmp_path):
    """@triton.autotune runs every config on the same buffers before it picks one: a config with wider column
    tiles has fewer tiles than a narrower one, and slots only the narrower one wrote would be reduced too (on the
    H200 the autotune style's split candidate failed gate 2 so). Each tile of the split writes the reduction's
    identity into the slots no tile reduces into, so every config writes every slot. Run with the interpreter and a
    benchmark hook that runs each config once, as a GPU's would, and picks the widest tile; with torch filling the
    identity once instead, as the split did before, the result is wrong."""
    p = problem(ROOT / "tests" / "fixtures" / "styles" / "linear_logsumexp" / "autotune.py")
    src = propose("fuse-split-row-reduction", p)[-1].source
    assert "restore_value" not in src and "row_part = torch.empty(" in src
    fill = next(ln for ln in src.splitlines() if ln.lstrip().startswith("tl.store(") and "fill_slots" in ln)
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    errors = {}
    # as it was before: torch fills the identity once, and only the tiles' own slots are written
    stale = src.replace(fill + "\n", "").replace("), device=y.device, dtype=y.dtype)",
                                                  "), float('-inf'), device=y.device, dtype=y.dtype)", 1)
    stale = stale.replace("row_part = torch.empty(", "row_part = torch.full(")
    assert "row_part = torch.full((y.shape[0], triton.cdiv(y.shape[-1], 16)), float('-inf')," in stale
    for name, text in (("whole", src), ("stale", stale)):
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        out = subprocess.run([sys.executable, "-c", _AUTOTUNE_RUN, str(path)], capture_output=True, text=True,
                             timeout=600, env={**env, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)})
        assert out.returncode == 0, out.stderr[-2000:]
        n, err, chosen = out.stdout.split()
        assert int(n) >= 2 and chosen == "256", out.stdout  # several configs ran; the widest was chosen
        errors[name] = float(err)
    assert errors["whole"] < 1e-3 and errors["stale"] > 0.1, errors


def test_a_synchronize_or_an_assert_between_the_launch_and_its_epilogue_does_not_stop_the_fusion(verify):
    p = load_problem(FUSION / "gemm_sync_relu")
    (cand,) = propose("fuse-epilogue", p)
    assert "torch.relu" not in cand.source and "torch.cuda.synchronize()" in cand.source  # the sync stays
    assert 'assert K == w.shape[1], "shape mismatch"' in cand.source
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()
