"""Diagnosis (issue 16): compiler facts read from what the worker wrote, the knowledge base's diagnoses, and how
the engines use them.

The fixtures under tests/fixtures/compiled/ are compiled kernels of bundled problems as the worker captured
them on the H200 (Triton 3.6; see their README): the recognizers and diagnoses are tested on real IR. What the
capture writes is tested on a stand-in compiled kernel (the interpreter compiles nothing).
"""

from __future__ import annotations

import json
from collections import namedtuple
from types import SimpleNamespace

import pytest

from tests.conftest import FIXTURES, ROOT
from xeforge.diagnosis.capture import dump_compiled, write_call_cost
from xeforge.diagnosis.compiler import read_folder, read_kernel
from xeforge.diagnosis.rules import NO_COMPILER, Diagnoser, by_shape, describe, findings_of, holds, tactic_order
from xeforge.kb import TritonInfo, load_kb
from xeforge.kb.loader import lint_paths
from xeforge.kb.schema import Condition
from xeforge.kernel_model import parse_kernel

COMPILED = FIXTURES / "compiled"
DEEP_CSV = FIXTURES / "ncu" / "gemm_relu-start.csv"
H200 = SimpleNamespace(kind="cuda", name="NVIDIA H200", cores=132, interpreter=False)


@pytest.fixture(scope="module")
def kb():
    return load_kb()


def _diagnoser(kb, device_id="h200", device=H200, triton="3.6.0"):
    return Diagnoser(kb, kb.devices[device_id], TritonInfo.parse(triton, is_xpu=device.kind == "xpu"), device)


def _launch(kernel, grid):
    return SimpleNamespace(kernel=kernel, grid=grid)


def _read(kb, problem, launches=(), **kw):
    model = parse_kernel((ROOT / "kernels" / problem.split("-")[0] / "kernel.py").read_text())
    trace = SimpleNamespace(launches=list(launches))
    return _diagnoser(kb, **kw).read(COMPILED / problem, trace, model)


def _facts(diagnosis, kernel):
    return next(k["facts"] for k in diagnosis["kernels"] if k["kernel"] == kernel)


def _ids(diagnosis):
    return {f["id"] for f in diagnosis["findings"]}


# ---------------------------------------------------------------------------------------- recognizers
def test_the_starting_gemm_runs_tf32_mma_sync_without_tma_on_the_h200(kb):
    """gemm_relu's start multiplies fp32 tiles: on the H200 its PTX has mma.sync with tf32 operands (not wgmma),
    cp.async loads and no TMA; its registers and shared memory come from the driver and the metadata."""
    d = _read(kb, "gemm_relu", [_launch("matmul_kernel", (16384, 1, 1)), _launch("relu_kernel", (16384,))])
    f = _facts(d, "matmul_kernel")
    assert f["mma.sync"] == 8 and f["mma.types"] == ["f32.tf32.tf32"] and "mma.wgmma" not in f
    assert f["load.cp_async"] == 6 and "load.tma" not in f
    assert (f["regs"], f["spills"], f["shared_bytes"], f["num_warps"], f["num_stages"]) == (46, 0, 8192, 4, 3)
    assert f["dot_calls"] == 1 and f["launches"] == 2 and f["programs"] == 16384 and f["device_cores"] == 132
    assert _facts(d, "relu_kernel")["dot_calls"] == 0


def test_the_ported_gemm_runs_bf16_wgmma_fed_by_tma(kb):
    d = _read(kb, "gemm_relu-candidate", [_launch("matmul_kernel", (132,))])
    f = _facts(d, "matmul_kernel")
    assert f["mma.wgmma"] == 4 and f["mma.wgmma.types"] == ["f32.bf16.bf16"] and f["mma.types"] == ["f32.bf16.bf16"]
    assert f["load.tma"] == 6 and f["regs"] == 155
    assert not _ids(d) & {"dx-cuda-dot-tf32", "dx-cuda-hopper-no-tma", "dx-cuda-dot-on-fma"}


