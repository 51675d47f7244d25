"""`xeforge bench`: the real CLI on the CPU interpreter (correctness only, failures recorded, --workers), and the
GPU path (timing, speedups, roofline, geomeans) through a scripted verifier with fixed per-call times.

The scripted run also produces tests/golden/reports/bench_{gpu,cpu}.json, the inputs of the report goldens in
tests/test_report.py; after an intended change to the bench record, accept them with
    XEFORGE_ACCEPT_GOLDEN=1 .venv/bin/python -m pytest tests/test_bench.py tests/test_report.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import FIXTURES, ROOT
from tests.test_report import check_golden
from xeforge import bench, schedule
from xeforge.devices import DeviceInfo
from xeforge.errors import UsageError
from xeforge.isolation import WorkerFailure
from xeforge.settings import Settings
from xeforge.verifier import GateResult, Verdict

VADD = FIXTURES / "problems" / "vadd"
ROWSUM = FIXTURES / "problems" / "rowsum"


def _bench_cli(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xeforge", "bench", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def _copy_problem(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _fake_port_run(runs: Path, problem: Path, kernel_text: str, device: str = "cpu", stamp: str = "20250101-000000",
                   start_text: str | None = None, correct: bool = True) -> Path:
    """A port run folder as xeforge port leaves it, reduced to what bench reads."""
    from xeforge.problem import source_hash

    run = runs / problem.name / stamp
    (run / "final").mkdir(parents=True)
    (run / "final" / "kernel.py").write_text(kernel_text)
    start = start_text if start_text is not None else (problem / "kernel.py").read_text()
    report = {"problem": problem.name, "device": {"kind": device}, "engine": "rules",
              "baseline": {"source_hash": source_hash(start)},
              "final": {"path": "/somewhere/else/final/kernel.py", "claim": "synthetic port result",
                        "improved": True, "is_start": False, "source_hash": source_hash(kernel_text),
                        "verdict": {"correct": correct}}}
    (run / "report.json").write_text(json.dumps(report))
    return run


# ------------------------------------------------------------------------------------------------ CPU, real CLI
@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """vadd (with a verified port result waiting in the runs folder) and rowsum (none), on the CPU interpreter."""
    tmp = tmp_path_factory.mktemp("bench-cpu")
    ported = VADD.joinpath("kernel.py").read_text().replace("BLOCK=64", "BLOCK=128").replace("cdiv(n, 64)", "cdiv(n, 128)")
    assert ported != VADD.joinpath("kernel.py").read_text()
    _fake_port_run(tmp / "runs", VADD, ported)
    _fake_port_run(tmp / "runs", VADD, "stale", stamp="20250102-000000", start_text="an older starting kernel")
    out = tmp / "out"
    proc = _bench_cli(str(VADD), str(ROWSUM), "--device", "cpu", "--out", str(out), "--runs-dir", str(tmp / "runs"))
    return SimpleNamespace(proc=proc, out=out, report=json.loads((out / "bench.json").read_text()), ported=ported)


def test_cpu_bench_writes_every_output_labelled_correctness_only(cpu_run):
    proc, out, rep = cpu_run.proc, cpu_run.out, cpu_run.report
    assert proc.returncode == 0, proc.stderr
    for name in ("bench.json", "bench.md", "bench.html"):
        assert (out / name).stat().st_size > 0
    assert rep["kind"] == "bench" and rep["status"] == "done" and rep["timed"] is False
    assert rep["timing_method"] is None and rep["pairs"] is None
    # the header line comes first everywhere: stdout, Markdown, HTML
    assert proc.stdout.splitlines()[0].startswith("CORRECTNESS ONLY")
    md, html = (out / "bench.md").read_text(), (out / "bench.html").read_text()
    assert "CORRECTNESS ONLY" in md.split("## Suite")[0] and 'class="banner">CORRECTNESS ONLY' in html
    assert "speedup" not in rep["summary"] and rep["summary"].startswith("correctness only")
    # the time columns read "not timed"; nothing claims a speed
    header, *rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| ")]
    cols = [c.strip() for c in header.strip("|").split("|")]
    for row in rows:
        cells = dict(zip(cols, [c.strip() for c in row.strip("|").split("|")]))
        assert cells["start ms [IQR]"] == "not timed" and cells["eager ms [IQR]"] == "not timed"
        assert cells["final/eager"] == "not timed" and cells["achieved"] == "not timed"
    assert not list(out.glob("plots/*.png")), "no plot may be drawn from a correctness-only run"
    assert "not drawn — nothing was timed" in md


def test_cpu_bench_rows_carry_verification_and_provenance(cpu_run):
    from xeforge.problem import source_hash

    rows = {r["problem"]: r for r in cpu_run.report["problems"]}
    assert list(rows) == ["vadd", "rowsum"]
    v, r = rows["vadd"], rows["rowsum"]
    assert v["entries"]["start"]["verified"] == "verified" and "float64 PyTorch reference" in v["entries"]["start"]["verification"]
    # the newest *matching* port run is used; the newer one for an older starting kernel is skipped and said so
    assert v["port_run"]["run_dir"].endswith("20250101-000000")
    assert any("starting kernel differs" in n for n in v["notes"])
    assert v["entries"]["final"]["verified"] == "verified"
    assert v["entries"]["final"]["source_hash"] == source_hash(cpu_run.ported)
    assert v["entries"]["start"]["source_hash"] == source_hash(VADD.joinpath("kernel.py").read_text())
    assert r["entries"]["final"]["path"] is None and r["entries"]["final"]["verified"] == "not run"
    assert "xeforge port" in r["entries"]["final"]["verification"]
    for row in rows.values():
        assert row["entries"]["start"]["checked_variants"][0] == "ci"
        assert row["entries"]["start"]["rounds"] >= bench.CPU_ROUNDS
        assert row["entries"]["eager"]["verified"] == "not run" and row["entries"]["eager"]["time"] is None
    rep = cpu_run.report
    assert rep["versions"]["triton"] and rep["device"]["kind"] == "cpu"
    assert rep["settings"]["correctness_rounds"] == bench.CPU_ROUNDS
    assert rep["counts"]["start_verified"] == 2 and rep["counts"]["final_verified"] == 1


@pytest.mark.slow  # two bench worker subprocesses over three problems (about 27 s): CI runs it with make test-slow
def test_failing_problems_are_recorded_and_the_run_goes_on(tmp_path):
    """Through --workers 2: a kernel that fails gate 2, a spec that does not load, and a good problem."""
    zero = _copy_problem(VADD, tmp_path / "vadd_zero")
    (zero / "kernel.py").write_text((FIXTURES / "cheats" / "returns_zeros.py").read_text())
    badspec = _copy_problem(ROWSUM, tmp_path / "badspec")
    with open(badspec / "spec.yaml", "a") as fh:
        fh.write("bogus_key: 1\n")
    out = tmp_path / "out"
    proc = _bench_cli(str(zero), str(badspec), str(ROWSUM), "--device", "cpu", "--out", str(out), "--workers", "2",
                      "--runs-dir", str(tmp_path / "runs"))
    assert proc.returncode == 2, proc.stderr  # something failed: never a quiet success
    assert "Traceback" not in proc.stderr
    rep = json.loads((out / "bench.json").read_text())
    assert [r["problem"] for r in rep["problems"]] == ["vadd_zero", "badspec", "rowsum"]  # merged in order
    z, b, r = rep["problems"]
    assert z["status"] == "ok" and z["entries"]["start"]["verified"] == "failed"
    assert "2-correctness" in z["entries"]["start"]["verification"] and "outside tolerance" in z["entries"]["start"]["verification"]
    assert b["status"] == "error" and "bogus_key" in b["error"] and "spec.yaml" in b["error"]
    assert r["status"] == "ok" and r["entries"]["start"]["verified"] == "verified"
    assert all(row["worker"]["exit_code"] in (0, 2) for row in rep["problems"])
    md = (out / "bench.md").read_text()
    assert "## Errors and failures" in md and "bogus_key" in md and "failed verification" in md
    assert rep["counts"] == {**rep["counts"], "errors": 1, "start_failed": 1, "start_verified": 1}


def test_bad_arguments_are_clear_errors(tmp_path):
    proc = _bench_cli(str(tmp_path / "nope"), "--device", "cpu", "--out", str(tmp_path / "o"))
    assert proc.returncode == 1 and "Error:" in proc.stderr and "no such file" in proc.stderr
    assert "Traceback" not in proc.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = _bench_cli(str(empty), "--device", "cpu", "--out", str(tmp_path / "o"))
    assert proc.returncode == 1 and "neither a problem folder" in proc.stderr


def test_discovery_and_settings(tmp_path):
    found = bench.discover([str(ROOT / "kernels")])
    assert len(found) >= 20 and all((p / "spec.yaml").exists() for p in found)
    suite = tmp_path / "suite"
    shutil.copytree(VADD, suite / "vadd")
    (suite / "_scratch").mkdir()
    (suite / "_scratch" / "notes.py").write_text("# not a problem\n")
    assert [p.name for p in bench.discover([str(suite)])] == ["vadd"]  # only folders that are problems
    assert bench.discover([str(VADD), str(VADD)]) == [VADD]  # de-duplicated
    with pytest.raises(UsageError):
        bench.discover([str(tmp_path / "missing")])
    opt = bench.BenchOptions(problems=[])
    assert bench.bench_settings(opt, "cpu", env={}).correctness_rounds == bench.CPU_ROUNDS
    assert bench.bench_settings(opt, "cuda", env={}).correctness_rounds == Settings().correctness_rounds
    assert bench.bench_settings(opt, "cpu", env={"XEFORGE_ROUNDS": "4"}).correctness_rounds == 4
    with pytest.raises(UsageError):
        bench.bench_settings(bench.BenchOptions(problems=[], pairs=1), "cuda", env={})
    assert schedule.gpu_slots("cpu", 3) == [{}, {}, {}]
    # GPU lanes: one device each, and a share of the CPUs for torch.compile's workers unless the user set it
    two = schedule.gpu_slots("cuda", 2, env={}, count=2, cpus=32)
    assert two == [{"CUDA_VISIBLE_DEVICES": "0", "TORCHINDUCTOR_COMPILE_THREADS": "8"},
                   {"CUDA_VISIBLE_DEVICES": "1", "TORCHINDUCTOR_COMPILE_THREADS": "8"}]
    assert schedule.gpu_slots("xpu", 1, env={"ZE_AFFINITY_MASK": "3"}, count=4, cpus=32) == [{"ZE_AFFINITY_MASK": "3"}]
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in schedule.gpu_slots(
        "cuda", 2, env={"TORCHINDUCTOR_COMPILE_THREADS": "4"}, count=2)[0]
    with pytest.raises(UsageError):
        schedule.gpu_slots("cuda", 3, env={}, count=2)


def test_port_result_prefers_the_device_and_skips_failed_runs(tmp_path):
    from xeforge.problem import source_hash

    runs = tmp_path / "runs"
    start = VADD.joinpath("kernel.py").read_text()
    _fake_port_run(runs, VADD, "# on cuda\n", device="cuda", stamp="20250101-000000")
    _fake_port_run(runs, VADD, "# on cpu, newer\n", device="cpu", stamp="20250102-000000")
    _fake_port_run(runs, VADD, "# failed final gate\n", device="cuda", stamp="20250103-000000", correct=False)
    info, notes = bench.find_port_result(runs, "vadd", source_hash(start), "cuda")
    assert info["run_dir"].endswith("20250101-000000") and not notes
    info, notes = bench.find_port_result(runs, "vadd", source_hash(start), "xpu")
    assert info["run_dir"].endswith("20250102-000000") and "made on cpu" in notes[0]
    assert bench.find_port_result(runs, "rowsum", "x", "cuda") == (None, [])


# ------------------------------------------------------------------------------------------------ GPU path, scripted
SPEC = """kind: {kind}
origin: naive-port
description: "{desc}"
precision: strict
inputs:
{inputs}
ci:
  - params: [{params}]
    dtype: float32
    dims: {{{ci}}}
    flop: "{flop}"
    bytes: "{bytes_ci}"
