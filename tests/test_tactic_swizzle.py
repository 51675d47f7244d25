"""The device_tuning stage's GROUP_SIZE_M swizzle tactic on the CPU interpreter, through the real verifier.

A 2D-grid GEMM becomes a 1D grid in grouped order (fixture with 5 x 3 tiles, so GROUP_SIZE_M=2 leaves a
short last group); a persistent tile loop gets the same grouped mapping; a 1D grid split by ``//`` and ``%``
(linear_groupnorm's direct.py of the style corpus, row- and column-major, other spellings) keeps its grid and
gets the mapping in place of the split, run on the interpreter against the unswizzled kernel on a ragged shape
(4 x 3 tiles of 32, partial last row, column and K step): bit for bit the same. Rewrites pass ``Verifier.verify``
with the KB's gate-1 constraints; GROUP_SIZE_M is a literal at the launch that the launch-parameter search
tunes; the starting value comes from the device's KB space; other shapes are left alone with a reason.
"""

from __future__ import annotations

import ast

import pytest

from stages.device_tuning import LaunchParamSearch
from xeforge.rewrite.tiling.configs import tunable_names
from stages.device_tuning_swizzle import GroupedTileOrder, group_size
from tests.conftest import tactic_context, FIXTURES, ROOT
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite import NotApplicable, blockio, persistent
from xeforge.rewrite.device_tuning import swizzle

KERNELS = ROOT / "kernels"
HERE = FIXTURES / "tactics" / "swizzle"
TACTIC = GroupedTileOrder()



def context(p, source: str | None = None, kind: str = "cpu", target: str | None = None):
    return tactic_context(p, source, kind, target, cores=20)


def with_group(source: str, group: int) -> str:
    """The swizzled source with GROUP_SIZE_M set to ``group`` at the launch (what the search would try)."""
    site = next(s for s in parse_kernel(source).launches if swizzle.PARAM in s.constexprs)
    from xeforge.rewrite.tiling.edit import LaunchEdit, edit_launch

    return edit_launch(source, LaunchEdit(site.kernel, site.line, set_kwargs={swizzle.PARAM: repr(group)}))


def test_2d_grid_becomes_a_grouped_1d_grid(verify):
    p = load_problem(HERE / "gemm_grid2d")
    ctx = context(p)
    app = TACTIC.check(ctx)
    assert app.applies and "1D grid" in app.reason, app.reason
    src = TACTIC.propose(ctx)[0].source
    model = parse_kernel(src)
    site = model.launches[0]
    assert site.constexprs[swizzle.PARAM] == group_size(ctx)[0]
    assert "lambda META: (triton.cdiv(M, META['BLOCK_M']) * triton.cdiv(N, META['BLOCK_N']),)" in src
    fn = model.functions["matmul_kernel"].node
    assert sum(isinstance(n, ast.Call) and ast.unparse(n.func) == "tl.program_id" for n in ast.walk(fn)) == 1
    # GROUP_SIZE_M=2 over 5 tile rows: groups of 2, 2 and a short one of 1
    verdict = verify(p, with_group(src, 2))
    assert verdict.correct, verdict.feedback()
    # the launch-parameter search can tune the group size and the blocks of the swizzled kernel
    names, _ = tunable_names(model, site)
    assert {swizzle.PARAM, "BLOCK_M", "BLOCK_N"} <= set(names)


def test_a_wrong_group_mapping_is_caught(verify):
    """The fixture's shapes see every tile: dropping the group's row offset must fail verification."""
    p = load_problem(HERE / "gemm_grid2d")
    src, _ = swizzle.rewrite(p.kernel_source, group=2)
    bad = src.replace("pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)",
                      "pid_m = (pid % num_pid_in_group) % group_size_m")
    assert bad != src
    assert not verify(p, bad).correct


def test_persistent_loop_gets_the_grouped_order(verify):
    p = load_problem(HERE / "gemm_grid2d")
    src, _ = persistent.rewrite(p.kernel_source)
    ctx = context(p, src)
    app = TACTIC.check(ctx)
    assert app.applies and "persistent tile loop" in app.reason, app.reason
    out = with_group(TACTIC.propose(ctx)[0].source, 2)
    assert "tile_id % num_pid_in_group" in out and "pid_m = tile_id % num_pid_m" not in out
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()


