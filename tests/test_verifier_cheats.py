"""The verifier against kernels that cheat or break: each must fail at its named gate, for its named reason.

Runs the real cascade (worker process, static checks, float64 oracle) on the CPU interpreter.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from xeforge.devices import describe
from xeforge.problem import load_problem
from xeforge.verifier import Verifier

CHEATS = FIXTURES / "cheats"

# (fixture, problem, gate that must fail, text the failure must contain)
CASES = [
    ("returns_empty", "vadd", "2-correctness", "variant ci"),
    ("returns_zeros", "vadd", "2-correctness", "outside tolerance"),
    ("returns_input", "vadd", "2-correctness", "aliases an input"),
    ("torch_matmul", "vadd", "1-static", "S020-torch-compute"),
    ("never_launched", "vadd", "1-static", "S004-not-launched"),
    ("caches_output", "vadd", "2-correctness", "outside tolerance"),
    ("mutates_input", "vadd", "2-correctness", "mutated its input"),
    ("side_stream", "vadd", "1-static", "device stream"),
    ("divides_by_zero", "vadd", "0-isolation", "ZeroDivisionError"),
    ("segfaults", "vadd", "0-isolation", "SIGSEGV"),
    ("writes_file", "vadd", "1-static", "open()"),
    ("reads_api_key", "vadd", "1-static", "environment"),
    ("pow2_only", "vadd", "2-correctness", "ragged"),
    ("rowsum_reads_oob", "rowsum", "2-correctness", "ragged"),
    # torch reached through a dict, a dunder or bound methods in a tuple: gate 1 follows them (and so do the run-time
    # checks, below)
    ("skips_launch", "vadd", "1-static", "torch.add beyond the starting kernel"),
    ("torch_fallback_hidden", "vadd", "1-static", ".__add__ beyond the starting kernel"),
    ("overwrites_output", "vadd", "1-static", ".copy_ beyond the starting kernel"),
    # fresh values at the same input addresses: a result cached by address is stale
    ("caches_by_address", "vadd", "2-correctness", "outside tolerance"),
    # obfuscated escapes: gate 1 is the fast first filter for them too (the sandbox is the defence)
    ("gate1_torch_os_system", "vadd", "1-static", "torch.os reaches the os module through torch"),
    ("gate1_import_by_name", "vadd", "1-static", ".__import__ reaches the interpreter's internals"),
    ("gate1_eval_alias", "vadd", "1-static", "eval is used as a value"),
    ("gate1_environ_by_name", "vadd", "1-static", "getattr with a computed attribute name"),
    ("gate1_subclass_walk", "vadd", "1-static", ".__subclasses__ reaches the interpreter's internals"),
]


@pytest.fixture(scope="module")
def verifiers(tmp_path_factory):
    from xeforge.settings import Settings

    made = {}

    def get(problem: str, **overrides):
        key = (problem, tuple(sorted(overrides.items())))
        if key not in made:
            p = load_problem(FIXTURES / "problems" / problem)
            settings = Settings(compile_timeout_s=60.0, run_timeout_s=30.0).replace(**overrides)
            made[key] = Verifier(p, describe("cpu"), settings, tmp_path_factory.mktemp(problem))
        return made[key]

    yield get
    for v in made.values():
        v.close()


@pytest.mark.parametrize("name,problem,gate,reason", CASES, ids=[c[0] for c in CASES])
def test_cheat_fails_at_its_gate(verifiers, name, problem, gate, reason):
    v = verifiers(problem)
    verdict = v.verify(CHEATS / f"{name}.py", v.problem.kernel_path)
    failed = verdict.failed_gate
    assert failed is not None, f"{name} was not rejected: {verdict.feedback()}"
    assert failed.gate == gate, f"{name} failed at {failed.gate}, expected {gate}: {failed.summary}"
    assert reason in failed.summary, f"{name}: reason {reason!r} not in {failed.summary!r}"
    assert not verdict.correct and not verdict.accepted


# with gate 1 out of the way, what the call did (run-time checks against the starting kernel's call) rejects them too
RUNTIME_CASES = [
    ("skips_launch", "no Triton kernel ran during the call"),
    ("torch_fallback_hidden", "torch computed beyond the starting kernel at run time: torch.Tensor.add"),
    ("overwrites_output", "torch computed beyond the starting kernel at run time"),
]


@pytest.mark.parametrize("name,reason", RUNTIME_CASES, ids=[c[0] for c in RUNTIME_CASES])
def test_the_runtime_checks_reject_it_past_gate_1(verifiers, name, reason):
    v = verifiers("vadd")
    g0, g2 = v.correctness(v.code(CHEATS / f"{name}.py"))
    assert g0.passed and g2 is not None and g2.status == "fail", (g0.summary, g2)
    assert reason in g2.summary, g2.summary


def test_loop_forever_times_out_and_worker_is_replaced(verifiers):
    v = verifiers("vadd", compile_timeout_s=6.0, run_timeout_s=3.0)
    verdict = v.verify(CHEATS / "loops_forever.py", v.problem.kernel_path)
    assert verdict.failed_gate.gate == "0-isolation"
    assert "timed out" in verdict.failed_gate.summary
    # the worker was killed; the next candidate gets a fresh one and passes
    ok = v.verify(v.problem.kernel_path, v.problem.kernel_path)
    assert ok.correct, ok.feedback()


def test_crash_then_recovery(verifiers):
    v = verifiers("vadd")
    bad = v.verify(CHEATS / "segfaults.py", v.problem.kernel_path)
    assert bad.failed_gate.gate == "0-isolation"
    good = v.verify(v.problem.kernel_path, v.problem.kernel_path)
    assert good.correct, good.feedback()
    assert v.worker.restarts >= 1


def test_starting_kernels_pass(verifiers):
    for problem in ("vadd", "rowsum"):
        v = verifiers(problem)
        verdict = v.verify(v.problem.kernel_path, v.problem.kernel_path)
        assert verdict.correct, verdict.feedback()
        perf = verdict.gates[-1]
        assert perf.gate == "3-performance" and perf.status == "skipped"
        assert "interpreter" in perf.summary
        assert not verdict.accepted  # nothing claims a speedup on the CPU
        # gate 2 says where its seconds went: every part was timed, and the parts add up to no more than the gate
        g2 = next(g for g in verdict.gates if g.gate == "2-correctness")
        parts = g2.details["seconds_in"]
        main = {k: parts[k] for k in ("first_calls", "calls", "oracle", "checks")}
        assert set(parts) == {*main, "starting", "waiting"}
        assert main["first_calls"] > 0 and main["oracle"] > 0, parts
        assert sum(main.values()) <= g2.details["seconds"] + 0.01, (parts, g2.details["seconds"])
        # no lock on the CPU: nothing waits; starting is part of the calls it delayed
        assert parts["waiting"] == 0 and parts["starting"] <= sum(main.values()), parts


def test_failure_feedback_names_worst_element(verifiers):
    v = verifiers("vadd")
    verdict = v.verify(CHEATS / "returns_zeros.py", v.problem.kernel_path)
    d = verdict.failed_gate.details
    assert {"index", "expected", "got", "fraction", "seed", "variant"} <= set(d)
    assert d["fraction"] > 0.9


def test_worker_environment_has_no_secrets(tmp_path, monkeypatch):
    from xeforge.isolation import Worker, scrubbed_env

    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "t0k")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    env = scrubbed_env("cpu")
    assert "OPENAI_API_KEY" not in env and "MY_SERVICE_TOKEN" not in env
    assert env["TRITON_INTERPRET"] == "1" and "TRITON_CACHE_DIR" in env
    with Worker("cpu", tmp_path) as w:
        w.start()
        live = Path(f"/proc/{w.proc.pid}/environ").read_bytes().split(b"\0")
        names = {kv.split(b"=", 1)[0] for kv in live if kv}
        assert b"OPENAI_API_KEY" not in names and b"MY_SERVICE_TOKEN" not in names
        assert Path(f"/proc/{w.proc.pid}/cwd").resolve() == tmp_path.resolve()


# knowledge-base constraints at gate 1: (fixture, target device, Triton version, rule id that must fire)
KB_CASES = [
    ("kb_warps_grf", "arc-b580", "3.6.0"),
    ("kb_grf_large", "arc-b580", "3.6.0"),
    ("kb_block_ptr", "h200", "3.9.0"),
]


@pytest.mark.parametrize("name,target,triton", KB_CASES, ids=[c[0] for c in KB_CASES])
def test_kb_constraints_reject_at_gate_1_with_rule_id_and_fix(tmp_path, name, target, triton):
    from xeforge.pipeline import constraint_hook, kb_context
    from xeforge.settings import Settings

    problem = load_problem(FIXTURES / "problems" / "vadd")
    kbc = kb_context(describe("cpu"), target=target, triton=triton)
    with Verifier(problem, describe("cpu"), Settings(), tmp_path, [constraint_hook(kbc)]) as v:
        verdict = v.verify(CHEATS / f"{name}.py", problem.kernel_path)
    failed = verdict.failed_gate
    assert failed is not None and failed.gate == "1-static", verdict.feedback()
    finding = failed.details["findings"][0]
    assert finding["rule"] and finding["rule"] in failed.summary
    assert finding["fix"] and finding["line"] > 0
    # the same kernel under a Triton/device where the rule does not apply passes gate 1
    ok = kb_context(describe("cpu"), target="h200", triton="3.8.0")
    with Verifier(problem, describe("cpu"), Settings(), tmp_path / "ok", [constraint_hook(ok)]) as v:
        assert v.static((CHEATS / f"{name}.py").read_text()).passed or name != "kb_block_ptr"


def test_constant_output_is_judged_at_the_output_precision():
    """A bf16 output that is constant because bf16 cannot tell the oracle's values apart is not a cheat."""
    import torch

    from xeforge.compare import compare_outputs

    ref = 9.06 + torch.linspace(0, 0.02, 64, dtype=torch.float64)  # all round to one bf16 value
    got = ref.to(torch.bfloat16)
    assert len(set(got.tolist())) == 1
    assert compare_outputs([got], [ref], [torch.bfloat16], 1e-2, 1e-2) is None
    wide = torch.linspace(-1, 1, 64, dtype=torch.float64)
    bad = compare_outputs([torch.full((64,), 0.5, dtype=torch.bfloat16)], [wide], [torch.bfloat16], 1e-2, 10.0)
    assert bad is not None and bad.reason == "constant"