def test_kernels_without_tl_dot_have_no_mma_and_vector_loads(kb):
    d = _read(kb, "softmax")
    f = _facts(d, "softmax_kernel")
    assert "mma.any" not in f and f["load.vector.widths"] == ["4"] and f["dot_calls"] == 0
    assert not _ids(d) & {"dx-cuda-dot-on-fma", "dx-cuda-hopper-no-tma"}


# ---------------------------------------------------------------------------------------- diagnoses
def test_the_start_is_diagnosed_with_its_causes_and_the_stages_that_address_them(kb):
    d = _read(kb, "gemm_relu", [_launch("matmul_kernel", (16384, 1, 1)), _launch("relu_kernel", (16384,))])
    by_id = {f["id"]: f for f in d["findings"]}
    assert set(by_id) == {"dx-cuda-dot-tf32", "dx-cuda-hopper-no-tma", "dx-several-launches"}
    assert by_id["dx-cuda-dot-tf32"]["stage"] == "dtype" and "f32.tf32.tf32" in by_id["dx-cuda-dot-tf32"]["cause"]
    assert by_id["dx-cuda-hopper-no-tma"]["tactics"] == ["tensor-descriptor"]
    # a fact of the call is said once, with every kernel it holds on
    assert by_id["dx-several-launches"]["kernel"] == "matmul_kernel, relu_kernel"
    assert by_id["dx-cuda-dot-tf32"]["where"].startswith("knowledge_base/diagnoses/cuda.yaml:")
    lines = describe(d)
    assert any(x.startswith("compiler: matmul_kernel: regs 46, spills 0") and "MMA mma.sync x8" in x for x in lines)
    assert any(x.startswith("diagnosis: [dx-cuda-dot-tf32] matmul_kernel:") for x in lines)


def test_a_grid_smaller_than_the_device_is_diagnosed_for_split_k(kb):
    d = _read(kb, "gemm_tall_k", [_launch("matmul_kernel", (64,))])
    f = next(f for f in d["findings"] if f["id"] == "dx-fewer-programs-than-cores")
    assert f["tactics"][0] == "split-k" and "64 programs for 132 cores" in f["cause"]
    assert "68 cores get no program" in f["cause"]
    assert "dx-fewer-programs-than-cores" not in _ids(_read(kb, "gemm_tall_k", [_launch("matmul_kernel", (264,))]))
    # 128 programs for 132 cores (linear_relu's 128 x 256 tiles on the H200) fill the device: no split-K hint
    assert "dx-fewer-programs-than-cores" not in _ids(_read(kb, "gemm_tall_k", [_launch("matmul_kernel", (128,))]))


def test_a_part_filled_last_wave_is_diagnosed_for_the_tail_split(kb):
    """gemm_square's 288 tiles at 3000 x 4096 x 3000 on 132 cores: 3 waves, the last with 24 programs; 72.7% of the
    waves' core time has a program, so the gain is bounded at 1.38x. 264 programs (two whole waves) and 380 (the
    third wave 88% full) are not diagnosed."""
    d = _read(kb, "gemm_tall_k", [_launch("matmul_kernel", (288,))])
    f = next(f for f in d["findings"] if f["id"] == "dx-part-filled-last-wave")
    assert f["tactics"] == ["split-k", "per-shape-config"] and f["gain"] == 1.38, f
    assert "288 programs run in 3 waves of 132 cores" in f["cause"] and "0.727 of the waves' core time" in f["cause"]
    assert _facts(d, "matmul_kernel")["wave_fill"] == 0.727 and _facts(d, "matmul_kernel")["waves"] == 3
    for programs in (264, 380, 64):
        assert "dx-part-filled-last-wave" not in _ids(_read(kb, "gemm_tall_k", [_launch("matmul_kernel",
                                                                                         (programs,))]))


