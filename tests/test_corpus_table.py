"""scripts/corpus_table.py: the corpus's rows from several reports of one device, and never a probe's candidate shown
as a port result (BENCHMARKS.md's corpus table is made by it)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("corpus_table", ROOT / "scripts" / "corpus_table.py")
corpus_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(corpus_table)


def _row(name: str, start: float, final: float | None, compile_: float) -> dict:
    times = {"start": {"median_ms": start}, "compile": {"median_ms": compile_}}
    speed = {}
    if final is not None:
        times["final"] = {"median_ms": final}
        speed = {"final_vs_start": {"value": start / final}, "final_vs_compile": {"value": compile_ / final}}
    return {"problem": name, "status": "ok", "entries": {"start": {"path": "kernel.py", "source_hash": "a"},
                                                         **({"final": {"path": "f.py", "source_hash": "b"}}
                                                            if final is not None else {})},
            "shapes": [{"variant": "bench-gpu", "dims": {"M": 1}, "times": times, "speedups": speed}]}


def _report(tmp_path, name: str, rows: list[dict], device: str = "GPU A") -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"problems": rows, "device": {"name": device}, "versions": {}}))
    return str(path)


@pytest.fixture
def corpus(tmp_path):
    for name, kind in (("ce", "reduction"), ("gqa", "attention"), ("mm", "gemm")):
        (tmp_path / "corpus" / name).mkdir(parents=True)
        (tmp_path / "corpus" / name / "new.yaml").write_text(f"kind: {kind}\ndims: {{M: 1}}\n")
    return str(tmp_path / "corpus")


def test_rows_come_from_the_main_report_then_also_then_starts_only(tmp_path, corpus, capsys):
    main = _report(tmp_path, "main.json", [_row("ce", 2.0, 1.0, 4.0)])
    also = _report(tmp_path, "also.json", [_row("mm", 3.0, None, 1.5)])
    probe = _report(tmp_path, "probe.json", [_row("gqa", 8.0, 1.0, 4.0), _row("ce", 9.0, 9.0, 9.0)])
    assert corpus_table.main([main, "--also", also, "--starts", probe, "--corpus", corpus]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip() in ("ce", "gqa", "mm") and "bench-gpu" in line}
    assert "from probe.json; no port result" in rows["gqa"] and "8.0000" in rows["gqa"]
    assert "1.0000" not in rows["gqa"]  # the probe's candidate is not shown as a port result
    assert "from also.json" in rows["mm"] and "2.0000" in rows["ce"]  # the main report's row wins
    assert "- none" in out.split("### Kernels without figures")[1]


def test_reports_of_another_device_do_not_mix(tmp_path, corpus):
    main = _report(tmp_path, "main.json", [_row("ce", 2.0, 1.0, 4.0)])
    other = _report(tmp_path, "other.json", [_row("gqa", 8.0, 1.0, 4.0)], device="GPU B")
    with pytest.raises(SystemExit) as err:
        corpus_table.main([main, "--also", other, "--corpus", corpus])
    assert "GPU B" in str(err.value) and "do not mix" in str(err.value)


def test_the_suite_mode_takes_each_rows_kind_and_gives_geomeans_per_shape_class(tmp_path, capsys):
    """--suite: the problems of the reports, each row's kind its family; each shape's class as the report recorded
    it, and the geomean and lowest ratio to torch.compile per class (the issue's bar for every shape)."""
    a = _row("mm", 2.0, 1.0, 1.0)  # 1.00x at its large shape
    a["kind"] = "gemm"
    a["shapes"][0]["class"] = "large"
    b = _row("mv", 2.0, 1.0, 0.8)  # 0.80x at a decode shape
    b["kind"] = "gemm"
    b["shapes"][0]["class"] = "decode"
    c = _row("mv2", 2.0, 1.0, 0.9)
    c["kind"] = "gemm"
    c["shapes"][0]["class"] = "decode"
    assert corpus_table.main([_report(tmp_path, "s.json", [a, b, c]), "--suite"]) == 0
    out = capsys.readouterr().out
    per_class = out.split("per shape class")[1].split("###")[0]
    decode = next(line for line in per_class.splitlines() if line.startswith("| decode"))
    assert f"{(0.8 * 0.9) ** 0.5:.3f}x" in decode and "0.80x (mv at bench-gpu)" in decode
    assert "| large " in per_class and "attention" not in out.split("### Per kernel")[0]
    assert "### Shapes" not in out
