"""The kernel shapes fusion recognises, read from the libcst tree of a ``@triton.jit`` function.

Owns: :func:`tile_store` — a kernel's one final ``tl.store(ptr + offsets, value, mask=...)`` at the top level
of its body: the pointer parameter, the offset expression, the mask, the value before its down-cast, and
(for a 2D tile) the row and column offsets with their bounds; and :func:`elementwise_kernel` — a
flat elementwise kernel (``offs = pid * BLOCK + tl.arange(0, BLOCK)``, ``mask = offs < n``, loads at
``ptr + offs``, one store at ``out_ptr + offs``, no loops or reductions). Each raises
:class:`~xeforge.rewrite.NotApplicable` naming what does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from xeforge.rewrite import NotApplicable
from xeforge.rewrite.cst_tools import Parsed, arg, body_statements, call_name, code, dotted, is_tl, names_in, small, walk

REDUCING = ("sum", "max", "min", "reduce", "cumsum", "cumprod", "argmax", "argmin", "dot", "dot_scaled", "xor_sum",
            "histogram", "sort", "atomic_add", "atomic_max", "atomic_min", "atomic_cas", "atomic_xchg",
            "atomic_and", "atomic_or", "atomic_xor", "associative_scan", "gather", "make_block_ptr",
            "make_tensor_descriptor", "advance")


def params_of(fn: cst.FunctionDef) -> tuple[list[str], list[str]]:
    """(all parameter names, constexpr parameter names)."""
    names, consts = [], []
    for p in fn.params.params:
        names.append(p.name.value)
        if p.annotation is not None and (dotted(p.annotation.annotation) or "").endswith("constexpr"):
            consts.append(p.name.value)
    return names, consts


def _plus_terms(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    node = _unparen(node)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
        return _plus_terms(node.left) + _plus_terms(node.right)
    return [node]


def _unparen(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node


def _and_terms(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    node = _unparen(node)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitAnd):
        return _and_terms(node.left) + _and_terms(node.right)
    return [node]


def _broadcast_axis(node: cst.BaseExpression) -> tuple[str, str] | None:
    """``offs_m[:, None]`` -> (offs_m, "row"); ``offs_n[None, :]`` -> (offs_n, "col")."""
    node = _unparen(node)
    if not (isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and len(node.slice) == 2):
        return None
    a, b = (code(e.slice).strip() for e in node.slice)
    if a == ":" and b == "None":
        return node.value.value, "row"
    if a == "None" and b == ":":
        return node.value.value, "col"
    return None


def _single_assign(fn: cst.FunctionDef, name: str) -> tuple[cst.SimpleStatementLine, cst.BaseExpression] | None:
    """The one top-level ``name = value`` of ``fn`` (None if assigned elsewhere or more than once)."""
    found = []
    for stmt in body_statements(fn):
        s = small(stmt)
        if isinstance(s, cst.Assign) and len(s.targets) == 1 and isinstance(s.targets[0].target, cst.Name) \
                and s.targets[0].target.value == name:
            found.append((stmt, s.value))
    nested = 0
    for node in walk(fn.body):
        if isinstance(node, cst.AssignTarget) and isinstance(node.target, cst.Name) and node.target.value == name:
            nested += 1
        if isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name) and node.target.value == name:
            nested += 1
    return found[0] if len(found) == 1 and nested == 1 else None


def _uses(fn: cst.FunctionDef, name: str) -> int:
    n = 0
    for node in walk(fn.body):
        if isinstance(node, cst.Attribute):
            continue
        if isinstance(node, cst.Name) and node.value == name:
            n += 1
    return n


@dataclass
class TileStore:
    """A kernel's final tile store."""

    fn: str
    line: int  # first line of the store statement
    ptr_param: str  # the pointer parameter it stores through
    ptr_src: str  # the pointer expression as written (may be a local like c_ptrs)
    offset_src: str  # offsets added to ptr_param (the flat index when the output is contiguous)
    mask_src: str | None
    value_src: str  # the value before its down-cast
    value_is_name: bool
    cast_src: str | None  # the down-cast target, e.g. "c_ptr.dtype.element_ty"
    cast_line: int | None  # a `c = acc.to(...)` statement only the store used (removed when fusing)
    rows: tuple[str, str | None] | None = None  # (offs_m, M)
    cols: tuple[str, str | None] | None = None  # (offs_n, N)
    row_stride: str | None = None  # stride_cm in `offs_m[:, None] * stride_cm`
    names: set[str] = field(default_factory=set)  # every name in the function
    params: list[str] = field(default_factory=list)
    constexprs: list[str] = field(default_factory=list)
    stmt_node: cst.SimpleStatementLine | None = None

    @property
    def two_d(self) -> bool:
        return self.rows is not None and self.cols is not None

    def cast(self, value: str) -> str:
        return f"{value}.to({self.cast_src})" if self.cast_src else value