def test_relative_work_folder_works(tmp_path, monkeypatch):
    """The worker runs inside the work folder, so a relative folder (e.g. `bench --out bench-out/ci`) must still work."""
    from xeforge.settings import Settings

    problem = load_problem(FIXTURES / "problems" / "vadd")
    monkeypatch.chdir(tmp_path)
    with Verifier(problem, describe("cpu"), Settings(correctness_rounds=1), Path("rel") / "work") as v:
        verdict = v.verify(problem.kernel_path)
    assert verdict.correct, verdict.feedback()


def test_a_start_with_device_side_descriptors_and_no_allocator_runs(tmp_path):
    """The worker sets a Triton allocator, as torch's own Triton integration does: a kernel that makes its tensor
    descriptors in the kernel (scratch memory at launch on Hopper) runs without a set_allocator of its own."""
    from tests.conftest import gpu_kind
    from xeforge.settings import Settings

    problem = load_problem(FIXTURES / "problems" / "vadd")
    with Verifier(problem, describe(gpu_kind() or "cpu"), Settings(correctness_rounds=1), tmp_path) as v:
        g0, g2 = v.correctness(v.code(FIXTURES / "descriptors" / "vadd_device_desc.py"))
    assert g0.passed, g0.summary  # on a GPU without the worker's allocator: "no allocator was set"
    assert g2 is not None and g2.passed, g2.summary