bench-gpu:
  - params: [{params}]
    dtype: bfloat16
    dims: {{{gpu}}}
    flop: "{flop}"
    bytes: "{bytes_gpu}"
"""
# a second timed shape (decode-like) for one problem: the bench times every entry again there
SHAPE_1 = {"softmax_fake": "R: 16, C: 8192", "gemm_fake": "M: 16, N: 4096, K: 4096"}
SHAPE_1_MS = {"softmax_fake": {"start": 0.050, "final": 0.060, "eager": 0.040, "compile": 0.035},  # final slower
              "gemm_fake": {"start": 0.060, "final": 0.030, "eager": 0.028, "compile": 0.027, "blas": 0.025}}

SYNTHETIC = {
    # name: (kind, description, inputs, params, ci dims, gpu dims, flop, bytes formula without the element size)
    "gemm_fake": ("gemm", "synthetic GEMM (compute-bound)", {"A": ["M", "K"], "B": ["K", "N"]}, "A, B",
                  "M: 32, N: 32, K: 32", "M: 4096, N: 4096, K: 4096", "2*M*N*K", "(M*K + K*N + M*N)"),
    "softmax_fake": ("reduction", "synthetic row softmax (memory-bound)", {"X": ["R", "C"]}, "X",
                     "R: 8, C: 64", "R: 8192, C: 8192", "5*R*C", "2*R*C"),
    "broken_fake": ("elementwise", "its starting kernel fails verification", {"X": ["N"]}, "X",
                    "N: 64", "N: 16777216", "N", "2*N"),
    "compile_breaks_fake": ("elementwise", "torch.compile breaks the timing run", {"X": ["N"]}, "X",
                            "N: 64", "N: 16777216", "N", "2*N"),
}
# median ms of each entry on bench-gpu: start, final, eager, compile
BASE_MS = {
    "gemm_fake": {"start": 1.40, "final": 0.20, "eager": 0.18, "compile": 0.175, "blas": 0.17},
    "softmax_fake": {"start": 0.90, "final": 0.30, "eager": 0.45, "compile": 0.32},
    "broken_fake": {"start": 0.50, "eager": 0.08, "compile": 0.07},
    "compile_breaks_fake": {"start": 0.12, "eager": 0.10, "compile": 0.09},
}
PEAK = {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}
BANDWIDTH = 4.8e12
WOBBLE = [1 + 0.004 * ((i * 7) % 5 - 2) for i in range(20)]  # fixed per-round noise: medians stay exact


class FakeEntry:
    id = "fake-h200"
    bandwidth_bytes_per_s = BANDWIDTH

    def peak_flops(self, dtype: str):
        return PEAK.get(dtype)


class ScriptedVerifier:
    """Stands in for xeforge.verifier.Verifier: verdicts by file content, times from BASE_MS."""

    calls: list = []

    def __init__(self, problem, device, settings, workdir, hooks, entry):
        self.problem, self.device = problem, device

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def verify(self, path, incumbent=None, *, source_hash=""):
        text = Path(path).read_text()
        gates = [GateResult("0-isolation", "pass", f"ran in an isolated worker on {self.device.kind}"),
                 GateResult("1-static", "pass", "static checks and knowledge-base constraints passed")]
        if "BROKEN" in text:
            gates.append(GateResult("2-correctness", "fail", "variant ci (N=64), normal inputs: output: 100.00% of "
                                    "elements outside tolerance (synthetic)"))
            return Verdict(source_hash, gates, correct=False)
        variants = ["ci", "bench-gpu", "ci-ragged-odd"] if self.device.can_time else ["ci", "ci-ragged-odd"]
        gates.append(GateResult("2-correctness", "pass", f"matches the float64 PyTorch reference on 12 rounds over "
                                f"{', '.join(variants)}", {"rounds": 12, "variants": variants,
                                                           "oracle": "float64 PyTorch reference"}))
        diagnosis = None
        if self.device.can_time and self.problem.name == "gemm_fake":  # the compiler facts a GPU verdict carries
            kernel = {"kernel": "gemm_kernel", "backend": "cuda", "arch": "90", "triton": "3.6.0", "unknown": {},
                      "facts": {"regs": 46 if "runs" not in Path(path).parts else 154, "spills": 0, "num_warps": 4}}
            diagnosis = {"available": True, "kernels": [kernel], "findings": []}
        return Verdict(source_hash, gates, correct=True, diagnosis=diagnosis)

    def profile(self, path, variant):
        """The profiler's events of one call (synthetic), through the real breakdown."""
        from xeforge.diagnosis.profile import breakdown

        final = "runs" in Path(path).parts
        events = [{"name": "gemm_kernel", "device_us": 80.0 if final else 300.0, "calls": 1.0},
                  {"name": "void at::native::vectorized_elementwise_kernel<4, at::native::AbsFunctor<float>>(int)",
                   "device_us": 4.0, "calls": 1.0},
                  {"name": "Memset (Device)", "device_us": 1.0, "calls": 1.0}]
        return {**breakdown(events, {"gemm_kernel"}), "events": events}

    def time_entries(self, entries, variant, pairs=None):
        assert self.device.can_time and variant.name in ("bench-gpu", "bench-gpu-1")
        type(self).calls.append((self.problem.name, [(Path(p).name, m) for p, m in entries], pairs))
        table = BASE_MS if variant.name == "bench-gpu" else SHAPE_1_MS
        out = []
        for path, mode in entries:
            p = Path(path)
            key = "compile" if mode else ("eager" if p.name == "reference.py" else "blas" if p.name.startswith("blas_gemm")
                                          else ("final" if "runs" in p.parts else "start"))
            if key == "compile" and self.problem.name == "compile_breaks_fake":
                raise WorkerFailure("exception", "BackendCompilerFailed: synthetic inductor failure", "reference.py:1")
            out.append([table[self.problem.name][key] * w for w in WOBBLE[: pairs or 20]])
        return out