def test_a_finding_that_holds_at_another_timed_shape_names_that_shape(kb):
    """Facts are read at every timed shape (issue 34): the same GEMM fills the device at the primary shape and
    leaves cores idle at a decode-sized one; the finding says at which shape, the report lines name it, and the
    rules engine orders split-K first for it."""
    primary = _read(kb, "gemm_tall_k", [_launch("matmul_kernel", (264,))])
    decode = _read(kb, "gemm_tall_k", [_launch("matmul_kernel", (16,))])
    d = by_shape([("bench-gpu", primary), ("bench-gpu-1", decode), ("bench-gpu-2", {"available": False})])
    assert d["shape"] == "bench-gpu" and list(d["by_shape"]) == ["bench-gpu-1"]  # a shape with no facts is left out
    assert "dx-fewer-programs-than-cores" not in _ids(d)  # the primary's own findings are as they were
    found = [f for f in findings_of(d) if f.id == "dx-fewer-programs-than-cores"]
    assert len(found) == 1 and found[0].shape == "bench-gpu-1" and "16 programs for 132 cores" in found[0].cause
    lines = describe(d)
    assert any(x.startswith("diagnosis: [dx-fewer-programs-than-cores] matmul_kernel at bench-gpu-1: the grid has "
                            "16 programs") for x in lines), lines
    assert not any(x.startswith("compiler at") for x in lines)  # the same compiled kernel at both: said once
    names = ("launch-params", "split-k", "swap-ab", "per-shape-config")
    order, why = tactic_order([SimpleNamespace(name=n) for n in names], "device_tuning", d)
    # that shape's class gets its own branch first (split-K, swap-AB or smaller tiles there only), then split-K for
    # every shape: a one-minute port on an H100 ran out of time after the launch search, before per-shape-config
    assert [t.name for t in order] == ["per-shape-config", "split-k", "launch-params", "swap-ab"]
    assert why["per-shape-config"].startswith("diagnosis dx-fewer-programs-than-cores at bench-gpu-1:")
    assert "16 programs" in why["split-k"]
    # a shape that compiled differently (another specialization) gets its own compiler line
    other = json.loads(json.dumps(decode))
    other["kernels"][0]["facts"]["regs"] = 99
    lines = describe(by_shape([("bench-gpu", primary), ("bench-gpu-1", other)]))
    assert any(x.startswith("compiler at bench-gpu-1: matmul_kernel: regs 99") for x in lines), lines


def test_a_device_entry_and_a_triton_version_gate_recognizers_and_diagnoses(kb):
    # TMA is Hopper's: the diagnosis does not apply to an H100-less, H200-less entry (an Intel part here)
    b580 = SimpleNamespace(kind="xpu", name="Intel Arc B580", cores=20, interpreter=False)
    dx = _diagnoser(kb, "arc-b580", b580)
    assert "dx-cuda-hopper-no-tma" not in {d.id for d in dx.diagnoses}
    assert "llir-2d-block-load" in {r.id for r in dx.recognizers} and "ptx-wgmma" not in {r.id for r in dx.recognizers}
    # Triton 2.x has no recognizer for wgmma / TMA (>= 3.0): their facts are unknown, never "missing"
    old = _diagnoser(kb, triton="2.3.0")
    d = old.read(COMPILED / "gemm_relu", SimpleNamespace(launches=[]),
                 parse_kernel((ROOT / "kernels/gemm_relu/kernel.py").read_text()))
    assert "ptx-tma-load" not in {r.id for r in old.recognizers}
    assert "load.tma" in d["kernels"][0]["unknown"] and "dx-cuda-hopper-no-tma" not in _ids(d)


def test_an_unread_ir_proves_nothing(tmp_path, kb):
    """A kernel whose PTX is not there: the facts read from PTX are unknown, and 'missing' conditions fail."""
    src = next((COMPILED / "gemm_relu").glob("matmul_kernel-*"))
    dst = tmp_path / "calls" / src.name
    dst.mkdir(parents=True)
    (dst / "meta.json").write_text((src / "meta.json").read_text())
    kf = read_kernel(dst, _diagnoser(kb).recognizers)
    assert "mma.any" in kf.unknown and "ptx" in kf.unknown["mma.any"]
    assert not holds(Condition(fact="mma.any", missing=True), kf)
    assert kf.facts["regs"] == 46


