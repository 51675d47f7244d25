"""The device_tuning stage's per-shape-config tactic (issue 17, item 3): shape classes, coverage, the dispatch rewrite.

The tactic acts only where gate 3 times (a stand-in H200 here: ``tactic_context(kind="cuda")``); its dispatch rewrite is
run through the real verifier on the interpreter with a threshold that splits the CPU's correctness shapes, so both
branches run. Gate 3's side (every shape timed for these candidates) is in tests/test_shapes.py.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys

import pytest

from stages.base import Candidate, Stage, TrialOutcome
from stages.device_tuning import STAGE
from stages.device_tuning_shapes import CONFIGS_PER_CLASS, SWAPPED_PER_CLASS, PerShapeConfig, chain_coverage
from tests.conftest import FIXTURES, ROOT, tactic_context
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite.tiling import NotApplicable
from xeforge.rewrite.device_tuning import splitk
from xeforge.rewrite.device_tuning.swap_ab import swapped_branch
from xeforge.rewrite.tiling.configs import OPTION_KEYS, apply_config
from xeforge.rewrite.tiling.dispatch import Branch, dispatch, undispatch
from xeforge.verifier import Verdict

GEMM_RELU = ROOT / "kernels" / "gemm_relu"
STYLES = FIXTURES / "styles" / "linear_relu"
TACTIC = next(t for t in STAGE.tactics if t.name == "per-shape-config")

DECODE = """bench-gpu-1:
  - params: [X]
    dtype: bfloat16
    dims: {M: 16, K: 4096, N: 4096}
    flop: "2*M*N*K"
"""


def style_problem(tmp_path, style: str, extra: str = DECODE, ragged: str = "ragged: false"):
    """linear_relu in ``style`` as a problem of its own, timed at the spec's shapes plus ``extra``."""
    folder = tmp_path / style
    folder.mkdir()
    shutil.copy(STYLES / f"{style}.py", folder / "kernel.py")
    shutil.copy(STYLES / "reference.py", folder / "reference.py")
    (folder / "spec.yaml").write_text((STYLES / "spec.yaml").read_text().replace("ragged: false", extra + ragged))
    return load_problem(folder)


def h200(p, source=None):
    return tactic_context(p, source, kind="cuda", target="h200", cores=132)


def launches(source: str, kernel: str) -> list:
    return [s for s in parse_kernel(source).launches if s.kernel == kernel]


def test_registered_right_after_the_launch_parameter_search_and_swap_ab():
    """After the search (its trials are there to draw from) and after swap-ab (a swapped kernel that wins is the one
    whose tiles the dispatch picks per shape class)."""
    names = [t.name for t in STAGE.tactics]
    assert names.index("per-shape-config") == names.index("swap-ab") + 1 == names.index("launch-params") + 2


# ------------------------------------------------------------------------------------------------ where it does not act
def test_on_the_interpreter_it_does_not_apply_and_says_why():
    ctx = tactic_context(load_problem(GEMM_RELU))
    app = TACTIC.check(ctx)
    assert not app.applies and app.reason.startswith("nothing to rank on the interpreter")
    assert TACTIC.propose(ctx) == []


def test_one_timed_shape_gives_nothing_to_dispatch_on(tmp_path):
    app = TACTIC.check(h200(style_problem(tmp_path, "direct", extra="")))
    assert not app.applies and "one timed shape (bench-gpu)" in app.reason


def test_an_autotuned_kernel_gets_the_same_through_its_key(tmp_path):
    app = TACTIC.check(h200(style_problem(tmp_path, "autotune")))
    assert not app.applies and "@triton.autotune'd" in app.reason and "key (M, N, K)" in app.reason
    assert "line 14" in app.reason


