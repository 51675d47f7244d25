"""Split-K codemod (device_tuning): a GEMM whose output has too few tiles for the device sums K in SPLIT_K slices.

Owns: applying the split-K rewrite (:func:`apply`) and the summing kernel it adds; which kernels it fits and
their sizes at a variant are :mod:`~xeforge.rewrite.device_tuning.splitk_plan`'s (re-exported here). A
2D-grid GEMM kernel (``pid_m = tl.program_id(0)``, ``pid_n = tl.program_id(1)``, one output tile per program, ``tl.dot``
accumulated in a K loop, the accumulator stored as it is or cast) gets a third grid axis
``pid_k = tl.program_id(2)`` (a 1D-grid one, the grouped tile order, a second axis ``tl.program_id(1)``); each
program runs the K steps ``[k_lo, k_hi)`` of its tile::

    pid_k = tl.program_id(2)
    c_ptr = c_ptr + pid_k * stride_ck           # this program's fp32 partial tile: slice pid_k
    num_k = tl.cdiv(K, BLOCK_K)                  # the trip count of the original K loop
    k_per = tl.cdiv(num_k, SPLIT_K)
    k_lo = pid_k * k_per
    k_hi = min(num_k, k_lo + k_per)
    a_ptrs += k_lo.to(tl.int64) * BLOCK_K * stride_ak   # what the loop advances starts at step k_lo
    for k in range(k_lo, k_hi):                  # the same iterations as before, so masks on K still hold
        ...
    tl.store(c_ptrs, acc, mask=...)              # fp32, the cast moves to the summing kernel

Slices are whole BLOCK_K steps (``k_per * BLOCK_K`` elements of K), computed in the kernel so BLOCK_K stays
tunable; the last slice is short or empty when K does not divide. ``forward`` allocates the fp32 workspace
``(SPLIT_K, *c.shape)``, passes slice 0 where it passed ``c`` (same strides per slice) and the slice stride,
and launches a second kernel that adds the slices in order and casts into ``c`` — deterministic, no atomics,
no torch compute in ``forward``. That launch is sized per call by the helper :data:`SUM_CONFIG_FN` the rewrite
adds: its tile's columns halve until the grid has about :data:`SUM_PROGRAMS` programs (16 programs summed 32 slices
at M = 16 on an H100), and ``VEC``, the widest power of two up to 16 dividing the columns and the strides, lets the
compiler use 16-byte accesses at a width that is no multiple of 16 (N = 1000: scalar 16-bit stores without it).
Pointers or counters the K loop carries are started at ``k_lo`` by scaling
their per-step increment; anything else the loop carries, an accumulator that does not start at zero, a
persistent or already 3D grid, or a kernel that reads its output is left alone, with the reason.

A kernel with an epilogue (anything done to the tile after the K loop: a bias, an activation, a fused tail) is
split by :func:`_apply_copies`: ``<kernel>_splitk`` runs the slices and stores the raw partial tiles (int32 for
an int8 GEMM's integer accumulator), and
``<kernel>_epilogue``, the kernel with its K loop replaced by the ordered sum of those tiles, runs the epilogue
once, on the original grid.

With ``when`` (a host test, ``M <= 128``: the per-shape-config tactic's class of few rows) the split runs only at
the shapes it holds for, by copies of the kernel (:func:`_apply_copies`); the kernel as written runs at the others.

With ``programs`` the split is sized per call, as a serving GEMM's wrapper sizes it: ``forward`` computes SPLIT_K
from the grid it launches (its output tiles: a tuple as written, a META grid with the block sizes the launch passes;
:func:`host_tiles`) and the K loop's length, through the helper :data:`SIZE_FN` the
rewrite adds, the largest power of two up to :data:`MOST` that keeps ``tiles * SPLIT_K`` within ``programs`` and
:data:`MIN_SLICE_STEPS` K steps in each slice. At SPLIT_K = 1 (tiles that fill the device already) the kernel runs
as written. One candidate then serves every shape: at M = 16 of gemm_tall_k (4 tiles of 128 x 256) a constant
SPLIT_K = 4 sized at M = 1024 launched 16 programs for 132 cores on the H200 (2026-12-06); sized per call, the same
kernel launches 128 there. The
launch search, which retiles the split launch after the split (128 x 256 tiles, BLOCK_K = 64), calls
:func:`follow`, which counts the tiles and K steps again from the launch as it is now; without it the count would
stay at the tiles the split was written for.
"""

from __future__ import annotations

import ast
import copy

import libcst as cst

from xeforge.kernel_model import parse_kernel, parse_python, segment_of
from xeforge.rewrite.cst_tools import (Edits, Parsed, apply_edits, branch_block, expr, function_copy, place_copies,
                                      set_call_kwargs, statements, walk)
from xeforge.rewrite.device_tuning.splitk_plan import (EPILOGUE, PARAM, SUM_KERNEL, Increment, SplitPlan, find,
                                                      loop_range, plan, sizes)
