"""The traced model of forward (xeforge/analysis/trace.py) on one problem written in five styles.

tests/fixtures/styles/linear_relu/ holds relu(x @ W^T + b) as people write it: the launch in forward (direct), a
module-level wrapper with module constants and a META grid, ``@triton.autotune`` with no block sizes at the
launch, a ``torch.autograd.Function`` with a backward kernel forward never launches, and a launcher method with
block sizes from instance attributes. The trace must see the same launch in every one: the kernel, its real
argument dtypes and shapes, the constexprs as used, the grid, and how forward reaches it.
"""

from __future__ import annotations

import pytest

from tests.conftest import FIXTURES
from xeforge.analysis.trace import Trace, TraceError
from xeforge.devices import describe
from xeforge.problem import load_problem
from xeforge.settings import Settings
from xeforge.verifier import Verifier

STYLES = FIXTURES / "styles" / "linear_relu"
# style -> (the frames from forward down to the launch, the constexprs the launch used)
EXPECT = {
    "direct": (["Model.forward"], {"BM": 16, "BN": 16, "BK": 32}),
    "wrapper": (["Model.forward", "linear_relu"], {"BM": 16, "BN": 16, "BK": 32}),
    "autotune": (["Model.forward"], {"BM": 16, "BN": 16, "BK": 32}),  # the first config, pinned on the interpreter
    "autograd": (["Model.forward", "LinearReLUFunction.forward"], {"BM": 16, "BN": 16, "BK": 32}),
    "launcher": (["Model.forward", "FusedLinear.launch"], {"BM": 16, "BN": 16, "BK": 32}),
}


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """Every style traced and verified, four verifiers at a time (their worker processes start in parallel)."""
    from concurrent.futures import ThreadPoolExecutor

    folders = {style: tmp_path_factory.mktemp(style) for style in EXPECT}  # mktemp is not thread-safe

    def one(style):
        p = load_problem(STYLES / f"{style}.py")
        with Verifier(p, describe("cpu"), Settings(correctness_rounds=1), folders[style]) as v:
            return v.trace(p.kernel_path, p.variant("ci")), v.verify(p.kernel_path)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(EXPECT, pool.map(one, EXPECT)))


@pytest.mark.parametrize("style", list(EXPECT))
def test_every_style_shows_the_same_launch(traced, style):
    trace, _ = traced[style]
    frames, consts = EXPECT[style]
    assert trace.kernels() == ["fc_relu"], trace.summary()  # relu_grad (backward only) never ran
    (la,) = trace.launches
    assert [f.function for f in la.stack] == frames, la.via()
    assert {c: la.args[c].value for c in la.constexprs} == consts
    assert la.grid == (2, 3), la.grid  # cdiv(24, 16), cdiv(48, 16): resolved from a tuple or a META lambda
    x, w = la.args["x_ptr"], la.args["w_ptr"]
    assert (x.kind, x.dtype, x.shape) == ("tensor", "float32", (24, 64))
    assert (w.dtype, w.shape, w.strides) == ("float32", (48, 64), (64, 1))
    assert trace.arg_dtypes("fc_relu", "x_ptr") == {"float32"}
    # what forward returns is what the kernel wrote
    assert trace.returns[0].storage == la.args["y_ptr"].storage


def test_the_trace_names_the_construct_on_the_way(traced):
    trace, _ = traced["autograd"]
    assert "torch.autograd.Function.forward" in trace.launches[0].via()
    wrapper, _ = traced["wrapper"]
    assert wrapper.launches[0].site.function == "linear_relu"


def test_autotune_records_its_configs_and_the_one_it_ran(traced):
    trace, verdict = traced["autotune"]
    tuned = trace.launches[0].autotune
    assert len(tuned["configs"]) == 3 and tuned["chosen"]["kwargs"] == {"BM": 16, "BN": 16, "BK": 32}
    assert tuned["key"] == ["M", "N", "K"]
    assert "@triton.autotune ran config" in trace.summary()[0]


@pytest.mark.parametrize("style", list(EXPECT))
def test_every_style_verifies_on_the_interpreter(traced, style):
    _, verdict = traced[style]
    assert verdict.correct, verdict.feedback()


def test_torch_ops_are_recorded_with_their_kind(traced):
    trace, _ = traced["autograd"]
    ops = {(o.op.rsplit(".", 1)[-1], o.kind) for o in trace.ops}
    assert ("empty", "allocation") in ops and ("to", "view") in ops
    assert trace.compute_ops() == []  # the Parameters' .to(dtype) is a cast, not compute