def _write_synthetic(root: Path) -> tuple[list[Path], Path]:
    problems = []
    for name, (kind, desc, inputs, params, ci, gpu, flop, nbytes) in SYNTHETIC.items():
        d = root / "problems" / name
        d.mkdir(parents=True)
        spec = SPEC.format(kind=kind, desc=desc, params=params, ci=ci, gpu=gpu, flop=flop,
                           inputs="\n".join(f"  {k}: {{shape: [{', '.join(v)}], dtype: bfloat16}}" for k, v in inputs.items()),
                           bytes_ci=f"4*{nbytes}", bytes_gpu=f"2*{nbytes}")
        if name in SHAPE_1:
            spec += (f"bench-gpu-1:\n  - params: [{params}]\n    dtype: bfloat16\n    dims: {{{SHAPE_1[name]}}}\n"
                     f"    flop: \"{flop}\"\n    bytes: \"2*{nbytes}\"\n")
        (d / "spec.yaml").write_text(spec)
        body = "BROKEN: returns zeros\n" if name == "broken_fake" else "launches its Triton kernel\n"
        (d / "kernel.py").write_text(f"# synthetic starting kernel of {name}: {body}")
        (d / "reference.py").write_text(f"# synthetic PyTorch reference of {name}\n")
        problems.append(d)
    runs = root / "runs"
    for name in ("gemm_fake", "softmax_fake"):
        _fake_port_run(runs, root / "problems" / name, f"# synthetic port result of {name}\n", device="cuda")
    return problems, runs


def scripted_report(root: Path, kind: str) -> dict:
    """A bench report made by the real bench code over synthetic problems with a scripted verifier."""
    problems, runs = _write_synthetic(root)
    if kind == "cuda":
        device = DeviceInfo("cuda", "NVIDIA H200 (synthetic)", cores=132, l2_bytes=50 * 2**20, architecture="sm_90",
                            driver="synthetic-driver", torch="2.x", triton="3.x")
    else:
        device = DeviceInfo("cpu", "Triton interpreter (synthetic)", cores=2, architecture="x86_64", interpreter=True)
    opt = bench.BenchOptions(problems=[str(p) for p in problems], device=kind, runs_dir=runs,
                             argv=["bench", "kernels/", "--device", kind])
    settings = Settings() if kind == "cuda" else Settings(correctness_rounds=bench.CPU_ROUNDS)
    kbc = SimpleNamespace(kb=None, device_id="fake-h200" if kind == "cuda" else "cpu-interpreter",
                          entry=FakeEntry() if kind == "cuda" else None, note="",
                          triton=SimpleNamespace(text="3.x"))
    ctx = bench.BenchContext(device, kbc, settings, opt, root / "work", ScriptedVerifier)
    report = bench.new_report(opt, device, kbc, settings, root / "out")
    for p in problems:
        report["problems"].append(bench.bench_problem(p, ctx))
    report["status"] = "done"
    return bench.finalize(report)


