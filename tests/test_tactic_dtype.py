"""The dtype stage's tactics on the CPU interpreter, through the real verifier.

Each tactic rewrites its target shape (bundled problems and fixtures under tests/fixtures/tactics/dtype), the
rewrite passes ``Verifier.verify``, and shapes it does not cover are left untouched with a reason. The
precision contract is checked too: which operands are 16-bit comes from the spec's variants as each variant's
trace shows them (no trace of the kernel: not known, and the reason says why), and nothing is
ever lowered below the inputs' precision (not even under a spec that would allow it). gemm_relu's rewrites
are verified end to end by the port test in tests/test_tactic_fusion.py.
"""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path

import pytest

from stages import dtype
from stages.base import StageContext
from tests.conftest import FIXTURES, ROOT
from xeforge.devices import describe
from xeforge.problem import load_problem

KERNELS = ROOT / "kernels"
DTYPE = FIXTURES / "tactics" / "dtype"
TACTIC = {t.name: t for t in dtype.STAGE.tactics}


def context(p, source: str | None = None) -> StageContext:
    return StageContext(p, p.kernel_source if source is None else source, p.kernel_source, describe("cpu"), None)


def propose(tactic: str, p, source: str | None = None):
    ctx = context(p, source)
    app = TACTIC[tactic].check(ctx)
    assert app.applies, app.reason
    (cand,) = TACTIC[tactic].propose(ctx)
    assert cand.tactic == tactic and cand.kind == "rewrite" and cand.source != ctx.source
    return cand


def variant_of(tmp_path: Path, src: Path, **spec_edits: str) -> Path:
    """A copy of problem ``src`` with text replacements in its spec.yaml."""
    dst = tmp_path / src.name
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    text = (dst / "spec.yaml").read_text()
    for old, new in spec_edits.items():
        assert old in text, old
        text = text.replace(old, new)
    (dst / "spec.yaml").write_text(text)
    return dst


# ------------------------------------------------------------------------------------------------ up-casts
def test_upcast_removed_where_the_spec_makes_operands_16_bit():
    p = load_problem(KERNELS / "gemm_relu")  # ci fp32 (a no-op there), bench-gpu bf16: the win on the GPU
    cand = propose("drop-upcast-before-dot", p)
    assert ".to(tl.float32)" not in cand.source and "bfloat16" in cand.description
    assert "acc += tl.dot(a, b)" in cand.source  # fp32 accumulation untouched
    issues = [i for i in dtype.STAGE.detect(context(p)) if i.code == "upcast-before-dot"]
    assert len(issues) == 2 and all(i.line for i in issues) and "bfloat16 in bench-gpu" in issues[0].message


def test_upcast_removal_on_fp16_inputs_is_correct_and_composes_with_acc_in_place(verify):
    p = load_problem(DTYPE / "gemm_fp16")  # ci is fp16: the interpreter really runs the 16-bit dot
    cand = propose("drop-upcast-before-dot", p)
    assert "acc += tl.dot(a, b)" in cand.source and "float16" in cand.description
    both = propose("dot-accumulate-in-place", p, cand.source)
    assert "acc = tl.dot(a, b, acc)" in both.source
    for src in (cand.source, both.source):
        verdict = verify(p, src)
        assert verdict.correct, verdict.feedback()


def test_upcast_of_fp32_inputs_is_left_alone(tmp_path):
    # every variant fp32: dropping the cast would change nothing, so it is not proposed
    root = variant_of(tmp_path, KERNELS / "gemm_relu", **{"dtype: bfloat16": "dtype: float32"})
    p = load_problem(root)
    ctx = context(p)
    app = TACTIC["drop-upcast-before-dot"].check(ctx)
    assert not app.applies and "float32 in every variant" in app.reason
    assert TACTIC["drop-upcast-before-dot"].propose(ctx) == []
    assert not [i for i in dtype.STAGE.detect(ctx) if i.code == "upcast-before-dot"]


