"""GROUP_SIZE_M swizzle: tiles are visited in groups of GROUP_SIZE_M rows, so neighbours share L2 data.

Owns: planning and applying the grouped tile ordering for 2D-tiled kernels, in three forms:

- a 2D grid (``pid_m = tl.program_id(0)``, ``pid_n = tl.program_id(1)``, grid ``(cdiv(M, BM), cdiv(N, BN))``)
  becomes a 1D grid ``lambda META: (cdiv(M, META["BLOCK_M"]) * cdiv(N, META["BLOCK_N"]),)`` whose program id is
  mapped to (pid_m, pid_n) in grouped order;
- a 1D grid whose program id is split into the tile indices by ``//`` and ``%`` of one tile count, row-major
  (``pid_m = pid // num_pid_n``, ``pid_n = pid % num_pid_n``, ``num_pid_n = tl.cdiv(N, BLOCK_N)``) or
  column-major (``pid_m = pid % num_pid_m``, ``pid_n = pid // num_pid_m``), the count named or inline: the two
  split statements become the grouped mapping of ``pid`` (the other tile count is computed in the kernel from the
  bound and block of its tile axis). Which index is the row comes from the stored tile (the index on its first
  dimension), never from names. The grid is left as it is: it must be the product of the two tile counts;
- a persistent tile loop written by :mod:`xeforge.rewrite.persistent` (``pid_m = tile_id % num_pid_m``,
  ``pid_n = tile_id // num_pid_m``) gets the same grouped mapping of ``tile_id``.

``GROUP_SIZE_M`` becomes a constexpr parameter with a literal value at the launch, so the launch-parameter
search (and autotuning) can tune it. Left alone, with the reason: kernels that already have a ``GROUP_SIZE_M``;
grids whose axes are not both tile axes (``pid * BLOCK``); 1D grids without the ``//``/``%`` split, whose tile
count is not ``tl.cdiv(bound, BLOCK)`` of the ``%`` index's tile axis in the kernel (a count passed as a kernel
argument, computed on the host, is refused: nothing in the kernel ties it to the tiles), or whose grid is not the
product of the two tile counts.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import libcst as cst

from xeforge.kernel_model import KernelModel, dotted_name, parse_kernel, segment_of
from xeforge.rewrite.tiling import BlockPtr, KernelAnalysis, Mask, NotApplicable, Poly, Ptr, is_tl_call
from xeforge.rewrite.tiling.grid import (GridTranslator, PidVar, axis_tiles, fresh_name, launch_bindings,
                                         launch_grid, launched_kernels_gemm_first, no_dot_reason, program_id_vars,
                                         single_launch)
from xeforge.rewrite.cst_tools import statements
from xeforge.rewrite.tiling.edit import FunctionEdit, LaunchEdit, edit_function, edit_launch
from xeforge.rewrite.tiling.pids import hoist_program_ids

PARAM = "GROUP_SIZE_M"


@dataclass
class SwizzlePlan:
    kernel: str
    form: str  # grid (a 2D grid made 1D) | grid1d (a 1D grid split by // and %, left as it is) | persistent
    pid_m: str
    pid_n: str
    index: str  # the linear tile index (the program id or the persistent loop variable)
    num_m: str  # kernel expressions / names of the tile counts
    num_n: str
    lines: set[int]  # lines of the statements replaced
    grid_meta: list[str]  # host tile counts (grid form)
    group: int
    program_id: str = "tl.program_id(0)"  # how the grid form reads its linear id (keeps an int64 cast)
    order: str = ""  # grid1d: row-major | column-major (how the kernel split its program id)

    def describe(self) -> str:
        if self.form == "grid":
            where = "1D grid (was a 2D grid)"
        elif self.form == "grid1d":
            where = (f"{self.order} 1D grid ({self.pid_m}, {self.pid_n} from {self.index} by // and %; the grid is "
                     "left as it is)")
        else:
            where = "persistent tile loop"
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


# ------------------------------------------------------------------------------------------------ the 1D grid form
_CDIV = ("tl.cdiv", "triton.cdiv", "triton.language.cdiv")


def _src(node: ast.AST) -> str:
    return ast.unparse(node)


def _param_symbol(an: KernelAnalysis, poly: object) -> str | None:
    """``name`` when ``poly`` is exactly one run-time kernel parameter that the kernel never reassigns."""
    name = poly.single_symbol() if isinstance(poly, Poly) else None
    if name and name in an.params and name not in an.constexprs and an.counts.get(name, 0) == 0:
        return name
    return None


def _cdiv_of(an: KernelAnalysis, node: ast.AST) -> tuple[str, str] | None:
    """(bound parameter, block constexpr) of kernel code ``tl.cdiv(bound, BLOCK)`` or ``(bound + BLOCK - 1) // BLOCK``."""
    if isinstance(node, ast.Call) and (dotted_name(node.func) or "") in _CDIV and len(node.args) == 2 \
            and not node.keywords:
        num, blk = node.args
        bound = _param_symbol(an, an.eval(num))
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
        num, blk = node.left, node.right
        value = an.eval(num)
        bound = _param_symbol(an, value - Poly.sym(blk.id) + Poly.const(1)) \
            if isinstance(value, Poly) and isinstance(blk, ast.Name) else None
    else:
        return None
    if bound is None or not (isinstance(blk, ast.Name) and blk.id in an.constexprs):
        return None
    return bound, blk.id