def test_search_candidates_on_the_swizzled_kernel_are_correct(verify):
    p = load_problem(HERE / "gemm_grid2d")
    src, _ = swizzle.rewrite(p.kernel_source, group=2)
    cands = LaunchParamSearch().propose(context(p, src))
    assert cands
    verdict = verify(p, cands[0].source)
    assert verdict.correct, (cands[0].description, verdict.feedback())


def test_group_size_comes_from_the_device_kb_space():
    p = load_problem(KERNELS / "gemm_relu")
    assert group_size(context(p, kind="xpu", target="arc-b580"))[0] == 4
    assert group_size(context(p, kind="cuda", target="h200"))[0] == 8
    cands = TACTIC.propose(context(p, kind="cuda", target="h200"))
    assert len(cands) >= 2 and cands[1].params.get("BLOCK_M") == 128  # the rewrite with the KB's tile seeds


def test_descriptor_kernel_can_be_swizzled_too(verify):
    p = load_problem(KERNELS / "gemm_relu")
    src, _ = blockio.rewrite(p.kernel_source)
    out = TACTIC.propose(context(p, src))[0].source
    assert "USE_BLOCK_IO=use_block_io" in out and f"{swizzle.PARAM}=" in out
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()


@pytest.mark.parametrize("folder,reason", [
    (KERNELS / "gemm_square", "already has a GROUP_SIZE_M swizzle"),
    (KERNELS / "vector_add", "no tl.dot"),
    (KERNELS / "flash_attn_fwd", "grid axis 1 (off_bh) is not a tile axis"),
], ids=["already-swizzled", "elementwise", "attention-batch-axis"])
def test_other_shapes_are_left_alone_with_a_reason(folder, reason):
    ctx = context(load_problem(folder))
    app = TACTIC.check(ctx)
    assert not app.applies and reason in app.reason, app.reason
    assert TACTIC.propose(ctx) == []


# ------------------------------------------------------------------------------------------------ 1D tile grids
GROUPNORM = FIXTURES / "styles" / "linear_groupnorm"
ROW_MAJOR_SPLIT = ("    num_pid_n = tl.cdiv(N, BLOCK_N)\n    pid_m = pid // num_pid_n\n    pid_n = pid % num_pid_n\n")
# M=100, N=72, K=40 on 32x32 tiles: 4 x 3 tiles, the last row and column partial, two K steps (the second partial)
RAGGED = dict(M=100, N=72, K=40, G=4)


def split_variant(split: str, source: str | None = None) -> str:
    """direct.py of linear_groupnorm with its program-id split (the three lines after ``pid = ...``) replaced."""
    source = source or (GROUPNORM / "direct.py").read_text()
    assert ROW_MAJOR_SPLIT in source
    return source.replace(ROW_MAJOR_SPLIT, split)


_INTERPRET = r"""
import importlib.util, sys, torch
import torch.nn.functional as F
out, M, N, K, G, paths = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6:]
empty = torch.empty


def poisoned(*args, **kwargs):
    t = empty(*args, **kwargs)
    return t.fill_(float("nan")) if t.is_floating_point() else t


torch.empty = poisoned
got = {}
for i, path in enumerate(paths):
    spec = importlib.util.spec_from_file_location(f"swizzle_1d_case{i}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    model = mod.Model(K, N, G)
    x = torch.randn(M, K)
    with torch.no_grad():
        y = model(x)
        ref = F.group_norm(F.linear(x, model.fc.weight, model.fc.bias), G, model.gn.weight, model.gn.bias,
                           model.gn.eps)
    got[path] = (y, ref)
torch.save(got, out)
"""


def run_on_interpreter(sources: dict[str, str], tmp_path, M: int, N: int, K: int, G: int) -> dict[str, tuple]:
    """Name -> (Model(K, N, G)(x), the torch reference) of each source on the CPU interpreter, all in one process of
    their own (Triton's interpreter state does not survive other tests' kernels in the test process), weights and
    input from one seed: two files give the same model. ``torch.empty`` gives NaN-filled tensors there, so a tile no
    program writes shows (freed memory of an earlier run could otherwise hold its right values)."""
    import os
    import subprocess
    import sys

    import torch

    paths = {}
    for name, source in sources.items():
        paths[name] = tmp_path / f"{name}.py"
        paths[name].write_text(source)
    out = tmp_path / "outputs.pt"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _INTERPRET, str(out), str(M), str(N), str(K), str(G),
                           *map(str, paths.values())], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    got = torch.load(out)
    return {name: got[str(path)] for name, path in paths.items()}