# ------------------------------------------------------------------------------------------------ classes and candidates
def test_the_decode_shape_gets_a_class_and_candidates_that_keep_the_primary_launch():
    p = load_problem(GEMM_RELU)
    ctx = h200(p)
    app = TACTIC.check(ctx)
    assert app.applies, app.reason
    # M: 4096 (primary), 16 (decode), 3000: the threshold is the power of two below sqrt(16 * 3000)
    assert "M <= 128 for bench-gpu-1 (M=16; verified at ci@bfloat16, bench-gpu-1" in app.reason
    # M 3000 against 4096: less than 4x apart, and odd: a class of its own
    assert "M % 128 != 0 and M > 64 for bench-gpu-2 (M=3000; verified at bench-gpu-2)" in app.reason
    every = [c for c in TACTIC.propose(ctx) if "(bench-gpu-1)" in c.description]  # the odd class's are below
    cands = [c for c in every if not (c.params.get("swap_ab") or c.params.get("gemv") or "SPLIT_K" in c.params)]
    assert 0 < len(cands) <= CONFIGS_PER_CLASS
    original = ast.get_source_segment(p.kernel_source, launches(p.kernel_source, "matmul_kernel")[0].node)
    fn = parse_kernel(p.kernel_source).functions["matmul_kernel"]
    for c in cands:
        assert c.time_all_shapes and c.kind == "search" and "if M <= 128 (bench-gpu-1)" in c.description
        assert not ctx.kb.check_config(c.params, ctx.device_id, ctx.triton, fn), c.params
        sites = launches(c.source, "matmul_kernel")
        assert len(sites) == 2
        tree = parse_kernel(c.source).tree
        test = next(n for n in ast.walk(tree) if isinstance(n, ast.If))
        assert ast.unparse(test.test) == "M <= 128"
        # the else branch is the incumbent's launch, as written
        assert ast.unparse(test.orelse[0].value) == ast.unparse(ast.parse(original, mode="eval").body)
        branch = sites[0]
        grid = next(e for e in ast.walk(branch.node.func.slice) if isinstance(e, ast.Tuple))
        blocks = [call.args[1].value for call in grid.elts]
        assert blocks == [c.params["BLOCK_M"], c.params["BLOCK_N"]], c.description  # its own, consistent grid
    # the seeds of the device's space for few rows (narrow N tiles, long K steps) come first, not large-M tiles cut
    # to 16 rows; then the incumbent's tile fitted to the decode shape: 16 rows, the rest as it was
    few = ctx.kb.space(ctx.device_id, "gemm", ctx.triton, rows=16)
    assert few.max_rows and few.seeds
    seed = few.seeds[0]
    assert {k: cands[0].params[k.upper()] for k in ("block_m", "block_n", "block_k")} == \
        {k: seed[k] for k in ("block_m", "block_n", "block_k")}
    assert cands[0].params["num_stages"] == seed["num_stages"]
    assert any(c.params["BLOCK_M"] == 16 and c.params["BLOCK_N"] == 32 and c.params["BLOCK_K"] == 32 for c in cands)
    # and the class's first configurations again, its branch launching a swap-AB copy of the kernel
    swapped = [c for c in every if c.params.get("swap_ab")]
    assert 0 < len(swapped) <= SWAPPED_PER_CLASS
    for c in swapped:
        assert len(launches(c.source, "matmul_kernel")) == 1 and len(launches(c.source, "matmul_kernel_swapab")) == 1
        assert "def matmul_kernel_swapab(" in c.source and "a swap-AB copy" in c.description


def test_the_swapped_branch_verifies_at_the_shapes_it_serves(verify):
    """gemm_relu on the interpreter: ci (M=32) takes the incumbent's launch, the ragged M=31 and 17 the swapped copy
    with a 16-row tile."""
    p = load_problem(GEMM_RELU)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 16, "num_warps": 2}
    out = swapped_branch(dispatch(p.kernel_source, "matmul_kernel", [Branch("M <= 31", cfg)]), p.kernel_source,
                         "matmul_kernel", "M <= 31")
    assert "matmul_kernel_swapab[(triton.cdiv(M, 16), triton.cdiv(N, 64))](" in out
    assert "acc += tl.dot(tl.trans(b), tl.trans(a))" in out and out.count("tl.trans(acc)") == 1
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()


