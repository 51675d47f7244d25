"""GROUP_SIZE_M swizzle: tiles are visited in groups of GROUP_SIZE_M rows, so neighbours share L2 data.

Owns: planning and applying the grouped tile ordering for 2D-tiled kernels, in two forms:

- a 2D grid (``pid_m = tl.program_id(0)``, ``pid_n = tl.program_id(1)``, grid ``(cdiv(M, BM), cdiv(N, BN))``)
  becomes a 1D grid ``lambda META: (cdiv(M, META["BLOCK_M"]) * cdiv(N, META["BLOCK_N"]),)`` whose program id is
  mapped to (pid_m, pid_n) in grouped order;
- a persistent tile loop written by :mod:`xeforge.rewrite.persistent` (``pid_m = tile_id % num_pid_m``,
  ``pid_n = tile_id // num_pid_m``) gets the same grouped mapping of ``tile_id``.

``GROUP_SIZE_M`` becomes a constexpr parameter with a literal value at the launch, so the launch-parameter
search (and autotuning) can tune it. Kernels that already have a ``GROUP_SIZE_M``, 1D grids, and grids whose
axes are not both tile axes (``pid * BLOCK``) are left alone, with the reason.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import libcst as cst

from xeforge.kernel_model import KernelModel, dotted_name, parse_kernel
from xeforge.rewrite.tiling import KernelAnalysis, NotApplicable, is_tl_call
from xeforge.rewrite.tiling.grid import (GridTranslator, axis_tiles, fresh_name, launch_grid, program_id_vars,
                                         single_launch)
from xeforge.rewrite.cst_tools import statements
from xeforge.rewrite.tiling.edit import FunctionEdit, LaunchEdit, edit_function, edit_launch

PARAM = "GROUP_SIZE_M"


@dataclass
class SwizzlePlan:
    kernel: str
    form: str  # grid | persistent
    pid_m: str
    pid_n: str
    index: str  # the linear tile index (the program id or the persistent loop variable)
    num_m: str  # kernel expressions / names of the tile counts
    num_n: str
    lines: set[int]  # lines of the statements replaced
    grid_meta: list[str]  # host tile counts (grid form)
    group: int
    program_id: str = "tl.program_id(0)"  # how the grid form reads its linear id (keeps an int64 cast)

    def describe(self) -> str:
        where = "1D grid" if self.form == "grid" else "persistent tile loop"
        return f"{self.kernel}: grouped tile order on a {where}, {PARAM}={self.group}"


def _persistent_loop(fn: ast.FunctionDef) -> tuple[ast.For, str, str, str, str, str] | None:
    """(loop, index, pid_m, pid_n, num_m, num_n) of a persistent tile loop written by the persistent rewrite."""
    assigns = {st.targets[0].id: st.value for st in fn.body if isinstance(st, ast.Assign)
               and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)}
    for st in fn.body:
        if not (isinstance(st, ast.For) and isinstance(st.target, ast.Name) and isinstance(st.iter, ast.Call)
                and (dotted_name(st.iter.func) or "") in ("tl.range", "range") and len(st.iter.args) >= 2
                and any(is_tl_call(n, "program_id") for n in ast.walk(st.iter.args[0]))):
            continue
        idx = st.target.id
        if len(st.body) < 2:
            return None
        a, b = st.body[0], st.body[1]
        ok = all(isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)
                 and isinstance(s.value, ast.BinOp) and isinstance(s.value.left, ast.Name)
                 and s.value.left.id == idx and isinstance(s.value.right, ast.Name) for s in (a, b))
        if not ok or not isinstance(a.value.op, ast.Mod) or not isinstance(b.value.op, ast.FloorDiv) \
                or a.value.right.id != b.value.right.id:
            return None
        num_m = a.value.right.id
        stop = st.iter.args[1]
        total = assigns.get(stop.id) if isinstance(stop, ast.Name) else None
        if not (isinstance(total, ast.BinOp) and isinstance(total.op, ast.Mult)
                and isinstance(total.left, ast.Name) and isinstance(total.right, ast.Name)
                and total.left.id == num_m):
            return None
        return st, idx, a.targets[0].id, b.targets[0].id, num_m, total.right.id
    return None


def plan_swizzle(model: KernelModel, kernel: str, group: int) -> SwizzlePlan:
    fn = model.functions[kernel]
    if PARAM in fn.params or any(p.upper().startswith("GROUP_SIZE") for p in fn.constexpr_params):
        raise NotApplicable(f"{kernel} already has a {PARAM} swizzle")
    if not any(is_tl_call(n, "dot") for n in ast.walk(fn.node)):
        raise NotApplicable(f"{kernel} has no tl.dot: grouped ordering helps 2D-tiled GEMM-like kernels")
    site = single_launch(model, kernel)
    an = KernelAnalysis(fn)
    loop = _persistent_loop(fn.node)
    if loop is not None:
        st, idx, pm, pn, nm, nn = loop
        return SwizzlePlan(kernel, "persistent", pm, pn, idx, nm, nn, {st.body[0].lineno, st.body[1].lineno}, [],
                           group)
    pids, inline = program_id_vars(fn.node)
    if inline:
        raise NotApplicable(f"{kernel} calls tl.program_id inline (line {inline[0].lineno})")
    axes = sorted(p.axis for p in pids)
    if axes != [0, 1]:
        raise NotApplicable(f"{kernel} uses grid axes {axes}; the swizzle maps a 2D tile grid (axes 0 and 1)")
    pm = next(p for p in pids if p.axis == 0)
    pn = next(p for p in pids if p.axis == 1)
    for p in (pm, pn):
        if not axis_tiles(an, p.name):
            raise NotApplicable(f"grid axis {p.axis} ({p.name}) is not a tile axis ({p.name} * BLOCK + tl.arange)")
    grid = launch_grid(model, site)
    if grid is None or len(grid.elements) != 2:
        raise NotApplicable(f"the launch at line {site.line} does not use a 2-axis tuple grid")
    tr = GridTranslator(model, site, an, grid)
    counts = [tr.kernel_expr(el) for el in grid.elements]
    meta = [tr.meta_expr(el) for el in grid.elements]
    return SwizzlePlan(kernel, "grid", pm.name, pn.name, "", counts[0], counts[1], {pm.stmt.lineno, pn.stmt.lineno},
                       meta, group, pm.read(0) if pm.cast else "tl.program_id(0)")


def _mapping(plan: SwizzlePlan, taken: set[str], index: str, num_m: str, num_n: str) -> list[str]:
    in_group = fresh_name(taken, "num_pid_in_group")
    gid = fresh_name(taken, "group_id")
    first = fresh_name(taken, "first_pid_m")
    gsize = fresh_name(taken, "group_size_m")
    return [
        f"{in_group} = {PARAM} * {num_n}",
        f"{gid} = {index} // {in_group}",
        f"{first} = {gid} * {PARAM}",
        f"{gsize} = min({num_m} - {first}, {PARAM})",
        f"{plan.pid_m} = {first} + (({index} % {in_group}) % {gsize})",
        f"{plan.pid_n} = ({index} % {in_group}) // {gsize}",
    ]


def apply_swizzle(source: str, plan: SwizzlePlan) -> str:
    model = parse_kernel(source)
    fn = model.functions[plan.kernel]
    taken = {n.id for n in ast.walk(fn.node) if isinstance(n, ast.Name)} | set(fn.params)
    comment = cst.EmptyLine(comment=cst.Comment(f"# grouped tile order: {PARAM} rows of tiles at a time share "
                                                "the same columns of B in L2"))
    if plan.form == "grid":
        index = fresh_name(taken, "pid")
        taken.add(index)
        num_m = fresh_name(taken, "num_pid_m")
        taken.add(num_m)
        num_n = fresh_name(taken, "num_pid_n")
        taken.add(num_n)
        code = [f"{index} = {plan.program_id}", f"{num_m} = {plan.num_m}", f"{num_n} = {plan.num_n}",
                *_mapping(plan, taken, index, num_m, num_n)]
    else:
        code = _mapping(plan, taken, plan.index, plan.num_m, plan.num_n)
    new_stmts = [s for c in code for s in statements(c)]
    new_stmts[0] = new_stmts[0].with_changes(leading_lines=[comment])

    def body(original, updated, line_of):
        if plan.form == "grid":
            return replace_pairs(original, updated, line_of)
        out = []
        for o, u in zip(original, updated):
            if isinstance(o, cst.For) and any(line_of(s) in plan.lines for s in o.body.body):
                inner, placed = [], False
                for so, su in zip(o.body.body, u.body.body):
                    if line_of(so) in plan.lines:
                        if not placed:
                            inner.extend(new_stmts)
                            placed = True
                        continue
                    inner.append(su)
                u = u.with_changes(body=u.body.with_changes(body=inner))
            out.append(u)
        return out

    def replace_pairs(original, updated, line_of):
        out, placed = [], False
        for o, u in zip(original, updated):
            if line_of(o) in plan.lines:
                if not placed:
                    out.extend(new_stmts)
                    placed = True
                continue
            out.append(u)
        return out

    source = edit_function(source, FunctionEdit(plan.kernel, body=body, new_params=[f"{PARAM}: tl.constexpr"]))
    model = parse_kernel(source)
    site = single_launch(model, plan.kernel)
    edit = LaunchEdit(plan.kernel, site.line, set_kwargs={PARAM: str(plan.group)})
    if plan.form == "grid":
        grid = f"lambda META: ({' * '.join(plan.grid_meta)},)"
        g = launch_grid(model, site)
        if g is not None and g.variable and g.assign is not None and \
                sum(1 for n in ast.walk(model.tree) if isinstance(n, ast.Name) and n.id == g.variable
                    and isinstance(n.ctx, ast.Load)) == 1:
            edit.grid_assign = (g.assign.lineno, grid)
        else:
            edit.grid = grid
    return edit_launch(source, edit)


def rewrite(source: str, group: int = 8, kernel: str | None = None) -> tuple[str, SwizzlePlan]:
    model = parse_kernel(source)
    names = [kernel] if kernel else list(dict.fromkeys(s.kernel for s in model.launches))
    errors = []
    for name in names:
        try:
            plan = plan_swizzle(model, name, group)
        except NotApplicable as exc:
            errors.append(f"{name}: {exc}")
            continue
        return apply_swizzle(source, plan), plan
    raise NotApplicable("; ".join(errors) or "no kernel launch found")