def test_conditions(kb):
    kf = read_folder(COMPILED / "gemm_relu", _diagnoser(kb).recognizers)[0]
    kf.facts.update({"programs": 64, "device_cores": 132})
    assert holds(Condition(fact="programs", below="device_cores"), kf)
    assert not holds(Condition(fact="programs", above="device_cores"), kf)
    assert holds(Condition(fact="mma.types", has="tf32"), kf) and not holds(Condition(fact="mma.types", has="bf16"), kf)
    assert holds(Condition(fact="load.tma", missing=True), kf) and not holds(Condition(fact="regs", missing=True), kf)
    assert holds(Condition(fact="num_warps", equals=4), kf) and not holds(Condition(fact="nope", above=0), kf)


def test_the_interpreter_says_there_are_no_compiler_facts(kb):
    cpu = SimpleNamespace(kind="cpu", name="interpreter", cores=2, interpreter=True)
    d = Diagnoser(kb, kb.devices["cpu-interpreter"], TritonInfo.parse("3.6.0"), cpu).read(COMPILED / "gemm_relu")
    assert d == {"available": False, "why": NO_COMPILER}
    assert describe(d) == [f"compiler facts: none ({NO_COMPILER})"]


# ---------------------------------------------------------------------------------------- capture
def test_the_capture_writes_metadata_and_text_irs_and_records_what_it_could_not(tmp_path, kb):
    Meta = namedtuple("Meta", "name num_warps num_stages shared hash target build_flags")
    target = SimpleNamespace(backend="xpu", arch="bmg", warp_size=16)

    class Asm(dict):
        def __missing__(self, key):
            raise FileNotFoundError("cuobjdump not found")

    kernel = SimpleNamespace(
        metadata=Meta("k", 8, 2, 65536, "ab" * 32, target, " -cl-intel-256-GRF-per-thread"),
        asm=Asm(ttgir="#ttig.dpas<{repeatCount = 8}>\n", llir="call @_Z__spirv_Subgroup2DBlockLoadINTEL\n" * 3,
                spv=b"\x03\x02#\x07", cubin=b"x"),
        n_regs=128, n_spills=12, n_max_threads=512)
    folder = dump_compiled("k", kernel, tmp_path, "3.6.0")
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["binaries"] == {"spv": 4, "cubin": 1} and "sass" in meta["unavailable"]
    assert sorted(meta["irs"]) == ["llir", "ttgir"] and meta["n_spills"] == 12
    b580 = SimpleNamespace(kind="xpu", name="Intel Arc B580", cores=20, interpreter=False)
    dx = _diagnoser(kb, "arc-b580", b580)
    d = dx.read(tmp_path, SimpleNamespace(launches=[]), None)
    f = d["kernels"][0]["facts"]
    assert f["grf_mode"] == "256" and f["load.block2d"] == 3 and f["dot.dpas_layout"] == 1 and f["spills"] == 12
    assert "dx-register-spills" in _ids(d) and "dx-xpu-spills-default-grf" not in _ids(d)  # 256 already
    # a launch that asked for no grf_mode and got 256: the backend recompiled it after spilling
    plain = SimpleNamespace(kernel="k", grid=(4,), options={"num_warps": 8})
    assert "dx-xpu-grf-recompiled" in _ids(dx.read(tmp_path, SimpleNamespace(launches=[plain]), None))
    asked = SimpleNamespace(kernel="k", grid=(4,), options={"grf_mode": "256"})
    assert "dx-xpu-grf-recompiled" not in _ids(dx.read(tmp_path, SimpleNamespace(launches=[asked]), None))
    assert dump_compiled("k", SimpleNamespace(metadata=None), tmp_path / "none", "3.6.0") is None  # the interpreter
    # only the IRs the recognizers read are written (SASS is never disassembled for nothing)
    assert dx.irs == {"ttgir", "llir"}
    few = dump_compiled("k", kernel, tmp_path / "few", "3.6.0", irs=sorted(dx.irs))
    fmeta = json.loads((few / "meta.json").read_text())
    assert sorted(fmeta["irs"]) == ["llir", "ttgir"] and "sass" in fmeta["not_written"] and "unavailable" not in fmeta
    # what the capture cost, against the call that compiled the kernel
    assert d["kernels"][0]["capture_s"] == meta["capture_s"] and "cost" in d and d["cost"]["first_call_s"] is None
    write_call_cost(tmp_path, 2.0)
    cost = dx.read(tmp_path, SimpleNamespace(launches=[]), None)["cost"]
    assert cost == {"capture_s": meta["capture_s"], "first_call_s": 2.0, "share": round(meta["capture_s"] / 2.0, 4)}