def test_a_class_of_few_tiles_gets_split_k_in_its_branch_only(verify):
    """gemm_square at M=16 has 32 output tiles of 128 x 128 for the 132 SMs of the stand-in H200: the class's
    candidates split K only there (`if M <= 128:` a split copy of the kernel and the summing kernel); every other
    shape launches the kernel as written (a SPLIT_K=1 specialization of the split kernel ran 5-8% slower at 4096^3
    on the H100). A threshold that splits the CPU's correctness shapes runs both sides through the verifier (the
    ragged M=17 split, ci's M=64 and the ragged 63 not)."""
    p = load_problem(ROOT / "kernels" / "gemm_square")
    ctx = h200(p)
    split = [c for c in TACTIC.propose(ctx) if "SPLIT_K" in c.params]
    assert [c.params["SPLIT_K"] for c in split] == [4, 2]  # 4 x 32 tiles: one wave of the 132 SMs
    for c in split:
        assert c.time_all_shapes and c.params["when"] == "M <= 128"
        assert f"if M <= 128:" in c.source and f"split_k = {c.params['SPLIT_K']}\n" in c.source
        assert "32 tiles at bench-gpu-1 for 132 cores" in c.description
    src = splitk.apply(p.kernel_source, splitk.find(p.kernel_source, p), 4, when="M <= 31")
    assert [s.kernel for s in parse_kernel(src).launches] == ["matmul_kernel_splitk", splitk.SUM_KERNEL,
                                                             "matmul_kernel"]
    at = p.kernel_source.index("def matmul_kernel(")
    original = p.kernel_source[at:p.kernel_source.index("\n\n\n", at)]
    assert original in src  # the kernel as written, for the other shapes
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_a_kernel_with_an_epilogue_gets_split_k_with_it_in_the_branch(verify):
    """kb09 adds its bias in the kernel: with 32 x 256 tiles (32 tiles at M=16 for 132 SMs) the class's branch
    launches the split copy and the epilogue copy, the else branch the kernel as written; both sides verified on
    the interpreter (the ragged M=17 split). With its own 32 x 32 tiles (256 at M=16) there is nothing to split."""
    p = load_problem(ROOT / "kernels" / "kb09_matmul_subtract_multiply_relu")
    assert not [c for c in TACTIC.propose(h200(p)) if "SPLIT_K" in c.params]
    wide = apply_config(p.kernel_source, "matmul_bias_kernel", {"BLOCK_M": 32, "BLOCK_N": 256, "BLOCK_K": 32})
    split = [c for c in TACTIC.propose(h200(p, wide)) if "SPLIT_K" in c.params]
    assert split and all("if M <= 64:" in c.source and "matmul_bias_kernel_epilogue[grid](" in c.source
                         for c in split)
    src = splitk.apply(p.kernel_source, splitk.find(p.kernel_source, p), 4, when="M <= 17")
    assert len(launches(src, "matmul_bias_kernel")) == 1 and len(launches(src, "matmul_bias_kernel_splitk")) == 1
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_a_row_kernel_whose_block_the_host_makes_gets_other_warps_for_its_decode_class(verify):
    """fused_add_rmsnorm (the real-world corpus): BLOCK = next_power_of_2(N) and num_warps from a heuristic of it, one
    program a row. No block size is the tactic's to change, and it used to stop there; at 16 tokens the start ran at
    0.66x of torch.compile on an H100. The decode class now gets the launch's options only (num_warps: a one-pass
    kernel has no num_stages worth timing), the else branch keeps the heuristic, and both branches verify."""
    from tests.realworld import problem_dir

    p = load_problem(problem_dir("fused_add_rmsnorm"))
    ctx = h200(p)
    app = TACTIC.check(ctx)
    assert app.applies and "x2d.shape[0] <= 256 for bench-gpu-1 (tokens=16" in app.reason, app.reason
    cands = TACTIC.propose(ctx)
    assert cands and all("num_warps=" in c.description and "num_stages" not in c.description
                         and "BLOCK" not in c.description.split(":", 2)[2] for c in cands), [c.description for c in cands]
    assert not any("num_warps=8;" in c.description for c in cands)  # what the heuristic gives at 16 tokens already
    src = cands[0].source
    assert src.count("_fused_add_rmsnorm_kernel[(x2d.shape[0],)](") == 2 and "num_warps=_num_warps(BLOCK)" in src
    # on the CPU every correctness shape has few rows: move the threshold between ci (8 rows) and the ragged ones
    verdict = verify(p, src.replace("if x2d.shape[0] <= 256:", "if x2d.shape[0] <= 8:"))
    assert verdict.correct, verdict.feedback()


