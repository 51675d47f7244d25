#!/usr/bin/env python3
"""A bench report of the real-world corpus, or of the suite, as markdown tables: one row per kernel and timed shape
(with its shape class: decode, large or odd, :mod:`xeforge.shape_classes`), then geomeans per family (the ``kind``
of each ``examples/realworld/<name>/new.yaml``; with ``--suite``, each row's own kind) and per shape class, then the
kernels whose port result is slower than the starting kernel at some timed shape, and the kernels with no figures
(and why).

Usage (repo root):
    .venv/bin/python scripts/corpus_table.py BENCH_JSON [--earlier OLDER_BENCH_JSON ...] [--also OTHER_BENCH_JSON ...]
        [--corpus examples/realworld]
    .venv/bin/python scripts/corpus_table.py BENCH_JSON --suite [--also OTHER_BENCH_JSON ...]   (the problems the
        reports hold, each shape's class from the report or else from kernels/<problem>/spec.yaml)

--earlier names reports of earlier calls of the same bench: a kernel without figures in BENCH_JSON (a row dropped by
``--resume --redo`` and not run again, say) is explained from the newest earlier report that has a row for it.
--also names other reports taken on the same device (another bench call, a start-only bench of kernels the ports had
no time for): a kernel without figures in BENCH_JSON takes its row from the first of them that timed its start, and
the row says which report it came from. --starts does the same with the start, eager and torch.compile figures only
(a probe that benched a candidate with --final has no port result to show).

Every figure is read from BENCH_JSON as ``xeforge bench`` wrote it (``xeforge/bench.py``): per problem, ``shapes``
(each timed shape with the median times of start, final, eager and compile, and the speedups final_vs_start and
final_vs_compile = median(baseline) / median(port result)); problems timed at one shape only have no ``shapes`` and
are read from ``entries`` and ``speedups``. Nothing is re-measured or rounded before the geomean. A kernel whose
torch.compile entry the bench marked ``unlike`` (its reference computes its products wider than the problem) keeps
its ratio in its row, noted, and is left out of the geomeans against torch.compile.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from pathlib import Path

import yaml

try:
    from tabulate import tabulate
except ImportError:  # pragma: no cover - a plain pipe table without it
    tabulate = None

FAMILIES = ("gemm", "attention", "reduction", "elementwise", "other")


def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return (math.exp(sum(math.log(x) for x in xs) / len(xs)), len(xs)) if xs else (None, 0)


def table(rows, headers):
    if tabulate is not None:
        return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def ms(t):
    return f"{t['median_ms']:.4f}" if t and t.get("median_ms") is not None else "–"


def x(sp):
    return f"{sp['value']:.2f}x" if sp and sp.get("value") is not None else "–"


def corpus_kinds(corpus: Path) -> dict[str, dict]:
    out = {}
    for f in sorted(corpus.glob("*/new.yaml")):
        y = yaml.safe_load(f.read_text())
        out[f.parent.name] = {"kind": y.get("kind", "other"), "bench": y.get("bench"), "dims": y.get("dims")}
    return out


def suite_kinds(reports: list[dict]) -> dict[str, dict]:
    """The problems the reports hold (the first report's order, then the others'), each with its row's kind."""
    out: dict[str, dict] = {}
    for rep in reports:
        for r in rep.get("problems", []):
            kind = r.get("kind") if r.get("kind") in FAMILIES else "other"
            out.setdefault(r["problem"], {"kind": kind, "bench": None, "dims": None})
    return out


@functools.lru_cache(maxsize=None)
def _suite_spec(name: str):
    """The spec of the suite problem ``name`` under kernels/, read once; None where there is none."""
    if not (Path("kernels") / name / "spec.yaml").is_file():
        return None
    try:
        from xeforge.problem import load_problem
    except ImportError:
        return None
    return load_problem(Path("kernels") / name).spec


