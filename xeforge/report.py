"""Reports. The JSON is the record; Markdown and HTML (with plots) are rendered from it, and only from it.

Owns: the two report kinds and their files —

- a port (``report.json`` written by :mod:`xeforge.pipeline`): ``report.md``, ``report.html``, ``plots/``;
- a bench (``bench.json`` written by :mod:`xeforge.bench`): ``bench.md``, ``bench.html``, ``plots/``;

the Markdown of both (from the view models both formats share, :mod:`xeforge.report_views`, where the suite
table is built once for stdout, Markdown and HTML), and ``xeforge report RUN_DIR`` (:func:`rerender`), which
re-renders either kind from the stored JSON. Every number rendered carries what the JSON carries for it:
device, versions, source hash, variant, timing method, spread (median and IQR) and a three-state verification
(verified / failed / not run). HTML lives in :mod:`xeforge.report_html`, figures in :mod:`xeforge.plots`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2

from xeforge.errors import RunError
from xeforge.plots import bench_plots, port_plots
from xeforge.report_html import render_bench_html, render_port_html
from xeforge.report_views import bench_view, port_view
from xeforge.store import atomic_write, write_json

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("xeforge", "templates"), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True, trim_blocks=False, lstrip_blocks=False)


# ------------------------------------------------------------------------------------------------ render + write
def render_port_markdown(report: dict[str, Any], plots: list | None = None) -> str:
    return _ENV.get_template("port_report.md.j2").render(r=report, v=port_view(report), plots=plots or [])


def render_bench_markdown(report: dict[str, Any], plots: list | None = None) -> str:
    return _ENV.get_template("bench_report.md.j2").render(r=report, v=bench_view(report), plots=plots or [])


def _write_plots(folder: Path, plots: list) -> None:
    for p in plots:
        target = Path(folder) / "plots" / f"{p.name}.png"
        if p.png:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(p.png)
        else:
            target.unlink(missing_ok=True)


def write_reports(run_dir: Path, report: dict[str, Any]) -> None:
    """A port: report.json, report.md, report.html and plots/."""
    write_json(Path(run_dir) / "report.json", report)
    _render_port(Path(run_dir), report)


def _render_port(run_dir: Path, report: dict[str, Any]) -> list[Path]:
    plots = port_plots(report)
    _write_plots(run_dir, plots)
    atomic_write(run_dir / "report.md", render_port_markdown(report, plots))
    atomic_write(run_dir / "report.html", render_port_html(report, plots))
    return [run_dir / "report.md", run_dir / "report.html"]


def write_bench_reports(out_dir: Path, report: dict[str, Any]) -> list[Path]:
    """A bench: bench.json, bench.md, bench.html and plots/."""
    write_json(Path(out_dir) / "bench.json", report)
    return _render_bench(Path(out_dir), report)


def _render_bench(out_dir: Path, report: dict[str, Any]) -> list[Path]:
    plots = bench_plots(report)
    _write_plots(out_dir, plots)
    atomic_write(out_dir / "bench.md", render_bench_markdown(report, plots))
    atomic_write(out_dir / "bench.html", render_bench_html(report, plots))
    return [out_dir / "bench.md", out_dir / "bench.html"]


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise RunError(str(path), f"not valid JSON ({exc.msg} at line {exc.lineno})",
                       "re-run it; reports are written atomically, so this file was edited by hand") from None
    if not isinstance(data, dict):
        raise RunError(str(path), "does not hold a report (expected a JSON object)", "pass a port run or bench folder")
    return data


def rerender_all(run_dir: Path) -> list[Path]:
    """Re-render every report in ``run_dir`` from its stored JSON: a port run (report.json) and/or a bench
    (bench.json). Returns the Markdown and HTML files written."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(str(run_dir), "no such folder", "pass the folder of a port run (runs/<problem>/<stamp>) or a bench "
                       "(bench-out/<stamp>)")
    written: list[Path] = []
    bench = run_dir / "bench.json"
    port = run_dir / "report.json"
    if bench.exists():
        written += _render_bench(run_dir, _load(bench))
    if port.exists():
        data = _load(port)
        if data.get("kind") == "bench":
            written += _render_bench(run_dir, data)
        else:
            for key in ("problem", "final", "stages"):
                if key not in data:
                    raise RunError(str(port), f"not a port report: key {key!r} is missing",
                                   "pass the folder of a finished port run")
            written += _render_port(run_dir, data)
    if not written:
        runs = sorted(p.parent for p in run_dir.glob("*/report.json"))
        hint = (f"this looks like a folder of runs; pass one of them, e.g. {runs[-1]}" if runs else
                "pass the folder of a finished port run or bench")
        raise RunError(str(run_dir), "no report.json or bench.json in this folder", hint)
    return written


def rerender(run_dir: Path) -> Path:
    """``xeforge report RUN_DIR``: re-render from the stored JSON; returns the first Markdown file written
    (the HTML beside it is rewritten too; :func:`rerender_all` lists every file)."""
    return rerender_all(run_dir)[0]
