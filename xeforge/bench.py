"""``xeforge bench``: the suite runner. Each problem's starting kernel, its latest verified port result, PyTorch
eager and torch.compile, verified and timed by the same harness as gate 3, side by side.

The flow, and which module owns each step:

1. Discover problems: problem folders, kernel files, or folders of problem folders (``kernels/``).
2. Pick the device (:mod:`xeforge.devices`) and its knowledge-base entry (:func:`xeforge.pipeline.kb_context`) for
   the roofline: peak FLOP/s for the variant's dtype and memory bandwidth. No entry: no roofline, and rows say so.
3. Per problem (:func:`bench_problem`), every failure recorded in the row, never raised past it:
   a. the port result: ``--port`` runs :class:`xeforge.pipeline.Pipeline` first; otherwise the newest
      ``RUNS_DIR/<problem>/*/report.json`` whose final verdict is correct and whose starting kernel is this one;
   b. correctness (gates 0-2, :meth:`xeforge.verifier.Verifier.verify`) of the start and the port result;
   c. timing (GPU only): :meth:`Verifier.time_entries` runs start, final, eager and torch.compile interleaved in
      one worker (device events, L2 flush, rotated inputs) on the same inputs; a kernel that failed verification
      is not timed. One entry that breaks the timing run is found and dropped, the rest are timed without it;
   d. statistics (:mod:`xeforge.timing`): median + IQR per entry, speedups as ratios of medians with the IQR
      of the per-round paired ratios, achieved FLOP/s and bytes/s, % of the roofline bound.
4. ``--workers N``: one subprocess per local GPU (``CUDA_VISIBLE_DEVICES`` / ``ZE_AFFINITY_MASK``), each running
   a single-problem ``xeforge bench --json``; rows are merged in problem order. ``--lanes-per-gpu K`` runs K such
   subprocesses on each GPU: their correctness runs and compiles overlap, each timing holds the GPU alone
   (:mod:`xeforge.device_lock`). ``--cluster ray[://ADDRESS]`` runs the same subprocesses as Ray tasks on a
   cluster's GPUs; a lost task is retried and the record says so. Both are schedulers of one interface
   (:mod:`xeforge.schedule`, :mod:`xeforge.ray_cluster`): ``_run_scheduled`` makes the jobs and reads the rows.
5. After every problem ``bench.json`` is rewritten; in ``finally:`` the geomeans, ``bench.md``, ``bench.html``
   and the plots are written (:mod:`xeforge.report`, :mod:`xeforge.report_html`, :mod:`xeforge.plots`) and the
   table goes to stdout. Progress goes to stderr.

On ``--device cpu`` (Triton's interpreter) nothing is timed: the run checks correctness only, and every output
says so in its first line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shlex
import shutil
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from tabulate import tabulate

from xeforge import devices
from xeforge.cli_args import add_check_lanes, add_llm_args, add_time_budget
from xeforge.diagnosis.deep import describe as describe_deep
from xeforge.diagnosis.profile import describe as describe_profile
from xeforge.diagnosis.rules import describe as describe_diagnosis
from xeforge.errors import UsageError, XeforgeError
from xeforge.isolation import WorkerFailure
from xeforge.problem import load_problem, source_hash
from xeforge.ray_cluster import RayScheduler, parse_cluster
from xeforge.report import write_bench_reports
from xeforge.report_views import bench_table
from xeforge.schedule import Job, LocalScheduler, Outcome, Scheduler, gpu_slots, lane_locks
from xeforge.settings import load_settings
from xeforge.shape_classes import shape_class
from xeforge.store import atomic_write, write_json
from xeforge.timing import Stats, paired_ratios, quantile, roofline_floor
from xeforge.verifier import Verdict, Verifier

# Correctness rounds per variant for a bench on the CPU interpreter (unless --rounds or XEFORGE_ROUNDS says
# otherwise): the suite is re-checked in CI on 2 cores, and 2 fresh-input rounds per variant (plus the ragged
# shapes) keep `xeforge bench kernels/ --device cpu` to a couple of minutes. A port still uses the full count.
CPU_ROUNDS = 2

ENTRY_LABELS = {
    "start": "starting kernel",
    "final": "port result",
    "eager": "PyTorch eager",
    "compile": "torch.compile",
    "blas": "vendor BLAS GEMM alone",
}
VERIFIED, FAILED, NOT_RUN = "verified", "failed", "not run"
# speedup name -> (baseline entry, faster-is-better entry): value = median(baseline) / median(entry)
SPEEDUPS = {
    "final_vs_start": ("start", "final"),
    "final_vs_eager": ("eager", "final"),
    "final_vs_compile": ("compile", "final"),
    "start_vs_eager": ("eager", "start"),
    "start_vs_compile": ("compile", "start"),
    # GEMM problems: the vendor BLAS doing the GEMM alone, no epilogue (>= 0.8 is the issue-4 target)
    "final_vs_blas": ("blas", "final"),
}
CPU_HEADER = ("CORRECTNESS ONLY: --device cpu runs Triton's interpreter, which measures nothing about GPU speed. "
              "Kernels were verified (gates 0-2); nothing was timed and no speedup is claimed; no compiler facts or "
              "profiles (the interpreter compiles nothing).")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_DTYPE_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64", "int8": "int8"}


@dataclass
class BenchOptions:
    problems: list[str]
    device: str = "auto"
    port: bool = False
    compile_mode: str = "default"
    workers: int = 1
    lanes_per_gpu: int = 1  # problems run at once on each GPU; their timing takes the GPU alone (device_lock)
    out: Path | None = None
    variant: str | None = None
    runs_dir: Path = Path("runs")
    rounds: int | None = None
    pairs: int | None = None
    engine: str = "auto"
    stages: list[str] | None = None
    budget: int | None = None
    time_budget: float | None = None  # minutes per port's stages (--port)
    check_lanes: int | None = None  # verifiers per port that check candidates side by side (--port)
    resume: bool = False
    redo: bool = False  # with resume: bench the named problems again even where the folder has their rows
    continue_ports: bool = False  # --port: continue a problem's unfinished port in runs_dir (set by --resume)
    stop_after: float | None = None  # minutes: start no new problem after this
    target: str | None = None
    triton: str | None = None
    llm: Any = None
    llm_argv: list[str] = field(default_factory=list)  # --model/--api-base/... to hand to worker subprocesses
    json: bool = False
    argv: list[str] = field(default_factory=list)
    final: str | None = None  # a kernel file benched as the port result; "{problem}" -> each problem's name
    profile: str = "basic"  # basic: torch.profiler's breakdown on a GPU; deep: also the vendor profiler's counters
    cluster: str | None = None  # "ray" or "ray://ADDRESS": each problem a Ray task (xeforge.ray_cluster)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ discovery
def _is_problem(path: Path) -> bool:
    if path.is_file():
        return path.suffix == ".py"
    return path.is_dir() and ((path / "kernel.py").exists() or (path / "spec.yaml").exists())


def discover(paths: list[str]) -> list[Path]:
    """Problem folders (or kernel files), in the order given; a folder of problems expands to its sorted children."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise UsageError(raw, "no such file or folder", "pass problem folders (kernels/softmax) or a folder of them (kernels/)")
        if _is_problem(p):
            found = [p]
        else:
            found = sorted(c for c in p.iterdir() if c.is_dir() and not c.name.startswith((".", "_")) and _is_problem(c))
            if not found:
                raise UsageError(raw, "is neither a problem folder (kernel.py, spec.yaml) nor a folder of them",
                                 "pass kernels/ or kernels/<name>; see docs/problem-format.md")
        for f in found:
            if f.resolve() not in {o.resolve() for o in out}:
                out.append(f)
    return out


# ------------------------------------------------------------------------------------------------ port results
def find_port_result(runs_dir: Path, name: str, start_hash: str, device_kind: str) -> tuple[dict | None, list[str]]:
    """The newest port run of this problem whose final kernel passed the final gate and whose starting kernel is
    the current one; a run on the same device kind is preferred. Returns (info or None, notes)."""
    notes: list[str] = []
    base = Path(runs_dir) / name
    reports = sorted(base.glob("*/report.json"), key=lambda p: p.parent.name, reverse=True)
    fallback, stale = None, 0
    for rp in reports:
        try:
            rep = json.loads(rp.read_text())
        except (OSError, json.JSONDecodeError):
            notes.append(f"{rp}: unreadable report.json, skipped")
            continue
        final = rep.get("final") or {}
        if not (final.get("verdict") or {}).get("correct"):
            continue
        if (rep.get("baseline") or {}).get("source_hash") != start_hash:
            stale += 1
            continue
        kernel = rp.parent / "final" / Path(final.get("path") or "kernel.py").name
        if not kernel.exists():
            notes.append(f"{rp.parent}: report.json names {kernel.name} but final/ does not hold it, skipped")
            continue
        info = {"run_dir": str(rp.parent), "report": str(rp), "path": str(kernel),
                "device": (rep.get("device") or {}).get("kind"), "engine": rep.get("engine"),
                "claim": final.get("claim"), "improved": final.get("improved"), "is_start": final.get("is_start"),
                "source_hash": final.get("source_hash")}
        if info["device"] == device_kind:
            return info, notes + _stale_note(stale)
        fallback = fallback or info
    if fallback is not None:
        notes.append(f"no verified port run on {device_kind}; using the newest one, made on {fallback['device']}")
    return fallback, notes + _stale_note(stale)