def normalise(report: dict, root: Path) -> dict:
    """Replace everything that depends on the machine or the clock."""
    text = json.dumps(report).replace(str(root), "<tmp>")
    rep = json.loads(text)
    rep["created"] = "2025-01-01T12:00:00"
    rep["versions"] = {"python": "3.x", "torch": "2.x", "triton": "3.x"}
    rep["elapsed_s"] = 12.5
    shown = ("correctness_rounds", "ragged_shapes", "warmup_calls", "timed_pairs", "compile_timeout_s", "run_timeout_s")
    rep["settings"] = {k: rep["settings"][k] for k in shown}  # new Settings fields must not move the goldens
    for r in rep["problems"]:
        r["elapsed_s"] = 1.0
    return rep


@pytest.fixture(scope="module")
def gpu_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic-gpu")
    ScriptedVerifier.calls = []
    return normalise(scripted_report(root, "cuda"), root), list(ScriptedVerifier.calls)


def test_gpu_path_times_interleaved_and_derives_speedups(gpu_report):
    rep, calls = gpu_report
    rows = {r["problem"]: r for r in rep["problems"]}
    g = rows["gemm_fake"]
    # one interleaved run with all entries, the compile entry in torch.compile's default mode; a gemm also times
    # the vendor BLAS doing its GEMM alone (the "% of cuBLAS" figure)
    assert calls[0] == ("gemm_fake", [("kernel.py", None), ("kernel.py", None), ("reference.py", None),
                                      ("reference.py", "default"), ("blas_gemm.py", None)], 20)
    assert g["speedups"]["final_vs_blas"]["value"] == pytest.approx(0.17 / 0.20)
    assert "blas" not in rows["softmax_fake"]["entries"]  # not a GEMM: no BLAS baseline
    assert g["speedups"]["final_vs_start"]["value"] == pytest.approx(1.40 / 0.20)
    assert g["speedups"]["final_vs_eager"]["value"] == pytest.approx(0.18 / 0.20)
    assert g["speedups"]["final_vs_compile"]["value"] == pytest.approx(0.175 / 0.20)
    assert g["speedups"]["final_vs_start"]["ratio_iqr"] == pytest.approx(0.0, abs=1e-9)  # same wobble each round
    start = g["entries"]["start"]
    assert start["time"]["median_ms"] == pytest.approx(1.40) and start["time"]["n"] == 20
    assert start["time"]["iqr_ms"] > 0 and len(start["time"]["times_ms"]) == 20
    flop = 2 * 4096**3
    nbytes = 2 * 3 * 4096 * 4096
    assert g["roofline"]["bound"] == "compute" and g["roofline"]["floor_ms"] == pytest.approx(flop / 989e12 * 1e3)
    assert g["entries"]["final"]["achieved"]["flop_per_s"] == pytest.approx(flop / 0.20e-3)
    assert g["entries"]["final"]["achieved"]["pct_roofline"] == pytest.approx(100 * (flop / 989e12) / 0.20e-3)
    assert g["roofline"]["intensity"] == pytest.approx(flop / nbytes)
    s = rows["softmax_fake"]
    assert s["roofline"]["bound"] == "memory"
    assert s["entries"]["final"]["achieved"]["pct_roofline"] == pytest.approx(100 * (2 * 2 * 8192 * 8192 / BANDWIDTH) / 0.30e-3)
    # a kernel that fails verification is not timed; PyTorch still is
    b = rows["broken_fake"]
    assert b["entries"]["start"]["verified"] == "failed" and b["entries"]["start"]["time"] is None
    assert "failed verification" in b["entries"]["start"]["not_timed"] and b["entries"]["eager"]["time"]
    assert "final_vs_start" not in b["speedups"] and "start_vs_eager" not in b["speedups"]
    # one entry that breaks the timing run is found and dropped; the others are still timed
    c = rows["compile_breaks_fake"]
    assert "BackendCompilerFailed" in c["entries"]["compile"]["error"] and c["entries"]["compile"]["time"] is None
    assert c["entries"]["start"]["time"]["median_ms"] == pytest.approx(0.12)
    assert c["speedups"]["start_vs_eager"]["value"] == pytest.approx(0.10 / 0.12)
    # geomeans over the rows that have both sides
    gm = rep["geomean"]
    assert gm["final_vs_eager"]["n"] == 2
    assert gm["final_vs_eager"]["value"] == pytest.approx(((0.18 / 0.20) * (0.45 / 0.30)) ** 0.5)
    assert gm["start_vs_eager"]["n"] == 3
    assert rep["timed"] and "geomean port result vs eager" in rep["summary"]
    assert bench.exit_code(rep) == 2  # a failed kernel and an entry error: not a clean run


def test_blas_baseline_times_the_gemm_alone_and_ignores_the_problems_weights(tmp_path):
    import torch

    from xeforge.problem import load_problem

    gemm = load_problem(ROOT / "kernels" / "gemm_relu")
    path = bench.blas_baseline(gemm, gemm.variant("ci"), tmp_path)
    ns: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    m = ns["Model"](*gemm.init_args(gemm.variant("ci")))
    m.load_state_dict({"weight": torch.zeros(1)}, strict=True)  # the worker loads the problem's weights into it
    d = gemm.variant("ci").dims
    out = m(torch.zeros(3))
    assert out.shape == (d["M"], d["N"]) and torch.allclose(out, m.a @ m.b)
    assert bench.blas_baseline(load_problem(ROOT / "kernels" / "softmax"), load_problem(ROOT / "kernels" / "softmax")
                               .variant("ci"), tmp_path) is None


def test_blas_baseline_takes_the_problems_compute_dtype_where_the_variant_names_none(tmp_path):
    """A problem brought in with `xeforge new` gives its dtype through its inputs (bfloat16 here), not its variants:
    the vendor GEMM is timed in bfloat16, not in the float32 its buffers are drawn in (on an H100 that was 52
    TFLOP/s against about 600)."""
    import torch

    from tests.realworld import problem_dir
    from xeforge.problem import load_problem

    p = load_problem(problem_dir("matmul_config_by_m"))
    v = p.variant("bench-gpu")
    assert v.dtype is None and p.compute_dtype(v) == "bfloat16"
    path = bench.blas_baseline(p, v, tmp_path)
    assert "DTYPE = torch.bfloat16" in path.read_text()
    small = bench.blas_baseline(load_problem(ROOT / "kernels" / "gemm_relu"), load_problem(ROOT / "kernels" /
                                                                                         "gemm_relu").variant("ci"),
                                tmp_path)
    ns: dict = {}
    exec(compile(small.read_text(), str(small), "exec"), ns)
    assert ns["Model"]().a.dtype == torch.float32  # ci is a float32 variant


