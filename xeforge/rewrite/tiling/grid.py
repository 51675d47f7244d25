"""The grid side of tiled kernels: program ids, tile axes, launch bindings and grid expressions.

Owns: the top-level program-id assignments of a kernel (:func:`program_id_vars`), the block size and bound of
each tile axis (:func:`axis_tiles`), which host expression a launch passes for each kernel parameter
(:func:`launch_bindings`), the launch's grid (:func:`launch_grid`) and its translation into kernel terms
(``tl.cdiv(M, BLOCK_M)``) and ``META`` terms (:class:`GridTranslator`). Built on the symbolic reading of
:mod:`xeforge.rewrite.tiling`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable, Iterable

from xeforge.analysis.launches import bindings, live_launches, unpacked_dict
from xeforge.kernel_model import JitFunction, KernelModel, LaunchSite, dotted_name, is_literal, literal, segment_of
from xeforge.rewrite.tiling import (BlockPtr, KernelAnalysis, Mask, NotApplicable, Poly, _factor_key, _kw,
                                    block_symbol, is_tl_call, names_in)


@dataclass
class PidVar:
    name: str
    axis: int
    stmt: ast.stmt  # the top-level assignment
    cast: str | None = None  # ``tl.int64`` when written ``tl.program_id(a).to(tl.int64)``

    def read(self, axis_expr: str = "") -> str:
        """The program-id expression as the kernel wrote it (with its cast)."""
        call = f"tl.program_id({axis_expr or self.axis})"
        return f"{call}.to({self.cast})" if self.cast else call


def _program_id_call(value: ast.AST) -> tuple[ast.Call, str | None] | None:
    if is_tl_call(value, "program_id"):
        return value, None
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "to" \
            and is_tl_call(value.func.value, "program_id") and len(value.args) == 1:
        return value.func.value, ast.unparse(value.args[0])
    return None


def program_id_vars(fn: ast.FunctionDef) -> tuple[list[PidVar], list[ast.Call]]:
    """Top-level ``x = tl.program_id(a)`` (or ``...program_id(a).to(tl.int64)``) assignments, and every other
    ``tl.program_id`` call (inline uses)."""
    pids: list[PidVar] = []
    claimed: set[int] = set()
    for st in fn.body:
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            found = _program_id_call(st.value)
            if found is None:
                continue
            call, cast = found
            arg = _kw(call, "axis", 0)
            val = literal(arg)
            if is_literal(val) and isinstance(val, int):
                pids.append(PidVar(st.targets[0].id, val, st, cast))
                claimed.add(id(call))
    inline = [n for n in ast.walk(fn) if is_tl_call(n, "program_id") and id(n) not in claimed]
    return pids, inline


def pid_derived_names(fn: ast.FunctionDef, axis: int | None = None) -> set[str]:
    """Names whose value depends on a program id (assigned from tl.program_id or from such names: plain, augmented
    and annotated assignments, loop targets); with ``axis``, on that axis's program id only."""

    def is_pid(n: ast.AST) -> bool:
        if not is_tl_call(n, "program_id"):
            return False
        if axis is None:
            return True
        arg = n.args[0] if n.args else next((k.value for k in n.keywords if k.arg == "axis"), None)
        return not (isinstance(arg, ast.Constant) and arg.value != axis)

    derived: set[str] = set()
    changed = True
    while changed:
        changed = False
        for node in ast.walk(fn):
            targets, value = [], None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                targets, value = [node.target], node.value
            elif isinstance(node, ast.For):
                targets, value = [node.target], node.iter
            if value is None:
                continue
            uses = any(is_pid(n) for n in ast.walk(value)) or \
                any(isinstance(n, ast.Name) and n.id in derived for n in ast.walk(value))
            if uses:
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name) and n.id not in derived:
                            derived.add(n.id)
                            changed = True
    return derived


def axis_tiles(an: KernelAnalysis, pid: str) -> list[tuple[str, Poly]]:
    """(block constexpr, bound) pairs of index vectors ``pid * BLOCK + tl.arange(0, BLOCK)`` compared to a bound."""
    out: list[tuple[str, Poly]] = []
    for acc in an.accesses:
        masks = [acc.mask] if isinstance(acc.mask, Mask) else []
        for m in masks:
            for b in m.bounds:
                blk = block_symbol(b.vec.size, an.constexprs)
                if blk is None:
                    continue
                coef = b.vec.start.as_dict().get(tuple(sorted((pid, blk), key=_factor_key)))
                if coef != 1:
                    continue
                # the absolute bound: vec.start + arange < limit  <=>  index < limit
                if b.limit.symbols() & {pid}:
                    continue
                if (blk, b.limit) not in out:
                    out.append((blk, b.limit))
    # block pointers: offsets pid * BLOCK on a dimension whose shape is the bound
    for acc in an.accesses:
        bp = acc.ptr
        if isinstance(bp, BlockPtr):
            for off, shape, blk in zip(bp.offsets, bp.shape, bp.block):
                bname = blk.single_symbol()
                key = tuple(sorted((pid, bname), key=_factor_key)) if bname else ()
                if bname and bname in an.constexprs and off.as_dict().get(key) == 1 and (bname, shape) not in out:
                    out.append((bname, shape))
    return out