def test_no_tactic_lowers_precision_even_when_the_contract_allows_it(tmp_path):
    root = variant_of(tmp_path, KERNELS / "gemm_relu", **{"dtype: bfloat16": "dtype: float32",
                                                           "precision: strict": "precision: bf16"})
    p = load_problem(root)
    ctx = context(p)
    proposed = 0
    for tactic in dtype.STAGE.tactics:
        for cand in tactic.propose(ctx) if tactic.check(ctx).applies else []:
            proposed += 1
            added = [ln for ln in difflib.ndiff(p.kernel_source.splitlines(), cand.source.splitlines())
                     if ln.startswith("+ ")]
            for lowered in ("bfloat16", "float16", "input_precision", "allow_tf32"):
                assert not any(lowered in ln for ln in added), (tactic.name, lowered, added)
    assert proposed == 1  # only the fp32 accumulator form (acc = tl.dot(a, b, acc)) applies here


def test_already_direct_operands_say_so():
    p = load_problem(KERNELS / "gemm_square")
    ctx = context(p)
    app = TACTIC["drop-upcast-before-dot"].check(ctx)
    assert not app.applies and "loaded without an fp32 up-cast already" in app.reason
    acc = TACTIC["dot-accumulate-in-place"].check(ctx)
    assert not acc.applies and "no `acc += tl.dot(a, b)`" in acc.reason


# ------------------------------------------------------------------------------------------------ dtypes from the trace
STYLES = FIXTURES / "styles" / "linear_relu"


def test_a_kernel_launched_from_a_wrapper_gets_its_dtypes_from_the_trace():
    from xeforge.rewrite.context import Ctx
    from xeforge.rewrite.dtype import param_dtypes

    p = load_problem(STYLES / "wrapper.py")  # forward calls linear_relu(x, ...), which launches fc_relu
    c = Ctx(p.kernel_source, p)
    assert [(s.kernel, s.function) for s in c.model.launches] == [("fc_relu", "linear_relu")]
    for ptr in ("x_ptr", "w_ptr"):  # the input, and the Model's weight cast with it
        assert param_dtypes(c, "fc_relu", ptr) == {"ci": "float32", "bench-gpu": "bfloat16"}
    app = TACTIC["drop-upcast-before-dot"].check(context(p))
    assert app.applies and "bfloat16" in app.reason, app.reason


# forward as gemm_relu has it, and two ways for the bf16 variants to leave the dtypes of the operands unknown
_FORWARD = "        w = self.linear.weight\n"
UNTRACEABLE = {
    # .item() on the meta device fails, and with real values the check raises: bf16 variants cannot be traced (ci,
    # fp32, short-circuits and traces)
    "trace-fails": (_FORWARD + "        if x.dtype == torch.bfloat16 and x.abs().max().item() >= 0:\n"
                               "            raise ValueError('out of range')\n",
                    "forward could not be traced on the meta device at bench-gpu: ", ".item()"),
}


@pytest.mark.parametrize("case", list(UNTRACEABLE))
def test_a_variant_without_a_trace_of_the_kernel_leaves_its_dtypes_unknown(case):
    """No static guess stands in for a trace: the static reading of this forward says bf16 at bench-gpu (the launch
    is in forward, x and the weight are the variant's dtype), but what the kernel is given there is not known."""
    edit, reason, quoted = UNTRACEABLE[case]
    p = load_problem(KERNELS / "gemm_relu")
    src = p.kernel_source.replace(_FORWARD, edit)
    assert src != p.kernel_source
    ctx = context(p, src)
    app = TACTIC["drop-upcast-before-dot"].check(ctx)
    assert not app.applies
    assert "matmul_kernel line " in app.reason and "the element type of a_ptr, b_ptr is not known in bench-gpu " \
        "(and bench-gpu-1, bench-gpu-2): " + reason in app.reason, app.reason
    assert quoted in app.reason and "known from forward" not in app.reason and len(app.reason) < 400, app.reason
    assert TACTIC["drop-upcast-before-dot"].propose(ctx) == []
    assert not [i for i in dtype.STAGE.detect(ctx) if i.code == "upcast-before-dot"]  # nothing claimed either


