"""The dtype stage's narrowing of fp32 intermediates that pass from one Triton kernel to another.

Owns :func:`narrow_intermediates`: a tensor ``forward`` (or a wrapper it calls) allocates in fp32, that one Triton
kernel stores and other Triton kernels only load, is allocated in the dtype of the writer's 16-bit input instead
(``dtype=torch.float32`` -> ``dtype=x.dtype``), and every load of it in a reading kernel is up-cast to fp32 (an
existing ``.to(tl.float32)`` is kept, a missing one added). The readers then compute exactly as before; the one
change is a rounding of each stored value to the inputs' dtype, the rounding the reference's own op makes at its
output in that dtype, so ``strict`` (keep the inputs' precision) holds, and gate 2 checks it. Half the bytes are
written and read again, and a GEMM's output tile staged in shared memory for a descriptor store halves too.

What the buffer is and who touches it is read from the traces (:mod:`xeforge.analysis.observe`): its allocation (the
torch op and the line it ran at), the launches that got it (tensors are named by storage, so a view or a second
name for it is the same buffer), any torch op that read it, whether forward returns it. How each kernel uses its
pointer parameter is read from the kernel's code: loads and stores only, through the pointer or pointer arithmetic
on it. After the edit the source is traced again: nothing but the buffers may change dtype (an allocation that took
its dtype from one, ``torch.empty_like(y)``, is pinned to the fp32 it was). Where a buffer does not qualify the
reason names the construct and its line ("the torch.empty of line 49: torch.nn.functional.group_norm (line 56)
reads it"); in variants whose inputs are fp32 the new allocation is fp32 as before.

On the H200 the narrowed buffer measured slower where the GEMM stores it through pointers (kb30: the 128 x 256
GEMM 0.2034 -> 0.2416 ms with a bf16 output) and pays where it stores through a tensor descriptor, so the KB pattern
``dtype-narrow-intermediate-with-descriptor-stores-on-hopper`` proposes it as a basis for the persistent stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from xeforge.analysis.observe import traces
from xeforge.analysis.trace import ALLOCATIONS, Launch, Trace
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.context import Ctx
from xeforge.rewrite.cst_tools import Edits, apply_edits, arg, call_name, code, dotted, expr, is_tl, walk
from xeforge.rewrite.dtype import SIXTEEN, f32_cast_operand, pointer_param, variant_traces

_FP32 = {"torch.float32", "torch.float"}


@dataclass
class _Buffer:
    """One fp32 intermediate, as the traces saw it (keyed by the line its allocation ran at)."""

    function: str  # the function (qualified name) that allocated it
    line: int  # the line of the allocation
    op: str  # the torch allocation (empty, zeros, ...)
    uses: set[tuple[str, str]] = field(default_factory=set)  # (kernel, parameter) of each launch that got it
    launch_lines: dict[str, set[int]] = field(default_factory=dict)  # kernel -> lines it was launched from with it
    blocked: str = ""  # why it is not narrowed (empty: not blocked)
    target: dict[str, str] = field(default_factory=dict)  # variant -> the dtype it becomes there
    returned: bool = False  # forward returns it (at some variant): a result, not an intermediate


def narrow_intermediates(source: str, problem: Any) -> tuple[str, str]:
    """``source`` with every qualifying fp32 intermediate allocated in its writer's input dtype (the module
    docstring says which), and a description; NotApplicable with each buffer's reason otherwise."""
    c = Ctx(source, problem)
    traced = variant_traces(c)
    failed = {v: t for v, t in traced.items() if not isinstance(t, Trace)}
    if failed:
        v, why = next(iter(failed.items()))
        raise NotApplicable(f"the buffers forward passes between kernels are not known at {v}: {why}")
    buffers = _buffers(traced)  # type: ignore[arg-type]
    if not buffers:
        raise NotApplicable("no fp32 tensor allocated in the traced code is passed to a Triton kernel")
    edits, done, why = Edits(), [], []
    wraps: dict[str, set[str]] = {}
    narrowed: set[tuple[str, str]] = set()  # (kernel, parameter) that get a narrowed buffer
    for b in buffers.values():
        name = f"the {b.op} of line {b.line}"
        try:
            if b.blocked:
                raise NotApplicable(b.blocked)
            roles = {(k, p): _role(c, k, p) for k, p in sorted(b.uses)}
            writers = sorted({k for (k, p), r in roles.items() if r[0] == "store"})
            readers = sorted({k for (k, p), r in roles.items() if r[0] == "load"})
            if len(writers) != 1 or not readers:
                raise NotApplicable(f"written by {len(writers)} kernel(s) ({', '.join(writers) or 'none'}) and read by "
                                    f"{len(readers)}: only a buffer one kernel writes and others read is narrowed")
            writer = writers[0]
            dtype_expr = _dtype_source(c, traced, b, writer)  # type: ignore[arg-type]
            line = _allocation_line(c, b)
            edits.plain_calls[line] = _with_dtype(dtype_expr)
            narrowed |= b.uses
            for (k, p), r in roles.items():
                if r[0] == "load":
                    wraps.setdefault(k, set()).add(p)
            added = sum(roles[(k, p)][1] for (k, p) in roles if roles[(k, p)][0] == "load")
            done.append(f"the fp32 buffer of line {line} ({writer} writes it, {', '.join(readers)} read"
                        f"{'s' if len(readers) == 1 else ''} it) allocated in {dtype_expr} instead of fp32"
                        + (f"; {added} load(s) of it up-cast to fp32 in the reader" if added else ""))
        except NotApplicable as exc:
            why.append(f"{name}: {exc}")
    if not done:
        raise NotApplicable("; ".join(why))
    new = apply_edits(source, edits, c.parsed)
    if wraps:
        new = _upcast_loads(new, wraps)
    new, pinned = _unchanged_elsewhere(problem, traced, new, set(edits.plain_calls), narrowed)  # type: ignore[arg-type]
    desc = "; ".join(done) + " (half the bytes written and read again; the readers still compute in fp32)"
    if pinned:
        desc += (f"; {', '.join(f'line {n}' for n in pinned)} allocated in torch.float32 as before (it took its dtype "
                 "from the buffer)")
    if why:
        desc += f"; left as they are: {'; '.join(why)}"
    return new, desc