def test_ir_files_are_read_capped(tmp_path, kb, monkeypatch):
    import xeforge.diagnosis.compiler as compiler

    src = next((COMPILED / "gemm_relu").glob("matmul_kernel-*"))
    dst = tmp_path / src.name
    dst.mkdir()
    (dst / "meta.json").write_text((src / "meta.json").read_text())
    (dst / "ptx.txt").write_text("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 " * 1000)
    monkeypatch.setattr(compiler, "MAX_IR_BYTES", 5200)  # the first 5200 bytes: 102 of the 1000 instructions
    assert read_kernel(dst, _diagnoser(kb).recognizers).facts["mma.sync"] == 102


# ---------------------------------------------------------------------------------------- the engines
def test_the_rules_engine_tries_the_diagnosed_tactics_first_and_says_why(kb):
    tactics = [SimpleNamespace(name=n) for n in ("launch-params", "split-k", "group-swizzle", "rows-per-program")]
    d = _read(kb, "gemm_tall_k", [_launch("matmul_kernel", (64,))])
    order, why = tactic_order(tactics, "device_tuning", d)
    assert [t.name for t in order] == ["split-k", "launch-params", "group-swizzle", "rows-per-program"]
    assert why["split-k"].startswith("diagnosis dx-fewer-programs-than-cores:")
    same, none = tactic_order(tactics, "device_tuning", None)
    assert same == tactics and none == {}


def test_a_finding_with_a_bounded_gain_goes_before_the_others(kb):
    """kb41 on an H100: 38 spilled registers at the primary shape (launch-params, epilogue-halves) and 32 programs for
    132 cores at M = 16 (per-shape-config, up to 4.1x there). The finding whose diagnosis bounds its gain by the
    share of cores used goes first, so the port's time reaches the decode branch."""
    from dataclasses import asdict

    from xeforge.diagnosis.rules import Finding

    d = _read(kb, "gemm_tall_k", [_launch("matmul_kernel", (64,))])
    idle = next(f for f in findings_of(d) if f.id == "dx-fewer-programs-than-cores")
    facts = d["kernels"][0]["facts"]
    assert idle.gain == round(1 / facts["core_fill"], 2) > 2  # 64 programs for 132 cores
    spills = Finding("dx-register-spills", "spills", "k", "38 spilled", "device_tuning",
                     ["launch-params", "epilogue-halves"])
    fewer = Finding("dx-fewer-programs-than-cores", "few", "k", "32 programs for 132 cores", "device_tuning",
                    ["split-k", "launch-params", "per-shape-config"], shape="bench-gpu-1", gain=4.12)
    diag = {"available": True, "findings": [asdict(spills)],
            "by_shape": {"bench-gpu-1": {"findings": [asdict(fewer)]}}}
    tactics = [SimpleNamespace(name=n) for n in ("launch-params", "epilogue-halves", "per-shape-config", "split-k")]
    order, why = tactic_order(tactics, "device_tuning", diag)
    assert [t.name for t in order] == ["per-shape-config", "split-k", "launch-params", "epilogue-halves"]
    assert why["launch-params"].startswith("diagnosis dx-fewer-programs-than-cores at bench-gpu-1")
    diag["by_shape"]["bench-gpu-1"]["findings"][0]["gain"] = None  # unbounded: the primary's finding first
    assert [t.name for t in tactic_order(tactics, "device_tuning", diag)[0]][:2] == ["launch-params",
                                                                                    "epilogue-halves"]