def test_a_dim_that_only_sizes_the_grid_gets_a_class_too():
    """gemv_decode's batch B is no argument of gemv_kernel: its grid's second axis (``grid = (cdiv(N, 32), B)``);
    measured on the H200 the one-shape port was 0.94x of its start at B = 8, and the tactic said it did not apply."""
    p = load_problem(ROOT / "kernels" / "gemv_decode")
    ctx = h200(p)
    app = TACTIC.check(ctx)
    assert app.applies, app.reason
    assert "B > 2 for bench-gpu-1 (B=8" in app.reason  # B: 1 (primary), 8; the ragged B=3 runs the branch
    cands = [c for c in TACTIC.propose(ctx) if "(bench-gpu-1)" in c.description]  # not the odd 4000 x 4000's
    assert cands and all(c.time_all_shapes and "if B > 2 (bench-gpu-1)" in c.description for c in cands)
    plain = next(c for c in cands if not c.params.get("dot_rows") and not c.params.get("shared_rows"))
    test = next(n for n in ast.walk(parse_kernel(plain.source).tree) if isinstance(n, ast.If))
    assert ast.unparse(test.test) == "B > 2" and len(launches(plain.source, "gemv_kernel")) == 2


def test_a_branch_no_correctness_shape_reaches_is_not_proposed_and_the_tactic_says_why(monkeypatch):
    p = load_problem(GEMM_RELU)
    every = p.correctness_variants("cuda")
    # as if gate 2 ran only the small shapes (everything falls into M <= 128: the else branch would go unverified)
    monkeypatch.setattr(type(p), "correctness_variants",
                        lambda self, kind, ragged=True: [v for v in every if v.dims["M"] <= 128])
    app = TACTIC.check(h200(p))
    assert not app.applies and "no correctness shape falls outside M <= 128" in app.reason
    assert "would go unverified" in app.reason and TACTIC.propose(h200(p)) == []
    # ... or only the large ones (nothing verifies the decode branch)
    monkeypatch.setattr(type(p), "correctness_variants",
                        lambda self, kind, ragged=True: [v for v in every if v.dims["M"] > 128])
    app = TACTIC.check(h200(p))
    assert "no correctness shape falls into M <= 128" in app.reason
    # the odd shape's class is reached by M = 3000 and its else by 4096: it alone is proposed
    assert app.applies and "M % 128 != 0 and M > 64 for bench-gpu-2" in app.reason
    cands = TACTIC.propose(h200(p))
    assert cands and not any("M <= 128" in c.description for c in cands)


@pytest.mark.slow  # about 10 s on 2 cores: make test-slow
def test_two_classes_and_their_winners_combined(tmp_path):
    narrow = DECODE + """bench-gpu-2:
  - params: [X]
    dtype: bfloat16
    dims: {M: 1024, K: 4096, N: 256}
    flop: "2*M*N*K"
"""
    p = style_problem(tmp_path, "wrapper", extra=narrow)
    ctx = h200(p)
    app = TACTIC.check(ctx)
    assert app.applies and "M <= 128 for bench-gpu-1" in app.reason and "N <= 1024 for bench-gpu-2" in app.reason
    tactic = PerShapeConfig(TACTIC._target)
    cands = tactic.propose(ctx)
    assert not any(c.params.get("swap_ab") for c in cands if "if N <= 1024" in c.description)  # few columns: no swap
    cands = [c for c in cands if not c.params.get("swap_ab")]
    by_class = {t: [c for c in cands if f"if {t} " in c.description] for t in ("M <= 128", "N <= 1024")}
    assert all(by_class.values()), [c.description for c in cands]

    def outcome(c: Candidate, speedup: float) -> TrialOutcome:
        return TrialOutcome("t", c, Verdict("h", correct=True, timed=True, accepted=speedup > 1.02, speedup=speedup))

    # only one class with a winner: nothing to combine
    one = [outcome(by_class["M <= 128"][0], 1.2)] + [outcome(c, 0.9) for c in by_class["N <= 1024"]]
    assert tactic.follow_up(ctx, one) == []
    both = [outcome(by_class["M <= 128"][0], 1.2), outcome(by_class["N <= 1024"][-1], 1.1)]
    (combined,) = tactic.follow_up(ctx, both)
    assert combined.time_all_shapes and "combined" in combined.description
    tree = parse_kernel(combined.source).tree
    top = next(n for n in ast.walk(tree) if isinstance(n, ast.If))
    assert ast.unparse(top.test) == "M <= 128" and ast.unparse(top.orelse[0].test) == "N <= 1024"
    assert len(launches(combined.source, "fc_relu")) == 3

    # the other shapes' winner kept the incumbent's launch for M <= 128: combined with N <= 1024's winner, the
    # M <= 128 branch keeps it too (the other shapes' tile would be untried there)
    from stages.device_tuning_shapes import Proposal
    from xeforge.problem import source_hash

    plan = tactic.plan(ctx)
    m_cls = next(c for c in plan.classes if c.test == "M <= 128")
    other_cfg = {**tactic.configs(ctx, plan.site, m_cls)[0]}
    fake = Candidate(ctx.source + "\n# the other shapes' winner\n", tactic.name, "else winner")
    tactic._proposed[source_hash(fake.source)] = Proposal(m_cls, "else", other_cfg)
    (kept,) = tactic.follow_up(ctx, [outcome(by_class["N <= 1024"][-1], 1.1), outcome(fake, 1.2)])
    top = next(n for n in ast.walk(parse_kernel(kept.source).tree) if isinstance(n, ast.If))
    assert ast.unparse(top.test) == "M <= 128" and len(launches(kept.source, "fc_relu")) == 3
    from xeforge.rewrite.tiling.configs import current_config

    current = current_config(ctx.model, plan.site)  # what the other shapes' winner kept for the class, as it did
    branch = ast.unparse(top.body[0])
    assert all(f"{k}={current[k]}" in branch for k in ("BN", "BK")), (branch, current)  # BM: its host name
    assert "(the search's, for the other shapes)" in kept.description

    # the rules engine asks for it once the tactic's own candidates are judged, before the stage chooses
    from xeforge.engines import RulesEngine

    speed = {c.source: s for c, s in [(by_class["M <= 128"][0], 1.2), (by_class["N <= 1024"][-1], 1.1)]}
    judged = []

    def evaluate(c):
        judged.append(c)
        return outcome(c, 1.3 if "combined" in c.description else speed.get(c.source, 0.9))

    stage = Stage("device_tuning", 7, "g", (), tactics=[tactic])
    (rec,) = RulesEngine().run_stage(stage, ctx, evaluate, lambda outs: max(outs, key=lambda o: o.verdict.speedup))
    assert "combined" in judged[-1].description and rec.best.candidate is judged[-1]


