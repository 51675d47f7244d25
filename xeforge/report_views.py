"""The view models of the two report kinds: what the Markdown and the HTML of a port or a bench both render.

Owns: :func:`port_view` and :func:`bench_view` (from the stored ``report.json`` / ``bench.json`` only), the suite
table (:func:`bench_table`, built once for stdout, Markdown and HTML; :func:`bench_table_markdown`) and the
formatting every rendered number goes through (:func:`num`, :func:`speedup_text`, :func:`time_text` ...). The
Markdown writer (:mod:`xeforge.report`) and the HTML renderer (:mod:`xeforge.report_html`) both import it; it
imports neither.
"""

from __future__ import annotations

import shlex
from typing import Any

from tabulate import tabulate

from xeforge.outcome import stage_verdict

NOT_TIMED = "not timed"
DASH = "—"


# ------------------------------------------------------------------------------------------------ formatting
def num(x: float | None, digits: int = 4) -> str:
    """A number for people: ``digits`` significant digits, no exponent for ordinary magnitudes."""
    if x is None:
        return DASH
    if x != x:  # NaN
        return "nan"
    if abs(x) >= 10 ** digits:
        return f"{x:.0f}"
    if x != 0 and abs(x) < 1e-4:
        return f"{x:.2e}"
    return f"{x:.{digits}g}"


def speedup_text(sp: dict | None) -> str:
    if not sp or sp.get("value") is None:
        return DASH
    return f"{sp['value']:.2f}x" + (" (!)" if sp.get("flagged_over") else "") + (" (wider ref)" if sp.get("unlike")
                                                                                 else "")


def rate_text(ach: dict | None, bound: str | None) -> str:
    """Achieved TFLOP/s for compute-bound variants, GB/s for memory-bound ones."""
    if not ach:
        return DASH
    if bound == "memory" or (bound is None and not ach.get("flop_per_s")):
        return f"{num(ach['bytes_per_s'] / 1e9, 3)} GB/s" if ach.get("bytes_per_s") else DASH
    return f"{num(ach['flop_per_s'] / 1e12, 3)} TFLOP/s" if ach.get("flop_per_s") else DASH


def pct_text(ach: dict | None) -> str:
    if not ach or ach.get("pct_roofline") is None:
        return DASH
    return f"{ach['pct_roofline']:.0f}%"


def time_text(e: dict | None, timed_run: bool) -> str:
    """``median [IQR]`` in ms, or why there is no time."""
    if not e:
        return DASH
    if e.get("time"):
        t = e["time"]
        return f"{num(t['median_ms'])} [{num(t['iqr_ms'], 2)}]"
    if e.get("error"):
        return "error"
    if not e.get("path"):
        return DASH
    return NOT_TIMED


def verified_text(e: dict | None) -> str:
    if not e or not e.get("path"):
        return "not run"
    return e.get("verified") or "not run"


def _arrow(start: str, final: str, final_present: bool) -> str:
    if not final_present or final == DASH:
        return start if start == DASH else f"{start} (start)"
    if start == DASH:
        return final
    return f"{start} → {final}"


# ------------------------------------------------------------------------------------------------ bench view
BENCH_HEADERS = ["problem", "start", "port result", "start ms [IQR]", "final ms [IQR]", "eager ms [IQR]",
                 "compile ms [IQR]", "final/start", "final/eager", "final/compile", "final/BLAS GEMM", "achieved",
                 "% roofline"]