def _signature(t: Trace, narrowed: set[tuple[str, str]]) -> list[tuple]:
    """What must not change when the buffers are narrowed: each event's kind, place and dtypes (the narrowed
    buffers' own parameters left out), and the result dtypes."""
    out: list[tuple] = []
    for ev in t.order:
        line = ev.stack[-1].line if ev.stack else 0
        if isinstance(ev, Launch):
            out.append(("launch", ev.kernel, line, tuple(sorted(
                (p, a.dtype) for p, a in ev.args.items() if a.kind == "tensor" and (ev.kernel, p) not in narrowed))))
        else:
            out.append((ev.kind, ev.op, line, tuple(a.dtype for a in ev.outputs if a.kind == "tensor")))
    return out + [("return", tuple(a.dtype for a in t.returns))]


def _unchanged_elsewhere(problem: Any, before: dict[str, Trace], new: str, lines: set[int],
                         narrowed: set[tuple[str, str]]) -> tuple[str, list[int]]:
    """``new`` traced again: every event but the narrowed buffers must have the dtypes it had. An allocation that
    took its dtype from a narrowed buffer (``torch.empty(..., dtype=y.dtype)``, ``torch.empty_like(y)``) and was
    fp32 in every variant is pinned to ``torch.float32``; any other change is NotApplicable, naming it."""
    want = {v: _signature(t, narrowed) for v, t in before.items()}
    pinned: list[int] = []
    for attempt in range(2):
        after = traces(problem, new)
        changed: dict[int, tuple] = {}
        for v, t in after.items():
            if not isinstance(t, Trace):
                raise NotApplicable(f"the narrowed source does not trace at {v}: {t}")
            got = _signature(t, narrowed)
            if len(got) != len(want[v]):
                raise NotApplicable(f"narrowing changes what forward does at {v} ({len(want[v])} events before, "
                                    f"{len(got)} after)")
            for old, now in zip(want[v], got):
                if old != now and not (old[0] == "allocation" and old[2] in lines):  # the buffers themselves
                    changed.setdefault(now[2] if old[0] != "return" else 0, old)
        if not changed:
            return new, pinned
        fixable = {n: ev for n, ev in changed.items() if ev[0] == "allocation" and n not in lines
                   and all(_fp32_allocation_at(want[v], n) for v in want)}
        if attempt or not fixable:  # pinned once: what still changes depends on the buffers otherwise
            what = ", ".join(f"{ev[1]} at line {n}" if n else "forward's result" for n, ev in sorted(changed.items()))
            raise NotApplicable(f"narrowing would change the dtype of {what}, which depends on it")
        edits = Edits()
        for n in fixable:
            edits.plain_calls[n] = _with_dtype("torch.float32")
        new = apply_edits(new, edits)
        pinned += sorted(fixable)
    return new, pinned