def given_final(template: str, name: str) -> dict | None:
    """``--final``: a kernel file named on the command line stands for the port result (``{problem}`` in the
    path becomes the problem's name). It is verified afresh like any port result found in a runs folder."""
    path = Path(template.replace("{problem}", name))
    if not path.is_file():
        return None
    return {"run_dir": None, "given": str(path), "path": str(path), "device": None, "engine": None,
            "claim": "given with --final, verified and timed by this bench", "improved": None, "is_start": None,
            "source_hash": None}


def _stale_note(n: int) -> list[str]:
    return [f"{n} port run(s) skipped: their starting kernel differs from the current kernel.py"] if n else []


def _run_port(problem, opt: BenchOptions, device_kind: str) -> dict:
    """``--port``: run the pipeline on this problem now and return the port-result info."""
    # lazy: the pipeline imports libcst and every stage (about a second); `xeforge --help` imports this module
    from xeforge.pipeline import Pipeline, PortOptions

    settings = load_settings()
    if opt.budget is not None:
        settings = settings.replace(tuning_budget=opt.budget,
                                    cpu_tuning_budget=min(opt.budget, settings.cpu_tuning_budget))
    if opt.time_budget is not None:
        settings = settings.replace(port_minutes=opt.time_budget)
    if opt.check_lanes is not None:
        settings = settings.replace(check_lanes=opt.check_lanes)
    unfinished = unfinished_port(Path(opt.runs_dir), problem, device_kind) if opt.continue_ports else None
    if unfinished is not None:
        say(f"  [port {problem.name}] continuing the unfinished port in {unfinished} (its recorded trials are replayed)")
    popt = PortOptions(device=device_kind, stages=opt.stages, engine=opt.engine, runs_dir=Path(opt.runs_dir),
                       target=opt.target, triton=opt.triton, settings=settings, llm=opt.llm,
                       resume=unfinished is not None, run_dir=unfinished,
                       argv=["port", str(problem.root), "--device", device_kind, "(from xeforge bench --port)"])
    rep = Pipeline(problem, popt, progress=lambda m: say(f"  [port {problem.name}] {m}")).run()
    final = rep["final"]
    run_dir = Path(rep["run_dir"])
    return {"run_dir": str(run_dir), "report": str(run_dir / "report.json"),
            "path": str(run_dir / "final" / Path(final["path"]).name), "device": device_kind,
            "engine": rep.get("engine"), "claim": final.get("claim"), "improved": final.get("improved"),
            "is_start": final.get("is_start"), "source_hash": final.get("source_hash"), "ported_now": True}


