"""The precision-contract rewrites around ``tl.dot`` and fp64, inside ``@triton.jit`` functions.

Owns:

- :func:`drop_dot_upcasts` — ``a = tl.load(...).to(tl.float32)`` feeding ``tl.dot`` loses the cast when the
  loaded tensor is fp16/bf16 in some variant of the spec (and both operands of the dot share a dtype in
  every variant). A 16-bit x 16-bit product is exact in fp32 and ``tl.dot`` still returns fp32, so the
  result is as precise as the up-cast (TF32 rounds 16-bit inputs to themselves) under every contract,
  ``strict`` included; the dot runs on the matrix units at 16-bit rate instead of TF32 or FMA.
- :func:`dot_accumulate_in_place` — ``acc += tl.dot(a, b)`` with an fp32 ``acc`` becomes
  ``acc = tl.dot(a, b, acc)`` (the backend accumulates inside the MMA/DPAS instruction).
- :func:`fp32_accumulator` — a dot accumulating in fp16/bf16 (16-bit ``acc``, ``out_dtype=tl.float16``)
  accumulates in fp32; the store still casts to the output's dtype. A precision increase, always allowed.
- :func:`fp64_to_fp32` — ``tl.float64`` arithmetic in kernels (and fp64 intermediates allocated in forward)
  becomes fp32 when no variant has fp64 inputs: fp64 is beyond every precision contract the spec can state
  for lower-precision inputs (``strict`` keeps the *input's* precision).

Which element type a kernel pointer has in a variant is read from that variant's trace only
(:func:`param_readings`, :mod:`xeforge.analysis.observe`), wherever the kernel is launched from; where the trace
failed or has no launch of the kernel the dtype is not known, the rewrite that needs it does not apply, and its
reason names the variant and the trace's reason. Which dtype a forward input has comes from the spec
(:func:`xeforge.problem.plan_inputs`). Nothing here reads dtypes from the static model of forward.

None of them lowers precision below the inputs': lowering an fp32 GEMM to tf32/bf16 is never proposed here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, NamedTuple

import libcst as cst

from xeforge.analysis.observe import traces
from xeforge.analysis.trace import Trace
from xeforge.problem import plan_inputs
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.context import Ctx
from xeforge.rewrite.cst_tools import Edits, apply_edits, arg, call_name, code, dotted, is_tl, set_call_kwargs, walk

SIXTEEN = {"float16", "bfloat16"}
TL_DTYPES = {"tl.float16": "float16", "tl.bfloat16": "bfloat16", "tl.float32": "float32", "tl.float64": "float64",
             "triton.language.float16": "float16", "triton.language.bfloat16": "bfloat16",
             "triton.language.float32": "float32", "triton.language.float64": "float64"}


def _variants(c: Ctx) -> dict[str, Any]:
    return dict(c.problem.spec.variants)


#: how much of a trace's failure a reason quotes
REASON_CHARS = 200


class Reading(NamedTuple):
    """The element dtype of one pointer parameter in one variant, or None and why it is not known."""

    dtype: str | None
    why: str = ""


def variant_traces(c: Ctx) -> dict[str, Trace | str]:
    try:
        return traces(c.problem, c.source)
    except Exception as exc:  # noqa: BLE001 — a problem the trace cannot describe is a reason, not a crash
        why = f"forward could not be traced ({type(exc).__name__}: {exc})"
        return {v: why for v in _variants(c)}


def _cap(text: str) -> str:
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 3] + "..."


def param_readings(c: Ctx, kernel: str, param: str) -> dict[str, Reading]:
    """Variant name -> the element dtype of pointer ``param`` of ``kernel`` there, or why it is not known.

    Read from the trace of the source at each variant only: what the kernel was really given, wherever it is
    launched from (forward, a wrapper, a method, an autograd Function). A variant whose trace failed, or whose
    trace has no launch of ``kernel`` (a ``@triton.jit`` helper, a kernel forward does not reach), or whose
    launches pass ``param`` no tensor or tensors of different dtypes, has no dtype: the reason says which. A variant
    whose call does not launch ``kernel`` while another one does (a torch fallback off the GPU or below a size, an
    early return of the wrapper) is left out: the kernel does not run there, so what it is given there is moot, and
    the code path that skips it is kept as it is.
    """
    traced = variant_traces(c)
    out: dict[str, Reading] = {}
    unlaunched: dict[str, Reading] = {}
    for vname in _variants(c):
        t = traced.get(vname, f"{vname} was not traced")
        if not isinstance(t, Trace):
            out[vname] = Reading(None, _cap(t))
            continue
        if not t.launches_of(kernel):
            unlaunched[vname] = Reading(None, f"{vname}'s trace has no launch of {kernel}")
            continue
        ds = t.arg_dtypes(kernel, param)
        if len(ds) == 1 and None not in ds:
            out[vname] = Reading(ds.pop())
        elif None in ds:
            out[vname] = Reading(None, f"{param} is not a tensor at a launch of {kernel} in {vname}'s trace")
        else:
            out[vname] = Reading(None, f"{param} is {'/'.join(sorted(ds))} at different launches of {kernel} in "
                                       f"{vname}'s trace")
    return out if out else unlaunched


def param_dtypes(c: Ctx, kernel: str, param: str) -> dict[str, str | None]:
    """The element dtype of pointer ``param`` of ``kernel`` in each variant, from the traces (None where unknown:
    :func:`param_readings` says why)."""
    return {v: r.dtype for v, r in param_readings(c, kernel, param).items()}


def unknown_dtypes(readings: dict[str, dict[str, Reading]]) -> str:
    """Why some dtypes are not known: ``readings`` is param -> :func:`param_readings`; "" when every one is known.

    Variants with the same reason (but for their own name) are named together, the reason quoted once:
    ``bench-gpu (and bench-gpu-1): forward could not be traced on the meta device at bench-gpu: ...``.
    """
    per_variant: dict[str, list[str]] = {}
    for rs in readings.values():
        for v, r in rs.items():
            if r.dtype is None and r.why not in per_variant.setdefault(v, []):
                per_variant[v].append(r.why)
    groups: dict[str, list[str]] = {}  # the reason with the variant's name taken out -> its variants
    for v, whys in per_variant.items():
        if whys:
            groups.setdefault("; ".join(whys).replace(v, "\0"), []).append(v)
    parts = []
    for first, *others in groups.values():
        also = f" (and {', '.join(others)})" if others else ""
        parts.append(f"{first}{also}: {'; '.join(per_variant[first])}")
    return "; in ".join(parts)


def _jit_functions(c: Ctx) -> list[cst.FunctionDef]:
    return [f for name in c.model.functions if (f := c.parsed.function(name)) is not None]


def _assignments(fn: cst.FunctionDef, name: str) -> list[tuple[cst.CSTNode, cst.BaseExpression | None]]:
    """Every assignment to ``name`` in ``fn``: (statement node, value) — value None for augmented ones."""
    out = []
    for node in walk(fn.body):
        if isinstance(node, cst.Assign):
            for t in node.targets:
                if isinstance(t.target, cst.Name) and t.target.value == name:
                    out.append((node, node.value))
        elif isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name) and node.target.value == name:
            out.append((node, None))
        elif isinstance(node, cst.For) and isinstance(node.target, cst.Name) and node.target.value == name:
            out.append((node, None))
    return out


def _name_loads(fn: cst.FunctionDef, name: str) -> list[cst.Name]:
    """Names ``name`` read in ``fn`` (assignment targets, attributes and keywords excluded)."""
    found: list[cst.Name] = []

    class V(cst.CSTVisitor):
        def visit_Attribute(self, n: cst.Attribute) -> bool:
            n.value.visit(self)
            return False

        def visit_Arg(self, n: cst.Arg) -> bool:
            n.value.visit(self)
            return False

        def visit_AssignTarget(self, n: cst.AssignTarget) -> bool:
            return False

        def visit_Param(self, n: cst.Param) -> bool:
            return False

        def visit_Name(self, n: cst.Name) -> None:
            if n.value == name:
                found.append(n)

    fn.body.visit(V())
    return found


def pointer_param(fn: cst.FunctionDef, ptr: cst.BaseExpression, params: set[str], depth: int = 0) -> str | None:
    """The pointer parameter a load address is based on (``a_ptr`` for ``a_ptr + offs`` or ``a_ptrs``)."""
    if depth > 6:
        return None
    node = ptr
    while isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract)):
        left = pointer_param(fn, node.left, params, depth + 1)
        if left is not None:
            return left
        node = node.right
    if isinstance(node, cst.Name):
        if node.value in params:
            return node.value
        bases = set()
        for _, value in _assignments(fn, node.value):
            if value is None:
                continue
            if isinstance(value, cst.Call) and is_tl(call_name(value), "make_block_ptr", "advance"):
                inner = arg(value, 0, "base")
                b = pointer_param(fn, inner, params, depth + 1) if inner is not None else None
            else:
                b = pointer_param(fn, value, params, depth + 1)
            bases.add(b)
        bases.discard(node.value)
        return bases.pop() if len(bases) == 1 and None not in bases else None
    return None


def f32_cast_operand(node: cst.CSTNode) -> cst.BaseExpression | None:
    """The operand of ``X.to(tl.float32)`` (None for anything else)."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "to" \
            and node.args and TL_DTYPES.get(dotted(node.args[0].value) or "") == "float32" \
            and all(a.keyword is None or a.keyword.value == "dtype" for a in node.args[:1]) and len(node.args) == 1:
        return node.func.value
    return None