def assert_swizzle_keeps_the_output(source: str, tmp_path, groups=(2, 4)):
    """The unswizzled kernel against its swizzle at each GROUP_SIZE_M on the ragged shape: bit for bit the same
    (every tile computed once, by the same arithmetic), and the unswizzled one against torch."""
    import torch

    plans = {g: swizzle.rewrite(source, group=g) for g in groups}
    outs = run_on_interpreter({"start": source, **{f"group{g}": src for g, (src, _) in plans.items()}}, tmp_path,
                              **RAGGED)
    want, ref = outs["start"]
    torch.testing.assert_close(want, ref, rtol=1e-4, atol=1e-4)
    for g in groups:
        got = outs[f"group{g}"][0]
        assert torch.equal(got, want), (g, (got - want).abs().max())
    return list(plans.values())


def test_row_major_1d_grid_gets_the_grouped_order_and_keeps_its_grid(tmp_path):
    source = (GROUPNORM / "direct.py").read_text()
    (src, plan), _ = assert_swizzle_keeps_the_output(source, tmp_path)
    assert plan.form == "grid1d" and plan.order == "row-major"
    assert "row-major 1D grid" in plan.describe() and "the grid is left as it is" in plan.describe()
    assert (plan.pid_m, plan.pid_n, plan.num_m, plan.num_n) == ("pid_m", "pid_n", "tl.cdiv(M, BLOCK_M)", "num_pid_n")
    model = parse_kernel(src)
    site = model.launches[0]
    assert site.constexprs[swizzle.PARAM] == 2
    assert "gemm_bias_kernel[(triton.cdiv(M, 32) * triton.cdiv(N, 32),)](" in src  # the grid as it was
    assert "num_pid_m = tl.cdiv(M, BLOCK_M)" in src and "pid_m = pid // num_pid_n" not in src
    assert "group_id = pid // num_pid_in_group" in src
    # the comparison sees a wrong mapping: without the group's row offset, later groups redo the first rows
    import torch

    bad = src.replace("pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)",
                      "pid_m = (pid % num_pid_in_group) % group_size_m")
    assert bad != src
    outs = run_on_interpreter({"again": source, "bad": bad}, tmp_path, **RAGGED)
    want, got = outs["again"][0], outs["bad"][0]
    assert not torch.equal(got, want)


def test_column_major_1d_grid_groups_the_rows_too(tmp_path):
    """``pid_m = pid % num_pid_m``: the fast index is the row of the stored tile, so it is the grouped one."""
    source = split_variant("    num_pid_m = tl.cdiv(M, BLOCK_M)\n    pid_m = pid % num_pid_m\n"
                           "    pid_n = pid // num_pid_m\n")
    (src, plan), _ = assert_swizzle_keeps_the_output(source, tmp_path)
    assert plan.order == "column-major" and "column-major 1D grid" in plan.describe()
    assert (plan.pid_m, plan.pid_n, plan.num_m, plan.num_n) == ("pid_m", "pid_n", "num_pid_m", "tl.cdiv(N, BLOCK_N)")
    assert "num_pid_n = tl.cdiv(N, BLOCK_N)" in src and "pid_m = pid % num_pid_m" not in src


@pytest.mark.parametrize("split", [
    "    pid_m = pid // tl.cdiv(N, BLOCK_N)\n    pid_n = pid % tl.cdiv(N, BLOCK_N)\n",
    "    num_pid_n = (N + BLOCK_N - 1) // BLOCK_N\n    pid_n = pid % num_pid_n\n    pid_m = pid // num_pid_n\n",
    "    num_pid_m = tl.cdiv(M, BLOCK_M)\n    pid_n = pid // num_pid_m\n    pid_m = pid % num_pid_m\n",
], ids=["inline-count", "ceil-div-count-mod-first", "column-major-div-first"])
def test_other_spellings_of_the_split(split, tmp_path):
    assert_swizzle_keeps_the_output(split_variant(split), tmp_path, groups=(2,))


def test_an_int64_program_id_keeps_its_cast(tmp_path):
    source = (GROUPNORM / "direct.py").read_text().replace("pid = tl.program_id(0)\n",
                                                          "pid = tl.program_id(0).to(tl.int64)\n")
    (src, _), = assert_swizzle_keeps_the_output(source, tmp_path, groups=(4,))
    assert "pid = tl.program_id(0).to(tl.int64)" in src


