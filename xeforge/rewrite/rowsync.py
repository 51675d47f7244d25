"""The split row reduction's second pass folded into its GEMM's tile loop: the tiles of a row of tiles wait for
each other, then each finishes its own tile.

Owns :func:`apply` and :class:`SyncPlan`. After the fusion stage's split row reduction (``y - y.mean(1,
keepdim=True)``, ``exp(y - y.amax(1, keepdim=True))`` over rows no tile covers) a GEMM stores its tile and one
partial per row, and a generated ``row_combine_kernel`` (:mod:`xeforge.rewrite.fusion.combine`) reduces the
partials, reads the tile back and writes the result: a second pass over the output, which torch.compile also runs
after cuBLAS. Here, in a persistent GEMM whose programs all run at once, each tile stores its partials, counts
itself in its row of tiles' counter (``tl.atomic_add`` with release semantics, after a barrier so that the
partials are stored first), waits until the count reaches the row's tile count (acquire), reads the row's
partials in slot order (the same order and arithmetic as the combine kernel: deterministic) and writes the
finished tile from its registers. The tile is no longer written and read back, so the output is written once.

That is safe only where every program of the row's tiles is running: the tile loop is ordered row of tiles by row
of tiles (``pid_row = tile // n_cols``), steps by the largest multiple of the row's tile count within the grid (a
round of the loop holds whole rows; the programs beyond it get no tile), and the launch is cooperative on CUDA
(``launch_cooperative_grid=True``: the driver runs every program at once or refuses the launch). Where the grid is
smaller than a row's tile count, or on a device without a cooperative launch (the CPU interpreter runs programs one
at a time; XPU: not known to the knowledge base), the kernel runs the two passes as before: ``SYNC`` is set per call
and the kernel checks the grid, and the combine kernel runs only where the GEMM did not finish the tiles (a flag
the GEMM sets).

Applies to the form the fusion stage generates: a combine kernel with the standard parameters and nothing but
elementwise ops on ``v`` (the row's value) and ``y`` (the tile), launched once, after a GEMM launched with its
partials buffer, whose tile loop steps over ``tl.num_programs(0)`` with tile ids ``tile % n`` / ``tile // n``.
Otherwise NotApplicable with the reason.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass

import libcst as cst

from xeforge.kernel_model import KernelModel, dotted_name, parse_kernel, parse_python
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.tiling import _kw
from xeforge.rewrite.cst_tools import Edits, add_params, apply_edits, code, expr, set_call_kwargs, statements

__all__ = ["COMBINE_PARAMS", "SyncPlan", "apply", "plan"]

#: the generated combine kernel's parameters, in order (:mod:`xeforge.rewrite.fusion.combine`, broadcast phase)
COMBINE_PARAMS = ("part_ptr", "out_ptr", "M", "S", "N", "stride_part", "stride_out", "y_ptr", "y_stride_r",
                  "y_stride_c", "BLOCK_R", "BLOCK_S", "BLOCK_N")
#: names the combine kernel's row and tile statements may read: they are renamed into the GEMM's epilogue
_TAIL_NAMES = {"p", "ok", "v", "w", "y", "S", "tl", "float", "math"}


@dataclass
class SyncPlan:
    gemm: str  # the GEMM kernel
    combine: str  # the generated combine kernel
    part: str  # host: the partials buffer
    out: str  # host: the combine kernel's output
    y: str  # host: the tile the GEMM stores
    keep_y: bool  # forward reads the tile otherwise too: still stored
    part_param: str
    stride_param: str
    y_param: str
    tile: str  # the tile loop's variable
    pid_row: str
    pid_col: str
    n_rows: str
    n_cols: str
    rows: str  # the tile's row offsets
    cols: str  # the tile's column offsets
    row_mask: str  # the partial store's mask (source)
    col_mask: str  # the epilogue's column mask (a name)
    value: str  # the value the GEMM stores as the tile (source)
    reduce: list[str]  # the combine kernel's statements from its partials to the row's value
    finish: list[str]  # its statements from the row's value and the tile to the result

    def describe(self) -> str:
        return (f"{self.gemm}: the split row reduction finished in the tile loop: the tiles of a row of tiles wait "
                f"for each other's partials (an atomic count per row, a cooperative launch on CUDA), then each "
                f"writes its finished tile; {self.combine} runs only where the grid cannot hold a row's tiles")


def _src(node: ast.AST) -> str:
    return ast.unparse(node)


def _combine(model: KernelModel) -> str:
    for name, fn in model.functions.items():
        if tuple(fn.params) == COMBINE_PARAMS:
            return name
    raise NotApplicable("no generated row-combine kernel (the fusion stage's second pass of a split row reduction) "
                        "in this source")


def _combine_parts(fn: ast.FunctionDef) -> tuple[list[str], list[str]]:
    """The combine kernel's statements from its loaded partials ``p`` to the row's value ``v`` (the reduction and
    what follows it per row), and those of its column loop from ``w = v[:, None]`` and the tile ``y`` to the
    stored ``w``."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    loop = next((s for s in body if isinstance(s, ast.For)), None)
    if loop is None or body[-1] is not loop:
        raise NotApplicable(f"{fn.name} has no column loop last (its rows are not broadcast over the tile)")
    at = next((i for i, s in enumerate(body) if isinstance(s, ast.Assign) and _src(s.targets[0]) == "p"), None)
    if at is None:
        raise NotApplicable(f"{fn.name} does not load its partials into p")
    reduce = [s for s in body[at + 1:-1] if not (isinstance(s, ast.Assign) and _src(s.targets[0]) == "span")]
    inner = loop.body
    ys = [i for i, s in enumerate(inner) if isinstance(s, ast.Assign) and _src(s.targets[0]) == "y"]
    if len(ys) != 1 or not isinstance(inner[-1], ast.Expr) or dotted_name(getattr(inner[-1].value, "func", None)) \
            != "tl.store":
        raise NotApplicable(f"{fn.name}'s column loop does not read the tile once and store the result last")
    finish = [s for i, s in enumerate(inner[:-1]) if i != ys[0] and not (
        isinstance(s, ast.Assign) and _src(s.targets[0]) == "offs_n")]
    stored = inner[-1].value.args[1] if len(inner[-1].value.args) > 1 else None
    if stored is None or _src(stored) != "w.to(out_ptr.dtype.element_ty)":
        raise NotApplicable(f"{fn.name} stores something other than w")
    for s in [*reduce, *finish]:
        if not all(isinstance(t, ast.Name) and t.id in ("v", "w") for t in getattr(s, "targets", [None])):
            raise NotApplicable(f"{fn.name} line {s.lineno}: only assignments to v and w fold into the tile")
        names = {n.id for n in ast.walk(s) if isinstance(n, ast.Name)} - _TAIL_NAMES
        if names:
            raise NotApplicable(f"{fn.name} line {s.lineno} reads {', '.join(sorted(names))}: only the row's value, "
                                "the tile and the slot count fold into the tile")
    return [_src(s) for s in reduce], [_src(s) for s in finish]