def unfinished_port(runs_dir: Path, problem, device_kind: str) -> Path | None:
    """The newest run folder of ``problem`` in ``runs_dir`` whose port never finished (interrupted, or killed while
    running: a bench call's ``timeout``) on this kind of device, of this starting kernel; None if there is none. A
    resumed bench continues it instead of porting from scratch: its baseline and finished trials are replayed."""
    base = Path(runs_dir) / problem.name
    for run in sorted((p for p in base.glob("*") if (p / "run.json").exists()), key=lambda p: p.name, reverse=True):
        try:
            meta = json.loads((run / "run.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if meta.get("status") == "done":
            return None  # the newest run finished: a later one is a new port
        if (meta.get("status") in ("running", "interrupted") and meta.get("start_hash") == problem.source_hash
                and (meta.get("device") or {}).get("kind") == device_kind):
            return run
    return None


def port_verdicts(port: dict, start_hash: str, final_hash: str | None) -> dict:
    """The baseline and final-gate verdicts of a port this bench ran itself (``--port``), keyed start / final.

    Those are the same cascade on the same device with the same code, minutes old: verifying them again would
    double the bench's correctness time for nothing. A verdict is used only when it belongs to the source benched
    (by hash) and carries a passed correctness gate; anything else is verified again by the caller.
    """
    if not port.get("ported_now") or not port.get("run_dir"):
        return {}
    out = {}
    for key, folder, want in (("start", "baseline", start_hash), ("final", "final", final_hash)):
        path = Path(port["run_dir"]) / folder / "verdict.json"
        try:
            verdict = Verdict.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        g2 = next((g for g in verdict.gates if g.gate == "2-correctness"), None)
        if verdict.source_hash == want and verdict.correct and g2 is not None and g2.status == "pass":
            out[key] = verdict
    return out


# ------------------------------------------------------------------------------------------------ statistics
def time_stats(times: list[float]) -> dict:
    return {**Stats.of(times).as_dict(), "times_ms": [round(t, 6) for t in times]}


def speedup_of(base: list[float], new: list[float]) -> dict:
    """How much faster ``new`` is than ``base``: median(base) / median(new), with the spread of the per-round
    ratios (the entries are timed interleaved, so round i of each is a pair)."""
    value = statistics.median(base) / statistics.median(new)
    ratios = paired_ratios(base, new)
    q1, q3 = (quantile(ratios, 0.25), quantile(ratios, 0.75)) if ratios else (float("nan"), float("nan"))
    return {"value": value, "ratio_q1": q1, "ratio_q3": q3, "ratio_iqr": q3 - q1, "pairs": len(ratios)}


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def roofline_for(variant, dtype: str | None, entry: Any) -> dict:
    """Peak, bandwidth, the roofline bound (floor time) and the arithmetic intensity of one variant."""
    short = _DTYPE_SHORT.get(dtype or "float32", dtype or "fp32")
    out: dict[str, Any] = {"dtype": short, "flop": variant.flop, "bytes": variant.bytes, "peak_flops": None,
                           "bandwidth_bytes_per_s": None, "floor_ms": None, "bound": None, "intensity": None,
                           "source": None}
    if variant.flop and variant.bytes:
        out["intensity"] = variant.flop / variant.bytes
    if entry is None:
        out["source"] = "no knowledge-base device entry for this device: no roofline"
        return out
    try:
        out["peak_flops"] = entry.peak_flops(short)
    except Exception:  # a KB entry without the accessor or the dtype: roofline from bandwidth alone
        out["peak_flops"] = None
    try:
        out["bandwidth_bytes_per_s"] = entry.bandwidth_bytes_per_s
    except Exception:  # same: peak alone
        out["bandwidth_bytes_per_s"] = None
    kb_id = getattr(entry, "id", "?")
    if out["peak_flops"] is None and out["bandwidth_bytes_per_s"] is None:
        out["source"] = f"knowledge-base entry {kb_id} states no peak or bandwidth: no roofline"
    else:
        known = [w for w, val in ((f"peak {short}", out["peak_flops"]), ("bandwidth", out["bandwidth_bytes_per_s"]))
                 if val is not None]
        out["source"] = f"knowledge-base entry {kb_id} (datasheet {' and '.join(known)})"
    floor = roofline_floor(variant.flop, variant.bytes, out["peak_flops"], out["bandwidth_bytes_per_s"])
    if floor is not None:
        out["floor_ms"] = floor * 1e3
        t_c = variant.flop / out["peak_flops"] if variant.flop and out["peak_flops"] else 0.0
        t_m = variant.bytes / out["bandwidth_bytes_per_s"] if variant.bytes and out["bandwidth_bytes_per_s"] else 0.0
        out["bound"] = "compute" if t_c >= t_m else "memory"
    return out


def achieved(median_ms: float, roof: dict) -> dict:
    s = median_ms * 1e-3
    return {"flop_per_s": roof["flop"] / s if roof["flop"] else None,
            "bytes_per_s": roof["bytes"] / s if roof["bytes"] else None,
            "pct_roofline": 100.0 * roof["floor_ms"] / median_ms if roof["floor_ms"] else None}


# ------------------------------------------------------------------------------------------------ one problem
@dataclass
class BenchContext:
    """What every problem of one run shares."""

    device: Any  # DeviceInfo
    kbc: Any  # KBContext or None
    settings: Any  # Settings
    options: BenchOptions
    work_root: Path
    make_verifier: Callable[..., Any] | None = None  # (problem, device, settings, workdir, hooks, entry) -> Verifier

    def verifier(self, problem, workdir: Path):
        # lazy: the pipeline imports libcst and every stage (about a second); `xeforge --help` imports this module
        from xeforge.pipeline import constraint_hook, diagnoser

        hooks = [h for h in [constraint_hook(self.kbc)] if h] if self.kbc is not None else []
        entry = getattr(self.kbc, "entry", None)
        if self.make_verifier is not None:
            return self.make_verifier(problem, self.device, self.settings, workdir, hooks, entry)
        dx = diagnoser(self.kbc, self.device) if self.kbc is not None else None
        return Verifier(problem, self.device, self.settings, workdir, hooks, entry, dx)


def _entry(label: str, path: Path | None, text: str | None = None) -> dict:
    e: dict[str, Any] = {"label": label, "path": str(path) if path else None, "source_hash": None,
                         "verified": NOT_RUN, "verification": "", "gates": [], "time": None, "timed": False,
                         "not_timed": "", "achieved": None, "error": None}
    if path is not None:
        e["source_hash"] = source_hash(text if text is not None else Path(path).read_text())
    return e


def _record_verdict(e: dict, verdict) -> None:
    e["verified"] = VERIFIED if verdict.correct else FAILED
    e["verification"] = verdict.feedback()
    e["gates"] = [{"gate": g.gate, "status": g.status, "summary": g.summary} for g in verdict.gates]
    lines = describe_diagnosis(getattr(verdict, "diagnosis", None), quiet=True)  # the CPU header says "none" once
    if lines:
        e["compiler"] = lines
    cost = (getattr(verdict, "diagnosis", None) or {}).get("cost")
    if cost:
        e["capture_cost"] = cost  # the compiler-facts capture against the first call that compiled
    g2 = next((g for g in verdict.gates if g.gate == "2-correctness"), None)
    if g2 is not None and g2.status == "pass":
        e["verification"] = g2.summary
        e["checked_variants"] = g2.details.get("variants")
        e["rounds"] = g2.details.get("rounds")
        e["oracle"] = g2.details.get("oracle")


def bench_problem(path: Path, ctx: BenchContext) -> dict:
    """One row of the suite table. Never raises for a problem's own failure (only for KeyboardInterrupt)."""
    t0 = time.monotonic()
    row: dict[str, Any] = {"problem": path.stem if path.is_file() else path.name, "path": str(path), "status": "ok",
                           "error": None, "kind": None, "origin": None, "description": None, "variant": None,
                           "roofline": None, "entries": {}, "speedups": {}, "notes": [], "port_run": None}
    workdir = ctx.work_root / row["problem"]
    try:
        _bench_problem(path, ctx, row, workdir)
    except XeforgeError as exc:
        row["status"], row["error"] = "error", exc.render()
    except Exception as exc:  # noqa: BLE001 — a bug or a broken problem must not stop the suite; the row says what
        row["status"], row["error"] = "error", f"unexpected {type(exc).__name__}: {exc}"
        row["traceback"] = traceback.format_exc()[-3000:]
    finally:
        row["elapsed_s"] = round(time.monotonic() - t0, 2)
        for scratch in ("io", "weights"):  # bench-gpu weights can be hundreds of MB per problem
            shutil.rmtree(workdir / scratch, ignore_errors=True)
    return row


def _bench_problem(path: Path, ctx: BenchContext, row: dict, workdir: Path) -> None:
    opt, device = ctx.options, ctx.device
    problem = load_problem(path)
    row.update(problem=problem.name, kind=problem.spec.kind, origin=problem.spec.origin,
               description=problem.spec.description)
    row["notes"] += list(problem.notes)
    variant = problem.variant(opt.variant) if opt.variant else problem.timing_variant(device.kind)
    dtype = problem.compute_dtype(variant)
    row["variant"] = {"name": variant.name, "dims": dict(variant.dims), "dtype": dtype, "flop": variant.flop,
                      "bytes": variant.bytes, "flop_expr": variant.flop_expr, "bytes_expr": variant.bytes_expr}
    row["roofline"] = roofline_for(variant, dtype, getattr(ctx.kbc, "entry", None))

    entries = row["entries"]
    entries["start"] = _entry(ENTRY_LABELS["start"], problem.kernel_path, problem.kernel_source)
    final = _entry(ENTRY_LABELS["final"], None)
    entries["final"] = final
    port = None
    if opt.final:
        port = given_final(opt.final, problem.name)
        if port is None:
            final["verification"] = (f"no kernel file at {opt.final.replace('{problem}', problem.name)} (--final; "
                                     "'{problem}' in its path becomes each problem's name)")
            final["not_timed"] = "no port result"
    elif opt.port:
        try:
            port = _run_port(problem, opt, device.kind)
        except XeforgeError as exc:
            final["error"] = f"--port failed: {exc.render()}"
            final["verification"] = "no port result: the port failed"
    else:
        port, notes = find_port_result(opt.runs_dir, problem.name, problem.source_hash, device.kind)
        row["notes"] += notes
        if port is None:
            final["verification"] = (f"no verified port result in {opt.runs_dir}/{problem.name}/ "
                                     "(run `xeforge port` first, or pass --port)")
            final["not_timed"] = "no port result"
    if port is not None:
        row["port_run"] = port
        entries["final"] = final = _entry(ENTRY_LABELS["final"], Path(port["path"]))
    ref = problem.reference_path
    for key, mode in (("eager", None), ("compile", opt.compile_mode)):
        e = _entry(ENTRY_LABELS[key] + (f" ({mode})" if mode and mode != "default" else ""), ref)
        e["compile_mode"] = mode
        e["verification"] = ("the PyTorch reference itself, at the variant dtype (the oracle runs it in float64); "
                             "not re-verified" if ref else "no reference.py: nothing to compare against")
        if ref is None:
            e["not_timed"] = "no reference.py"
        entries[key] = e
    widened = reference_widening(problem, variant) if ref is not None and device.can_time else None
    if widened:
        row["notes"].append(widened)
        for key in ("eager", "compile"):
            entries[key]["unlike"] = widened

    workdir.mkdir(parents=True, exist_ok=True)
    blas = blas_baseline(problem, variant, workdir, kind=device.kind) if device.can_time else None
    if blas is not None:
        op = "torch._int_mm" if problem.compute_dtype(variant) == "int8" else "torch.matmul"
        e = _entry(ENTRY_LABELS["blas"] + f" ({op}, {'x'.join(str(variant.dims[d]) for d in 'MNK')})", blas)
        e["verification"] = ("a throughput baseline, not the problem: the GEMM alone through the vendor BLAS "
                             f"({op}; cuBLAS on cuda, oneDNN on xpu) at the problem's M, N, K and dtype")
        entries["blas"] = e
    with ctx.verifier(problem, workdir) as v:
        start = entries["start"]
        fresh = port_verdicts(port, start["source_hash"], final["source_hash"]) if port else {}
        if fresh:
            row["notes"].append("start and port result: gate verdicts of the port run made just now by this bench "
                                "(its baseline and final gate, same device and code), not verified a second time")
        _record_verdict(start, fresh.get("start") or v.verify(problem.kernel_path, None,
                                                               source_hash=start["source_hash"]))
        if final["path"]:
            if final["source_hash"] == start["source_hash"]:
                for k in ("verified", "verification", "gates", "checked_variants", "rounds", "oracle"):
                    if k in start:
                        final[k] = start[k]
                final["verification"] = "same source as the starting kernel (verdict shared): " + start["verification"]
            else:
                _record_verdict(final, fresh.get("final") or v.verify(Path(final["path"]), None,
                                                                      source_hash=final["source_hash"]))
        if not device.can_time:
            for e in entries.values():
                if e["path"]:
                    e["not_timed"] = "not timed: the CPU interpreter measures nothing (correctness only)"
            return
        _time_row(v, problem, variant, row, ctx)
        for key in ("start", "final"):  # where each one's device time goes (profiler; not gate 3's timer)
            e = entries.get(key) or {}
            if e.get("path") and e.get("verified") == VERIFIED and (key == "start"
                                                                   or e.get("source_hash") != start["source_hash"]):
                try:
                    view = v.profile(Path(e["path"]), variant)
                except Exception as exc:  # noqa: BLE001 — an advisory view; it never costs the problem its row
                    view = {"available": False, "why": f"the profile failed: {type(exc).__name__}: {exc}"[:300]}
                row.setdefault("breakdown", {})[key] = {**view, "line": describe_profile(view)}
                if opt.profile == "deep":  # the vendor profiler's counters (ncu), in a worker of its own
                    try:
                        dv = v.deep_profile(Path(e["path"]), variant)
                    except Exception as exc:  # noqa: BLE001 — advisory, as above
                        dv = {"available": False, "why": f"the deep profile failed: {type(exc).__name__}: {exc}"[:300]}
                    row["breakdown"][key].update(deep=dv, deep_lines=describe_deep(dv))
        if not opt.variant:
            _time_shapes(v, problem, problem.timed_variants(device.kind)[1:], row, ctx, workdir)


_BLAS_MODEL = """\
# Generated by xeforge bench: the GEMM of {problem} alone through the vendor BLAS, a throughput baseline.
import torch

M, N, K = {M}, {N}, {K}
DTYPE = torch.{dtype}  # the problem's compute dtype at this variant (a variant without a dtype of its own too)


class Model(torch.nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("a", torch.randn({batch}M, K, generator=g).to(DTYPE), persistent=False)
        self.register_buffer("b", torch.randn({batch}K, N, generator=g).to(DTYPE), persistent=False)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        return None  # the problem's weights belong to its own Model, not to this baseline

    def forward(self, *inputs):
        return torch.matmul(self.a, self.b)
"""


_INT8_BLAS_MODEL = """\
# Generated by xeforge bench: the int8 GEMM of {problem} alone through the vendor BLAS (cuBLASLt via
# torch._int_mm: int8 operands, int32 accumulation and output), a throughput baseline without scales or epilogue.
import torch

M, N, K = {M}, {N}, {K}


class Model(torch.nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("a", torch.randint(-127, 128, (M, K), generator=g, dtype=torch.int8), persistent=False)
        # the weight as [N, K] rows, read transposed: the column-major operand cuBLASLt's int8 kernels take
        self.register_buffer("w", torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8), persistent=False)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        return None  # the problem's weights belong to its own Model, not to this baseline

    def forward(self, *inputs):
        return torch._int_mm(self.a, self.w.t())
"""


#: torch ops that run a matrix product (their input dtype decides the speed class: tensor cores or not)
MATMUL_OPS = frozenset({"mm", "bmm", "matmul", "addmm", "baddbmm", "linear", "einsum", "scaled_dot_product_attention"})


#: the dtypes a reference's matrix product may run in that are wider than the problem's compute dtype
_WIDER = {"bfloat16": ("float32", "float64"), "float16": ("float32", "float64"),
          "int8": ("float16", "bfloat16", "float32", "float64")}


def reference_widening(problem, variant) -> str | None:
    """Why the reference is not a like-for-like speed baseline at ``variant``, or None: a reference that computes its
    matrix products in a wider dtype than the problem's (an oracle-style ``x.float() @ w.float()`` on bfloat16
    inputs, a float64 product of int8 operands) makes eager and torch.compile time an fp32 GEMM where the kernel
    runs a bf16 one. Read from the reference's trace at the variant (on the meta device, or the CPU where its host
    code reads data)."""
    from xeforge.analysis.observe import trace_at  # lazy: the facts worker, only for a problem with a reference

    dtype = problem.compute_dtype(variant)
    wider = _WIDER.get(dtype or "")
    if problem.reference_source is None or wider is None:
        return None
    trace = trace_at(problem, variant, problem.reference_source)
    if isinstance(trace, str):
        return None
    for op in trace.ops:
        name = op.op.rsplit(".", 1)[-1].strip("_")
        wide = sorted({a.dtype for a in op.inputs if a.kind == "tensor" and a.dtype in wider})
        if name in MATMUL_OPS and wide:
            at = f" ({op.stack[-1].function}, line {op.stack[-1].line})" if op.stack else ""
            return (f"the reference runs its {name}{at} in {', '.join(wide)} where the problem computes in {dtype}: "
                    "eager and torch.compile time that wider product, not a like-for-like baseline (a reference "
                    f"that computes in {dtype} gives one; the oracle runs it in float64 either way)")
    return None


def blas_baseline(problem, variant, workdir: Path, name: str = "blas_gemm.py", kind: str = "cuda") -> Path | None:
    """A Model file (``workdir / name``) timing the problem's GEMM alone with ``torch.matmul`` at the variant's M, N,
    K in its compute dtype (its own, else its first floating input's: a bf16 problem whose variants name no dtype is
    timed against a bf16 GEMM, not an fp32 one); None unless a gemm with M, N, K. An int8 GEMM is timed with
    ``torch._int_mm`` on cuda where cuBLASLt takes the shape (:func:`int8_blas_takes`), else has none. A problem
    whose work is several such GEMMs (a batch dim: its ``flop`` is a whole multiple of 2*M*N*K) is timed against as
    many, batched; one whose work is not is left without a baseline rather than compared with a GEMM of another
    size."""
    dims = variant.dims
    if problem.spec.kind != "gemm" or not all(isinstance(dims.get(d), int) for d in "MNK"):
        return None
    dtype = problem.compute_dtype(variant) or "float32"
    batch = gemm_batch(variant.flop, dims["M"], dims["N"], dims["K"])
    if batch is None:
        return None
    path = workdir / name
    if dtype == "int8":
        if kind != "cuda" or batch > 1 or not int8_blas_takes(dims["M"], dims["N"], dims["K"]):
            return None
        atomic_write(path, _INT8_BLAS_MODEL.format(problem=problem.name, M=dims["M"], N=dims["N"], K=dims["K"]))
        return path
    if not dtype.startswith(("float", "bfloat")):
        return None
    atomic_write(path, _BLAS_MODEL.format(problem=problem.name, M=dims["M"], N=dims["N"], K=dims["K"], dtype=dtype,
                                          batch=f"{batch}, " if batch > 1 else ""))
    return path


def int8_blas_takes(m: int, n: int, k: int) -> bool:
    """Whether ``torch._int_mm`` (cuBLASLt's int8 GEMM, int32 out) runs this shape on CUDA: more than 16 rows, K and
    N multiples of 8 (its checks in ATen's ``_int_mm_out_cuda``); a decode shape has no int8 vendor baseline."""
    return m > 16 and k % 8 == 0 and n % 8 == 0


def gemm_batch(flop: Any, m: int, n: int, k: int) -> int | None:
    """How many M x K @ K x N GEMMs the variant's ``flop`` counts: 1 when it is about one (an epilogue's few flops
    on top), the batch when it is a whole multiple (batched_matmul_3d's B), None when it is neither."""
    one = 2 * m * n * k
    if not isinstance(flop, (int, float)) or flop <= 0 or flop < 1.5 * one:
        return 1
    batch = round(flop / one)
    return batch if abs(batch * one - flop) <= 0.05 * flop else None


def _time_row(v, problem, variant, row: dict, ctx: BenchContext) -> None:
    entries = row["entries"]
    todo: list[tuple[str, Path, str | None]] = []
    for key, e in entries.items():
        if not e["path"]:
            continue
        if key in ("start", "final") and e["verified"] != VERIFIED:
            e["not_timed"] = "not timed: failed verification"
            continue
        if key == "final" and e["source_hash"] == entries["start"]["source_hash"]:
            continue  # the port returned the starting kernel: timing it twice would only measure noise
        todo.append((key, Path(e["path"]), e.get("compile_mode")))
    pairs = ctx.options.pairs or ctx.settings.timed_pairs
    times, errors = time_entries_robust(v, todo, variant, pairs)
    if "start" in times and entries["final"]["path"] and entries["final"]["source_hash"] == entries["start"]["source_hash"]:
        times["final"] = times["start"]
        row["notes"].append("the port result is the starting kernel (same source hash): no verified improvement, "
                            "final = start by definition (1.00x), timed once")
    for key, msg in errors.items():
        entries[key]["error"] = f"timing failed: {msg}"
        entries[key]["not_timed"] = "not timed: the timing run failed"
    roof = row["roofline"]
    for key, ts in times.items():
        e = entries[key]
        e["time"] = time_stats(ts)
        e["timed"] = True
        e["achieved"] = achieved(e["time"]["median_ms"], roof)
        floor = roof["floor_ms"]
        if floor and e["time"]["median_ms"] < floor and key in ("start", "final"):
            row["notes"].append(f"{key}: median {e['time']['median_ms']:.4f} ms is below the roofline bound "
                                f"{floor:.4f} ms: a measurement or correctness problem")
    for name, (base, new) in SPEEDUPS.items():
        if base in times and new in times:
            sp = speedup_of(times[base], times[new])
            sp["flagged_over"] = ctx.settings.speedup_flag if sp["value"] > ctx.settings.speedup_flag else None
            if entries[base].get("unlike"):
                sp["unlike"] = True  # against a reference that computes wider than the problem (row's notes)
            row["speedups"][name] = sp


#: the speedups shown per timed shape (a GEMM's BLAS baseline is written again for each shape's M, N, K)
SHAPE_SPEEDUPS = ("final_vs_start", "final_vs_eager", "final_vs_compile", "final_vs_blas")


def _time_shapes(v, problem, variants: list, row: dict, ctx: BenchContext, workdir: Path) -> None:
    """The entries timed at the primary shape, timed again at each other timed shape (``row["shapes"]``, the
    primary first): a port must hold at every shape its users run, not only at the one gate 3 decides on first.
    A GEMM's vendor-BLAS baseline is sized for each shape in turn (``blas_gemm-<variant>.py``)."""
    entries = row["entries"]
    keys = [k for k in ("start", "final", "eager", "compile", "blas") if entries.get(k, {}).get("timed")]
    if not variants or "start" not in keys:
        return
    same = entries["final"].get("source_hash") == entries["start"].get("source_hash")
    todo = [(k, Path(entries[k]["path"]), entries[k].get("compile_mode")) for k in keys
            if not (k == "final" and same) and k != "blas"]
    shapes = [{"variant": row["variant"]["name"], "dims": dict(row["variant"]["dims"]),
               "class": shape_class(problem.spec, row["variant"]["dims"]),
               "times": {k: entries[k]["time"] for k in keys},
               "speedups": {n: row["speedups"][n] for n in SHAPE_SPEEDUPS if n in row["speedups"]}, "errors": {}}]
    pairs = ctx.options.pairs or ctx.settings.timed_pairs
    for var in variants:
        blas = blas_baseline(problem, var, workdir, f"blas_gemm-{var.name}.py") if "blas" in keys else None
        times, errors = time_entries_robust(v, todo + ([("blas", blas, None)] if blas else []), var, pairs)
        if same and "start" in times and "final" in keys:
            times["final"] = times["start"]
        speedups = {n: speedup_of(times[SPEEDUPS[n][0]], times[SPEEDUPS[n][1]]) for n in SHAPE_SPEEDUPS
                    if SPEEDUPS[n][0] in times and SPEEDUPS[n][1] in times}
        for n, sp in speedups.items():
            if entries[SPEEDUPS[n][0]].get("unlike"):
                sp["unlike"] = True
        shapes.append({"variant": var.name, "dims": dict(var.dims), "class": shape_class(problem.spec, var.dims),
                       "times": {k: time_stats(t) for k, t in times.items()}, "speedups": speedups, "errors": errors})
    row["shapes"] = shapes


def time_entries_robust(v, todo: list[tuple[str, Path, str | None]], variant, pairs: int):
    """Time every entry interleaved; if the run fails, find the entries that break it alone and time the rest."""
    if not todo:
        return {}, {}
    try:
        got = v.time_entries([(p, m) for _, p, m in todo], variant, pairs)
        return {k: t for (k, _, _), t in zip(todo, got)}, {}
    except WorkerFailure as exc:
        first = str(exc)
    errors: dict[str, str] = {}
    ok = []
    for item in todo:  # which entry breaks it? each alone, one round
        try:
            v.time_entries([(item[1], item[2])], variant, 1)
            ok.append(item)
        except WorkerFailure as exc:
            errors[item[0]] = str(exc)[:1000]
    if not errors:  # every entry runs alone but not together: the joint failure is all we know
        return {}, {k: first[:1000] for k, _, _ in todo}
    if not ok:
        return {}, errors
    try:
        got = v.time_entries([(p, m) for _, p, m in ok], variant, pairs)
    except WorkerFailure as exc:
        return {}, {**errors, **{k: str(exc)[:1000] for k, _, _ in ok}}
    return {k: t for (k, _, _), t in zip(ok, got)}, errors


# ------------------------------------------------------------------------------------------------ the run
def bench_settings(opt: BenchOptions, device_kind: str, env: dict[str, str] | None = None):
    env = os.environ if env is None else env
    settings = load_settings(env)
    if opt.rounds is not None:
        if opt.rounds < 1:
            raise UsageError("--rounds", f"{opt.rounds} is not a positive number of rounds", "use --rounds 1 or more")
        settings = settings.replace(correctness_rounds=opt.rounds)
    elif device_kind == "cpu" and "XEFORGE_ROUNDS" not in env:
        settings = settings.replace(correctness_rounds=min(CPU_ROUNDS, settings.correctness_rounds))
    if opt.pairs is not None and opt.pairs < 2:
        raise UsageError("--pairs", f"{opt.pairs} timed rounds cannot give a spread", "use --pairs 2 or more (default 20)")
    return settings


def default_out(root: Path = Path("bench-out")) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out, n = root / stamp, 1
    while out.exists():
        n += 1
        out = root / f"{stamp}-{n}"
    return out


def timing_method(device, settings, pairs: int, lanes: int = 1) -> str | None:
    if not device.can_time:
        return None
    shared = (f"; {lanes} problems at once per GPU, every timing with the GPU to itself (the other lanes' correctness "
              "runs and compiles wait for it)") if lanes > 1 else ""
    return (f"{device.kind} events around each call with a full sync, L2 flushed before every call (2x L2, the write "
            f"repeated so the device is still busy while the host issues the call: launch overhead is not timed), rotated "
            f"input buffers; start, final, eager and torch.compile interleaved in one worker (one cyclic order, so "
            f"no entry runs twice in a row), {pairs} rounds after {settings.warmup_calls} warm-up calls; median and IQR"
            f"{shared}")


def new_report(opt: BenchOptions, device, kbc, settings, out: Path) -> dict:
    pairs = opt.pairs or settings.timed_pairs
    return {
        "schema": 1,
        "kind": "bench",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "argv": opt.argv,
        "out_dir": str(out),
        "device": device.as_dict(),
        "versions": devices.versions(),
        "kb_device": getattr(kbc, "device_id", None),
        "kb_note": getattr(kbc, "note", "") or "",
        "triton_gate": getattr(getattr(kbc, "triton", None), "text", None),
        "timed": bool(device.can_time),
        "header": None if device.can_time else CPU_HEADER,
        "timing_method": timing_method(device, settings, pairs, opt.lanes_per_gpu),
        "correctness_method": (f"gates 0-2 of the verification cascade in an isolated worker: static and "
                               f"knowledge-base checks, then {settings.correctness_rounds} rounds of fresh inputs "
                               f"(normal, uniform, outliers) per variant the device can hold"
                               f"{', plus 2 per ragged shape' if settings.ragged_shapes else ''}, against the "
                               "float64 PyTorch reference"),
        "compile_mode": opt.compile_mode,
        "variant_choice": (opt.variant or "bench-gpu (or the first bench-* variant)") if device.can_time else
        "none: nothing is timed on the CPU interpreter (correctness runs on ci and its ragged shapes)",
        "pairs": pairs if device.can_time else None,
        "port_source": "--port (ported in this run)" if opt.port else f"latest verified run in {opt.runs_dir}/<problem>/",
        "settings": dict(settings.__dict__),
        "workers": opt.workers,
        "lanes_per_gpu": opt.lanes_per_gpu,
        "status": "running",
        "resumed": bool(opt.resume),
        "pending": [],
        "problems": [],
        "geomean": {},
        "counts": {},
        "summary": "",
        "elapsed_s": None,
    }


def _ratio_text(sp: dict) -> str:
    """``0.98x`` with its paired-ratio quartiles when there are some: a reader sees whether it is noise."""
    q1, q3 = sp.get("ratio_q1"), sp.get("ratio_q3")
    spread = (f"; paired ratios {q1:.2f}-{q3:.2f}" if isinstance(q1, float) and isinstance(q3, float)
              and math.isfinite(q1) and math.isfinite(q3) else "")
    return f"{sp['value']:.2f}x{spread}"


def _class_geomeans(rows: list[dict]) -> dict[str, dict]:
    """Per shape class: the geomean of each speedup over the class's timed shapes, and the port result's lowest
    ratio to torch.compile with where it was (the issue's bar is both: a class's geomean and its worst shape)."""
    got: dict[str, dict[str, list]] = {}
    for r in rows:
        for sh in r.get("shapes") or []:
            cls = sh.get("class")
            if cls is None:
                continue
            for name, sp in (sh.get("speedups") or {}).items():
                if not sp.get("unlike"):
                    got.setdefault(cls, {}).setdefault(name, []).append((sp["value"], r["problem"], sh["variant"]))
    out = {}
    for cls in ("decode", "large", "odd"):
        if cls not in got:
            continue
        out[cls] = {n: {"value": geomean([v for v, _, _ in vals]), "n": len(vals)} for n, vals in got[cls].items()}
        if vals := got[cls].get("final_vs_compile"):
            low = min(vals)
            out[cls]["final_vs_compile"]["lowest"] = {"value": low[0], "problem": low[1], "variant": low[2]}
    return out


def finalize(report: dict) -> dict:
    """Geomeans, counts and the one-line summary, from the rows (used again by ``xeforge report``)."""
    rows = report["problems"]
    gm = {}
    for name in SPEEDUPS:  # a ratio against a reference that computes wider than the problem is left out (noted)
        got = [r["speedups"][name] for r in rows if name in (r.get("speedups") or {})]
        vals = [sp["value"] for sp in got if not sp.get("unlike")]
        gm[name] = {"value": geomean(vals), "n": len(vals)}
        if len(vals) < len(got):
            gm[name]["left_out_wider_ref"] = len(got) - len(vals)
    report["geomean"] = gm
    by_shape: dict[str, dict] = {}  # timed-shape name (bench-gpu, bench-gpu-1, ...) -> speedup -> geomean
    for r in rows:
        for sh in r.get("shapes") or []:
            for name, sp in (sh.get("speedups") or {}).items():
                if not sp.get("unlike"):
                    by_shape.setdefault(sh["variant"], {}).setdefault(name, []).append(sp["value"])
    report["geomean_by_shape"] = {k: {n: {"value": geomean(v), "n": len(v)} for n, v in d.items()}
                                  for k, d in sorted(by_shape.items())}
    report["geomean_by_class"] = _class_geomeans(rows)
    slower = [f"{r['problem']} at {sh['variant']} ({_ratio_text(sh['speedups']['final_vs_start'])})"
              for r in rows for sh in r.get("shapes") or []
              if sh.get("speedups", {}).get("final_vs_start", {}).get("value", 1.0) < 1.0]
    ents = [r.get("entries") or {} for r in rows]
    counts = {
        "problems": len(rows),
        "errors": sum(r["status"] == "error" for r in rows),
        "start_verified": sum(e.get("start", {}).get("verified") == VERIFIED for e in ents),
        "start_failed": sum(e.get("start", {}).get("verified") == FAILED for e in ents),
        "final_verified": sum(e.get("final", {}).get("verified") == VERIFIED for e in ents),
        "final_failed": sum(e.get("final", {}).get("verified") == FAILED for e in ents),
        "no_port_result": sum(bool(e) and not e.get("final", {}).get("path") for e in ents),
        "entry_errors": sum(1 for e in ents for x in e.values() if x.get("error")),
    }
    report["counts"] = counts
    retried = [{"problem": r["problem"], "path": r.get("path"), "attempts": w["attempts"], "lost": w.get("lost", [])}
               for r in rows if (w := r.get("worker") or {}).get("attempts", 1) > 1]
    if retried or "cluster" in report:  # a local bench never retries: its record stays as it was
        report["retried"] = retried
    dev = report["device"]
    head = f"{counts['problems']} problem(s) on {dev['kind']} ({dev['name']})"
    parts = [f"start verified {counts['start_verified']}/{counts['problems']}",
             f"port result verified {counts['final_verified']}/{counts['problems']}"
             + (f" ({counts['no_port_result']} without one)" if counts["no_port_result"] else "")]
    if counts["start_failed"] or counts["final_failed"]:
        parts.append(f"failed verification: {counts['start_failed']} start, {counts['final_failed']} port result")
    if counts["errors"]:
        parts.append(f"{counts['errors']} problem(s) could not be benched")
    if counts["entry_errors"]:
        parts.append(f"{counts['entry_errors']} entry error(s)")
    if retried:
        parts.append(f"{len(retried)} problem(s) retried after a lost worker: "
                     + ", ".join(f"{r['problem']} ({r['attempts']} attempts)" for r in retried))
    if report.get("pending"):
        parts.append(f"{len(report['pending'])} problem(s) not started (--stop-after; continue with --resume)")
    if report["timed"]:
        for name, label in (("final_vs_eager", "port result vs eager"), ("final_vs_compile", "vs torch.compile"),
                            ("final_vs_start", "vs start")):
            g = gm[name]
            if g["value"] is not None:
                parts.append(f"geomean {label} {g['value']:.3f}x (n={g['n']})")
            if g.get("left_out_wider_ref"):
                parts.append(f"{g['left_out_wider_ref']} {label} ratio(s) left out: the reference computes wider "
                             "than the problem (see the rows' notes)")
        classes = report["geomean_by_class"]
        per_class = [f"{cls} {c['value']:.3f}x (lowest {c['lowest']['value']:.2f}x)"
                     for cls, g in classes.items() if (c := g.get("final_vs_compile") or {}).get("value")
                     and len(classes) > 1]
        if per_class:
            parts.append("vs torch.compile per shape class: " + ", ".join(per_class))
        if report["geomean_by_shape"]:
            parts.append(f"port result slower than its start at {len(slower)} shape(s)"
                         + (f": {', '.join(slower)}" if slower else ""))
        report["summary"] = f"{head}: " + "; ".join(parts)
    else:
        report["summary"] = f"correctness only — {head}: " + "; ".join(parts) + "; nothing timed"
    if report.get("status") not in {"done", "interrupted", "failed"}:
        report["status"] = "partial"
    return report


def exit_code(report: dict) -> int:
    c = report["counts"]
    bad = c["errors"] or c["start_failed"] or c["final_failed"] or c["entry_errors"] or report["status"] != "done"
    return 2 if bad else 0


class _Progress:
    """A rich progress bar on stderr when it is a terminal; one line per finished problem otherwise."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0
        self.bar = None
        if sys.stderr.isatty():
            self.bar = Progress(TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                TextColumn("{task.description}"), console=Console(stderr=True), transient=True)
            self.task = self.bar.add_task("", total=total)
            self.bar.start()

    def starting(self, name: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=name)

    def more(self, n: int) -> None:
        """``n`` more problems to bench than counted at the start (those run again alone)."""
        self.total += n
        if self.bar is not None:
            self.bar.update(self.task, total=self.total)

    def finished(self, row: dict) -> None:
        self.done += 1
        line = f"[{self.done}/{self.total}] {row['problem']}: {_row_status(row)} ({row.get('elapsed_s', 0):.1f}s)"
        if self.bar is not None:
            self.bar.console.print(line, highlight=False)
            self.bar.advance(self.task)
        else:
            say(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _row_status(row: dict) -> str:
    if row["status"] == "error":
        return "ERROR " + (row["error"] or "").splitlines()[0][:200]
    e = row["entries"]
    s = f"start {e['start']['verified']}, port result " + (e["final"]["verified"] if e["final"]["path"] else "none")
    sp = row["speedups"].get("final_vs_eager") or row["speedups"].get("start_vs_eager")
    if sp:
        s += f", {'final' if 'final_vs_eager' in row['speedups'] else 'start'} vs eager {sp['value']:.2f}x"
    return s


def run_bench(opt: BenchOptions, *, make_verifier=None) -> dict:
    # lazy: the pipeline imports libcst and every stage (about a second); `xeforge --help` imports this module
    from xeforge.pipeline import kb_context

    paths = discover(opt.problems)
    if opt.workers < 1:
        raise UsageError("--workers", f"{opt.workers} is not a number of workers", "use --workers 1 or more")
    if opt.lanes_per_gpu < 1:
        raise UsageError("--lanes-per-gpu", f"{opt.lanes_per_gpu} is not a number of lanes", "use --lanes-per-gpu 1 or more")
    if opt.compile_mode not in COMPILE_MODES:
        raise UsageError("--compile-mode", f"unknown torch.compile mode {opt.compile_mode!r}",
                         f"use one of {', '.join(COMPILE_MODES)}")
    if opt.stop_after is not None and opt.stop_after <= 0:
        raise UsageError("--stop-after", f"{opt.stop_after} is not a positive number of minutes", "use e.g. --stop-after 8")
    if opt.cluster is not None and opt.device in ("cuda", "xpu") and not devices.available(opt.device):
        # a driver without the GPU its cluster has (a laptop): the kind --device names; each row names its device
        kind = opt.device
        device = devices.DeviceInfo(kind, f"{kind} GPUs of the Ray cluster (none on this host; each row names its own)")
        say(f"note: this host has no {kind} GPU; the problems run on the cluster's, and each row names the device "
            "it ran on (no roofline here unless --target names the knowledge-base device)")
    else:
        kind = devices.resolve(opt.device)
        device = devices.describe(kind)
    if opt.lanes_per_gpu > 1 and kind == "cpu":
        raise UsageError("--lanes-per-gpu", "the CPU interpreter has no GPU to share",
                         "use --workers N for parallel problems on the CPU")
    lanes = opt.workers * opt.lanes_per_gpu
    address = None
    if opt.cluster is not None:
        address = parse_cluster(opt.cluster)
        if opt.workers != 1:
            raise UsageError("--workers", "with --cluster the cluster's GPUs decide how many problems run at once",
                             "drop --workers; --lanes-per-gpu K still puts K problems on each GPU")
    slots = gpu_slots(kind, opt.workers, lanes=opt.lanes_per_gpu) if lanes > 1 and opt.cluster is None else []
    try:
        kbc = kb_context(device, opt.target, opt.triton)
    except XeforgeError:
        raise
    except Exception as exc:  # the KB is optional for a bench: no roofline, said in the report
        kbc = None
        say(f"note: knowledge base unavailable ({type(exc).__name__}: {exc}); no roofline")
    settings = bench_settings(opt, kind)
    if opt.redo and not opt.resume:
        raise UsageError("--redo", "re-benches problems of an earlier run, so it needs --resume",
                         "add --resume and the earlier run's --out")
    cluster = None
    if opt.cluster is not None:  # connected before anything is written: a cluster that cannot be used leaves no folder
        cluster = RayScheduler(address, kind, opt.lanes_per_gpu, say=say)
        cluster.connect()
    out, kept, earlier, before = _prepare_out(opt, device)
    scheduler: Scheduler | None = cluster  # None: each problem in this process, one after another
    if cluster is None and slots:
        scheduler = LocalScheduler(lane_locks(slots, out / "gpu-locks") if opt.lanes_per_gpu > 1 else slots)
    if opt.redo:
        again = {str(p) for p in paths}
        kept = [r for r in kept if r["path"] not in again]
    report = new_report(opt, device, kbc, settings, out)
    for r in kept:  # a row kept from before calls were recorded: measured by an earlier call, which is not known
        r.setdefault("call", None)
    report["problems"] = kept
    if scheduler is not None and scheduler.describe() is not None:
        report["cluster"] = scheduler.describe()  # filled in as the scheduler connects (nodes, GPUs, version)
    # every call that wrote into this folder (a resumed run is several), so the record says how it was made;
    # each row says which call measured it, and each call which xeforge source it ran
    call = len(earlier)
    report["calls"] = [*earlier, {"created": report["created"], "argv": opt.argv, "elapsed_s": None,
                                  "xeforge": tool_hash(), "timing_method": report["timing_method"]}]
    done = {r["path"] for r in kept}
    todo = [p for p in paths if str(p) not in done]
    if kept:
        say(f"resuming {out}: {len(kept)} problem(s) kept from the earlier run, {len(todo)} to go")
    if report["kb_note"]:
        say(f"note: {report['kb_note']}")
    if not device.can_time:
        say("note: " + CPU_HEADER)
    say(f"xeforge bench: {len(todo)} problem(s) on {device.kind} ({device.name}); outputs in {out}")
    ctx = BenchContext(device, kbc, settings, opt, out / "work", make_verifier)
    progress = _Progress(len(todo))
    t0 = time.monotonic()
    deadline = t0 + 60 * opt.stop_after if opt.stop_after else None
    # the folder's order first (a resumed call may name only some problems), then new ones in the given order
    order = {path: i for i, path in enumerate(dict.fromkeys(
        [*before, *(str(p) for p in paths)]))}
    try:
        if scheduler is not None:
            _run_scheduled(todo, opt, kind, scheduler, out, report, progress, deadline)
        else:
            for p in todo:
                if deadline is not None and time.monotonic() > deadline:
                    break
                progress.starting(p.name)
                row = bench_problem(p, ctx)
                report["problems"].append(row)
                progress.finished(row)
                _write_partial(out, report)
        for r in report["problems"]:
            r.setdefault("call", call)
        report["problems"].sort(key=lambda r: order.get(r["path"], len(order)))
        benched = {r["path"] for r in report["problems"]}
        report["pending"] = [str(p) for p in paths if str(p) not in benched]
        report["status"] = "partial" if report["pending"] else "done"
        if report["pending"]:
            say(f"--stop-after: {len(report['pending'])} problem(s) not started; continue with: "
                f"{continue_command(opt, kind, out)}")
    except KeyboardInterrupt:
        report["status"] = "interrupted"
        raise
    except BaseException:
        report["status"] = "failed"
        raise
    finally:
        progress.close()
        report["elapsed_s"] = round(time.monotonic() - t0, 1)
        report["calls"][-1]["elapsed_s"] = report["elapsed_s"]
        finalize(report)
        for r in report.get("retried") or []:
            say(f"retried after a lost worker: {r['problem']} ({r['attempts']} attempts; {'; '.join(r['lost'])})")
        try:
            write_bench_reports(out, report)
        except Exception as exc:  # noqa: BLE001 — keep the JSON even if rendering breaks; say why
            write_json(out / "bench.json", report)
            say(f"warning: could not render bench.md/bench.html ({type(exc).__name__}: {exc}); bench.json is written")
    return report


def continue_command(opt: BenchOptions, kind: str, out: Path) -> str:
    """The command that continues a stopped bench with the same options (``--final``, ``--rounds``, ...): the
    call's own arguments with ``--out`` and ``--resume`` (``--redo`` dropped: it would start the rows again)."""
    args = [a for a in opt.argv if a != "--redo"] if opt.argv[:1] == ["bench"] else \
        ["bench", *opt.problems, "--device", kind]
    if "--out" not in args:
        args += ["--out", str(out)]
    if "--resume" not in args:
        args.append("--resume")
    return shlex.join(["xeforge", *args])


def tool_hash() -> str:
    """A short hash of xeforge's own source (the package, the stages, the LLM agent, the knowledge base): which
    code benched."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for folder in ("xeforge", "stages", "cover_agent", "knowledge_base"):
        for f in sorted((root / folder).rglob("*")):
            if f.is_file() and f.suffix in (".py", ".yaml", ".j2"):
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:12]


def _prepare_out(opt: BenchOptions, device) -> tuple[Path, list[dict], list[dict], list[str]]:
    """The output folder, and with ``--resume`` the rows of the earlier run worth keeping (those without an error
    and not out of device memory), the calls that made it and the order of all its rows."""
    if opt.resume:
        if opt.out is None:
            raise UsageError("--resume", "needs the folder of the run to continue", "pass --out bench-out/<stamp>")
        out = Path(opt.out)
        path = out / "bench.json"
        if not path.exists():
            raise UsageError("--resume", f"{out} holds no bench.json to continue", "drop --resume to start a new run")
        try:
            prev = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise UsageError("--resume", f"{path} is not valid JSON ({exc.msg})", "start a new run in another --out") from None
        pdev = prev.get("device") or {}
        if pdev.get("kind") != device.kind or pdev.get("name") != device.name:
            raise UsageError("--resume", f"{out} was benched on {pdev.get('kind')} ({pdev.get('name')}), this is "
                             f"{device.kind} ({device.name})", "resume on the same device, or start a new run")
        calls = prev.get("calls") or [{"created": prev.get("created"), "argv": prev.get("argv"),
                                       "elapsed_s": prev.get("elapsed_s")}]
        rows = prev.get("problems", [])
        # a row that ran out of device memory (another lane's, as often as not) is not a result: it runs again
        kept = [r for r in rows if r.get("status") == "ok" and not _out_of_memory(r)]
        return out, kept, calls, [r["path"] for r in rows if "path" in r]
    out = Path(opt.out) if opt.out else default_out()
    if (out / "bench.json").exists():
        raise UsageError("--out", f"{out} already holds a bench run",
                         "pass --resume to continue it, choose another --out, or delete that folder")
    out.mkdir(parents=True, exist_ok=True)
    return out, [], [], []


def _write_partial(out: Path, report: dict) -> None:
    write_json(out / "bench.json", report)


# ------------------------------------------------------------------------------------------------ --workers, --cluster
def child_argv(opt: BenchOptions, problem: Path, device_kind: str, out: Path) -> list[str]:
    argv = [sys.executable, "-m", "xeforge", "bench", str(problem), "--device", device_kind, "--out", str(out),
            "--json", "--runs-dir", str(opt.runs_dir), "--compile-mode", opt.compile_mode]
    for flag, val in (("--variant", opt.variant), ("--rounds", opt.rounds), ("--pairs", opt.pairs),
                      ("--engine", opt.engine if opt.port else None), ("--budget", opt.budget),
                      ("--time-budget", opt.time_budget if opt.port else None),
                      ("--check-lanes", opt.check_lanes if opt.port else None),
                      ("--stages", ",".join(opt.stages) if opt.stages else None), ("--target", opt.target),
                      ("--triton", opt.triton)):
        if val is not None:
            argv += [flag, str(val)]
    if opt.port:
        argv += ["--port", *opt.llm_argv]
        if opt.continue_ports:
            argv.append("--continue-ports")
    if opt.final:
        argv += ["--final", opt.final]
    if opt.profile != "basic":
        argv += ["--profile", opt.profile]
    return argv


def _run_scheduled(paths: list[Path], opt: BenchOptions, kind: str, scheduler: Scheduler, out: Path, report: dict,
                   progress: _Progress, deadline: float | None) -> None:
    """Each problem as a child ``xeforge bench --json`` job on ``scheduler`` (this host's slots or a cluster);
    rows merged in problem order as they finish, bench.json rewritten after each."""
    kept = list(report["problems"])
    rows: dict[int, dict] = {}

    def job(idx: int) -> Job:
        p = paths[idx]
        stem = p.stem if p.is_file() else p.name
        part = out / "parts" / f"{idx:03d}-{stem}"
        n = 1
        while part.exists():  # a resumed run (or a retry alone) benches into a fresh folder
            n += 1
            part = part.with_name(f"{idx:03d}-{stem}-{n}")
        part.parent.mkdir(parents=True, exist_ok=True)
        return Job(idx, stem, child_argv(opt, p, kind, part), part)

    alone = False  # the second round: problems that ran out of memory beside other lanes, each with its GPU alone

    def done(o: Outcome) -> None:
        row = _child_row(o.job.part, paths[o.job.index], o.exit_code, o.job.log, o.env, o.error)
        row.setdefault("elapsed_s", o.elapsed_s)
        if o.where is not None:  # a cluster: where the finished attempt ran, and the attempts it took
            row["worker"].update(o.where, attempts=o.attempts, lost=o.lost)
        first = rows.get(o.job.index)
        if alone and first is not None:
            row["notes"] = [*row.get("notes", []), alone_note(opt.lanes_per_gpu, first)]
        elif opt.lanes_per_gpu > 1 and _out_of_memory(row):
            row["notes"] = [*row.get("notes", []), lanes_oom_note(opt.lanes_per_gpu, row.get("problem", o.job.name),
                                                                  retried=isinstance(scheduler, LocalScheduler))]
        rows[o.job.index] = row
        progress.finished(row)
        report["problems"] = kept + [rows[k] for k in sorted(rows)]
        _write_partial(out, report)

    scheduler.run([job(i) for i in range(len(paths))], done, deadline)
    oom = [i for i in sorted(rows) if _out_of_memory(rows[i])]
    if opt.lanes_per_gpu > 1 and oom and isinstance(scheduler, LocalScheduler):
        # a lane's memory is the GPU's less the other lanes': what ran out beside them runs again, one per GPU
        say(f"{len(oom)} problem(s) ran out of GPU memory beside other lanes; benching them again, each with its "
            f"GPU alone: {', '.join(rows[i]['problem'] for i in oom)}")
        alone = True
        progress.more(len(oom))
        scheduler_alone = LocalScheduler(list({s.get("CUDA_VISIBLE_DEVICES", s.get("ZE_AFFINITY_MASK")): s
                                               for s in scheduler.slots}.values()))
        scheduler_alone.run([job(i) for i in oom], done, deadline)
    report["problems"] = kept + [rows[k] for k in sorted(rows)]


def _out_of_memory(row: dict) -> bool:
    """Whether the row's error or any entry's verdict is the device running out of memory."""
    texts = [row.get("error") or ""] + [str(e.get(k) or "") for e in (row.get("entries") or {}).values()
                                       if isinstance(e, dict) for k in ("error", "verification")]
    return any("out of memory" in t.lower() for t in texts)


def lanes_oom_note(lanes: int, problem: str, retried: bool = False) -> str:
    """What an out-of-memory row means when lanes share a GPU, and the fix (``retried``: the bench runs it again
    alone once the other lanes are done, unless --stop-after ends the call first)."""
    why = (f"out of GPU memory while {lanes} problems shared the GPU (--lanes-per-gpu {lanes}): each lane holds its "
           "own float64 oracle, inputs and compiled candidates, so this may be another lane's memory, not the "
           "kernel's fault; ")
    fix = f"bench it again alone: --resume --redo {problem} --lanes-per-gpu 1"
    return why + ("the bench runs it again alone after the other lanes, unless --stop-after ends the call first; "
                  "if it did, " if retried else "") + fix


def alone_note(lanes: int, first: dict) -> str:
    """The note of a row benched again alone after it ran out of memory beside other lanes."""
    cause = next((t for t in [first.get("error") or ""] + [
        str(e.get("error") or e.get("verification") or "") for e in (first.get("entries") or {}).values()
        if isinstance(e, dict)] if "out of memory" in t.lower()), "")
    return (f"benched again with the GPU alone: with {lanes} lanes sharing it, it ran out of GPU memory"
            + (f" ({' '.join(cause.split())[:200]})" if cause else ""))


def _child_row(part: Path, problem: Path, rc: int | None, log: Path, slot: dict, error: str | None = None) -> dict:
    """The row a child wrote into its part folder, or an error row saying why there is none (``error``: the
    scheduler could not run the child to an end)."""
    worker = {"env": slot, "log": str(log), "exit_code": rc}
    child = None
    if error is None:
        try:
            child = json.loads((part / "bench.json").read_text())
            row = child["problems"][0]
        except (OSError, json.JSONDecodeError, KeyError, IndexError):
            child = None
    if child is None:
        tail = " ".join(log.read_text(errors="replace")[-800:].split()) if log.exists() else ""
        what = error or f"the worker subprocess exited with code {rc} and wrote no result"
        return {"problem": problem.stem if problem.is_file() else problem.name, "path": str(problem),
                "status": "error", "error": what + (f"; its log ends: {tail}" if tail else ""), "kind": None,
                "origin": None, "description": None, "variant": None, "roofline": None, "entries": {},
                "speedups": {}, "notes": [], "port_run": None, "worker": worker}
    row.pop("call", None)  # the child's own one call; the parent numbers its calls
    row["worker"] = {**worker, "device": child.get("device", {}).get("name")}
    return row


# ------------------------------------------------------------------------------------------------ CLI
def cmd_bench(args: argparse.Namespace) -> int:
    llm, llm_argv = None, []
    if args.port and args.engine in {"llm", "both", "auto"}:
        # lazy, for the same reason as the pipeline: the engine registry imports the rewrites (libcst) and the stages
        from xeforge.engines import llm_config

        llm = llm_config(args)
        for flag, attr in (("--model", "model"), ("--api-base", "api_base"), ("--max-iters", "max_iters"),
                           ("--best-k", "best_k")):
            if getattr(args, attr, None) is not None:
                llm_argv += [flag, str(getattr(args, attr))]
    opt = BenchOptions(problems=args.problems, device=args.device, port=args.port, compile_mode=args.compile_mode,
                       workers=args.workers, lanes_per_gpu=args.lanes_per_gpu, out=Path(args.out) if args.out else None, variant=args.variant,
                       runs_dir=Path(args.runs_dir), rounds=args.rounds, pairs=args.pairs, engine=args.engine,
                       stages=[s.strip() for s in args.stages.split(",") if s.strip()] if args.stages else None,
                       budget=args.budget, time_budget=args.time_budget, check_lanes=args.check_lanes,
                       resume=args.resume, redo=args.redo, continue_ports=args.resume or args.continue_ports,
                       stop_after=args.stop_after,
                       target=args.target, triton=args.triton, llm=llm, llm_argv=llm_argv,
                       json=args.json, argv=sys.argv[1:], final=args.final,
                       profile=args.profile, cluster=args.cluster)
    report = run_bench(opt)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        if report["header"]:
            print(report["header"])
        headers, rows = bench_table(report)
        print(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
        print(report["summary"])
        print(f"outputs: {Path(report['out_dir']) / 'bench.json'}, bench.md, bench.html")
    return exit_code(report)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="the suite table: starting kernel, port result, PyTorch eager, torch.compile (verified, timed)",
        description="Verify and time each problem's starting kernel, its latest verified port result, PyTorch eager "
                    "and torch.compile with the gate-3 harness. On --device cpu: correctness only.")
    p.add_argument("problems", nargs="+", metavar="PROBLEM", help="problem folders, kernel files, or a folder of them (kernels/)")
    p.add_argument("--device", default="auto", help="auto (xpu, then cuda, then cpu), xpu, cuda or cpu")
    p.add_argument("--target", default=None, help="knowledge-base device id for the roofline and checks (default: matched)")
    p.add_argument("--triton", default=None, help="Triton version to gate the knowledge base on (default: installed)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--port", action="store_true", help="run `xeforge port` on each problem first and bench its result")
    how.add_argument("--final", default=None, metavar="KERNEL",
                     help="bench this kernel file as the port result instead of the latest port run; '{problem}' in "
                          "the path becomes each problem's name (--final 'ports/{problem}/final-kernel.py'); "
                          "verified afresh")
    p.add_argument("--engine", default="auto", choices=["rules", "llm", "auto", "both"], help="engine for --port")
    p.add_argument("--stages", default=None, help="comma-separated stages for --port")
    p.add_argument("--budget", type=int, default=None, help="hardware evaluations per search tactic, for --port")
    add_time_budget(p, "each port's stages, for --port")
    add_check_lanes(p, "each port's candidates (--port)")
    p.add_argument("--compile-mode", default="default",
                   help="torch.compile mode: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs")
    p.add_argument("--variant", default=None, help="variant to time on a GPU (default: bench-gpu, else the first bench-* variant)")
    p.add_argument("--runs-dir", default=os.environ.get("XEFORGE_RUNS_DIR", "runs"),
                   help="where port runs live (the latest verified one per problem is benched)")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"correctness rounds per variant (default: $XEFORGE_ROUNDS or 5; {CPU_ROUNDS} on the CPU)")
    p.add_argument("--pairs", type=int, default=None, help="timed rounds of the interleaved entries (default 20)")
    p.add_argument("--workers", type=int, default=1, help="problems run at once, one local GPU each")
    p.add_argument("--lanes-per-gpu", type=int, default=1, metavar="K",
                   help="problems run at once on each GPU (default 1): their correctness runs and compiles overlap, "
                        "and each timing has the GPU to itself")
    p.add_argument("--cluster", default=None, metavar="ray[://ADDRESS]",
                   help="run each problem as a task on a Ray cluster (one GPU each, 1/K with --lanes-per-gpu K): "
                        "'ray' connects to $RAY_ADDRESS, else to a cluster on this host, else starts one here; "
                        "'ray://HOST:10001' through Ray Client. Needs pip install -e '.[ray]'")
    p.add_argument("--out", default=None, help="output folder (default: bench-out/<timestamp>/)")
    p.add_argument("--resume", action="store_true",
                   help="continue the bench in --out: keep its finished rows, bench the problems it lacks (or that errored)")
    p.add_argument("--continue-ports", action="store_true",
                   help="with --port: continue each problem's unfinished port in --runs-dir (one a bench call's "
                        "timeout killed) instead of porting it from scratch; on by --resume")
    p.add_argument("--redo", action="store_true",
                   help="with --resume: bench the problems named here again, replacing their rows in --out")
    p.add_argument("--stop-after", type=float, default=None, metavar="MINUTES",
                   help="start no new problem after this many minutes; the rest are listed and --resume continues")
    p.add_argument("--profile", default="basic", choices=["basic", "deep"],
                   help="basic: where the device time goes (torch.profiler, on a GPU); deep: also the vendor "
                        "profiler's counters per kernel (ncu on cuda: throughput, occupancy, stall reasons)")
    p.add_argument("--json", action="store_true", help="print bench.json on stdout instead of the table")
    add_llm_args(p)
    p.set_defaults(func=cmd_bench)
