"""Persistent-kernel rewrite: one program per core walks the tiles, instead of one program per tile.

Owns: planning and applying the persistent stage's codemod. A kernel whose program ids are assigned at the
top (``pid_m = tl.program_id(0)``, ``pid_n = tl.program_id(1)``, or one ``pid``) and whose grid axes are
``cdiv(<kernel argument>, <block>)`` (or products of them) becomes::

    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    <loop-invariant statements, hoisted: aranges, descriptors>
    for tile_id in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        pid_m = tile_id % num_pid_m          # the 2D grid's order: axis 0 fastest
        pid_n = tile_id // num_pid_m
        <the rest of the body, once per tile>

and the launch gets ``grid = lambda META: (min(num_programs, <tiles from META>),)`` with the program count read
from the device at run time (SMs on NVIDIA, Xe-cores on Intel, a few on the CPU interpreter) by a small
module-level helper. Block sizes stay tunable: the grid follows ``META``. A grid count the kernel is not given but
no block divides (a row count the wrapper reads off a shape, ``(x2d.shape[0],)``; a batch size) is passed in as a
new argument ``NUM_PID_<axis>``; a pointer parameter each tile advances in place (``X += row * stride``, the row
kernels' form) becomes a per-tile local (``X_tile = X + (row * stride)``), so every tile starts from the pointer the
kernel was given. A kernel's early exits at its top level become guards of the tile's work (``if c: return``
and the rest become ``if not (c): <the rest>``), and a grid counted from a size the wrapper computes
(``cdiv(max_seqlen, BLOCK_M)``) passes that size in as ``GRID_SIZE_<axis>`` for the kernel to divide by its block.
A kernel with a ``return`` inside a block, inline ``tl.program_id`` uses, a grid axis the kernel cannot recompute
(a size made by a call), or another name carried from before the loop and reassigned inside it is left alone, with
the reason.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from dataclasses import dataclass

import libcst as cst

from xeforge.kernel_model import KernelModel, dotted_name, early_returns, literal, parse_kernel
from xeforge.rewrite.memory import launch_facts
from xeforge.rewrite.tiling import KernelAnalysis, NotApplicable, _assign_counts, is_tl_call, names_in
from xeforge.rewrite.tiling.grid import (GridTranslator, enclosing_function, fresh_name, launch_bindings, launch_grid,
                                         launched_kernels_gemm_first, program_id_vars, single_launch)
from xeforge.rewrite.cst_tools import (Edits, Parsed, apply_edits, arg, call_name, code, expr, is_tl,
                                       set_call_kwargs, statements, walk)
from xeforge.rewrite.tiling.edit import FunctionEdit, LaunchEdit, add_module_function, edit_function, edit_launch
from xeforge.rewrite.tiling.pids import hoist_program_ids

HELPER = "_device_core_count"
HELPER_CODE = f'''
def {HELPER}(device):
    """Programs for a persistent launch: one per SM (NVIDIA) or Xe-core (Intel); a few on the CPU interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    if device.type == "xpu":
        index = device.index if device.index is not None else torch.xpu.current_device()
        return triton.runtime.driver.active.utils.get_device_properties(index)["multiprocessor_count"]
    return 2