def test_variants_where_the_kernel_does_not_run_are_left_out_of_its_dtypes():
    """The bf16 variants compute in torch (their traces launch no matmul_kernel): the kernel runs at ci alone, in
    fp32, so dropping its casts would change nothing there, and that is the reason given (not 'unknown')."""
    p = load_problem(KERNELS / "gemm_relu")
    src = p.kernel_source.replace(_FORWARD, _FORWARD + "        if x.dtype == torch.bfloat16:\n"
                                  "            return torch.relu(x @ w.t())\n")
    ctx = context(p, src)
    app = TACTIC["drop-upcast-before-dot"].check(ctx)
    assert not app.applies and "float32 in every variant; dropping the cast would change nothing" in app.reason, \
        app.reason
    assert TACTIC["drop-upcast-before-dot"].propose(ctx) == []


# ------------------------------------------------------------------------------------------------ accumulators
def test_16_bit_accumulator_becomes_fp32(verify):
    p = load_problem(DTYPE / "acc16")
    cand = propose("fp32-accumulator", p)
    assert "dtype=tl.float32)" in cand.source and "out_dtype" not in cand.source
    assert any(i.code == "dot-16bit-accumulator" for i in dtype.STAGE.detect(context(p)))
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()


def test_fp32_accumulator_and_acc_form_leave_other_shapes_alone():
    p = load_problem(KERNELS / "gemm_relu")
    app = TACTIC["fp32-accumulator"].check(context(p))
    assert not app.applies and "already accumulates in fp32" in app.reason
    # acc += dot on a 16-bit accumulator is not rewritten to acc = dot(a, b, acc) (that would accumulate in 16 bits)
    src = p.kernel_source.replace("dtype=tl.float32)", "dtype=tl.float16)")
    acc = TACTIC["dot-accumulate-in-place"].check(context(p, src))
    assert not acc.applies and "not an fp32 accumulator" in acc.reason


# ------------------------------------------------------------------------------------------------ fp64
def test_fp64_arithmetic_becomes_fp32(verify):
    p = load_problem(DTYPE / "rowsum_fp64")
    cand = propose("fp64-to-fp32", p)
    assert "float64" not in cand.source and "tl.float64" in p.kernel_source
    assert "dtype=torch.float32)" in cand.source  # the fp64 intermediate buffer too
    assert any(i.code == "fp64" for i in dtype.STAGE.detect(context(p)))
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()


def test_fp64_kept_when_the_spec_has_fp64_inputs(tmp_path):
    root = variant_of(tmp_path, DTYPE / "rowsum_fp64", **{"dtype: float32\n    dims: {M: 20": "dtype: float64\n    dims: {M: 20"})
    ctx = context(load_problem(root))
    app = TACTIC["fp64-to-fp32"].check(ctx)
    assert not app.applies and "fp64 inputs in ci" in app.reason
    assert TACTIC["fp64-to-fp32"].propose(ctx) == []


def test_fp64_kept_when_the_spec_declares_fp64_inputs(tmp_path):
    # no variant dtype: the inputs are generated as declared (xeforge.problem.plan_inputs), fp64 here
    root = variant_of(tmp_path, DTYPE / "rowsum_fp64", **{"    dtype: float32\n    dims": "    dims",
                                                          "dtype: float32\ninits": "dtype: float64\ninits"})
    app = TACTIC["fp64-to-fp32"].check(context(load_problem(root)))
    assert not app.applies and "fp64 inputs in ci, bench-gpu" in app.reason, app.reason


def test_no_fp64_no_proposal():
    app = TACTIC["fp64-to-fp32"].check(context(load_problem(KERNELS / "gemm_relu")))
    assert not app.applies and "no fp64" in app.reason