def bench_table(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The suite table (headers, rows of strings), shared by stdout, Markdown and HTML; last row: geomeans."""
    timed = bool(report.get("timed"))
    rows = []
    for r in report.get("problems", []):
        e = r.get("entries") or {}
        if r.get("status") == "error" and not e:
            rows.append([r["problem"] + " (error)", "not run", "not run"] + [DASH] * 10)
            continue
        start, final = e.get("start"), e.get("final")
        cells = [r["problem"] + (" (error)" if r.get("status") == "error" else ""), verified_text(start),
                 verified_text(final)]
        cells += [time_text(e.get(k), timed) for k in ("start", "final", "eager", "compile")]
        if timed:
            sp = r.get("speedups") or {}
            cells += [speedup_text(sp.get(k)) for k in ("final_vs_start", "final_vs_eager", "final_vs_compile",
                                                        "final_vs_blas")]
            bound = (r.get("roofline") or {}).get("bound")
            has_final = bool(final and final.get("time"))
            cells.append(_arrow(rate_text((start or {}).get("achieved"), bound),
                                rate_text((final or {}).get("achieved"), bound), has_final))
            cells.append(_arrow(pct_text((start or {}).get("achieved")), pct_text((final or {}).get("achieved")),
                                has_final))
        else:
            cells += [NOT_TIMED] * 6
        rows.append(cells)
    gm = report.get("geomean") or {}
    if timed:
        foot = ["geomean", "", "", "", "", "", ""]
        for k in ("final_vs_start", "final_vs_eager", "final_vs_compile", "final_vs_blas"):
            g = gm.get(k) or {}
            foot.append(f"{g['value']:.2f}x (n={g['n']})" if g.get("value") else DASH)
        rows.append(foot + ["", ""])
    return list(BENCH_HEADERS), rows


def bench_table_markdown(report: dict[str, Any]) -> str:
    headers, rows = bench_table(report)
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _entry_view(key: str, e: dict, row: dict, timed: bool) -> dict:
    t = e.get("time") or {}
    bound = (row.get("roofline") or {}).get("bound")
    ach = e.get("achieved") or {}
    note = e.get("error") or e.get("not_timed") or ""
    return {
        "key": key, "label": e.get("label", key), "path": e.get("path") or DASH,
        "source_hash": e.get("source_hash") or DASH, "verified": verified_text(e),
        "verification": e.get("verification") or "", "gates": e.get("gates") or [],
        "median": num(t.get("median_ms")) if t else (NOT_TIMED if e.get("path") else DASH),
        "iqr": num(t.get("iqr_ms"), 2) if t else DASH,
        "quartiles": f"{num(t['q1_ms'])}–{num(t['q3_ms'])}" if t else DASH,
        "n": str(t.get("n")) if t else DASH,
        "tflops": f"{num(ach['flop_per_s'] / 1e12, 3)}" if ach.get("flop_per_s") else DASH,
        "gbs": f"{num(ach['bytes_per_s'] / 1e9, 3)}" if ach.get("bytes_per_s") else DASH,
        "achieved": rate_text(ach, bound) if ach else DASH, "pct": pct_text(ach), "note": note,
    }


_SPEEDUP_LABELS = {"final_vs_start": "port result vs start", "final_vs_eager": "port result vs PyTorch eager",
                   "final_vs_compile": "port result vs torch.compile", "start_vs_eager": "start vs PyTorch eager",
                   "start_vs_compile": "start vs torch.compile",
                   "final_vs_blas": "port result vs the vendor BLAS doing the GEMM alone"}


_SHAPE_SPEEDUPS = ("final_vs_start", "final_vs_eager", "final_vs_compile", "final_vs_blas")


def bench_view(report: dict[str, Any]) -> dict[str, Any]:
    """Everything the bench templates print, preformatted."""
    timed = bool(report.get("timed"))
    problems = []
    for r in report.get("problems", []):
        var = r.get("variant") or {}
        roof = r.get("roofline") or {}
        sp = r.get("speedups") or {}
        problems.append({
            "name": r["problem"], "path": r.get("path", ""), "status": r.get("status"), "error": r.get("error"),
            "kind": r.get("kind") or DASH, "origin": r.get("origin") or DASH, "description": r.get("description") or "",
            "variant": var.get("name") or DASH,
            "dims": ", ".join(f"{k}={v}" for k, v in (var.get("dims") or {}).items()) or DASH,
            "dtype": var.get("dtype") or DASH,
            "flop": f"{num(var.get('flop'))} ({var.get('flop_expr')})" if var.get("flop") else DASH,
            "bytes": f"{num(var.get('bytes'))} ({var.get('bytes_expr')})" if var.get("bytes") else DASH,
            "bound": roof.get("bound") or DASH,
            "intensity": num(roof.get("intensity"), 3) if roof.get("intensity") else DASH,
            "floor": f"{num(roof.get('floor_ms'))} ms" if roof.get("floor_ms") else DASH,
            "roofline_source": roof.get("source") or DASH,
            "entries": [_entry_view(k, e, r, timed) for k, e in (r.get("entries") or {}).items()],
            "speedups": [{"label": _SPEEDUP_LABELS.get(k, k), "value": speedup_text(v),
                          "spread": f"{num(v.get('ratio_q1'), 3)}–{num(v.get('ratio_q3'), 3)}",
                          "pairs": v.get("pairs"), "flagged": bool(v.get("flagged_over"))}
                         for k, v in sp.items()],
            "shapes": [{"variant": sh["variant"], "class": sh.get("class") or DASH,
                        "dims": ", ".join(f"{k}={v}" for k, v in (sh.get("dims") or {}).items()),
                        "final_ms": num((sh.get("times", {}).get("final") or {}).get("median_ms")),
                        **{k: speedup_text((sh.get("speedups") or {}).get(k)) for k in _SHAPE_SPEEDUPS},
                        "errors": "; ".join(f"{k}: {m}" for k, m in (sh.get("errors") or {}).items())}
                       for sh in r.get("shapes") or []],
            "breakdown": [{"entry": k, "line": b.get("line", ""), "rows": b.get("rows") or [],
                           "deep": b.get("deep_lines") or []}
                          for k, b in (r.get("breakdown") or {}).items()],
            "compiler": [{"entry": k, "lines": e.get("compiler")} for k, e in (r.get("entries") or {}).items()
                         if e.get("compiler")],
            "port_run": r.get("port_run"), "notes": r.get("notes") or [], "elapsed": r.get("elapsed_s"),
            "measured_by": _measured_by(report, r),
            "worker": r.get("worker"),
        })
    gm = report.get("geomean") or {}
    dev = report.get("device") or {}
    ver = report.get("versions") or {}
    settings = report.get("settings") or {}
    return {
        "title": f"xeforge bench: {len(problems)} problem(s) on {dev.get('kind', '?')}",
        "header": report.get("header"), "summary": report.get("summary", ""), "timed": timed,
        "device": f"{dev.get('kind', '?')} — {dev.get('name', '?')}" + (f" (driver {dev['driver']})" if dev.get("driver") else "")
                  + (f", {dev['architecture']}" if dev.get("architecture") else "")
                  + (f", {dev['cores']} cores" if dev.get("cores") else ""),
        "kb": (report.get("kb_device") or "none matched") + (f" — {report['kb_note']}" if report.get("kb_note") else ""),
        "triton_gate": report.get("triton_gate") or DASH,
        "versions": f"torch {ver.get('torch', '?')}, Triton {ver.get('triton', '?')}, Python {ver.get('python', '?')}",
        "timing": report.get("timing_method") or "none: correctness only (the CPU interpreter measures nothing)",
        "correctness": report.get("correctness_method", ""),
        "compile_mode": report.get("compile_mode", "default"),
        "variant_choice": report.get("variant_choice", ""),
        "port_source": report.get("port_source", ""),
        "command": _command(report),
        "calls": _calls(report),
        "created": report.get("created", ""), "status": report.get("status", ""),
        "elapsed": report.get("elapsed_s"),
        "settings": ", ".join(f"{k}={settings[k]}" for k in ("correctness_rounds", "ragged_shapes", "warmup_calls",
                                                            "timed_pairs", "compile_timeout_s", "run_timeout_s")
                              if k in settings),
        "geomeans": [{"label": _SPEEDUP_LABELS[k], "value": f"{g['value']:.3f}x" if g.get("value") else DASH,
                      "n": g.get("n", 0)} for k, g in gm.items() if k in _SPEEDUP_LABELS],
        "shape_geomeans": [{"variant": name, **{k: f"{g[k]['value']:.3f}x" if g.get(k, {}).get("value") else DASH
                                                 for k in _SHAPE_SPEEDUPS},
                            "n": max((g[k]["n"] for k in g), default=0)}
                           for name, g in (report.get("geomean_by_shape") or {}).items()],
        "class_geomeans": [{"class": name, **{k: f"{g[k]['value']:.3f}x" if g.get(k, {}).get("value") else DASH
                                              for k in _SHAPE_SPEEDUPS},
                            "lowest": _lowest(g.get("final_vs_compile", {}).get("lowest")),
                            "n": max((g[k]["n"] for k in g), default=0)}
                           for name, g in (report.get("geomean_by_class") or {}).items()],
        "problems": problems,
        "issues": _issues(report),
        "table_md": bench_table_markdown(report),
        "table": bench_table(report),
    }


def _lowest(low: dict[str, Any] | None) -> str:
    """The lowest port result / torch.compile ratio of a shape class, and where."""
    return f"{low['value']:.2f}x ({low['problem']} at {low['variant']})" if low else DASH


def _command(report: dict[str, Any]) -> str:
    """The command that made the bench; a run continued with --resume names each of its calls."""
    def one(argv) -> str:
        return "xeforge " + " ".join(shlex.quote(a) for a in argv or [])

    calls = report.get("calls") or []
    if len(calls) <= 1:
        return one(report.get("argv"))
    return "; then ".join(f"{one(c.get('argv'))} ({_call_stamp(c)})" for c in calls)


def _calls(report: dict[str, Any]) -> list[str]:
    """One line per call of the bench (a resumed run has several): the HTML shows the first and folds the rest."""
    calls = report.get("calls") or []
    if len(calls) <= 1:
        return [_command(report)]
    return [f"xeforge {' '.join(shlex.quote(a) for a in c.get('argv') or [])} ({_call_stamp(c)})" for c in calls]


def _call_stamp(c: dict[str, Any]) -> str:
    return (c.get("created") or "?") + (f", xeforge {c['xeforge']}" if c.get("xeforge") else "")


def _measured_by(report: dict[str, Any], row: dict[str, Any]) -> str | None:
    """Which call of a resumed run measured this row (None for a run of one call)."""
    calls = report.get("calls") or []
    i = row.get("call")
    if len(calls) <= 1:
        return None
    if i is None:  # kept from a folder written before rows recorded their call: its method is not known either
        return "an earlier run whose call was not recorded (its timing method may differ from the header's)"
    if not isinstance(i, int) or not 0 <= i < len(calls):
        return None
    method = calls[i].get("timing_method")
    other = f"; timed as: {method}" if method and method != report.get("timing_method") else ""
    return f"call {i + 1} of {len(calls)} ({_call_stamp(calls[i])}{other})"


def _issues(report: dict[str, Any]) -> list[dict[str, str]]:
    """Every error and failed verification of a bench, one line each, for the 'Errors and failures' section."""
    out = []
    for r in report.get("problems", []):
        if r.get("error"):
            out.append({"problem": r["problem"], "text": "could not be benched: " + r["error"]})
        for e in (r.get("entries") or {}).values():
            if e.get("error"):
                out.append({"problem": r["problem"], "text": f"{e.get('label')}: {e['error']}"})
            if e.get("verified") == "failed":
                out.append({"problem": r["problem"], "text": f"{e.get('label')} failed verification: "
                                                             f"{e.get('verification', '')}"})
    return out


# ------------------------------------------------------------------------------------------------ port view
def _stats_text(st: dict | None) -> str:
    if not st:
        return DASH
    return f"{num(st.get('median_ms'))} ms (IQR {num(st.get('iqr_ms'), 2)}, n={st.get('n')})"


def port_view(report: dict[str, Any]) -> dict[str, Any]:
    """The preformatted parts of a port report that the templates would otherwise compute."""
    final = report.get("final") or {}
    verdict = final.get("verdict") or {}
    g3 = next((g for g in verdict.get("gates", []) if g.get("gate") == "3-performance"), None)
    det = (g3 or {}).get("details") or {}
    result = None
    if g3 is not None and g3.get("status") != "skipped" and det.get("candidate"):
        result = {"variant": det.get("variant") or DASH, "start": _stats_text(det.get("incumbent")),
                  "final": _stats_text(det.get("candidate")),
                  "speedup": f"{det['speedup']:.3f}x" if det.get("speedup") else DASH,
                  "margin": f"{100 * det['margin']:.1f}%" if det.get("margin") is not None else DASH,
                  "method": det.get("method") or report.get("timing_method") or DASH, "status": g3.get("status"),
                  "floor": f"{num(det['floor_ms'])} ms" if det.get("floor_ms") else DASH,
                  "flagged": bool(det.get("flagged_over_10x"))}
    stages = []
    for s in report.get("stages", []):
        adopted = [c for t in s.get("tactics", []) for c in t.get("candidates", []) if c.get("adopted")]
        if s.get("speedup"):
            sp = f"{s['speedup']:.3f}x"
        elif s.get("adopted_unmeasured"):
            sp = "not measured"
        else:
            sp = DASH
        timings = []
        for c in adopted:
            t = c.get("timing") or {}
            if t.get("candidate"):
                timings.append(f"{c['trial']} on {t.get('variant', '?')}: {_stats_text(t.get('incumbent'))} → "
                               f"{_stats_text(t.get('candidate'))}, margin {100 * (t.get('margin') or 0):.1f}%")
        stages.append({"name": s["name"], "speedup": sp, "verified": stage_verdict(s),
                       "adopted": ", ".join(c["trial"] for c in adopted) or DASH, "timings": timings})
    verified = "verified" if verdict.get("correct") else ("failed" if verdict.get("gates") else "not run")
    dev = report.get("device") or {}
    ver = report.get("versions") or {}
    return {"result": result, "stages": stages, "final_verified": verified,
            "timed": not dev.get("interpreter", False) and bool(report.get("timing_method")),
            "device": f"{dev.get('kind', '?')} — {dev.get('name', '?')}" + (f" (driver {dev['driver']})" if dev.get("driver") else ""),
            "versions": f"torch {ver.get('torch', '?')}, Triton {ver.get('triton', '?')}, Python {ver.get('python', '?')}"}
