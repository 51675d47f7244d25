"""The device_tuning stage's rows-per-program tactic on the CPU interpreter, through the real verifier.

The rewrite applies to rotary (one program per (b, s, h) vector), to the flat elementwise kernels of the suite
(a "row" is then one block), and to a fixture with the codemod's edge cases (per-row scalar loads, positional
masks, hinted aranges, a grid variable). Rewrites pass ``Verifier.verify`` on ci and on the ragged shapes, whose
row counts are not multiples of ROWS. A kernel that reduces its short rows outside a loop (a log-softmax, a
LayerNorm that stores its mean) reduces axis 1 of the block instead. Kernels that reduce in a loop, index 2D tiles
or branch on the row are left alone with a reason, and ``xeforge port --dry-run`` lists the tactic for rotary.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from stages import device_tuning
from stages.device_tuning_rows import ELEMENTS, RowsPerProgram
from tests.conftest import FIXTURES, ROOT, problem_folder, tactic_context
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.device_tuning import rows

KERNELS = ROOT / "kernels"
ROW_SCALE = FIXTURES / "tactics" / "rows" / "row_scale"
TACTIC = RowsPerProgram()


def rewritten(p, source: str | None = None):
    ctx = tactic_context(p, source)
    app = TACTIC.check(ctx)
    assert app.applies, app.reason
    cands = TACTIC.propose(ctx)
    assert len(cands) == 1 and cands[0].kind == "rewrite"  # the interpreter gets the default ROWS only
    return cands[0]


def row_counts(p, kernel: str) -> list[tuple[str, int]]:
    """(variant, rows) of every variant the correctness gate runs, from forward's grid expression."""
    from xeforge.rewrite.memory import launch_facts
    from xeforge.rewrite.tiling.grid import single_launch

    model = parse_kernel(p.kernel_source)
    site = single_launch(model, kernel)
    ci = p.variant("ci")
    return [(v.name, launch_facts(model, site, p, v)[1][0]) for v in [ci, *p.ragged_variants(ci)]]


@pytest.mark.slow  # about 30 s: every correctness shape of rotary on the interpreter
def test_rotary_is_batched_and_correct_on_ragged_row_counts(verify):
    p = load_problem(KERNELS / "rotary")
    cand = rewritten(p)
    src, r = cand.source, cand.params["ROWS"]
    assert "pid = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]" in src
    assert "row_ok = pid < N_ROWS" in src and "j = tl.arange(0, BLOCK_HALF)[None, :]" in src
    assert src.count("mask=mask & row_ok") == 8
    assert f"rotary_kernel[(triton.cdiv(B * S * H, {r}),)]" in src and f"N_ROWS=B * S * H, ROWS={r}" in src
    counts = row_counts(p, "rotary_kernel")
    assert any(n % r for _, n in counts), f"some variant must leave a partial last program: {counts}"
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()
    # the last, partial program must be computed: rounding the grid down leaves rows unwritten
    floor = src.replace(f"triton.cdiv(B * S * H, {r})", f"B * S * H // {r}")
    assert floor != src
    assert not verify(p, floor).correct, "the correctness gate must exercise a row count that ROWS does not divide"


@pytest.mark.parametrize("name", ["swiglu", "vector_add", "gemm_relu", "kb97_matmul_batchnorm_biasadd_divide_swish"])
def test_bundled_elementwise_kernels_stay_correct(verify, name):
    p = load_problem(KERNELS / name)
    cand = rewritten(p)
    assert "[:, None]" in cand.source and "[None, :]" in cand.source
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()


def test_codemod_edge_cases_are_correct(verify):
    p = load_problem(ROW_SCALE)
    src = rewritten(p).source
    body = src[src.index("def row_scale_kernel"):src.index("class Model")]
    assert "w = tl.load(w_ptr + pid, mask=row_ok)" in body  # a per-row scalar load gets the row mask, no `other`
    assert "b = tl.load(b_ptr + cols, m, 0.0)" in body  # the bias does not depend on the row: untouched
    assert "x = tl.load(x_ptr + pid * stride_x + cols, m & row_ok, 0.0)" in body  # positional mask
    assert "tl.store(w2_ptr + pid, w * w, mask=row_ok)" in body
    assert "tl.max_contiguous(tl.multiple_of(tl.arange(0, BLOCK_D), BLOCK_D), BLOCK_D)[None, :]" in body
    assert "grid = (triton.cdiv(R, 32),)" in src and "N_ROWS=R, ROWS=32" in src  # 37 rows: 32 + a partial 5
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_a_2d_grid_batches_the_rows_of_axis_0_and_keeps_axis_1(verify):
    """Axis 1 (column blocks, heads) stays a scalar program id; its conditions are not the row's."""
    p = load_problem(ROW_SCALE)
    src = rewritten(p, GRID_2D).source
    assert "grid = (triton.cdiv(R, 32), 1)" in src and "extra = tl.program_id(1)" in src
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_gpu_candidates_are_powers_of_two_sized_from_the_row(verify):
    p = load_problem(KERNELS / "rotary")
    ctx = tactic_context(p, kind="cuda", target="h200", cores=132)
    cands = TACTIC.propose(ctx)
    found = [(c.params["ROWS"], c.params["num_warps"]) for c in cands]
    assert found[0] == (32, 4) and cands[0].kind == "rewrite"  # 2048 elements a program, the launch's warps
    assert {c.kind for c in cands[1:]} == {"search"}
    assert sorted(found) == sorted((r, w) for r in (16, 32, 64, 128) for w in (4, 8))
    assert all(ELEMENTS[0] <= r * 64 <= ELEMENTS[-1] for r, _ in found)  # BLOCK_HALF=64 at bench-gpu
    # num_warps is appended where the launch had none; the interpreter ignores it but runs the kernel
    fixture = load_problem(ROW_SCALE)
    extra = TACTIC.propose(tactic_context(fixture, kind="cuda", target="h200"))
    eight = next(c for c in extra if c.params["num_warps"] == 8)
    assert "num_warps=8)" in eight.source
    verdict = verify(fixture, eight.source)
    assert verdict.correct, verdict.feedback()