def test_an_int8_gemm_computes_in_int8_against_a_float64_reference(tmp_path):
    """W8A8 (int8 operands listed before their float32 scales): on an H100 the bench took float32 for its dtype, so
    its roofline was the 67 TFLOP/s fp32 peak (1201%), its BLAS baseline an fp32 GEMM (15.6x) and its reference's
    float64 product a like-for-like torch.compile (13.8x). It computes in int8 now: the int8 peak, an int8 vendor
    GEMM (``torch._int_mm``, where cuBLASLt takes the shape) for the BLAS baseline, and the float64 reference named
    as wider."""
    import dataclasses

    import torch

    from tests.realworld import problem_dir
    from xeforge.kb.loader import load_kb
    from xeforge.problem import load_problem

    p = load_problem(problem_dir("w8a8_int8_matmul"))
    v = p.variant("bench-gpu")
    assert v.dtype is None and p.compute_dtype(v) == "int8"
    assert "torch._int_mm" in bench.blas_baseline(p, v, tmp_path).read_text()
    ci = dataclasses.replace(v, dims={**v.dims, "M": 40, "N": 48, "K": 64})  # bench-gpu's form at a CPU's size
    path = bench.blas_baseline(p, ci, tmp_path)  # M = 40 > 16: cuBLASLt's int8 GEMM takes it
    assert "torch._int_mm" in path.read_text() and "torch.matmul" not in path.read_text()
    ns: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    m = ns["Model"]()
    out = m()
    assert out.dtype == torch.int32 and out.shape == (ci.dims["M"], ci.dims["N"])
    assert torch.equal(out, m.a.int() @ m.w.int().t())
    decode = next(x for x in p.spec.variants.values() if x.dims.get("M") == 16)
    assert bench.blas_baseline(p, decode, tmp_path) is None  # 16 rows: _int_mm's CUDA check refuses it
    assert bench.blas_baseline(p, ci, tmp_path, kind="xpu") is None
    why = bench.reference_widening(p, v)
    assert why and "in float64 where the problem computes in int8" in why, why
    roof = bench.roofline_for(v, "int8", load_kb().devices["h100"])
    assert roof["dtype"] == "int8" and roof["peak_flops"] == pytest.approx(1979e12)
    # its output is dequantized into the bias's bfloat16: checked with bf16's tolerance at every GPU shape (int8's
    # compute dtype gave fp32's 1e-4, and on an H100 its start was rejected at ci@int8 by its own bf16 rounding)
    assert {p.tolerance_dtype(x) for x in p.variants_for("cuda")} == {"bfloat16"}
    assert [x.name for x in p.variants_for("cuda")][0] == "ci@int8"
    assert p.tolerance_dtype(p.variant("ci")) == "float32"  # the interpreter's ci, in its ci_dtype


def test_blas_baseline_of_a_batched_gemm_times_the_whole_batch(tmp_path):
    """batched_matmul_3d (B = 128 GEMMs of 4096 x 128 @ 128 x 512) was compared with one GEMM of that size on an
    H200: 0.0069 ms against the kernel's 0.289. The baseline now runs the batch its flop count says; a flop count
    that is no whole number of GEMMs gets no baseline."""
    from tests.realworld import problem_dir
    from xeforge.problem import load_problem

    p = load_problem(problem_dir("batched_matmul_3d"))
    path = bench.blas_baseline(p, p.variant("bench-gpu"), tmp_path)
    ns: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    d = p.variant("ci").dims
    ci = bench.blas_baseline(p, p.variant("ci"), tmp_path, "ci.py")
    exec(compile(ci.read_text(), str(ci), "exec"), ns)
    m = ns["Model"]()
    assert m(None).shape == (d["B"], d["M"], d["N"])
    assert "torch.randn(128, M, K" in path.read_text()
    assert bench.gemm_batch(2 * 16 * 32 * 64 + 16 * 32, 16, 32, 64) == 1  # one GEMM and its epilogue
    assert bench.gemm_batch(2.5 * 2 * 16 * 32 * 64, 16, 32, 64) is None


def test_gpu_bench_times_every_timed_shape_and_says_where_the_port_is_slower(gpu_report):
    """A problem with a second timed shape is timed again there (a GEMM against a BLAS GEMM written for that shape's
    M, N, K); the geomeans per shape name, and the summary names a shape where the port result is slower than its
    start."""
    rep, calls = gpu_report
    rows = {r["problem"]: r for r in rep["problems"]}
    shapes = rows["softmax_fake"]["shapes"]
    assert [sh["variant"] for sh in shapes] == ["bench-gpu", "bench-gpu-1"]
    assert ("gemm_fake", [("kernel.py", None), ("kernel.py", None), ("reference.py", None),
                          ("reference.py", "default"), ("blas_gemm-bench-gpu-1.py", None)], 20) in calls
    decode = rows["gemm_fake"]["shapes"][1]
    assert decode["variant"] == "bench-gpu-1" and decode["dims"] == {"M": 16, "N": 4096, "K": 4096}
    assert decode["speedups"]["final_vs_blas"]["value"] == pytest.approx(0.025 / 0.030)
    assert rep["geomean_by_shape"]["bench-gpu-1"]["final_vs_blas"]["n"] == 1
    assert shapes[1]["speedups"]["final_vs_start"]["value"] == pytest.approx(0.050 / 0.060)
    assert shapes[0]["speedups"]["final_vs_start"]["value"] == pytest.approx(0.90 / 0.30)
    assert [c for c in calls if c[0] == "softmax_fake"][-1][1] == [("kernel.py", None), ("kernel.py", None),
                                                                   ("reference.py", None), ("reference.py", "default")]
    assert rep["geomean_by_shape"]["bench-gpu-1"]["final_vs_start"]["n"] == 2
    assert "slower than its start at 1 shape(s): softmax_fake at bench-gpu-1 (0.83x; paired ratios 0.83-0.83)" in rep["summary"]


def test_timed_shapes_fall_into_decode_large_and_odd_classes(gpu_report):
    """The geomeans per shape class, and each class's lowest ratio to torch.compile with where it was: gemm_fake's
    4096^3 is large, its M = 16 decode, softmax_fake's 16 rows decode too; a size no tile divides is odd, and a
    problem whose first input is not a (rows, columns) matrix is not classed."""
    from types import SimpleNamespace as NS

    from xeforge.shape_classes import shape_class

    def spec(*shape):
        return NS(inputs={"x": NS(shape=shape)})

    assert shape_class(spec("M", "K"), {"M": 16, "N": 4096, "K": 4096}) == "decode"
    assert shape_class(spec("M", "K"), {"M": 3000, "N": 3000, "K": 4096}) == "odd"
    assert shape_class(spec("B", "K"), {"B": 1, "N": 4000, "K": 4000}) == "decode"  # a decode GEMV at an odd size
    assert shape_class(spec("ROWS", "COLS"), {"ROWS": 8192, "COLS": 8192}) == "large"
    assert shape_class(spec("B", "S", "H", "D"), {"B": 1, "H": 32, "S": 1024, "D": 64}) is None
    rep, _ = gpu_report
    by_class = rep["geomean_by_class"]
    shapes = [sh for r in rep["problems"] for sh in r.get("shapes", [])]
    assert [sh["class"] for sh in shapes] == ["large", "decode", "large", "decode"]
    decode = [sh["speedups"]["final_vs_compile"]["value"] for sh in shapes if sh["class"] == "decode"]
    assert by_class["decode"]["final_vs_compile"]["n"] == 2
    assert by_class["decode"]["final_vs_compile"]["lowest"]["value"] == pytest.approx(min(decode))
    assert by_class["decode"]["final_vs_compile"]["lowest"]["problem"] == "softmax_fake"
    assert by_class["decode"]["final_vs_compile"]["value"] == pytest.approx(bench.geomean(decode))
    assert "vs torch.compile per shape class: decode 0.72" in rep["summary"]


