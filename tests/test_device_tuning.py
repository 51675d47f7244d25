"""The launch-parameter search: which constexprs it may change, and grids that follow the block sizes."""

from __future__ import annotations

import ast

import pytest

from stages.device_tuning import LaunchParamSearch, target_site
from xeforge.rewrite.tiling.configs import tunable_names
from tests.conftest import ROOT, tactic_context
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem

KERNELS = ROOT / "kernels"


def test_blocks_of_a_1d_tile_grid_are_tunable_and_each_factor_follows_its_block():
    """``grid = (cdiv(M, 128) * cdiv(N, 128),)`` with the kernel splitting program_id(0) into tile rows and columns
    (here through a GROUP_SIZE_M swizzle): each cdiv factor is matched to its block by the tile axis it bounds."""
    from xeforge.rewrite.tiling.configs import apply_config

    p = load_problem(KERNELS / "gemm_square")
    m = parse_kernel(p.kernel_source)
    names, why = tunable_names(m, target_site(m))
    assert {"BLOCK_M", "BLOCK_N", "BLOCK_K"} <= set(names), why
    out = apply_config(p.kernel_source, "matmul_kernel", {"BLOCK_M": 64, "BLOCK_N": 256})
    assert "grid = (triton.cdiv(M, 64) * triton.cdiv(N, 256),)" in out
    assert "BLOCK_M=64, BLOCK_N=256" in out
    # a factor whose size is not a kernel argument cannot be matched: left alone, and the reason says why
    odd = p.kernel_source.replace("triton.cdiv(N, 128)", "triton.cdiv(N + 0, 128)")
    m = parse_kernel(odd)
    names, why = tunable_names(m, target_site(m))
    assert "BLOCK_M" in names and "BLOCK_N" not in names
    assert "cannot follow" in why["BLOCK_N"] and "N + 0 is not an argument" in why["BLOCK_N"]


def test_a_config_on_a_1d_tile_grid_passes_the_verifier_and_a_swapped_grid_does_not(verify):
    """The direct style of the GEMM + GroupNorm problem (a literal 1D grid ``cdiv(M, 32) * cdiv(N, 32)``): a
    configuration with different row and column blocks verifies; the same one with the grid's factors swapped
    (fewer programs than tiles at the ci shape) is caught, so the check can fail."""
    from xeforge.rewrite.tiling.configs import apply_config

    p = load_problem(ROOT / "tests" / "fixtures" / "styles" / "linear_groupnorm" / "direct.py")
    out = apply_config(p.kernel_source, "gemm_bias_kernel", {"BLOCK_M": 64, "BLOCK_N": 16, "BLOCK_K": 16})
    assert "triton.cdiv(M, 64) * triton.cdiv(N, 16)" in out and "BLOCK_M=64, BLOCK_N=16, BLOCK_K=16" in out
    assert verify(p, out).correct
    swapped = out.replace("triton.cdiv(M, 64) * triton.cdiv(N, 16)", "triton.cdiv(M, 16) * triton.cdiv(N, 64)")
    assert not verify(p, swapped).correct


def test_candidates_resize_the_grid_with_the_blocks():
    p = load_problem(KERNELS / "gemm_relu")
    ctx = tactic_context(p, kind="cuda", target="h200")
    cands = LaunchParamSearch().propose(ctx)
    assert cands
    for c in cands:
        m = parse_kernel(c.source)
        site = target_site(m) or next(s for s in m.launches if s.kernel == "matmul_kernel")
        fn = next(f for f in ast.walk(m.tree) if isinstance(f, ast.FunctionDef) and f.name == site.function)
        grid = next(a.value for a in ast.walk(fn) if isinstance(a, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "grid" for t in a.targets))
        lits = [call.args[1].value for call in ast.walk(grid) if isinstance(call, ast.Call) and len(call.args) == 2]
        assert lits == [site.constexprs["BLOCK_M"], site.constexprs["BLOCK_N"]], c.description