def test_registered_in_device_tuning_after_the_launch_parameter_search():
    names = [t.name for t in device_tuning.STAGE.tactics]
    assert names.index("launch-params") < names.index("rows-per-program")
    # only the descriptors and the second launch's search after it
    assert names[names.index("rows-per-program") + 1:] == ["host-descriptors", "second-launch-params"]


SCALE = (ROW_SCALE / "kernel.py").read_text()
EARLY_RETURN = SCALE.replace("    m = cols < D\n", "    m = cols < D\n    if D == 0:\n        return\n")
ROW_LOOP = SCALE.replace("    tl.store(w2_ptr + pid, w * w)\n",
                         "    for i in range(pid % 2):\n        tl.store(w2_ptr + pid, w * w)\n")
CARRIED = SCALE.replace("    tl.store(out_ptr + pid * stride_o + cols, x * w + b, m)\n",
                        "    for i in range(2):\n        b = b + x\n"
                        "    tl.store(out_ptr + pid * stride_o + cols, b, m)\n")
ROW_BRANCH = SCALE.replace("    w = tl.load(w_ptr + pid)\n", "    w = tl.load(w_ptr + pid) if pid > 0 else 1.0\n")
GRID_2D = SCALE.replace("    pid = tl.program_id(0)\n", "    pid = tl.program_id(0)\n    extra = tl.program_id(1)\n") \
    .replace("m = cols < D\n", "m = cols < D + extra\n").replace("grid = (R,)", "grid = (R, 1)")
GRID_3D = SCALE.replace("    pid = tl.program_id(0)\n", "    pid = tl.program_id(0)\n    extra = tl.program_id(2)\n") \
    .replace("m = cols < D\n", "m = cols < D + extra\n").replace("grid = (R,)", "grid = (R, 1, 1)")
SHARED_STORE = SCALE.replace("tl.store(w2_ptr + pid, w * w)", "tl.store(w2_ptr + cols, w * w + b, m)")


@pytest.mark.parametrize("folder,source,reason", [
    (KERNELS / "softmax", None, "its rows of [8192] at bench-gpu fill a program already"),
    (KERNELS / "rmsnorm", None, "its rows of [8192] at bench-gpu fill a program already"),
    (KERNELS / "gemv_decode", None, "combines elements (tl.sum, line 23) in a way"),  # in its K loop
    (KERNELS / "flash_attn_fwd", None, "combines elements (tl.dot"),
    (KERNELS / "layernorm", None, "calls tl.zeros (line 14)"),
    (ROW_SCALE, GRID_3D, "reads program ids of axes [0, 2]"),
    (ROW_SCALE, EARLY_RETURN, "returns early"),
    (ROW_SCALE, ROW_LOOP, "a loop bound depends on the row"),
    (ROW_SCALE, CARRIED, "b is set per program before line"),
    (ROW_SCALE, ROW_BRANCH, "a condition depends on the row"),
    (ROW_SCALE, SHARED_STORE, "has an address that does not depend on the row"),
], ids=["softmax", "rmsnorm", "gemv", "attention", "layernorm", "3d-grid", "early-return", "row-loop", "carried",
        "row-branch", "shared-store"])
def test_unsupported_kernels_are_left_alone_with_a_reason(folder, source, reason):
    p = load_problem(folder)
    src = p.kernel_source if source is None else source
    ctx = tactic_context(p, src)
    app = TACTIC.check(ctx)
    assert not app.applies and reason in app.reason, app.reason
    assert TACTIC.propose(ctx) == []
    if "fill a program" not in reason:  # the codemod could batch them; the tactic's sizing says no
        with pytest.raises(NotApplicable):
            rows.rewrite(src, 16)
    assert ctx.source == src


def test_a_batched_kernel_is_not_batched_again():
    p = load_problem(KERNELS / "rotary")
    src = rewritten(p).source
    app = TACTIC.check(tactic_context(p, src))
    assert not app.applies and "already works on 2D blocks" in app.reason, app.reason