from xeforge.rewrite.tiling import NotApplicable
from xeforge.rewrite.tiling.grid import (enclosing_function, fresh_name, gemm_kernels, launch_bindings, launch_grid,
                                        single_launch)
from xeforge.rewrite.tiling.pids import hoist_program_ids

__all__ = ["EPILOGUE", "PARAM", "SUM_KERNEL", "SplitPlan", "apply", "find", "follow", "plan", "sizes"]

SUM_BLOCK = 64
#: the programs the summing kernel's launch aims at (columns per tile halved until it has them)
SUM_PROGRAMS = 128
#: the largest SPLIT_K a split sized per call takes (the summing kernel unrolls its slices)
MOST = 32
#: the fewest K steps a slice of a split sized per call keeps
MIN_SLICE_STEPS = 4
#: the helper a split sized per call adds to the file
SIZE_FN = "splitk_size"

SIZE_FN_CODE = '''
def {name}(grid, steps, programs, most={most}, min_steps={min_steps}):
    """SPLIT_K for one launch: the largest power of two up to ``most`` that keeps the programs (the grid's output
    tiles times SPLIT_K) within ``programs`` and ``min_steps`` K steps or more in each slice (``steps``: the K loop's
    length; None where the host cannot tell); 1 where the tiles alone reach ``programs``."""
    tiles = 1
    for g in grid:
        tiles *= g
    split = 1
    while split * 2 <= most and tiles * split * 2 <= programs and (steps is None or steps // (split * 2) >= min_steps):
        split *= 2
    return split
'''

SUM_KERNEL_CODE = '''
@triton.jit
def {name}(
    part_ptr, out_ptr, M, N, stride_pk, stride_pm, stride_pn, stride_om, stride_on,
    {param}: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, VEC: tl.constexpr,
):
    """out = the sum of {param} fp32 partial tiles, added in slice order (the same bits every run). VEC divides N
    and the strides (the host passes the largest power of two up to 16 that does): it tells the compiler that
    VEC-wide accesses along a row stay aligned where Triton's own specialization (multiples of 16) does not."""
    if VEC > 1:
        N = N // VEC * VEC
        stride_pk = stride_pk // VEC * VEC
        stride_pm = stride_pm // VEC * VEC
        stride_om = stride_om // VEC * VEC
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    parts = part_ptr + offs_m[:, None] * stride_pm + offs_n[None, :] * stride_pn
    acc = tl.load(parts, mask=mask, other=0.0)
    for k in tl.static_range(1, {param}):
        acc += tl.load(parts + k * stride_pk, mask=mask, other=0.0)
    out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out, acc.to({cast}), mask=mask)
'''

#: the helper that sizes the summing kernel's launch per call
SUM_CONFIG_FN = "splitk_sum_config"

SUM_CONFIG_FN_CODE = '''
def {name}(rows, cols, *strides, programs={programs}, block={block}):
    """(BLOCK_M, BLOCK_N, VEC) for {sum_kernel}: tiles of up to ``block`` rows (as few as 16 for fewer rows), their
    columns halved (down to 16) until the grid has ``programs`` programs, so that a decode-sized sum is spread over
    the device; VEC, the largest power of two up to 16 that divides the columns and every stride."""
    bm = min(block, max(16, 1 << (max(rows, 1) - 1).bit_length()))
    bn = block
    while bn > 16 and -(-rows // bm) * -(-cols // bn) < programs:
        bn //= 2
    vec = 16
    for v in (cols, *strides):
        while vec > 1 and v % vec:
            vec //= 2
    return bm, bn, vec
'''


def _scaled(factor: str, delta: str) -> str:
    node = parse_python(delta, mode="eval").body
    if isinstance(node, ast.Constant) and node.value == 0:
        return "0"
    simple = isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)) or \
        (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult))
    return f"{factor} * {delta}" if simple else f"{factor} * ({delta})"


def _advance(inc: Increment, k_lo: str) -> str:
    if inc.kind == "advance":
        return f"{inc.name} = tl.advance({inc.name}, ({', '.join(_scaled(k_lo, d) for d in inc.deltas)}))"
    # 64-bit, as the pointer the loop advances step by step is: k_lo * BLOCK_K * stride may pass 2**31
    return f"{inc.name} += {_scaled(f'{k_lo}.to(tl.int64)', inc.deltas[0])}"


def _loop_range(p: SplitPlan, k_lo: str, k_hi: str) -> tuple[str, str, str | None]:
    start = p.start if p.start not in (None, "0") else None
    step = p.step if p.step not in (None, "1") else None

    def at(i: str) -> str:
        pos = _scaled(i, step) if step else i
        return f"{start} + {pos}" if start else pos

    return at(k_lo), at(k_hi), step


