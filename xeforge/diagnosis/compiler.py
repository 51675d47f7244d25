"""A compiled kernel's facts, read from the files the worker wrote (:mod:`xeforge.diagnosis.capture`).

Owns: :func:`read_kernel` — the metadata facts every compiled kernel has (``regs``, ``spills``, ``shared_bytes``,
``num_warps``, ``num_stages``, ``threads_per_warp``, ``max_threads``, and on Intel the ``grf_mode`` its build flags
settled on) and the facts of the knowledge base's recognizers (regular expressions over one IR each, gated on the
backend and the Triton version by the caller's selection); :func:`read_folder` — every kernel of one call.

The files come from the worker that ran the candidate: sizes are capped on reading, a pattern runs over text
only, and what is read is never executed. A recognizer whose IR is not there (no disassembler for SASS, an IR the
backend does not produce) leaves its fact *unknown*, which is not the same as absent: a diagnosis that needs
"no TMA loads" does not hold where the PTX was not read.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from xeforge.diagnosis.capture import COST_FILE

MAX_META_BYTES = 1 << 20
MAX_IR_BYTES = 8 << 20
MAX_KERNELS = 64
_GRF = re.compile(r"-cl-intel-(\d+)-GRF-per-thread")


@dataclass
class KernelFacts:
    """What one compiled kernel is: ``facts`` by name (numbers, strings, lists of captured values); ``unknown``:
    facts a recognizer could not look for, with why."""

    kernel: str
    backend: str | None = None
    arch: str | None = None
    triton: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    unknown: dict[str, str] = field(default_factory=dict)
    capture_s: float | None = None  # what writing this kernel's files cost in the worker

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KernelFacts":
        return cls(**d)

    def summary(self) -> str:
        """One line a kernel engineer reads first."""
        f = self.facts
        parts = [f"{k} {f[k]}" for k in ("regs", "spills", "shared_bytes", "num_warps", "num_stages") if k in f]
        if "grf_mode" in f:
            parts.append(f"grf {f['grf_mode']}")
        mma = [f"{k} x{f[k]}" + (f" ({', '.join(f[k + '.types'])})" if f.get(k + ".types") else "")
               for k in ("mma.wgmma", "mma.sync") if f.get(k)]
        if mma:
            parts.append("MMA " + "; ".join(mma))
        elif f.get("dot_calls"):
            parts.append("no MMA instruction" if "mma.any" not in self.unknown and not f.get("mma.any")
                         else "MMA " + ("found" if f.get("mma.any") else "not read"))
        loads = [name for key, name in (("load.tma", "TMA"), ("load.block2d", "2D block"), ("load.cp_async", "cp.async"))
                 if f.get(key)]
        if f.get("load.vector.widths"):
            loads.append("vector x" + "/".join(f["load.vector.widths"]))
        if loads:
            parts.append("loads: " + ", ".join(loads))
        return f"{self.kernel}: " + ", ".join(parts)


def _read_text(path: Path, cap: int) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(cap).decode("utf-8", errors="replace")
    except OSError:
        return None


def _metadata_facts(meta: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, name in (("n_regs", "regs"), ("n_spills", "spills"), ("shared", "shared_bytes"),
                      ("num_warps", "num_warps"), ("num_stages", "num_stages"), ("n_max_threads", "max_threads")):
        v = meta.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[name] = v
    tpw = meta.get("threads_per_warp") or meta.get("warp_size") or (meta.get("target") or {}).get("warp_size")
    if isinstance(tpw, int):
        out["threads_per_warp"] = tpw
    backend = (meta.get("target") or {}).get("backend")
    if backend in ("xpu", "intel"):
        flags = str(meta.get("build_flags") or "")
        m = _GRF.search(flags)
        out["grf_mode"] = m.group(1) if m else ("auto" if "auto-large-GRF" in flags else "default")
    return out


def read_kernel(folder: Path, recognizers: Iterable[Any]) -> KernelFacts | None:
    """The facts of one folder :func:`~xeforge.diagnosis.capture.dump_compiled` wrote; None when it holds none.

    ``recognizers`` are the knowledge base's entries that apply here (``spec`` with ``ir``, ``pattern``,
    ``fact``, ``capture``)."""
    raw = _read_text(folder / "meta.json", MAX_META_BYTES)
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(meta, dict):
        return None
    target = meta.get("target") if isinstance(meta.get("target"), dict) else {}
    kf = KernelFacts(str(meta.get("kernel") or meta.get("name") or folder.name)[:200],
                     str(target.get("backend")) if target.get("backend") else None,
                     str(target.get("arch")) if target.get("arch") is not None else None,
                     str(meta.get("triton")) if meta.get("triton") else None)
    kf.facts.update(_metadata_facts(meta))
    if isinstance(meta.get("capture_s"), (int, float)):
        kf.capture_s = float(meta["capture_s"])
    texts: dict[str, str | None] = {}
    for rec in recognizers:
        spec = rec.spec
        if spec.ir not in texts:
            texts[spec.ir] = _read_text(folder / f"{spec.ir}.txt", MAX_IR_BYTES)
        text = texts[spec.ir]
        if text is None:
            why = (meta.get("unavailable") or {}).get(spec.ir) or f"the compiler produced no {spec.ir}"
            kf.unknown.setdefault(spec.fact, f"{rec.id}: {why}")
            if spec.capture:
                kf.unknown.setdefault(spec.capture, f"{rec.id}: {why}")
            continue
        matches = list(re.finditer(spec.pattern, text))
        if not matches:
            continue
        kf.unknown.pop(spec.fact, None)  # another recognizer of the same fact read its IR
        kf.facts[spec.fact] = kf.facts.get(spec.fact, 0) + len(matches)
        if spec.capture:
            values = sorted({".".join(g for g in m.groups() if g) for m in matches} - {""})
            kf.facts[spec.capture] = sorted(set(kf.facts.get(spec.capture, [])) | set(values))
    return kf


def read_folder(folder: Path, recognizers: Iterable[Any]) -> list[KernelFacts]:
    """Every kernel the worker wrote under ``folder`` (one call's launches), in name order."""
    recs = list(recognizers)
    if not folder.is_dir():
        return []
    out = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir())[:MAX_KERNELS]:
        kf = read_kernel(sub, recs)
        if kf is not None:
            out.append(kf)
    return out


def read_cost(folder: Path, kernels: list[KernelFacts]) -> dict[str, Any] | None:
    """What the capture cost against the call that compiled the kernels (``call.json``, written by the worker):
    ``capture_s`` summed over the kernels, ``first_call_s`` (compiles and capture included) and the share."""
    raw = _read_text(folder / COST_FILE, 4096)
    try:
        first = float(json.loads(raw)["first_call_s"]) if raw else None
    except (ValueError, KeyError, TypeError):
        first = None
    spent = [k.capture_s for k in kernels if k.capture_s is not None]
    if not spent:
        return None
    capture = round(sum(spent), 4)
    return {"capture_s": capture, "first_call_s": first,
            "share": round(capture / first, 4) if first else None}
