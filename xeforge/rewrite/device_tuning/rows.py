"""Row batching: one program handles ROWS rows of a per-row kernel, as a [ROWS, BLOCK] block.

Owns: planning and applying the device_tuning stage's ``rows-per-program`` codemod. A kernel launched on a 1D
tuple grid ``(n,)`` whose program id indexes one row — ``pid = tl.program_id(0)`` assigned once at the top,
every ``tl.arange`` a 1D per-row vector, no scan, dot, atomic or reduction but the row reductions below, no
branch or loop bound that depends on the row — becomes::

    pid = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]    # [ROWS, 1] row indices
    row_ok = pid < N_ROWS
    j = tl.arange(0, BLOCK)[None, :]                              # [1, BLOCK]
    ... tl.load(ptr, mask=mask & row_ok) ... tl.store(ptr, v, mask=mask & row_ok)

Values computed from ``pid`` (``h = pid % H``, row base pointers) become [ROWS, 1] columns and broadcast
against the [1, BLOCK] vectors. A row reduction outside any loop (``tl.sum(x, axis=0)``, ``x.max()``: a norm's
mean and variance, a softmax's max and sum) reduces axis 1 with ``keep_dims=True``: its per-program scalar becomes
the [ROWS, 1] column of each row's result, which broadcasts the same way. A load or store whose address depends
on the row gets ``& row_ok`` on its mask (``mask=row_ok`` where it had none; no ``other``: rows past the end are
never stored). The launch gets
``(triton.cdiv(n, ROWS),)``, ``N_ROWS=n`` and ``ROWS=<value>`` (an ``@triton.autotune``'d kernel too: its configs
tune the rest). Anything else is left alone with the reason.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

import libcst as cst

from xeforge.analysis.launches import live_launches
from xeforge.kernel_model import JitFunction, KernelModel, dotted_name, early_returns, literal, parse_kernel
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.context import loads
from xeforge.rewrite.cst_tools import Edits, apply_edits, expr, is_tl, set_call_kwargs, statements
from xeforge.rewrite.tiling import _assign_counts, _kw, names_in
from xeforge.rewrite.tiling.edit import FunctionEdit, edit_function
from xeforge.rewrite.tiling.grid import (enclosing_function, fresh_name, launch_grid, pid_derived_names,
                                        program_id_vars, single_launch)
from xeforge.rewrite.tiling.pids import hoist_program_ids

#: reductions of a 1D per-row vector that a [ROWS, BLOCK] block computes on axis 1, keeping the axis
ROW_REDUCTIONS = frozenset({"sum", "max", "min", "argmax", "argmin", "xor_sum"})
#: calls that combine elements of a row (or of the block), so a [ROWS, BLOCK] block would change their result
REDUCING = frozenset({"sum", "max", "min", "reduce", "argmax", "argmin", "xor_sum", "cumsum", "cumprod",
                      "associative_scan", "sort", "topk", "histogram", "gather", "dot", "dot_scaled"})
#: calls whose result depends on the rank or shape of their operands, or that build a fixed shape
SHAPED = frozenset({"reshape", "view", "trans", "permute", "expand_dims", "broadcast_to", "broadcast", "cat", "join",
                    "split", "interleave", "flip", "ravel", "zeros", "full", "make_block_ptr", "advance",
                    "make_tensor_descriptor", "load_tensor_descriptor", "store_tensor_descriptor", "num_programs",
                    "swizzle2d"})
#: compiler hints on a 1D vector: kept on the arange, the row axis is added outside them
HINTS = frozenset({"multiple_of", "max_contiguous", "max_constancy"})
#: Python builtins that need a scalar, not a [ROWS, 1] tensor
SCALAR_BUILTINS = frozenset({"min", "max", "int", "float", "bool", "len", "sum", "any", "all", "sorted", "round"})
#: calls a jit helper may not make for the kernel to be batched (it would see [ROWS, ...] operands)
_HELPER_BARRED = REDUCING | SHAPED | {"program_id", "arange", "load", "store"}

PARAM, COUNT, MASK = "ROWS", "N_ROWS", "row_ok"


@dataclass
class RowsPlan:
    kernel: str
    pid: str
    start: str  # the program id as the kernel read it (with its cast)
    pid_line: int
    n_rows: str  # host expression: the grid's one element
    edit_assign: bool  # the grid is a variable used once: its assignment is rewritten, else the launch's grid
    blocks: list[str]  # the tl.arange sizes, as written
    aranges: list[tuple[int, int, str]] = field(default_factory=list)  # calls that get [None, :]
    masked: list[tuple[int, int, str, int]] = field(default_factory=list)  # loads/stores: position, mask index
    names: tuple[str, str, str] = (PARAM, COUNT, MASK)  # ROWS constexpr, row-count parameter, row mask
    cdiv: str = "triton.cdiv"  # or "" when the module does not import triton
    other_axes: list[str] = field(default_factory=list)  # the grid's other elements, kept as written
    meta: str | None = None  # a lambda grid's parameter (the new grid stays a lambda of it)
    reductions: list[tuple[int, int, str | None, bool]] = field(default_factory=list)  # position, method form?

    def describe(self) -> str:
        rows, count, _ = self.names
        vec = ", ".join(dict.fromkeys(self.blocks))
        red = f"; {len(self.reductions)} row reduction(s) on axis 1" if self.reductions else ""
        return (f"{self.kernel}: {rows} rows per program as [{rows}, {vec}] blocks instead of one row "
                f"({count} = {self.n_rows}; {len(self.masked)} loads/stores masked by row{red})")


def _attr(call: ast.Call) -> str | None:
    """``sum`` for ``tl.sum(...)`` and ``x.sum(...)``; the name for ``f(...)``."""
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return call.func.id if isinstance(call.func, ast.Name) else None


def _is_tl(call: ast.AST, *attrs: str) -> bool:
    return isinstance(call, ast.Call) and is_tl(dotted_name(call.func), *attrs)


def _assignments(root: ast.AST) -> list[tuple[str, ast.stmt]]:
    out = []
    for node in ast.walk(root):
        if isinstance(node, ast.Assign):
            out += [(n.id, node) for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name):
            out.append((node.target.id, node))
    return out


def _check_body(fn: JitFunction, model: KernelModel, dep: set[str]) -> None:
    """Raise when something in the kernel would change meaning once rows are batched."""
    node = fn.node
    consts = set(fn.constexpr_params)
    early = {id(r) for r in early_returns(node)}
    for n in (n for st in node.body for n in ast.walk(st)):
        line = getattr(n, "lineno", fn.line)
        if id(n) in early:
            raise NotApplicable(f"{fn.name} returns early (line {line}); a batched program serves several rows")
        test = None
        if isinstance(n, (ast.If, ast.While, ast.IfExp)):
            test = n.test
        elif isinstance(n, ast.For):
            test = n.iter
        elif isinstance(n, ast.BoolOp):
            test = n
        if test is not None and names_in(test) & dep:
            what = "a loop bound" if isinstance(n, ast.For) else "a condition"
            raise NotApplicable(f"{what} depends on the row ({ast.unparse(test)}, line {line}); with ROWS rows "
                                "per program it would be a tensor")
        if not isinstance(n, ast.Call):
            continue
        attr = _attr(n)
        if isinstance(n.func, ast.Name) and attr in SCALAR_BUILTINS:
            if any(names_in(a) & dep for a in [*n.args, *(k.value for k in n.keywords)]):
                raise NotApplicable(f"{fn.name} calls Python's {attr}() on a row-dependent value (line {line}); with "
                                    "ROWS rows per program it would be a tensor")
        elif isinstance(n.func, ast.Name) and attr in model.functions:
            helper = model.functions[attr].node
            barred = sorted({_attr(c) for c in ast.walk(helper) if isinstance(c, ast.Call)} & _HELPER_BARRED)
            if barred:
                raise NotApplicable(f"{fn.name} calls {attr} (line {line}), which uses {', '.join(barred)}")
        elif isinstance(n.func, ast.Attribute) and attr in SHAPED:
            raise NotApplicable(f"{fn.name} calls {ast.unparse(n.func)} (line {line}), whose result depends on the "
                                "block's shape")
    # a name carried into a loop (or a run-time branch) with a per-program value that the loop makes per-row
    # would change shape from one iteration to the next
    for n in ast.walk(node):
        if not (isinstance(n, (ast.For, ast.While)) or (isinstance(n, ast.If) and not names_in(n.test) <= consts)):
            continue
        inside = {id(s) for s in ast.walk(n)}
        changed = {name for name, _ in _assignments(n)} & dep
        for name in sorted(changed):
            before = sorted((s for nm, s in _assignments(node) if nm == name and id(s) not in inside
                             and s.lineno < n.lineno), key=lambda s: s.lineno)
            state = "program" if name in fn.params else None
            for s in before:
                if s.value is not None and names_in(s.value) & dep:
                    state = "row"
                elif not isinstance(s, ast.AugAssign):
                    state = "program"
            if state == "program":
                raise NotApplicable(f"{name} is set per program before line {n.lineno} and per row inside the "
                                    f"{'loop' if not isinstance(n, ast.If) else 'branch'} there")


def _accesses(fn: JitFunction, dep: set[str]) -> list[tuple[int, int, str, int]]:
    out = []
    for n in ast.walk(fn.node):
        if not _is_tl(n, "load", "store"):
            continue
        store = n.func.attr == "store"
        ptr = _kw(n, "pointer", 0)
        mask_at = 2 if store else 1
        rest = [a for a in (_kw(n, "value", 1) if store else None, _kw(n, "mask", mask_at),
                            None if store else _kw(n, "other", 2)) if a is not None]
        if ptr is not None and names_in(ptr) & dep:
            out.append((n.lineno, n.col_offset, ast.unparse(n.func), mask_at))
        elif any(names_in(a) & dep for a in rest):
            raise NotApplicable(f"the {n.func.attr} at line {n.lineno} has an address that does not depend on the "
                                "row but a value or mask that does")
    return out


def _aranges(fn: JitFunction) -> tuple[list[tuple[int, int, str]], list[str]]:
    """The calls that get ``[None, :]`` (an arange, or the outermost hint wrapped around one) and the sizes."""
    wrapped: set[int] = set()
    edits, sizes = [], []
    for n in ast.walk(fn.node):
        if _is_tl(n, *HINTS) and n.args:
            inner = n.args[0]
            chain = [n]
            while _is_tl(inner, *HINTS) and inner.args:
                chain.append(inner)
                inner = inner.args[0]
            if not _is_tl(inner, "arange"):
                raise NotApplicable(f"{ast.unparse(n.func)} at line {n.lineno} applies to a value that gains a row "
                                    "dimension (the rewrite keeps hints on tl.arange only)")
            if id(n) not in wrapped:
                edits.append((n.lineno, n.col_offset, ast.unparse(n.func)))
            wrapped |= {id(c) for c in chain} | {id(inner)}
    for n in ast.walk(fn.node):
        if _is_tl(n, "arange"):
            sizes.append(ast.unparse(_kw(n, "end", 1) or n))
            if id(n) not in wrapped:
                edits.append((n.lineno, n.col_offset, ast.unparse(n.func)))
    return edits, sizes


def _binds(tree: ast.Module, name: str, full: str) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Import) and any((a.asname or a.name) == name and a.name == full for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and full.startswith(f"{node.module}.") and any(
                (a.asname or a.name) == name and f"{node.module}.{a.name}" == full for a in node.names):
            return True
    return False


def _helper_bodies(model: KernelModel, fn: JitFunction) -> list[tuple[str, list[ast.AST]]]:
    """(name, its nodes) of each jit helper of the file that ``fn`` calls, directly or through another helper."""
    seen: dict[str, list[ast.AST]] = {}
    todo = [fn.node]
    while todo:
        for n in ast.walk(todo.pop()):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in model.functions \
                    and n.func.id != fn.name and n.func.id not in seen:
                helper = model.functions[n.func.id].node
                seen[n.func.id] = [m for st in helper.body for m in ast.walk(st)]
                todo.append(helper)
    return list(seen.items())


def _axis_arg(call: ast.Call, method: bool) -> ast.expr | None:
    """The axis a reduction call is given (``tl.sum(x, 0)``, ``x.sum(axis=0)``), None where it has none."""
    return _kw(call, "axis", 0 if method else 1)


def _row_reductions(fn: JitFunction) -> list[tuple[int, int, str | None, bool]]:
    """The reductions of a 1D per-row vector the batched kernel computes on axis 1: ``tl.<op>(x[, 0])`` and
    ``x.<op>([0])`` outside any loop, with (line, column, the callee as written, whether it is the method form).
    A reduction in a loop (its per-row result carried from one iteration to the next would change shape) or over
    another axis is left in place, and the refusal names it."""
    in_loop = {id(n) for lp in ast.walk(fn.node) if isinstance(lp, (ast.For, ast.While)) for n in ast.walk(lp)}
    out = []
    for n in ast.walk(fn.node):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ROW_REDUCTIONS):
            continue
        method = not is_tl(dotted_name(n.func), n.func.attr)
        axis = _axis_arg(n, method)
        if id(n) in in_loop or (axis is not None and literal(axis) not in (0, None)) or \
                any(k.arg == "keep_dims" for k in n.keywords) or (method and len(n.args) > 1) or \
                (not method and (not n.args or len(n.args) > 2)):
            continue
        out.append((n.lineno, n.col_offset, dotted_name(n.func), method))  # the key the call edit matches
    return out


def _on_axis_1(method: bool):
    """The reduction call on axis 1 with its axis kept: ``tl.sum(x, 0)`` -> ``tl.sum(x, axis=1, keep_dims=True)``."""
    def build(call: cst.Call) -> cst.Call:
        first = 0 if method else 1  # the positional slot of the axis
        positional = [a for a in call.args if a.keyword is None and not a.star]
        args = [a for a in call.args if not (a.keyword is None and not a.star and a in positional[first:first + 1])]
        args = [a for a in args if not (a.keyword is not None and a.keyword.value == "axis")]
        out = set_call_kwargs(call.with_changes(args=args), {"axis": "1", "keep_dims": "True"})
        last = out.args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return out.with_changes(args=[*out.args[:-1], last])
    return build


def plan_rows(model: KernelModel, kernel: str) -> RowsPlan:
    fn = model.functions[kernel]
    tuned = {k for c in fn.autotune_configs for k in c}
    if fn.autotuned and not fn.autotune_configs:
        raise NotApplicable(f"{kernel} is @triton.autotune'd with configs that are not literals: which names they "
                            "set (ROWS among them?) cannot be read")
    site = single_launch(model, kernel)
    body = [n for st in fn.node.body for n in ast.walk(st)]
    reductions = _row_reductions(fn)
    for n in body:
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and (n.lineno, n.col_offset) not in \
                {(r[0], r[1]) for r in reductions} and (n.func.attr in REDUCING or n.func.attr.startswith("atomic_")):
            raise NotApplicable(f"{kernel} combines elements ({ast.unparse(n.func)}, line {n.lineno}) in a way a "
                                "[ROWS, BLOCK] block would change (row batching takes elementwise code and row "
                                f"reductions outside loops: {', '.join(sorted(ROW_REDUCTIONS))})")
    for owner, nodes in ((kernel, body), *_helper_bodies(model, fn)):
        sub = next((n for n in nodes if isinstance(n, ast.Subscript)), None)
        if sub is not None:
            where = "" if owner == kernel else f" in its jit helper {owner}"
            raise NotApplicable(f"{kernel} already works on 2D blocks (it indexes a tensor{where}: "
                                f"{ast.unparse(sub)}, line {sub.lineno}), several rows a program, sized by its own "
                                "block arguments; the rewrite is for 1D per-row vectors")
    pids, inline = program_id_vars(fn.node)
    if inline:
        raise NotApplicable(f"{kernel} calls tl.program_id inline (line {inline[0].lineno}); the rewrite needs one "
                            "`pid = tl.program_id(0)` at the top")
    if not pids:
        raise NotApplicable(f"{kernel} never reads tl.program_id")
    axes = sorted(p.axis for p in pids)
    if axes not in ([0], [0, 1]):
        raise NotApplicable(f"{kernel} reads program ids of axes {axes}; the rewrite batches the rows of axis 0 "
                            "of a 1D or 2D grid")
    pid = next(p for p in pids if p.axis == 0)  # axis 1 (column blocks, heads) stays as it is
    if _assign_counts(fn.node).get(pid.name, 0) != 1:
        raise NotApplicable(f"{pid.name} is assigned more than once")
    if not _binds(model.tree, "tl", "triton.language"):
        raise NotApplicable("the module does not import triton.language as tl")
    if fn.node.args.defaults or fn.node.args.vararg or fn.node.args.kwonlyargs or fn.node.args.kwarg:
        raise NotApplicable(f"{kernel} has parameters with defaults, *args or keyword-only parameters")
    dep = pid_derived_names(fn.node, axis=0) | {pid.name}  # the row's values; axis 1's stay scalars
    _check_body(fn, model, dep)
    aranges, sizes = _aranges(fn)
    if not sizes:
        raise NotApplicable(f"{kernel} has no tl.arange: each program handles one element, not a row vector")
    masked = _accesses(fn, dep)
    if not any(name.endswith("store") for *_, name, _ in masked):
        raise NotApplicable(f"no tl.store of {kernel} writes a row-dependent address")
    grid = launch_grid(model, site)
    if grid is None or (grid.kind == "lambda" and grid.meta in names_in(grid.elements[0])):
        raise NotApplicable(f"the grid of the launch at line {site.line} is not a tuple, or a lambda whose row count "
                            "does not depend on the meta-parameters (the rewrite needs `(n,)`)")
    elements = list(grid.elements)
    while len(elements) > len(axes) and literal(elements[-1]) == 1:  # (n, 1): a 1D grid written as 2D
        elements.pop()
    if len(elements) != len(axes):
        raise NotApplicable(f"the grid of the launch at line {site.line} has {len(grid.elements)} axes and "
                            f"{kernel} reads {len(axes)}")
    el = elements[0]
    rest = [model.segment(e).strip() or ast.unparse(e) for e in grid.elements[1:]]
    n_rows = model.segment(el).strip() or ast.unparse(el)
    host = enclosing_function(model, site)
    edit_assign = False
    if grid.variable and grid.assign is not None and host is not None:
        moved = {nm for nm, s in _assignments(host) if grid.assign.lineno < s.lineno < site.line}
        if moved & names_in(el):
            raise NotApplicable(f"{', '.join(sorted(moved & names_in(el)))} changes between the grid assignment "
                                f"(line {grid.assign.lineno}) and the launch")
        edit_assign = loads([host], grid.variable) == 1
    first_const = next((i for i, p in enumerate(fn.params) if p in fn.constexpr_params), len(fn.params))
    if len(site.node.args) > first_const:
        raise NotApplicable(f"the launch at line {site.line} passes constexpr arguments by position; the row count "
                            "would be inserted among them")
    taken = {n.id for n in ast.walk(fn.node) if isinstance(n, ast.Name)} | set(fn.params) | tuned
    names = []
    for base in (PARAM, COUNT, MASK):
        names.append(fresh_name(taken, base))
        taken.add(names[-1])
    cdiv = "triton.cdiv" if _binds(model.tree, "triton", "triton") else ""
    return RowsPlan(kernel, pid.name, pid.read(), pid.stmt.lineno, n_rows, edit_assign, sizes, aranges, masked,
                    tuple(names), cdiv, rest, grid.meta if grid.kind == "lambda" else None, reductions)


def with_mask(pos: int, mask: str):
    """A builder of ``call`` with ``& <mask>`` on its mask (positional slot ``pos`` or ``mask=``; ``mask=<mask>``
    where it has none). Also used by :mod:`~xeforge.rewrite.device_tuning.shared_rows`."""
    def build(call: cst.Call) -> cst.Call:
        args = list(call.args)
        positional = [i for i, a in enumerate(args) if a.keyword is None and not a.star]
        at = next((i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == "mask"),
                  positional[pos] if len(positional) > pos else None)
        if at is None:
            return set_call_kwargs(call, {"mask": mask})
        old = args[at].value
        if isinstance(old, cst.Name) and old.value == "None":
            new = cst.Name(mask)
        else:
            if not isinstance(old, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not old.lpar:
                old = old.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            new = cst.BinaryOperation(old, cst.BitAnd(), cst.Name(mask))
        args[at] = args[at].with_changes(value=new)
        return call.with_changes(args=args)
    return build


def _row_vector(call: cst.Call) -> cst.BaseExpression:
    return expr("_[None, :]").with_changes(value=call)


def apply_rows(source: str, plan: RowsPlan, rows: int, num_warps: int | None = None) -> str:
    """``source`` with ``plan`` applied for ``rows`` rows per program (and ``num_warps`` when given); its inline
    program ids hoisted first, as :func:`plan` planned."""
    source = hoist_program_ids(source)
    if rows < 1 or rows & (rows - 1):
        raise NotApplicable(f"ROWS={rows} is not a power of two")
    param, count, mask = plan.names
    edit = FunctionEdit(plan.kernel)
    for key in plan.aranges:
        edit.calls[key] = _row_vector
    for line, col, name, pos in plan.masked:
        edit.calls[(line, col, name)] = with_mask(pos, mask)
    for line, col, name, method in plan.reductions:
        edit.calls[(line, col, name)] = _on_axis_1(method)
    head = f"{plan.pid} = {plan.start} * {param} + tl.arange(0, {param})[:, None]\n{mask} = {plan.pid} < {count}"

    def body(original, updated, line_of):
        out = []
        for o, u in zip(original, updated):
            if line_of(o) != plan.pid_line:
                out.append(u)
                continue
            new = statements(head)
            new[0] = new[0].with_changes(leading_lines=u.leading_lines)
            out += new
        return out

    edit.body = body
    source = edit_function(source, edit)
    model = parse_kernel(source)
    site = single_launch(model, plan.kernel)
    grid = launch_grid(model, site)
    n = plan.n_rows if "\n" not in plan.n_rows else f"({plan.n_rows})"
    size = f"{plan.cdiv}({n}, {rows})" if plan.cdiv else f"({n} + {rows - 1}) // {rows}"
    elements = f"({', '.join([size, *plan.other_axes])}{',' if not plan.other_axes else ''})"
    new_grid = expr(f"lambda {plan.meta}: {elements}" if plan.meta else elements)

    def launch(call: cst.Call) -> cst.Call:
        has_warps = any(a.keyword is not None and a.keyword.value == "num_warps" for a in call.args)
        call = set_call_kwargs(call, {count: n, param: str(rows), **({"num_warps": str(num_warps)}
                                                                      if num_warps and has_warps else {})})
        if num_warps and not has_warps:
            last = call.args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            eq = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
            call = call.with_changes(args=[*call.args[:-1], last, cst.Arg(cst.Integer(str(num_warps)),
                                                                           keyword=cst.Name("num_warps"), equal=eq)])
        if not plan.edit_assign:
            el = call.func.slice[0]
            call = call.with_changes(func=call.func.with_changes(slice=[el.with_changes(slice=cst.Index(new_grid))]))
        return call

    edits = Edits(params={plan.kernel: [count, f"{param}: tl.constexpr"]}, calls={site.line: launch})
    if plan.edit_assign:
        # the tuple itself is replaced, inside a lambda grid's body too
        new_tuple = expr(elements)
        edits.tuples[grid.assign.lineno] = lambda t: new_tuple if len(t.elements) == 1 + len(plan.other_axes) else None
    try:
        return apply_edits(source, edits)
    except LookupError as exc:
        raise NotApplicable(f"the launch of {plan.kernel} could not be rewritten ({exc})") from None


def launched_in_order(model: KernelModel) -> list[str]:
    """Launched kernels in launch order: those the traces saw run (a backward kernel forward never launches is no
    target), every launched one where the source has not been traced."""
    return list(dict.fromkeys(s.kernel for s in live_launches(model)))


def plan(source: str, kernel: str | None = None) -> RowsPlan:
    """The plan for ``kernel`` (or the first launched kernel it applies to), on the source with its inline program
    ids hoisted (:mod:`~xeforge.rewrite.tiling.pids`); NotApplicable with every reason."""
    model = parse_kernel(hoist_program_ids(source))
    errors = []
    for name in [kernel] if kernel else launched_in_order(model):
        try:
            return plan_rows(model, name)
        except NotApplicable as exc:
            errors.append(f"{name}: {exc}")
    raise NotApplicable("; ".join(errors) or "no kernel launch found in Model.forward")


def rewrite(source: str, rows: int, num_warps: int | None = None, kernel: str | None = None) -> tuple[str, RowsPlan]:
    p = plan(source, kernel)
    return apply_rows(source, p, rows, num_warps), p