def test_gpu_bench_record_golden(gpu_report):
    rep, _ = gpu_report
    check_golden("bench_gpu.json", json.dumps(rep, indent=2) + "\n")


def test_cpu_bench_record_golden(tmp_path):
    rep = normalise(scripted_report(tmp_path, "cpu"), tmp_path)
    assert all(not e["timed"] for r in rep["problems"] for e in r["entries"].values())
    assert rep["header"] == bench.CPU_HEADER and rep["geomean"]["final_vs_eager"]["value"] is None
    check_golden("bench_cpu.json", json.dumps(rep, indent=2) + "\n")


def test_interrupted_run_keeps_partial_results(tmp_path):
    problems, runs = _write_synthetic(tmp_path)

    class Interrupting(ScriptedVerifier):
        def verify(self, path, incumbent=None, *, source_hash=""):
            if self.problem.name == "softmax_fake":
                raise KeyboardInterrupt
            return super().verify(path, incumbent, source_hash=source_hash)

    out = tmp_path / "out"
    opt = bench.BenchOptions(problems=[str(p) for p in problems], device="cpu", runs_dir=runs, out=out)
    with pytest.raises(KeyboardInterrupt):
        bench.run_bench(opt, make_verifier=Interrupting)
    rep = json.loads((out / "bench.json").read_text())
    assert rep["status"] == "interrupted" and [r["problem"] for r in rep["problems"]] == ["gemm_fake"]
    assert (out / "bench.md").exists() and "status interrupted" in (out / "bench.md").read_text()


def test_stop_after_leaves_a_resumable_partial_run(tmp_path):
    problems, runs = _write_synthetic(tmp_path)
    out = tmp_path / "out"
    opt = bench.BenchOptions(problems=[str(p) for p in problems], device="cpu", runs_dir=runs, out=out,
                             stop_after=1e-9, argv=["bench", "--stop-after", "1e-9"])
    rep = bench.run_bench(opt, make_verifier=ScriptedVerifier)
    assert rep["status"] == "partial" and len(rep["pending"]) == len(problems) and not rep["problems"]
    assert "continue with --resume" in rep["summary"] and bench.exit_code(rep) == 2
    with pytest.raises(UsageError, match="already holds a bench run"):
        bench.run_bench(bench.BenchOptions(problems=opt.problems, device="cpu", runs_dir=runs, out=out),
                        make_verifier=ScriptedVerifier)
    rep = bench.run_bench(bench.BenchOptions(problems=opt.problems, device="cpu", runs_dir=runs, out=out, resume=True,
                                             argv=["bench", "--resume"]), make_verifier=ScriptedVerifier)
    assert rep["status"] == "done" and rep["pending"] == []
    # the record names both calls, and the rendered command says the run was continued
    assert [c["argv"] for c in rep["calls"]] == [["bench", "--stop-after", "1e-9"], ["bench", "--resume"]]
    assert all(c["elapsed_s"] is not None for c in rep["calls"])
    assert "--stop-after 1e-9" in (out / "bench.md").read_text() and "; then xeforge bench --resume" in \
        (out / "bench.md").read_text()
    assert [r["problem"] for r in rep["problems"]] == [p.name for p in problems]
    stored = json.loads((out / "bench.json").read_text())
    assert stored["status"] == "done" and len(stored["problems"]) == len(problems)


def test_port_that_returned_the_start_is_timed_once_and_claims_nothing(tmp_path):
    """A port result with the starting kernel's source is the same kernel: 1.00x by definition, not noise."""
    problems, runs = _write_synthetic(tmp_path)
    gemm = next(p for p in problems if p.name == "gemm_fake")
    _fake_port_run(runs, gemm, (gemm / "kernel.py").read_text(), device="cuda", stamp="20250105-000000")  # newest
    device = DeviceInfo("cuda", "NVIDIA H200 (synthetic)", cores=132, l2_bytes=50 * 2**20, architecture="sm_90")
    opt = bench.BenchOptions(problems=[str(gemm)], device="cuda", runs_dir=runs, argv=["bench"])
    kbc = SimpleNamespace(kb=None, device_id="fake-h200", entry=FakeEntry(), note="", triton=SimpleNamespace(text="3.x"))
    ScriptedVerifier.calls = []
    ctx = bench.BenchContext(device, kbc, Settings(), opt, tmp_path / "work", ScriptedVerifier)
    row = bench.bench_problem(gemm, ctx)
    per_shape = [[name for name, _ in entries] for _, entries, _ in ScriptedVerifier.calls]
    assert len(per_shape) == 2 and all(names.count("kernel.py") == 1 for names in per_shape)  # the start, once a
    # shape; the identical port result is not timed again
    assert row["speedups"]["final_vs_start"]["value"] == 1.0
    assert any("same source hash" in n for n in row["notes"])


def test_bench_port_reuses_only_its_own_matching_passed_verdicts(tmp_path):
    """bench --port takes the baseline and final-gate verdicts of the port it just ran instead of verifying the
    same two kernels again; a verdict of another source, a failed one, or one of an older run is not reused."""
    run = tmp_path / "run"

    def write(folder: str, h: str, g2: str = "pass", correct: bool = True) -> None:
        gates = [GateResult("0-isolation", "pass", "ok"), GateResult("1-static", "pass", "ok"),
                 GateResult("2-correctness", g2, "matches the reference on 14 rounds", {"rounds": 14})]
        (run / folder).mkdir(parents=True, exist_ok=True)
        (run / folder / "verdict.json").write_text(json.dumps(Verdict(h, gates, correct=correct).as_dict()))

    write("baseline", "s" * 16)
    write("final", "f" * 16)
    port = {"run_dir": str(run), "ported_now": True}
    got = bench.port_verdicts(port, "s" * 16, "f" * 16)
    assert set(got) == {"start", "final"} and got["final"].source_hash == "f" * 16
    assert set(bench.port_verdicts(port, "s" * 16, "x" * 16)) == {"start"}  # another source: verify again
    assert bench.port_verdicts({**port, "ported_now": False}, "s" * 16, "f" * 16) == {}  # an older run's
    write("final", "f" * 16, g2="fail", correct=False)
    assert set(bench.port_verdicts(port, "s" * 16, "f" * 16)) == {"start"}
    (run / "baseline" / "verdict.json").write_text("{not json")
    assert bench.port_verdicts(port, "s" * 16, "f" * 16) == {}