def test_the_1d_grid_tactic_passes_the_verifier(verify):
    p = load_problem(GROUPNORM / "direct.py")
    ctx = context(p)
    app = TACTIC.check(ctx)
    assert app.applies and "row-major 1D grid" in app.reason, app.reason
    verdict = verify(p, with_group(TACTIC.propose(ctx)[0].source, 2))
    assert verdict.correct, verdict.feedback()


def _host_count(source: str) -> str:
    """The column count computed on the host and passed as a kernel argument."""
    source = split_variant("    pid_m = pid // num_pid_n\n    pid_n = pid % num_pid_n\n", source)
    source = source.replace("stride_ym, stride_yn,\n", "stride_ym, stride_yn, num_pid_n,\n", 1)
    return source.replace("y.stride(0), y.stride(1),\n", "y.stride(0), y.stride(1), triton.cdiv(N, 32),\n", 1)


@pytest.mark.parametrize("edit,reason", [
    (_host_count, "the tile count num_pid_n is a kernel argument computed on the host (the launch passes "
                  "triton.cdiv(N, 32))"),
    (lambda s: s.replace("[(triton.cdiv(M, 32) * triton.cdiv(N, 32),)]", "[(triton.cdiv(M, 32) * triton.cdiv(K, 32),)]"),
     "is not the product of the two tile counts tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)"),
    (lambda s: s.replace("[(triton.cdiv(M, 32) * triton.cdiv(N, 32),)]", "[(triton.cdiv(M, 32),)]"),
     "is tl.cdiv(M, BLOCK_M) in kernel terms, not the product of the two tile counts"),
    (lambda s: s.replace("num_pid_n = tl.cdiv(N, BLOCK_N)", "num_pid_n = tl.cdiv(N, BLOCK_M)"),
     "is cdiv(N, BLOCK_M), but pid_n = pid % count tiles N by BLOCK_N"),
    (lambda s: s.replace("pid_n = pid % num_pid_n", "pid_n = (pid - pid_m * num_pid_n) % num_pid_n"),
     "does not split pid into two tile indices"),
], ids=["host-count", "grid-not-the-product", "grid-short", "count-of-the-wrong-axis", "no-split"])
def test_1d_grids_that_do_not_fit_are_left_alone_with_a_reason(edit, reason):
    source = edit((GROUPNORM / "direct.py").read_text())
    with pytest.raises(swizzle.NotApplicable) as exc:
        swizzle.rewrite(source)
    assert reason in str(exc.value), str(exc.value)


HELPER_DOT = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _tile(a_ptr, b_ptr, K, offs_m, offs_n, BLOCK_K: tl.constexpr):
    acc = tl.zeros([16, 16], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        acc += tl.dot(tl.load(a_ptr + offs_m[:, None] * K + offs_k[None, :]),
                      tl.load(b_ptr + offs_k[:, None] * 16 + offs_n[None, :]))
    return acc


@triton.jit
def outer(a_ptr, b_ptr, c_ptr, K, BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * 16 + tl.arange(0, 16)
    offs_n = tl.arange(0, 16)
    acc = _tile(a_ptr, b_ptr, K, offs_m, offs_n, BLOCK_K)
    tl.store(c_ptr + offs_m[:, None] * 16 + offs_n[None, :], acc)


class Model(torch.nn.Module):
    def forward(self, a, b):
        c = torch.empty(a.shape[0], 16, device=a.device, dtype=torch.float32)
        outer[(a.shape[0] // 16,)](a, b, c, a.shape[1], BLOCK_K=16)
        return c
'''


def test_a_dot_in_a_jit_helper_is_named_not_denied():
    """The tutorial attention's form: the kernel's tl.dot lives in a jit helper. Split-K and the swizzle rewrite a
    loop of the kernel itself, and their reasons say where the tl.dot is instead of that there is none."""
    from xeforge.rewrite.device_tuning import splitk_plan

    model = parse_kernel(HELPER_DOT)
    with pytest.raises(NotApplicable, match="outer's tl.dot is in its jit helper _tile, whose loop grouped ordering"):
        swizzle.plan_swizzle(model, "outer", 8)
    with pytest.raises(NotApplicable, match="outer's tl.dot is in its jit helper _tile, whose loop split-K"):
        splitk_plan.find(HELPER_DOT)