def test_the_kb_seeds_come_first():
    """With a small budget the search must still try the configurations the knowledge base says are good."""
    p = load_problem(KERNELS / "gemm_relu")
    ctx = tactic_context(p, kind="cuda", target="h200")
    space = ctx.kb.space("h200", "gemm", ctx.triton)
    cands = LaunchParamSearch().propose(ctx)
    seeds = space.seeds
    assert seeds and len(cands) >= len(seeds)
    first = cands[0].params
    assert first["BLOCK_M"] == seeds[0]["block_m"] and first["BLOCK_N"] == seeds[0]["block_n"]
    assert first["num_warps"] == seeds[0]["num_warps"]


def test_a_kernel_that_spills_tries_a_smaller_accumulator_per_warp_first():
    """The incumbent at 128 x 256 / 8 warps spilled (its compiler facts say so): the seeds as large as it (its own tile
    with 4 stages, 256 x 128 / 8 warps, 128 x 128 / 4 warps) would spill too, so 128 x 128 / 8 warps comes first and the check says why.
    Without spills the KB's seed order stands, so the reordering is the facts' doing."""
    from xeforge.rewrite.tiling.configs import apply_config

    p = load_problem(KERNELS / "gemm_relu")
    big = apply_config(p.kernel_source, "matmul_kernel", {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64,
                                                          "num_warps": 8, "num_stages": 3})
    ctx = tactic_context(p, big, kind="cuda", target="h200")
    plain = [c.params for c in LaunchParamSearch().propose(ctx)]
    seed = next(s for s in ctx.kb.space("h200", "gemm", ctx.triton).seeds
                if (s["block_m"], s["block_n"], s["num_stages"]) != (128, 256, 3))  # the KB's first but the incumbent
    assert (plain[0]["BLOCK_M"], plain[0]["BLOCK_N"], plain[0]["num_warps"], plain[0]["num_stages"]) == \
        (seed["block_m"], seed["block_n"], seed["num_warps"], seed["num_stages"])
    facts = {"regs": 255, "spills": 46, "num_warps": 8, "num_stages": 3}
    ctx.diagnosis = {"available": True, "kernels": [{"kernel": "matmul_kernel", "facts": facts}], "findings": []}
    assert "spills 46 registers" in LaunchParamSearch().check(ctx).reason
    first = [c.params for c in LaunchParamSearch().propose(ctx)]
    per_warp = [c["BLOCK_M"] * c["BLOCK_N"] / c.get("num_warps", 8) for c in first]
    assert per_warp[0] < 128 * 256 / 8 and (first[0]["BLOCK_M"], first[0]["BLOCK_N"]) == (128, 128)
    assert per_warp == sorted(per_warp, key=lambda v: v >= 128 * 256 / 8)  # every smaller one before the rest
    ctx.diagnosis["kernels"][0]["facts"]["spills"] = 0
    assert [c.params for c in LaunchParamSearch().propose(ctx)] == plain


