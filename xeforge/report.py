"""Reports: ``report.json`` is the record; ``report.md`` is rendered from it with a Jinja2 template.

Owns: writing and re-rendering port reports (``xeforge report RUN_DIR``). Every figure in a report comes from
the stored JSON, which carries device, versions, source hashes, the variant, the timing method and spread.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2

from xeforge.errors import RunError
from xeforge.store import atomic_write, write_json

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("xeforge", "templates"), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True, trim_blocks=False, lstrip_blocks=False)


def render_port_markdown(report: dict[str, Any]) -> str:
    return _ENV.get_template("port_report.md.j2").render(r=report)


def write_reports(run_dir: Path, report: dict[str, Any]) -> None:
    write_json(Path(run_dir) / "report.json", report)
    atomic_write(Path(run_dir) / "report.md", render_port_markdown(report))


def rerender(run_dir: Path) -> Path:
    path = Path(run_dir) / "report.json"
    if not path.exists():
        raise RunError(str(run_dir), "no report.json in this folder", "pass the folder of a finished port run")
    try:
        report = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise RunError(str(path), f"not valid JSON ({exc.msg} at line {exc.lineno})",
                       "re-run the port; the report is written atomically, so this file was edited by hand") from None
    atomic_write(Path(run_dir) / "report.md", render_port_markdown(report))
    return Path(run_dir) / "report.md"