def _trip_count(start: str | None, stop: str, step: str | None) -> str:
    """The trip count of ``range(start, stop, step)`` in kernel terms (source text)."""
    start = start if start not in (None, "0") else None
    span = f"{stop} - ({start})" if start else stop
    if step in (None, "1"):
        return span
    return f"tl.cdiv({span}, {step})"


def node_at(parsed: Parsed, kind: type, line: int) -> cst.CSTNode:
    for n in walk(parsed.module):
        if isinstance(n, kind) and parsed.line(n) == line:
            return n
    raise NotApplicable(f"no {kind.__name__} at line {line}")


class _Swap(cst.CSTTransformer):
    """Replace a plain name (not an attribute name or a keyword) with an expression."""

    def __init__(self, name: str, text: str) -> None:
        super().__init__()
        self.name, self.text = name, text
        self.skip: set[int] = set()

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        self.skip.add(id(node.attr))
        return True

    def visit_Arg(self, node: cst.Arg) -> bool:
        if node.keyword is not None:
            self.skip.add(id(node.keyword))
        return True

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        if id(original) in self.skip or original.value != self.name:
            return updated
        return expr(self.text)


class _Uncast(cst.CSTTransformer):
    """``acc.to(...)`` -> ``acc``."""

    def __init__(self, acc: str) -> None:
        super().__init__()
        self.acc = acc

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        f = updated.func
        if isinstance(f, cst.Attribute) and f.attr.value == "to" and isinstance(f.value, cst.Name) \
                and f.value.value == self.acc:
            return f.value
        return updated