def _fp32_allocation_at(signature: list[tuple], line: int) -> bool:
    return any(ev[0] == "allocation" and ev[2] == line and ev[3] == ("float32",) for ev in signature)


# ------------------------------------------------------------------------------------------------ the traces
def _buffers(traced: dict[str, Trace]) -> dict[tuple[str, int], _Buffer]:
    """Every fp32 tensor a torch allocation made (in the traced code) and some launch got, across the variants."""
    out: dict[tuple[str, int], _Buffer] = {}
    wider: set[tuple[str, int]] = set()
    for variant, t in traced.items():
        returned = {a.storage for a in t.returns if a.kind == "tensor"}
        params = {a.storage for a in t.params.values() if a.kind == "tensor"}
        result = {a.dtype for a in t.returns if a.kind == "tensor"}
        mine: dict[str, _Buffer] = {}
        for ev in t.order:
            if not isinstance(ev, Launch):  # a torch op
                outs = [a for a in ev.outputs if a.kind == "tensor"]
                if ev.kind == "allocation" and ev.stack and outs and outs[0].storage not in params:
                    key = (ev.stack[-1].function, ev.stack[-1].line)
                    if outs[0].dtype == "float32":
                        b = out.setdefault(key, _Buffer(key[0], key[1], ev.op))
                        mine[outs[0].storage] = b
                    else:
                        wider.add(key)  # fp32 only where the inputs are (dtype=x.dtype): not an fp32 buffer
                    continue
                same = {a.storage for a in outs}
                for a in ev.inputs:
                    b = mine.get(a.storage) if a.kind == "tensor" else None
                    if ev.kind == "view" and a.storage in same:
                        continue  # a view of it: the same buffer under another name
                    if b is not None and not b.blocked:
                        where = f" (line {ev.stack[-1].line})" if ev.stack else ""
                        op = ev.op if "." in ev.op else f"torch {ev.op}"
                        b.blocked = f"{op}{where} reads it: only a buffer nothing but Triton kernels read is narrowed"
                continue
            for pname, a in ev.args.items():
                b = mine.get(a.storage) if a.kind in ("tensor", "descriptor") else None
                if b is None:
                    continue
                if a.kind == "descriptor" and not b.blocked:
                    b.blocked = f"{ev.kernel} gets it as a host-side tensor descriptor ({pname})"
                b.uses.add((ev.kernel, pname))
                if ev.site is not None:
                    b.launch_lines.setdefault(ev.kernel, set()).add(ev.site.line)
        for storage, b in mine.items():
            if storage in returned:
                b.returned = True  # forward's result, not an intermediate
            if len(result) != 1:
                b.blocked = b.blocked or f"forward returns {len(result)} tensor dtype(s) at {variant}, not one"
            else:
                b.target[variant] = next(iter(result))
    return {k: b for k, b in out.items() if b.uses and not b.returned and k not in wider}


def _dtype_source(c: Ctx, traced: dict[str, Trace], b: _Buffer, writer: str) -> str:
    """The expression (in the allocating function) whose ``.dtype`` the buffer takes: a tensor argument of the
    writer's launch there with the module's result dtype in every variant, 16-bit in at least one."""
    if any(d not in SIXTEEN | {"float32"} for d in b.target.values()):
        raise NotApplicable(f"forward's result is {'/'.join(sorted(set(b.target.values())))}, not fp16/bf16/fp32")
    if not any(d in SIXTEEN for d in b.target.values()):
        raise NotApplicable("forward's result is fp32 in every variant: the buffer is already in its dtype")
    lines = b.launch_lines.get(writer, set())
    sites = [s for s in c.model.launches if s.kernel == writer and s.line in lines]
    if len(sites) != 1 or sites[0].function.rsplit(".", 1)[-1] != b.function.rsplit(".", 1)[-1]:
        raise NotApplicable(f"{writer} is not launched once from {b.function}, where the buffer is allocated")
    site, fn = sites[0], c.model.functions[writer]
    bound = dict(zip(fn.params, site.node.args))
    bound.update({k.arg: k.value for k in site.node.keywords if k.arg})
    for pname in fn.params:
        node = bound.get(pname)
        text = c.seg(node) if node is not None else ""
        if node is None or dotted(cst.parse_expression(text)) is None:
            continue  # a plain name or attribute chain only: it is read again, so no side effects
        dts = {v: t.arg_dtypes(writer, pname) for v, t in traced.items()}
        if all(ds == {b.target.get(v)} for v, ds in dts.items()):
            return f"{text}.dtype"
    raise NotApplicable(f"no tensor argument of {writer} at line {site.line} has forward's result dtype in every "
                        "variant")


