"""Gate 2's integrity checks that the parent decides from data the worker returned (never from its say-so).

Owns: the canary padding placed around every input (its width and fill value, shared with the worker that
builds the padded buffers), and the checks made on the tensors a worker wrote: an input changed by the call, a
write outside an input's bounds (the padding no longer NaN / the sentinel), two runs on the same inputs with
different bits. The worker only returns the buffers; patching torch inside it changes none of these verdicts.
Also what a call did to the Model's weights (:func:`weight_changes`, run in the worker, which alone holds them:
a change of values is refused, a first call's move or cast of its parameters is not), and what it did against the
starting kernel's call (:func:`runtime_problems`, from the two calls' traces).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

CANARY = 64  # elements of NaN (or a sentinel) on each side of every input


def canary_value(torch: Any, dtype: Any) -> Any:
    """What the padding holds: NaN for floats, True for bools, a large sentinel for integers."""
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max if dtype != torch.int64 else 2**62


def same_bits(a: Any, b: Any) -> bool:
    """Bit-identical: same shape, dtype and bytes (NaN payloads included, -0.0 distinct from 0.0)."""
    import torch  # lazy: torch, in the worker and the verifier only

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return bool(torch.equal(a.contiguous().view(-1).view(ints), b.contiguous().view(-1).view(ints)))
    return bool(torch.equal(a, b))


def weight_changes(before: dict[str, Any], after: dict[str, Any], first_call: bool) -> tuple[list[str], dict[str, str]]:
    """(entries a call changed, entries it only converted), from the Model's ``state_dict()`` before and after it.

    A conversion keeps every value: the entry after the call is bit for bit the one before cast to its new dtype
    and device (``before.to(after.device, after.dtype)``), same shape, any layout. Published starting kernels do this
    once (``_move_params_once``: the weights put where the input is, in its dtype, on the first call), so on a slot's
    first call it is reported (name -> 'old dtype/device -> new'), not refused; on any later call, and for any
    other change (values, shape, an entry removed), the entry is changed. A cache kept in a weight changes values.
    """
    changed: list[str] = []
    converted: dict[str, str] = {}
    for name, old in before.items():
        new = after.get(name)
        if new is None:
            changed.append(name)
            continue
        if new.device == old.device and same_bits(new, old):
            continue
        if first_call and new.shape == old.shape and same_bits(new, old.to(new.device, new.dtype)):
            def where(t: Any) -> str:
                return str(t.dtype).removeprefix("torch.") + ("" if new.device == old.device else f" on {t.device}")

            converted[name] = f"{where(old)} -> {where(new)}"
            continue
        changed.append(name)
    return changed, converted


def input_problems(names: list[str], originals: list[Any], buffers: list[Any]) -> tuple[list[str], list[str]]:
    """(inputs changed by the call, inputs written outside their bounds), from each padded buffer after the call."""
    import torch  # lazy: torch, in the worker and the verifier only

    mutated, overwritten = [], []
    for name, orig, buf in zip(names, originals, buffers):
        n = orig.numel()
        if buf.dtype != orig.dtype or buf.dim() != 1 or buf.numel() != n + 2 * CANARY:
            overwritten.append(name)  # the worker returned something else than the buffer it was given
            continue
        if not same_bits(buf[CANARY:CANARY + n].view(orig.shape), orig.to(buf.device)):
            mutated.append(name)
        pads = torch.cat([buf[:CANARY], buf[CANARY + n:]])
        fill = canary_value(torch, buf.dtype)
        intact = bool(torch.isnan(pads).all()) if buf.dtype.is_floating_point else bool((pads == fill).all())
        if not intact:
            overwritten.append(name)
    return mutated, overwritten


def runtime_problems(cand: Any, start: Any) -> str | None:
    """What the candidate's call did that the starting kernel's did not, from the two calls' traces.

    Decided on what ran, not on how the source spells it (``getattr(torch, 'mat' + 'mul')`` is ``torch.matmul``
    here): no Triton kernel launched where the start launched one; torch compute beyond the start's, counted per
    op; an output whose last writer is a torch op (or nothing) where the start's was a kernel launch. Both traces
    are :class:`xeforge.analysis.trace.Trace` objects of one call each.
    """

    if cand.truncated:
        if start.truncated:
            return None  # both calls did more than a trace holds: nothing to compare event by event
        return (f"the call made more launches and torch ops than a trace holds ({len(cand.order)}), far more than the "
                "starting kernel's call")
    if start.launches and not (cand.launches or cand.tuning):  # an autotuner's timing runs are launches too
        return "no Triton kernel ran during the call (the starting kernel launches one): the output came from elsewhere"
    extra = Counter(o.op for o in cand.compute_ops()) - Counter(o.op for o in start.compute_ops())
    if extra:
        shown = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(extra.items()))
        return f"torch computed beyond the starting kernel at run time: {shown} (the work must stay in Triton kernels)"
    theirs, ours = last_writers(cand), last_writers(start)
    for i, (mine, ref) in enumerate(zip(theirs, ours)):
        if ref == "launch" and mine != "launch":
            return (f"output {i} was last written by {mine}, not by a Triton kernel launched during the call "
                    "(the starting kernel's is)")
    return None


def last_writers(trace: Any) -> list[str]:
    """Per returned tensor: 'launch' when a kernel launch was the last event to receive its storage, 'torch <op>'
    when a torch op computed or copied into it after that, 'nothing' when neither touched it during the call."""
    out = []
    for ret in trace.returns:
        writer = "nothing"
        if ret.kind == "tensor":
            for ev in trace.order:
                if hasattr(ev, "kernel"):
                    if any(a.storage == ret.storage for a in ev.args.values() if a.kind in ("tensor", "descriptor")):
                        writer = "launch"
                elif ev.kind not in ("allocation", "own-op") and any(o.storage == ret.storage for o in ev.outputs) and \
                        (ev.kind == "compute" or all(i.storage != ret.storage for i in ev.inputs)):
                    writer = f"torch {ev.op}"  # computed, or copied (a cast, .contiguous()): not a view of its input
        out.append(writer)
    return out


def dummy_launches(cand: Any, start: Any, cand_kernels: dict, start_kernels: dict) -> str | None:
    """Work accounting: a kernel of the start that the candidate launches on fewer programs, into a far smaller
    output (1/16 or less of the elements its launches store into at the start) *and* with a size argument shrunk as
    far (``M=1`` where the start passed 32), while the call's output stays as large — a launch made to be seen,
    with the work done elsewhere. (A fused row reduction stores per-tile partials, far fewer elements, but at the
    same sizes.) A kernel that loops over its work by program id (a persistent grid sized by the core count) is not
    judged; neither is one whose stored-into parameters cannot be read. ``cand`` / ``start`` are the two calls'
    traces, ``*_kernels`` each file's kernels as name -> (the parameters it stores into, whether it loops over
    program ids), read from the static model."""
    def out_elems(trace: Any) -> int:
        return max((_numel(r.shape) for r in trace.returns if r.kind == "tensor"), default=0)

    def work(trace: Any, name: str, params: set) -> tuple[int, int, list, dict]:
        programs, stored, grids, sizes = 0, 0, [], {}
        for la in trace.launches_of(name):
            if not isinstance(la.grid, tuple):
                return -1, -1, [], {}
            programs += _numel(la.grid)
            stored = max(stored, sum(_numel(a.shape) for p, a in la.args.items()
                                     if p in params and a.kind in ("tensor", "descriptor")))
            grids.append(la.grid)
            for p, a in la.args.items():  # the integer arguments that are no constexpr or stride: the sizes
                if a.kind == "scalar" and type(a.value) is int and p not in la.constexprs and "stride" not in p:
                    sizes[p] = max(sizes.get(p, 0), a.value)
        return programs, stored, grids, sizes

    if out_elems(cand) * 2 < out_elems(start):
        return None
    for name, (stores, loops) in cand_kernels.items():
        if name not in start_kernels or not cand.launches_of(name) or not start.launches_of(name) or loops:
            continue
        c_prog, c_stored, c_grids, c_sizes = work(cand, name, stores)
        s_prog, s_stored, s_grids, s_sizes = work(start, name, start_kernels[name][0])
        if min(c_prog, s_prog, c_stored) < 0 or s_stored <= 0:
            continue
        shrunk = sorted(p for p, v in s_sizes.items() if v >= 16 and 0 <= c_sizes.get(p, v) * 16 <= v)
        if c_prog < s_prog and c_stored * 16 <= s_stored and shrunk:
            told = ", ".join(f"{p}={c_sizes[p]} (start {s_sizes[p]})" for p in shrunk[:3])
            return (f"work accounting: {name} ran on grid {_grids(c_grids)} with {told}, storing into {c_stored} "
                    f"elements, where the starting kernel's launch ran on grid {_grids(s_grids)} over {s_stored}, "
                    f"while the output still holds {out_elems(cand)}: a dummy launch (the work was done elsewhere)")
    return None


def _numel(shape: Any) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _grids(grids: list) -> str:
    shown = ", ".join("x".join(str(g) for g in grid) for grid in grids[:3])
    return shown + (f" (+{len(grids) - 3} launches)" if len(grids) > 3 else "")
