"""Alignment by shape: the integer arguments of a launch that are multiples of 16 at some timed shapes and not others.

Owns: :func:`alignment_by_shape` and :func:`describe`. Triton specializes a compiled kernel on each integer
argument being a multiple of 16 (``tt.divisibility = 16``). At a shape where a row stride or an extent is not (a
hidden size of 3000, a vocabulary of 32003, a token count of 17), the kernel is compiled without that hint: the
compiler can no longer prove that rows start 16-byte aligned, so pointer loads and stores along them fall from
128-bit vectors to narrower ones (tensor descriptors, whose strides are checked when they are made, do not need the
hint). That is why one shape can lose while the others do not; this module names the shape, the kernel, the
argument, its value and its role, read from the traces of the timed shapes (meta device: launches recorded, nothing
compiled or run). What the compiler then made of it (no ``ld.global.v4``) is the compiler facts' to say, on a GPU.
"""

from __future__ import annotations

from typing import Any

from xeforge.analysis.trace import ITEMSIZE, Trace

DIVISIBILITY = 16  # Triton's integer specialization: multiples of 16 (and the value 1)
LINE = 128  # bytes in an L2 cache line of the NVIDIA GPUs measured (no Intel GPU was at hand to measure)


def _ints(trace: Trace) -> dict[tuple[str, str], int]:
    """(kernel, argument) -> its integer value at the first launch of that kernel (constexprs left out)."""
    out: dict[tuple[str, str], int] = {}
    for la in trace.launches:
        for name, arg in la.args.items():
            v = arg.value
            if arg.kind == "scalar" and isinstance(v, int) and not isinstance(v, bool) and name not in la.constexprs:
                out.setdefault((la.kernel, name), v)
    return out


def _itemsizes(trace: Trace) -> dict[tuple[str, str], int]:
    """(kernel, tensor argument) -> its element size in bytes, at the first launch of that kernel."""
    out: dict[tuple[str, str], int] = {}
    for la in trace.launches:
        for name, arg in la.args.items():
            if arg.kind in ("tensor", "descriptor") and arg.dtype in ITEMSIZE:
                out.setdefault((la.kernel, name), ITEMSIZE[arg.dtype])
    return out


def alignment_by_shape(traces: dict[str, Trace | str], shapes: list[str],
                       roles: dict[tuple[str, str], str] | None = None) -> list[dict[str, Any]]:
    """One finding per (shape, kernel, argument) whose value is not a multiple of 16 at ``shape`` while it is at
    another of ``shapes`` (an argument that is never one, a head count of 12, is how the kernel always runs and is
    left out). ``roles``: (kernel, argument) -> what the argument is ("row stride of a", "extent"), where known; a
    stride of a tensor the trace saw also gets ``pitch_bytes``, the bytes between its rows there."""
    values = {s: _ints(t) for s in shapes if isinstance((t := traces.get(s)), Trace)}
    sizes = {s: _itemsizes(t) for s in shapes if isinstance((t := traces.get(s)), Trace)}
    out = []
    for shape, got in values.items():
        for key, v in sorted(got.items()):
            if v % DIVISIBILITY == 0 or v == 1:
                continue
            aligned = {s: o[key] for s, o in values.items() if key in o and o[key] % DIVISIBILITY == 0}
            if not aligned:
                continue
            kernel, arg = key
            role = (roles or {}).get(key, "")
            found = {"shape": shape, "kernel": kernel, "arg": arg, "value": v, "role": role, "aligned_at": aligned}
            size = sizes[shape].get((kernel, role[len(STRIDE_ROLE):])) if role.startswith(STRIDE_ROLE) else None
            if size:
                found["pitch_bytes"] = v * size
                found["itemsize"] = size
            out.append(found)
    return out


STRIDE_ROLE = "a stride of "  # the roles a caller gives (``role`` of a finding) start so ...
BOUND_ROLE = "a bound of its masks"  # ... or are this
SCALAR_ROLE = "an offset of scalar loads and stores only"  # ... or this: one element an access, nothing to vectorize
LOOP_ROLE = "a loop's trip count only"  # ... or this: no address is made from it
_CONSEQUENCE = {
    "stride": "the rows it strides cannot be proven to start 16-byte aligned: pointer loads and stores along them "
              "use narrower vectors (tensor descriptors, whose strides are checked when they are made, do not "
              "need the hint)",
    "bound": "its masks cannot be proven constant over groups of 16 elements: where it bounds a contiguous "
             "dimension, masked loads and stores along it are split into narrower ones",
    "scalar": "but nothing is lost: a scalar load or store moves one element whatever its alignment",
    "loop": "but nothing is lost: no address or mask is made from it",
    "": "the compiler's alignment and mask proofs that used it do not hold there",
}


def describe(finding: dict[str, Any]) -> str:
    """The line a user reads for one finding."""
    at = ", ".join(f"{v} at {s}" for s, v in sorted(finding["aligned_at"].items()))
    role = finding.get("role") or ""
    kind = "stride" if role.startswith(STRIDE_ROLE) else "bound" if role == BOUND_ROLE else \
        "scalar" if role == SCALAR_ROLE else "loop" if role == LOOP_ROLE else ""
    pitch = finding.get("pitch_bytes")
    line = (f"; its rows are {pitch} bytes apart, not a multiple of {LINE} (a cache line), so the rows of a tile "
            "start part-way into a line, through tensor descriptors too: in H100 probes (2026-12-07) gemm_square's "
            "port ran 0.158 ms at 3000 x 4096 x 3000 with B's rows 6000 bytes apart and 0.144 ms with them 6144 "
            "apart, gemm_tall_k's 0.234 ms at 1000 x 65536 x 1000 with B's rows 2000 bytes apart and 0.199 ms with "
            "them 2048 apart (cuBLAS: 0.187 ms as given). No rewrite of the kernel recovered it (256 x 128 tiles, "
            "pointer loads, a padded copy per call: each slower); where the model allows it, keep this tensor in a "
            f"buffer whose rows are padded to a multiple of {LINE // finding.get('itemsize', 1)} elements and pass a "
            "view of it") if pitch and pitch % LINE else ""
    return (f"{finding['shape']}: {finding['kernel']}'s {finding['arg']}{f' ({role})' if role else ''} = "
            f"{finding['value']} is not a multiple of {DIVISIBILITY} ({at}): Triton compiles this shape without the "
            f"divisibility hint{',' if kind in ('scalar', 'loop') else ', so'} {_CONSEQUENCE[kind]}{line}")