def test_on_a_gpu_an_autotuned_kernel_gets_the_rewrite_with_kb_tiles_pinned_too(verify):
    """The autotune style of linear_relu: the up-cast drop is proposed as is (its autotuner keeps its own tiles) and,
    on a GPU, with the KB's top tiles pinned at the launch (decorator removed), as the direct style gets them
    written at its launch: both styles reach the same candidates. The pinned one is a correct kernel."""
    from tests.conftest import tactic_context

    p = load_problem(STYLES / "autotune.py")
    ctx = tactic_context(p, kind="cuda", target="h200")
    from xeforge.kernel_model import parse_kernel

    cands = TACTIC["drop-upcast-before-dot"].propose(ctx)
    assert len(cands) >= 2 and parse_kernel(cands[0].source).functions["fc_relu"].is_autotuned
    pinned = cands[1:]
    for c in pinned:
        assert not parse_kernel(c.source).functions["fc_relu"].is_autotuned and "; with BM=" in c.description
        (site,) = parse_kernel(c.source).launches
        assert {k: site.constexprs.get(k) for k in ("BM", "BN", "BK")} == {k: c.params[k] for k in ("BM", "BN", "BK")}
    direct = TACTIC["drop-upcast-before-dot"].propose(tactic_context(load_problem(STYLES / "direct.py"), kind="cuda",
                                                                     target="h200"))
    assert [c.params for c in pinned] == [c.params for c in direct[1:]]  # the same tiles in both styles
    verdict = verify(p, pinned[0].source)
    assert verdict.correct, verdict.feedback()


def test_on_a_gpu_the_kb_tiles_go_to_the_kernel_forward_launches_not_a_backward_one():
    """linear_relu's backward_kernels style: the file also launches fc_relu_bwd_input from a backward function that
    forward never calls. On the H200 the up-cast drop's re-tiled copies went to that launch (the rewritten text was
    never traced, so its own model counted it live): fc_relu kept 16 x 16 tiles, the drop was refused and the port
    stayed on fp32 matrix units (0.178 ms, 0.30x of torch.compile, where the other styles reached 0.061). The tiles
    go to fc_relu's launch, as in the direct style."""
    from tests.conftest import tactic_context
    from xeforge.kernel_model import parse_kernel

    p = load_problem(STYLES / "backward_kernels.py")
    start = {s.kernel: s.constexprs for s in parse_kernel(p.kernel_source).launches}
    cands = TACTIC["drop-upcast-before-dot"].propose(tactic_context(p, kind="cuda", target="h200"))
    assert len(cands) >= 2
    for c in cands[1:]:
        after = {s.kernel: s.constexprs for s in parse_kernel(c.source).launches}
        assert after["fc_relu_bwd_input"] == start["fc_relu_bwd_input"], c.description
        assert after["fc_relu"]["BM"] == c.params["BM"] != start["fc_relu"]["BM"]


def test_a_torch_fallback_at_some_variants_does_not_block_the_rewrite(verify, tmp_path):
    """Real wrappers fall back to torch below a size (or off the GPU): where the kernel does not run its operands'
    dtype is moot, so the variants where it runs decide, and the fallback is kept as it was."""
    folder = variant_of(tmp_path, KERNELS / "gemm_relu")
    src = (folder / "kernel.py").read_text().replace('''        M, K = x.shape
        N = w.shape[0]''', '''        M, K = x.shape
        N = w.shape[0]
        if M <= 16:  # decode-sized batches: torch is fast enough there
            return torch.relu(x @ w.t())''')
    (folder / "kernel.py").write_text(src)
    p = load_problem(folder)  # the user's start, fallback included
    assert "if M <= 16:" in p.kernel_source
    cand = propose("drop-upcast-before-dot", p)  # bench-gpu-1 (M=16) takes the fallback
    assert ".to(tl.float32)" not in cand.source and "if M <= 16:" in cand.source
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()