def launch_bindings(site: LaunchSite, fn: JitFunction, source: str) -> dict[str, str]:
    """Kernel parameter -> the host expression the launch passes for it (source text)."""
    spread = unpacked_dict(site)
    if any(isinstance(a, ast.Starred) for a in site.node.args) or \
            (spread is None and any(kw.arg is None for kw in site.node.keywords)):
        raise NotApplicable(f"the launch of {site.kernel} at line {site.line} unpacks arguments (*args, or "
                            "**kwargs other than one dict variable); the rewrite needs to see which argument each "
                            "parameter gets")
    out: dict[str, str] = {}
    for p, a in zip(fn.params, site.args):
        out[p] = a
    for kw in site.node.keywords:
        if kw.arg:
            out[kw.arg] = segment_of(source, kw.value) or ""
    if spread is not None:  # ``**cfg``: every parameter without a default that nothing else gives is cfg's
        defaults = set(fn.params[len(fn.params) - len(fn.node.args.defaults):]) if fn.node.args.defaults else set()
        for p in fn.params:
            if p not in out and p not in defaults:
                out[p] = f'{spread}["{p}"]'
    return out


def enclosing_function(model: KernelModel, site: LaunchSite) -> ast.FunctionDef | None:
    for node in ast.walk(model.tree):
        if isinstance(node, ast.FunctionDef) and node.name == site.function and \
                node.lineno <= site.line <= (node.end_lineno or node.lineno):
            return node
    return None


@dataclass
class GridInfo:
    kind: str  # tuple | lambda
    elements: list[ast.expr]
    meta: str | None  # the lambda's parameter name
    variable: str | None  # the grid variable, when the launch names one
    assign: ast.Assign | None  # its assignment (the last one before the launch)


def launch_grid(model: KernelModel, site: LaunchSite) -> GridInfo | None:
    sl = site.node.func.slice
    fn = enclosing_function(model, site)
    var, assign = None, None
    if isinstance(sl, ast.Name) and fn is not None:
        var = sl.id
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and node.targets[0].id == var and node.lineno < site.line:
                if assign is None or node.lineno > assign.lineno:
                    assign = node
        if assign is None:
            return _def_grid(fn, var, site.line)
        sl = assign.value
    if isinstance(sl, ast.Tuple):
        return GridInfo("tuple", list(sl.elts), None, var, assign)
    if isinstance(sl, ast.Lambda) and len(sl.args.args) == 1 and isinstance(sl.body, ast.Tuple):
        return GridInfo("lambda", list(sl.body.elts), sl.args.args[0].arg, var, assign)
    return None


