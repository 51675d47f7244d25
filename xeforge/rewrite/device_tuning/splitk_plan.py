"""Split-K analysis (device_tuning): which GEMMs the split-K codemod fits, and their sizes at a variant.

Owns: :func:`plan` — the checks that a kernel is a 2D- or 1D-grid GEMM the codemod of
:mod:`xeforge.rewrite.device_tuning.splitk` can split, and the facts it needs (program ids, the K loops and their
range, the names each loop advances by a fixed step, the zero-initialised accumulator, the one output pointer and
the dtype the tile is stored in) — and :func:`sizes`, the output tile count and K-loop length at a variant, from a
static evaluation of ``forward``. An epilogue is planned for a second kernel (:class:`Epilogue`: the store's
pointer and mask, fixed before the K loop, and the statements after it). Anything a slice could not start
mid-way, an epilogue a second kernel cannot run, or a grid other than one program per tile raises
:class:`NotApplicable` with the reason.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from xeforge.kernel_model import KernelModel, dotted_name, parent_map, parse_kernel, parse_python, segment_of
from xeforge.rewrite.memory import launch_facts
from xeforge.rewrite.persistent import is_persistent, launched_programs
from xeforge.rewrite.tiling import (BlockPtr, KernelAnalysis, NotApplicable, Ptr, _assign_counts, _kw, assigned_names,
                                    is_tl_call)
from xeforge.rewrite.tiling.grid import (enclosing_function, gemm_kernels, launch_bindings, launch_grid, no_dot_reason,
                                         program_id_vars, single_launch)
from xeforge.rewrite.tiling.pids import hoist_program_ids

PARAM = "SPLIT_K"
SUM_KERNEL = "splitk_sum_kernel"
EPILOGUE = "the epilogue must run after the slices are summed"
_RANGES = ("range", "tl.range", "triton.language.range")


@dataclass
class Increment:
    """A name the K loop advances by a loop-invariant amount each step (a pointer, a block pointer, a counter)."""

    name: str
    kind: str  # add (``p += d`` / ``p = p + d``) | advance (``p = tl.advance(p, (d0, d1))``)
    deltas: list[str]


@dataclass
class KLoop:
    node: ast.For
    increments: list[Increment]


@dataclass
class Epilogue:
    """What the kernel does to the finished tile before its one store, kept for a second kernel that runs it on the
    summed slices: the store's pointer and mask, the top-level statements after the last K loop (and those of them
    the pointer and mask need), and the output's stride parameters."""

    ptr: ast.expr
    mask: ast.expr | None
    tail_lines: list[int]  # first lines of the kernel's top-level statements after its last K loop
    prelude_lines: list[int]  # those of them that compute the store's pointer and mask (from nothing the tile is)
    loop_lines: list[int]  # first lines of its K loops (top-level statements)
    strides: dict[str, int]  # output stride parameter -> the dim of the output it strides
    acc_dtype: str = "float32"  # the accumulator's and the partial tiles' type: float32, or int32 (exact sums)


@dataclass
class SplitPlan:
    kernel: str
    pid_lines: tuple[int, ...]
    pid_cast: str | None
    loops: list[KLoop]
    start: str | None  # the K loop's range, as written (None: the default)
    stop: str
    step: str | None
    anchor: int  # index of the top-level statement that holds the first K loop
    acc: str
    out: str  # the output pointer parameter
    out_host: str  # the tensor forward passes for it
    cast: str  # the output dtype, as the summing kernel spells it
    value_lines: list[int]  # statements whose ``acc.to(...)`` becomes ``acc``
    axis: int = 2  # the grid axis the slices take: the first the kernel does not use (1 for a 1D grid)
    epilogue: Epilogue | None = None  # the kernel changes the tile after its K loop: a second kernel runs that
    gathered: bool = False  # a store's rows are gathered through loaded indices: not every element need be written

    @property
    def epilogue_kernel(self) -> str:
        return f"{self.kernel}_epilogue"

    @property
    def split_kernel(self) -> str:
        """The copy of the kernel the slices run where the kernel itself stays (an epilogue, a shape class)."""
        return f"{self.kernel}_splitk"

    def describe(self, split: int | None = None) -> str:
        loops = f"{len(self.loops)} K loops" if len(self.loops) > 1 else "the K loop"
        what = f"{PARAM}={split}" if split else PARAM
        if self.epilogue:
            return (f"{self.kernel}: split-K, {what} programs per output tile each run a slice of {loops} "
                    f"({self.split_kernel}); {self.epilogue_kernel} adds their fp32 partial tiles in order and runs "
                    "the kernel's own epilogue")
        return (f"{self.kernel}: split-K, {what} programs per output tile each run a slice of {loops}; fp32 partial "
                f"tiles summed in order by {SUM_KERNEL}")