def test_a_partly_written_output_is_diagnosed_as_never_written(verifiers):
    v = verifiers("vadd")
    _, g2 = v.correctness(v.code(FIXTURES / "unstable" / "vadd_partial.py"))
    # the unwritten elements hold whatever torch.empty gave: the verdict may lead with NaN or with the tolerance,
    # but it always names the elements the call never wrote
    assert g2.status == "fail", g2.summary
    # 64 are never written; where torch.empty happened to hold NaN in the first run, the rerun cannot tell an unset
    # element from a NaN the kernel wrote, and counts it out
    never = re.search(r"(\d+) of 256 elements are never written by the call", g2.summary)
    assert never and 48 <= int(never.group(1)) <= 64, g2.summary


def test_weights_that_hold_nan_once_loaded_are_named_as_the_cause(verifiers):
    v = verifiers("vadd")
    _, g2 = v.correctness(v.code(FIXTURES / "unstable" / "vadd_nan_buffer.py"))
    assert g2.status == "fail", g2.summary
    assert "the weights scale hold NaN or Inf once loaded" in g2.summary, g2.summary


def test_a_start_whose_two_runs_differ_gets_its_cause(tmp_path):
    """A start that is its own baseline, every element written, but carrying state between calls: the verdict says
    so and names the fix (not only 'two runs differ')."""
    import shutil

    from xeforge.settings import Settings

    folder = tmp_path / "stateful"
    shutil.copytree(FIXTURES / "problems" / "vadd", folder)
    shutil.copy(FIXTURES / "unstable" / "vadd_state.py", folder / "kernel.py")
    problem = load_problem(folder)
    with Verifier(problem, describe("cpu"), Settings(correctness_rounds=1), tmp_path / "work") as v:
        verdict = v.verify(problem.kernel_path)
    failed = verdict.failed_gate
    assert failed is not None and "two runs on the same inputs gave different bits" in failed.summary
    assert "differ although every element is written in both runs" in failed.summary, failed.summary
    assert "nondeterministic: true" in failed.summary and "state the Model keeps between calls" in failed.summary