def test_after_a_per_shape_dispatch_the_search_tunes_the_branch_the_primary_shape_takes():
    """gemm_relu with a dispatch as per-shape-config writes it (``if M <= 256:`` a few-rows launch, else the primary
    shape's): the search targets the else branch, which the traces saw run at bench-gpu (M = 4096), and changes it
    alone, its grid following; the few-rows branch and its grid stay as they were. Before, the search took the first
    launch by line and no configuration applied to a kernel launched from two places."""
    from xeforge.rewrite import NotApplicable
    from xeforge.rewrite.tiling.configs import apply_config

    p = load_problem(KERNELS / "gemm_relu")
    src = p.kernel_source
    launch = src[src.index("        grid = (triton.cdiv(M, 32)"):src.index("        y = torch.empty_like(c)")]
    few = launch.replace("grid", "grid_s").replace("triton.cdiv(M, 32), triton.cdiv(N, 32)",
                                                    "triton.cdiv(M, 16), triton.cdiv(N, 64)")
    few = few.replace("BLOCK_M=32, BLOCK_N=32", "BLOCK_M=16, BLOCK_N=64")
    indent = lambda text: "".join("    " + ln + "\n" for ln in text.splitlines())  # noqa: E731
    dispatch = "        if M <= 256:\n" + indent(few) + "        else:\n" + indent(launch)
    src = src.replace(launch, dispatch)
    ctx = tactic_context(p, src, kind="cuda", target="h200")
    site = target_site(ctx.model, "bench-gpu")
    assert site.line > src[:src.index("        else:")].count("\n") + 1 and site.constexprs["BLOCK_M"] == 32
    assert target_site(ctx.model).constexprs["BLOCK_M"] == 16  # by line alone: the few-rows branch
    cands = LaunchParamSearch().propose(ctx)
    assert cands, LaunchParamSearch().check(ctx).reason
    for c in cands:
        head, tail = c.source.split("        else:\n")
        assert head == src.split("        else:\n")[0], c.description  # the few-rows branch as it was
        bm, bn = c.params.get("BLOCK_M", 32), c.params.get("BLOCK_N", 32)
        assert f"grid = (triton.cdiv(M, {bm}), triton.cdiv(N, {bn}))" in tail, c.description
    # one grid variable for both branches: changing its blocks would change the other launch's grid too
    shared = src.replace("grid_s = (triton.cdiv(M, 16), triton.cdiv(N, 64))",
                         "grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))").replace("[grid_s]", "[grid]")
    shared = shared.replace("BLOCK_M=16, BLOCK_N=64", "BLOCK_M=32, BLOCK_N=32")
    ctx = tactic_context(p, shared, kind="cuda", target="h200")
    params = [c.params for c in LaunchParamSearch().propose(ctx)]
    assert all(c.get("BLOCK_M", 32) == 32 and c.get("BLOCK_N", 32) == 32 for c in params)
    line = target_site(ctx.model, "bench-gpu").line
    with pytest.raises(NotApplicable, match="serves another launch too"):
        apply_config(shared, "matmul_kernel", {"BLOCK_M": 64}, line=line)
    assert "num_warps=8" in apply_config(shared, "matmul_kernel", {"num_warps": 8}, line=line).split("else:")[1]

GRID_VAR = """import triton
import triton.language as tl


@triton.jit
def k(x_ptr, M, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, 1.0, mask=offs < M)


def f(x, M):
    bs = 64
    grid = (triton.cdiv(M, bs),)
    shape = (3, 4)
    k[grid](x, M, BLOCK=bs)
"""


def test_a_config_follows_the_grid_variable_and_the_block_variable():
    """``BLOCK=bs`` with ``grid = (cdiv(M, bs),)``: a new block size is written at the launch and in the grid (found
    by name, not position), other tuples and the variable's own line left alone."""
    from xeforge.rewrite.tiling.configs import apply_config

    m = parse_kernel(GRID_VAR)
    assert tunable_names(m, m.launches[0]) == (["BLOCK"], {})
    out = apply_config(GRID_VAR, "k", {"BLOCK": 128})
    assert "grid = (triton.cdiv(M, 128),)" in out and "shape = (3, 4)" in out and "bs = 64" in out
    assert "k[grid](x, M, BLOCK=128)" in out
    used = GRID_VAR.replace("    shape = (3, 4)\n", "    shape = (bs, 4)\n")
    names, why = tunable_names(parse_kernel(used), parse_kernel(used).launches[0])
    assert names == [] and "also read at line 14" in why["BLOCK"]


OVER = ("variant ci@bfloat16: raised: OutOfResources: out of resource: shared memory, Required: 240000, "
        "Hardware limit: 232448. Reducing block sizes or `num_stages` may help.")


def _launch_option(source: str, name: str):
    m = parse_kernel(source)
    return next(s.options.get(name) for s in m.launches if s.kernel == "matmul_kernel")


def test_fit_stages_keeps_the_tile_and_drops_just_enough_stages():
    from xeforge.rewrite.tiling.configs import fit_stages

    src = load_problem(KERNELS / "gemm_square").kernel_source
    assert _launch_option(src, "num_stages") == 3
    new, how = fit_stages(src, OVER, elem_bytes=2)
    # 128x128x32 bf16: 16 KB per stage; 240000 B at 3 stages leaves 190848 B that are not stages -> 2 fit
    assert how["num_stages"] == 2 and how["estimate"] <= 232448
    assert _launch_option(new, "num_stages") == 2
    assert parse_kernel(new).launches[0].constexprs == parse_kernel(src).launches[0].constexprs
    assert fit_stages(src, "RuntimeError: something else") is None
    assert fit_stages(src, OVER.replace("240000", "999999")) is None  # not even one stage fits: no candidate