def _kernel_edits(model, parsed: Parsed, p: SplitPlan, slices: bool = True) -> tuple[Edits, str]:
    """The kernel's side of the split (its slice's program id, output slice, K range and advanced pointers), as
    edits of the source ``parsed`` holds; and the name of the slice-stride parameter it gets. Without ``slices``
    the output pointer stays where it is and no stride parameter is added (a split whose partial tiles go to a
    workspace of its own: :mod:`~xeforge.rewrite.device_tuning.splitk_tail`); ``pid_k`` is then the name the
    slice's program id gets, returned in place of the stride."""
    fn = model.functions[p.kernel].node
    taken = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} | set(model.functions[p.kernel].params)
    fresh = {}
    for base in ("pid_k", "num_k", "k_per", "k_lo", "k_hi"):
        fresh[base] = fresh_name(taken, base)
        taken.add(fresh[base])
    stem = p.out[:-4] if p.out.endswith("_ptr") else p.out
    stride = fresh_name(taken, f"stride_{stem}k" if len(stem) == 1 else f"stride_{stem}_k")
    pid_k, num_k, k_per, k_lo, k_hi = (fresh[b] for b in ("pid_k", "num_k", "k_per", "k_lo", "k_hi"))
    edits = Edits()
    edits.params[p.kernel] = [stride, f"{PARAM}: tl.constexpr"] if slices else []

    read = f"tl.program_id({p.axis}).to({p.pid_cast})" if p.pid_cast else f"tl.program_id({p.axis})"
    head = [f"{pid_k} = {read}"]
    if slices:
        head += [f"# split-K: program {pid_k} sums K steps [{k_lo}, {k_hi}) of its tile into slice {pid_k} of an "
                 "fp32 workspace", f"{p.out} = {p.out} + {pid_k} * {stride}"]
    split_code = [f"{num_k} = {_trip_count(p.start, p.stop, p.step)}", f"{k_per} = tl.cdiv({num_k}, {PARAM})",
                  f"{k_lo} = {pid_k} * {k_per}", f"{k_hi} = min({num_k}, {k_lo} + {k_per})"]
    last_pid = max(p.pid_lines)
    before_anchor = fn.body[p.anchor - 1].lineno
    edits.insert_after[last_pid] = statements("\n".join(head))
    edits.insert_after.setdefault(before_anchor, [])
    edits.insert_after[before_anchor] = edits.insert_after[before_anchor] + statements("\n".join(split_code))

    lo, hi, step = _loop_range(p, k_lo, k_hi)
    for kl in p.loops:
        node = node_at(parsed, cst.For, kl.node.lineno)
        call = node.iter
        rest = [a for a in call.args if a.keyword is not None and a.keyword.value != "step"]
        new_args = [lo, hi] + ([step] if step else [])
        args = [cst.Arg(expr(t), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for t in new_args]
        args = args + rest
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        loop = node.with_changes(iter=call.with_changes(args=args), leading_lines=[])
        pre = [s for inc in kl.increments for s in statements(_advance(inc, k_lo))]
        edits.replace[kl.node.lineno] = [*pre, loop]

    return edits, stride if slices else pid_k


def apply(source: str, p: SplitPlan, split: int, when: str | None = None, programs: int | None = None) -> str:
    """``source`` with ``p`` applied: SPLIT_K ``split``; with ``when`` (a host test such as ``M <= 128``) only at
    the shapes it holds for, the kernel as written launched at the others; with ``programs``, sized per call for
    about that many programs (``split`` is then only what the description says it is at the bench shape). A plan
    with an epilogue, a ``when`` or ``programs`` goes to :func:`_apply_copies`. The plan was made on the source with
    its program ids hoisted, and so is this."""
    if when is not None and programs is not None:
        raise ValueError("a split sized per call has its own test (SPLIT_K > 1); it takes no `when`")
    source = hoist_program_ids(source)
    if p.epilogue is not None or when is not None or programs is not None:
        return _apply_copies(source, p, split, when, programs)
    model = parse_kernel(source)
    parsed = Parsed.of(source)
    edits, stride = _kernel_edits(model, parsed, p)
    for line in sorted(set(p.value_lines)):
        st = node_at(parsed, cst.SimpleStatementLine, line)
        edits.replace[line] = [st.visit(_Uncast(p.acc)).with_changes(leading_lines=[])]

    site, host, split_var, parts = _host_names(model, p)
    launch_idx = next(i for i, st in enumerate(host.body) if isinstance(st, ast.Expr) and st.value is site.node)
    launch_line = host.body[launch_idx].lineno
    prev_line = host.body[launch_idx - 1].lineno
    grid = launch_grid(model, site)
    grid_src = [segment_of(source, e) or ast.unparse(e) for e in grid.elements]
    new_grid = f"({', '.join(grid_src + [split_var])})"
    if grid.kind == "lambda":
        new_grid = f"lambda {grid.meta}: {new_grid}"
    choose = [f"# split-K: {split_var} programs per output tile, each over one slice of K; their fp32 partial tiles",
              f"# go to {parts} and {SUM_KERNEL} adds them into {p.out_host}", f"{split_var} = {split}"]
    alloc = [f"{parts} = torch.{_alloc(p)}(({split_var}, *{p.out_host}.shape), device={p.out_host}.device, "
             "dtype=torch.float32)"]
    grid_var = grid.variable and grid.assign is not None and grid.assign in host.body and \
        sum(1 for n in ast.walk(host) if isinstance(n, ast.Name) and n.id == grid.variable
            and isinstance(n.ctx, ast.Load)) == 1
    if grid_var:
        g = node_at(parsed, cst.SimpleStatementLine, grid.assign.lineno)
        assign = g.body[0].with_changes(value=expr(new_grid))
        edits.replace[grid.assign.lineno] = [*statements("\n".join(choose)),
                                               g.with_changes(body=[assign], leading_lines=[])]
        edits.insert_after[prev_line] = edits.insert_after.get(prev_line, []) + statements("\n".join(alloc))
    else:
        edits.insert_after[prev_line] = edits.insert_after.get(prev_line, []) + statements("\n".join(choose + alloc))

    def launch(call: cst.Call) -> cst.Call:
        args = [a.with_changes(value=a.value.visit(_Swap(p.out_host, f"{parts}[0]"))) if a.keyword is None else a
                for a in call.args]
        call = call.with_changes(args=args)
        if not grid_var:
            el = call.func.slice[0]
            call = call.with_changes(func=call.func.with_changes(
                slice=[el.with_changes(slice=cst.Index(value=expr(new_grid)))]))
        return set_call_kwargs(call, {stride: f"{parts}.stride(0)", PARAM: split_var})

    edits.calls[site.line] = launch
    c = p.out_host
    reduce = _sum_launch(c, parts, split_var, host)
    edits.insert_after[launch_line] = edits.insert_after.get(launch_line, []) + statements(reduce)
    try:
        source = apply_edits(source, edits, parsed)
    except LookupError as exc:
        raise NotApplicable(f"the split-K edit could not be placed ({exc})") from None
    return _add_sum_kernel(source, p.cast)


def _alloc(p: SplitPlan) -> str:
    """How the partial tiles are allocated: ``empty`` where the slices write every element the sum reads (tiles of
    the output), ``zeros`` where they write rows gathered through loaded indices (a MoE block's token ids), which
    need not cover the whole output: an element no slice writes then sums to zero, not to stale memory."""
    return "zeros" if p.gathered else "empty"


def _host_names(model, p: SplitPlan, line: int | None = None) -> tuple:
    """(the launch site, the host function holding it, fresh names there for SPLIT_K and the partial tiles); with
    ``line``, the kernel's launch on that line (one of several), not its single launch."""
    site = single_launch(model, p.kernel) if line is None else \
        next((s for s in model.launches if s.kernel == p.kernel and s.line == line), None)
    host = enclosing_function(model, site) if site is not None else None
    if host is None:
        raise NotApplicable(f"no launch of {p.kernel} at line {site.line if site else line} inside a function")
    names = {n.id for n in ast.walk(host) if isinstance(n, ast.Name)} | {a.arg for a in host.args.args}
    split_var = fresh_name(names, "split_k")
    return site, host, split_var, fresh_name(names | {split_var}, f"{p.out_host}_partials")


def _sum_launch(c: str, parts: str, split_var: str, host: ast.AST) -> str:
    """The summing kernel's launch: ``parts`` (SPLIT_K slices) added into ``c``, its tiles and VEC sized per call by
    :data:`SUM_CONFIG_FN` into names fresh in ``host``, the function holding the launch."""
    taken = {n.id for n in ast.walk(host) if isinstance(n, ast.Name)} | {split_var, parts}
    bm, bn, vec = (fresh_name(taken, n) for n in ("sum_block_m", "sum_block_n", "sum_vec"))
    return (f"{bm}, {bn}, {vec} = {SUM_CONFIG_FN}({c}.shape[0], {c}.shape[1], {parts}.stride(0), {parts}.stride(1), "
            f"{c}.stride(0))\n"
            f"{SUM_KERNEL}[(triton.cdiv({c}.shape[0], {bm}), triton.cdiv({c}.shape[1], {bn}))](\n"
            f"    {parts}, {c}, {c}.shape[0], {c}.shape[1], {parts}.stride(0), {parts}.stride(1), "
            f"{parts}.stride(2),\n    {c}.stride(0), {c}.stride(1), {PARAM}={split_var}, BLOCK_M={bm}, "
            f"BLOCK_N={bn}, VEC={vec}, num_warps=4)")


def _add_sum_kernel(source: str, cast: str) -> str:
    """Insert the summing kernel and its launch's sizing helper before the first class (``Model``), or at the end."""
    source = _insert_before_model(source, SUM_KERNEL, SUM_KERNEL_CODE.format(name=SUM_KERNEL, param=PARAM, cast=cast))
    return _insert_before_model(source, SUM_CONFIG_FN, SUM_CONFIG_FN_CODE.format(
        name=SUM_CONFIG_FN, programs=SUM_PROGRAMS, block=SUM_BLOCK, sum_kernel=SUM_KERNEL))


def _insert_before_model(source: str, name: str, code: str) -> str:
    """Insert the top-level function ``name`` (``code``) before the first class (``Model``), or at the end."""
    module = cst.parse_module(source)
    if any(isinstance(st, cst.FunctionDef) and st.name.value == name for st in module.body):
        raise NotApplicable(f"the file already defines {name}")
    new = statements(code)
    new[0] = new[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    body = list(module.body)
    idx = next((i for i, st in enumerate(body) if isinstance(st, cst.ClassDef)), len(body))
    if idx < len(body):
        body[idx] = body[idx].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *[
            ln for ln in body[idx].leading_lines if ln.comment is not None]])
    body[idx:idx] = new
    return module.with_changes(body=body).code