def _tile_count(an: KernelAnalysis, fn: ast.FunctionDef, node: ast.AST, before: int,
                host: dict[str, str]) -> tuple[str, str]:
    """(bound, block) of the tile count a split divides by: ``tl.cdiv(bound, BLOCK)`` inline, or a name assigned
    that once, at the top level, before the split."""
    if not isinstance(node, ast.Name):
        found = _cdiv_of(an, node)
        if found is None:
            raise NotApplicable(f"the tile count {_src(node)} is not tl.cdiv(<bound>, <BLOCK>) of kernel arguments")
        return found
    name = node.id
    if name in an.params:
        passed = f" (the launch passes {host[name]})" if host.get(name) else ""
        raise NotApplicable(f"the tile count {name} is a kernel argument computed on the host{passed}: nothing in the "
                            f"kernel ties it to the tiles; compute it in the kernel as tl.cdiv(<bound>, <BLOCK>)")
    defs = [st for st in fn.body if isinstance(st, ast.Assign) and len(st.targets) == 1
            and isinstance(st.targets[0], ast.Name) and st.targets[0].id == name]
    if an.counts.get(name, 0) != 1 or len(defs) != 1 or defs[0].lineno >= before:
        raise NotApplicable(f"the tile count {name} is not assigned once, at the top level of the kernel, before "
                            f"line {before}")
    found = _cdiv_of(an, defs[0].value)
    if found is None:
        raise NotApplicable(f"the tile count {name} = {_src(defs[0].value)} (line {defs[0].lineno}) is not "
                            "tl.cdiv(<bound>, <BLOCK>) of kernel arguments")
    return found


def _stored_dims(an: KernelAnalysis, index: str) -> set[int]:
    """Dimensions of the stored tiles on which ``index`` (times a block constexpr) places its rows or columns."""
    dims: set[int] = set()

    def scan(dim: int, start: object) -> None:
        if isinstance(start, Poly):
            for mono, coef in start.terms:
                if coef and index in mono and len(mono) == 2 and any(s in an.constexprs for s in mono):
                    dims.add(dim)

    for acc in an.accesses:
        if acc.kind != "store":
            continue
        if isinstance(acc.mask, Mask) and acc.mask.rank == 2:
            for b in acc.mask.bounds:
                scan(b.dim, b.vec.start)
        if isinstance(acc.ptr, Ptr) and acc.ptr.rank == 2:
            for t in acc.ptr.offs.terms:
                scan(t.dim, t.vec.start)
        if isinstance(acc.ptr, BlockPtr) and len(acc.ptr.offsets) == 2:
            for d, off in enumerate(acc.ptr.offsets):
                scan(d, off)
    return dims


def _one_tile_axis(an: KernelAnalysis, index: str) -> tuple[str, str]:
    """(bound parameter, block constexpr) of the one tile axis of ``index``."""
    tiles = axis_tiles(an, index)
    if not tiles:
        raise NotApplicable(f"{index} is not a tile axis ({index} * BLOCK + tl.arange compared to a bound)")
    pairs = {(_param_symbol(an, bound), blk) for blk, bound in tiles}
    if len(pairs) != 1 or None in next(iter(pairs)):
        shown = ", ".join(f"{blk} over {bound.code()}" for blk, bound in tiles)
        raise NotApplicable(f"{index} tiles {shown}: the swizzle needs one block over one kernel argument")
    return next(iter(pairs))


