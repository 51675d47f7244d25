"""The stage prompts: golden files per stage, every applicable knowledge-base entry, the dry run.

Golden files live in tests/golden/prompts/. They are rendered on a synthetic device with fixed roofline numbers,
so they do not depend on the machine; the knowledge-base selection and the KB findings are rendered by
xeforge.kb (owned and tested there) and are replaced by a placeholder, so KB edits do not churn them (the test
``test_every_applicable_kb_entry_reaches_the_prompt`` checks that part). To accept intended changes:

    XEFORGE_ACCEPT_GOLDEN=1 .venv/bin/python -m pytest tests/test_cover_prompts.py
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

import stages
from cover_agent.feedback import Attempt, verdict_feedback
from cover_agent.prompts import _kb_findings, render_stage, render_stage_prompt
from stages.base import Issue, StageContext
from tests.conftest import ROOT
from xeforge.devices import DeviceInfo
from xeforge.problem import load_problem
from xeforge.settings import Settings
from xeforge.verifier import GateResult, Verdict

GOLDEN = ROOT / "tests" / "golden" / "prompts"
ACCEPT = os.environ.get("XEFORGE_ACCEPT_GOLDEN") == "1"
B580 = DeviceInfo("xpu", "Intel(R) Arc(TM) B580 Graphics", cores=20, l2_bytes=18874368, shared_mem_bytes=131072,
                  subgroup_sizes=[16, 32], has_fp64=True, architecture="bmg_g21")
CPU = DeviceInfo("cpu", "Triton interpreter (golden)", cores=4, architecture="x86_64", interpreter=True)
PEAKS = {"bfloat16": 116.74e12, "float16": 116.74e12, "float32": 13.7e12}


@pytest.fixture(scope="module")
def kb():
    from xeforge.kb import load_kb

    return load_kb()


def _triton(text="3.6.0", xpu=True):
    from xeforge.kb import TritonInfo

    return TritonInfo.parse(text, is_xpu=xpu)


def _kbc(kb, device_id="arc-b580", triton=None, entry=None):
    if entry is None and device_id == "arc-b580":  # fixed roofline facts: goldens must not move when the KB does
        entry = SimpleNamespace(id="arc-b580", name="Intel Arc B580", backend="xpu",
                                peak_flops=lambda dtype: PEAKS.get(dtype), bandwidth_bytes_per_s=456e9)
    return SimpleNamespace(kb=kb, device_id=device_id, triton=triton or _triton(), entry=entry, note="")


def _ctx(problem_dir: str, device: DeviceInfo, kbc, source: str | None = None) -> StageContext:
    problem = load_problem(ROOT / "kernels" / problem_dir)
    return StageContext(problem, source or problem.kernel_source, problem.kernel_source, device, kbc.device_id,
                        kbc.kb, kbc.triton, Settings())


def _normalise(text: str, stage, ctx, kbc) -> str:
    if kbc.kb is not None and kbc.device_id:
        sel = kbc.kb.select(stage.name, kbc.device_id, kbc.triton).render_text().rstrip()
        assert sel in text, "the KB selection must appear in the prompt verbatim"
        text = text.replace(sel, f"<knowledge-base selection for {stage.name} on {kbc.device_id}: rendered by "
                                 "xeforge.kb.render_selection, elided in golden files>")
        for line in _kb_findings(ctx, kbc):
            text = text.replace(line, "<knowledge-base finding on the current kernel, elided in golden files>")
    return text


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.md"
    for marker in (str(ROOT), "/tmp/", os.path.expanduser("~") + "/"):
        assert marker not in text, f"golden text for {name} contains a machine-specific path ({marker})"
    if ACCEPT:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"no golden file {path.relative_to(ROOT)}; create it with: XEFORGE_ACCEPT_GOLDEN=1 "
                    ".venv/bin/python -m pytest tests/test_cover_prompts.py")
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), "golden", "rendered"))
        pytest.fail(f"the rendered prompt differs from {path.relative_to(ROOT)}:\n{diff[:6000]}\nIf the change is "
                    "intended: XEFORGE_ACCEPT_GOLDEN=1 .venv/bin/python -m pytest tests/test_cover_prompts.py")


ISSUE = "synthetic issue for the golden file (the stage's real detectors are tested with the stage)"


@pytest.mark.parametrize("name", [s.name for s in stages.ALL])
def test_stage_prompt_golden(name, kb):
    stage = stages.BY_NAME[name]
    kbc = _kbc(kb)
    ctx = _ctx("gemm_relu", B580, kbc)
    text = render_stage_prompt(stage, ctx, [Issue(name, "example", ISSUE, 12)], kbc, [])
    check_golden(name, _normalise(text, stage, ctx, kbc))


def _verdict(gates, correct=False, accepted=False, timed=False, speedup=None, margin=None):
    return Verdict("0" * 16, gates, correct=correct, accepted=accepted, timed=timed, speedup=speedup, margin=margin)


def _attempts(current: str) -> list[Attempt]:
    ok0 = GateResult("0-isolation", "pass", "ran in an isolated worker on xpu")
    ok1 = GateResult("1-static", "pass", "static checks and knowledge-base constraints passed")
    ok2 = GateResult("2-correctness", "pass", "matches the float64 PyTorch reference on 9 rounds over ci, bench-gpu")
    g2 = GateResult("2-correctness", "fail", "variant ci-ragged-17 (M=17, K=17, N=48), normal inputs: output: 3.92% "
                    "of elements outside tolerance (rtol=0.0001, atol=0.0001); worst at index (16, 47): expected "
                    "0.31337, got 0 (|diff| 0.313); NaN: no, Inf: no",
                    {"variant": "ci-ragged-17", "reason": "tolerance", "index": [16, 47]})
    timing = {"variant": "bench-gpu", "speedup": 0.94, "margin": 0.031, "incumbent": {"median_ms": 2.1, "iqr_ms": 0.012},
              "candidate": {"median_ms": 2.234, "iqr_ms": 0.02}, "floor_ms": 1.18}
    g3 = GateResult("3-performance", "fail", "not faster beyond the noise margin: speedup 0.940x", timing)
    g1 = GateResult("1-static", "fail", "[grf-mode-spelling] ...", {"findings": [
        {"rule": "grf-mode-spelling", "line": 58, "message": "grf_mode='large' is not accepted by triton-xpu 3.6",
         "fix": "write grf_mode='256'"}]})
    fast = dict(timing, speedup=1.31, candidate={"median_ms": 1.603, "iqr_ms": 0.01})
    g3ok = GateResult("3-performance", "pass", "faster: speedup 1.310x", fast)
    verdicts = [
        ("widened tiles to 64x64x32 without masking K", _verdict([ok0, ok1, g2])),
        ("grf_mode large for the bigger tiles", _verdict([GateResult("0-isolation", "skipped", "not run"), g1])),
        ("num_warps=8, 128x128x32", _verdict([ok0, ok1, ok2, g3], correct=True, timed=True, speedup=0.94, margin=0.031)),
        ("128x256x32, num_warps=32, grf_mode='256'", _verdict([ok0, ok1, ok2, g3ok], correct=True, accepted=True,
                                                              timed=True, speedup=1.31, margin=0.031)),
    ]
    out = []
    for i, (summary, v) in enumerate(verdicts, start=1):
        status, headline, text = verdict_feedback(v, can_time=True)
        out.append(Attempt(1, i, status, headline, text, code=current.replace("BLOCK_M=32", f"BLOCK_M={32 * i}"),
                           summary=summary, trial=f"000{i}-device_tuning-llm", speedup=v.speedup,
                           failed_gate=v.failed_gate.gate if v.failed_gate else None))
    out.insert(2, Attempt(1, 0, "invalid", "INVALID kernel file (not verified)",
                          "The code was not sent to the verifier:\n- the code does not parse: line 40: '(' was never closed",
                          code="def broken(:\n", summary="an unfinished answer"))
    for i, a in enumerate(out, start=1):
        a.round = i
    return out


def test_prompt_with_attempts_and_plan_golden(kb):
    stage = stages.BY_NAME["device_tuning"]
    kbc = _kbc(kb)
    problem = load_problem(ROOT / "kernels" / "gemm_relu")
    current = problem.kernel_source.replace("num_warps=4", "num_warps=8", 1)
    ctx = _ctx("gemm_relu", B580, kbc, source=current)
    plan = "Bottlenecks:\n- 32x32x32 tiles starve DPAS\nPlan:\n1. 128x128x32 tiles, num_warps 8 (seed of xpu-dpas gemm)\n"
    text = render_stage_prompt(stage, ctx, [], kbc, _attempts(current), plan=plan)
    assert "## Starting kernel (before any stage)" in text and "## Current kernel (after the earlier stages" in text
    check_golden("device_tuning-attempts", _normalise(text, stage, ctx, kbc))


def test_prompt_without_a_knowledge_base_golden():
    stage = stages.BY_NAME["fusion"]
    kbc = SimpleNamespace(kb=None, device_id=None, triton=None, entry=None,
                          note="knowledge base unavailable: No module named 'xeforge.kb'")
    ctx = _ctx("kb09_matmul_subtract_multiply_relu", B580, kbc)
    text = render_stage_prompt(stage, ctx, [], kbc, [])
    assert "No knowledge-base entries are available: knowledge base unavailable" in text
    assert "roofline: unknown" in text
    check_golden("fusion-no-kb", text)


def test_analysis_prompt_golden(kb):
    stage = stages.BY_NAME["dtype"]
    kbc = _kbc(kb)
    ctx = _ctx("gemm_relu", B580, kbc)
    text = render_stage_prompt(stage, ctx, [Issue("dtype", "example", ISSUE, 30)], kbc, [], purpose="analysis")
    assert "This call only plans" in text and "Return the complete kernel file" not in text
    check_golden("dtype-analysis", _normalise(text, stage, ctx, kbc))


def test_cpu_interpreter_prompt_golden(kb):
    stage = stages.BY_NAME["memory_access"]
    kbc = _kbc(kb, "cpu-interpreter", _triton("3.8.0", xpu=False), entry=kb.devices["cpu-interpreter"])
    ctx = _ctx("vector_add", CPU, kbc)
    text = render_stage_prompt(stage, ctx, [], kbc, [])
    assert "gate 3 (timing) does not run on this device" in text and "on a GPU, gate 3 times variant bench-gpu" in text
    check_golden("memory_access-cpu", _normalise(text, stage, ctx, kbc))


# ------------------------------------------------------------------------------------------------ content checks
@pytest.mark.parametrize("device_id,triton", [("arc-b580", ("3.6.0", True)), ("arc-a770", ("3.5.0", True)),
                                              ("max-1550", ("3.6.0", True)), ("h100", ("3.8.0", False)),
                                              ("cpu-interpreter", ("3.8.0", False))])
def test_every_applicable_kb_entry_reaches_the_prompt(kb, device_id, triton):
    t = _triton(*triton)
    kbc = _kbc(kb, device_id, t, entry=kb.devices[device_id])
    device = CPU if device_id == "cpu-interpreter" else B580
    ctx = _ctx("gemm_relu", device, kbc)
    for stage in stages.ALL:
        sel = kb.select(stage.name, device_id, t)
        text = render_stage(stage, ctx, [], kbc, []).text
        assert sel.render_text().rstrip() in text, f"{stage.name}: KB selection not verbatim in the prompt"
        for entry_id in sel.ids():
            assert f"[{entry_id}]" in text, f"{stage.name} on {device_id}: KB entry {entry_id} missing"
        assert "left out for the prompt budget" not in text


def test_problem_context_numbers(kb):
    kbc = _kbc(kb)
    ctx = _ctx("gemm_relu", B580, kbc)
    text = render_stage(stages.BY_NAME["fusion"], ctx, [], kbc, []).text
    # 2*4096^3 + 4096^2 FLOP on 116.74 TFLOP/s; 2*(3*4096^2) bytes on 456 GB/s
    assert "timed shape (variant bench-gpu, timed on xpu): M=4096, K=4096, N=4096; dtype bfloat16" in text
    assert "work: 137 GFLOP (2*M*N*K + M*N); memory traffic: 101 MB" in text
    assert "roofline: compute 1.18 ms, memory 221 us" in text and "this problem is compute-bound" in text
    assert "## Precision contract: strict" in text and "bench-gpu (bfloat16): rtol=0.01, atol=0.01" in text
    assert "## PyTorch reference (the oracle; gate 2 runs it in float64)" in text


def test_templates_declare_their_signature_and_reference(kb):
    kbc = _kbc(kb)
    ctx = _ctx("gemm_relu", B580, kbc)
    kinds = {s.name: render_stage(s, ctx, [], kbc, []) for s in stages.ALL}
    assert {n: r.signature for n, r in kinds.items() if r.signature != "optimization"} == {
        "algorithmic": "algorithmic", "discovery": "discovery"}
    reference = load_problem(ROOT / "kernels" / "gemm_relu").reference_path.read_text().rstrip()
    assert reference in kinds["algorithmic"].text and reference in kinds["fusion"].text
    assert "## PyTorch reference" not in kinds["device_tuning"].text
    for stage in stages.ALL:
        assert stage.template.exists(), f"missing prompt template {stage.template.name}"


def test_plain_string_feedback_is_rendered(kb):
    kbc = _kbc(kb)
    ctx = _ctx("gemm_relu", B580, kbc)
    text = render_stage_prompt(stages.BY_NAME["dtype"], ctx, [], kbc, ["rejected at gate 1-static: something"])
    assert "## Earlier attempts at this stage" in text and "rejected at gate 1-static: something" in text


def test_dry_run_prints_every_stage_prompt_with_kb_entries(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "xeforge", "port", str(ROOT / "kernels" / "vector_add"), "--device",
                           "cpu", "--dry-run", "--engine", "llm", "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("prompt the llm engine would send:") == 9 and "prompt rendering unavailable" not in out
    for stage in stages.ALL:
        assert f"# Stage {stage.order} of 9: {stage.name}" in out
    assert "[block-sizes-power-of-two]" in out and "## PyTorch reference" in out