def test_chain_coverage_names_the_branch_no_shape_reaches():
    p = load_problem(GEMM_RELU)
    from stages.device_tuning_shapes import ShapeClass

    small = ShapeClass("M", "M", "M", "<=", 128, ("bench-gpu-1",))
    smaller = ShapeClass("M", "M", "M", "<=", 64, ("bench-gpu-1",))
    shapes = p.correctness_variants("cuda")
    assert chain_coverage([small], shapes) is None
    assert "M <= 64" in chain_coverage([small, smaller], shapes)  # every small shape stops at the first branch


# ------------------------------------------------------------------------------------------------ the rewrite
def test_the_rewrite_is_valid_for_a_launch_in_forward_with_an_inline_grid():
    src = (STYLES / "direct.py").read_text()
    out = dispatch(src, "fc_relu", [Branch("M <= 64", {"BM": 32, "BN": 64, "num_warps": 8})])
    ast.parse(out)
    fn = next(n for n in ast.walk(ast.parse(out)) if isinstance(n, ast.FunctionDef) and n.name == "forward")
    test = next(n for n in fn.body if isinstance(n, ast.If))
    assert "fc_relu[(triton.cdiv(M, 32), triton.cdiv(N, 64))](" in ast.get_source_segment(out, test.body[0])
    assert "BM=16, BN=16, BK=32, num_warps=4" in ast.get_source_segment(out, test.orelse[0])


@pytest.mark.parametrize("where, kernel, blocks", [("gemm_relu", "matmul_kernel", ("BLOCK_M", "BLOCK_N")),
                                                   ("wrapper", "fc_relu", ("BM", "BN")),
                                                   ("direct", "fc_relu", ("BM", "BN"))])