def test_a_trial_slower_at_one_shape_puts_the_per_shape_branch_first(kb):
    """On top of a carried trial that lost at M = 16 only, per-shape-config goes before every diagnosed tactic: a
    branch for that class keeps the trial's gain at the other shapes. Without the lost shape the diagnosis decides;
    a stage without the tactic is left as it was."""
    from stages.base import Candidate, TacticRecord, TrialOutcome
    from xeforge.pipeline import _hidden_gain
    from xeforge.verifier import GateResult, Verdict

    tactics = [SimpleNamespace(name=n) for n in ("launch-params", "split-k", "group-swizzle", "per-shape-config")]
    d = _read(kb, "gemm_tall_k", [_launch("matmul_kernel", (64,))])
    order, why = tactic_order(tactics, "device_tuning", d, ("bench-gpu-1",))
    assert [t.name for t in order][:2] == ["per-shape-config", "split-k"]
    assert "slower at bench-gpu-1" in why["per-shape-config"]
    assert [t.name for t in tactic_order(tactics, "device_tuning", d)[0]][0] == "split-k"
    assert tactic_order(tactics[:3], "device_tuning", None, ("bench-gpu-1",))[0] == tactics[:3]
    # the carried trial records where it lost and its own compiler facts
    gate3 = GateResult("3-performance", "fail", "not adopted: slower at bench-gpu-1", {"blocked_by": "bench-gpu-1"})
    v = Verdict("h", [gate3], correct=True, timed=True, speedup=1.2, diagnosis=d)
    rec = TacticRecord("persistent-loop", True, "")
    rec.outcomes = [TrialOutcome("0004-persistent-persistent-loop", Candidate("src", "persistent-loop", "x"), v)]
    carried = _hidden_gain([rec])
    assert carried.trial == "0004-persistent-persistent-loop" and carried.lost_at == ("bench-gpu-1",)
    assert carried.diagnosis is d


def test_run_stage_follows_the_incumbents_diagnosis(kb):
    from stages.base import Applicability, Stage, Tactic
    from xeforge.engines import RulesEngine

    seen = []

    class T(Tactic):
        def __init__(self, name):
            self.name = name

        def check(self, ctx):
            seen.append(self.name)
            return Applicability(False, "test")

        def propose(self, ctx):
            return []

    stage = Stage("device_tuning", 7, "test", [])
    stage.tactics = [T("launch-params"), T("split-k")]
    ctx = SimpleNamespace(source="", diagnosis=_read(kb, "gemm_tall_k", [_launch("matmul_kernel", (64,))]), lost_at=())
    records = RulesEngine().run_stage(stage, ctx, evaluate=None, choose=None)
    assert seen == ["split-k", "launch-params"]
    assert records[0].note.startswith("tried first: diagnosis dx-fewer-programs-than-cores")


def test_the_llm_prompt_carries_the_incumbents_compiler_facts(kb):
    import stages
    from cover_agent.prompts import render_stage_prompt
    from stages.base import StageContext
    from tests.test_cover_prompts import _normalise, check_golden
    from xeforge.devices import DeviceInfo
    from xeforge.problem import load_problem
    from xeforge.settings import Settings

    problem = load_problem(ROOT / "kernels" / "gemm_relu")
    h200 = DeviceInfo("cuda", "NVIDIA H200", cores=132, l2_bytes=50331648, shared_mem_bytes=232448,
                      subgroup_sizes=[32], has_fp64=True, architecture="sm_90")
    kbc = SimpleNamespace(kb=kb, device_id="h200", triton=TritonInfo.parse("3.6.0"), entry=None, note="")
    ctx = StageContext(problem, problem.kernel_source, problem.kernel_source, h200, "h200", kb, kbc.triton, Settings())
    ctx.diagnosis = _read(kb, "gemm_relu", [_launch("matmul_kernel", (16384, 1, 1)), _launch("relu_kernel", (16384,))])
    stage = stages.BY_NAME["dtype"]
    text = render_stage_prompt(stage, ctx, [], kbc, [])
    assert "## What the compiler made of the current kernel" in text
    assert "- diagnosis: [dx-cuda-dot-tf32] matmul_kernel:" in text and "mma.sync x8 (f32.tf32.tf32.f32)" in text
    check_golden("dtype-h200-diagnosed", _normalise(text, stage, ctx, kbc))