def _allocation_line(c: Ctx, b: _Buffer) -> int:
    """The first line of the ``torch.<alloc>(..., dtype=torch.float32)`` call the trace saw run at ``b.line``."""
    for node in walk(c.parsed.module):
        if not isinstance(node, cst.Call):
            continue
        name = dotted(node.func) or ""
        start = c.parsed.line(node)
        if not (name.startswith("torch.") and name.rsplit(".", 1)[-1] in ALLOCATIONS):
            continue
        if not start <= b.line <= start + code(node).count("\n"):
            continue
        kw = next((a for a in node.args if a.keyword is not None and a.keyword.value == "dtype"), None)
        if kw is None and not name.endswith("_like"):
            raise NotApplicable(f"{name} at line {start} does not say dtype=torch.float32")
        if kw is not None and dotted(kw.value) not in _FP32:
            raise NotApplicable(f"{name} at line {start} takes its dtype from {code(kw.value)}, not torch.float32")
        return start
    raise NotApplicable(f"the {b.op} that ran at line {b.line} is not a torch.{b.op}(...) call written there")


def _with_dtype(text: str):
    """An edit of a torch allocation call: its ``dtype=`` set to ``text`` (added where it has none)."""
    def edit(call: cst.Call) -> cst.Call:
        if not any(a.keyword is not None and a.keyword.value == "dtype" for a in call.args):
            tight = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                    whitespace_after=cst.SimpleWhitespace(""))
            last = call.args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            return call.with_changes(args=[*call.args[:-1], last,
                                           cst.Arg(expr(text), keyword=cst.Name("dtype"), equal=tight)])
        args = [a.with_changes(value=expr(text)) if a.keyword is not None and a.keyword.value == "dtype" else a
                for a in call.args]
        return call.with_changes(args=args)
    return edit


# ------------------------------------------------------------------------------------------------ the kernels
class _Uses(cst.CSTVisitor):
    """Every read of ``names`` (a pointer parameter and the pointers computed from it) in a kernel, with the
    nodes above it."""

    def __init__(self, names: set[str]) -> None:
        self.names, self.stack, self.found = names, [], []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Name) and node.value in self.names and self.stack and not (
                isinstance(self.stack[-1], (cst.Param, cst.AssignTarget))
                or (isinstance(self.stack[-1], cst.Attribute) and self.stack[-1].attr is node)):
            self.found.append((node, list(self.stack)))
        self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()


def _pointer_names(fn: cst.FunctionDef, param: str, params: set[str]) -> set[str]:
    """``param`` and the names assigned pointer arithmetic on it (``a_ptrs = a_ptr + offs``)."""
    out = {param}
    for node in walk(fn.body):
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            if not isinstance(node.value, cst.Call) and pointer_param(fn, node.value, params) == param:
                out.add(node.targets[0].target.value)
    return out