@dataclass
class Upcast:
    """One removable ``.to(tl.float32)`` on a tl.dot operand."""

    fn: str
    line: int
    cast: cst.Call  # the .to(...) call node to unwrap
    param: str  # the pointer parameter loaded
    operand: str  # the operand's variable (or expression) name
    assigned: bool = False  # the cast is in the variable's assignment (so the variable changes type)


def _operand_upcasts(c: Ctx, fn: cst.FunctionDef, operand: cst.BaseExpression, params: set[str]) -> list[Upcast] | str:
    """The casts to drop for one dot operand, or why there are none."""
    name = fn.name.value
    # tl.load(...).to(tl.float32) inline, or v.to(tl.float32) with v a plain load
    inner = f32_cast_operand(operand)
    if inner is not None:
        if isinstance(inner, cst.Call) and is_tl(call_name(inner), "load"):
            p = pointer_param(fn, arg(inner, 0, "pointer"), params)
            return [Upcast(name, c.parsed.line(operand), operand, p, "tl.load(...)")] if p else \
                f"the address of {code(inner)[:40]}... is not based on a pointer parameter"
        if isinstance(inner, cst.Name):
            assigns = _assignments(fn, inner.value)
            if assigns and all(v is not None and isinstance(v, cst.Call) and is_tl(call_name(v), "load")
                               for _, v in assigns):
                ps = {pointer_param(fn, arg(v, 0, "pointer"), params) for _, v in assigns}
                if len(ps) == 1 and None not in ps:
                    return [Upcast(name, c.parsed.line(operand), operand, ps.pop(), inner.value)]
        return f"{code(operand)} is not a cast of a loaded tile"
    if isinstance(operand, cst.Name):
        assigns = _assignments(fn, operand.value)
        if not assigns:
            return f"{operand.value} is not assigned in {name}"
        found = []
        if all(v is not None and isinstance(v, cst.Call) and is_tl(call_name(v), "load") for _, v in assigns):
            return f"{operand.value} is loaded without an fp32 up-cast already"
        for node, value in assigns:
            inner = f32_cast_operand(value) if value is not None else None
            if inner is None or not (isinstance(inner, cst.Call) and is_tl(call_name(inner), "load")):
                return f"{operand.value} is not a tl.load(...).to(tl.float32)"
            p = pointer_param(fn, arg(inner, 0, "pointer"), params)
            if p is None:
                return f"the address {operand.value} is loaded from is not based on a pointer parameter"
            found.append(Upcast(name, c.parsed.line(value), value, p, operand.value, assigned=True))
        return found
    return f"{code(operand)[:40]} is not a loaded tile"