def _dispatched(src: str) -> str:
    """gemm_square's launch behind a per-shape dispatch: a decode branch of 16-row tiles, then the launch as it was."""
    launch = src[src.index("        matmul_kernel[grid]"):src.index("        return c")]
    small = launch.replace("BLOCK_M=128", "BLOCK_M=16").replace("num_stages=3", "num_stages=5")
    branches = ("        if M <= 128:\n" + small.replace("\n        ", "\n            ").replace("        matmul", "            matmul", 1)
                + "        else:\n" + launch.replace("\n        ", "\n            ").replace("        matmul", "            matmul", 1))
    return src.replace(launch, branches)


def test_fit_stages_changes_the_branch_the_failure_names_after_a_dispatch():
    """A per-shape dispatch launches the GEMM twice: the shared-memory refit changes the launch on the line the
    worker's failure names (the large tile's branch), not the decode branch, and refits nothing when no line tells."""
    from xeforge.rewrite.tiling.configs import fit_stages

    src = _dispatched(load_problem(KERNELS / "gemm_square").kernel_source)
    sites = [s for s in parse_kernel(src).launches if s.kernel == "matmul_kernel"]
    assert [s.options.get("num_stages") for s in sites] == [5, 3]
    failure = f"{OVER} (at candidate.py:{sites[1].line}: `matmul_kernel[grid](a, b, c, ...`)"
    new, how = fit_stages(src, failure, elem_bytes=2)
    assert how["num_stages"] == 2
    assert [s.options.get("num_stages") for s in parse_kernel(new).launches if s.kernel == "matmul_kernel"] == [5, 2]
    assert fit_stages(src, OVER, elem_bytes=2) is None  # two launches and no line: which one failed is unknown
    # the line is read in the source that failed and the launch found at the same place in a rewritten one
    shifted = "# one line more\n" + src
    again, _ = fit_stages(shifted, failure, elem_bytes=2, failed_source=src)
    assert [s.options.get("num_stages") for s in parse_kernel(again).launches if s.kernel == "matmul_kernel"] == [5, 2]


def test_rules_engine_retries_a_shared_memory_failure_with_fewer_stages():
    from stages.base import Candidate
    from tests.conftest import run_rules_stage

    p = load_problem(KERNELS / "gemm_square")
    ctx = tactic_context(p, kind="cuda", target="h200")
    first = Candidate(ctx.source, "fixed", "as launched", kind="search", params={"num_stages": 3})
    rec, seen = run_rules_stage(ctx, [first], lambda src: _launch_option(src, "num_stages") != 3, failure=OVER)
    assert len(seen) == 2 and _launch_option(seen[1].source, "num_stages") == 2
    assert "num_stages 3 -> 2" in seen[1].description and seen[1].params["num_stages"] == 2
    assert rec.best is not None and rec.best.candidate is seen[1]


def test_a_gemv_without_tl_dot_is_tuned_from_the_gemv_space_not_with_gemm_tiles():
    """gemv_decode is declared a gemm problem, but its kernel reduces with tl.sum: GEMM tiles (64-256 outputs a
    program) left it 32-64 programs for 132 SMs on the H200 (0.27-0.59x in the suite run); the gemv space's small
    output blocks come first now. An epilogue kernel of a gemm problem is classified by its own body."""
    from xeforge.rewrite.tiling.configs import kernel_family

    p = load_problem(KERNELS / "gemv_decode")
    m = parse_kernel(p.kernel_source)
    assert kernel_family(m, m.functions["gemv_kernel"], p.spec.kind) == "gemv"
    k9 = load_problem(KERNELS / "kb09_matmul_subtract_multiply_relu")
    m9 = parse_kernel(k9.kernel_source)
    assert kernel_family(m9, m9.functions["matmul_bias_kernel"], "gemm") == "gemm"
    assert kernel_family(m9, m9.functions["sub_mul_relu_kernel"], "gemm") == "elementwise"
    ctx = tactic_context(p, kind="cuda", target="h200")
    cands = LaunchParamSearch().propose(ctx)
    assert cands and "BLOCK_N=8, BLOCK_K=512" in cands[0].description
    for c in cands:
        site = next(s for s in parse_kernel(c.source).launches if s.kernel == "gemv_kernel")
        assert site.constexprs["BLOCK_N"] <= 32  # never a GEMM tile