def test_a_malformed_trace_is_an_error_not_a_crash():
    for bad in (None, {}, {"events": [{"event": "launch"}]}, {"events": "x"}, {"events": [{"stack": [{}]}]}):
        with pytest.raises(TraceError):
            Trace.from_json("ci", bad)


# ------------------------------------------------------------------------------------------------ style coverage
# tactics that apply to direct.py but not yet to a style: (style, tactic) -> the construct the tactic stops at.
# The coverage test fails if one of these starts to apply (take it off the list) or another gap appears.
KNOWN_GAPS: dict[tuple[str, str], str] = {}  # none left on this problem (tests/test_style_corpus.py has more)


def _applicable(style: str) -> dict[str, tuple[bool, str]]:
    import stages
    from tests.conftest import tactic_context

    p = load_problem(STYLES / f"{style}.py")
    ctx = tactic_context(p, kind="cuda", target="h200", cores=132)
    return {t.name: (a.applies, a.reason) for st in stages.ALL for t in st.tactics for a in [t.check(ctx)]}


# the launcher and autograd styles take about 20 s each on 2 cores: make test-slow (CI runs both)
@pytest.mark.parametrize("style", [pytest.param(s, marks=pytest.mark.slow) if s in ("launcher", "autograd") else s
                                   for s in EXPECT if s != "direct"])
def test_style_coverage_of_the_tactics_that_apply_to_the_direct_style(style):
    direct = {name for name, (ok, _) in _applicable("direct").items() if ok}
    got = _applicable(style)
    missing = {name: got[name][1] for name in direct if not got[name][0]}
    expected = {t: why for (s, t), why in KNOWN_GAPS.items() if s == style}
    assert set(missing) == set(expected), missing
    for name, why in expected.items():
        assert why in missing[name]  # the reason names the construct
    assert {"drop-upcast-before-dot", "dot-accumulate-in-place"} <= direct - set(missing)


@pytest.mark.parametrize("style", [pytest.param(s, marks=pytest.mark.slow) if s == "autograd" else s
                                   for s in EXPECT])  # autograd: about 25 s, make test-slow
def test_the_dropped_upcast_verifies_in_every_style(style, tmp_path):
    """The dtype rewrite reads the operands' dtypes from the trace (bf16 at bench-gpu) wherever the launch is."""
    from stages import dtype
    from tests.conftest import tactic_context

    p = load_problem(STYLES / f"{style}.py")
    (cand,) = dtype.STAGE.tactics[0].propose(tactic_context(p))
    assert ".to(tl.float32)" not in cand.source.split("acc = tl.zeros")[1].split("tl.dot")[0]
    path = tmp_path / f"{style}.py"
    path.write_text(cand.source)
    with Verifier(p, describe("cpu"), Settings(correctness_rounds=1), tmp_path / "run") as v:
        verdict = v.verify(path)
    assert verdict.correct, verdict.feedback()


def _trace(events, returns, **extra):
    return Trace.from_json("ci", {"events": events, "returns": returns, "params": {}, "inputs": [], **extra})


def test_run_time_checks_count_the_autotuners_timing_launches_and_refuse_a_flood():
    """On a GPU the autotuner times its configs with hundreds of launches: they are counted, not listed, so the
    launch that writes the output is still in the trace (listing them cut it and failed a correct candidate)."""
    from xeforge.integrity import runtime_problems

    out = {"kind": "tensor", "storage": "s1", "dtype": "float32", "shape": [4], "strides": [1], "offset": 0,
           "contiguous": True, "device": "cpu"}
    launch = {"event": "launch", "kernel": "k", "stack": [], "args": {"out": out}, "constexprs": [], "options": {},
              "grid": [1]}
    start = _trace([launch], [out])
    assert runtime_problems(_trace([launch], [out], tuning_launches=600), start) is None
    assert "no Triton kernel ran" in runtime_problems(_trace([], [out]), start)
    copy = {"event": "torch", "op": "torch.Tensor.copy_", "kind": "compute", "stack": [], "inputs": [out],
            "outputs": [out]}
    assert "torch.Tensor.copy_" in runtime_problems(_trace([launch, copy], [out]), start)
    assert "more launches and torch ops than a trace holds" in runtime_problems(
        _trace([launch], [out], truncated=True), start)


