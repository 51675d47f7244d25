"""Tail split (device_tuning): a GEMM's last, part-filled wave of output tiles split over K, the full waves as written.

Owns: :func:`apply`, the rewrite, and the sizing helper it adds to the file (:data:`SIZE_FN`). At 3000 x 4096 x 3000
gemm_square's 128 x 256 tiles come to 288, 2.2 waves of an H100's 132 cores: the third wave keeps 24 cores busy for
as long as a full one, and no tile shape avoids it (the GEMM probe, docs/measurements/gemm-probe-h100-2026-12-07/:
no form above 0.68x of cuBLAS there; the rows' 6000-byte pitch is the other cause). Stream-K's answer, in its hybrid form, is to run the whole waves
data-parallel and share the last wave's work out over every core. This rewrite does that at slice granularity:
``forward`` launches the kernel as written on the programs of the whole waves, then ``<kernel>_tail`` on the rest,
SPLIT_K programs per tile, each over one slice of the K loop::

    tail_start, split_k = splitk_tail_size((g0, g1), steps, 132)   # computed per call, from the grid it launches
    if split_k > 1:
        if tail_start > 0:
            kernel[(tail_start, g1)](...)                          # whole waves, as written
        kernel_tail[(g0 - tail_start, g1, split_k)](..., ws, locks, tail_start, SPLIT_K=split_k)
    else:
        kernel[(g0, g1)](...)

In ``<kernel>_tail`` the axis-0 program id starts at ``tail_start``, so every program maps to the tile it would
have had (any tile order: a grouped 1D grid too). Each slice stores its fp32 (int32) partial tile to its own place
in a workspace, then counts itself in the tile's counter (``tl.atomic_add``, after a CTA barrier so that the
tile is written first); the slice that counts last adds the partial tiles in slice order, 0 first, and runs
everything the kernel did after its K loop — its epilogue and store, as written. The sum is the same bits whoever
counts last: deterministic, with no spinning (on the interpreter, which runs programs one at a time, too).

Measured on an H100 (2026-12-07, do_bench, docs/measurements/ports-h100-2026-12-07c): over gemm_square's port,
1.08x at 3072 x 4096 x 3072 (the same 288 tiles, rows 6144 bytes apart) and 0.93x at 3000 x 4096 x 3000, where rows
6000 bytes apart, off a 128-byte line, slow its slices more than they slow the kernel; gate 3 judges each port.

With no whole wave (fewer tiles than cores: a decode step) the same launch splits every tile, as split-K sized per
call does, without its second kernel (1.12x over the unsplit port at M = 16 in the same probe). Where the last wave
fills half the cores or more, or more than :data:`MAX_WAVES` whole waves come first (the idle share is small), the
kernel runs as written.

What it refuses, with the reason: a kernel split-K's plan does not fit (:mod:`splitk_plan`), an epilogue that reads
what the K loop assigns (other than the accumulator) or returns early, an accumulator that is not a 2D ``tl.zeros``
of block sizes the launch passes, and a grid the host cannot count before the launch.
"""

from __future__ import annotations

import ast
import textwrap

import libcst as cst

from xeforge.kernel_model import parent_map, parse_kernel
from xeforge.rewrite.cst_tools import (Edits, Parsed, apply_edits, call_name, expr, function_copy, is_tl,
                                      place_copies, set_call_kwargs, statements, walk)
from xeforge.rewrite.device_tuning.splitk import (PARAM, _host_names, _insert_before_model, _kernel_edits, host_steps,
                                                 host_tiles, node_at)
from xeforge.rewrite.device_tuning.splitk_plan import SplitPlan, _assigns_of, _top_index, _zeros
from xeforge.rewrite.tiling import NotApplicable, _kw, assigned_names
from xeforge.rewrite.tiling.dispatch import undispatch
from xeforge.rewrite.tiling.grid import fresh_name, gemm_kernels, launch_bindings, launch_grid
from xeforge.rewrite.tiling.pids import hoist_program_ids

__all__ = ["MAX_WAVES", "SIZE_FN", "apply", "behind_dispatch", "kernel_name", "size"]

#: the helper that sizes the tail per call
SIZE_FN = "splitk_tail_size"
#: the most whole waves before the tail for which it is split (beyond, the last wave's idle share is small)
MAX_WAVES = 4
#: the largest SPLIT_K (the fix-up unrolls its slices)
MOST = 32
#: the fewest K steps a slice keeps
MIN_SLICE_STEPS = 4