HOST_WARPS = '''import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


class Model(torch.nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        n = x.numel()
        num_warps = 4 if n < 4096 else 8
        add_kernel[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64, num_warps=num_warps)
        return out
'''


def test_warps_computed_on_the_host_are_not_called_default():
    from stages.device_tuning import _detect_defaults

    p = load_problem(ROOT / "tests" / "fixtures" / "problems" / "vadd")
    issues = _detect_defaults(tactic_context(p, HOST_WARPS))
    codes = {i.code for i in issues}
    assert "default-warps" not in codes, [i.message for i in issues]
    computed = next(i for i in issues if i.code == "host-computed-warps")
    assert "num_warps=num_warps" in computed.message and "changes with the shape" in computed.message


def test_a_block_the_host_computes_leaves_the_launch_options_to_search(verify):
    """softmax sizes its block from the row (BLOCK = next_power_of_2(n_cols)): the block stays the user's, and the
    search still tries num_warps / num_stages at the launch (each candidate verified)."""
    p = load_problem(ROOT / "kernels" / "softmax")
    ctx = tactic_context(p, kind="cuda", target="h200", cores=132)  # the KB's H200 space (the CPU's has no warps)
    app = LaunchParamSearch().check(ctx)
    assert app.applies and "the launch options" in app.reason and "BLOCK=BLOCK changes with the shape" in app.reason
    cands = LaunchParamSearch().propose(ctx)
    assert cands and all(set(c.params) <= {"num_warps", "num_stages", "grf_mode", "warp_size"} for c in cands)
    for c in cands:
        assert "BLOCK = triton.next_power_of_2(n_cols)" in c.source
        verdict = verify(p, c.source)
        assert verdict.correct, verdict.feedback()


def test_the_search_tries_no_warps_the_host_heuristic_already_gives_and_no_stages_for_a_one_pass_kernel():
    """fused_add_rmsnorm on an H100 (2026-12-06): with a budget of 2, the search spent one trial on num_warps=8,
    num_stages=1, which is what its `_num_warps(BLOCK)` heuristic gives at the primary shape, and num_stages is
    nothing to a kernel without a loop: 0.996x, a trial for nothing. The traces say what the heuristic gives."""
    from tests.realworld import problem_dir

    ctx = tactic_context(load_problem(problem_dir("fused_add_rmsnorm")), kind="cuda", target="h200", cores=132)
    proposed = [c.params for c in LaunchParamSearch().propose(ctx)]
    assert proposed and all("num_stages" not in p for p in proposed), proposed
    assert {"num_warps": 8} not in proposed and all(p.get("num_warps") != 8 for p in proposed), proposed
    looping = tactic_context(load_problem(problem_dir("cross_entropy_fwd")), kind="cuda", target="h200", cores=132)
    assert any("num_stages" in c.params for c in LaunchParamSearch().propose(looping))  # its vocab loop pipelines