OWN_ROUNDING = {
    "kernel.py": '''import torch
import triton
import triton.language as tl


@triton.jit
def _shift_back(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(y_ptr + offs, (x + 1000.0) - 1000.0, mask=m)


class Model(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _shift_back[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
        return y
''',
    "reference.py": '''import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return (x + 1000.0) - 1000.0
''',
    "spec.yaml": '''kind: elementwise
inputs:
  x: {shape: [N], dtype: float16}
ci:
  - {params: [x], dims: {N: 1000}}
''',
}


def test_a_mismatch_the_reference_makes_too_is_named_as_the_problems_own_rounding(tmp_path):
    """A float16 start that adds and subtracts 1000 (half an ulp there is 0.25) misses the float64 oracle as the
    reference does when it runs in float16: the verdict says it is the problem's own rounding and names the atol
    the reference would need."""
    from xeforge.settings import Settings

    d = tmp_path / "shift"
    d.mkdir()
    for name, text in OWN_ROUNDING.items():
        (d / name).write_text(text)
    problem = load_problem(d)
    wrong = tmp_path / "wrong.py"
    wrong.write_text(problem.kernel_source.replace("- 1000.0,", "- 999.0,"))
    closer = tmp_path / "closer.py"  # shifts by 100: half an ulp there is 1/32, far under the reference's miss
    closer.write_text(problem.kernel_source.replace("(x + 1000.0) - 1000.0", "(x + 100.0) - 100.0"))
    with Verifier(problem, describe("cpu"), Settings(correctness_rounds=1, ragged_shapes=False), tmp_path / "w") as v:
        _, g2 = v.correctness(v.code(problem.kernel_path))
        _, g2_wrong = v.correctness(v.code(wrong))  # a kernel whose error is far beyond the problem's own
        _, g2_closer = v.correctness(v.code(closer))
    assert g2 is not None and g2.status == "fail", g2.summary
    assert "the reference itself, run as built (float16) on the same inputs, misses the float64 oracle too" \
        in g2.summary, g2.summary
    assert "this is the problem's own float16 rounding, not the kernel's; fix: give variant ci `atol: " in g2.summary
    need = float(g2.summary.split("it needs atol ")[1].split(" ")[0])
    assert 0.1 < need <= 0.26, g2.summary  # half an ulp at 1000 in float16 (0.5), less the rtol share
    # ... is not excused
    assert g2_wrong is not None and g2_wrong.status == "fail", g2_wrong.summary
    assert "by less than this call" in g2_wrong.summary and "not the kernel's" not in g2_wrong.summary, g2_wrong.summary
    # a kernel far closer to the oracle than the reference as built gets its own atol, so the check stays tight
    assert g2_closer is not None and g2_closer.status == "fail", g2_closer.summary
    assert "not the kernel's" in g2_closer.summary and "well under the reference's" in g2_closer.summary, g2_closer.summary
    given = float(g2_closer.summary.split("`atol: ")[1].split("`")[0])
    assert given < need and given <= 1.5 * 2 ** -5 + 1e-9, g2_closer.summary