def _chain(node: ast.AST, parents: dict[int, ast.AST], stop: ast.AST) -> list[ast.AST]:
    """The ancestors of ``node`` up to (not including) ``stop``, nearest first."""
    out = []
    cur = parents.get(id(node))
    while cur is not None and cur is not stop:
        out.append(cur)
        cur = parents.get(id(cur))
    return out


def _reads(st: ast.stmt) -> set[str]:
    names = {n.id for n in ast.walk(st) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if isinstance(st, ast.AugAssign) and isinstance(st.target, ast.Name):
        names.add(st.target.id)
    return names


def carried(loop: ast.For) -> list[str]:
    """Names the loop body reads before it assigns them in the same iteration: state carried across steps. An ``if``
    is followed branch by branch (``if EVEN_K: ... else: k_left = ...; ... k_left ...`` carries nothing); after
    it, what both branches assign counts as assigned."""
    inside = assigned_names(loop.body)
    out: list[str] = []

    def reads(names: set[str], written: set[str]) -> None:
        for n in sorted(names):
            if n in inside and n not in written and n not in out:
                out.append(n)

    def visit(body: list[ast.stmt], written: set[str]) -> set[str]:
        written = set(written)
        for st in body:
            if isinstance(st, ast.If):
                reads(_names(st.test), written)
                written |= visit(st.body, written) & visit(st.orelse, written)
                continue
            reads(_reads(st), written)
            written |= assigned_names([st])
        return written

    visit(loop.body, _names(loop.target))
    return out


def _assigns_of(root: ast.AST, name: str) -> list[ast.stmt]:
    out = []
    for node in ast.walk(root):
        if isinstance(node, ast.Assign) and any(name in _names(t) for t in node.targets):
            out.append(node)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name) \
                and node.target.id == name:
            out.append(node)
    return out


def _dot_accumulates(st: ast.stmt, name: str) -> bool:
    """``acc = tl.dot(a, b, acc)``, ``acc += tl.dot(a, b)`` or ``acc = acc + tl.dot(a, b)``."""
    if isinstance(st, ast.AugAssign):
        return isinstance(st.op, ast.Add) and is_tl_call(st.value, "dot") and name not in _names(st.value)
    if not isinstance(st, ast.Assign) or len(st.targets) != 1:
        return False
    v = st.value
    if is_tl_call(v, "dot"):
        acc = _kw(v, "acc", 2)
        others = [a for i, a in enumerate(v.args) if i != 2] + [k.value for k in v.keywords if k.arg != "acc"]
        return isinstance(acc, ast.Name) and acc.id == name and not any(name in _names(o) for o in others)
    if isinstance(v, ast.BinOp) and isinstance(v.op, ast.Add):
        for a, b in ((v.left, v.right), (v.right, v.left)):
            if isinstance(a, ast.Name) and a.id == name and is_tl_call(b, "dot") and name not in _names(b):
                return True
    return False


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _src(source: str, node: ast.AST) -> str:
    return segment_of(source, node) or ast.unparse(node)


def _increment(st: ast.stmt, name: str, inside: set[str], source: str) -> Increment | None:
    """``st`` as a loop-invariant increment of ``name``, else None."""
    delta: list[ast.AST] = []
    kind = "add"
    if isinstance(st, ast.AugAssign) and isinstance(st.op, ast.Add) and isinstance(st.target, ast.Name) \
            and st.target.id == name:
        delta = [st.value]
    elif isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) \
            and st.targets[0].id == name:
        v = st.value
        if isinstance(v, ast.BinOp) and isinstance(v.op, ast.Add):
            for a, b in ((v.left, v.right), (v.right, v.left)):
                if isinstance(a, ast.Name) and a.id == name:
                    delta = [b]
                    break
        elif is_tl_call(v, "advance") and len(v.args) == 2 and not v.keywords and isinstance(v.args[0], ast.Name) \
                and v.args[0].id == name and isinstance(v.args[1], (ast.Tuple, ast.List)):
            kind, delta = "advance", list(v.args[1].elts)
    if not delta or any(_names(d) & inside for d in delta):
        return None
    return Increment(name, kind, [_src(source, d) for d in delta])