def _def_grid(fn: ast.AST, var: str, before: int) -> GridInfo | None:
    """A grid written as a nested function, ``def grid(meta): return (cdiv(M, meta["BLOCK_M"]), ...)``: read
    as the lambda it is (a rewrite replaces it at the launch and leaves the function unused)."""
    defs = [n for n in ast.walk(fn) if isinstance(n, ast.FunctionDef) and n.name == var and n.lineno < before]
    if not defs:
        return None
    d = max(defs, key=lambda n: n.lineno)
    body = [st for st in d.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
    if len(d.args.args) == 1 and len(body) == 1 and isinstance(body[0], ast.Return) and \
            isinstance(body[0].value, ast.Tuple):
        return GridInfo("lambda", list(body[0].value.elts), d.args.args[0].arg, var, None)
    return None


def _cdiv_args(node: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    if isinstance(node, ast.Call) and len(node.args) == 2 and not node.keywords:
        name = dotted_name(node.func) or ""
        if name.rsplit(".", 1)[-1] == "cdiv":
            return node.args[0], node.args[1]
    return None


class GridTranslator:
    """Translates a launch's grid expression into kernel terms (``tl.cdiv(M, BLOCK_M)``) and ``META`` terms.

    ``cdiv(h, 32)`` is understood when ``h`` is the host expression bound to a kernel parameter that bounds a
    tile axis whose block constexpr is 32 at the launch (or ``META["BLOCK_M"]`` in a lambda grid).
    """

    def __init__(self, model: KernelModel, site: LaunchSite, an: KernelAnalysis, grid: GridInfo) -> None:
        self.model, self.site, self.an, self.grid = model, site, an, grid
        self.bind = launch_bindings(site, model.functions[site.kernel], model.source)
        self.host_to_param: dict[str, str] = {}
        for p, src in self.bind.items():
            if p in an.params and p not in an.constexprs:
                self.host_to_param.setdefault(src.strip(), p)
        # bound parameter -> block constexprs used with it
        self.bound_blocks: dict[str, set[str]] = {}
        for pv in program_id_vars(an.node)[0]:
            for blk, bound in axis_tiles(an, pv.name):
                b = bound.single_symbol()
                if b:
                    self.bound_blocks.setdefault(b, set()).add(blk)
        for acc in an.accesses:
            for m in ([acc.mask] if isinstance(acc.mask, Mask) else []):
                for bd in m.bounds:
                    blk, b = block_symbol(bd.vec.size, an.constexprs), bd.limit.single_symbol()
                    if blk and b and bd.vec.start.symbols() and \
                            any(blk in mono for mono, _ in bd.vec.start.terms):
                        self.bound_blocks.setdefault(b, set()).add(blk)

    def _src(self, node: ast.AST) -> str:
        return segment_of(self.model.source, node) or ast.unparse(node)

    def block_of(self, bound_param: str | None, divisor: ast.AST) -> str:
        """The block constexpr ``divisor`` stands for in a ``cdiv(<bound_param's value>, divisor)`` grid element
        (``bound_param`` None: a size the kernel is not given; any block constexpr of the launch then)."""
        cands = sorted(self.bound_blocks.get(bound_param, set()) if bound_param else self.an.constexprs)
        if self.grid.kind == "lambda" and isinstance(divisor, ast.Subscript) and \
                isinstance(divisor.value, ast.Name) and divisor.value.id == self.grid.meta:
            key = literal(divisor.slice)
            if is_literal(key) and key in self.an.constexprs:
                return key
            raise NotApplicable(f"grid divisor {self._src(divisor)} is not a constexpr of {self.site.kernel}")
        val = literal(divisor)
        if not is_literal(val):
            # the same expression the launch passes for a block constexpr: ``cdiv(M, bm)`` with ``BM=bm``
            src = self._src(divisor).strip()
            match = [b for b in cands if (self.bind.get(b) or "").strip() == src]
            if not match:  # the kernel's tile axes are not read from masks (tensor descriptors): the launch says
                match = [b for b in sorted(self.an.constexprs) if (self.bind.get(b) or "").strip() == src]
            if len(match) == 1:
                return match[0]
            raise NotApplicable(f"grid divisor {src} at line {self.site.line} is neither a literal block size nor "
                                f"the expression the launch passes for {' or '.join(cands) or 'a block constexpr'}")
        values = {b: bd.value for b, bd in bindings(self.model, self.site).items()}
        match = [b for b in cands if values.get(b) == val]
        if len(match) != 1:
            raise NotApplicable(f"cannot tell which block constexpr the grid's cdiv(..., {val}) stands for "
                                + (f"(candidates for {bound_param}: {', '.join(cands) or 'none'})" if bound_param else
                                   f"(blocks of that value: {', '.join(match) or 'none'})"))
        return match[0]

    def cdiv_parts(self, node: ast.AST, pass_size: Callable[[str], str] | None = None,
              need_param: bool = True) -> tuple[str, str | None, str] | None:
        """(host numerator, kernel parameter, block constexpr) of a ``cdiv(num, BLOCK)`` grid element, else None.
        A numerator the kernel is not given is refused, unless ``pass_size`` names a new kernel argument for it (a
        size the wrapper computes, ``max_seqlen``: the kernel divides it by its block, so the tile count follows a
        later change of the block) or ``need_param`` is off (host terms only)."""
        cd = _cdiv_args(node)
        if cd is None:
            return None
        num, div = cd
        src = self._src(num).strip()
        param = self.host_to_param.get(src)
        if param is not None:
            return src, param, self.block_of(param, div)
        plain = not any(isinstance(n, ast.Call) and not (
            isinstance(n.func, ast.Attribute) and n.func.attr in ("size", "numel")) for n in ast.walk(num))
        if need_param and not (pass_size is not None and plain):
            raise NotApplicable(f"grid size {src} is not passed to {self.site.kernel}")
        try:
            blk = self.block_of(None, div)
        except NotApplicable as exc:
            raise NotApplicable(f"grid size {src} is not an argument of {self.site.kernel}, and {exc}") from None
        return src, (pass_size(src) if need_param else None), blk

    def kernel_expr(self, node: ast.AST, pass_size: Callable[[str], str] | None = None) -> str:
        """The grid element in kernel terms, e.g. ``tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)``; ``pass_size``: see
        :meth:`cdiv_parts`."""
        cd = self.cdiv_parts(node, pass_size)
        if cd is not None:
            _, param, blk = cd
            return f"tl.cdiv({param}, {blk})"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return f"{self.kernel_expr(node.left, pass_size)} * {self.kernel_expr(node.right, pass_size)}"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # two kinds of tile on one axis
            return f"({self.kernel_expr(node.left, pass_size)} + {self.kernel_expr(node.right, pass_size)})"
        src = self._src(node).strip()
        if src in self.host_to_param:
            return self.host_to_param[src]
        raise NotApplicable(f"grid size {src} is not a kernel argument or cdiv(arg, BLOCK)")

    def meta_expr(self, node: ast.AST, meta: str = "META") -> str:
        """The grid element with literal block sizes replaced by ``META["BLOCK"]`` (host code)."""
        cd = self.cdiv_parts(node, need_param=False)
        if cd is not None:
            num, _, blk = cd
            return f"triton.cdiv({num}, {meta}[{blk!r}])"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return f"{self.meta_expr(node.left, meta)} * {self.meta_expr(node.right, meta)}"
        src = self._src(node).strip()
        if self.grid.kind == "lambda" and self.grid.meta in names_in(node):
            if self.grid.meta != meta:
                raise NotApplicable(f"grid uses a lambda parameter named {self.grid.meta}")
        return src

    def blocks_in(self, node: ast.AST) -> list[str]:
        """The block constexprs a grid element divides by."""
        try:
            cd = self.cdiv_parts(node, need_param=False)
        except NotApplicable:  # a size the kernel is not given, over a divisor no block constexpr stands for
            return []
        if cd is not None:
            return [cd[2]]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return self.blocks_in(node.left) + self.blocks_in(node.right)
        return []


def single_launch(model: KernelModel, kernel: str) -> LaunchSite:
    sites = [s for s in model.launches if s.kernel == kernel]
    if len(sites) != 1:
        raise NotApplicable(f"{kernel} is launched from {len(sites)} places (the rewrite needs exactly one)")
    return sites[0]


def gemm_kernels(model: KernelModel) -> list[str]:
    """Launched kernels whose body calls ``tl.dot``, in launch order (only those that run, where traced)."""
    out = []
    for site in live_launches(model):
        fn = model.functions[site.kernel]
        if site.kernel not in out and any(is_tl_call(n, "dot") for n in ast.walk(fn.node)):
            out.append(site.kernel)
    return out


def dot_helpers(model: KernelModel, kernel: str) -> list[str]:
    """The jit helpers ``kernel`` calls whose body calls ``tl.dot`` (the tutorial attention's K loop), when the
    kernel's own body does not."""
    fn = model.functions[kernel]
    if any(is_tl_call(n, "dot") for n in ast.walk(fn.node)):
        return []
    called = {dotted_name(n.func) for n in ast.walk(fn.node) if isinstance(n, ast.Call)}
    return sorted(c for c in called if c in model.functions and c != kernel
                  and any(is_tl_call(n, "dot") for n in ast.walk(model.functions[c].node)))


def launched_kernels_gemm_first(model: KernelModel) -> list[str]:
    """Launched kernels, GEMM-like (tl.dot) first, then the rest in launch order (only those that run, where
    traced: a backward kernel forward never launches is not a target)."""
    dots = gemm_kernels(model)
    rest = [s.kernel for s in live_launches(model) if s.kernel not in dots]
    return dots + list(dict.fromkeys(rest))


def fresh_name(taken: Iterable[str], base: str) -> str:
    taken = set(taken)
    if base not in taken:
        return base
    i = 2
    while f"{base}_{i}" in taken:
        i += 1
    return f"{base}_{i}"


def no_dot_reason(model: KernelModel, kernel: str | None, tactic: str, purpose: str) -> str:
    """Why ``tactic``, which rewrites a K loop written in the kernel itself (split-K, the swizzle), finds no
    ``tl.dot`` in ``kernel`` (or, with None, in any launched kernel): a jit helper that calls it is named."""
    kernels = [kernel] if kernel else list(dict.fromkeys(s.kernel for s in live_launches(model)))
    via = {k: h for k in kernels if k in model.functions and (h := dot_helpers(model, k))}
    if via:
        return "; ".join(f"{k}'s tl.dot is in its jit helper {', '.join(h)}, whose loop {tactic} does not rewrite"
                         for k, h in via.items())
    return f"{kernel} has no tl.dot: {purpose}" if kernel else f"no launched kernel calls tl.dot: {purpose}"