def _role(c: Ctx, kernel: str, param: str) -> tuple[str, int]:
    """("load", loads without an fp32 up-cast) or ("store", 0): how ``kernel`` uses pointer ``param``.
    NotApplicable, naming the line, for any other use."""
    fn = c.parsed.function(kernel)
    if fn is None or kernel not in c.model.functions:
        raise NotApplicable(f"{kernel} is not a @triton.jit function of the file")
    params = set(c.model.functions[kernel].params)
    names = _pointer_names(fn, param, params)
    v = _Uses(names)
    fn.body.visit(v)
    loads, stores = set(), set()
    for node, stack in v.found:
        io = next((s for s in reversed(stack) if isinstance(s, cst.Call) and is_tl(call_name(s), "load", "store")),
                  None)
        ptr = arg(io, 0, "pointer") if io is not None else None
        if ptr is not None and pointer_param(fn, ptr, params) == param:
            if any(s is ptr for s in stack) or ptr is node:
                (stores if is_tl(call_name(io), "store") else loads).add(id(io))
                continue
            if is_tl(call_name(io), "store") and len(stack) >= 2 and isinstance(stack[-1], cst.Attribute) \
                    and stack[-1].attr.value == "dtype" and isinstance(stack[-2], cst.Attribute) \
                    and stack[-2].attr.value == "element_ty":
                continue  # the store's own cast: tl.store(p + o, v.to(p.dtype.element_ty))
        if _stored_cast(fn, stack, param, params):
            continue  # c = acc.to(c_ptr.dtype.element_ty), then only tl.store(c_ptr + o, c)
        calls = any(isinstance(s, cst.Call) for s in stack)
        if not calls and isinstance(stack[-1], cst.AugAssign) and stack[-1].target is node:
            continue  # a pointer advanced in a loop: a_ptrs += BLOCK_K * stride
        assign = next((s for s in reversed(stack) if isinstance(s, cst.Assign)), None)
        if not calls and assign is not None and isinstance(assign.targets[0].target, cst.Name) \
                and assign.targets[0].target.value in names:
            continue  # pointer arithmetic on it
        raise NotApplicable(f"{kernel} uses {param} at line {c.parsed.line(node)} other than as the address of a "
                            "tl.load or tl.store")
    if loads and stores:
        raise NotApplicable(f"{kernel} both loads and stores {param}")
    if stores:
        return "store", 0
    if not loads:
        raise NotApplicable(f"{kernel} neither loads nor stores {param}")
    return "load", len(loads - _cast_loads(fn))


def _stored_cast(fn: cst.FunctionDef, stack: list[cst.CSTNode], param: str, params: set[str]) -> bool:
    """The read of ``param`` above ``stack`` is ``v = x.to(param.dtype.element_ty)`` and ``v`` is read only as the
    value of stores through ``param``: the cast is the store's own, whatever the buffer's dtype."""
    if not (len(stack) >= 5 and isinstance(stack[-1], cst.Attribute) and stack[-1].attr.value == "dtype"
            and isinstance(stack[-2], cst.Attribute) and stack[-2].attr.value == "element_ty"
            and isinstance(stack[-3], cst.Arg) and isinstance(stack[-4], cst.Call)
            and isinstance(stack[-4].func, cst.Attribute) and stack[-4].func.attr.value == "to"):
        return False
    assign = stack[-5]
    if not (isinstance(assign, cst.Assign) and assign.value is stack[-4] and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)):
        return False
    v = _Uses({assign.targets[0].target.value})
    fn.body.visit(v)
    for read, above in v.found:
        store = next((s for s in reversed(above) if isinstance(s, cst.Call) and is_tl(call_name(s), "load", "store")),
                     None)
        value = arg(store, 1, "value") if store is not None and is_tl(call_name(store), "store") else None
        ptr = arg(store, 0, "pointer") if value is not None else None
        if value is None or ptr is None or not (read is value or any(n is value for n in above)) \
                or pointer_param(fn, ptr, params) != param:
            return False
    return bool(v.found)


def _cast_loads(fn: cst.FunctionDef) -> set[int]:
    """ids of the calls in ``fn`` that are up-cast right where they are made (``tl.load(...).to(tl.float32)``)."""
    return {id(f32_cast_operand(n)) for n in walk(fn.body)
            if isinstance(n, cst.Call) and f32_cast_operand(n) is not None}


def _upcast_loads(source: str, wraps: dict[str, set[str]]) -> str:
    """``source`` with each ``tl.load`` of the pointers in ``wraps`` (kernel -> parameters) that is not already
    ``.to(tl.float32)`` up-cast."""
    module = cst.parse_module(source)

    class Wrap(cst.CSTTransformer):
        def __init__(self) -> None:
            self.fn: cst.FunctionDef | None = None
            self.cast: set[int] = set()

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            if node.name.value in wraps:
                self.fn = node
                self.cast = _cast_loads(node)
            return True

        def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
            self.fn = None
            return updated

        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
            if self.fn is None or id(original) in self.cast or not is_tl(call_name(original), "load"):
                return updated
            params = {p.name.value for p in self.fn.params.params}
            ptr = arg(original, 0, "pointer")
            if ptr is None or pointer_param(self.fn, ptr, params) not in wraps[self.fn.name.value]:
                return updated
            tl_mod = (call_name(original) or "tl.load").rsplit(".", 1)[0]
            return cst.Call(func=cst.Attribute(value=updated, attr=cst.Name("to")),
                            args=[cst.Arg(expr(f"{tl_mod}.float32"))])

    return module.visit(Wrap()).code