def _plan_loop(loop: ast.For, source: str, kernel: str) -> tuple[KLoop, str]:
    """The loop's increments and its accumulator; NotApplicable for any other state carried across steps."""
    inside = assigned_names(loop.body)
    incs, accs = [], []
    for name in carried(loop):
        assigns = _assigns_of(loop, name)
        if assigns and all(_dot_accumulates(st, name) for st in assigns):
            accs.append(name)
            continue
        inc = _increment(assigns[0], name, inside, source) if len(assigns) == 1 and assigns[0] in loop.body else None
        if inc is None:
            raise NotApplicable(f"the K loop of {kernel} (line {loop.lineno}) carries {name} from one step to the "
                                "next in a way a slice cannot start mid-way")
        incs.append(inc)
    if len(accs) != 1:
        found = ", ".join(accs) or "none"
        raise NotApplicable(f"the K loop of {kernel} (line {loop.lineno}) needs exactly one tl.dot accumulator "
                            f"(found: {found})")
    return KLoop(loop, incs), accs[0]


def _range(loop: ast.For, source: str, kernel: str) -> tuple[str | None, str, str | None, list[ast.AST]]:
    it = loop.iter
    if not (isinstance(it, ast.Call) and (dotted_name(it.func) or "") in _RANGES and 1 <= len(it.args) <= 3):
        raise NotApplicable(f"the K loop of {kernel} (line {loop.lineno}) does not iterate over range(...) or "
                            "tl.range(...)")
    args = list(it.args)
    step_kw = next((k.value for k in it.keywords if k.arg == "step"), None)
    if step_kw is not None:
        args.append(step_kw)
    if len(args) == 1:
        start, stop, step = None, args[0], None
    else:
        start, stop, step = args[0], args[1], (args[2] if len(args) > 2 else None)
    if step is not None and isinstance(step, ast.Constant) and not (isinstance(step.value, int) and step.value > 0):
        raise NotApplicable(f"the K loop of {kernel} (line {loop.lineno}) does not count up")
    nodes = [n for n in (start, stop, step) if n is not None]
    text = [None if n is None else _src(source, n) for n in (start, stop, step)]
    return text[0], text[1], text[2], nodes


def _desc_bases(fn: ast.FunctionDef) -> dict[str, str]:
    """Tensor descriptors created in ``fn`` -> the pointer parameter they describe."""
    out = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Call) \
                and (dotted_name(node.value.func) or "").endswith("make_tensor_descriptor"):
            base = _kw(node.value, "base", 0)
            if isinstance(base, ast.Name):
                out[node.targets[0].id] = base.id
    return out