def test_undispatch_gives_back_the_launch_as_written_and_every_branch_configuration(where, kernel, blocks):
    """The autotuning stage's way back from a dispatch (an if/elif/else of three launches here): the source before
    the dispatch, to the character, and each branch's configuration, the else's first."""
    src = load_problem(GEMM_RELU).kernel_source if where == "gemm_relu" else (STYLES / f"{where}.py").read_text()
    small = {blocks[0]: 16, blocks[1]: 64, "num_warps": 2}
    out = dispatch(src, kernel, [Branch("M <= 31", small), Branch("M <= 64", {**small, "num_warps": 4})])
    back, configs = undispatch(out, kernel)
    assert back == src
    assert len(configs) == 3 and configs[1]["num_warps"] == 2 and configs[2]["num_warps"] == 4
    assert all(c[blocks[1]] == 64 for c in configs[1:]) and configs[0][blocks[1]] != 64
    assert undispatch(src, kernel) is None  # one launch: nothing to undo


def test_a_launch_inside_a_larger_expression_is_refused_with_its_line():
    src = (STYLES / "direct.py").read_text().replace("        fc_relu[(triton", "        _ = [fc_relu[(triton", 1)
    src = src.replace("BM=16, BN=16, BK=32, num_warps=4)", "BM=16, BN=16, BK=32, num_warps=4)]", 1)
    with pytest.raises(NotApplicable, match="line 36 is part of a larger expression"):
        dispatch(src, "fc_relu", [Branch("M <= 64", {"BM": 32})])


def test_the_dispatch_verifies_on_both_branches_for_a_launch_in_forward(verify):
    """gemm_relu: a grid variable in forward; the CPU runs ci (M=32) and its ragged shapes (M=31, 17): M <= 31 sends
    the ragged ones to the new tile and ci to the incumbent's."""
    p = load_problem(GEMM_RELU)
    out = dispatch(p.kernel_source, "matmul_kernel",
                   [Branch("M <= 31", {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 16, "num_warps": 2})])
    assert "matmul_kernel[(triton.cdiv(M, 16), triton.cdiv(N, 64))](" in out
    assert "grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))" in out  # the variable is left for the else branch
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()


def test_the_dispatch_verifies_on_both_branches_for_a_launch_in_a_wrapper(tmp_path, verify):
    """linear_relu's wrapper style: the launch in a module-level function, a META grid, block sizes from module
    constants; ci (M=24) takes the else branch, a ragged M=7 the new one."""
    p = style_problem(tmp_path, "wrapper", ragged="ragged: [{M: 7}]")
    out = dispatch(p.kernel_source, "fc_relu", [Branch("M <= 8", {"BM": 16, "BN": 32, "BK": 16, "num_warps": 2})])
    wrapper = next(n for n in ast.walk(ast.parse(out)) if isinstance(n, ast.FunctionDef) and n.name == "linear_relu")
    test = next(n for n in wrapper.body if isinstance(n, ast.If))
    assert ast.unparse(test.test) == "M <= 8" and "BN=32, BK=16, num_warps=2" in ast.unparse(test.body[0])
    assert "fc_relu[grid](" in ast.unparse(test.body[0])  # the META grid follows the block sizes by itself
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()
    g2 = next(g for g in verdict.gates if g.gate.startswith("2"))
    assert "ci-ragged0" in g2.summary, g2.summary  # the ragged M=7 ran: the new branch was verified