def _strip_cast(node: cst.BaseExpression) -> tuple[cst.BaseExpression, str | None]:
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "to" \
            and len(node.args) == 1 and node.args[0].keyword is None:
        return node.func.value, code(node.args[0].value)
    return node, None


def tile_store(parsed: Parsed, fn_name: str) -> TileStore:
    fn = parsed.function(fn_name)
    if fn is None:
        raise NotApplicable(f"{fn_name} is not a top-level function")
    params, consts = params_of(fn)
    stores = [n for n in walk(fn.body) if isinstance(n, cst.Call) and is_tl(call_name(n), "store")]
    if len(stores) != 1:
        raise NotApplicable(f"{fn_name} has {len(stores)} tl.store calls (fusion needs exactly one final tile store)")
    stmt = None
    for s in body_statements(fn):
        sm = small(s)
        if isinstance(sm, cst.Expr) and sm.value is stores[0]:
            stmt = s
    if stmt is None:
        raise NotApplicable(f"{fn_name}'s tl.store is inside a loop or branch, not the kernel's final statement")
    call = stores[0]
    ptr = arg(call, 0, "pointer")
    value = arg(call, 1, "value")
    mask = arg(call, -1, "mask")
    if ptr is None or value is None:
        raise NotApplicable(f"{fn_name}'s tl.store has no pointer/value arguments")
    other_kw = [a.keyword.value for a in call.args if a.keyword is not None and a.keyword.value not in
                ("pointer", "value", "mask")]
    if other_kw:
        raise NotApplicable(f"{fn_name}'s tl.store passes {', '.join(other_kw)} (only mask= is understood)")
    ptr_src = code(ptr)
    expanded = ptr
    if isinstance(ptr, cst.Name) and ptr.value not in params:
        one = _single_assign(fn, ptr.value)
        if one is None:
            raise NotApplicable(f"{fn_name} stores through {ptr.value}, which is not assigned exactly once")
        expanded = one[1]
    terms = _plus_terms(expanded)
    bases = [t for t in terms if isinstance(t, cst.Name) and t.value in params and t.value not in consts]
    if len(bases) > 1:
        bases = [t for t in bases if "ptr" in t.value] or bases
    if len(bases) != 1:
        raise NotApplicable(f"{fn_name}'s store pointer {code(expanded)} is not <pointer parameter> + offsets")
    base = bases[0].value
    offsets = [t for t in terms if not (isinstance(t, cst.Name) and t.value == base)]
    offset_src = " + ".join(code(t) for t in offsets) if offsets else "0"
    rows = cols = None
    row_stride = None
    for t in offsets:
        t = _unparen(t)
        parts = [t]
        if isinstance(t, cst.BinaryOperation) and isinstance(t.operator, cst.Multiply):
            parts = [t.left, t.right]
        for i, p in enumerate(parts):
            ax = _broadcast_axis(p)
            if ax is None:
                continue
            if ax[1] == "row":
                rows = (ax[0], None)
                if len(parts) == 2:
                    row_stride = code(parts[1 - i])
            else:
                cols = (ax[0], None)
    mask_src = code(mask) if mask is not None else None
    if mask is not None:
        mexpr = mask
        if isinstance(mask, cst.Name):
            one = _single_assign(fn, mask.value)
            if one is not None:
                mexpr = one[1]
        for term in _and_terms(mexpr):
            term = _unparen(term)
            if isinstance(term, cst.Comparison) and len(term.comparisons) == 1 \
                    and isinstance(term.comparisons[0].operator, cst.LessThan):
                ax = _broadcast_axis(term.left)
                bound = code(term.comparisons[0].comparator)
                if ax and ax[1] == "row" and rows and ax[0] == rows[0]:
                    rows = (rows[0], bound)
                elif ax and ax[1] == "col" and cols and ax[0] == cols[0]:
                    cols = (cols[0], bound)
    pre, cast = _strip_cast(value)
    cast_line = None
    if cast is None and isinstance(value, cst.Name):
        one = _single_assign(fn, value.value)
        if one is not None and _uses(fn, value.value) == 2:  # the assignment and the store
            inner, c = _strip_cast(one[1])
            if c is not None:
                pre, cast, cast_line = inner, c, parsed.line(one[0])
    return TileStore(
        fn=fn_name, line=parsed.line(stmt), ptr_param=base, ptr_src=ptr_src, offset_src=offset_src,
        mask_src=mask_src, value_src=code(pre), value_is_name=isinstance(pre, cst.Name), cast_src=cast,
        cast_line=cast_line, rows=rows if rows and rows[1] else None, cols=cols if cols and cols[1] else None,
        row_stride=row_stride, names=names_in(fn), params=params, constexprs=consts, stmt_node=stmt,
    )