def test_redo_replaces_the_named_rows_and_each_row_says_which_call_measured_it(tmp_path):
    problems, runs = _write_synthetic(tmp_path)
    out = tmp_path / "out"
    every = [str(p) for p in problems]
    first = bench.run_bench(bench.BenchOptions(problems=every, device="cpu", runs_dir=runs, out=out, argv=["bench"]),
                            make_verifier=ScriptedVerifier)
    assert {r["call"] for r in first["problems"]} == {0}
    with pytest.raises(UsageError, match="needs --resume"):
        bench.run_bench(bench.BenchOptions(problems=every[1:2], device="cpu", runs_dir=runs, out=out, redo=True),
                        make_verifier=ScriptedVerifier)
    again = bench.run_bench(bench.BenchOptions(problems=every[1:2], device="cpu", runs_dir=runs, out=out, resume=True,
                                               redo=True, argv=["bench", "--resume", "--redo"]),
                            make_verifier=ScriptedVerifier)
    assert [r["path"] for r in again["problems"]] == every  # the folder's order, not the call's
    assert [r["call"] for r in again["problems"]] == [1 if p == every[1] else 0 for p in every]
    assert len(again["calls"]) == 2 and all(len(c["xeforge"]) == 12 for c in again["calls"])
    assert again["calls"][0]["xeforge"] == bench.tool_hash()  # same source: same hash
    md = (out / "bench.md").read_text()
    assert f"measured by call 2 of 2 ({again['calls'][1]['created']}, xeforge {bench.tool_hash()})" in md
    assert md.count("measured by call 1 of 2") == len(every) - 1
    # rows from before calls were recorded are not claimed by the call that resumes the folder
    data = json.loads((out / "bench.json").read_text())
    for r in data["problems"]:
        del r["call"]
    (out / "bench.json").write_text(json.dumps(data))
    third = bench.run_bench(bench.BenchOptions(problems=every[:1], device="cpu", runs_dir=runs, out=out, resume=True,
                                               redo=True, argv=["bench", "--resume", "--redo"]),
                            make_verifier=ScriptedVerifier)
    assert [r["call"] for r in third["problems"]] == [2 if p == every[0] else None for p in every]
    md = (out / "bench.md").read_text()
    assert md.count("measured by call") == 1
    assert md.count("measured by an earlier run whose call was not recorded") == len(every) - 1
    # a row timed by a call whose method differs from the report's says how it was timed
    data = json.loads((out / "bench.json").read_text())
    data["problems"][1]["call"], data["calls"][1]["timing_method"] = 1, "an older order"
    from xeforge.report import write_bench_reports
    write_bench_reports(out, data)
    assert "measured by call 2 of 3" in (out / "bench.md").read_text() and "timed as: an older order" in \
        (out / "bench.md").read_text()


def test_final_given_on_the_command_line_is_verified_and_timed_as_the_port_result(tmp_path):
    """--final 'dir/{problem}/kernel.py': a kernel file stands for the port result (no runs folder needed); a
    problem without such a file says where it looked."""
    problems, _ = _write_synthetic(tmp_path)
    gemm = next(p for p in problems if p.name == "gemm_fake")
    soft = next(p for p in problems if p.name == "softmax_fake")
    given = tmp_path / "given" / "runs" / "gemm_fake" / "final-kernel.py"  # "runs": the scripted verifier's final
    given.parent.mkdir(parents=True)
    given.write_text("# a hand-made port result of gemm_fake\n")
    template = str(tmp_path / "given" / "runs" / "{problem}" / "final-kernel.py")
    device = DeviceInfo("cuda", "NVIDIA H200 (synthetic)", cores=132, l2_bytes=50 * 2**20, architecture="sm_90")
    opt = bench.BenchOptions(problems=[str(gemm), str(soft)], device="cuda", runs_dir=tmp_path / "no-runs",
                             final=template, argv=["bench"])
    kbc = SimpleNamespace(kb=None, device_id="fake-h200", entry=FakeEntry(), note="", triton=SimpleNamespace(text="3.x"))
    ctx = bench.BenchContext(device, kbc, Settings(), opt, tmp_path / "work", ScriptedVerifier)
    row = bench.bench_problem(gemm, ctx)
    assert row["port_run"]["given"] == str(given) and row["entries"]["final"]["path"] == str(given)
    assert row["entries"]["final"]["verified"] == "verified"  # verified afresh: no port verdict to reuse
    assert row["speedups"]["final_vs_start"]["value"] == pytest.approx(1.40 / 0.20)
    missing = bench.bench_problem(soft, ctx)
    assert missing["port_run"] is None and "final_vs_start" not in missing["speedups"]
    assert "softmax_fake/final-kernel.py (--final;" in missing["entries"]["final"]["verification"]
    argv = bench.child_argv(opt, gemm, "cuda", tmp_path / "o")
    assert argv[argv.index("--final") + 1] == template  # --workers children bench the same files
    opt.argv = ["bench", str(gemm), "--final", template, "--rounds", "1", "--resume", "--redo", "--out", "o"]
    again = bench.continue_command(opt, "cuda", tmp_path / "o")  # what --stop-after tells the user to run next
    assert "--final" in again and "--rounds 1" in again and "--redo" not in again and again.count("--resume") == 1
    proc = _bench_cli(str(gemm), "--port", "--final", template, "--device", "cpu")
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr


def test_a_ports_time_budget_and_check_lanes_reach_every_port_of_the_bench(tmp_path):
    """--time-budget and --check-lanes with --port go to each port: in-process through the settings, and to the
    children of --workers / --lanes-per-gpu on their command line."""
    opt = bench.BenchOptions(problems=[str(ROOT / "kernels" / "gemm_relu")], device="cuda", port=True,
                             time_budget=2.5, check_lanes=2, runs_dir=tmp_path / "runs", argv=["bench"])
    argv = bench.child_argv(opt, ROOT / "kernels" / "gemm_relu", "cuda", tmp_path / "o")
    assert argv[argv.index("--time-budget") + 1] == "2.5" and argv[argv.index("--check-lanes") + 1] == "2"
    opt.port = False
    argv = bench.child_argv(opt, ROOT / "kernels" / "gemm_relu", "cuda", tmp_path / "o")
    assert "--time-budget" not in argv and "--check-lanes" not in argv
    from xeforge.cli import build_parser

    args = build_parser().parse_args(["bench", "kernels/", "--port", "--time-budget", "3", "--check-lanes", "2"])
    assert args.time_budget == 3.0 and args.check_lanes == 2


def test_an_out_of_memory_row_with_lanes_sharing_a_gpu_names_the_lanes_and_the_fix():
    """The corpus run with 4 lanes on an 80 GB card reported eight starts as failing gate 0 with CUDA out of
    memory: another lane's memory, not the kernel's fault. The row now says so, and how to bench it alone."""
    from xeforge.bench import _out_of_memory, lanes_oom_note

    start = {"verification": "rejected at gate 0-isolation: variant ci: raised: AcceleratorError: CUDA error: out of "
                             "memory"}
    assert _out_of_memory({"error": None, "entries": {"start": start}})
    assert _out_of_memory({"error": "unexpected OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB"})
    assert not _out_of_memory({"error": None, "entries": {"start": {"verification": "correct on every variant"}}})
    note = lanes_oom_note(4, "geglu_tanh")
    assert "--lanes-per-gpu 4" in note and "--redo geglu_tanh --lanes-per-gpu 1" in note