def _loop(fn: ast.FunctionDef) -> ast.For:
    loops = [s for s in fn.body if isinstance(s, ast.For) and isinstance(s.iter, ast.Call)
             and dotted_name(s.iter.func) in ("tl.range", "range") and len(s.iter.args) >= 3
             and _src(s.iter.args[2]) == "tl.num_programs(0)" and _src(s.iter.args[0]) == "tl.program_id(0)"]
    if len(loops) != 1 or not isinstance(loops[0].target, ast.Name):
        raise NotApplicable(f"{fn.name} has no persistent tile loop (for tile in tl.range(tl.program_id(0), tiles, "
                            "tl.num_programs(0))): the row's tiles can wait for each other only where every program "
                            "runs at once")
    if any(k.arg == "warp_specialize" for k in loops[0].iter.keywords):
        raise NotApplicable(f"{fn.name}'s tile loop is warp-specialized: a barrier in its epilogue would wait on the "
                            "loading warps")
    return loops[0]


def _store_to(node: ast.AST, base: str) -> ast.Call | None:
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and dotted_name(n.func) == "tl.store" and n.args:
            ptr = n.args[0]
            while isinstance(ptr, ast.BinOp):
                ptr = ptr.left
            if isinstance(ptr, ast.Name) and ptr.id == base:
                return n
    return None


