"""Where one forward's device time goes: the profiler's events grouped into the file's Triton kernels, library
kernels (cuBLAS, oneDNN, torch's own) and copies.

Owns: :func:`breakdown` — from the events the worker's ``profile`` request returns (torch.profiler, per-call
device microseconds) and the names of the ``@triton.jit`` functions the source defines, the rows a report shows
(name, time, share, kind) and the Triton kernels' share. The profiler's timeline is not gate 3's timer (no L2
flush, no interleaving): its shares say where the time goes, its totals are not the verdict's times.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

MAX_ROWS = 12
_COPY = re.compile(r"^(Memcpy|Memset|memcpy|memset)|\bcopy_?\b", re.IGNORECASE)


def _short(name: str) -> str:
    """A kernel's name as a reader scans it: template arguments and signatures cut."""
    base = re.sub(r"^void\s+", "", name)
    base = re.sub(r"<.*", "", base)
    base = re.sub(r"\(.*", "", base)
    return (base.strip() or name)[:80]


def kind_of(name: str, triton_names: set[str]) -> str:
    if name in triton_names or _short(name) in triton_names:
        return "triton"
    if _COPY.search(name):
        return "copy"
    return "library"


def breakdown(events: Iterable[dict[str, Any]], triton_names: Iterable[str]) -> dict[str, Any]:
    """The report's view of one profile: ``rows`` (largest first, at most :data:`MAX_ROWS`, the rest summed),
    ``total_us`` per call, ``triton_share`` (of the device time in the file's own kernels)."""
    names = set(triton_names)
    evs = [e for e in events if isinstance(e, dict) and isinstance(e.get("device_us"), (int, float))
           and e["device_us"] > 0 and isinstance(e.get("name"), str)]
    total = sum(e["device_us"] for e in evs)
    if total <= 0:
        return {"available": False, "why": "the profiler recorded no device time"}
    rows = [{"name": _short(e["name"]), "us": round(e["device_us"], 2), "share": round(e["device_us"] / total, 4),
             "kind": kind_of(e["name"], names), "calls": e.get("calls")} for e in evs]
    rows.sort(key=lambda r: -r["us"])
    shown, rest = rows[:MAX_ROWS], rows[MAX_ROWS:]
    if rest:
        shown.append({"name": f"{len(rest)} other kernel(s)", "us": round(sum(r["us"] for r in rest), 2),
                      "share": round(sum(r["share"] for r in rest), 4), "kind": "other", "calls": None})
    triton = sum(r["us"] for r in rows if r["kind"] == "triton")
    return {"available": True, "total_us": round(total, 2), "triton_share": round(triton / total, 4), "rows": shown}


def describe(view: dict[str, Any] | None) -> str:
    """One line: 'matmul_kernel 81% (triton), relu_kernel 17% (triton), ...; Triton kernels 98% of 1234 us'."""
    if not view:
        return "not profiled"
    if not view.get("available"):
        return f"not profiled: {view.get('why', 'no profile')}"
    parts = [f"{r['name']} {r['share'] * 100:.0f}% ({r['kind']})" for r in view["rows"][:5]]
    return (", ".join(parts) + f"; Triton kernels {view['triton_share'] * 100:.0f}% of {view['total_us']:.1f} us "
            "of device time per call")