def test_a_correct_candidates_feedback_ends_with_its_compiler_facts(kb):
    from cover_agent.feedback import verdict_feedback
    from xeforge.verifier import GateResult, Verdict

    gates = [GateResult("0-isolation", "pass", "ok"), GateResult("1-static", "pass", "ok"),
             GateResult("2-correctness", "pass", "matches"),
             GateResult("3-performance", "fail", "not faster", {"speedup": 0.97, "margin": 0.02})]
    v = Verdict("0" * 16, gates, correct=True, diagnosis=_read(kb, "gemm_relu", [_launch("matmul_kernel", (1,))]))
    status, _, text = verdict_feedback(v, True)
    assert status == "slower" and "diagnosis: [dx-cuda-dot-tf32]" in text and "compiler: matmul_kernel" in text
    assert text.index("diagnosis:") < text.index("compiler:")  # the findings first: they say what to change


# ---------------------------------------------------------------------------------------- the knowledge base
def test_a_diagnosis_naming_an_unknown_fact_or_a_bad_pattern_is_a_lint_error(tmp_path):
    root = tmp_path / "kb"
    import shutil

    shutil.copytree(ROOT / "knowledge_base", root)
    (root / "diagnoses" / "extra.yaml").write_text(
        "diagnoses:\n  - id: dx-typo\n    title: t\n    when:\n      - {fact: spils, above: 0}\n"
        "    cause: c\n    stage: device_tuning\n    source: xeforge-design\n    confidence: derived\n")
    (root / "recognizers" / "extra.yaml").write_text(
        "recognizers:\n  - id: bad-regex\n    title: t\n    ir: ptx\n    pattern: 'wgmma(('\n    fact: x.y\n"
        "    source: xeforge-design\n    confidence: derived\n")
    errors = [e.render() for e in lint_paths([root])]
    assert any("extra.yaml:5" in e and "unknown fact 'spils'" in e and "did you mean 'spills'" in e for e in errors)
    assert any("recognizers/extra.yaml" in e and "regular expression" in e for e in errors)
    (root / "diagnoses" / "extra.yaml").write_text(
        "diagnoses:\n  - id: dx-typo\n    title: t\n    when:\n      - {fact: spills, above: 0}\n"
        "    cause: c\n    stage: device_tuning\n    share: core_fil\n    source: xeforge-design\n"
        "    confidence: derived\n")
    errors = [e.render() for e in lint_paths([root])]
    assert any("extra.yaml:8" in e and "unknown fact 'core_fil'" in e and "did you mean 'core_fill'" in e
               for e in errors), errors


# ---------------------------------------------------------------------------------------- the profile
def test_the_profile_breakdown_groups_the_files_kernels_library_kernels_and_copies():
    from xeforge.diagnosis.profile import breakdown, describe as describe_profile

    events = [{"name": "matmul_kernel", "device_us": 600.0, "calls": 1.0},
              {"name": "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)",
               "device_us": 300.0, "calls": 2.0},
              {"name": "Memcpy HtoD (Pageable -> Device)", "device_us": 100.0, "calls": 1.0},
              {"name": "bogus", "device_us": -1}, {"device_us": 5.0}, "not an event"]
    view = breakdown(events, {"matmul_kernel"})
    assert view["total_us"] == 1000.0 and view["triton_share"] == 0.6
    assert [(r["name"], r["kind"], r["share"]) for r in view["rows"]] == [
        ("matmul_kernel", "triton", 0.6), ("at::native::vectorized_elementwise_kernel", "library", 0.3),
        ("Memcpy HtoD", "copy", 0.1)]
    assert describe_profile(view).endswith("Triton kernels 60% of 1000.0 us of device time per call")
    many = breakdown([{"name": f"k{i}", "device_us": 1.0} for i in range(20)], set())
    assert len(many["rows"]) == 13 and many["rows"][-1]["name"] == "8 other kernel(s)"
    assert breakdown([], {"k"}) == {"available": False, "why": "the profiler recorded no device time"}