def class_of(name: str, sh: dict) -> str:
    """A timed shape's class as the report recorded it, else from the problem's spec under kernels/ (a report
    written before the bench classed its shapes); "–" where neither says."""
    if sh.get("class"):
        return sh["class"]
    spec = _suite_spec(name)
    if spec is None:
        return "–"
    from xeforge.shape_classes import shape_class
    return shape_class(spec, sh.get("dims") or {}) or "–"


def shapes_of(row: dict) -> list[dict]:
    """Every timed shape of a row, the primary first; a row timed at one shape gets one from its entries."""
    if row.get("shapes"):
        return row["shapes"]
    ents = row.get("entries") or {}
    times = {k: e["time"] for k, e in ents.items() if e.get("timed") and e.get("time")}
    if not times:
        return []
    sp = {n: v for n, v in (row.get("speedups") or {}).items() if n in ("final_vs_start", "final_vs_compile",
                                                                      "final_vs_eager")}
    v = row.get("variant") or {}
    return [{"variant": v.get("name"), "dims": v.get("dims"), "times": times, "speedups": sp, "errors": {}}]


def why_not(row: dict) -> str:
    return " ".join(_why_not(row).split())


def _why_not(row: dict) -> str:
    if row.get("status") == "error":
        return (row.get("error") or "error").strip().splitlines()[0][:300]
    ents = row.get("entries") or {}
    bits = []
    for k in ("start", "final"):
        e = ents.get(k) or {}
        if e.get("error"):
            bits.append(f"{k}: {' '.join(e['error'].split())[:250]}")
        elif e.get("not_timed"):
            bits.append(f"{k}: {e['not_timed']}" + (f" ({e.get('verification', '')[:200]})"
                                                       if e.get("verified") == "failed" else ""))
    return "; ".join(bits) or "no timed start"


