"""The compiled kernels of a call, written to files for the parent to read (runs in the worker).

Owns: :func:`dump_compiled` — one folder per compiled kernel under the slot's folder, with ``meta.json`` (the
compiled metadata Triton keeps: warps, stages, shared memory, target, build flags; the driver's registers,
spills and thread limit) and one ``<ir>.txt`` per text IR in ``kernel.asm`` (TTIR, TTGIR, LLIR, PTX; SASS through
Triton's own disassembler where it works), each cut at a size cap. Binaries (cubin, SPIR-V, zebin) are not
copied; their size is recorded. The interpreter compiles nothing, so nothing is written there.
:func:`write_call_cost` records how long the whole first call took (compiles and capture included), so the
capture's cost can be read against it.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

#: metadata fields kept (the rest of Triton's metadata is launch plumbing)
META_FIELDS = ("name", "num_warps", "num_stages", "num_ctas", "shared", "threads_per_warp", "warp_size",
               "build_flags", "maxnreg", "tmem_size", "global_scratch_size", "enable_fp_fusion", "hash")
#: the driver's figures, set on the kernel object when it is loaded
HANDLE_FIELDS = ("n_regs", "n_spills", "n_max_threads")
IR_CAP_BYTES = 4 << 20
#: beside the kernels' folders: the wall time of the call that wrote them (read by the parent as data)
COST_FILE = "call.json"
#: binaries: their size is recorded, never their bytes
BINARY_KEYS = ("cubin", "spv", "zebin", "hsaco")


def _scalar(v: Any) -> Any:
    return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)


def metadata_of(kernel: Any) -> dict[str, Any]:
    meta = getattr(kernel, "metadata", None)
    raw = meta._asdict() if hasattr(meta, "_asdict") else dict(getattr(meta, "__dict__", {}) or {})
    out = {k: _scalar(raw[k]) for k in META_FIELDS if k in raw}
    target = raw.get("target")
    if target is not None:
        out["target"] = {"backend": _scalar(getattr(target, "backend", None)),
                         "arch": _scalar(getattr(target, "arch", None)),
                         "warp_size": _scalar(getattr(target, "warp_size", None))}
    for k in HANDLE_FIELDS:
        v = getattr(kernel, k, None)
        if isinstance(v, (int, float)):
            out[k] = v
    return out


def dump_compiled(name: str, kernel: Any, folder: Path, triton_version: str, cap: int = IR_CAP_BYTES,
                  irs: list[str] | None = None) -> Path | None:
    """Write ``kernel`` (a Triton ``CompiledKernel``) under ``folder``; the folder written, or None when
    ``kernel`` is not a compiled kernel (the interpreter's launches return none). ``irs``: only these text IRs
    (those the knowledge base's recognizers read; the disassembly of SASS alone took most of a second per kernel
    on the H200); None: every one, SASS included."""
    asm = getattr(kernel, "asm", None)
    if asm is None or getattr(kernel, "metadata", None) is None:
        return None
    t0 = time.perf_counter()
    meta = metadata_of(kernel)
    meta["kernel"] = name
    meta["triton"] = triton_version
    digest = str(meta.get("hash") or "")[:12] or f"{id(kernel):x}"
    out = folder / f"{re.sub(r'[^A-Za-z0-9_]', '_', name)[:64]}-{digest}"
    out.mkdir(parents=True, exist_ok=True)
    wanted = irs
    irs, binaries, cut = [], {}, []
    keys = list(asm.keys())
    if "cubin" in keys and "sass" not in keys:
        keys.append("sass")  # Triton disassembles the cubin on request (cuobjdump); absent tools are recorded
    if wanted is not None:
        skipped = [k for k in keys if k not in wanted and k not in BINARY_KEYS]
        keys = [k for k in keys if k in wanted or k in BINARY_KEYS]
        if skipped:
            meta["not_written"] = skipped  # no recognizer reads them; XEFORGE_KEEP_COMPILED=1 writes them all
    for key in keys:
        try:
            value = asm[key]
        except Exception as exc:  # noqa: BLE001 — a disassembler that is not there is a fact, not a failure
            meta.setdefault("unavailable", {})[key] = f"{type(exc).__name__}: {str(exc)[:200]}"
            continue
        if isinstance(value, bytes):
            binaries[key] = len(value)
            continue
        text = str(value)
        if len(text) > cap:
            text, cut = text[:cap], [*cut, key]
        (out / f"{key}.txt").write_text(text)
        irs.append(key)
    meta.update({"irs": irs, "binaries": binaries, "cut": cut, "capture_s": round(time.perf_counter() - t0, 4)})
    (out / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    return out


def write_call_cost(folder: Path, first_call_s: float) -> None:
    """:data:`COST_FILE` beside the kernels' folders: the wall time of the call that compiled and captured them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / COST_FILE).write_text(json.dumps({"first_call_s": round(first_call_s, 4)}))