def test_the_interpreter_has_no_device_timeline(tmp_path):
    from xeforge.devices import describe as describe_device
    from xeforge.problem import load_problem
    from xeforge.settings import Settings
    from xeforge.verifier import Verifier

    p = load_problem(ROOT / "kernels" / "vector_add")
    with Verifier(p, describe_device("cpu"), Settings(), tmp_path) as v:
        out = v.profile(p.kernel_path, p.variant("ci"))
    assert out == {"available": False, "why": "the CPU interpreter has no device timeline"}
    assert v.deep_profile(p.kernel_path, p.variant("ci")) == {"available": False,
                                                             "why": "no hardware counters on the CPU interpreter"}


def test_the_deep_profile_reads_ncus_raw_csv_page():
    """The fixed set per kernel from ncu's raw page (DEEP_CSV: recorded on the H200, the start of gemm_relu)."""
    from xeforge.diagnosis.deep import describe as describe_deep, read_ncu_csv

    view = read_ncu_csv(DEEP_CSV)
    assert view["available"] and view["tool"] == "ncu"
    assert [k["kernel"] for k in view["kernels"]] == ["matmul_kernel", "relu_kernel"]  # one call: warm-up not counted
    k, relu = view["kernels"]
    assert k["time_us"] == pytest.approx(1220.16) and relu["time_us"] == pytest.approx(16.128)  # nsecond -> us
    assert all(0 <= k[m] <= 100 for m in ("compute_pct", "memory_pct", "occupancy_pct"))
    assert relu["memory_pct"] > relu["compute_pct"] and relu["stalls"][0]["reason"] == "long_scoreboard"
    # the GEMM's own distance to the roofs: tf32 mma.sync keeps the tensor pipe at 35%, DRAM at 7% of peak
    assert (k["tensor_pipe_pct"], k["dram_pct"]) == (pytest.approx(34.99), pytest.approx(6.53))
    assert 1 <= len(k["stalls"]) <= 3 and k["stalls"] == sorted(k["stalls"], key=lambda s: -s["cycles"])
    line = describe_deep(view)[0]
    assert line.startswith("deep profile (ncu): ") and "SM throughput" in line and "top stalls: " in line


def test_the_deep_profile_says_why_there_is_none(tmp_path, monkeypatch):
    from xeforge.diagnosis.deep import describe as describe_deep, read_ncu_csv, tool_for

    monkeypatch.setenv("PATH", str(tmp_path))  # no ncu, no unitrace
    assert tool_for("cuda") == (None, "ncu (Nsight Compute) is not on PATH: install Nsight Compute or put its "
                                      "folder on PATH for --profile deep")
    assert tool_for("xpu")[0] is None and "unitrace or VTune (neither is on PATH)" in tool_for("xpu")[1]
    assert read_ncu_csv(tmp_path / "none.csv")["why"] == "ncu wrote no report (its log file is missing)"
    log = tmp_path / "ncu.csv"
    log.write_text("==PROF== Connected to process 12 (/usr/bin/python3)\n==ERROR== ERR_NVGPUCTRPERM - The user "
                   "does not have permission to access NVIDIA GPU Performance Counters\n")
    why = read_ncu_csv(log)["why"]
    assert why.startswith("ncu profiled no kernel: ==ERROR== ERR_NVGPUCTRPERM")
    assert describe_deep({"available": False, "why": why}) == [f"deep profile: none ({why})"]


def test_a_worker_runs_under_a_profiler_prefix_inside_its_sandbox(tmp_path):
    """The deep worker's prefix (ncu there) runs the worker as its child; the protocol is untouched."""
    from xeforge.isolation import Worker

    marker = tmp_path / "w" / "prefix-ran"
    (tmp_path / "w").mkdir()
    script = tmp_path / "w" / "fake-profiler"  # inside the sandbox /tmp is empty: the worker's own folder is not
    script.write_text(f'#!/bin/sh\necho "profiler args: $1" > {marker}\nshift\nexec "$@"\n')
    script.chmod(0o755)
    with Worker("cpu", tmp_path / "w", prefix=(str(script), "--clock-control")) as w:
        w.start(timeout=60)
        assert w.alive()
    assert marker.read_text() == "profiler args: --clock-control\n"