def find_dot_upcasts(c: Ctx) -> tuple[list[tuple[cst.Call, list[Upcast]]], list[str]]:
    """Per tl.dot: the operand casts to drop (both operands' when both are cast). Plus reasons for the rest."""
    out, why = [], []
    for fn in _jit_functions(c):
        params = {p.name.value for p in fn.params.params}
        for node in walk(fn.body):
            if not (isinstance(node, cst.Call) and is_tl(call_name(node), "dot")):
                continue
            a, b = arg(node, 0, "input"), arg(node, 1, "other")
            ups: list[Upcast] = []
            reasons = []
            for op in (a, b):
                r = _operand_upcasts(c, fn, op, params) if op is not None else "missing operand"
                if isinstance(r, str):
                    reasons.append(r)
                else:
                    ups.extend(r)
            if reasons:
                why.append(f"{fn.name.value} line {c.parsed.line(node)}: " + "; ".join(reasons))
                continue
            out.append((node, ups))
    return out, why


def drop_dot_upcasts(source: str, problem: Any) -> tuple[str, str]:
    c = Ctx(source, problem)
    dots, why = find_dot_upcasts(c)
    drop: list[Upcast] = []
    for dot, ups in dots:
        fn = ups[0].fn
        od = arg(dot, -1, "out_dtype")
        if od is not None and TL_DTYPES.get(dotted(od) or "") != "float32":
            why.append(f"{fn} line {c.parsed.line(dot)}: the dot has out_dtype={code(od)}")
            continue
        # operand names used anywhere but as dot operands would change type: leave those alone
        readings = {u.param: param_readings(c, fn, u.param) for u in ups}
        per_variant = {v: {readings[u.param][v].dtype for u in ups} for v in _variants(c)
                       if all(v in readings[u.param] for u in ups)}
        unknown = unknown_dtypes(readings)
        if unknown:
            why.append(f"{fn} line {c.parsed.line(dot)}: the element type of "
                       f"{', '.join(sorted({u.param for u in ups}))} is not known in {unknown}")
            continue
        mixed = [v for v, ds in per_variant.items() if len(ds) != 1]
        if mixed:
            why.append(f"{fn} line {c.parsed.line(dot)}: the operands differ in dtype in {', '.join(mixed)}")
            continue
        if not any(ds & SIXTEEN for ds in per_variant.values()):
            why.append(f"{fn} line {c.parsed.line(dot)}: the operands are "
                       f"{'/'.join(sorted(set().union(*per_variant.values())))} in every variant; dropping the "
                       "cast would change nothing")
            continue
        fnode = c.parsed.function(fn)
        bad = []
        for u in ups:
            if u.assigned:
                uses = _name_loads(fnode, u.operand)
                dot_args = {id(a.value) for n in walk(fnode.body) if isinstance(n, cst.Call)
                            and is_tl(call_name(n), "dot") for a in n.args[:2]}
                if any(id(n) not in dot_args for n in uses):
                    bad.append(u.operand)
        if bad:
            why.append(f"{fn} line {c.parsed.line(dot)}: {', '.join(bad)} is also used outside tl.dot")
            continue
        drop.extend(ups)
    if not drop:
        raise NotApplicable("; ".join(dict.fromkeys(why)) or "no tl.dot operand is cast to fp32")
    ids = {id(u.cast) for u in drop}

    class T(cst.CSTTransformer):
        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
            if id(original) in ids:
                return updated.func.value
            return updated

    new = c.parsed.module.visit(T()).code
    ops = ", ".join(dict.fromkeys(u.operand for u in drop))
    sixteen = sorted({d for u in drop for d in param_dtypes(c, u.fn, u.param).values() if d in SIXTEEN})
    return new, (f"tl.dot takes the loaded {'/'.join(sixteen)} tiles directly ({ops} no longer cast to fp32): "
                 "matrix units at 16-bit rate, fp32 accumulation unchanged")