def _stores(fn: ast.FunctionDef, an: KernelAnalysis) -> list[tuple[ast.Call, str | None, ast.AST | None]]:
    """(call, pointer parameter written, stored value) of every store: ``tl.store`` and descriptor stores."""
    descs = _desc_bases(fn)
    by_call = {id(a.call): a for a in an.accesses if a.kind == "store"}
    out = []
    params = set(an.params)
    for node in ast.walk(fn):
        if is_tl_call(node, "store"):
            acc = by_call.get(id(node))
            ptr = acc.ptr if acc is not None else None
            base = ptr.base if isinstance(ptr, (Ptr, BlockPtr)) else None
            if base is None and node.args:  # rows gathered from memory (a MoE block's token ids): not a tile the
                base = _pointer_param(fn, node.args[0], params)  # analysis reads, but its base is still the sum's
            out.append((node, base, _kw(node, "value", 1)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "store" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id in descs:
            out.append((node, descs[node.func.value.id], node.args[1] if len(node.args) > 1 else None))
    return out


def _pointer_param(fn: ast.FunctionDef, expr: ast.AST, params: set[str]) -> str | None:
    """The pointer parameter a pointer expression offsets (``out_ptr + rows[:, None] * s + ...``, or a name assigned
    once from one): the leftmost operand of its sum, followed through single assignments; None otherwise."""
    for _ in range(8):
        while isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            expr = expr.left
        if not isinstance(expr, ast.Name):
            return None
        if expr.id in params:
            return expr.id
        assigns = _assigns_of(fn, expr.id)
        if len(assigns) != 1 or not isinstance(assigns[0], ast.Assign) or len(assigns[0].targets) != 1 or \
                not isinstance(assigns[0].targets[0], ast.Name):
            return None
        expr = assigns[0].value
    return None


def _reads_output(fn: ast.FunctionDef, an: KernelAnalysis, out: str) -> bool:
    descs = _desc_bases(fn)
    if any(a.kind == "load" and getattr(a.ptr, "base", None) == out for a in an.accesses):
        return True
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "load"
               and isinstance(n.func.value, ast.Name) and descs.get(n.func.value.id) == out for n in ast.walk(fn))


def _cast_of(value: ast.AST, acc: str) -> tuple[bool, ast.AST | None]:
    """(is the accumulator, the dtype it is cast to) for ``acc`` or ``acc.to(dtype)``."""
    if isinstance(value, ast.Name) and value.id == acc:
        return True, None
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "to" \
            and isinstance(value.func.value, ast.Name) and value.func.value.id == acc and len(value.args) == 1 \
            and not value.keywords:
        return True, value.args[0]
    return False, None


def _sum_cast(dtype: ast.AST | None, out: str, kernel: str, descs: list[str] = ()) -> str:
    """The output dtype as the summing kernel (whose output pointer is ``out_ptr``) writes it; ``descs``: tensor
    descriptors the kernel makes over ``out`` (``acc.to(c_desc.dtype)`` is ``out``'s element type)."""
    if dtype is None:
        return "out_ptr.dtype.element_ty"
    text = ast.unparse(dtype)
    if text == f"{out}.dtype.element_ty" or text in {f"{d}.dtype" for d in descs}:
        return "out_ptr.dtype.element_ty"
    if text.startswith(("tl.", "triton.language.")) and text.count(".") <= 2:
        return text
    raise NotApplicable(f"{kernel} casts the accumulator to {text}, which the summing kernel cannot name")


def _top_index(fn: ast.FunctionDef, node: ast.AST, parents: dict[int, ast.AST]) -> int:
    chain = [node, *_chain(node, parents, fn)]
    top = chain[-1]
    return next(i for i, st in enumerate(fn.body) if st is top)


def _check_kernel(model: KernelModel, kernel: str) -> list:
    """The kernel-wide conditions; returns its program-id assignments (axis 0 first): a 2D grid, or a 1D one (the
    grouped tile order: one program id, the tile's row and column computed from it)."""
    fn = model.functions[kernel]
    node = fn.node
    if PARAM in fn.params:
        raise NotApplicable(f"{kernel} already has a {PARAM} parameter")
    if not any(is_tl_call(n, "dot") for n in ast.walk(node)):
        raise NotApplicable(no_dot_reason(model, kernel, "split-K", "split-K is for GEMM-like kernels"))
    if is_persistent(node) or any(is_tl_call(n, "num_programs") for n in ast.walk(node)):
        raise NotApplicable(f"{kernel} is persistent (it loops over tiles); split-K needs one program per tile")
    atomics = sorted({dotted_name(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)
                      and (dotted_name(n.func) or "").rsplit(".", 1)[-1].startswith("atomic_")})
    if atomics:
        raise NotApplicable(f"{kernel} uses {', '.join(atomics)}; the split must stay deterministic")
    site = single_launch(model, kernel)
    pids, inline = program_id_vars(node)
    if inline:
        raise NotApplicable(f"{kernel} calls tl.program_id inline (line {inline[0].lineno}); the rewrite needs "
                            "`pid = tl.program_id(axis)` assignments at the top of the kernel")
    axes = sorted(p.axis for p in pids)
    if any(a >= 2 for a in axes):
        raise NotApplicable(f"{kernel} already uses a third grid axis")
    if axes not in ([0], [0, 1]):
        raise NotApplicable(f"{kernel} uses grid axes {axes}; split-K handles a 2D grid (pid_m = tl.program_id(0), "
                            "pid_n = tl.program_id(1)) or a 1D one (pid = tl.program_id(0))")
    grid = launch_grid(model, site)
    if grid is None or len(grid.elements) != len(axes):
        raise NotApplicable(f"the launch of {kernel} at line {site.line} does not use a {len(axes)}-axis grid "
                            f"as its kernel reads (axes {axes})")
    host = enclosing_function(model, site)
    if host is None or not any(isinstance(st, ast.Expr) and st.value is site.node for st in host.body[1:]):
        raise NotApplicable(f"the launch of {kernel} (line {site.line}) is not a top-level statement of "
                            f"{site.function} after the output is allocated")
    return sorted(pids, key=lambda p: p.axis)


def _k_loops(fn, parents: dict[int, ast.AST]) -> list[ast.For]:
    """The loops that call tl.dot: at the top of the kernel body, or in its top-level ifs (block_io's two paths)."""
    node, kernel = fn.node, fn.name
    loops = sorted((n for n in ast.walk(node) if isinstance(n, ast.For)
                    and any(is_tl_call(c, "dot") for s in n.body for c in ast.walk(s))), key=lambda n: n.lineno)
    if not loops:
        raise NotApplicable(f"{kernel} calls tl.dot outside a K loop")
    for lp in loops:
        outer = _chain(lp, parents, node)
        if any(isinstance(p, (ast.For, ast.While)) for p in outer):
            raise NotApplicable(f"the K loop of {kernel} (line {lp.lineno}) is nested in another loop")
        if any(not isinstance(p, ast.If) for p in outer):
            raise NotApplicable(f"the K loop of {kernel} (line {lp.lineno}) is not at the top of the kernel body")
    outside = [n for n in ast.walk(node) if is_tl_call(n, "dot")
               and not any(p in loops for p in _chain(n, parents, node))]
    if outside:
        raise NotApplicable(f"{kernel} calls tl.dot outside its K loop (line {outside[0].lineno})")
    return loops


def _loop_bounds_fixed(fn, loops: list[ast.For], anchor: int, source: str) -> None:
    """The K loop's bounds must be computable where the slice is chosen (before the statement holding the loop)."""
    before = set(fn.params) | assigned_names(fn.node.body[:anchor])
    counts = _assign_counts(fn.node)
    for name in sorted(set().union(*(_names(n) for n in _range(loops[0], source, fn.name)[3]))):
        if name in ("tl", "triton") or name in fn.params:
            continue
        if name not in before or counts.get(name, 0) != 1:
            raise NotApplicable(f"the K loop's bound uses {name}, which is not fixed before the loop")


def _check_accumulator(fn, loops: list[ast.For], acc: str, parents: dict[int, ast.AST], source: str) -> None:
    """Zeros before the K loops, untouched after them."""
    node, kernel = fn.node, fn.name
    outside = [st for st in _assigns_of(node, acc) if not any(p in loops for p in _chain(st, parents, node))]
    inits = [st for st in outside if st.lineno < loops[0].lineno]
    later = [st for st in outside if st.lineno > loops[0].lineno]
    if later:
        raise NotApplicable(f"{kernel} changes {acc} after the K loop (line {later[0].lineno}): {EPILOGUE}")
    if len(inits) != 1 or not isinstance(inits[0], ast.Assign) or not _zeros(inits[0].value):
        what = _src(source, inits[-1].value) if inits and isinstance(inits[-1], ast.Assign) else "several places"
        raise NotApplicable(f"{acc} starts from {what}, not tl.zeros: every slice would add it again")


def _output(fn, loops: list[ast.For], acc: str, parents: dict[int, ast.AST], source: str) -> tuple[str, str, list[int]]:
    """(output pointer, its dtype for the summing kernel, lines whose ``acc.to(...)`` becomes ``acc``): every store
    writes the finished accumulator, or a cast of it, to one tensor the kernel does not read."""
    node, kernel = fn.node, fn.name
    an = KernelAnalysis(fn)
    stores = _stores(node, an)
    if not stores:
        raise NotApplicable(f"{kernel} stores nothing")
    last_loop_end = max(lp.end_lineno or lp.lineno for lp in loops)
    outs, dtypes, value_lines = set(), {}, []
    for call, base, value in stores:
        if call.lineno < last_loop_end or any(isinstance(p, (ast.For, ast.While)) for p in _chain(call, parents, node)):
            raise NotApplicable(f"{kernel} stores before its K loop ends (line {call.lineno}); split-K needs one "
                                "store of the finished tile")
        if base is None:
            raise NotApplicable(f"cannot tell which tensor the store at line {call.lineno} writes")
        outs.add(base)
        ok, dtype = _cast_of(value, acc) if value is not None else (False, None)
        line = call.lineno
        if not ok and isinstance(value, ast.Name):
            alias = _assigns_of(node, value.id)
            if len(alias) == 1 and isinstance(alias[0], ast.Assign) and alias[0].lineno > last_loop_end:
                ok, dtype = _cast_of(alias[0].value, acc)
                line = alias[0].lineno
        if not ok:
            shown = _src(source, value) if value is not None else "nothing"
            raise NotApplicable(f"{kernel} stores {shown} rather than {acc} or a cast of it (line {call.lineno}): "
                                f"{EPILOGUE}")
        if dtype is not None:
            value_lines.append(line)
        dtypes[None if dtype is None else ast.unparse(dtype)] = dtype
    if len(outs) != 1:
        raise NotApplicable(f"{kernel} writes {len(outs)} tensors ({', '.join(sorted(outs))}); split-K handles one "
                            "output")
    out = outs.pop()
    if len(dtypes) != 1:
        raise NotApplicable(f"{kernel} casts the accumulator differently in different stores")
    if _reads_output(node, an, out):
        raise NotApplicable(f"{kernel} reads {out} as well as writing it; the slices would each add what it holds")
    descs = [d for d, base in _desc_bases(node).items() if base == out]
    return out, _sum_cast(next(iter(dtypes.values())), out, kernel, descs), value_lines


def loop_range(model: KernelModel, kernel: str) -> tuple[str | None, str, str | None]:
    """(start, stop, step) of ``kernel``'s K loops as source text, without :func:`plan`'s checks of the kernel and
    its launch (a kernel split already, launched in a branch); NotApplicable where its loops are not one range."""
    fn = model.functions[kernel]
    ranges = {_range(lp, model.source, kernel)[:3] for lp in _k_loops(fn, parent_map(fn.node))}
    if len(ranges) != 1:
        raise NotApplicable(f"the K loops of {kernel} run over different ranges")
    return ranges.pop()


def plan(model: KernelModel, kernel: str) -> SplitPlan:
    """What the codemod needs to split ``kernel``; NotApplicable with the reason when it does not fit."""
    fn = model.functions[kernel]
    node, source = fn.node, model.source
    pids = _check_kernel(model, kernel)
    parents = parent_map(node)
    loops = _k_loops(fn, parents)
    planned, accs = [], set()
    for lp in loops:
        kl, acc = _plan_loop(lp, source, kernel)
        planned.append(kl)
        accs.add(acc)
    if len(accs) != 1:
        raise NotApplicable(f"the K loops of {kernel} accumulate into different names ({', '.join(sorted(accs))})")
    acc = accs.pop()
    start, stop, step = loop_range(model, kernel)
    anchor = min(_top_index(node, lp, parents) for lp in loops)
    pid_idx = [next(i for i, st in enumerate(node.body) if st is p.stmt) for p in pids]
    if max(pid_idx) >= anchor:
        raise NotApplicable(f"{kernel} reads its program ids after the K loop starts")
    _loop_bounds_fixed(fn, loops, anchor, source)
    epilogue = None
    try:
        _check_accumulator(fn, loops, acc, parents, source)
        out, cast, value_lines = _output(fn, loops, acc, parents, source)
    except NotApplicable as exc:
        if EPILOGUE not in str(exc):
            raise
        out, epilogue = _epilogue(model, kernel, loops, acc, parents, exc)
        cast, value_lines = "out_ptr.dtype.element_ty", []
    if any(out in _names(st) for st in node.body[:min(pid_idx)]):
        raise NotApplicable(f"{kernel} uses {out} before reading its program ids")
    site = single_launch(model, kernel)
    out_host = launch_bindings(site, fn, source).get(out, "").strip()
    if not out_host.isidentifier():
        raise NotApplicable(f"{kernel}'s output is passed as {out_host or 'nothing'}; the rewrite needs a plain name")
    if epilogue is not None:
        for param, host in launch_bindings(site, fn, source).items():
            for dim in (0, 1):
                if host.replace(" ", "") == f"{out_host}.stride({dim})":
                    epilogue.strides[param] = dim
    an = KernelAnalysis(fn)
    tiles = {id(a.call) for a in an.accesses if a.kind == "store" and isinstance(a.ptr, (Ptr, BlockPtr))}
    gathered = any(base == out and id(call) not in tiles and is_tl_call(call, "store")
                   for call, base, _ in _stores(node, an))
    return SplitPlan(kernel, tuple(p.stmt.lineno for p in pids), pids[0].cast, planned, start, stop, step,
                     anchor, acc, out, out_host, cast, value_lines, axis=len(pids), epilogue=epilogue,
                     gathered=gathered)


def _epilogue(model: KernelModel, kernel: str, loops: list[ast.For], acc: str, parents: dict[int, ast.AST],
              why: NotApplicable) -> tuple[str, Epilogue]:
    """The kernel's epilogue, when a second kernel can run it on the summed slices: K loops at the top of the body,
    ``acc`` zeroed before them, one ``tl.store`` after them whose pointer and mask use only names fixed before the
    first loop or computed after it from those alone (the prelude, which the second kernel runs before the sum),
    nothing the loops assign read after them but ``acc``. NotApplicable (``why`` first) otherwise."""
    fn = model.functions[kernel]
    node = fn.node

    def refuse(reason: str) -> NotApplicable:
        return NotApplicable(f"{why}; a second kernel cannot run it: {reason}")

    body = node.body
    if any(lp not in body for lp in loops):
        raise refuse("a K loop is not a top-level statement of the kernel")
    first, last = body.index(loops[0]), max(body.index(lp) for lp in loops)
    inits = [st for st in _assigns_of(node, acc) if not any(p in loops for p in _chain(st, parents, node))
             and st.lineno < loops[0].lineno]
    if len(inits) != 1 or not isinstance(inits[0], ast.Assign) or not _zeros(inits[0].value):
        raise refuse(f"{acc} does not start from tl.zeros")
    dtype = _kw(inits[0].value, "dtype", 1 if is_tl_call(inits[0].value, "zeros") else 2)
    acc_dtype = "float32" if dtype is None else ast.unparse(dtype).rsplit(".", 1)[-1]
    if acc_dtype not in ("float32", "int32"):
        raise refuse(f"{acc} accumulates in {acc_dtype} (the partial tiles are float32 or int32)")
    an = KernelAnalysis(fn)
    stores = _stores(node, an)
    tail = body[last + 1:]
    if len(stores) != 1 or not is_tl_call(stores[0][0], "store"):
        raise refuse(f"it makes {len(stores)} stores (one tl.store of the finished tile is what it moves)")
    call, out, _ = stores[0]
    holder = next((st for st in tail if isinstance(st, ast.Expr) and st.value is call), None)
    if holder is None or out is None:
        raise refuse(f"its store (line {call.lineno}) is not a top-level statement after the K loop")
    if _reads_output(node, an, out):
        raise refuse(f"it reads {out} as well as writing it")
    ptr, mask = _kw(call, "pointer", 0), _kw(call, "mask", 2)
    if ptr is None:
        raise refuse(f"its store at line {call.lineno} names no pointer")
    if _kw(call, "boundary_check", 3) is not None:
        raise refuse(f"its store at line {call.lineno} goes through a block pointer")
    fixed = set(fn.params) | assigned_names(body[:first])
    counts = _assign_counts(node)
    inside = set().union(*(assigned_names(lp.body) | _names(lp.target) for lp in loops)) - {acc}
    # the tail's statements the store's pointer and mask need (the tutorial's `offs_cm = ...` after the loop):
    # each assigned once, from names fixed before the loop or by each other, never from the tile
    prelude: list[ast.stmt] = []
    need = set().union(*(_names(e) for e in (ptr, mask) if e is not None)) - {"tl", "triton"}
    for st in reversed(tail[:tail.index(holder)]):
        made = _names(st.targets[0]) if isinstance(st, ast.Assign) and len(st.targets) == 1 and \
            isinstance(st.targets[0], ast.Name) else set()
        if made & need:
            prelude.insert(0, st)
            need |= _names(st.value) - {"tl", "triton"}
    made_here = {st.targets[0].id for st in prelude}
    for name in sorted(need - made_here):
        if name in fn.params and counts.get(name, 0) == 0:
            continue
        if name not in fixed or counts.get(name, 0) != 1 or name in inside or name == acc:
            raise refuse(f"the store's pointer or mask uses {name}, which is not fixed before the K loop")
    if any(counts.get(n, 0) != 1 for n in made_here):
        raise refuse("the store's pointer or mask is built from names assigned more than once")
    if ptr is not None and out not in need | made_here | _names(ptr):
        raise refuse(f"its store writes through a pointer made before the K loop, not from {out} where it stores")
    read = set().union(*(_names(st) for st in tail)) if tail else set()
    if inside & read:
        raise refuse(f"its epilogue reads {', '.join(sorted(inside & read))}, which the K loop assigns")
    return out, Epilogue(ptr, mask, [st.lineno for st in tail], [st.lineno for st in prelude],
                         [lp.lineno for lp in loops], {}, acc_dtype)


def _zeros(value: ast.AST) -> bool:
    if is_tl_call(value, "zeros"):
        return True
    if is_tl_call(value, "full") and len(value.args) >= 2:
        v = value.args[1]
        return isinstance(v, ast.Constant) and v.value == 0
    return False


def find(source: str, problem: Any = None) -> SplitPlan:
    """The plan for the first launched ``tl.dot`` kernel that split-K fits (its inline program ids hoisted first:
    :mod:`~xeforge.rewrite.tiling.pids`, as :func:`sizes` and ``splitk.apply`` read them); NotApplicable with every
    reason."""
    source = hoist_program_ids(source)
    model = parse_kernel(source, str(getattr(problem, "kernel_path", "kernel.py")))
    names = gemm_kernels(model)
    if not names:
        raise NotApplicable(no_dot_reason(model, None, "split-K", "split-K is for GEMM-like kernels"))
    errors = []
    for name in names:
        try:
            return plan(model, name)
        except NotApplicable as exc:
            errors.append(str(exc))
    raise NotApplicable("; ".join(errors))


# ------------------------------------------------------------------------------------------------ sizes
def sizes(source: str, plan_: SplitPlan, problem: Any, variant: Any) -> tuple[int, int]:
    """(output tiles, K-loop steps) of the plan's kernel at ``variant``; NotApplicable where forward or the
    loop bound cannot be evaluated statically."""
    model = parse_kernel(hoist_program_ids(source))
    tiles = launched_programs(model, plan_.kernel, problem, variant)
    site = single_launch(model, plan_.kernel)
    bound = launch_facts(model, site, problem, variant)
    if tiles is None or bound is None:
        raise NotApplicable(f"the tile count of {plan_.kernel} at {variant.name} cannot be read from forward")
    shape = getattr(bound[0].get(plan_.out), "shape", None)
    if shape is not None and len(shape) != 2:
        raise NotApplicable(f"{plan_.kernel} writes a {len(shape)}-D tensor; the summing kernel adds matrices")
    steps = trip_count(model.functions[plan_.kernel].node, bound[0], plan_.start, plan_.stop, plan_.step)
    if steps is None:
        raise NotApplicable(f"the K-loop length of {plan_.kernel} at {variant.name} cannot be evaluated statically")
    return tiles, steps


def trip_count(fn: ast.FunctionDef, params: dict[str, Any], start: str | None, stop: str, step: str | None
               ) -> int | None:
    """How many times ``for _ in range(start, stop, step)`` runs in kernel ``fn`` with its parameters at
    ``params`` (a variant's traced values), the bounds evaluated through the kernel's top-level assignments; None
    where one is not known before the kernel runs (read from memory, say)."""
    values = {k: v for k, v in params.items() if isinstance(v, int) and not isinstance(v, bool)}
    defs = {st.targets[0].id: st.value for st in fn.body if isinstance(st, ast.Assign) and len(st.targets) == 1
            and isinstance(st.targets[0], ast.Name)}
    ev = lambda text, default: default if text is None else int_value(parse_python(text, mode="eval").body, values, defs)
    lo, hi, by = ev(start, 0), ev(stop, None), ev(step, 1)
    if None in (lo, hi, by) or by <= 0:
        return None
    return max(0, -(-(hi - lo) // by))


def int_value(node: ast.AST, values: dict[str, int], defs: dict[str, ast.AST], depth: int = 0) -> int | None:
    """``node`` evaluated as an integer from ``values`` (kernel parameters at a variant) and ``defs`` (the kernel's
    top-level assignments): numbers, + - * //, cdiv, min and max; None where anything is unknown."""
    if depth > 20:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in values:
            return values[node.id]
        return int_value(defs[node.id], values, defs, depth + 1) if node.id in defs else None
    if isinstance(node, ast.BinOp):
        a, b = int_value(node.left, values, defs, depth + 1), int_value(node.right, values, defs, depth + 1)
        if a is None or b is None:
            return None
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
               ast.FloorDiv: lambda: a // b if b else None}
        f = ops.get(type(node.op))
        return f() if f else None
    if isinstance(node, ast.Call) and not node.keywords:
        name = (dotted_name(node.func) or "").rsplit(".", 1)[-1]
        args = [int_value(a, values, defs, depth + 1) for a in node.args]
        if None in args:
            return None
        if name == "cdiv" and len(args) == 2 and args[1]:
            return -(-args[0] // args[1])
        if name in ("min", "minimum") and args:
            return min(args)
        if name in ("max", "maximum") and args:
            return max(args)
    return None