# ------------------------------------------------------------------------------------------------ with an epilogue
class _Rename(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(self.names.get(node.id, node.id), node.ctx), node)


class Inline(ast.NodeTransformer):
    """Names replaced by (copies of) the expressions they stand for."""

    def __init__(self, values: dict[str, ast.expr]) -> None:
        self.values = values

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return copy.deepcopy(self.values[node.id]) if node.id in self.values else node


def _function_copy(source: str, kernel: str, name: str) -> cst.FunctionDef:
    try:
        return function_copy(source, kernel, name)
    except LookupError as exc:
        raise NotApplicable(str(exc)) from None


def _apply_copies(source: str, p: SplitPlan, split: int, when: str | None, programs: int | None = None) -> str:
    """Split-K by copies of the kernel. ``<kernel>_splitk``, a copy whose slices store their raw partial tiles
    (fp32; int32, exact, for an integer accumulator) where the kernel stored its finished one, runs the K slices.
    For a kernel that changes its tile after the K loop (a bias, an activation, a scale), ``<kernel>_epilogue``, a
    copy whose K loop became the sum of those partial tiles in slice order, then runs the kernel's own epilogue and
    store on the original grid; for one without, the summing kernel adds the slices into the output. The launch
    becomes the two launches, which replace the kernel; with ``when``, under ``if <when>:``, and the kernel and its
    launch stay in the ``else`` (on the H100 a SPLIT_K=1 specialization of the split kernel ran gemm_square's 4096^3
    5-8% slower than the kernel as written: docs/measurements/splitk-h100-2026-12-05/)."""
    ep = p.epilogue
    model = parse_kernel(source)
    fn = model.functions[p.kernel].node
    parsed = Parsed.of(source)

    # the slices' kernel: the split as for a plain GEMM, its store of the raw tile (with an epilogue: everything
    # after the K loop one store, behind the statements that compute its pointer and mask, as written)
    edits, stride = _kernel_edits(model, parsed, p)
    if ep is None:
        for line in sorted(set(p.value_lines)):
            st = node_at(parsed, cst.SimpleStatementLine, line)
            edits.replace[line] = [st.visit(_Uncast(p.acc)).with_changes(leading_lines=[])]
        split_fn = _function_copy(apply_edits(source, edits, parsed), p.kernel, p.split_kernel)
        return _launch_copies(source, p, model, parsed, split, when, split_fn, None, stride, {}, programs)
    prelude = [next(st for st in fn.body if st.lineno == line) for line in ep.prelude_lines]
    prelude_src = [segment_of(source, st) or ast.unparse(st) for st in prelude]
    mask = f", mask={ast.unparse(ep.mask)}" if ep.mask is not None else ""
    raw = statements("\n".join([*prelude_src, f"tl.store({ast.unparse(ep.ptr)}, {p.acc}{mask})"]))
    for i, line in enumerate(ep.tail_lines):
        edits.replace[line] = raw if i == 0 else []
    split_fn = _function_copy(apply_edits(source, edits, parsed), p.kernel, p.split_kernel)

    # the epilogue's kernel: the K loop replaced by the sum of the partial tiles, read where the tile is stored (the
    # store's pointer with the pointer statements it reads spelled out, the output and its strides the partials')
    taken = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} | set(model.functions[p.kernel].params)
    part, s_k, s_m, s_n, s_i = (fresh_name(taken, n) for n in ("part_ptr", "stride_pk", "stride_pm", "stride_pn", "s"))
    dims = {param: (s_m, s_n)[dim] for param, dim in ep.strides.items()}
    ptr_node = parse_python(ast.unparse(ep.ptr), mode="eval").body
    for st in reversed(prelude):
        ptr_node = Inline({st.targets[0].id: st.value}).visit(ptr_node)
    ptr = ast.unparse(_Rename({p.out: part, **dims}).visit(ptr_node))
    zero = "0" if ep.acc_dtype.startswith("int") else "0.0"
    load = f"tl.load({ptr}{{off}}{mask}{f', other={zero}' if ep.mask is not None else ''})"
    summed = [*prelude_src,
              f"# split-K: the {PARAM} {ep.acc_dtype} partial tiles of this tile, added in slice order; then the "
              "epilogue",
              f"{p.acc} = {load.format(off='')}",
              f"for {s_i} in tl.static_range(1, {PARAM}):",
              f"    {p.acc} += {load.format(off=f' + {s_i} * {s_k}')}"]
    epi = Edits()
    epi.params[p.kernel] = [part, s_k, s_m, s_n, f"{PARAM}: tl.constexpr"]
    for i, line in enumerate(ep.loop_lines):
        epi.replace[line] = statements("\n".join(summed)) if i == 0 else []
    for line in ep.prelude_lines:
        epi.replace[line] = []
    epilogue_fn = _function_copy(apply_edits(source, epi, parsed), p.kernel, p.epilogue_kernel)
    return _launch_copies(source, p, model, parsed, split, when, split_fn, epilogue_fn, stride,
                          {"part": part, "s_k": s_k, "s_m": s_m, "s_n": s_n}, programs)