# ------------------------------------------------------------------------------------------------ acc forms
def _acc_dtype(c: Ctx, fn: cst.FunctionDef, acc: str) -> tuple[str | None, cst.Call | None, str]:
    """(dtype, the tl.zeros call, why the dtype is not known) of accumulator ``acc`` when it is initialised once
    with tl.zeros/full; a ``ptr.dtype.element_ty`` accumulator has the traced dtype of ``ptr``."""
    inits = [(n, v) for n, v in _assignments(fn, acc) if v is not None and isinstance(v, cst.Call)
             and is_tl(call_name(v), "zeros", "full")]
    if len(inits) != 1:
        return None, None, ""
    call = inits[0][1]
    dt = arg(call, 1 if is_tl(call_name(call), "zeros") else 2, "dtype")
    if dt is None:
        return None, call, ""
    name = dotted(dt) or ""
    if name in TL_DTYPES:
        return TL_DTYPES[name], call, ""
    if name.endswith(".dtype.element_ty"):
        ptr = name[: -len(".dtype.element_ty")]
        readings = param_readings(c, fn.name.value, ptr)
        unknown = unknown_dtypes({ptr: readings})
        if unknown:
            return None, call, f"the element type of {ptr} is not known in {unknown}"
        ds = {r.dtype for r in readings.values()}
        return ("16bit" if ds & SIXTEEN else ds.pop() if len(ds) == 1 else None), call, ""
    return None, call, ""