# ------------------------------------------------------------------------------------------------ consumers
@dataclass
class ElementwiseKernel:
    """A flat elementwise kernel: ``offs = pid * BLOCK + arange``; ``mask = offs < n``; one store at ``out + offs``."""

    fn: str
    offs: str
    mask: str | None
    n_param: str | None
    block_param: str | None
    flat_loads: dict[str, int]  # pointer parameter -> number of tl.load(<param> + offs, ...) calls
    flat_nodes: dict[str, list[cst.Call]]  # the same loads
    out_param: str
    drop_lines: set[int]  # the pid / offs / mask statements (replaced by the producer's tile)
    store_line: int
    store_value: cst.BaseExpression
    store_stmt: cst.BaseStatement
    body: list[cst.BaseStatement]  # the statements kept (in order), store excluded
    params: list[str] = field(default_factory=list)
    constexprs: list[str] = field(default_factory=list)

    def uses(self, name: str, skip: list[cst.Call]) -> bool:
        """Whether ``name`` is read by the kept statements outside the calls in ``skip``."""
        skip_ids = {id(c) for c in skip}

        def visit(node: cst.CSTNode) -> bool:
            if id(node) in skip_ids:
                return False
            if isinstance(node, cst.Attribute):
                return visit(node.value)
            if isinstance(node, cst.Arg):
                return visit(node.value)
            if isinstance(node, cst.Name):
                return node.value == name
            return any(visit(c) for c in node.children)

        return any(visit(s) for s in self.body) or visit(self.store_value)


def _is_flat(ptr: cst.BaseExpression, offs: str, params: list[str]) -> str | None:
    terms = _plus_terms(ptr)
    if len(terms) == 2:
        names = [t.value for t in terms if isinstance(t, cst.Name)]
        if len(names) == 2 and offs in names:
            other = names[1 - names.index(offs)]
            if other in params:
                return other
    return None