def test_the_search_sizes_shared_memory_for_the_widest_dtype_a_candidate_runs_in(tmp_path):
    """On an H100 four of matmul_config_by_m's launch-search trials (128 x 256 x 64, 3 stages) failed gate 0 at its
    float32 `ci`, out of shared memory: 288 KB of 227, sized for its bf16 bench shapes. A problem brought in with
    `xeforge new` runs `ci` in its bench dtype on a GPU now, as the suite's problems do, and the tile fits; a problem
    with a float32 shape to pass on the GPU keeps it out of the search."""
    import shutil

    from tests.realworld import problem_dir
    from xeforge.rewrite.tiling.configs import kb_rejects, widest_dtype

    wide = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}
    p = load_problem(problem_dir("matmul_config_by_m"))
    assert p.spec.variants["ci"].dtype == "float32"
    ci = p.correctness_variants("cuda")[0]
    assert ci.name == "ci@bfloat16" and ci.dtype is None and p.compute_dtype(ci) == "bfloat16"
    assert p.correctness_variants("cpu")[0].name == "ci"  # the interpreter still runs it in float32
    ctx = tactic_context(p, kind="cuda", target="h100", cores=132)
    fn = parse_kernel(p.kernel_source).functions["_linear_kernel"]
    assert widest_dtype(ctx) == "bfloat16" and not kb_rejects(ctx, wide, fn)
    # a plan made on the interpreter for a GPU target sizes for that GPU's shapes, not the interpreter's float32 ci
    assert widest_dtype(tactic_context(p, kind="cpu", target="arc-b580")) == "bfloat16"

    folder = tmp_path / "gemm_square"
    shutil.copytree(KERNELS / "gemm_square", folder)
    spec = folder / "spec.yaml"
    text = spec.read_text()
    block = text[text.index("bench-gpu:"):text.index("bench-gpu-1:")]
    fp32 = "\n".join(ln for ln in block.splitlines() if not ln.startswith("#")).replace("bench-gpu:", "bench-gpu-9:", 1) \
        .replace("dtype: bfloat16", "dtype: float32")
    spec.write_text(text + "\n" + fp32 + "\n")
    q = load_problem(folder)
    qctx = tactic_context(q, kind="cuda", target="h100", cores=132)
    qfn = parse_kernel(q.kernel_source).functions["matmul_kernel"]
    assert widest_dtype(qctx) == "float32"
    assert kb_rejects(qctx, wide, qfn)


def test_program_ids_read_inline_by_keyword_tie_the_grid_to_the_blocks(verify):
    """``tl.program_id(axis=0) * TM`` with no ``pid = ...`` line: the grid's literal 16s are each block's, so the
    blocks are searchable (they were left alone as "an index computation the search cannot follow"), and a larger
    tile with its grid verifies."""
    from tests.conftest import FIXTURES
    from xeforge.rewrite.tiling.configs import apply_config

    p = load_problem(FIXTURES / "tactics" / "block_io" / "inline_program_ids")
    m = parse_kernel(p.kernel_source)
    names, why = tunable_names(m, target_site(m))
    assert {"TM", "TN", "TK"} <= set(names), why
    out = apply_config(p.kernel_source, "gemm_bias", {"TM": 32, "TN": 64})
    assert "grid = (triton.cdiv(x.shape[0], 32), triton.cdiv(w.shape[0], 64))" in out, out
    assert verify(p, out).correct


def test_the_second_launch_is_searched_on_a_gpu_and_its_candidates_verify(verify):
    """A forward with two launches (gemm_tall_k after split-K: the split GEMM and splitk_sum_kernel, sized by the
    host's rule): the first search tunes the GEMM, the second the summing kernel; on the interpreter it does not
    apply. On an H100 (2026-12-07) the read-back epilogues' generated second pass, sized by its host rule alone, took
    0.029 ms at 4096^3 against torch.compile's 0.020."""
    from stages.device_tuning import STAGE, SecondLaunchSearch
    from stages.device_tuning_splitk import SplitK

    p = load_problem(KERNELS / "gemm_tall_k")
    (split, *_) = SplitK().propose(tactic_context(p))
    tactic = SecondLaunchSearch()
    assert [t.name for t in STAGE.tactics][-1] == tactic.name
    cpu = tactic_context(p, split.source)
    assert not tactic.check(cpu).applies and tactic.propose(cpu) == []
    gpu = tactic_context(p, split.source, kind="cuda", target="h200", cores=132)
    app = tactic.check(gpu)
    assert app.applies and app.reason.startswith("splitk_sum_kernel at line"), app.reason
    assert target_site(gpu.model).kernel != "splitk_sum_kernel"  # the first search's launch is the GEMM's
    cands = tactic.propose(gpu)
    assert cands and all(c.description.startswith("splitk_sum_kernel: ") for c in cands)
    narrow = next(c for c in cands if c.params.get("BLOCK_N") == 32)
    verdict = verify(p, narrow.source)
    assert verdict.correct, verdict.feedback()
    # one kernel: nothing for it
    one = tactic_context(p, kind="cuda", target="h200", cores=132)
    assert not tactic.check(one).applies and "no second launch" in tactic.check(one).reason