def test_the_dry_run_lists_the_tactic_with_its_reason(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "xeforge", "port", str(GEMM_RELU), "--dry-run", "--device", "cpu",
                           "--stages", "device_tuning", "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "tactic per-shape-config: does not apply — nothing to rank on the interpreter" in proc.stdout, proc.stdout


def test_the_search_configuration_for_the_other_shapes_with_the_incumbent_kept_for_the_class(tmp_path, verify):
    """The other way round: a configuration the launch search verified (faster at the primary shape, rejected for
    being slower at the decode-like one) goes to every shape but the class's, whose branch keeps the incumbent's
    launch; it is correct on both branches (ci M=24 keeps the incumbent's tile, a ragged M=200 takes the search's)."""
    import json

    p = style_problem(tmp_path, "wrapper", ragged="ragged: [{M: 200}]")
    run = tmp_path / "run"
    trial = run / "trials" / "0003-device_tuning-launch-params"
    trial.mkdir(parents=True)
    searched = {"BM": 32, "BN": 32, "BK": 16, "num_warps": 2}
    (trial / "meta.json").write_text(json.dumps({"stage": "device_tuning", "tactic": "launch-params",
                                                 "params": searched, "description": "fc_relu: BM=32, BN=32"}))
    # the objective over the shapes says 0.95x; at the primary shape it was 1.11x (slower at the decode shape alone)
    shapes = [{"variant": "bench-gpu", "speedup": 1.11}, {"variant": "bench-gpu-1", "speedup": 0.87}]
    (trial / "verdict.json").write_text(json.dumps({"correct": True, "speedup": 0.95, "gates": [
        {"gate": "3-performance", "details": {"shapes": shapes}}]}))
    other = run / "trials" / "0004-device_tuning-launch-params"  # a better objective, slower at the primary shape
    other.mkdir()
    (other / "meta.json").write_text(json.dumps({"stage": "device_tuning", "tactic": "launch-params", "params": {
        "BM": 16, "BN": 64, "BK": 16, "num_warps": 4}, "description": "fc_relu: BN=64"}))
    (other / "verdict.json").write_text(json.dumps({"correct": True, "speedup": 1.01, "gates": [
        {"gate": "3-performance", "details": {"shapes": [{"variant": "bench-gpu", "speedup": 0.99}]}}]}))
    ctx = tactic_context(p, kind="cuda", target="h200", run_dir=run)
    cands = [c for c in TACTIC.propose(ctx) if "the incumbent's launch; else" in c.description]
    assert len(cands) == 2, [c.description for c in TACTIC.propose(ctx)]
    cand = cands[0]  # the fastest at the primary shape first
    assert cand.time_all_shapes and "BM=32, BN=32" in cand.description
    wrapper = next(n for n in ast.walk(ast.parse(cand.source))
                   if isinstance(n, ast.FunctionDef) and n.name == "linear_relu")
    test = next(n for n in wrapper.body if isinstance(n, ast.If))
    assert ast.unparse(test.test) == "M <= 128"
    kept, other = ast.unparse(test.body[0]), ast.unparse(test.orelse[0])
    assert "BM=BM" not in other and "BM=32" in other and "BN=32" in other  # the search's tile for the rest
    assert "BM=16" in kept and "BN=16" in kept  # the incumbent's launch for the class
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()
    g2 = next(g for g in verdict.gates if g.gate.startswith("2"))
    assert "ci-ragged0" in g2.summary, g2.summary  # M=200 ran: the search's branch was verified


@pytest.mark.slow  # about 30 s: two winners verified and combined on the interpreter
def test_a_split_k_class_and_the_searchs_tile_for_the_other_shapes_combined(tmp_path, verify):
    """On the H100 gemm_relu's per-shape candidates won on both sides, 1.65x at M=16 from split-K in the class's
    branch and 1.42-1.47x elsewhere from the search's 128 x 256 tile with the class kept, and only one could be
    adopted. The follow-up offers both in one candidate: the split-K candidate as verified, its else branch (the
    kernel's only launch there) retiled. Verified on the interpreter with a threshold that splits the CPU's shapes."""
    import json

    p = load_problem(ROOT / "kernels" / "gemm_square")
    run = tmp_path / "run"
    trial = run / "trials" / "0004-device_tuning-launch-params"
    trial.mkdir(parents=True)
    wide = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}
    (trial / "meta.json").write_text(json.dumps({"stage": "device_tuning", "tactic": "launch-params", "params": wide,
                                                 "description": "matmul_kernel: BLOCK_N=256, BLOCK_K=64"}))
    (trial / "verdict.json").write_text(json.dumps({"correct": True, "speedup": 0.97, "gates": [
        {"gate": "3-performance", "details": {"shapes": [{"variant": "bench-gpu", "speedup": 1.3}]}}]}))
    ctx = tactic_context(p, kind="cuda", target="h200", cores=132, run_dir=run)
    tactic = PerShapeConfig(TACTIC._target)
    cands = tactic.propose(ctx)
    split = next(c for c in cands if c.params.get("SPLIT_K") == 4)
    other = next(c for c in cands if "the incumbent's launch; else" in c.description and "BLOCK_N=256" in
                 c.description and "if M <= 128 (" in c.description)  # the decode class's, not the odd one's

    def outcome(c: Candidate, speedup: float) -> TrialOutcome:
        return TrialOutcome("t", c, Verdict("h", correct=True, timed=True, accepted=speedup > 1.02, speedup=speedup))

    assert tactic.follow_up(ctx, [outcome(split, 1.18), outcome(other, 0.99)]) == []  # one winner: nothing to add
    (combined,) = tactic.follow_up(ctx, [outcome(split, 1.18), outcome(other, 1.28)])
    assert combined.time_all_shapes and "combined: if M <= 128: split-K, 4 programs" in combined.description
    assert "else BLOCK_N=256, BLOCK_K=64 (the search's, for the other shapes)" in combined.description
    names = [s.kernel for s in parse_kernel(combined.source).launches]
    assert names == ["matmul_kernel_splitk", splitk.SUM_KERNEL, "matmul_kernel"]
    rest = ast.unparse(next(n for n in ast.walk(ast.parse(combined.source)) if isinstance(n, ast.If)
                            and ast.unparse(n.test) == "M <= 128").orelse[0])
    assert "BLOCK_N=256" in rest and "BLOCK_K=64" in rest
    assert combined.source.count("if M <= 128:") == 1
    verdict = verify(p, combined.source.replace("if M <= 128:", "if M <= 31:"))  # ragged M=17 split, ci's 64 not
    assert verdict.correct, verdict.feedback()