def plan(source: str) -> SyncPlan:
    model = parse_kernel(source)
    combine = _combine(model)
    csites = [s for s in model.launches if s.kernel == combine]
    if len(csites) != 1 or len(csites[0].args) < 2:
        raise NotApplicable(f"{combine} is launched from {len(csites)} places (the rewrite needs one)")
    part, out = csites[0].args[0], csites[0].args[1]
    y = _src(_kw(csites[0].node, "y_ptr")) if _kw(csites[0].node, "y_ptr") is not None else None
    if y is None or not (part.isidentifier() and out.isidentifier() and y.isidentifier()):
        raise NotApplicable(f"{combine}'s launch does not pass its partials, output and tile as plain names")
    reduce, finish = _combine_parts(model.functions[combine].node)
    gsites = [s for s in model.launches if s.kernel != combine
              and any(_src(k.value) == part for k in s.node.keywords)]
    if not gsites or len({s.kernel for s in gsites}) != 1:
        raise NotApplicable(f"no single kernel is launched with {part} (the split reduction's partials)")
    gemm = gsites[0].kernel
    if len([s for s in model.launches if s.kernel == gemm]) != len(gsites):
        raise NotApplicable(f"{gemm} is also launched without {part}")
    fn = model.functions[gemm]
    part_param = next(k.arg for k in gsites[0].node.keywords if _src(k.value) == part)
    y_param = next((k.arg for k in gsites[0].node.keywords if k.arg and _src(k.value) == y), None)
    if y_param is None:
        pos = [i for i, a in enumerate(gsites[0].args) if a == y]
        y_param = fn.params[pos[0]] if pos else None
    if y_param is None:
        raise NotApplicable(f"{gemm}'s launch does not pass {y} (the tile read back)")
    loop = _loop(fn.node)
    tile = loop.target.id
    pids = {}
    for s in loop.body[:4]:
        if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name) and isinstance(s.value, ast.BinOp) \
                and _src(s.value.left) == tile and isinstance(s.value.op, (ast.Mod, ast.FloorDiv)) \
                and isinstance(s.value.right, ast.Name):
            pids[type(s.value.op)] = (s.targets[0].id, s.value.right.id)
    if set(pids) != {ast.Mod, ast.FloorDiv} or pids[ast.Mod][1] != pids[ast.FloorDiv][1]:
        raise NotApplicable(f"{gemm}'s tile loop does not number its tiles as tile % n and tile // n (a grouped order "
                            "is not rewritten)")
    pstore = _store_to(loop, part_param)
    if pstore is None or _kw(pstore, "mask") is None:
        raise NotApplicable(f"{gemm} does not store its partials with a row mask inside its tile loop")
    pterm = pstore.args[0]
    if not isinstance(pterm, ast.BinOp) or not isinstance(pterm.right, ast.Name):
        raise NotApplicable(f"{gemm}'s partial store is not base + rows * stride + column tile")
    pid_col = pterm.right.id
    pid_row = next(p for p, _ in pids.values() if p != pid_col)
    counts = {}
    for s in fn.node.body:
        if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name) and isinstance(s.value, ast.BinOp) \
                and isinstance(s.value.op, ast.Mult) and isinstance(s.value.left, ast.Name) \
                and isinstance(s.value.right, ast.Name):
            counts[s.targets[0].id] = (s.value.left.id, s.value.right.id)
    tiles = _src(loop.iter.args[1])
    if tiles not in counts or pids[ast.Mod][1] not in counts[tiles]:
        raise NotApplicable(f"{gemm}'s tile count {tiles} is not the product of its row and column tile counts")
    # which count goes with the column tile: the divisor of tile % n where pid_col = tile % n, else the other one
    mod_pid, div_n = pids[ast.Mod]
    other = next(n for n in counts[tiles] if n != div_n) if counts[tiles][0] != counts[tiles][1] else div_n
    n_cols, n_rows = (div_n, other) if mod_pid == pid_col else (other, div_n)
    inner = pterm.left
    rows = None
    if isinstance(inner, ast.BinOp) and isinstance(inner.right, ast.BinOp) and isinstance(inner.right.left, ast.Name):
        rows = inner.right.left.id
    param_stride = _src(inner.right.right) if rows else None
    if rows is None or param_stride is None:
        raise NotApplicable(f"{gemm}'s partial store is not base + rows * stride + column tile")
    cmask = next((s.targets[0].id for s in loop.body if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name)
                  and s.targets[0].id.startswith("col_mask")), None)
    cols = None
    if cmask is not None:
        cm = next(s for s in loop.body if isinstance(s, ast.Assign) and _src(s.targets[0]) == cmask)
        sub = cm.value.left if isinstance(cm.value, ast.Compare) else None
        cols = sub.value.id if isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name) else None
    if cmask is None or cols is None:
        raise NotApplicable(f"{gemm}'s epilogue has no column mask (col_mask = cols[None, :] < N)")
    ystore = _store_to(loop, y_param)
    if ystore is None or len(ystore.args) < 2:
        raise NotApplicable(f"{gemm} has no pointer store of its tile {y_param} to read the stored value from")
    # forward's other reads of the tile: the launches and its shape only, or the tile is still stored
    keep = _reads_tile_otherwise(model.forward(), y, {id(s.node) for s in [*gsites, *csites]})
    return SyncPlan(gemm, combine, part, out, y, keep, part_param, param_stride, y_param, tile, pid_row, pid_col, n_rows,
                    n_cols, rows, cols, _src(_kw(pstore, "mask")), cmask, _src(ystore.args[1]), reduce, finish)


