"""The autotuning stage's tactic on the CPU interpreter, through the real verifier.

On the interpreter the decorator carries only the launch's own configuration (Triton's autotuner needs a GPU
benchmarker to rank several); the rewrite — decorator, shape key, ``META`` grid, launch without the tuned
arguments — passes ``Verifier.verify`` with the KB's gate-1 constraints. For GPU targets the list holds the
incumbent first, then configurations measured by device_tuning (read from the run's trial store) and KB
seeds, at most four, all accepted by the KB, with Intel-only keys only on Intel; each listed configuration is
also verified for correctness on its own. Kernels it cannot autotune are left alone with a reason.
"""

from __future__ import annotations

import json

import pytest

from stages import autotuning as stage
from tests.conftest import tactic_context, FIXTURES, ROOT
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite import autotune, persistent
from xeforge.rewrite.tiling.dispatch import Branch, dispatch

KERNELS = ROOT / "kernels"
HERE = FIXTURES / "tactics" / "autotuning"
TACTIC = stage.AutotuneFromSpace()



def context(p, source: str | None = None, kind: str = "cpu", target: str | None = None, run_dir=None):
    return tactic_context(p, source, kind, target, cores=20, run_dir=run_dir)


def test_interpreter_candidate_autotunes_the_incumbent_config(verify):
    p = load_problem(KERNELS / "gemm_relu")
    ctx = context(p)
    app = TACTIC.check(ctx)
    assert app.applies and "no benchmarker" in app.reason, app.reason
    cand = TACTIC.propose(ctx)[0]
    model = parse_kernel(cand.source)
    fn = model.functions["matmul_kernel"]
    assert fn.autotune_key == ["M", "N", "K"]
    assert fn.autotune_configs == [{"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4}]
    site = next(s for s in model.launches if s.kernel == "matmul_kernel")
    assert not site.constexprs and not site.options  # the launch passes no tuned arguments any more
    assert "triton.cdiv(M, META['BLOCK_M'])" in cand.source
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()


def test_a_per_shape_dispatch_becomes_one_autotuned_launch_listing_every_branch(verify):
    """After device_tuning's per-shape dispatch the kernel has a launch per shape class; autotuning replaces the
    dispatch by the incumbent's launch under @triton.autotune whose list holds every branch's configuration (its key
    picks per shape). Each listed configuration, pinned, is verified on the interpreter (which cannot benchmark)."""
    p = load_problem(KERNELS / "gemm_relu")
    small = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 16, "num_warps": 2}
    dispatched = dispatch(p.kernel_source, "matmul_kernel", [Branch("M <= 31", small)])
    assert len([s for s in parse_kernel(dispatched).launches if s.kernel == "matmul_kernel"]) == 2
    src, plan = autotune.rewrite(dispatched, [], "cpu", kernel="matmul_kernel")
    assert plan.replaced_dispatch == 2 and "in place of the per-shape dispatch of 2 launches" in plan.describe()
    model = parse_kernel(src)
    assert len([s for s in model.launches if s.kernel == "matmul_kernel"]) == 1 and "M <= 31" not in src
    configs = model.functions["matmul_kernel"].autotune_configs
    assert configs == [{"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4}, small]  # the else's first
    app = TACTIC.check(context(p, dispatched))
    assert app.applies and "per-shape dispatch" in app.reason, app.reason
    for cfg in configs:
        verdict = verify(p, autotune.pin(src, "matmul_kernel", cfg, "cpu"))
        assert verdict.correct, (cfg, verdict.feedback())


def test_persistent_grid_keeps_its_meta_lambda(verify):
    p = load_problem(KERNELS / "gemm_square")
    src, _ = persistent.rewrite(p.kernel_source)
    cand = TACTIC.propose(context(p, src))[0]
    fn = parse_kernel(cand.source).functions["matmul_kernel"]
    assert set(fn.autotune_configs[0]) == {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_SIZE_M", "num_warps", "num_stages"}
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()


def _trial(run_dir, n: int, params: dict, speedup: float, correct: bool = True) -> None:
    folder = run_dir / "trials" / f"{n:04d}-device_tuning-launch-params"
    folder.mkdir(parents=True)
    desc = "matmul_kernel: " + ", ".join(f"{k}={v}" for k, v in params.items())
    (folder / "meta.json").write_text(json.dumps({"stage": "device_tuning", "tactic": "launch-params",
                                                  "description": desc, "params": params}))
    (folder / "verdict.json").write_text(json.dumps({"correct": correct, "speedup": speedup}))


def test_gpu_list_is_incumbent_then_measured_then_kb_seeds(tmp_path):
    p = load_problem(KERNELS / "gemm_relu")
    fast = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3}
    _trial(tmp_path, 1, {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}, 1.4)
    _trial(tmp_path, 2, fast, 2.5)
    _trial(tmp_path, 3, {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4}, 9.0, correct=False)
    ctx = context(p, kind="cuda", target="h200", run_dir=tmp_path)
    cand = TACTIC.propose(ctx)[0]
    configs = cand.params["configs"]
    assert len(configs) == autotune.MAX_CONFIGS
    assert configs[0] == {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4}
    assert configs[1] == fast  # the fastest correct trial comes right after the incumbent
    assert all(c.get("BLOCK_M") != 128 or c.get("BLOCK_N") != 64 for c in configs)  # the incorrect one is not listed
    assert "grf_mode" not in cand.source
    errors = [v for v in ctx.kb.check(parse_kernel(cand.source), "h200", ctx.triton) if v.is_error]
    assert not errors, [v.render() for v in errors]
    # its key picks per shape: gate 3 times it at each of gemm_relu's timed shapes, not the primary alone
    assert len(p.timed_variants("cuda")) > 1 and cand.time_all_shapes


def test_intel_list_carries_grf_mode_in_the_config_dict():
    p = load_problem(KERNELS / "gemm_relu")
    ctx = context(p, kind="xpu", target="arc-b580")
    cand = TACTIC.propose(ctx)[0]
    assert "'grf_mode': '256'" in cand.source and "grf_mode=" not in cand.source
    errors = [v for v in ctx.kb.check(parse_kernel(cand.source), "arc-b580", ctx.triton) if v.is_error]
    assert not errors, [v.render() for v in errors]


def test_every_config_of_a_gpu_list_is_correct_on_its_own(verify):
    p = load_problem(KERNELS / "gemm_square")
    configs = TACTIC.propose(context(p, kind="cuda", target="h200"))[0].params["configs"]
    assert len(configs) >= 3
    for cfg in configs[1:3]:
        single, _ = autotune.rewrite(p.kernel_source, [cfg], "cuda", include_incumbent=False)
        assert parse_kernel(single).functions["matmul_kernel"].autotune_configs == [cfg]
        verdict = verify(p, single)
        assert verdict.correct, (cfg, verdict.feedback())


INPLACE = '''
import torch
import triton
import triton.language as tl


@triton.jit
def scale_(x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(x_ptr + offs, x * 2, mask=offs < n)


class Model(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        n = y.numel()
        scale_[(triton.cdiv(n, 128),)](y, n, BLOCK=128, num_warps=4)
        return y
'''


def test_in_place_kernel_gets_restore_value():
    src, plan = autotune.rewrite(INPLACE, [], "cuda")
    assert plan.restore == ["x_ptr"] and "restore_value=['x_ptr']" in src
    assert "lambda META: (triton.cdiv(n, META['BLOCK']),)" in src


@pytest.mark.parametrize("folder,reason", [
    (HERE / "rowsum_atomic", "uses atomics"),
], ids=["atomics"])
def test_unsupported_kernels_are_left_alone_with_a_reason(folder, reason):
    ctx = context(load_problem(folder))
    app = TACTIC.check(ctx)
    assert not app.applies and reason in app.reason, app.reason
    assert TACTIC.propose(ctx) == []


def test_an_autotuned_kernel_keeps_its_list_and_gets_the_kbs_configs(verify):
    """Not autotuned twice: on the interpreter there is nothing to add; on a GPU the KB's configurations are
    appended to the kernel's own list (its key and configs kept), and the result verifies."""
    p = load_problem(KERNELS / "vector_add")
    cand = TACTIC.propose(context(p))[0]
    app = TACTIC.check(context(p, cand.source))
    assert not app.applies and "@triton.autotune'd already" in app.reason
    gpu = context(p, cand.source, kind="cuda", target="h200")
    app = TACTIC.check(gpu)
    assert app.applies and "its own @triton.autotune list of 1 extended by" in app.reason, app.reason
    (ext,) = TACTIC.propose(gpu)
    assert ext.source.count("@triton.autotune") == 1 and ext.source.count("triton.Config(") == len(ext.params["configs"])
    assert ext.source.count("triton.Config(") > cand.source.count("triton.Config(")
    verdict = verify(p, ext.source)
    assert verdict.correct, verdict.feedback()


def test_detector_reports_fixed_configs():
    issues = stage.STAGE.detect(context(load_problem(KERNELS / "gemm_relu")))
    assert any(i.code == "fixed-config" and "BLOCK_M=32" in i.message and "M/N/K" in i.message for i in issues)


VADD_HEURISTICS = '''import torch
import triton
import triton.language as tl


@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    out = tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask)
    if EVEN:  # the heuristic's value, a constexpr branch (here both give the same result)
        out = out * 1.0
    tl.store(out_ptr + offs, out, mask=mask)


class Model(torch.nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        n = x.numel()
        add_kernel[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64, num_warps=4)
        return out
'''


def test_autotuning_composes_with_heuristics(verify, tmp_path):
    """@triton.autotune goes above the kernel's @triton.heuristics, and no configuration sets what the heuristics
    set (EVEN follows each config's BLOCK); the result verifies, at the ragged shapes too."""
    import shutil

    folder = tmp_path / "vadd_heuristics"
    shutil.copytree(FIXTURES / "problems" / "vadd", folder)
    (folder / "kernel.py").write_text(VADD_HEURISTICS)
    p = load_problem(folder)
    src, plan = autotune.rewrite(p.kernel_source, [{"BLOCK": 128}], "cuda")
    assert "EVEN" not in plan.tuned and all("EVEN" not in c for c in plan.configs)
    assert src.index("@triton.autotune(") < src.index("@triton.heuristics(") < src.index("@triton.jit")
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()
    opaque = VADD_HEURISTICS.replace('@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})',
                                     "@triton.heuristics(RULES)").replace("@triton.heuristics", "RULES = {}\n\n\n"
                                                                           "@triton.heuristics", 1)
    with pytest.raises(autotune.NotApplicable, match="keys are not a literal dict"):
        autotune.rewrite(opaque, [], "cuda")


def test_sizes_a_heuristic_sets_are_named_as_the_heuristics_not_as_missing(tmp_path):
    """A launch whose block size and warps come from @triton.heuristics (swiglu in the corpus's training-library
    form) leaves the autotuner nothing; the reason says where they come from, not that they are not passed."""
    src = VADD_HEURISTICS.replace('@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})',
                                  '@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0, '
                                  '"BLOCK": lambda args: 64, "num_warps": lambda args: 4})')
    src = src.replace("BLOCK=64, num_warps=4)", ")")
    with pytest.raises(autotune.NotApplicable) as exc:
        autotune.rewrite(src, [], "cuda")
    assert "BLOCK, EVEN, num_warps come from add_kernel's @triton.heuristics" in str(exc.value)
    assert "not passed" not in str(exc.value), exc.value


def test_a_block_the_grid_reaches_through_a_local_stays_the_hosts_and_the_options_are_tuned(verify):
    """rope_cache's grid is `(num_tokens, n_q_blocks + triton.cdiv(n_k, BLOCK_H))` with `n_q_blocks = cdiv(n_q,
    BLOCK_H)`: META cannot express it. Since the launch search can set BLOCK_H where the host makes it, autotuning
    refused the whole launch ("size(s) the grid in a way the rewrite cannot express"); it now leaves BLOCK_H to the
    host and tunes the launch options."""
    from tests.realworld import problem_dir

    p = load_problem(problem_dir("rope_cache"))
    ctx = tactic_context(p, kind="cuda", target="h100", cores=132)
    app = TACTIC.check(ctx)
    assert app.applies and "of num_warps" in app.reason, app.reason
    cand = TACTIC.propose(ctx)[0]
    assert "BLOCK_H=BLOCK_H" in cand.source and "'BLOCK_H'" not in cand.source  # the host's, at the launch
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()


@pytest.mark.slow  # about 20 s: five verdicts of a dequantizing GEMM on the interpreter
def test_a_pinned_config_keeps_the_users_pruning(verify):
    """int4_dequant_matmul's ``@triton.autotune`` prunes configs whose K tile leaves its quantization group
    (``prune_configs_by``). Pinning a KB tile at the launch dropped that rule: on the H100 every candidate with
    BLOCK_K = 64 was rejected at gate 2 at ci (group 32). A pinned config now goes first in the autotuner's list, and
    the first config the user's pruning keeps runs: the pinned one where the rule allows it (the trace sees it), the
    user's own elsewhere, so both verify. The old form (decorator removed) is wrong at ci, so the check can fail."""
    from tests.realworld import problem_dir
    from xeforge.analysis.launches import observed
    from xeforge.analysis.observe import traces
    from xeforge.kernel_model import parse_kernel
    from xeforge.problem import load_problem
    from xeforge.rewrite import autotune
    from xeforge.rewrite.tiling.grid import single_launch

    p = load_problem(problem_dir("int4_dequant_matmul"))
    kernel = "_int4_dequant_mm_kernel"
    wide_k = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3}
    new = autotune.pin(p.kernel_source, kernel, wide_k)
    assert "prune_configs_by=_xeforge_pinned_first(" in new and new.count("def _xeforge_pinned_first") == 1
    assert verify(p, new).correct
    again = autotune.pin(new, kernel, {**wide_k, "BLOCK_K": 32})  # pinned over a pinned one: one helper, still right
    assert again.count("def _xeforge_pinned_first") == 1 and verify(p, again).correct
    kept = autotune.pin(p.kernel_source, kernel, {**wide_k, "BLOCK_K": 32})
    traces(p, kept)
    m = parse_kernel(kept)
    seen = observed(m, single_launch(m, kernel))
    assert seen["BLOCK_K"]["ci"] == 32 and seen["BLOCK_N"]["ci"] == 64  # the pinned config ran at ci
    unpruned = p.kernel_source.replace('prune_configs_by={"early_config_prune": _prune_int4_configs},', "")
    assert unpruned != p.kernel_source
    old_form = autotune.pin(unpruned, kernel, wide_k)
    assert "@triton.autotune(" not in old_form and not verify(p, old_form).correct


@pytest.mark.slow  # about 20 s: two traces and a verdict on the interpreter
def test_autotuning_takes_over_the_values_a_kernels_heuristics_make(verify):
    """swiglu_fwd (the corpus) makes BLOCK_N and num_warps in its ``@triton.heuristics``, which Triton applies over
    an autotuner's configs: autotuning said "they come from its @triton.heuristics, which an autotuner above it
    leaves to it" and did not apply. Those entries now leave the decorator (here all of them, so it goes) and the
    autotuner's configs set them, the traced values first; an entry that is no tuned value (rmsnorm_heuristics'
    EVEN_N, read from the block) stays."""
    from tests.realworld import problem_dir

    p = load_problem(problem_dir("swiglu_fwd"))
    ctx = tactic_context(p, kind="cuda", target="h100")
    (tactic,) = stage.STAGE.tactics
    app = tactic.check(ctx)
    assert app.applies and "BLOCK_N, num_warps" in app.reason, app.reason
    src = tactic.propose(ctx)[0].source
    assert "@triton.heuristics(" not in src and "triton.Config({'BLOCK_N': 1024}, num_warps=8)" in src, src
    assert verify(p, src).correct
    from xeforge.analysis.observe import traces

    q = load_problem(problem_dir("rmsnorm_heuristics"))
    traces(q)  # its block and warps are made on the host: the trace gives their values
    kept = autotune.rewrite(q.kernel_source, [], "cuda")[0]
    assert '@triton.heuristics({"EVEN_N"' in kept and "@triton.autotune(" in kept