HELPER_BLOCKS = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _scale_rows(base, n_rows, row0, stride, scale, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    r = row0 + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_C)
    m = (r[:, None] < n_rows) & (c[None, :] < stride)
    v = tl.load(base + r[:, None] * stride + c[None, :], mask=m)
    tl.store(base + r[:, None] * stride + c[None, :], v * scale, mask=m)


@triton.jit
def scale_kernel(x_ptr, n_rows, stride, scale, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    _scale_rows(x_ptr, n_rows, pid * BLOCK_R, stride, scale, BLOCK_R, BLOCK_C)


class Model(torch.nn.Module):
    def forward(self, x):
        n, d = x.shape
        scale_kernel[(triton.cdiv(n, 4),)](x, n, d, 2.0, BLOCK_R=4, BLOCK_C=triton.next_power_of_2(d))
        return x
'''


def test_rows_a_jit_helper_already_blocks_are_named_as_its():
    """The kernel's rows are a helper's 2D block (several rows a program already): the reason says so and names
    the helper and the line, not the helper's loads as a blocker."""
    with pytest.raises(NotApplicable) as exc:
        rows.plan(HELPER_BLOCKS)
    why = str(exc.value)
    assert "already works on 2D blocks" in why and "jit helper _scale_rows" in why and "line 11" in why, why


def test_rows_must_be_a_power_of_two():
    p = load_problem(KERNELS / "rotary")
    plan = rows.plan(p.kernel_source)
    with pytest.raises(NotApplicable, match="power of two"):
        rows.apply_rows(p.kernel_source, plan, 12)
    ast.parse(rows.apply_rows(p.kernel_source, plan, 16))


def test_dry_run_lists_the_tactic_for_rotary(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "xeforge", "port", str(KERNELS / "rotary"), "--device", "cpu",
                           "--dry-run", "--stages", "device_tuning", "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "tactic rows-per-program: applies — rotary_kernel: ROWS rows per program" in proc.stdout
    assert "+++ rows-per-program" in proc.stdout  # the diff the tactic would make


ROW_REDUCE = """import torch
import triton
import triton.language as tl


@triton.jit
def _lsm_kernel(X, Y, MX, stride, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
    top = tl.max(x, 0)
    z = x - top
    total = tl.exp(z).sum(axis=0)
    tl.store(MX + row, top)
    tl.store(Y + row * stride + cols, z - tl.log(total), mask=mask)


class Model(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        mx = torch.empty(x.shape[0], device=x.device, dtype=torch.float32)
        _lsm_kernel[(x.shape[0],)](x, y, mx, x.stride(0), x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return y, mx
"""

ROW_REDUCE_REF = """import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.log_softmax(x.float(), dim=1), x.float().amax(dim=1)
"""

ROW_REDUCE_SPEC = """kind: reduction
inputs:
  x: {shape: [R, N], dtype: float32}
ci:
  - {params: [x], dims: {R: 37, N: 100}}
bench-gpu:
  - {params: [x], dims: {R: 8192, N: 128}}
"""


def test_row_reductions_are_batched_on_axis_1_and_correct(tmp_path, verify):
    """A log-softmax over short rows that also stores each row's max: its reductions (the tl. form with a
    positional axis and the method form) reduce axis 1 keeping it, the per-row scalar store is masked by row, and
    the batched kernel matches at 37 rows (a partial last program) and the ragged shapes."""
    p = problem_folder(tmp_path / "lsm", ROW_REDUCE, ROW_REDUCE_REF, ROW_REDUCE_SPEC)
    cand = rewritten(p)
    src, r = cand.source, cand.params["ROWS"]
    assert r * 128 <= ELEMENTS[-1] and r >= 2
    assert "top = tl.max(x, axis=1, keep_dims=True)" in src
    assert "total = tl.exp(z).sum(axis=1, keep_dims=True)" in src
    assert "tl.store(MX + row, top, mask=row_ok)" in src
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_a_reduction_in_a_loop_is_left_alone():
    looped = ROW_REDUCE.replace("    top = tl.max(x, 0)\n", "    top = 0.0\n    for _ in range(2):\n"
                                "        top = tl.max(x, 0)\n")
    assert looped != ROW_REDUCE
    with pytest.raises(NotApplicable, match=r"combines elements \(tl.max, line 14\) in a way"):
        rows.plan(looped)


def test_an_autotuned_row_reduction_is_batched_under_its_configs(tmp_path, verify):
    """The softmax of the style corpus, @triton.autotune'd over launch options: ROWS is set at the launch (no config
    sets it), no num_warps is added (the configs set it), and the batched kernel verifies."""
    styles = FIXTURES / "styles" / "softmax"
    p = problem_folder(tmp_path / "softmax_autotune", (styles / "autotune.py").read_text(),
                       (styles / "reference.py").read_text(), (styles / "spec.yaml").read_text())
    cand = rewritten(p)
    assert "@triton.autotune(" in cand.source and "ROWS=2" in cand.source  # 4096-wide rows at bench-gpu: two
    gpu = TACTIC.propose(tactic_context(p, kind="cuda", target="h200"))
    assert gpu and all("num_warps" not in c.params for c in gpu)
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()