def _launch_copies(source: str, p: SplitPlan, model, parsed: Parsed, split: int, when: str | None,
                   split_fn: cst.FunctionDef, epilogue_fn: cst.FunctionDef | None, stride: str,
                   names: dict[str, str], programs: int | None = None) -> str:
    """The host's side of :func:`_apply_copies`: the launch becomes the split kernel's and then the epilogue
    kernel's (or the summing kernel's), and the copies go right after the kernel; with ``programs``, SPLIT_K is
    computed before them by :data:`SIZE_FN` and they run where it is above 1."""
    acc_dtype = p.epilogue.acc_dtype if p.epilogue else "float32"
    site, host, split_var, parts = _host_names(model, p)
    grid = launch_grid(model, site)
    if programs is not None:
        elems = host_tiles(model, site, grid)
        tiles = f"({', '.join(elems)}{',' if len(elems) == 1 else ''})"
    launch = next(n for n in walk(parsed.module) if isinstance(n, cst.Call) and parsed.line(n) == site.line
                  and isinstance(n.func, cst.Subscript))
    grid_src = cst.Module([]).code_for_node(launch.func.slice[0].slice.value)
    if grid is not None and grid.kind == "lambda":
        meta = grid.meta or "META"
        grid3 = f"lambda {meta}: (*({grid_src})({meta}), {split_var})"
    elif programs is not None:
        # the split launch's grid spelled out (the launch search can then change its tiles at that launch alone);
        # the sizing counts the same tiles
        grid3 = f"({', '.join(elems)}, {split_var})"
    else:
        grid3 = f"(*{grid_src}, {split_var})"

    def relaunch(name: str, grid_text: str, swap: bool, extra: dict[str, str]) -> cst.Call:
        c = launch
        if swap:
            c = c.with_changes(args=[a.with_changes(value=a.value.visit(_Swap(p.out_host, f"{parts}[0]")))
                                     for a in c.args])
        el = c.func.slice[0]
        c = c.with_changes(func=cst.Subscript(value=cst.Name(name), slice=[
            el.with_changes(slice=cst.Index(value=expr(grid_text)))]))
        return set_call_kwargs(c, extra)

    code = cst.Module([]).code_for_node
    if epilogue_fn is not None:
        second = code(relaunch(p.epilogue_kernel, grid_src, False, {
            names["part"]: parts, names["s_k"]: f"{parts}.stride(0)", names["s_m"]: f"{parts}.stride(1)",
            names["s_n"]: f"{parts}.stride(2)", PARAM: split_var}))
        then = f"{p.epilogue_kernel} adds them in slice order and runs {p.kernel}'s epilogue into {p.out_host}"
    else:
        second = _sum_launch(p.out_host, parts, split_var, host)
        then = f"{SUM_KERNEL} adds them in slice order into {p.out_host}"
    block = [f"# split-K: {split_var} programs per output tile, each over one slice of K, write {acc_dtype} "
             f"partial tiles to {parts};", f"# {then}",
             *([] if programs is not None else [f"{split_var} = {split}"]),
             f"{parts} = torch.{_alloc(p)}(({split_var}, *{p.out_host}.shape), device={p.out_host}.device, "
             f"dtype=torch.{acc_dtype})",
             code(relaunch(p.split_kernel, grid3, True, {stride: f"{parts}.stride(0)", PARAM: split_var})),
             second]
    if programs is not None:
        steps = host_steps(model, p.kernel, (p.start, p.stop, p.step), site)
        block = [f"# split-K sized per call: {split_var} slices of K per output tile, so that the tiles counted here "
                 f"come to about {programs}",
                 f"# programs ({split} a tile at the bench shape); at 1 the kernel runs as written",
                 f"{split_var} = {SIZE_FN}({tiles}, {steps or 'None'}, {programs})",
                 *branch_block(block, f"{split_var} > 1", code(launch))]
    else:
        block = branch_block(block, when, code(launch))
    host_edits = Edits()
    statement = next(st for st in ast.walk(host) if isinstance(st, ast.Expr) and st.value is site.node)
    host_edits.replace[statement.lineno] = statements("\n".join(block))
    try:
        out = apply_edits(source, host_edits, parsed)
        # without ``when`` nothing launches the kernel any more: its copies take its place
        out = place_copies(out, p.kernel, [split_fn] + ([epilogue_fn] if epilogue_fn is not None else []),
                           keep=when is not None or programs is not None)
    except LookupError as exc:
        raise NotApplicable(f"the split-K edit could not be placed ({exc})") from None
    out = out if epilogue_fn is not None else _add_sum_kernel(out, p.cast)
    return out if programs is None else _add_size_fn(out)