def _reads_tile_otherwise(fwd: ast.FunctionDef | None, y: str, launches: set[int]) -> bool:
    """Whether forward reads ``y`` other than as an argument of the launches, an attribute (``y.shape``,
    ``y.device``, ``y.stride(0)``) or its own allocation."""
    if fwd is None:
        return True
    skip: set[int] = set()
    for n in ast.walk(fwd):
        if id(n) in launches or (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == y):
            skip.update(id(m) for m in ast.walk(n))
    return any(isinstance(n, ast.Name) and n.id == y and isinstance(n.ctx, ast.Load) and id(n) not in skip
               for n in ast.walk(fwd))


#: names the rewrite adds to the GEMM kernel, its combine kernel and forward
_KERNEL_NAMES = ("sync_count_ptr", "sync_out_ptr", "sync_stride_out", "sync_S", "SYNC_BLOCK_S", "SYNC", "sync_step",
                 "sync_on", "sync_slots", "sync_ok", "sync_p", "sync_v", "sync_w", "sync_y")
_HOST_NAMES = ("sync_counts",)
_RENAME = {"p": "sync_p", "ok": "sync_ok", "v": "sync_v", "w": "sync_w", "y": "sync_y", "S": "sync_S"}


class _Rename(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.copy_location(ast.Name(_RENAME.get(node.id, node.id), node.ctx), node)


def _renamed(stmts: list[str]) -> list[str]:
    return [ast.unparse(_Rename().visit(parse_python(s))) for s in stmts]


class _Kernels(cst.CSTTransformer):
    """The GEMM's tile loop rows first, stepping over whole rows of tiles, with the synchronised finish; the combine
    kernel's body behind the GEMM's flag."""

    def __init__(self, p: SyncPlan) -> None:
        super().__init__()
        self.p = p
        self.fn: str | None = None
        self.done: set[str] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if self.fn is None and node.name.value in (self.p.gemm, self.p.combine):
            self.fn = node.name.value

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        name = original.name.value
        if name != self.fn:
            return updated
        self.fn = None
        if name == self.p.combine:
            body = list(updated.body.body)
            doc = 1 if body and _is_docstring(body[0]) else 0
            guard = cst.If(test=expr("tl.load(sync_flag_ptr) == 0"), body=cst.IndentedBlock(body=body[doc:]),
                           leading_lines=[cst.EmptyLine(comment=cst.Comment(
                               "# the GEMM finished the tiles itself where its grid held a whole row of them"))])
            self.done.add(name)
            return updated.with_changes(params=add_params(updated.params, ["sync_flag_ptr"]),
                                        body=updated.body.with_changes(body=[*body[:doc], guard]))
        body = list(updated.body.body)
        at = next((i for i, s in enumerate(body) if isinstance(s, cst.For) and self._is_tile_loop(s)), None)
        if at is None:
            return updated
        p = self.p
        pre = statements(f"""
            # rows of tiles whole in each round of the tile loop, where every program runs at once (SYNC: a
            # cooperative launch) and the grid holds a row's {p.n_cols} tiles; the two passes otherwise
            sync_step = tl.num_programs(0)
            sync_on = sync_step < 0
            if SYNC:
                if tl.num_programs(0) >= {p.n_cols}:
                    sync_step = (tl.num_programs(0) // {p.n_cols}) * {p.n_cols}
                    sync_on = sync_step > 0
            """)
        self.done.add(name)
        loop = body[at].with_changes(iter=self._iter(body[at].iter), body=self._loop_body(body[at].body))
        return updated.with_changes(
            params=add_params(updated.params, ["sync_count_ptr", "sync_out_ptr", "sync_stride_out", "sync_S",
                                               "SYNC_BLOCK_S: tl.constexpr", "SYNC: tl.constexpr"]),
            body=updated.body.with_changes(body=[*body[:at], *pre, loop, *body[at + 1:]]))

    def _is_tile_loop(self, node: cst.For) -> bool:
        return isinstance(node.target, cst.Name) and node.target.value == self.p.tile and isinstance(node.iter, cst.Call)

    def _iter(self, it: cst.Call) -> cst.Call:
        tiles = code(it.args[1].value)
        start = expr(f"tl.where(tl.program_id(0) < sync_step, tl.program_id(0), {tiles})")
        args = list(it.args)
        args[0] = args[0].with_changes(value=start)
        args[2] = args[2].with_changes(value=expr("sync_step"))
        # not flattened: Triton 3.6's TritonGPUFuseNestedLoops fails on the wait's loop inside a flattened tile loop
        # (H100, 2026-12-07, docs/measurements/ports-h100-2026-12-07e)
        kept = [a for a in args if not (a.keyword is not None and a.keyword.value == "flatten")]
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return it.with_changes(args=kept)

    def _loop_body(self, block: cst.IndentedBlock) -> cst.IndentedBlock:
        p = self.p
        out: list[cst.BaseStatement] = []
        for s in block.body:
            text = code(s).strip()
            head = text.split("\n", 1)[0].replace(" ", "")
            if head in (f"{p.pid_row}={p.tile}%{p.n_rows}", f"{p.pid_row}={p.tile}//{p.n_cols}"):
                out += statements(f"{p.pid_row} = {p.tile} // {p.n_cols}  # rows of tiles first: a row's tiles "
                                  "run in one round")
                continue
            if head in (f"{p.pid_col}={p.tile}//{p.n_rows}", f"{p.pid_col}={p.tile}%{p.n_cols}"):
                out += statements(f"{p.pid_col} = {p.tile} % {p.n_cols}")
                continue
            out.append(s)
        # the statement holding the tile's store (the last that stores the tile) becomes the choice of finish
        idx = max(i for i, s in enumerate(out) if _stores(s, p))
        plain = textwrap.indent(code(out[idx]).strip("\n"), "    ")
        reduce = "\n".join(textwrap.indent(s, "    ") for s in _renamed(p.reduce))
        finish = "\n".join(textwrap.indent(s, "    ") for s in _renamed(p.finish))
        keep = f"\n{plain}" if p.keep_y else ""
        new = statements(f"""
if sync_on:
    # this tile's partials are stored before it counts itself in its row of tiles; it waits for the row's count
    tl.debug_barrier()
    tl.atomic_add(sync_count_ptr + 1 + {p.pid_row}, 1, sem="release")
    # spin on plain loads (a read-modify-write per try would queue the row's last count behind the spinners),
    # then acquire once
    while tl.load(sync_count_ptr + 1 + {p.pid_row}, volatile=True) < {p.n_cols}:
        pass
    tl.atomic_add(sync_count_ptr + 1 + {p.pid_row}, 0, sem="acquire")
    # the row's partials in slot order (the slots past its tiles hold the reduction's identity: not read), then the
    # ops after the reduction on the tile still in registers
    sync_slots = tl.arange(0, SYNC_BLOCK_S)
    sync_ok = ({p.row_mask})[:, None] & (sync_slots < {p.n_cols})[None, :]
    sync_p = tl.load({p.part_param} + {p.rows}[:, None] * {p.stride_param} + sync_slots[None, :], mask=sync_ok,
                     other=0.0, volatile=True).to(tl.float32)
{reduce}
    sync_y = ({p.value}).to(tl.float32)
{finish}
    tl.store(sync_out_ptr + {p.rows}[:, None] * sync_stride_out + {p.cols}[None, :],
             sync_w.to(sync_out_ptr.dtype.element_ty), mask=({p.row_mask})[:, None] & {p.col_mask})
    tl.store(sync_count_ptr, 1){keep}
else:
{plain}
""")
        return block.with_changes(body=[*out[:idx], *new, *out[idx + 1:]])


def _stores(s: cst.CSTNode, p: SyncPlan) -> bool:
    return _store_to(parse_python(textwrap.dedent(code(s))), p.y_param) is not None


def _is_docstring(s: cst.BaseStatement) -> bool:
    return isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 and isinstance(s.body[0], cst.Expr) \
        and isinstance(s.body[0].value, (cst.SimpleString, cst.ConcatenatedString))


def apply(source: str, p: SyncPlan | None = None) -> str:
    """``source`` with the split row reduction's second pass finished in the GEMM's tile loop (see the module)."""
    p = p or plan(source)
    model = parse_kernel(source)
    taken = {n.id for n in ast.walk(model.tree) if isinstance(n, ast.Name)} | {
        a.arg for n in ast.walk(model.tree) if isinstance(n, ast.FunctionDef) for a in n.args.args}
    clash = sorted(taken & {*_KERNEL_NAMES, *_HOST_NAMES, "sync_flag_ptr"})
    if clash:
        raise NotApplicable(f"the source already uses {', '.join(clash)}")
    fwd = model.forward()
    top = list(fwd.body)
    gsites = [s for s in model.launches if s.kernel == p.gemm]
    csite = next(s for s in model.launches if s.kernel == p.combine)
    first = min(i for i, st in enumerate(top) if any(st.lineno <= s.line <= st.end_lineno for s in gsites))
    alloc = next((i for i, st in enumerate(top) if isinstance(st, ast.Assign) and len(st.targets) == 1
                  and isinstance(st.targets[0], ast.Name) and st.targets[0].id == p.out), None)
    if alloc is None or first == 0:
        raise NotApplicable(f"forward does not allocate {p.out} in a statement of its own after its first statement")
    if alloc > first:
        before = {t.id for st in top[:first] for t in ast.walk(st) if isinstance(t, ast.Name)
                  and isinstance(t.ctx, ast.Store)} | {a.arg for a in fwd.args.args}
        needs = {n.id for n in ast.walk(top[alloc].value) if isinstance(n, ast.Name)} - {"torch", "triton"}
        if needs - before:
            raise NotApplicable(f"{p.out} is allocated from {', '.join(sorted(needs - before))}, made after "
                                f"{p.gemm}'s launch")
    edits = Edits()
    moved = statements(ast.get_source_segment(model.source, top[alloc])) if alloc > first else []
    if alloc > first:
        edits.replace[top[alloc].lineno] = []
    gpu = f'{p.y}.device.type == "cuda"'
    edits.insert_after[top[first - 1].lineno] = [*moved, *statements(
        f"# one counter per row of tiles and a flag (slot 0): the GEMM's tiles of a row wait for each other\n"
        f"sync_counts = torch.zeros(({p.y}.shape[0] + 1,), device={p.y}.device, dtype=torch.int32)")]
    extra = {"sync_count_ptr": "sync_counts", "sync_out_ptr": p.out, "sync_stride_out": f"{p.out}.stride(0)",
             "sync_S": f"{p.part}.shape[1]", "SYNC_BLOCK_S": f"triton.next_power_of_2({p.part}.shape[1])",
             "SYNC": gpu, "launch_cooperative_grid": gpu}
    for s in gsites:
        edits.calls[s.line] = lambda call, extra=extra: set_call_kwargs(call, extra)
    edits.calls[csite.line] = lambda call: set_call_kwargs(call, {"sync_flag_ptr": "sync_counts"})
    host = apply_edits(source, edits)
    tr = _Kernels(p)
    out = cst.parse_module(host).visit(tr)
    if tr.done != {p.gemm, p.combine}:
        raise NotApplicable(f"the rewrite did not find {p.gemm}'s tile loop and {p.combine}'s body")
    return out.code