def dot_accumulate_in_place(source: str, problem: Any) -> tuple[str, str]:
    c = Ctx(source, problem)
    targets: set[int] = set()
    why = []
    for fn in _jit_functions(c):
        for stmt in walk(fn.body):
            if not (isinstance(stmt, cst.AugAssign) and isinstance(stmt.operator, cst.AddAssign)
                    and isinstance(stmt.target, cst.Name) and isinstance(stmt.value, cst.Call)
                    and is_tl(call_name(stmt.value), "dot")):
                continue
            dot = stmt.value
            if len([a for a in dot.args if a.keyword is None]) != 2 or any(
                    a.keyword is not None and a.keyword.value in ("acc", "out_dtype") for a in dot.args):
                why.append(f"{fn.name.value} line {c.parsed.line(stmt)}: the dot already passes acc/out_dtype")
                continue
            dt, _, unknown = _acc_dtype(c, fn, stmt.target.value)
            if dt != "float32":
                why.append(f"{fn.name.value} line {c.parsed.line(stmt)}: {stmt.target.value} is not an fp32 "
                           "accumulator (tl.zeros(..., dtype=tl.float32))" + (f": {unknown}" if unknown else ""))
                continue
            targets.add(id(stmt))
    if not targets:
        raise NotApplicable("; ".join(why) or "no `acc += tl.dot(a, b)` to rewrite")

    class T(cst.CSTTransformer):
        def leave_AugAssign(self, original: cst.AugAssign, updated: cst.AugAssign) -> cst.BaseSmallStatement:
            if id(original) not in targets:
                return updated
            dot = updated.value
            args = list(dot.args)
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            args.append(cst.Arg(value=cst.Name(updated.target.value)))
            return cst.Assign(targets=[cst.AssignTarget(target=updated.target)], value=dot.with_changes(args=args))

    new = c.parsed.module.visit(T()).code
    return new, f"{len(targets)} `acc += tl.dot(a, b)` -> `acc = tl.dot(a, b, acc)` (fp32 accumulator passed in)"


