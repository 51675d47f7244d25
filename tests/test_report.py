"""Reports: golden Markdown and HTML for a synthetic GPU port, a GPU bench and a CPU bench; embedded plots; and
`xeforge report` re-rendering both kinds from their stored JSON.

Inputs live in tests/golden/reports/: port_gpu.input.json is written by hand (fake H200 timings, so the
waterfall and the speedup columns are exercised); bench_{gpu,cpu}.json come from the real bench code over
synthetic problems (tests/test_bench.py). Plot images are replaced by a marker in the golden text (their pixels
depend on fonts and the matplotlib version); they are checked to be PNGs here instead. After an intended change:
    XEFORGE_ACCEPT_GOLDEN=1 .venv/bin/python -m pytest tests/test_bench.py tests/test_report.py
"""

from __future__ import annotations

import base64
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

GOLDEN = ROOT / "tests" / "golden" / "reports"
ACCEPT = os.environ.get("XEFORGE_ACCEPT_GOLDEN") == "1"
_DATA_URI = re.compile(r"data:image/png;base64,([A-Za-z0-9+/=]+)")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    for marker in (str(ROOT), "/tmp/", "pytest-of-"):
        assert marker not in text, f"golden text for {name} contains a machine-specific path ({marker})"
    if ACCEPT:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"no golden file {path.relative_to(ROOT)}; create it with: XEFORGE_ACCEPT_GOLDEN=1 "
                    ".venv/bin/python -m pytest tests/test_bench.py tests/test_report.py")
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), "golden", "rendered", n=2))
        pytest.fail(f"{name} differs from its golden file:\n{diff[:6000]}\nif the change is intended: "
                    "XEFORGE_ACCEPT_GOLDEN=1 .venv/bin/python -m pytest tests/test_bench.py tests/test_report.py")


def embedded_pngs(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in _DATA_URI.findall(html)]


def without_images(html: str) -> str:
    return _DATA_URI.sub("data:image/png;base64,<PNG elided in golden files>", html)


def _input(name: str) -> dict:
    path = GOLDEN / name
    if not path.exists():
        pytest.skip(f"{path.relative_to(ROOT)} is produced by tests/test_bench.py (run it first, with "
                    "XEFORGE_ACCEPT_GOLDEN=1 the first time)")
    return json.loads(path.read_text())


def _render(kind: str, report: dict):
    from xeforge import plots, report as rep
    from xeforge.report_html import render_bench_html, render_port_html

    if kind == "port":
        figs = plots.port_plots(report)
        return rep.render_port_markdown(report, figs), render_port_html(report, figs), figs
    figs = plots.bench_plots(report)
    return rep.render_bench_markdown(report, figs), render_bench_html(report, figs), figs


# ------------------------------------------------------------------------------------------------ goldens
@pytest.mark.parametrize("name,kind,source", [("port_gpu", "port", "port_gpu.input.json"),
                                              ("bench_gpu", "bench", "bench_gpu.json"),
                                              ("bench_cpu", "bench", "bench_cpu.json")])
def test_report_golden(name, kind, source):
    md, html, _ = _render(kind, _input(source))
    check_golden(f"{name}.md", md)
    check_golden(f"{name}.html", without_images(html))


def test_gpu_reports_embed_their_plots_as_png():
    md, html, figs = _render("port", _input("port_gpu.input.json"))
    pngs = embedded_pngs(html)
    assert len(pngs) == 1 and pngs[0].startswith(PNG_MAGIC) and len(pngs[0]) > 5000
    assert "![Speedup per stage](plots/waterfall.png)" in md
    md, html, figs = _render("bench", _input("bench_gpu.json"))
    pngs = embedded_pngs(html)
    assert [f.name for f in figs] == ["speedups", "roofline", "shapes", "shapes-compile", "shapes-blas"] and all(
        f.png for f in figs)
    assert len(pngs) == 5 and all(p.startswith(PNG_MAGIC) and len(p) > 5000 for p in pngs)
    assert "not drawn" not in html