def _starts_only(row: dict) -> dict:
    """``row`` without its port result: no final entry, no final time or ratio at any shape."""
    row = json.loads(json.dumps(row))
    row.get("entries", {}).pop("final", None)
    for sh in row.get("shapes") or []:
        (sh.get("times") or {}).pop("final", None)
        for k in [k for k in (sh.get("speedups") or {}) if k.startswith("final")]:
            sh["speedups"].pop(k)
    for k in [k for k in (row.get("speedups") or {}) if k.startswith("final")]:
        row["speedups"].pop(k)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench_json")
    ap.add_argument("--corpus", default="examples/realworld")
    ap.add_argument("--earlier", action="append", default=[], help="an earlier report, newest last (repeatable)")
    ap.add_argument("--also", action="append", default=[],
                    help="another report on the same device: rows for kernels BENCH_JSON has no figures for")
    ap.add_argument("--starts", action="append", default=[],
                    help="as --also, the start, eager and torch.compile figures only (a report whose port result "
                         "was given with --final, a probe's candidate, is not a port)")
    ap.add_argument("--suite", action="store_true",
                    help="the problems the reports hold, each row's own kind as its family (not a corpus folder)")
    a = ap.parse_args(argv)
    rep = json.loads(Path(a.bench_json).read_text())
    also: dict[str, tuple[str, dict]] = {}
    for f in [*a.also, *a.starts]:
        only_starts = f in a.starts
        other = json.loads(Path(f).read_text())
        if (other.get("device") or {}).get("name") != (rep.get("device") or {}).get("name"):
            sys.exit(f"corpus_table: {f} was taken on {(other.get('device') or {}).get('name')}, "
                     f"{a.bench_json} on {(rep.get('device') or {}).get('name')}: their figures do not mix")
        for r in other.get("problems", []):
            shs = shapes_of(r)
            if shs and "start" in (shs[0].get("times") or {}):
                also.setdefault(r["problem"], (f, _starts_only(r) if only_starts else r))
    kinds = suite_kinds([rep, *(json.loads(Path(f).read_text()) for f in [*a.also, *a.starts])]) if a.suite \
        else corpus_kinds(Path(a.corpus))
    by_class: dict[str, list] = {}
    rows_by = {r["problem"]: r for r in rep.get("problems", [])}
    earlier: dict[str, tuple[str, dict]] = {}
    for f in a.earlier:  # newest last: a later report's row wins
        for r in json.loads(Path(f).read_text()).get("problems", []):
            earlier[r["problem"]] = (f, r)

    per_kernel, slower, missing = [], [], []
    fam = {f: {"vs_start": [], "vs_compile": [], "start_vs_compile": []} for f in FAMILIES}
    timed_kernels = {f: 0 for f in FAMILIES}
    for name, meta in kinds.items():
        r, source = rows_by.get(name), ""
        timed = r is not None and shapes_of(r) and "start" in (shapes_of(r)[0].get("times") or {})
        if not timed and name in also:
            source, r = also[name]
            source = f"from {Path(source).name}"
        if r is None:
            if name in earlier:
                f, er = earlier[name]
                missing.append((name, meta["kind"], f"not in this report; in {f}: {why_not(er)}"))
            else:
                missing.append((name, meta["kind"], "not benched (in no report given)"))
            continue
        shs = shapes_of(r)
        ents = r.get("entries") or {}
        if not shs or "start" not in (shs[0].get("times") or {}):
            missing.append((name, meta["kind"], why_not(r)))
            continue
        timed_kernels[meta["kind"] if meta["kind"] in fam else "other"] += 1
        note = ""
        f = ents.get("final") or {}
        if f.get("path") and f.get("source_hash") == (ents.get("start") or {}).get("source_hash"):
            note = "port = start"
        elif not f.get("path"):
            note = "no port result" + (f": {f['error'][:120]}" if f.get("error") else "")
        elif not f.get("timed"):
            note = f"port not timed: {f.get('not_timed') or f.get('error') or ''}"[:160]
        note = "; ".join(b for b in (source, note) if b)
        wider = bool((ents.get("compile") or {}).get("unlike"))  # the reference computes wider: not like-for-like
        if wider:
            note = "; ".join(b for b in (note, "torch.compile of a reference that computes wider (left out)") if b)
        for sh in shs:
            t, sp = sh.get("times") or {}, sh.get("speedups") or {}
            dims = ", ".join(f"{k}={v}" for k, v in (sh.get("dims") or {}).items())
            vs_c = None
            if t.get("final") and t.get("compile"):
                vs_c = {"value": t["compile"]["median_ms"] / t["final"]["median_ms"]}
            s_c = None
            if t.get("start") and t.get("compile"):
                s_c = {"value": t["compile"]["median_ms"] / t["start"]["median_ms"]}
            fs = sp.get("final_vs_start")
            fc = sp.get("final_vs_compile") or vs_c
            err = "; ".join(f"{k}: {v[:80]}" for k, v in (sh.get("errors") or {}).items())
            vs_b = ({"value": t["blas"]["median_ms"] / t["final"]["median_ms"]}
                    if (t.get("blas") or {}).get("median_ms") and (t.get("final") or {}).get("median_ms") else None)
            cls = class_of(name, sh)
            if fc and fc.get("value") is not None and not wider and cls != "–":
                by_class.setdefault(cls, []).append((fc["value"], name, sh.get("variant")))
            per_kernel.append([name, meta["kind"], sh.get("variant") or "", cls, dims, ms(t.get("start")),
                               ms(t.get("final")), ms(t.get("eager")), ms(t.get("compile")), ms(t.get("blas")),
                               x(fs), x(fc), x(vs_b), "; ".join(b for b in (note, err) if b)])
            fk = meta["kind"] if meta["kind"] in fam else "other"
            for key, sv in (("vs_start", fs), ("vs_compile", fc), ("start_vs_compile", s_c)):
                if wider and key != "vs_start":
                    continue
                if sv and sv.get("value") is not None:
                    fam[fk][key].append(sv["value"])
            if fs and fs.get("value") is not None and fs["value"] < 1.0:
                q = (f"; paired ratios {fs['ratio_q1']:.2f}-{fs['ratio_q3']:.2f}"
                     if isinstance(fs.get("ratio_q1"), float) and math.isfinite(fs["ratio_q1"]) else "")
                slower.append(f"{name} at {sh.get('variant')} ({dims}): {fs['value']:.3f}x{q}")

    dev = rep.get("device") or {}
    ver = rep.get("versions") or {}
    print(f"Report: {a.bench_json} ({rep.get('status')}, created {rep.get('created')}); device {dev.get('name')} "
          f"({dev.get('architecture')}, {dev.get('driver')}); torch {ver.get('torch')}, Triton {ver.get('triton')}, "
          f"Python {ver.get('python')}\n")
    print("### Geomeans per family (every timed shape of every benched kernel counts once)\n")
    gm_rows = []
    allv = {"vs_start": [], "vs_compile": [], "start_vs_compile": []}
    for fname in FAMILIES:
        d = fam[fname]
        n_k = sum(1 for n, m in kinds.items() if m["kind"] == fname)
        if a.suite and not n_k:
            continue
        for k in allv:
            allv[k] += d[k]
        g1, n1 = geomean(d["vs_start"])
        g2, n2 = geomean(d["vs_compile"])
        g3, n3 = geomean(d["start_vs_compile"])
        gm_rows.append([fname, f"{timed_kernels[fname]} of {n_k}", n1, f"{g1:.3f}x" if g1 else "–",
                        f"{g2:.3f}x (n={n2})" if g2 else "–",
                        f"{g3:.3f}x (n={n3})" if g3 else "–"])
    g1, n1 = geomean(allv["vs_start"])
    g2, n2 = geomean(allv["vs_compile"])
    g3, n3 = geomean(allv["start_vs_compile"])
    gm_rows.append(["**all**", f"{sum(timed_kernels.values())} of {len(kinds)}", n1, f"{g1:.3f}x" if g1 else "–",
                    f"{g2:.3f}x (n={n2})" if g2 else "–",
                    f"{g3:.3f}x (n={n3})" if g3 else "–"])
    print(table(gm_rows, ["family", "kernels timed", "timed shapes", "port result / start",
                          "port result vs torch.compile", "start vs torch.compile"]))
    print("\nx = median(baseline) / median(port result): above 1 the port result is faster.\n")
    if by_class:
        print("### Port result vs torch.compile per shape class (decode: at most 64 rows; odd: a size no multiple of "
              "128; large: the rest)\n")
        cls_rows = []
        for cls in ("decode", "large", "odd"):
            vals = by_class.get(cls)
            if vals:
                g, n = geomean([v for v, _, _ in vals])
                low = min(vals)
                cls_rows.append([cls, n, f"{g:.3f}x", f"{low[0]:.2f}x ({low[1]} at {low[2]})"])
        print(table(cls_rows, ["class", "timed shapes", "geomean", "lowest"]) + "\n")
    print("### Per kernel and timed shape (median ms)\n")
    print(table(per_kernel, ["kernel", "family", "shape", "class", "dims", "start ms", "port result ms", "eager ms",
                             "torch.compile ms", "BLAS GEMM ms", "result / start", "result vs torch.compile",
                             "result vs BLAS GEMM", "note"]))
    print("\nBLAS GEMM: the vendor library's GEMM alone on the problem's M x K @ K x N in its dtype (GEMM kernels only); "
          "the port result also does the kernel's epilogue.")
    print("\n### Port result slower than the start at some timed shape\n")
    print("\n".join(f"- {s}" for s in slower) if slower else "- none")
    print("\n### Kernels without figures\n")
    print("\n".join(f"- `{n}` ({k}): {w}" for n, k, w in missing) if missing else "- none")
    if a.suite:
        return 0
    print("\n### Shapes (new.yaml: `dims` is bench-gpu; each `bench` entry overrides it as bench-gpu-1, -2, ...)\n")
    shp = [[n, m["kind"], ", ".join(f"{k}={v}" for k, v in (m["dims"] or {}).items()),
            "; ".join(", ".join(f"{k}={v}" for k, v in b.items()) for b in (m["bench"] or []))]
           for n, m in kinds.items()]
    print(table(shp, ["kernel", "family", "bench-gpu (dims)", "bench-gpu-1, -2, ... (overrides)"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
