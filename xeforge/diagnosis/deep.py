"""``--profile deep``: a vendor profiler's counters for one forward, read back as data.

Owns: which tool reads the counters on which device (:func:`tool_for`: Nsight Compute's ``ncu`` on cuda; none
read on xpu yet: unitrace and VTune are named, their readers are not written), the argv prefix the sandboxed
worker is started under (:func:`ncu_prefix`: the clocks left alone, only the kernels inside the worker's
``xeforge_deep`` NVTX range, three fixed sections), and :func:`read_ncu_csv` — the raw CSV page ``ncu`` writes
to its log file, reduced to a small fixed set per kernel: device time, compute (SM) and memory throughput as a
share of peak, the kernel's distance to the roofline (its tensor pipe's and its DRAM throughput's share of
peak), achieved occupancy, and the top stall reasons. :func:`describe` is the report's line.

ncu runs inside the sandbox with the candidate, so what it writes is as untrusted as any file the candidate
could write: the parent reads it as text with a size cap and never runs anything on it. Like the compiler facts
and the torch.profiler breakdown, the counters are advisory (they steer tactics and fill reports; no gate reads
them). A tool that is not there is named, never faked.
"""

from __future__ import annotations

import csv
import io
import re
import shutil
from pathlib import Path
from typing import Any

#: the NVTX range the worker wraps the profiled call in (warm-up calls run outside it)
RANGE = "xeforge_deep"
#: ncu sections whose raw metrics hold the fixed set (stable names across Nsight Compute releases)
SECTIONS = ("SpeedOfLight", "Occupancy", "WarpStateStats")
MAX_CSV_BYTES = 4 << 20
MAX_KERNELS = 32
#: raw metric -> the name reports use
METRICS = {
    "gpu__time_duration.sum": "time_us",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "compute_pct",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    # the kernel's own distance to the two roofs: its matrix (tensor) pipe and its DRAM traffic, share of peak
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed": "tensor_pipe_pct",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
}
_STALL = re.compile(r"issue_stalled_([a-z_]+?)_per_(?:issue|warp)_active")
TOP_STALLS = 3
_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6}


def tool_for(device_kind: str) -> tuple[str | None, str]:
    """(the tool's path, or None) and what to say when there is none."""
    if device_kind == "cuda":
        path = shutil.which("ncu")
        return path, ("" if path else "ncu (Nsight Compute) is not on PATH: install Nsight Compute or put its "
                      "folder on PATH for --profile deep")
    if device_kind == "xpu":
        found = [t for t in ("unitrace", "vtune") if shutil.which(t)]
        return None, ("--profile deep reads ncu only so far; on xpu the counters would come from unitrace or VTune "
                      + (f"({', '.join(found)} found here, no reader written)" if found else "(neither is on PATH)"))
    return None, "no hardware counters on the CPU interpreter"


def ncu_prefix(ncu: str, log_file: Path) -> list[str]:
    """The command the deep worker runs under (its output, CSV included, goes to ``log_file``, never to the
    worker's protocol channel)."""
    args = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", f"{RANGE}/", "--target-processes", "all"]
    for section in SECTIONS:
        args += ["--section", section]
    return args + ["--csv", "--page", "raw", "--log-file", str(log_file)]


def _number(cell: str) -> float | None:
    try:
        return float(cell.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def read_ncu_csv(path: Path) -> dict[str, Any]:
    """The fixed set per kernel from ncu's raw CSV page (``available``, ``kernels``, or ``why``)."""
    try:
        with open(path, "rb") as fh:
            text = fh.read(MAX_CSV_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return {"available": False, "why": "ncu wrote no report (its log file is missing)"}
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        errors = [line.strip() for line in lines if "ERROR" in line or "Error" in line][:3]
        return {"available": False, "why": "ncu profiled no kernel" + (f": {'; '.join(errors)[:400]}" if errors
                                                                        else " inside the xeforge_deep range")}
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    kname, ident = col.get("Kernel Name"), col.get("ID", 0)
    units = body[0] if body and len(body[0]) == len(header) and not body[0][ident].strip() else [""] * len(header)
    kernels = []
    for row in body:
        if kname is None or len(row) != len(header) or not row[kname] or not row[ident].strip():
            continue  # the units row, or a cut line
        k: dict[str, Any] = {"kernel": row[kname][:200]}
        for metric, name in METRICS.items():
            if metric in col and (v := _number(row[col[metric]])) is not None:
                k[name] = v * _TO_US.get(units[col[metric]], 1.0) if name == "time_us" else v
        stalls = sorted(((m.group(1), v) for name, i in col.items() if (m := _STALL.search(name))
                         and (v := _number(row[i])) is not None and v > 0), key=lambda x: -x[1])
        k["stalls"] = [{"reason": r, "cycles": round(v, 2)} for r, v in stalls[:TOP_STALLS]]
        kernels.append(k)
        if len(kernels) >= MAX_KERNELS:
            break
    if not kernels:
        return {"available": False, "why": "ncu's report holds no kernel row"}
    return {"available": True, "tool": "ncu", "kernels": kernels}


def describe(view: dict[str, Any] | None) -> list[str]:
    """One line per kernel: where it stands against the device's peaks, and why its warps wait."""
    if not view:
        return []
    if not view.get("available"):
        return [f"deep profile: none ({view.get('why', 'not collected')})"]
    out = []
    for k in view["kernels"]:
        parts = [f"{label} {k[key]:.0f}%" for key, label in (("compute_pct", "SM throughput"),
                                                             ("memory_pct", "memory throughput"),
                                                             ("tensor_pipe_pct", "tensor pipe"),
                                                             ("dram_pct", "DRAM"),
                                                             ("occupancy_pct", "achieved occupancy"))
                 if isinstance(k.get(key), (int, float))]
        if isinstance(k.get("time_us"), (int, float)):
            parts.insert(0, f"{k['time_us']:.1f} us")
        if k.get("stalls"):
            parts.append("top stalls: " + ", ".join(f"{s['reason']} {s['cycles']:.1f}" for s in k["stalls"]))
        out.append(f"deep profile ({view.get('tool', 'ncu')}): {k['kernel'][:60]}: " + ", ".join(parts))
    return out
