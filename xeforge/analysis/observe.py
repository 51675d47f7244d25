"""The traces every detector and tactic reads: one per spec variant, of the source they are looking at.

Owns: asking a worker for the trace of a source at each variant of the problem (on the meta device: the real
host code, shapes, dtypes, constexprs and grids of the bench-sized variants without running a kernel or needing a
device; where host code reads tensor data, such as ``.item()``, which fails there, on the CPU with real values),
caching them per source (and handing each to :func:`xeforge.analysis.launches.remember`), and saying why a
variant could not be traced. Runs in the process-wide facts worker (:func:`facts_worker`):
the kernel file is user code, and never runs in this process.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from xeforge.analysis.launches import remember
from xeforge.analysis.trace import ITEMSIZE, Trace, TraceError
from xeforge.isolation import WorkerFailure, facts_worker
from xeforge.problem import plan_inputs


#: the most input bytes a trace on the CPU with real values may allocate (host code that reads data)
HOST_TRACE_BYTES = 4 << 30


@functools.lru_cache(maxsize=64)
def _trace(source: str, filename: str, init_args: tuple, dtype: str | None, plan: tuple, variant: str) -> Trace | str:
    """``plan`` is ((name, shape, dtype, low, high), ...): hashable, for the cache. On the meta device first; where
    the host code reads tensor data there (a MoE wrapper turning routing offsets into a block map), again on the
    CPU with real values, when the inputs fit :data:`HOST_TRACE_BYTES`."""
    wire_plan = [{"name": n, "shape": list(shape), "dtype": dt, "low": lo, "high": hi} for n, shape, dt, lo, hi in plan]
    args = dict(source=source, filename=filename, init_args=list(init_args), dtype=dtype, plan=wire_plan)
    try:
        reply = facts_worker().request("trace_meta", 120.0, **args)
        return Trace.from_json(variant, reply.get("trace"))
    except WorkerFailure as exc:
        meta = f"forward could not be traced on the meta device at {variant}: {exc.detail[:300]}"
    except TraceError as exc:
        return f"the trace of {variant} was malformed: {exc}"
    size = sum(math.prod(shape) * ITEMSIZE.get(dt, 1) for _, shape, dt, _, _ in plan)
    if size > HOST_TRACE_BYTES:
        return f"{meta}; its inputs ({size / 2**30:.1f} GiB) are too large to trace on the CPU with real values"
    try:
        reply = facts_worker().request("trace_host", 300.0, **args)
        return Trace.from_json(variant, reply.get("trace"))
    except WorkerFailure as exc:
        return f"{meta}; nor on the CPU with real values: {exc.detail[:300]}"
    except TraceError as exc:
        return f"the trace of {variant} was malformed: {exc}"


def trace_at(problem: Any, variant: Any, source: str | None = None) -> Trace | str:
    """The trace of ``source`` (default: the starting kernel) at one variant (a derived one too: ragged shapes,
    ``ci@bfloat16``), or why there is none."""
    source = problem.kernel_source if source is None else source
    try:
        init = tuple(tuple(a) if isinstance(a, list) else a for a in problem.init_args(variant))
        plan = tuple((tp.name, tuple(tp.shape), tp.dtype, tp.low, tp.high) for tp in plan_inputs(problem, variant))
    except Exception as exc:  # noqa: BLE001 — a spec the trace cannot follow is a reason, not a crash
        return f"the inputs of {variant.name} could not be planned ({exc})"
    got = _trace(source, problem.kernel_path.name, init, variant.dtype, plan, variant.name)
    if isinstance(got, Trace):
        remember(source, got)  # the launches' values and which kernels ran, for every reader of this source
    return got


def traces(problem: Any, source: str | None = None) -> dict[str, Trace | str]:
    """Variant name -> the trace of ``source`` (default: the starting kernel), or why there is none."""
    return {name: trace_at(problem, variant, source) for name, variant in problem.spec.variants.items()}