def test_gpu_bench_report_numbers_name_their_provenance():
    rep = _input("bench_gpu.json")
    md, html, _ = _render("bench", rep)
    # device, versions, source hashes, variant, timing method, spread, three-state verification
    for text in ("NVIDIA H200 (synthetic)", "torch 2.x, Triton 3.x", "interleaved", "median and IQR",
                 "Variant **bench-gpu** (M=4096, N=4096, K=4096), dtype bfloat16",
                 rep["problems"][0]["entries"]["start"]["source_hash"], "| verified |", "| failed |", "| not run |",
                 "[IQR]", "paired ratios", "fake-h200"):
        assert text in md, text
    assert "7.00x" in md  # gemm_fake: 1.40 ms -> 0.20 ms
    assert "CORRECTNESS ONLY" not in md and "CORRECTNESS ONLY" not in html
    suite = md.split("## Suite")[1].split("##")[0]
    assert "geomean" in suite and "(n=2)" in suite


def test_cpu_bench_report_says_correctness_only_and_draws_nothing():
    md, html, figs = _render("bench", _input("bench_cpu.json"))
    assert md.split("\n", 3)[2].startswith("> **CORRECTNESS ONLY")
    assert 'class="banner">CORRECTNESS ONLY' in html
    assert not embedded_pngs(html) and all(f.png is None and "correctness-only" in f.missing for f in figs)
    assert "x (n=" not in md and "TFLOP/s" not in md.split("## Per problem")[0]


def test_port_waterfall_is_not_drawn_without_timings():
    from xeforge.plots import port_waterfall

    rep = _input("port_gpu.input.json")
    rep["device"]["interpreter"] = True
    for s in rep["stages"]:
        s["speedup"] = None
    rep["final"]["verdict"]["timed"] = False
    plot = port_waterfall(rep)
    assert plot.png is None and "CPU interpreter" in plot.missing


# ------------------------------------------------------------------------------------------------ xeforge report
def _report_cli(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xeforge", "report", str(path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_xeforge_report_rerenders_a_port_and_a_bench(tmp_path):
    port = tmp_path / "port"
    port.mkdir()
    shutil.copy(GOLDEN / "port_gpu.input.json", port / "report.json")
    proc = _report_cli(port)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(port / "report.md"), str(port / "report.html")]
    md, html = (port / "report.md").read_text(), (port / "report.html").read_text()
    assert "# xeforge port report: gemm_relu" in md and "2.409x" in md
    assert len(embedded_pngs(html)) == 1 and (port / "plots" / "waterfall.png").read_bytes().startswith(PNG_MAGIC)
    before = (port / "report.json").read_text()

    b = tmp_path / "bench"
    b.mkdir()
    shutil.copy(GOLDEN / "bench_gpu.json", b / "bench.json")
    proc = _report_cli(b)
    assert proc.returncode == 0, proc.stderr
    assert (b / "bench.md").read_text() == (GOLDEN / "bench_gpu.md").read_text()
    assert without_images((b / "bench.html").read_text()) == (GOLDEN / "bench_gpu.html").read_text()
    assert sorted(p.name for p in (b / "plots").iterdir()) == ["roofline.png", "shapes-blas.png", "shapes-compile.png",
                                                             "shapes.png", "speedups.png"]
    assert (port / "report.json").read_text() == before  # re-rendering never rewrites the record


def test_xeforge_report_bad_folders_are_clear_errors(tmp_path):
    proc = _report_cli(tmp_path / "missing")
    assert proc.returncode == 1 and "Error:" in proc.stderr and "Traceback" not in proc.stderr
    runs = tmp_path / "runs" / "vadd" / "20250101-000000"
    runs.mkdir(parents=True)
    shutil.copy(GOLDEN / "port_gpu.input.json", runs / "report.json")
    proc = _report_cli(tmp_path / "runs" / "vadd")
    assert proc.returncode == 1 and "pass one of them" in proc.stderr and "20250101-000000" in proc.stderr
    (runs / "report.json").write_text("{not json")
    proc = _report_cli(runs)
    assert proc.returncode == 1 and "not valid JSON" in proc.stderr