def fp32_accumulator(source: str, problem: Any) -> tuple[str, str]:
    c = Ctx(source, problem)
    zero_calls: dict[int, cst.Call] = {}
    out_dtypes: set[int] = set()
    why = []
    for fn in _jit_functions(c):
        for node in walk(fn.body):
            if not (isinstance(node, cst.Call) and is_tl(call_name(node), "dot")):
                continue
            od = arg(node, -1, "out_dtype")
            if od is not None and TL_DTYPES.get(dotted(od) or "") in SIXTEEN:
                out_dtypes.add(id(node))
        for stmt in walk(fn.body):
            acc = None
            if isinstance(stmt, cst.AugAssign) and isinstance(stmt.target, cst.Name) \
                    and isinstance(stmt.value, cst.Call) and is_tl(call_name(stmt.value), "dot"):
                acc = stmt.target.value
            elif isinstance(stmt, cst.Assign) and isinstance(stmt.value, cst.Call) and is_tl(call_name(stmt.value), "dot"):
                a = arg(stmt.value, 2, "acc")
                acc = a.value if isinstance(a, cst.Name) else None
            if acc is None:
                continue
            dt, call, unknown = _acc_dtype(c, fn, acc)
            if dt in SIXTEEN or dt == "16bit":
                zero_calls[id(call)] = call
            elif dt is None:
                why.append(f"{fn.name.value}: the dtype of accumulator {acc} is not known"
                           + (f": {unknown}" if unknown else ""))
    if not zero_calls and not out_dtypes:
        raise NotApplicable("; ".join(dict.fromkeys(why)) or "every tl.dot already accumulates in fp32")

    class T(cst.CSTTransformer):
        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
            if id(original) in zero_calls:
                args = []
                pos = 0
                dt_pos = 1 if is_tl(call_name(original), "zeros") else 2
                for a in updated.args:
                    if (a.keyword is not None and a.keyword.value == "dtype") or (a.keyword is None and pos == dt_pos):
                        a = a.with_changes(value=cst.parse_expression("tl.float32"))
                    if a.keyword is None:
                        pos += 1
                    args.append(a)
                return updated.with_changes(args=args)
            if id(original) in out_dtypes:
                args = [a for a in updated.args if not (a.keyword is not None and a.keyword.value == "out_dtype")]
                if args:
                    args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                return updated.with_changes(args=args)
            return updated

    new = c.parsed.module.visit(T()).code
    parts = []
    if zero_calls:
        parts.append(f"{len(zero_calls)} 16-bit dot accumulator(s) now fp32")
    if out_dtypes:
        parts.append(f"{len(out_dtypes)} tl.dot out_dtype=16-bit dropped (fp32 result)")
    return new, "; ".join(parts) + "; the store still casts to the output dtype"


# ------------------------------------------------------------------------------------------------ fp64
def fp64_to_fp32(source: str, problem: Any) -> tuple[str, str]:
    c = Ctx(source, problem)
    fp64_variants, unplanned = [], []
    for vname, var in _variants(c).items():
        try:  # the dtypes the verifier generates the inputs in (the variant's dtype for floating ones)
            dts = {tp.dtype for tp in plan_inputs(c.problem, var)}
        except Exception as exc:  # noqa: BLE001 — a spec that cannot be planned keeps fp64: its inputs are not known
            unplanned.append(f"{vname} ({_cap(str(exc))})")
            continue
        if var.dtype == "float64" or "float64" in dts:
            fp64_variants.append(vname)
    uses = []
    for fn in _jit_functions(c):
        for node in walk(fn.body):
            if isinstance(node, cst.Attribute) and TL_DTYPES.get(dotted(node) or "") == "float64":
                uses.append(node)
    fwd_allocs = []
    returned = {n.id for s in c.fwd if isinstance(s, ast.Return) and s.value is not None
                for n in [s.value] if isinstance(n, ast.Name)}
    for s in c.fwd:
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) \
                and s.targets[0].id not in returned and isinstance(s.value, ast.Call):
            for k in s.value.keywords:
                if k.arg == "dtype" and ast.unparse(k.value) in ("torch.float64", "torch.double"):
                    fwd_allocs.append(s.lineno)
    if not uses and not fwd_allocs:
        raise NotApplicable("no fp64 (tl.float64 or float64 intermediates) in the kernel")
    if fp64_variants:
        raise NotApplicable(f"the spec has fp64 inputs in {', '.join(fp64_variants)}: the precision contract keeps fp64")
    if unplanned:
        raise NotApplicable(f"the inputs of {', '.join(unplanned)} could not be planned: fp64 is kept")
    ids = {id(n) for n in uses}

    class T(cst.CSTTransformer):
        def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
            if id(original) in ids:
                return updated.with_changes(attr=cst.Name("float32"))
            return updated

    new = c.parsed.module.visit(T()).code
    if fwd_allocs:
        edits = Edits(plain_calls={ln: (lambda call: set_call_kwargs(call, {"dtype": "torch.float32"}))
                                   for ln in fwd_allocs})
        new = apply_edits(new, edits)
    where = []
    if uses:
        where.append(f"{len(uses)} tl.float64 in kernels")
    if fwd_allocs:
        where.append(f"{len(fwd_allocs)} fp64 intermediate buffer(s) in forward")
    return new, f"fp64 arithmetic replaced by fp32 ({', '.join(where)}); no input is fp64 in any variant"