'''
#: calls whose results differ per program or have effects: never hoisted out of the tile loop
_UNHOISTABLE = ("load", "store", "atomic_add", "atomic_max", "atomic_min", "atomic_cas", "atomic_xchg",
                "atomic_and", "atomic_or", "atomic_xor", "program_id", "rand", "randn", "randint", "debug_barrier",
                "device_print", "device_assert", "inline_asm_elementwise")
_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass
class PersistentPlan:
    kernel: str
    pids: list[str]  # by axis
    start: str  # the first tile of this program: tl.program_id(0), with the kernel's int64 cast if it had one
    counts: list[str]  # kernel-side tile counts per axis
    meta: list[str]  # host-side tile counts per axis, in META terms
    first: int  # index of the first program-id statement in the body
    pid_lines: set[int]
    hoisted: list[int]  # indices of body statements hoisted before the loop
    device_arg: str  # host tensor expression whose .device sizes the grid
    grid: object  # GridInfo
    site: object  # LaunchSite
    passed: dict[str, str] = dataclasses.field(default_factory=dict)  # new kernel argument -> the host count it gets
    #: pointer parameters a tile advances in place (``X += row * stride``) -> the per-tile local that replaces them
    advanced: dict[str, str] = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        axes = " x ".join(self.counts)
        return (f"{self.kernel}: persistent loop over {axes} tiles, one program per core "
                f"({len(self.hoisted)} loop-invariant statement(s) hoisted)")


def is_persistent(fn_node: ast.FunctionDef) -> bool:
    """A loop whose range starts from the program id (read inline or through a name assigned from it)."""
    from_pid = {t.id for st in ast.walk(fn_node) if isinstance(st, ast.Assign)
                and any(is_tl_call(a, "program_id") for a in ast.walk(st.value))
                for t in st.targets if isinstance(t, ast.Name)}
    for node in ast.walk(fn_node):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and node.iter.args and \
                (any(is_tl_call(a, "program_id") for a in ast.walk(node.iter)) or
                 names_in(node.iter.args[0]) & from_pid):
            return True
    return False


def _base_params(fn_node: ast.FunctionDef) -> set[str]:
    """Parameters a descriptor or block pointer of the kernel is based on (``base=Q + off``), or a pointer it loads
    or stores through (``tl.load(q_ptrs)``), through the names that make them."""
    params = {a.arg for a in fn_node.args.args}
    made: dict[str, set[str]] = {}
    for st in ast.walk(fn_node):
        if isinstance(st, ast.Assign):
            for t in st.targets:
                if isinstance(t, ast.Name):
                    made.setdefault(t.id, set()).update(names_in(st.value))
    todo: set[str] = set()
    for n in ast.walk(fn_node):
        name = (dotted_name(n.func) or "") if isinstance(n, ast.Call) else ""
        if name.endswith(("make_tensor_descriptor", "make_block_ptr")) or name in ("tl.load", "tl.store"):
            key = "base" if name.endswith(("make_tensor_descriptor", "make_block_ptr")) else "pointer"
            base = n.args[0] if n.args else next((k.value for k in n.keywords if k.arg == key), None)
            todo |= names_in(base) if base is not None else set()
    seen: set[str] = set()
    while todo:
        x = todo.pop()
        if x not in seen:
            seen.add(x)
            todo |= made.get(x, set())
    return seen & params


def _hoistable_assign(st: ast.stmt, counts: dict[str, int], dependent: set[str]) -> bool:
    if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)):
        return False
    if counts.get(st.targets[0].id, 0) != 1:
        return False
    if names_in(st.value) & dependent:
        return False
    return not any(isinstance(n, ast.Call) and any(is_tl_call(n, c) for c in _UNHOISTABLE)
                   for n in ast.walk(st.value))


def _advances_only(rest: list[tuple[int, ast.stmt]], name: str) -> bool:
    """Every assignment of ``name`` in the tile's statements is a top-level ``name += ...`` (nothing nested in an
    ``if`` or a loop, where a tile might skip it)."""
    top = [st for _, st in rest if isinstance(st, ast.AugAssign) and isinstance(st.target, ast.Name)
           and st.target.id == name and isinstance(st.op, ast.Add)]
    return bool(top) and len(top) == _assign_counts([st for _, st in rest]).get(name, 0)


class _Advance(cst.CSTTransformer):
    """In the tile loop's statements: the first ``X += d`` becomes ``X_tile = X + (d)``, and ``X`` is ``X_tile``
    after it (so each tile starts from the parameter as the kernel received it)."""

    def __init__(self, advanced: dict[str, str]) -> None:
        self.advanced, self.started = advanced, set()

    def rename(self, stmt: cst.BaseStatement) -> cst.BaseStatement:
        line = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
        if isinstance(line, cst.AugAssign) and isinstance(line.target, cst.Name) and \
                line.target.value in self.advanced and line.target.value not in self.started:
            name = line.target.value
            rhs = line.value.visit(self)
            self.started.add(name)
            new = statements(f"{self.advanced[name]} = {name} + ({code(rhs)})")[0]
            return new.with_changes(leading_lines=stmt.leading_lines, trailing_whitespace=stmt.trailing_whitespace)
        return stmt.visit(self)

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        if updated.value in self.started:
            return updated.with_changes(value=self.advanced[updated.value])
        return updated


def _plain_count(el: ast.AST) -> bool:
    """A grid element that counts programs without dividing by a block: ``x2d.shape[0]``, ``batch * heads``."""
    return not any((isinstance(n, ast.Call) and not (isinstance(n.func, ast.Attribute) and n.func.attr in
                                                     ("size", "numel")))
                   or (isinstance(n, ast.BinOp) and not isinstance(n.op, (ast.Mult, ast.Add))) for n in ast.walk(el))


def plan_persistent(model: KernelModel, kernel: str) -> PersistentPlan:
    fn = model.functions[kernel]
    if is_persistent(fn.node):
        raise NotApplicable(f"{kernel} already loops over tiles from tl.program_id (persistent)")
    site = single_launch(model, kernel)
    pids, inline = program_id_vars(fn.node)
    if inline:
        raise NotApplicable(f"{kernel} calls tl.program_id inline (line {inline[0].lineno}); the rewrite needs "
                            "`pid = tl.program_id(axis)` assignments at the top of the kernel")
    if not pids:
        raise NotApplicable(f"{kernel} never reads tl.program_id")
    axes = sorted(p.axis for p in pids)
    if axes not in ([0], [0, 1], [0, 1, 2]):
        raise NotApplicable(f"{kernel} uses grid axes {axes}; the rewrite handles grids of axes 0, 0-1 or 0-2")
    early = early_returns(fn.node)
    if early:
        raise NotApplicable(f"{kernel} returns early (line {early[0].lineno}), inside a block: in a tile loop it "
                            "would skip the program's remaining tiles (an `if ...: return` at the kernel's top level "
                            "becomes a guard of the tile's work)")
    counts = _assign_counts(fn.node)
    for p in pids:
        if counts.get(p.name, 0) != 1:
            raise NotApplicable(f"{p.name} is assigned more than once")
    grid = launch_grid(model, site)
    if grid is None:
        raise NotApplicable(f"the grid of the launch at line {site.line} is not a tuple or a lambda returning one")
    while len(grid.elements) > len(axes) and literal(grid.elements[-1]) == 1:  # (n, 1): a 1D grid written as 2D
        grid = dataclasses.replace(grid, elements=grid.elements[:-1])
    if len(grid.elements) != len(axes):
        raise NotApplicable(f"the grid has {len(grid.elements)} axes but {kernel} reads {len(axes)} program ids")
    an = KernelAnalysis(fn)
    tr = GridTranslator(model, site, an, grid)
    kcounts, passed = [], {}
    taken = {n.id for n in ast.walk(fn.node) if isinstance(n, ast.Name)} | set(fn.params)
    for ax, el in enumerate(grid.elements):

        def pass_size(src: str, ax=ax) -> str:  # a size the wrapper computes, divided by the block in the kernel
            name = next((n for n, v in passed.items() if v == src), None) or fresh_name(taken, f"GRID_SIZE_{ax}")
            taken.add(name)
            passed[name] = src
            return name

        try:
            kcounts.append(tr.kernel_expr(el, pass_size))
        except NotApplicable:
            # a count the kernel is not given (a batch size or a row count the wrapper reads off a shape): passed in
            # as an argument, where no block size divides it (a tile count would go stale when a later stage
            # changes the block)
            if (grid.kind == "lambda" and grid.meta in names_in(el)) or not _plain_count(el):
                raise
            name = fresh_name(taken, f"NUM_PID_{ax}")
            taken.add(name)
            passed[name] = ast.get_source_segment(model.source, el) or ast.unparse(el)
            kcounts.append(name)
    mcounts = [tr.meta_expr(el) for el in grid.elements]
    body = fn.node.body
    pid_stmts = {id(p.stmt) for p in pids}
    first = min(i for i, st in enumerate(body) if id(st) in pid_stmts)
    prologue = body[:first]
    rest = [(i, st) for i, st in enumerate(body) if i > first and id(st) not in pid_stmts]
    # names live before the loop that the loop body reassigns would carry state from one tile to the next
    before = set(fn.params) | set(_assign_counts(list(prologue)))
    in_loop = set(_assign_counts([st for _, st in rest]))
    # a parameter the tile advances in place (``X += row * stride``, the tutorials' row kernels) becomes a per-tile
    # local from its first advance on; anything else assigned before the loop and inside it would carry over
    advanced = {}
    for name in sorted(before & in_loop):
        if name in fn.params and name not in _assign_counts(list(prologue)) and _advances_only(rest, name):
            advanced[name] = fresh_name(taken, f"{name}_tile")
            taken.add(advanced[name])
    carried = sorted((before & in_loop) - set(advanced))
    if carried:
        raise NotApplicable(f"{', '.join(carried)} assigned before the tile loop and again inside it")
    dependent = {p.name for p in pids}
    hoisted: list[int] = []
    for i, st in rest:
        ok = _hoistable_assign(st, counts, dependent)
        if not ok and isinstance(st, ast.If) and isinstance(st.test, ast.Name) and st.test.id in fn.constexpr_params:
            ok = all(_hoistable_assign(s, counts, dependent) for s in st.body + st.orelse)
        if ok:
            hoisted.append(i)
        else:
            dependent |= set(_assign_counts([st]))
    bind = launch_bindings(site, fn, model.source)
    tensors = [bind[p].strip() for p in fn.params if p in bind and _PLAIN.match(bind[p].strip())
               and any(getattr(a.ptr, "base", None) == p for a in an.accesses)]
    if not tensors:  # a kernel that reads its tensors through descriptors, block pointers or pointers it builds
        # (their base parameters); or one that advances its pointers in place (``X += row * stride``)
        tensors = [bind[p].strip() for p in fn.params if (p in _base_params(fn.node) or p in advanced) and p in bind
                   and _PLAIN.match(bind[p].strip())]
    host = enclosing_function(model, site)
    inputs = {a.arg for a in host.args.args} if host is not None else set()
    # prefer an argument of forward itself: it exists before any statement of forward
    device_arg = next((t for t in tensors if t in inputs), tensors[0] if tensors else None)
    if device_arg is None:
        raise NotApplicable(f"no tensor argument of {kernel} to read the device from")
    cast = next((p.cast for p in pids if p.cast), None)
    start = f"tl.program_id(0).to({cast})" if cast else "tl.program_id(0)"
    return PersistentPlan(kernel, [p.name for p in sorted(pids, key=lambda p: p.axis)], start, kcounts, mcounts, first,
                          {p.stmt.lineno for p in pids}, hoisted, device_arg, grid, site, passed, advanced)


def apply_persistent(source: str, plan: PersistentPlan, flatten: bool = False) -> str:
    """``source`` with ``plan`` applied; ``flatten`` asks Triton to flatten the tile loop with the K loop it
    contains (``tl.range(..., flatten=True)``: software pipelining runs across tiles; upstream's persistent
    Hopper matmul does this). Inline program ids are hoisted first, as :func:`rewrite` planned."""
    source = hoist_program_ids(source)
    model = parse_kernel(source)
    fn = model.functions[plan.kernel]
    taken = {n.id for n in ast.walk(fn.node) if isinstance(n, ast.Name)} | set(fn.params)
    lines: list[str] = []
    if len(plan.pids) == 1:
        tiles = fresh_name(taken, "num_tiles")
        lines.append(f"{tiles} = {plan.counts[0]}")
        loop_var, per_tile = plan.pids[0], []
    else:  # axis 0 fastest, as the hardware orders a 2D or 3D grid (rows, columns, then a batch)
        nums = []
        for pid, count in zip(plan.pids, plan.counts):
            nums.append(fresh_name(taken, f"num_{pid}"))
            taken.add(nums[-1])
            lines.append(f"{nums[-1]} = {count}")
        tiles = fresh_name(taken, "num_tiles")
        taken.add(tiles)
        loop_var = fresh_name(taken, "tile_id")
        lines.append(f"{tiles} = {' * '.join(nums)}")
        per_tile, stride = [], ""
        for i, (pid, num) in enumerate(zip(plan.pids, nums)):
            divisor = f"({stride})" if "*" in stride else stride
            index = f"{loop_var} // {divisor}" if stride else loop_var
            per_tile.append(f"{pid} = {index} % {num}" if i < len(nums) - 1 else f"{pid} = {index}")
            stride = f"{stride} * {num}" if stride else num
    extra = ", flatten=True" if flatten else ""
    header = f"for {loop_var} in tl.range({plan.start}, {tiles}, tl.num_programs(0){extra}):\n    pass"
    hoisted_idx = set(plan.hoisted)

    def body(original, updated, line_of):
        ast_lines = [st.lineno for st in fn.node.body]
        by_line = {ln: i for i, ln in enumerate(ast_lines)}
        out, hoisted, inner = [], [], []
        for o, u in zip(original, updated):
            i = by_line.get(line_of(o))
            if i is None:
                raise NotApplicable("statements of the kernel body could not be matched")
            if i < plan.first:
                out.append(u)
            elif line_of(o) in plan.pid_lines:
                continue
            elif i in hoisted_idx:
                hoisted.append(u)
            else:
                inner.append(u)
        loop = statements(header)[0]
        comment = cst.EmptyLine(comment=cst.Comment("# persistent: program p handles tiles p, p + num_programs, "
                                                    "p + 2 * num_programs, ..."))
        if plan.advanced:
            adv = _Advance(plan.advanced)
            inner = [adv.rename(s) for s in inner]
        new_inner = [s for code in per_tile for s in statements(code)] + inner
        loop = loop.with_changes(body=loop.body.with_changes(body=new_inner), leading_lines=[comment])
        head = [s for code in lines for s in statements(code)]
        return out + head + hoisted + [loop]

    source = edit_function(source, FunctionEdit(plan.kernel, body=body, new_params=list(plan.passed)))
    source = add_module_function(source, HELPER, HELPER_CODE)
    model = parse_kernel(source)
    site = single_launch(model, plan.kernel)
    fwd = {n.id for n in ast.walk(model.tree) if isinstance(n, ast.Name)}
    nprog = fresh_name(fwd, "num_programs")
    total = " * ".join(plan.meta)
    grid = f"lambda META: (min({nprog}, {total}),)"
    edit = LaunchEdit(plan.kernel, site.line, before=[f"{nprog} = {HELPER}({plan.device_arg}.device)"],
                      set_kwargs=dict(plan.passed))
    g = launch_grid(model, site)
    if g is not None and g.variable and g.assign is not None and _grid_var_used_once(model, site, g.variable):
        edit.grid_assign = (g.assign.lineno, grid)
        host = enclosing_function(model, site)
        if host is not None and plan.device_arg in {a.arg for a in host.args.args}:
            edit.before_line = g.assign.lineno  # reads naturally; otherwise the count is taken right before the launch
    else:
        edit.grid = grid
    return edit_launch(source, edit)


def _bare_return(stmt: cst.BaseStatement) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Return)
            and stmt.body[0].value is None)


def _returns_in(node: cst.CSTNode) -> bool:
    return any(isinstance(n, cst.Return) for n in walk(node))


def _guarded(body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """A kernel body's statements with its top-level early exits made guards: ``if c: return`` followed by ``rest``
    becomes ``if not (c): rest``, and ``if c: A; return`` becomes ``if c: A else: rest``; a bare ``return`` at the
    end goes (the body falls off its end). A ``return`` anywhere else is left as it is (the plan refuses it)."""
    out: list[cst.BaseStatement] = []
    for i, st in enumerate(body):
        if _bare_return(st) and i == len(body) - 1:
            break
        guard = (isinstance(st, cst.If) and st.orelse is None and isinstance(st.body, cst.IndentedBlock)
                 and st.body.body and _bare_return(st.body.body[-1])
                 and not any(_returns_in(b) for b in st.body.body[:-1]))
        if not guard:
            out.append(st)
            continue
        rest, kept = _guarded(list(body[i + 1:])), list(st.body.body[:-1])
        if rest:  # the block opens on its first statement, not on the blank line that followed the return
            rest[0] = rest[0].with_changes(leading_lines=[ln for ln in rest[0].leading_lines if ln.comment])
        if not kept and not rest:
            break  # `if c: return` as the last statement: nothing is left to skip
        if not kept:
            out.append(st.with_changes(test=expr(f"not ({code(st.test)})"), body=st.body.with_changes(body=rest)))
        else:
            orelse = cst.Else(body=cst.IndentedBlock(body=rest)) if rest else None
            out.append(st.with_changes(body=st.body.with_changes(body=kept), orelse=orelse))
        return out
    return out


class _Guard(cst.CSTTransformer):
    def __init__(self, kernels: list[str]) -> None:
        self.kernels = set(kernels)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if updated.name.value not in self.kernels or not isinstance(updated.body, cst.IndentedBlock):
            return updated
        body = _guarded(list(updated.body.body))
        return updated.with_changes(body=updated.body.with_changes(body=body)) if body else updated


def _guard_returns(source: str, model: KernelModel, kernels: list[str]) -> str:
    """``source`` with ``kernels``' top-level early exits made guards (:func:`_guarded`): inside a tile loop a
    ``return`` would end the loop, skipping the program's remaining tiles; a guard skips only this tile's work."""
    names = [k for k in kernels if (fn := model.functions.get(k)) is not None
             and any(isinstance(n, ast.Return) for n in ast.walk(fn.node))]
    if not names:
        return source
    return cst.parse_module(source).visit(_Guard(names)).code


def _grid_var_used_once(model: KernelModel, site, var: str) -> bool:
    fn = enclosing_function(model, site)
    if fn is None:
        return False
    uses = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == var and isinstance(n.ctx, ast.Load)]
    return len(uses) == 1


def rewrite(source: str, kernel: str | None = None, flatten: bool = False) -> tuple[str, PersistentPlan]:
    source = hoist_program_ids(source)  # inline program ids: one name each at the top, to remap
    model = parse_kernel(source)
    names = [kernel] if kernel else launched_kernels_gemm_first(model)
    errors = []
    for name in names:
        guarded = _guard_returns(source, model, [name])  # inside a tile loop a return would end the loop
        try:
            plan = plan_persistent(parse_kernel(guarded) if guarded != source else model, name)
        except NotApplicable as exc:
            errors.append(f"{name}: {exc}")
            continue
        return apply_persistent(guarded, plan, flatten), plan
    raise NotApplicable("; ".join(errors) or "no kernel launch found")



#: the fewest accumulator rows a tile has for its loop to be warp-specialized (one Hopper warpgroup's wgmma)
WS_MIN_ROWS = 64


def _tile_rows(source: str, kernel: str) -> str | None:
    """The constexpr parameter that sizes the rows of ``kernel``'s accumulator tile: the first ``tl.zeros`` of a 2D
    tile whose rows are a constexpr (``acc = tl.zeros((BLOCK_M, BLOCK_N), ...)``); None where there is none."""
    fn = parse_kernel(source).functions.get(kernel)
    if fn is None:
        return None
    constexprs = set(fn.constexpr_params)
    for node in ast.walk(fn.node):
        if is_tl_call(node, "zeros") and node.args and isinstance(node.args[0], (ast.Tuple, ast.List)) \
                and len(node.args[0].elts) == 2 and isinstance(node.args[0].elts[0], ast.Name) \
                and node.args[0].elts[0].id in constexprs:
            return node.args[0].elts[0].id
    return None


def specialize(source: str, kernel: str) -> str:
    """``source`` with ``kernel``'s tile loop (``for ... in tl.range(start, tiles, tl.num_programs(0))``, as
    :func:`apply_persistent` writes it) warp-specialized: ``tl.range(..., warp_specialize=BLOCK_M >= 64)``, Triton
    splitting the loop's loads, MMAs and epilogue over separate warp groups (KB ``persistent-warp-specialize-hopper``)
    where the accumulator tile has :data:`WS_MIN_ROWS` rows or more, and running the loop as written at a smaller
    tile a later configuration sets (a decode branch's 16 rows; ``True`` where no accumulator tile is found). On an
    H100 (2026-12-07, call G) a 16 x 64 decode tile on a warp-specialized loop ran 1.017x over the 128 x 256 one at
    M = 16, while the same tile on a flattened loop was adopted for a twin epilogue (softmax-numerator, 0.94x of
    torch.compile there). NotApplicable where ``kernel`` has no such loop."""
    rows = _tile_rows(source, kernel)
    flag = f"{rows} >= {WS_MIN_ROWS}" if rows else "True"

    class Specialize(cst.CSTTransformer):
        def __init__(self) -> None:
            super().__init__()
            self.depth = self.done = 0

        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            self.depth += node.name.value == kernel

        def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
            self.depth -= original.name.value == kernel
            return updated

        def leave_For(self, original: cst.For, updated: cst.For) -> cst.For:
            it = updated.iter
            if not (self.depth and isinstance(it, cst.Call) and is_tl(call_name(it), "range")):
                return updated
            step = arg(it, 2, "step")
            if step is None or code(step).replace(" ", "") != "tl.num_programs(0)":
                return updated
            self.done += 1
            return updated.with_changes(iter=set_call_kwargs(it, {"warp_specialize": flag}))

    tr = Specialize()
    out = cst.parse_module(source).visit(tr)
    if tr.done != 1:
        raise NotApplicable(f"{kernel} has {tr.done} tile loops over tl.num_programs(0) (a persistent kernel has one)")
    return out.code


def launched_programs(model: KernelModel, kernel: str, problem, variant) -> int | None:
    """How many programs the launch of ``kernel`` starts at ``variant`` (the traced grid, else forward read
    statically)."""

    try:
        site = single_launch(model, kernel)
    except NotApplicable:
        return None
    bound = launch_facts(model, site, problem, variant)
    if bound is None:
        return None
    sizes = bound[1]
    if not sizes or any(s is None for s in sizes):
        return None
    total = 1
    for s in sizes:
        total *= s
    return total


#: the program count where the tile loop is off: more than any grid has tiles, so ``min(num_programs, tiles)`` starts
#: one program a tile and each walks its own tile once
ONE_A_TILE = "1 << 30"


def off_where(source: str, kernel: str, tests: list[str]) -> str:
    """``source``, a persistent rewrite of ``kernel``, starting one program a tile where one of ``tests`` holds
    (host expressions at the launch: the shape classes the loop lost at): the count the launch's grid takes from
    ``_device_core_count`` becomes ``1 << 30 if (<test>) or ... else _device_core_count(...)``, so each program's
    loop runs its one tile, the form the kernel had before. NotApplicable where ``kernel``'s launch does not take its
    program count from one such assignment."""
    model = parse_kernel(source)
    site = single_launch(model, kernel)
    host = enclosing_function(model, site)
    found = [n for n in ast.walk(host if host is not None else model.tree)
             if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
             and isinstance(n.value, ast.Call) and dotted_name(n.value.func) == HELPER]
    if len(found) != 1:
        raise NotApplicable(f"the launch of {kernel} at line {site.line} takes its program count from "
                            f"{len(found)} {HELPER}() assignments (a persistent rewrite makes one)")
    when = " or ".join(f"({t})" for t in tests)
    parsed = Parsed.of(source)
    target = found[0]
    edits = Edits()
    for node in walk(parsed.module):
        if isinstance(node, cst.SimpleStatementLine) and parsed.line(node) == target.lineno:
            st = node.body[0]
            edits.replace[target.lineno] = [node.with_changes(body=[st.with_changes(
                value=expr(f"{ONE_A_TILE} if {when} else {code(st.value)}"))])]
            break
    else:
        raise NotApplicable(f"the {HELPER}() assignment on line {target.lineno} is not a statement of its own")
    return apply_edits(source, edits, parsed)