# ------------------------------------------------------------------------------------------------- the odd class
def test_an_odd_shape_gets_a_class_of_its_own_and_tiles_that_fill_its_last_wave_first():
    """Issue 34's odd class: gemm_square at 3000 x 4096 x 3000 differs from the primary 4096^3 by less than 4x, so it
    had no class, and a tactic that won at 4096^3 and lost there (the persistent loop on the H100: 1.05x and 0.93x)
    could only be taken or left for both. It now has one, ``M % 128 != 0 and M > 64`` (decode's rows have their own),
    and for it the tiles whose programs fill the last wave of 132 cores better come first: the port's 128 x 256 tiles
    are 288 programs there (2.2 waves), 128 x 128 ones 576 (4.4)."""
    from xeforge.rewrite.persistent import launched_programs

    p = load_problem(ROOT / "kernels" / "gemm_square")
    src = apply_config(p.kernel_source, "matmul_kernel", {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64})
    ctx = h200(p, src)
    app = TACTIC.check(ctx)
    assert app.applies, app.reason
    assert "M <= 128 for bench-gpu-1" in app.reason
    assert "M % 128 != 0 and M > 64 for bench-gpu-2 (M=3000; verified at bench-gpu-2)" in app.reason
    every = TACTIC.propose(ctx)
    # the classes take turns: the odd class's first candidate right after the decode class's first, not after its ten
    assert "(bench-gpu-1)" in every[0].description and "(bench-gpu-2)" in every[1].description
    odd = [c for c in every if "(bench-gpu-2)" in c.description]
    assert odd and all(c.time_all_shapes and "if M % 128 != 0 and M > 64 (bench-gpu-2)" in c.description for c in odd)
    shape = next(v for v in p.timed_variants("cuda") if v.name == "bench-gpu-2")

    def last_wave(source: str) -> float:
        n = launched_programs(parse_kernel(source), "matmul_kernel", p, shape)
        return n / (132 * -(-n // 132))

    first = apply_config(src, "matmul_kernel", {k: v for k, v in odd[0].params.items() if k in OPTION_KEYS or
                                                k.startswith("BLOCK_")})
    assert last_wave(src) == pytest.approx(288 / 396)
    assert last_wave(first) >= last_wave(src) + 0.1, odd[0].description
    tree = parse_kernel(odd[0].source).tree
    test = next(n for n in ast.walk(tree) if isinstance(n, ast.If))
    assert ast.unparse(test.test) == "M % 128 != 0 and M > 64"


def test_an_odd_class_dispatch_verifies_on_both_branches(verify):
    """The odd class's test as the dispatch writes it, on the interpreter's shapes: the ragged M = 63 takes the
    branch (its threshold lowered to 32 here, so a CPU shape is odd above it), ci (M = 64) and M = 17 the incumbent's
    launch."""
    from stages.device_tuning_shapes import ShapeClass

    p = load_problem(ROOT / "kernels" / "gemm_square")
    cls = ShapeClass("M", "M", "M", "%", 128, ("bench-gpu-2",))
    assert cls.test == "M % 128 != 0 and M > 64"
    assert cls.holds({"M": 3000}) and not cls.holds({"M": 4096}) and not cls.holds({"M": 16})
    test = cls.test.replace("> 64", "> 32")
    out = dispatch(p.kernel_source, "matmul_kernel",
                   [Branch(test, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "num_warps": 2})])
    assert f"if {test}:" in out
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()
