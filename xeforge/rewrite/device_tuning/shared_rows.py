"""Rows that share loads: one program serves R rows of a grid axis, its per-row work unrolled, and reads what does
not depend on the row once.

Owns :func:`share_rows` (the kernel rewrite), :func:`rows_branch` (one branch of a per-shape dispatch launching it),
:func:`fit_config` (a configuration for several rows a program), :func:`plain_axis`, and what every rewrite that
serves several rows a program reads and checks (:func:`rows_site`, :func:`row_names`, :func:`check_rows`), how it
masks the rows past the end (:class:`RowMasker`) and how its copy is launched (:func:`launch_rows`;
:mod:`~xeforge.rewrite.device_tuning.rows_dot` uses them too). A decode GEMV written one row of ``x`` a program
(``grid = (cdiv(N, BLOCK_N), B)``, ``row = tl.program_id(1)``) reads the whole weight once per row: at B = 8 it
streams W eight times, and an H100 ran it at 0.25x of cuBLAS (docs/measurements/ports-h100-2026-12-07). The
rewrite keeps every statement as the user wrote it and changes which program runs it:

- ``row = tl.program_id(1)`` becomes R row indices, ``row_r0 = tl.program_id(1) * R + 0`` ... ``row_r7 = ... + 7``,
  and R row masks ``row_ok_r<i> = row_r<i> < N_ROWS`` (``N_ROWS``, a new parameter, is the grid axis's length);
- every statement that reads or writes a value depending on the row (found to a fixed point: ``acc`` becomes one
  when ``acc += tl.sum(w * x[None, :], axis=1)`` reads ``x``) is written R times, its row-dependent names renamed
  per copy (``acc_r3``); every other statement (the weight's load, the K offsets) stays once and is shared;
- a ``tl.load`` inside a copied statement whose address and mask do not depend on the row is taken out before the
  copies, once;
- each copy's loads, stores and atomics whose address depends on the row (an atomic always) get ``& row_ok_r<i>``
  on their mask, so rows past the end are neither read nor written;
- the launch's grid axis ``B`` becomes ``triton.cdiv(B, R)``, and ``N_ROWS=B`` is passed.

Control flow that depends on the row (a loop bound, a condition), an early return, a store to an address that
does not depend on the row, an atomic without a mask (``atomic_cas``), block pointers or tensor descriptors in a
copied statement, and a kernel reading ``tl.num_programs`` of the axis are refused with the reason: the copies
could not run them as the kernel did. A kernel with nothing to share (every load depends on the row) is refused
too: the rewrite would only unroll it. The copy is correct at every row count; whether it is faster is gate 3's to
say at every timed shape.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from xeforge.kb.roles import role_of
from xeforge.kernel_model import parse_kernel
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.cst_tools import (Parsed, add_params, arg, call_name, code, expr, is_tl, names_in, rename,
                                       set_call_kwargs, statements, walk)
from xeforge.rewrite.device_tuning.branch_copy import branch_copy
from xeforge.rewrite.device_tuning.rows import with_mask
from xeforge.rewrite.tiling import _assign_counts
from xeforge.rewrite.tiling.grid import (_cdiv_args, fresh_name, launch_grid, program_id_vars,
                                        single_launch)
from xeforge.rewrite.tiling.pids import _is_docstring, hoist_program_ids

#: the copy's name: ``<kernel>_rows<R>``
SUFFIX = "_rows"
#: rows a program serves, tried in this order (a power of two; the copies are written out, so few)
ROWS = (8, 4)
#: a copy's K block at most, its N block grown to keep the weight's tile, and its warps. On an H100 (2026-12-07, the
#: rows probe of gemv_decode at B = 8, K = N = 8192; docs/measurements/ports-h100-2026-12-07b) the 8- and 4-row copies
#: ran fastest at 32 x 128 with 8 warps (0.095 and 0.097 ms; 0.169-0.27 ms with 4 warps, 0.17-0.23 ms at K blocks of
#: 256 or 512 whatever the warps): each loaded weight element serves R rows, so more warps keep its loads in flight
ROW_BLOCK_K, ROW_WARPS = 128, 8
#: the row-count parameter and the row mask's base name
COUNT, MASK = "N_ROWS", "row_ok"
#: memory calls that take a ``mask=`` (and where it sits positionally)
_MASK_AT = {"load": 1, "store": 2}
_ATOMICS = ("atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor", "atomic_xchg")
#: calls a copied statement may not make: their result does not take a row mask
_UNMASKABLE = ("make_block_ptr", "advance", "make_tensor_descriptor", "load_tensor_descriptor",
               "store_tensor_descriptor", "atomic_cas")


@dataclass
class RowsPlan:
    kernel: str
    axis: int
    pid: str
    rows: int
    count: str  # the row-count parameter
    copied: int = 0  # statements written R times
    shared_loads: int = 0  # loads left once (in shared statements or taken out of copied ones)
    names: dict[str, list[str]] = field(default_factory=dict)  # row-dependent name -> its copies

    def describe(self) -> str:
        return (f"{self.kernel}{SUFFIX}{self.rows}: {self.rows} rows of grid axis {self.axis} a program "
                f"({self.pid} and {len(self.names) - 1} value(s) computed from it written {self.rows} times, "
                f"{self.copied} statement(s)); {self.shared_loads} load(s) shared by the rows")


def _simple(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine)


def assigned(stmt: cst.SimpleStatementLine) -> set[str]:
    """The names a simple statement assigns (plain, augmented and annotated assignments)."""
    out: set[str] = set()
    for s in stmt.body:
        targets = []
        if isinstance(s, cst.Assign):
            targets = [t.target for t in s.targets]
        elif isinstance(s, (cst.AugAssign, cst.AnnAssign)):
            targets = [s.target]
        for t in targets:
            out |= names_in(t)
    return out


def _blocks(node: cst.CSTNode) -> list[cst.BaseSuite]:
    """The statement blocks directly under a compound statement (body, else)."""
    out = [node.body]
    orelse = getattr(node, "orelse", None)
    while orelse is not None:
        out.append(orelse.body)
        orelse = getattr(orelse, "orelse", None) if isinstance(orelse, cst.If) else None
    return out


def simple_statements(block: cst.BaseSuite) -> list[cst.SimpleStatementLine]:
    """Every simple statement of ``block``, in order, those of nested loops and branches included."""
    out = []
    for st in getattr(block, "body", ()):
        if _simple(st):
            out.append(st)
        elif isinstance(st, cst.BaseCompoundStatement):
            for b in _blocks(st):
                out += simple_statements(b)
    return out


def row_names(fn: cst.FunctionDef, pid: str) -> set[str]:
    """The names whose value depends on the row: ``pid``, and every name a statement assigns that reads one of them
    (to a fixed point; a statement that assigns such a name is a row's statement whatever it reads)."""
    dep = {pid}
    simple = simple_statements(fn.body)
    changed = True
    while changed:
        changed = False
        for st in simple:
            if names_in(st) & dep and not assigned(st) <= dep:
                dep |= assigned(st)
                changed = True
    return dep


def _calls(node: cst.CSTNode) -> list[cst.Call]:
    return [n for n in walk(node) if isinstance(n, cst.Call)]


def memory_op(call: cst.Call) -> str | None:
    """``load``, ``store`` or the atomic a call is (``tl.<op>``), None for any other call."""
    name = call_name(call)
    for op in (*_MASK_AT, *_ATOMICS):
        if is_tl(name, op):
            return op
    return None


def check_rows(fn: cst.FunctionDef, dep: set[str], axis: int, helpers: dict[str, cst.FunctionDef]) -> None:
    """Raise where the copies could not run the kernel as it ran one row a program."""
    for n in walk(fn.body):
        if isinstance(n, cst.Return):
            raise NotApplicable(f"{fn.name.value} returns early (`{code(n).strip()}`): a program serves several rows")
        if isinstance(n, (cst.FunctionDef, cst.Lambda, cst.With, cst.Try)):
            raise NotApplicable(f"{fn.name.value} holds a {type(n).__name__.lower()} the rewrite does not copy")
        if isinstance(n, (cst.If, cst.While)) and names_in(n.test) & dep:
            raise NotApplicable(f"a condition depends on the row (`{code(n.test)}`): with several rows a program "
                                "each copy would need its own branch")
        if isinstance(n, cst.For):
            if names_in(n.iter) & dep or names_in(n.target) & dep:
                raise NotApplicable(f"a loop bound depends on the row (`{code(n.iter)}`): the rows' loops would run "
                                    "different lengths")
        if isinstance(n, cst.Call):
            name = call_name(n) or ""
            if is_tl(name, "num_programs") and (arg(n, 0, "axis") is None or code(arg(n, 0, "axis")) == str(axis)):
                raise NotApplicable(f"{fn.name.value} reads tl.num_programs({axis}), which the rewrite divides")
            if isinstance(n.func, cst.Name) and n.func.value in helpers:
                inner = {call_name(c) or "" for c in _calls(helpers[n.func.value])}
                if any(is_tl(c, "program_id", "num_programs") for c in inner):
                    raise NotApplicable(f"{fn.name.value} calls {n.func.value}, which reads the program id itself")
    for st in simple_statements(fn.body):
        if not names_in(st) & dep:
            continue
        for c in _calls(st):
            name = call_name(c) or ""
            short = name.rsplit(".", 1)[-1]
            if short in _UNMASKABLE or (isinstance(c.func, cst.Attribute) and short in ("load", "store")
                                        and not is_tl(name, "load", "store")):
                raise NotApplicable(f"a row's statement uses {name} (`{code(st).strip()}`), which takes no row "
                                    "mask (block pointers, tensor descriptors and atomic_cas are not copied)")
            ptr = arg(c, 0, "pointer")
            if memory_op(c) == "store" and (ptr is None or not names_in(ptr) & dep):
                raise NotApplicable(f"the store `{code(c)}` writes an address that does not depend on the row: the "
                                    "rows of one program would write it in turn")


class RowMasker(cst.CSTTransformer):
    """A row's statement with its loads and stores whose address depends on the row, and its atomics, masked by ``ok``
    (a copy's scalar mask, or the [16, 1] column of :mod:`~xeforge.rewrite.device_tuning.rows_dot`)."""

    def __init__(self, dep: set[str], ok: str) -> None:
        super().__init__()
        self.dep, self.ok = dep, ok

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        op = memory_op(original)
        if op is None:
            return updated
        ptr = arg(original, 0, "pointer")
        if op in _ATOMICS or (ptr is not None and names_in(ptr) & self.dep):
            return with_mask(_MASK_AT.get(op, 2), self.ok)(updated)
        return updated


class _Hoist(cst.CSTTransformer):
    """Loads of a copied statement that read no row-dependent name, replaced by fresh names assigned before it."""

    def __init__(self, dep: set[str], taken: set[str]) -> None:
        super().__init__()
        self.dep, self.taken = dep, taken
        self.out: list[tuple[str, cst.Call]] = []

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if memory_op(original) != "load" or names_in(original) & self.dep:
            return updated
        name = fresh_name(self.taken, "shared")
        self.taken.add(name)
        self.out.append((name, updated))
        return cst.Name(name)


@dataclass
class RowsSite:
    """A kernel read for a rewrite that serves several rows of grid axis ``axis`` a program: its source (program ids
    hoisted), the ``ast`` model and function, the row's program id, the libcst parse and function, the file's jit
    helpers, and the names that depend on the row."""

    source: str
    model: Any
    jf: Any
    pid: Any
    parsed: Parsed
    fn: cst.FunctionDef
    helpers: dict[str, cst.FunctionDef]
    dep: set[str]


def rows_site(source: str, kernel: str, axis: int) -> RowsSite:
    """``kernel`` read for a rows rewrite, with what it shares with every such rewrite checked (one ``pid =
    tl.program_id(axis)`` at the top, a launch that passes no constexpr by position, no defaults, nothing the copies
    could not run: :func:`check_rows`); NotApplicable with the reason."""
    source = hoist_program_ids(source)
    model = parse_kernel(source)
    if kernel not in model.functions:
        raise NotApplicable(f"{kernel} is not a @triton.jit function of the file")
    jf = model.functions[kernel]
    pids, inline = program_id_vars(jf.node)
    if inline:
        raise NotApplicable(f"{kernel} reads tl.program_id inline (line {inline[0].lineno})")
    pid = next((p for p in pids if p.axis == axis), None)
    if pid is None:
        raise NotApplicable(f"{kernel} never assigns tl.program_id({axis}) to a name at its top")
    if _assign_counts(jf.node).get(pid.name, 0) != 1:
        raise NotApplicable(f"{pid.name} is assigned more than once")
    consts = set(jf.constexpr_params)
    site = single_launch(model, kernel)
    first_const = next((i for i, p in enumerate(jf.params) if p in consts), len(jf.params))
    if len(site.node.args) > first_const:
        raise NotApplicable(f"the launch at line {site.line} passes constexpr arguments by position; {COUNT} would "
                            "be inserted among them")
    if jf.node.args.defaults or jf.node.args.vararg or jf.node.args.kwonlyargs or jf.node.args.kwarg:
        raise NotApplicable(f"{kernel} has parameters with defaults, *args or keyword-only parameters")
    parsed = Parsed.of(source)
    fn = parsed.function(kernel)
    helpers = {n: f for n in model.functions if n != kernel and (f := parsed.function(n)) is not None}
    dep = row_names(fn, pid.name)
    check_rows(fn, dep, axis, helpers)
    return RowsSite(source, model, jf, pid, parsed, fn, helpers, dep)


def share_rows(source: str, kernel: str, axis: int, rows: int) -> tuple[str, RowsPlan]:
    """``source`` with ``kernel`` serving ``rows`` rows of grid axis ``axis`` a program (its launch untouched: see
    :func:`rows_branch`); NotApplicable with the reason."""
    if rows < 2 or rows & (rows - 1):
        raise NotApplicable(f"{rows} rows a program is not a power of two of at least 2")
    rs = rows_site(source, kernel, axis)
    model, jf, pid, parsed, fn, dep = rs.model, rs.jf, rs.pid, rs.parsed, rs.fn, rs.dep
    taken = {n.id for n in ast.walk(model.tree) if isinstance(n, ast.Name)} | set(jf.params)
    count = fresh_name(taken, COUNT)
    taken.add(count)
    copies: dict[str, list[str]] = {}
    for name in sorted(dep):
        copies[name] = []
        for i in range(rows):
            copies[name].append(fresh_name(taken, f"{name}_r{i}"))
            taken.add(copies[name][-1])
    oks = []
    for i in range(rows):
        oks.append(fresh_name(taken, f"{MASK}_r{i}"))
        taken.add(oks[-1])
    plan = RowsPlan(kernel, axis, pid.name, rows, count, names=copies)
    pid_line = pid.stmt.lineno

    def block(stmts) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for st in stmts:
            if isinstance(st, cst.BaseCompoundStatement):
                out.append(compound(st))
                continue
            if not (_simple(st) and names_in(st) & dep):
                plan.shared_loads += sum(memory_op(c) == "load" for c in _calls(st))
                out.append(st)
                continue
            if parsed.line(st) == pid_line:
                lead = st.leading_lines
                made = statements("\n".join(
                    f"{copies[pid.name][i]} = {pid.read()} * {rows} + {i}\n{oks[i]} = {copies[pid.name][i]} < {count}"
                    for i in range(rows)))
                made[0] = made[0].with_changes(leading_lines=lead)
                out += made
                continue
            hoist = _Hoist(dep, taken)
            st = st.visit(hoist)
            for name, load in hoist.out:
                out.append(cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], load)]))
            plan.shared_loads += len(hoist.out)
            plan.copied += 1
            for i in range(rows):
                one = rename(st.visit(RowMasker(dep, oks[i])), {n: c[i] for n, c in copies.items()})
                out.append(one if i == 0 else one.with_changes(leading_lines=()))
        return out

    def compound(st):
        if isinstance(st, cst.If):
            new = st.with_changes(body=st.body.with_changes(body=block(st.body.body)))
            if st.orelse is not None:
                if isinstance(st.orelse, cst.If):
                    new = new.with_changes(orelse=compound(st.orelse))
                else:
                    new = new.with_changes(orelse=st.orelse.with_changes(
                        body=st.orelse.body.with_changes(body=block(st.orelse.body.body))))
            return new
        new = st.with_changes(body=st.body.with_changes(body=block(st.body.body)))
        if getattr(st, "orelse", None) is not None:
            new = new.with_changes(orelse=st.orelse.with_changes(
                body=st.orelse.body.with_changes(body=block(st.orelse.body.body))))
        return new

    body = block(fn.body.body)
    # a parameter the rows change (``x_ptr += row * stride``): each copy starts from the argument
    params = [p for p in jf.params if p in dep]
    if params:
        first = 1 if body and _is_docstring(body[0]) else 0
        body[first:first] = statements("\n".join(f"{copies[p][i]} = {p}" for p in params for i in range(rows)))
    if not plan.shared_loads:
        raise NotApplicable(f"every load of {kernel} depends on the row: the programs of several rows would share "
                            "nothing")
    new_fn = fn.with_changes(body=fn.body.with_changes(body=body), params=add_params(fn.params, [count]))
    module = parsed.module.with_changes(body=[new_fn if s is fn else s for s in parsed.module.body])
    return module.code, plan