def host_tiles(model, site, grid, bind_site=None) -> list[str]:
    """The launch's grid axes as host expressions before the call: a tuple's as written; a lambda's (or a grid
    function's) with each ``META["BM"]`` it reads replaced by what the launch (``bind_site``, where another launch
    passes the block sizes) passes for ``BM``. NotApplicable where the host cannot count them: a meta-parameter the
    launch does not pass (an ``@triton.autotune`` config chooses it), or a grid of another form."""
    why = (f"the launch of {site.kernel} at line {site.line} has a grid the host cannot count the tiles of before the "
           "call ({})")
    if grid is None:
        raise NotApplicable(why.format("neither a tuple nor a function of the launch's meta-parameters"))
    if grid.kind == "tuple":
        return [segment_of(model.source, e) or ast.unparse(e) for e in grid.elements]
    by = bind_site or site
    bind = launch_bindings(by, model.functions[by.kernel], model.source)
    meta = _MetaKeys(grid.meta, bind)
    out = [ast.unparse(meta.visit(copy.deepcopy(el))) for el in grid.elements]
    if meta.missing:
        raise NotApplicable(why.format(f"{', '.join(sorted(meta.missing))}: chosen with the launch's "
                                       "meta-parameters, not passed at the launch"))
    return out


class _MetaKeys(ast.NodeTransformer):
    """``META["BM"]`` -> the host expression the launch passes for ``BM``; what it cannot replace (a key the launch
    does not pass, ``META`` read another way) is collected in ``missing``."""

    def __init__(self, meta: str | None, bind: dict[str, str]) -> None:
        self.meta, self.bind, self.missing = meta, bind, set()

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == self.meta:
            key = node.slice.value if isinstance(node.slice, ast.Constant) else None
            if isinstance(key, str) and self.bind.get(key):
                return parse_python(f"({self.bind[key]})", mode="eval").body
            self.missing.add(str(key) if isinstance(key, str) else ast.unparse(node))
            return node
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == self.meta:  # META read other than by a literal key
            self.missing.add(self.meta)
        return node