SIZE_FN_CODE = '''
def {name}(grid, steps, cores, most={most}, min_steps={min_steps}, max_waves={max_waves}):
    """(tail_start, SPLIT_K) for one launch of ``grid`` (its programs along each axis, one output tile each). The
    programs along axis 0 before ``tail_start`` fill whole waves of ``cores`` and run as written; the tiles after
    them, a last wave that would leave half the cores idle or more, run in SPLIT_K slices of the K loop (``steps``
    long; None where the host cannot tell), as many as keep them within one wave and ``min_steps`` K steps in
    each slice (any count: 24 tiles on 132 cores take 5). (0, 1), the kernel as written everywhere, where the last wave is fuller, where more than
    ``max_waves`` whole waves come before it, or where no split fits."""
    inner = 1
    for g in grid[1:]:
        inner *= g
    full = grid[0] * inner // cores
    if full > max_waves:
        return 0, 1
    start = full * cores // inner
    tail = (grid[0] - start) * inner
    if tail == 0:
        return 0, 1
    split = min(most, cores // tail, most if steps is None else steps // min_steps)
    return (start, split) if split > 1 else (0, 1)
'''


def size(grid: tuple[int, ...], steps: int | None, cores: int) -> tuple[int, int]:
    """What :data:`SIZE_FN` returns for ``grid`` (the same code, run here): (tail_start, SPLIT_K)."""
    return _SIZE(grid, steps, cores)


_namespace: dict = {}
exec(SIZE_FN_CODE.format(name="size_", most=MOST, min_steps=MIN_SLICE_STEPS, max_waves=MAX_WAVES), _namespace)
_SIZE = _namespace["size_"]


def kernel_name(kernel: str) -> str:
    """The name of the copy that runs the tail."""
    return f"{kernel}_tail"


class _OffsetAxis0(cst.CSTTransformer):
    """``tl.program_id(0)`` -> ``(tl.program_id(0) + start)``."""

    def __init__(self, start: str) -> None:
        super().__init__()
        self.start, self.count = start, 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not is_tl(call_name(updated), "program_id") or not updated.args:
            return updated
        axis = updated.args[0].value
        if not (isinstance(axis, cst.Integer) and axis.value == "0"):
            return updated
        self.count += 1
        return cst.parse_expression(f"(tl.program_id(0) + {self.start})")


def _tile_shape(fn: ast.FunctionDef, p: SplitPlan) -> tuple[list[str], str]:
    """The accumulator's two block sizes (kernel names or literals) and its dtype (float32 or int32), from its
    ``tl.zeros`` before the K loop."""
    first = min(lp.node.lineno for lp in p.loops)
    inits = [st for st in _assigns_of(fn, p.acc) if isinstance(st, ast.Assign) and st.lineno < first]
    if len(inits) != 1 or not _zeros(inits[0].value):
        raise NotApplicable(f"{p.kernel}: {p.acc} does not start from one tl.zeros before the K loop")
    call = inits[0].value
    shape = call.args[0] if call.args else _kw(call, "shape", 0)
    if not isinstance(shape, (ast.Tuple, ast.List)) or len(shape.elts) != 2 or \
            not all(isinstance(e, (ast.Name, ast.Constant)) for e in shape.elts):
        raise NotApplicable(f"{p.kernel}: {p.acc} is not a 2D tile of named block sizes "
                            f"({ast.unparse(shape) if shape is not None else 'no shape'}); the tail's workspace is "
                            "sized on the host from them")
    dtype = _kw(call, "dtype", 1)
    acc_dtype = "float32" if dtype is None else ast.unparse(dtype).rsplit(".", 1)[-1]
    if acc_dtype not in ("float32", "int32"):
        raise NotApplicable(f"{p.kernel}: {p.acc} accumulates in {acc_dtype} (the partial tiles are float32 or int32)")
    return [ast.unparse(e) for e in shape.elts], acc_dtype


