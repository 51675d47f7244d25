"""HTML reports: one self-contained file per report (inline CSS, plots as base64 PNG ``data:`` URIs).

Owns: the HTML Jinja environment (autoescaped: kernel feedback and error text are untrusted) and rendering of
the port and bench reports from the same view models as the Markdown (:mod:`xeforge.report_views`) and the figures of
:mod:`xeforge.plots`. Nothing here reads anything but the report JSON, so ``xeforge report`` re-renders exactly.
"""

from __future__ import annotations

from typing import Any

import jinja2

from xeforge.report_views import bench_view, port_view

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("xeforge", "templates"), undefined=jinja2.StrictUndefined,
                          autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2", "html")),
                          keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def _state_class(text: str) -> str:
    """CSS class for a verification state or a table cell."""
    t = (text or "").strip()
    if t == "verified":
        return "ok"
    if t in {"failed", "error"} or t.endswith("(error)"):
        return "bad"
    if t in {"not run", "not timed", "—", ""}:
        return "muted"
    return ""


_ENV.filters["state"] = _state_class


def render_port_html(report: dict[str, Any], plots: list) -> str:
    return _ENV.get_template("port_report.html.j2").render(r=report, v=port_view(report), plots=plots)


def render_bench_html(report: dict[str, Any], plots: list) -> str:
    return _ENV.get_template("bench_report.html.j2").render(r=report, v=bench_view(report), plots=plots)