def fit_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` for a copy serving several rows a program: its K block (the role ``block_k``) cut to
    :data:`ROW_BLOCK_K` where larger, its N block (``block_n``) grown by the same factor (the weight's tile keeps its
    size), and :data:`ROW_WARPS` warps where it sets ``num_warps``; ``cfg`` as it is where it names no K block."""
    k = next((n for n in cfg if role_of(n) == "block_k" and isinstance(cfg[n], int)), None)
    if k is None:
        return cfg
    out = {**cfg, **({"num_warps": ROW_WARPS} if "num_warps" in cfg else {})}
    if cfg[k] > ROW_BLOCK_K:
        out[k] = ROW_BLOCK_K
        n = next((n for n in cfg if role_of(n) == "block_n" and isinstance(cfg[n], int)), None)
        if n is not None:
            out[n] = cfg[n] * (cfg[k] // ROW_BLOCK_K)
    return out


def plain_axis(source: str, kernel: str, axis: int) -> str:
    """The host expression of grid axis ``axis`` at ``kernel``'s launch when it is a plain count (``B``,
    ``x.shape[0]``: no ``cdiv`` of a block size, no meta-parameter); NotApplicable otherwise."""
    model = parse_kernel(source)
    site = single_launch(model, kernel)
    grid = launch_grid(model, site)
    if grid is None or axis >= len(grid.elements):
        raise NotApplicable(f"the grid of the launch at line {site.line} has no axis {axis} the rewrite can read")
    el = grid.elements[axis]
    if _cdiv_args(el) is not None or (grid.meta and any(isinstance(n, ast.Name) and n.id == grid.meta
                                                        for n in ast.walk(el))):
        raise NotApplicable(f"grid axis {axis} of the launch at line {site.line} is tiled by a block size, not one "
                            "program a row")
    return (ast.get_source_segment(model.source, el) or ast.unparse(el)).strip()


class _RowsLaunch(cst.CSTTransformer):
    """In the ``if`` whose test is ``test``: the launch of ``copy`` gets ``grid`` and ``N_ROWS=<count>``."""

    def __init__(self, test: str, copy: str, grid: str, count: tuple[str, str]) -> None:
        super().__init__()
        self.test, self.copy, self.grid, self.count = test, copy, grid, count
        self.inside, self.done = 0, 0

    def visit_If(self, node: cst.If) -> None:
        self.inside += code(node.test) == self.test

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
        self.inside -= code(original.test) == self.test
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        f = updated.func
        if not (self.inside and isinstance(f, cst.Subscript) and isinstance(f.value, cst.Name)
                and f.value.value == self.copy):
            return updated
        self.done += 1
        el = f.slice[0]
        call = updated.with_changes(func=f.with_changes(slice=[el.with_changes(slice=cst.Index(expr(self.grid)))]))
        return set_call_kwargs(call, {self.count[0]: self.count[1]})


def launch_rows(dispatched: str, rewritten: str, kernel: str, suffix: str, test: str, axis: int, rows: int,
                count_param: str, count: str) -> str:
    """``dispatched`` with the branch under ``if <test>:`` launching ``<kernel><suffix>`` (``rewritten``'s kernel,
    placed after the kernel), its grid axis ``axis`` divided by ``rows`` and ``count_param=<count>`` passed."""
    copy = f"{kernel}{suffix}"
    out = branch_copy(dispatched, rewritten, kernel, suffix, test)
    model = parse_kernel(out)
    site = next((s for s in model.launches if s.kernel == copy), None)
    grid = launch_grid(model, site) if site is not None else None
    if grid is None:
        raise NotApplicable(f"the grid of {copy}'s launch could not be read")
    parts = [(ast.get_source_segment(out, e) or ast.unparse(e)).strip() for e in grid.elements]
    tri = any(isinstance(n, ast.Import) and any(a.name == "triton" and a.asname is None for a in n.names)
              for n in model.tree.body)
    parts[axis] = f"triton.cdiv({count}, {rows})" if tri else f"(({count}) + {rows - 1}) // {rows}"
    inner = f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
    text = f"lambda {grid.meta}: {inner}" if grid.meta else inner
    tr = _RowsLaunch(test, copy, text, (count_param, count))
    module = cst.parse_module(out).visit(tr)
    if tr.done != 1:
        raise NotApplicable(f"no single launch of {copy} under `if {test}:`")
    return module.code


def rows_branch(dispatched: str, original: str, kernel: str, test: str, axis: int, rows: int) -> str:
    """``dispatched`` (a per-shape dispatch of ``kernel``) with the branch under ``if <test>:`` launching
    ``<kernel>_rows<R>`` (:func:`share_rows` of ``original``'s kernel), its grid axis ``axis`` divided by R and the
    row count passed; the other branches keep the kernel."""
    count = plain_axis(original, kernel, axis)
    new, plan = share_rows(original, kernel, axis, rows)
    return launch_rows(dispatched, new, kernel, f"{SUFFIX}{rows}", test, axis, rows, plan.count, count)