def _tail(fn: ast.FunctionDef, p: SplitPlan) -> list[ast.stmt]:
    """The kernel's top-level statements after its last K loop: what the slice that counts last runs."""
    parents = parent_map(fn)
    at = {lp.node.lineno for lp in p.loops}  # the plan's nodes are of its own parse: found again by line
    loops = [n for n in ast.walk(fn) if isinstance(n, ast.For) and n.lineno in at]
    last = max(_top_index(fn, lp, parents) for lp in loops)
    tail = fn.body[last + 1:]
    if not tail:
        raise NotApplicable(f"{p.kernel} does nothing after its K loop")
    if any(isinstance(n, ast.Return) for st in tail for n in ast.walk(st)):
        raise NotApplicable(f"{p.kernel} returns from its epilogue; the tail's fix-up runs it under an if")
    inside = set().union(*(assigned_names(lp.body) | assigned_names([lp]) for lp in loops)) - {p.acc}
    read = {n.id for st in tail for n in ast.walk(st) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if inside & read:
        raise NotApplicable(f"{p.kernel}'s epilogue reads {', '.join(sorted(inside & read))}, which the K loop "
                            "assigns: a slice that ends early would leave another value there")
    return tail


def apply(source: str, p: SplitPlan, cores: int, line: int | None = None) -> str:
    """``source`` with the tail split of ``p`` (a plan made on the source with its program ids hoisted), sized per
    call for ``cores`` cores; NotApplicable with the reason where it does not fit. ``line``: the launch to rewrite
    where the kernel has several (a per-shape dispatch's ``else`` branch: :func:`behind_dispatch`); ``p`` is then
    the plan of the source with that dispatch undone, whose kernel is this one, line for line."""
    source = hoist_program_ids(source)
    model = parse_kernel(source)
    fn = model.functions[p.kernel].node
    parsed = Parsed.of(source)
    shape, acc_dtype = _tile_shape(fn, p)
    tail = _tail(fn, p)

    edits, pid_k = _kernel_edits(model, parsed, p, slices=False)
    taken = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} | set(model.functions[p.kernel].params) | {pid_k}
    ws, locks, start, tile, offs, base, count, s_i = (
        fresh_name(taken, n) for n in ("ws_ptr", "lock_ptr", "tail_start", "tail_tile", "ws_offs", "ws_tile",
                                       "arrived", "s"))
    edits.params[p.kernel] = [ws, locks, start, f"{PARAM}: tl.constexpr"]

    # axis 0 starts where the whole waves end, so each program maps to the tile it would have had
    pid0 = node_at(parsed, cst.SimpleStatementLine, p.pid_lines[0])
    offset = _OffsetAxis0(start)
    moved = pid0.visit(offset)
    if offset.count != 1:
        raise NotApplicable(f"{p.kernel}: line {p.pid_lines[0]} does not read tl.program_id(0) once")
    edits.replace[p.pid_lines[0]] = [moved.with_changes(leading_lines=[])]

    bm, bn = shape
    size = f"{bm} * {bn}"
    which = "tl.program_id(0)" if p.axis == 1 else "tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)"
    lines = source.splitlines()
    body = textwrap.dedent("\n".join(lines[tail[0].lineno - 1:tail[-1].end_lineno]))
    load = f"tl.load({base} + {{off}}{offs}, cache_modifier=\".cg\")"
    fixup = [
        f"# tail split: this slice's partial tile to its place in the workspace; the slice of the tile that counts",
        "# itself last adds them all in slice order and runs the epilogue (the same sum whichever slice that is)",
        f"{tile} = {which}",
        f"{offs} = tl.arange(0, {bm})[:, None] * {bn} + tl.arange(0, {bn})[None, :]",
        f"{base} = {ws} + {tile} * ({PARAM} * {size})",
        f"tl.store({base} + {pid_k} * ({size}) + {offs}, {p.acc})",
        "tl.debug_barrier()  # the whole tile is stored before the count says so",
        f"{count} = tl.atomic_add({locks} + {tile}, 1)",
        f"if {count} == {PARAM} - 1:",
        f"    {p.acc} = {load.format(off='')}",
        f"    for {s_i} in tl.static_range(1, {PARAM}):",
        f"        {p.acc} += {load.format(off=f'{s_i} * ({size}) + ')}",
        textwrap.indent(body, "    "),
    ]
    for i, st in enumerate(tail):
        edits.replace[st.lineno] = statements("\n".join(fixup)) if i == 0 else []
    try:
        tail_fn = function_copy(apply_edits(source, edits, parsed), p.kernel, kernel_name(p.kernel))
    except LookupError as exc:
        raise NotApplicable(str(exc)) from None
    return _host(source, model, parsed, p, tail_fn, shape, acc_dtype, cores, (ws, locks, start), line)


def behind_dispatch(source: str) -> tuple[str, str, int] | None:
    """For a GEMM kernel launched from a per-shape dispatch (``if M <= 128: kernel[...](...) else: kernel[...](...)``,
    the per-shape-config tactic's): (the source with the dispatch undone, the kernel, the line of the ``else``
    launch here), where the kernel's text and lines are the same in both, so a plan made on the first applies to
    this source at that launch; None where there is no such dispatch. The ``else`` launch is the one the shapes
    outside every branch's class run (the primary shape's, and an odd one's)."""
    source = hoist_program_ids(source)
    model = parse_kernel(source)
    for kernel in gemm_kernels(model):
        sites = [s for s in model.launches if s.kernel == kernel]
        if len(sites) < 2:
            continue
        undone = undispatch(source, kernel)
        if undone is None:
            continue
        base = hoist_program_ids(undone[0])
        fn, other = model.functions[kernel].node, parse_kernel(base).functions[kernel].node
        if (fn.lineno, fn.end_lineno) != (other.lineno, other.end_lineno) or \
                ast.dump(fn) != ast.dump(other):
            continue
        return base, kernel, max(s.line for s in sites)
    return None