def host_steps(model, kernel: str, loop: tuple[str | None, str, str | None], site) -> str | None:
    """The length of ``kernel``'s K loop (``loop``: its start, stop and step) as a host expression at the launch
    ``site`` (``triton.cdiv(K, 64)``): the trip count with the kernel's top-level assignments inlined and each
    parameter replaced by what the launch passes for it; None where a name is neither (an autotuned block size, a
    value the kernel loads)."""
    fn = model.functions[kernel]
    try:
        bind = launch_bindings(site, fn, model.source)
    except NotApplicable:
        return None
    defs = {st.targets[0].id: st.value for st in fn.node.body if isinstance(st, ast.Assign) and len(st.targets) == 1
            and isinstance(st.targets[0], ast.Name)}
    node = parse_python(_trip_count(*loop), mode="eval").body
    for _ in range(8):  # definitions that read definitions, a few deep
        if not any(isinstance(n, ast.Name) and n.id in defs for n in ast.walk(node)):
            break
        node = Inline(defs).visit(node)
    host = {k: parse_python(f"({v})", mode="eval").body for k, v in bind.items() if v}
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - {"tl", "triton"}
    if not names <= set(host):
        return None
    text = ast.unparse(Inline(host).visit(node)).replace("tl.cdiv(", "triton.cdiv(")
    return None if "tl." in text else text


def _add_size_fn(source: str) -> str:
    """Insert :data:`SIZE_FN` before the first class (``Model``), or at the end."""
    return _insert_before_model(source, SIZE_FN, SIZE_FN_CODE.format(name=SIZE_FN, most=MOST,
                                                                     min_steps=MIN_SLICE_STEPS))


def follow(source: str) -> str:
    """``source`` with the count of each sized split (its :data:`SIZE_FN` call) read again from the split launch it
    sizes: that launch's output tiles (its grid as written now; a META grid with the block sizes it passes now) and
    its K loop's length with the ``BLOCK_K`` it passes now. The launch search tunes the split launch after the
    split (``BLOCK_N`` 128 -> 256 halves its tiles); the count then follows. Unchanged where there is no sized
    split, where the split kernel is launched from more than one place (a per-shape dispatch of it: no one count
    fits both), or where the launch can no longer be counted (its block sizes autotuned)."""
    if f"{SIZE_FN}(" not in source:
        return source
    model = parse_kernel(source)
    parsed, edits = None, Edits()
    sizings = [(fn, node) for fn in ast.walk(model.tree) if isinstance(fn, ast.FunctionDef) for node in ast.walk(fn)
               if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
               and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
               and node.value.func.id == SIZE_FN and len(node.value.args) == 3]
    for fn, node in sizings:
        counted = _split_count(model, fn, node.targets[0].id)
        if counted is None:
            continue
        tiles, steps = counted
        programs = segment_of(source, node.value.args[2]) or ast.unparse(node.value.args[2])
        text = f"{node.targets[0].id} = {SIZE_FN}({tiles}, {steps}, {programs})"
        if text == (segment_of(source, node) or ""):
            continue
        parsed = parsed or Parsed.of(source)
        st = node_at(parsed, cst.SimpleStatementLine, node.lineno)
        edits.replace[node.lineno] = [st.with_changes(body=statements(text)[0].body)]
    return apply_edits(source, edits, parsed) if parsed is not None else source


def _split_count(model, fn: ast.FunctionDef, var: str) -> tuple[str, str] | None:
    """(tiles, steps) as host expressions for the split that ``var`` (a :data:`SIZE_FN` result in ``fn``) sizes,
    read from its launch now; None where they cannot be read (see :func:`follow`)."""
    test = next((n for n in ast.walk(fn) if isinstance(n, ast.If) and isinstance(n.test, ast.Compare)
                 and isinstance(n.test.left, ast.Name) and n.test.left.id == var), None)
    if test is None:
        return None

    def lines(body: list[ast.stmt]) -> set[int]:
        return {n.lineno for st in body for n in ast.walk(st) if isinstance(n, ast.Call)}

    in_branch, in_else = lines(test.body), lines(test.orelse)
    original = [s for s in model.launches if s.node.lineno in in_else]
    dots = set(gemm_kernels(model))
    split = [s for s in model.launches if s.node.lineno in in_branch and s.kernel in dots
             and any(k.arg == PARAM for k in s.node.keywords)]
    if len(split) != 1 or len(original) != 1 or \
            sum(s.kernel == split[0].kernel for s in model.launches) != 1:
        return None
    site, orig = split[0], original[0]
    grid = launch_grid(model, site)
    try:
        if grid is not None and grid.kind == "tuple":
            last = grid.elements[-1] if grid.elements else None
            if not (isinstance(last, ast.Name) and last.id == var):
                return None
            elems = host_tiles(model, site, grid)[:-1]
        else:  # ``lambda META: (*(grid)(META), split_k)``: the original grid, with the split launch's block sizes
            elems = host_tiles(model, orig, launch_grid(model, orig), bind_site=site)
        steps = host_steps(model, orig.kernel, loop_range(model, orig.kernel), site)
    except NotApplicable:
        return None
    return f"({', '.join(elems)}{',' if len(elems) == 1 else ''})", steps or "None"