def elementwise_kernel(parsed: Parsed, fn_name: str) -> ElementwiseKernel:
    fn = parsed.function(fn_name)
    if fn is None:
        raise NotApplicable(f"{fn_name} is not a top-level function")
    params, consts = params_of(fn)
    for node in walk(fn.body):
        if isinstance(node, (cst.For, cst.While, cst.If, cst.With, cst.Try, cst.Return)):
            raise NotApplicable(f"{fn_name} has control flow ({type(node).__name__.lower()}); only straight-line "
                                "elementwise kernels are fused")
        name = call_name(node) if isinstance(node, cst.Call) else None
        if name and name.startswith(("tl.", "triton.language.")) and name.rsplit(".", 1)[-1] in REDUCING:
            raise NotApplicable(f"{fn_name} calls {name} (not elementwise)")
    pids = [n for n in walk(fn.body) if isinstance(n, cst.Call) and is_tl(call_name(n), "program_id")]
    aranges = [n for n in walk(fn.body) if isinstance(n, cst.Call) and is_tl(call_name(n), "arange")]
    if len(pids) != 1 or len(aranges) != 1:
        raise NotApplicable(f"{fn_name} is not a flat 1D elementwise kernel (one program_id and one arange expected)")
    pid_axis = arg(pids[0], 0, "axis")
    if pid_axis is None or code(pid_axis) != "0":
        raise NotApplicable(f"{fn_name} uses a program axis other than 0")
    # the statement that holds the arange defines offs
    offs_stmt = None
    for s in body_statements(fn):
        if any(n is aranges[0] for n in walk(s)):
            offs_stmt = s
    sm = small(offs_stmt) if offs_stmt is not None else None
    if not (isinstance(sm, cst.Assign) and len(sm.targets) == 1 and isinstance(sm.targets[0].target, cst.Name)):
        raise NotApplicable(f"{fn_name}: tl.arange is not assigned to an offsets variable at the top level")
    offs = sm.targets[0].target.value
    block = arg(aranges[0], 1, "end")
    block_param = block.value if isinstance(block, cst.Name) and block.value in consts else None
    drop = {parsed.line(offs_stmt)}
    # statements feeding offs (pid = tl.program_id(0), block_start = pid * BLOCK) are dropped too
    feeders = names_in(sm.value) - set(params)
    changed = True
    while changed:
        changed = False
        for s in body_statements(fn):
            si = small(s)
            line = parsed.line(s)
            if line in drop or not (isinstance(si, cst.Assign) and len(si.targets) == 1
                                    and isinstance(si.targets[0].target, cst.Name)):
                continue
            target = si.targets[0].target.value
            if target in feeders:
                if _uses(fn, target) != 2:
                    raise NotApplicable(f"{fn_name} uses {target} beyond computing {offs}")
                drop.add(line)
                feeders |= names_in(si.value) - set(params)
                changed = True
    # mask = offs < n
    mask = n_param = None
    for s in body_statements(fn):
        si = small(s)
        if isinstance(si, cst.Assign) and len(si.targets) == 1 and isinstance(si.targets[0].target, cst.Name):
            v = _unparen(si.value)
            if isinstance(v, cst.Comparison) and len(v.comparisons) == 1 \
                    and isinstance(v.comparisons[0].operator, cst.LessThan) and isinstance(v.left, cst.Name) \
                    and v.left.value == offs and isinstance(v.comparisons[0].comparator, cst.Name) \
                    and v.comparisons[0].comparator.value in params:
                mask, n_param = si.targets[0].target.value, v.comparisons[0].comparator.value
                drop.add(parsed.line(s))
    if mask is None:
        raise NotApplicable(f"{fn_name} has no `mask = {offs} < n_elements` bound (its ragged edge is not masked)")
    # loads and the store
    flat: dict[str, int] = {}
    flat_nodes: dict[str, list[cst.Call]] = {}
    for node in walk(fn.body):
        if isinstance(node, cst.Call) and is_tl(call_name(node), "load"):
            p = arg(node, 0, "pointer")
            f = _is_flat(p, offs, params) if p is not None else None
            if f is not None:
                flat[f] = flat.get(f, 0) + 1
                flat_nodes.setdefault(f, []).append(node)
    stores = [n for n in walk(fn.body) if isinstance(n, cst.Call) and is_tl(call_name(n), "store")]
    if len(stores) != 1:
        raise NotApplicable(f"{fn_name} has {len(stores)} tl.store calls (one expected)")
    st = stores[0]
    out = _is_flat(arg(st, 0, "pointer"), offs, params)
    if out is None:
        raise NotApplicable(f"{fn_name} does not store at <out_ptr> + {offs}")
    store_stmt = next((s for s in body_statements(fn) if isinstance(small(s), cst.Expr) and small(s).value is st), None)
    if store_stmt is None or store_stmt is not body_statements(fn)[-1]:
        raise NotApplicable(f"{fn_name}'s store is not its last statement")
    body = []
    for s in body_statements(fn):
        if parsed.line(s) in drop or s is store_stmt:
            continue
        if isinstance(small(s), cst.Expr) and isinstance(small(s).value, cst.SimpleString):
            continue  # docstring
        body.append(s)
    value = arg(st, 1, "value")
    return ElementwiseKernel(fn_name, offs, mask, n_param, block_param, flat, flat_nodes, out, drop,
                             parsed.line(store_stmt), value, store_stmt, body, params, consts)