def test_a_problem_that_ran_out_of_memory_beside_other_lanes_is_benched_again_with_the_gpu_alone(tmp_path, monkeypatch):
    """With --lanes-per-gpu 4 the corpus lost eight rows to another lane's memory, and each had to be benched again
    by hand. The bench now runs those again itself once the other lanes are done, one per GPU, and the row says so."""
    from xeforge.schedule import LocalScheduler, Outcome

    rounds: list[tuple[int, list[str]]] = []

    def run(self, jobs, done, deadline):  # what each child would write, without a GPU: "a" runs out of memory at first
        rounds.append((len(self.slots), [j.name for j in jobs]))
        for j in jobs:
            oom = j.name == "a" and len(rounds) == 1
            start = {"verified": "no" if oom else "yes", "path": "kernel.py",
                     "verification": "rejected at gate 0: CUDA error: out of memory" if oom else "correct"}
            row = {"problem": j.name, "path": str(tmp_path / j.name), "status": "ok", "speedups": {},
                   "entries": {"start": start, "final": {"path": None}}}
            j.part.mkdir(parents=True)
            (j.part / "bench.json").write_text(json.dumps({"problems": [row], "device": {"name": "gpu"}}))
            done(Outcome(j, 0, self.slots[0], 1.0))

    monkeypatch.setattr(LocalScheduler, "run", run)
    slots = [{"CUDA_VISIBLE_DEVICES": "0", "XEFORGE_GPU_LOCK": "l0"}] * 2 + [{"CUDA_VISIBLE_DEVICES": "1"}] * 2
    opt = bench.BenchOptions(problems=[], device="cuda", lanes_per_gpu=2, workers=2, argv=["bench"])
    report = {"problems": []}
    bench._run_scheduled([tmp_path / "a", tmp_path / "b"], opt, "cuda", LocalScheduler(slots), tmp_path / "o",
                         report, bench._Progress(2), None)
    assert rounds == [(4, ["a", "b"]), (2, ["a"])]  # again, "a" only, one slot per GPU
    rows = {r["problem"]: r for r in report["problems"]}
    assert len(report["problems"]) == 2 and rows["a"]["entries"]["start"]["verification"] == "correct"
    assert any("benched again with the GPU alone" in n and "out of memory" in n for n in rows["a"]["notes"])
    assert not rows["b"].get("notes")


def test_resume_runs_again_a_row_that_ran_out_of_memory(tmp_path):
    """The corpus's first call lost rows to another lane's memory with status ok (the start "failed" at gate 0 with
    CUDA out of memory); the resumed call kept them as results. Such a row now runs again."""
    out = tmp_path / "o"
    out.mkdir()
    device = DeviceInfo("cuda", "NVIDIA H100 (synthetic)")
    oom = {"problem": "a", "path": "a", "status": "ok", "entries": {"start": {
        "verification": "rejected at gate 0-isolation: variant ci: raised: AcceleratorError: CUDA error: out of memory"}}}
    fine = {"problem": "b", "path": "b", "status": "ok", "entries": {"start": {"verification": "correct"}}}
    (out / "bench.json").write_text(json.dumps({"device": {"kind": "cuda", "name": device.name},
                                                "problems": [oom, fine]}))
    _, kept, _, order = bench._prepare_out(bench.BenchOptions(problems=[], device="cuda", out=out, resume=True), device)
    assert [r["problem"] for r in kept] == ["b"] and order == ["a", "b"]


def test_a_reference_that_computes_wider_than_the_problem_is_named_and_left_out_of_the_geomeans(tmp_path):
    """An oracle-style reference (``x.float() @ w.float()`` on bfloat16 inputs) makes eager and torch.compile time an
    fp32 GEMM: the bench says so in the row's notes, marks those ratios and leaves them out of the geomeans."""
    import shutil

    from xeforge.problem import load_problem

    folder = tmp_path / "gemm_relu"
    shutil.copytree(ROOT / "kernels" / "gemm_relu", folder)
    p = load_problem(folder)
    assert bench.reference_widening(p, p.variant("bench-gpu")) is None  # torch.relu(self.linear(x)) in bf16
    ref = folder / "reference.py"
    ref.write_text(ref.read_text().replace("return torch.relu(self.linear(x))",
                                           "return torch.relu(x.float() @ self.linear.weight.float().t()).to(x.dtype)"))
    p = load_problem(folder)
    why = bench.reference_widening(p, p.variant("bench-gpu"))
    assert why and "matmul (Model.forward, line 12) in float32 where the problem computes in bfloat16" in why, why
    assert bench.reference_widening(p, p.variant("ci")) is None  # ci is a float32 variant: nothing wider
    fast, wide = {"value": 1.5}, {"value": 9.0, "unlike": True}
    rep = {"problems": [{"problem": "a", "status": "ok", "speedups": {"final_vs_compile": fast}, "shapes": []},
                        {"problem": "b", "status": "ok", "speedups": {"final_vs_compile": wide}, "shapes": []}],
           "timed": True, "status": "done", "device": {"kind": "cuda", "name": "a GPU"}}
    bench.finalize(rep)
    gm = rep["geomean"]["final_vs_compile"]
    assert gm["value"] == pytest.approx(1.5) and gm["n"] == 1 and gm["left_out_wider_ref"] == 1
    assert "1 vs torch.compile ratio(s) left out: the reference computes wider" in rep["summary"]
    from xeforge.report_views import speedup_text
    assert speedup_text(wide) == "9.00x (wider ref)"


def test_a_resumed_bench_continues_a_port_its_last_call_left_unfinished(tmp_path):
    """The corpus's calls ended at a `timeout` with four ports still running; the next call on the same machine ported
    them from scratch. A resumed bench now continues the newest unfinished port of the same start on the same kind of
    device (its baseline and trials replayed), and ports afresh once the newest run finished."""
    from types import SimpleNamespace

    problem = SimpleNamespace(name="geglu", source_hash="abc")
    runs = tmp_path / "runs"

    def run(stamp: str, **meta) -> Path:
        folder = runs / "geglu" / stamp
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps({"start_hash": "abc", "device": {"kind": "cuda"}, **meta}))
        return folder

    assert bench.unfinished_port(runs, problem, "cuda") is None  # no run at all
    old = run("20261206-070000-1", status="done")
    assert bench.unfinished_port(runs, problem, "cuda") is None
    killed = run("20261206-071000-1", status="running")  # a `timeout` killed it mid-port
    assert bench.unfinished_port(runs, problem, "cuda") == killed
    assert bench.unfinished_port(runs, problem, "cpu") is None  # another kind of device
    assert bench.unfinished_port(runs, SimpleNamespace(name="geglu", source_hash="changed"), "cuda") is None
    run("20261206-072000-1", status="done")  # the newest finished: a later bench ports afresh
    assert bench.unfinished_port(runs, problem, "cuda") is None and old.exists()
    opt = bench.BenchOptions(problems=["p"], device="cuda", port=True, continue_ports=True, runs_dir=runs,
                             argv=["bench"])
    assert "--continue-ports" in bench.child_argv(opt, tmp_path / "p", "cuda", tmp_path / "o")
    from xeforge.cli import build_parser

    assert build_parser().parse_args(["bench", "kernels/", "--port", "--continue-ports"]).continue_ports