def _host(source: str, model, parsed: Parsed, p: SplitPlan, tail_fn: cst.FunctionDef, shape: list[str],
          acc_dtype: str, cores: int, params: tuple[str, str, str], line: int | None) -> str:
    """The launch becomes the sizing, the whole waves' launch, the tail's and, where nothing splits, the launch as
    written; the copy goes right after the kernel and the sizing helper before ``Model``."""
    site, host, split_var, _ = _host_names(model, p, line)
    fn = model.functions[p.kernel]
    elems = host_tiles(model, site, launch_grid(model, site))
    bind = launch_bindings(site, fn, source)
    sizes = []
    for s in shape:
        value = bind.get(s, s if s.isdigit() else "").strip()
        if not value:
            raise NotApplicable(f"{p.kernel}'s tile size {s} is not passed at the launch (line {site.line}); the "
                                "host sizes the tail's workspace from it")
        sizes.append(f"({value})" if not value.isidentifier() and not value.isdigit() else value)
    steps = host_steps(model, p.kernel, (p.start, p.stop, p.step), site) or "None"
    names = {n.id for n in ast.walk(host) if isinstance(n, ast.Name)} | {a.arg for a in host.args.args} | {split_var}
    grid_v, start_v, ws_v, locks_v = (fresh_name(names, n) for n in ("tail_grid", "tail_start", f"{p.out_host}_ws",
                                                                      f"{p.out_host}_locks"))
    launch = next(n for n in walk(parsed.module) if isinstance(n, cst.Call) and parsed.line(n) == site.line
                  and isinstance(n.func, cst.Subscript))
    code = cst.Module([]).code_for_node

    def relaunch(name: str, grid_text: str, extra: dict[str, str]) -> str:
        el = launch.func.slice[0]
        c = launch.with_changes(func=cst.Subscript(value=cst.Name(name), slice=[
            el.with_changes(slice=cst.Index(value=expr(grid_text)))]))
        return code(set_call_kwargs(c, extra))

    rest = "" if len(elems) == 1 else f", {grid_v}[1]"
    tiles = f"{grid_v}[0] - {start_v}" if len(elems) == 1 else f"({grid_v}[0] - {start_v}) * {grid_v}[1]"
    ws, locks, start = params
    block = [
        f"# tail split ({SIZE_FN}): whole waves of the {cores} cores run {p.kernel} as written; the tiles of a "
        "last wave",
        f"# that would leave half of them idle run {split_var} slices of K each ({kernel_name(p.kernel)}), added "
        "in slice order",
        f"{grid_v} = ({', '.join(elems)}{',' if len(elems) == 1 else ''})",
        f"{start_v}, {split_var} = {SIZE_FN}({grid_v}, {steps}, {cores})",
        f"if {split_var} > 1:",
        f"    if {start_v} > 0:",
        textwrap.indent(relaunch(p.kernel, f"({start_v}{rest or ','})", {}), "        "),
        f"    {ws_v} = torch.empty((({tiles}) * {split_var} * {sizes[0]} * {sizes[1]},), device={p.out_host}.device, "
        f"dtype=torch.{acc_dtype})",
        f"    {locks_v} = torch.zeros(({tiles},), device={p.out_host}.device, dtype=torch.int32)",
        textwrap.indent(relaunch(kernel_name(p.kernel), f"({grid_v}[0] - {start_v}{rest}, {split_var})",
                                 {ws: ws_v, locks: locks_v, start: start_v, PARAM: split_var}), "    "),
        "else:",
        textwrap.indent(code(launch), "    "),
    ]
    statement = next((st for st in ast.walk(host) if isinstance(st, ast.Expr) and st.value is site.node), None)
    if statement is None:
        raise NotApplicable(f"the launch of {p.kernel} at line {site.line} is part of a larger statement; the tail "
                            "split replaces a launch that is a statement of its own")
    host_edits = Edits()
    host_edits.replace[statement.lineno] = statements("\n".join(block))
    try:
        out = place_copies(apply_edits(source, host_edits, parsed), p.kernel, [tail_fn], keep=True)
    except LookupError as exc:
        raise NotApplicable(f"the tail split could not be placed ({exc})") from None
    return _insert_before_model(out, SIZE_FN, SIZE_FN_CODE.format(name=SIZE_FN, most=MOST, min_steps=MIN_SLICE_STEPS,
                                                                  max_waves=MAX_WAVES))