@pytest.mark.slow  # two verifiers and a custom op on the interpreter (about 25 s): CI runs it with make test-slow
def test_a_candidate_that_redefines_the_starts_custom_op_does_not_replace_it(tmp_path):
    """torch.library ops are process-wide by name: without a namespace of its own per loaded file, a candidate
    defining the start's ``ns::op`` made the start's slot run the candidate's body (on the H200 every trial of the
    library-op style timed the candidate against itself: speedup 1.000x each time)."""
    p = load_problem(STYLES / "library_op.py")
    bad = tmp_path / "library_op_bad.py"
    bad.write_text(p.kernel_source.replace("acc = tl.maximum(acc, 0.0)", "acc = tl.maximum(acc, 1.0)"))
    with Verifier(p, describe("cpu"), Settings(correctness_rounds=1), tmp_path / "run") as v:
        assert v.verify(p.kernel_path).correct
        assert not v.verify(bad).correct
        again = v.verify(p.kernel_path)  # the start's slot, still loaded, runs the start's own op
        assert again.correct, again.feedback()
        trace = v.trace(p.kernel_path, p.variant("ci"))
    # named as written, and the file's own op, not torch compute (its body's launches are what the trace judges)
    assert [o.op for o in trace.ops if o.kind == "own-op"] == ["xeforge_corpus.linear_relu.default"]
    assert not trace.compute_ops()


def test_the_same_source_from_another_file_name_reuses_its_slot(tmp_path):
    """Slots are keyed by the source's hash: the same text under another file name (a port that changed nothing)
    runs in the slot it was loaded into, instead of a slot name that was never loaded (a KeyError at gate 0)."""
    p = load_problem(STYLES / "direct.py")
    twin = tmp_path / "unchanged_port.py"
    twin.write_text(p.kernel_source)
    with Verifier(p, describe("cpu"), Settings(correctness_rounds=1), tmp_path / "run") as v:
        assert v.verify(p.kernel_path).correct
        verdict = v.verify(twin)
    assert verdict.correct, verdict.feedback()


def test_host_code_that_reads_data_is_traced_on_the_cpu_when_the_meta_device_cannot(tmp_path):
    """A wrapper that turns routing offsets into a block map with ``.tolist()`` (MoE code) cannot run on the meta
    device; the trace is taken again on the CPU with real values (launches recorded, not run), so the launch's
    block sizes, which a host function picks from the data, are known at each variant."""
    from xeforge.analysis.launches import observed
    from xeforge.analysis.observe import traces
    from xeforge.kernel_model import parse_kernel

    (tmp_path / "kernel.py").write_text('''import torch
import triton
import triton.language as tl


@triton.jit
def scale_rows(x_ptr, y_ptr, rows_ptr, n, BLOCK: tl.constexpr):
    r = tl.load(rows_ptr + tl.program_id(0))
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + r * n + offs, tl.load(x_ptr + r * n + offs, mask=offs < n) * 2.0, mask=offs < n)


def block_for(counts):
    return 64 if sum(counts) > 32 else 32


class Model(torch.nn.Module):
    def forward(self, x, sel):
        counts = torch.bincount(sel, minlength=4).tolist()  # data the meta device does not have
        y = torch.zeros_like(x)
        rows = torch.arange(x.shape[0], dtype=torch.int32, device=x.device)
        scale_rows[(x.shape[0],)](x, y, rows, x.shape[1], BLOCK=block_for(counts))
        return y
''')
    (tmp_path / "reference.py").write_text("import torch\n\n\nclass Model(torch.nn.Module):\n"
                                            "    def forward(self, x, sel):\n        return x * 2.0\n")
    (tmp_path / "spec.yaml").write_text('''kind: elementwise
inputs:
  x: {shape: [R, C], dtype: float32}
  sel: {shape: [R], dtype: int64, range: [0, 4]}
ci:
  - {params: [x, sel], dims: {R: 12, C: 32}}
bench-gpu:
  - {params: [x, sel], dims: {R: 64, C: 48}}
''')
    p = load_problem(tmp_path)
    got = traces(p)
    assert all(isinstance(t, Trace) for t in got.values()), got
    model = parse_kernel(p.kernel_source)
    seen = observed(model, model.launches[0])
    assert seen["BLOCK"] == {"ci": 32, "bench-gpu": 64}, seen