def _plan_1d(model: KernelModel, kernel: str, an: KernelAnalysis, pid: PidVar, group: int) -> SwizzlePlan:
    """The grouped mapping of a 1D grid split by ``//`` and ``%`` (see the module docstring)."""
    fn = model.functions[kernel].node
    site = single_launch(model, kernel)
    host = launch_bindings(site, model.functions[kernel], model.source)
    name = pid.name
    splits: dict[type, list[ast.Assign]] = {ast.FloorDiv: [], ast.Mod: []}
    for st in fn.body:
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) \
                and isinstance(st.value, ast.BinOp) and type(st.value.op) in splits \
                and isinstance(st.value.left, ast.Name) and st.value.left.id == name:
            splits[type(st.value.op)].append(st)
    div, mod = splits[ast.FloorDiv], splits[ast.Mod]
    if len(div) != 1 or len(mod) != 1:
        raise NotApplicable(f"{kernel} uses grid axes [0] but does not split {name} into two tile indices by one "
                            f"`{name} // count` and one `{name} % count` at its top level; the swizzle maps a 2D "
                            "tile grid (axes 0 and 1) or such a split")
    div, mod = div[0], mod[0]
    first = min(div.lineno, mod.lineno)
    counts = [_tile_count(an, fn, st.value.right, first, host) for st in (div, mod)]
    if counts[0] != counts[1]:
        raise NotApplicable(f"{kernel} splits {name} by two different tile counts ({_src(div.value.right)} and "
                            f"{_src(mod.value.right)})")
    slow, fast = div.targets[0].id, mod.targets[0].id
    for v in (name, slow, fast):
        if an.counts.get(v, 0) != 1:
            raise NotApplicable(f"{v} is assigned more than once in {kernel}")
    count_bound, count_block = counts[1]
    fast_bound, fast_block = _one_tile_axis(an, fast)
    if (fast_bound, fast_block) != (count_bound, count_block):
        raise NotApplicable(f"the tile count {_src(mod.value.right)} is cdiv({count_bound}, {count_block}), but "
                            f"{fast} = {name} % count tiles {fast_bound} by {fast_block}: not the count of its tiles")
    slow_bound, slow_block = _one_tile_axis(an, slow)
    dims = (_stored_dims(an, slow), _stored_dims(an, fast))
    if dims == ({0}, {1}):
        order, pm, pn = "row-major", slow, fast
    elif dims == ({1}, {0}):
        order, pm, pn = "column-major", fast, slow
    else:
        raise NotApplicable(f"cannot tell which of {slow}, {fast} indexes the rows of the stored tile "
                            f"(dimensions {sorted(dims[0])} and {sorted(dims[1])})")
    fast_count = _src(mod.value.right) if isinstance(mod.value.right, ast.Name) else \
        f"tl.cdiv({count_bound}, {count_block})"
    slow_count = f"tl.cdiv({slow_bound}, {slow_block})"
    num_m, num_n = (slow_count, fast_count) if order == "row-major" else (fast_count, slow_count)
    # the grid stays: it must launch exactly one program per tile
    grid = launch_grid(model, site)
    if grid is None or len(grid.elements) != 1:
        raise NotApplicable(f"the launch at line {site.line} does not use a 1-element tuple (or META lambda) grid")
    el = grid.elements[0]
    want = sorted([f"tl.cdiv({slow_bound}, {slow_block})", f"tl.cdiv({count_bound}, {count_block})"])
    shown = segment_of(model.source, el) or _src(el)
    tr = GridTranslator(model, site, an, grid)

    def factors(node: ast.AST) -> list[str]:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return factors(node.left) + factors(node.right)
        return [tr.kernel_expr(node)]

    try:
        got = sorted(factors(el))
    except NotApplicable as exc:
        raise NotApplicable(f"the grid ({shown},) at line {site.line} is not the product of the two tile counts "
                            f"{' * '.join(want)}: {exc}") from None
    if got != want:
        raise NotApplicable(f"the grid ({shown},) at line {site.line} is {' * '.join(got)} in kernel terms, not the "
                            f"product of the two tile counts {' * '.join(want)}")
    return SwizzlePlan(kernel, "grid1d", pm, pn, name, num_m, num_n, {div.lineno, mod.lineno}, [], group,
                       order=order)


def plan_swizzle(model: KernelModel, kernel: str, group: int) -> SwizzlePlan:
    fn = model.functions[kernel]
    if PARAM in fn.params or any(p.upper().startswith("GROUP_SIZE") for p in fn.constexpr_params):
        raise NotApplicable(f"{kernel} already has a {PARAM} swizzle")
    if not any(is_tl_call(n, "dot") for n in ast.walk(fn.node)):
        raise NotApplicable(no_dot_reason(model, kernel, "grouped ordering",
                                          "grouped ordering helps 2D-tiled GEMM-like kernels"))
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
    if axes == [0]:
        return _plan_1d(model, kernel, an, pids[0], group)
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
    source = hoist_program_ids(source)  # as :func:`rewrite` planned it
    model = parse_kernel(source)
    fn = model.functions[plan.kernel]
    taken = {n.id for n in ast.walk(fn.node) if isinstance(n, ast.Name)} | set(fn.params)
    comment = cst.EmptyLine(comment=cst.Comment(f"# grouped tile order: {PARAM} rows of tiles at a time share "
                                                "the same columns of B in L2"))
    if plan.form == "grid1d":
        # the split statements become the grouped mapping of the program id; a count the kernel did not name is
        # computed once, before it
        pre, counts = [], []
        for base, count in (("num_pid_m", plan.num_m), ("num_pid_n", plan.num_n)):
            if not count.isidentifier():
                var = fresh_name(taken, base)
                taken.add(var)
                pre.append(f"{var} = {count}")
                count = var
            counts.append(count)
        code = [*pre, *_mapping(plan, taken, plan.index, counts[0], counts[1])]
    elif plan.form == "grid":
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
        if plan.form in ("grid", "grid1d"):
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
    source = hoist_program_ids(source)  # inline program ids: one name each at the top, to remap
    model = parse_kernel(source)
    names = [kernel] if kernel else launched_kernels_gemm_first(model)
    errors = []
    for name in names:
        try:
            plan = plan_swizzle(model, name, group)
        except NotApplicable as exc:
            errors.append(f"{name}: {exc}")
            continue
        return apply_swizzle(source, plan), plan
    raise NotApplicable("; ".join(errors) or "no kernel launch found")
