"""Block I/O rewrite: the tile loads of a GEMM's K loop (and its tile store) become tensor descriptors.

Owns: planning and applying the block_io stage's codemod. Recognised accesses (see
:mod:`xeforge.rewrite.tiling`): a rank-2 pointer tile ``base + rows[:, None] * s0 + cols[None, :] * s1`` with a
bounds mask on each dimension (or none on a dimension read whole from 0, ``tl.arange(0, HEAD_DIM)``: its block
is then its extent) and ``other`` absent or zero, whose matrix may start at an offset of the base made of
arguments, program ids and scalars it loads first (a batch's or head's: ``k_ptr + off_b * stride_kb``; a packed
sequence's, ``seq_start = tl.load(Cu_seqlens + b)``: where the descriptor is made),
or a block pointer; loads inside a loop that calls ``tl.dot``, rank-2 loads after it (an epilogue's residual or
scale tile), and rank-2 stores of the result. Tile coordinates a scalar-only jit helper computes are read through
it (:class:`~xeforge.rewrite.tiling.KernelAnalysis` with the file's helpers). Each becomes

- ``desc = tl.make_tensor_descriptor(base, shape=[R, C], strides=[s0, 1], block_shape=[BR, BC])`` and
  ``desc.load([r0, c0])`` / ``desc.store([r0, c0], value)`` (out-of-bounds reads are zero, writes are
  dropped, so the masks' boundary handling is kept), or
- the block-pointer spelling (``tl.make_block_ptr`` + ``tl.advance`` + ``boundary_check``) where the target
  Triton has no descriptors but still has block pointers.

Descriptors need the contiguous dimension last with a literal stride of 1, 16-byte aligned bases and 16-byte
multiples for the other strides (and for the strides of a start offset, so every batch's start is aligned). When the
contiguous dimension of an operand is its first (a weight used as ``W^T``), the descriptor describes the transposed
view and the loaded tile is transposed back with ``.T``. The conditions are checked at run time in ``forward``: the
kernel gets a ``USE_BLOCK_IO`` constexpr and keeps its original loop for inputs that do not qualify (ragged,
unaligned or non-contiguous strides), so every shape stays correct. On CUDA, device-side descriptors need a scratch
allocator, set in ``forward`` (``triton.set_allocator``); Intel GPUs and the interpreter do not. Descriptor
coordinates are int32: those computed from program ids that the memory_access stage made int64 are narrowed with
``.to(tl.int32)``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from xeforge.analysis.launches import live_launches
from xeforge.kernel_model import KernelModel, LaunchSite, dotted_name, parse_kernel
from xeforge.rewrite.tiling import (Access, BlockPtr, KernelAnalysis, LoopInfo, Mask, NotApplicable, Poly, Ptr,
                                   is_tl_call)
from xeforge.rewrite.tiling.grid import (dot_helpers, fresh_name, gemm_kernels, launch_bindings, pid_derived_names,
                                         single_launch)
from xeforge.rewrite.cst_tools import expr, statements
from xeforge.rewrite.jit_inline import inline_helpers
from xeforge.rewrite.tiling.pids import hoist_program_ids
from xeforge.rewrite.tiling.edit import FunctionEdit, LaunchEdit, edit_function, edit_launch, if_else

FLAG = "USE_BLOCK_IO"
DESCRIPTOR = "descriptor"
BLOCK_PTR = "block_ptr"
#: host expressions the run-time guard may evaluate twice (no calls other than .stride(i))
_PLAIN_TENSOR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_STRIDE_ARG = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)\.stride\((-?\d+)\)$")


@dataclass
class TileDim:
    shape: Poly
    stride: Poly
    block: Poly
    start: Poly


@dataclass
class DescSpec:
    name: str
    base: str
    dims: list[TileDim]  # in descriptor order: the contiguous dimension last
    transposed: bool  # descriptor order is the tile's order reversed
    offset: Poly | None = None  # where the tile's matrix starts in ``base`` (a batch's: ``bid * stride_ab``)
    wide: frozenset[str] = frozenset()  # the offset's tensor-valued names (not constexprs): its products in int64

    def key(self) -> tuple:
        return (self.base, self.offset, self.transposed, tuple((d.shape, d.stride, d.block) for d in self.dims))

    def start(self) -> str:
        """The pointer the descriptor is made at (its offset computed in 64 bits, as a batch's can need)."""
        return f"{self.base} + {self.offset.code(self.wide)}" if self.offset is not None else self.base


@dataclass
class AccessPlan:
    access: Access
    desc: DescSpec
    coords: list[Poly]  # descriptor order


@dataclass
class BlockIOPlan:
    kernel: str
    site: LaunchSite
    mode: str  # descriptor | block_ptr
    descs: list[DescSpec]
    accesses: list[AccessPlan]
    skipped: list[str]  # accesses left as they were, with the reason
    guards: list[str]  # host conditions for the fast path
    remove_lines: set[int] = field(default_factory=set)
    int32_coords: set[str] = field(default_factory=set)  # int64 program-id names: their coordinates are narrowed
    inlined: list[str] = field(default_factory=list)  # the jit helpers inlined first (the K loop was in one)

    def describe(self) -> str:
        what = "tensor descriptors" if self.mode == DESCRIPTOR else "block pointers"
        ops = ", ".join(f"{p.access.kind} of {p.desc.base}" + (" (transposed view)" if p.desc.transposed else "")
                        for p in self.accesses)
        text = f"{self.kernel}: {ops} through {what}"
        if self.skipped:
            text += f"; left as pointers: {'; '.join(self.skipped)}"
        if self.inlined:
            text += f"; the jit helper{'s' if len(self.inlined) > 1 else ''} {', '.join(self.inlined)} inlined into " \
                    f"{self.kernel} first (its K loop was there)"
        return text


def _contiguous_dim(strides: list[Poly], bind: dict[str, str]) -> int:
    """The tile dimension with unit stride: a literal 1, else the one bound to the highest ``t.stride(i)``."""
    for d, s in enumerate(strides):
        if s.const_value == 1:
            return d
    best, best_idx = len(strides) - 1, None
    for d, s in enumerate(strides):
        name = s.single_symbol()
        m = _STRIDE_ARG.match(bind.get(name, "").replace(" ", "")) if name else None
        if m:
            idx = int(m.group(2))
            idx = 10**6 if idx < 0 else idx
            if best_idx is None or idx > best_idx:
                best, best_idx = d, idx
    return best


def _pointer_tile_of_rank_2(ptr) -> bool:
    return isinstance(ptr, Ptr) and ptr.rank == 2 and len(ptr.offs.terms) == 2


def _defined_before(an: KernelAnalysis, stmt: ast.stmt) -> set[str]:
    """The kernel's parameters and the names its top-level statements before ``stmt`` assign once (a program's
    fixed scalars, ``seq_start = tl.load(Cu_seqlens + b)``): what a descriptor made before ``stmt`` may read."""
    out = set(an.params)
    for st in an.node.body:
        if st is stmt:
            break
        targets = st.targets if isinstance(st, ast.Assign) else [st.target] if isinstance(st, ast.AnnAssign) else []
        out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name) and an.single_assignment(n.id)}
    return out


def _tile_dims(an: KernelAnalysis, acc: Access, loop_names: set[str]) -> list[TileDim]:
    """The shape, stride, block and start of each dimension of a recognised rank-2 access, or NotApplicable."""
    params = _defined_before(an, acc.stmt)
    ptr = acc.ptr
    dims: list[TileDim] = []
    if isinstance(ptr, BlockPtr):
        if len(ptr.shape) != 2:
            raise NotApplicable(f"block pointer of rank {len(ptr.shape)}")
        if acc.padding not in (None, "zero"):
            raise NotApplicable(f"padding_option={acc.padding!r} (descriptors pad with zeros)")
        for shape, stride, block, start in zip(ptr.shape, ptr.strides, ptr.block, ptr.offsets):
            dims.append(TileDim(shape, stride, block, start))
    elif isinstance(ptr, Ptr):
        if not _pointer_tile_of_rank_2(ptr):
            raise NotApplicable("not a rank-2 tile of pointers")
        if acc.has_other and acc.other not in (0, 0.0):
            raise NotApplicable(f"other={acc.other!r} (descriptors pad out-of-bounds reads with zeros)")
        if acc.mask is not None and not isinstance(acc.mask, Mask):
            raise NotApplicable("the mask is not a bound on each dimension (descriptors need the tensor's shape)")
        all_bounds = acc.mask.bounds if isinstance(acc.mask, Mask) else ()
        used = 0
        for d in (0, 1):
            term = ptr.term(d)
            bounds = [b for b in all_bounds if b.dim == d]
            if term is not None and not bounds and term.vec.start.is_zero and \
                    (term.vec.size.is_const or term.vec.size.single_symbol() in an.constexprs):
                # no bound, from 0: the tile covers the whole dimension (an attention head's HEAD_DIM), which is
                # then the descriptor's extent
                dims.append(TileDim(term.vec.size, term.stride, term.vec.size, term.vec.start))
                continue
            extent = _loop_extent(acc, term) if term is not None and not bounds else None
            if extent is not None:
                # no bound, the tile stepped by the loop over the whole dim (a K loop whose kernel assumes
                # K % BLOCK_K == 0 and leaves K unmasked): the loop's stop is the descriptor's extent
                dims.append(TileDim(extent, term.stride, term.vec.size, term.vec.start))
                continue
            if term is None or len(bounds) != 1:
                raise NotApplicable(f"dimension {d} has {len(bounds)} bound(s) in the mask (one expected, or the "
                                    "loop that steps it by its block over the whole dimension)")
            b = bounds[0]
            if b.vec.size != term.vec.size:
                raise NotApplicable(f"dimension {d}'s mask uses a different arange than its pointers")
            shape = b.limit - b.vec.start + term.vec.start
            dims.append(TileDim(shape, term.stride, term.vec.size, term.vec.start))
            used += 1
        if len(all_bounds) != used:
            raise NotApplicable("the mask has conditions beyond the two bounds")
    else:
        loaded = _loaded_names(an, acc)
        if loaded:
            raise NotApplicable(f"its tile starts at {loaded[0]}, a value the kernel loads from memory (line "
                                f"{loaded[1]}): the analysis reads tile starts made of arguments and program ids")
        raise NotApplicable("the pointers are not base + start + tl.arange(0, BLOCK) tiles (wrapped with %, "
                            "gathered or computed another way)")
    for d, td in enumerate(dims):
        if td.shape.symbols() - params or td.shape.symbols() & loop_names:
            raise NotApplicable(f"dimension {d}'s extent {td.shape.code()} is not a kernel argument or a value "
                                "fixed before the access")
        if td.stride.symbols() - set(an.params):
            raise NotApplicable(f"dimension {d}'s stride {td.stride.code()} is not a kernel argument")
        blk = td.block.single_symbol()
        if not (td.block.is_const or (blk and blk in an.constexprs)):
            raise NotApplicable(f"dimension {d}'s block {td.block.code()} is not a constexpr")
    return dims


def _loop_extent(acc: Access, term: Any) -> Poly | None:
    """The stop of the loop whose variable is this dimension's tile start, stepping by the tile's block from 0
    (``for k0 in range(0, K, BLOCK_K)`` with ``k0 + tl.arange(0, BLOCK_K)``), None otherwise."""
    for lp in acc.loops:
        if lp.var is None or lp.stop is None or lp.step is None or not (lp.start is None or lp.start.is_zero):
            continue
        if (term.vec.start - Poly.sym(lp.var)).is_zero and (lp.step - term.vec.size).is_zero:
            return lp.stop
    return None


def _offset_of(an: KernelAnalysis, acc: Access, loop_names: set[str]) -> Poly | None:
    """Where a pointer tile's matrix starts in its base (``a_ptr + bid * stride_ab``: a batch's matrix; ``K +
    seq_start * stride_kt``: a packed sequence's), None for the base itself; NotApplicable where the start moves in
    the K loop or is made of anything but the kernel's arguments and the values it fixes before the access (the
    descriptor is made once, before the loop)."""
    ptr = acc.ptr
    if isinstance(ptr, BlockPtr):
        if ptr.start is None or ptr.start.is_zero:
            return None
        off = ptr.start
    elif not isinstance(ptr, Ptr) or ptr.offs.scalar.is_zero:
        return None
    else:
        off = ptr.offs.scalar
    if off.symbols() & loop_names or off.symbols() - _defined_before(an, acc.stmt):
        raise NotApplicable(f"the base pointer {ptr.base} is offset by {off.code()}, which is not made of the "
                            "kernel's arguments and the values it fixes before the access")
    for mono, _ in off.terms:
        if not set(mono) & set(an.params):
            raise NotApplicable(f"the base pointer {ptr.base} is offset by {off.code()}: its term "
                                f"{' * '.join(mono) or 'constant'} has no stride argument to check for alignment")
    return off


def _loaded_names(an: KernelAnalysis, acc: Access) -> tuple[str, int] | None:
    """(name, line) of a value loaded from memory that an access's pointer is made from (``seq_start =
    tl.load(Cu_seqlens + b)`` for a packed sequence's start), through the names that make it; None if none."""
    made: dict[str, ast.AST] = {}
    for st in ast.walk(an.node):
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            made.setdefault(st.targets[0].id, st.value)
    todo = [n.id for n in ast.walk(acc.call.args[0]) if isinstance(n, ast.Name)] if acc.call.args else []
    seen: set[str] = set()
    while todo:
        name = todo.pop(0)
        if name in seen or name not in made:
            continue
        seen.add(name)
        if any(is_tl_call(n, "load") for n in ast.walk(made[name])):
            return name, made[name].lineno
        todo += [n.id for n in ast.walk(made[name]) if isinstance(n, ast.Name)]
    return None


def _base_of(acc: Access, params: list[str] | None = None) -> str:
    if isinstance(acc.ptr, (Ptr, BlockPtr)):
        return acc.ptr.base
    if acc.call.args:  # the leftmost operand of the pointer sum (``k_base + rows * s``): its base, as written
        node = acc.call.args[0]
        while isinstance(node, ast.BinOp):
            node = node.left
        if isinstance(node, ast.Name):
            return node.id
        names = [n.id for n in ast.walk(acc.call.args[0]) if isinstance(n, ast.Name) and n.id in (params or ())]
        if names:
            return names[0]
    return "?"


def plan_block_io(model: KernelModel, kernel: str, mode: str = DESCRIPTOR, epilogue_loads: bool = False
                  ) -> BlockIOPlan:
    """The accesses of ``kernel`` that become descriptors: its K loop's tile loads and its result's store, and with
    ``epilogue_loads`` the rank-2 tile loads after the K loop too (their staging buffers cost shared memory, so
    they are a separate candidate, timed)."""
    fn = model.functions[kernel]
    if FLAG in fn.params:
        raise NotApplicable(f"{kernel} already has structured loads ({FLAG})")
    an = KernelAnalysis(fn, model.functions, scalar_loads=True)
    if an.has_call("make_tensor_descriptor") or an.has_call("_experimental_make_tensor_descriptor"):
        raise NotApplicable(f"{kernel} already uses tensor descriptors")
    if mode == BLOCK_PTR and an.has_call("make_block_ptr"):
        raise NotApplicable(f"{kernel} already uses block pointers")
    site = single_launch(model, kernel)
    bind = launch_bindings(site, fn, model.source)
    dot_loops = an.dot_loops()
    if not dot_loops:
        raise NotApplicable(f"{kernel} has no loop that calls tl.dot")
    dot_loop_ids = {id(lp.node) for lp in dot_loops}
    loop_names: set[str] = set()
    for lp in dot_loops:
        loop_names |= lp.assigned
    loop_end = max(lp.node.end_lineno or lp.node.lineno for lp in dot_loops)
    candidates: list[Access] = []
    for acc in an.accesses:
        in_dot_loop = any(id(lp.node) in dot_loop_ids for lp in acc.loops)
        if acc.kind == "load" and in_dot_loop:
            candidates.append(acc)
        elif not acc.loops and (acc.kind == "store" or (epilogue_loads and acc.stmt.lineno > loop_end)):
            candidates.append(acc)  # the result's store, and the epilogue's tile loads (a residual, a scale)
    descs: dict[tuple, DescSpec] = {}
    plans: list[AccessPlan] = []
    skipped: list[str] = []
    taken = {n.id for n in ast.walk(fn.node) if isinstance(n, ast.Name)} | set(fn.params)
    for acc in candidates:
        if acc.kind == "load" and not acc.loops and isinstance(acc.ptr, Ptr) and not _pointer_tile_of_rank_2(acc.ptr):
            continue  # an epilogue's bias vector or scalar: nothing for a 2D descriptor to move
        try:
            dims = _tile_dims(an, acc, loop_names if acc.kind == "load" else set())
            cont = _contiguous_dim([d.stride for d in dims], bind)
            transposed = cont == 0
            if transposed and acc.kind == "store":
                raise NotApplicable("the store's contiguous dimension is its first")
            order = [1, 0] if transposed else [0, 1]
            ddims = [dims[i] for i in order]
            if ddims[-1].stride.const_value != 1 and ddims[-1].stride.single_symbol() is None:
                raise NotApplicable(f"the contiguous stride {ddims[-1].stride.code()} is not one argument")
            for td in ddims[:-1]:
                if not (td.stride.single_symbol() or td.stride.is_const):
                    raise NotApplicable(f"stride {td.stride.code()} is not one argument")
            offset = _offset_of(an, acc, loop_names if acc.kind == "load" else set())
            _check_host_args(acc, ddims, bind, offset)
            wide = frozenset(offset.symbols() - set(an.constexprs)) if offset is not None else frozenset()
            spec = DescSpec("", _base_of(acc), ddims, transposed, offset, wide)
            if spec.key() not in descs:
                stem = re.sub(r"_ptrs?$", "", spec.base) or spec.base
                spec.name = fresh_name(taken, f"{stem}_desc" if mode == DESCRIPTOR else f"{stem}_bp")
                taken.add(spec.name)
                descs[spec.key()] = spec
            spec = descs[spec.key()]
            plans.append(AccessPlan(acc, spec, [d.start for d in ddims]))
        except NotApplicable as exc:
            skipped.append(f"{acc.kind} of {_base_of(acc, an.params)} at line {acc.line}: {exc}")
    loads = [p for p in plans if p.access.kind == "load" and p.access.loops]
    if not loads:
        raise NotApplicable(f"no tile load of {kernel}'s K loop can become a descriptor ("
                            + ("; ".join(skipped) or "no loads in the loop") + ")")
    # a store is converted only when it writes the GEMM result (values computed after the loop)
    plans = [p for p in plans if p.access.kind == "load" or _stores_result(an, p.access, dot_loops)]
    remove = _dead_increments(an, plans)
    guards = _guards(list(descs.values()), bind, plans, mode)
    int64_ids = any(isinstance(n, ast.Attribute) and n.attr == "to" and isinstance(n.value, ast.Call)
                    and (dotted_name(n.value.func) or "").endswith("program_id") for n in ast.walk(fn.node))
    int64_names = pid_derived_names(fn.node) if int64_ids else set()
    return BlockIOPlan(kernel, site, mode, [d for d in descs.values() if any(p.desc is d for p in plans)], plans,
                       skipped, guards, remove, int64_names)


def _check_host_args(acc: Access, ddims: list[TileDim], bind: dict[str, str], offset: Poly | None = None) -> None:
    base = _base_of(acc)
    if not _PLAIN_TENSOR.match(bind.get(base, "").strip()):
        raise NotApplicable(f"the launch passes {bind.get(base, '?')!r} for {base}, not a plain tensor expression")
    strides = [td.stride.single_symbol() for td in ddims] + sorted(_offset_strides(offset, bind))
    for s in strides:
        if s is None:
            continue
        arg = bind.get(s, "").replace(" ", "")
        if not (_STRIDE_ARG.match(arg) or _PLAIN_TENSOR.match(arg) or arg.isdigit()):
            raise NotApplicable(f"the launch passes {bind.get(s)!r} for {s}")


def _stores_result(an: KernelAnalysis, acc: Access, dot_loops: list[LoopInfo]) -> bool:
    if acc.value_node is None:
        return False
    used = {n.id for n in ast.walk(acc.value_node) if isinstance(n, ast.Name)}
    after: set[str] = set()
    seen_loop = False
    loop_ids = {id(lp.node) for lp in dot_loops}
    for st in an.node.body:
        if any(id(n) in loop_ids for n in ast.walk(st)):
            seen_loop = True
            for lp in dot_loops:
                after |= lp.assigned
            continue
        if seen_loop:
            for n in ast.walk(st):
                if isinstance(n, ast.Assign):
                    for t in n.targets:
                        after |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
    return bool(used & after)


def _dead_increments(an: KernelAnalysis, plans: list[AccessPlan]) -> set[int]:
    """Lines of loop-carried pointer increments whose pointer only feeds converted accesses."""
    converted = {id(p.access.call) for p in plans}
    out: set[int] = set()
    for lp in an.loops:
        for name in lp.carried:
            users = [a for a in an.accesses if a.call.args and isinstance(a.call.args[0], ast.Name)
                     and a.call.args[0].id == name]
            if not users or any(id(a.call) not in converted for a in users):
                continue
            for st in lp.node.body:
                targets = [st.target] if isinstance(st, ast.AugAssign) else (
                    st.targets if isinstance(st, ast.Assign) else [])
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    out.add(st.lineno)
    return out


def _offset_strides(offset: Poly | None, bind: dict[str, str]) -> set[str]:
    """The kernel arguments of a descriptor's start offset that the launch passes (its batch strides)."""
    return {sym for mono, _ in (offset.terms if offset is not None else ()) for sym in mono if sym in bind}


def _guards(descs: list[DescSpec], bind: dict[str, str], plans: list[AccessPlan], mode: str) -> list[str]:
    """Host conditions for the fast path: the contiguous stride is 1 (both forms); descriptors also need a
    16-byte aligned base and 16-byte multiples for the other strides."""
    out: list[str] = []
    for d in descs:
        if not any(p.desc is d for p in plans):
            continue
        t = bind[d.base].strip()
        conds = [f"{t}.data_ptr() % 16 == 0"] if mode == DESCRIPTOR else []
        last = d.dims[-1].stride.single_symbol()
        if last is not None:
            conds.append(f"{bind[last].strip()} == 1")
        for td in (d.dims[:-1] if mode == DESCRIPTOR else []):
            s = td.stride.single_symbol()
            arg = bind[s].strip() if s else td.stride.code()
            conds.append(f"({arg} * {t}.element_size()) % 16 == 0")
        for s in sorted(_offset_strides(d.offset, bind)) if mode == DESCRIPTOR else []:
            conds.append(f"({bind[s].strip()} * {t}.element_size()) % 16 == 0")  # each batch's start stays aligned
        for c in conds:
            if c not in out:
                out.append(c)
    return out


# ------------------------------------------------------------------------------------------------ apply
def _list(polys: list[Poly], int64_names: set[str] | frozenset = frozenset()) -> str:
    """Coordinates as a list. Descriptor and block-pointer offsets are int32, so coordinates computed from int64
    program ids (cast by the memory_access stage) are narrowed: a coordinate indexes one dimension of the
    tensor, which the descriptor's int32 shape bounds."""
    return "[" + ", ".join(f"({p.code()}).to(tl.int32)" if p.symbols() & int64_names else p.code()
                           for p in polys) + "]"


def _creation(d: DescSpec, mode: str) -> str:
    shape = ", ".join(td.shape.code() for td in d.dims)
    strides = ", ".join(td.stride.code() for td in d.dims[:-1]) + ", 1"
    block = ", ".join(td.block.code() for td in d.dims)
    if mode == DESCRIPTOR:
        return (f"{d.name} = tl.make_tensor_descriptor({d.start()}, shape=[{shape}], strides=[{strides}], "
                f"block_shape=[{block}])")
    zeros = ", ".join("0" for _ in d.dims)
    return (f"{d.name} = tl.make_block_ptr({d.start()}, shape=({shape}), strides=({strides}), offsets=({zeros}), "
            f"block_shape=({block}), order=(1, 0))")


def _load_expr(p: AccessPlan, mode: str, plan_int32: set[str] | frozenset = frozenset()) -> str:
    if mode == DESCRIPTOR:
        code = f"{p.desc.name}.load({_list(p.coords, plan_int32)})"
    else:
        dims = ", ".join(str(i) for i in range(len(p.coords)))
        code = f'tl.load(tl.advance({p.desc.name}, {_list(p.coords, plan_int32)}), boundary_check=({dims}), padding_option="zero")'
    return code + ".T" if p.desc.transposed else code


def _store_builder(p: AccessPlan, mode: str, plan_int32: set[str] | frozenset = frozenset()):
    def build(call: cst.Call) -> cst.BaseExpression:
        value = None
        for i, arg in enumerate(call.args):
            if (arg.keyword is not None and arg.keyword.value == "value") or (arg.keyword is None and i == 1):
                value = arg.value
        if value is None:
            raise NotApplicable("store without a value")
        if mode == DESCRIPTOR:
            new = expr(f"{p.desc.name}.store({_list(p.coords, plan_int32)}, __value__)")
        else:
            dims = ", ".join(str(i) for i in range(len(p.coords)))
            new = expr(f"tl.store(tl.advance({p.desc.name}, {_list(p.coords, plan_int32)}), __value__, boundary_check=({dims}))")
        return new.with_changes(args=[a if not (isinstance(a.value, cst.Name) and a.value.value == "__value__")
                                      else a.with_changes(value=value) for a in new.args])
    return build


def _bare(node: cst.BaseStatement) -> cst.BaseStatement:
    return node.with_changes(leading_lines=[]) if hasattr(node, "leading_lines") else node


def apply_block_io(source: str, plan: BlockIOPlan, allocator: bool) -> str:
    """The kernel file with ``plan`` applied (kernel body, signature, launch site)."""
    wrap_lines = {p.access.stmt.lineno for p in plan.accesses}
    calls: dict = {}
    for p in plan.accesses:
        c = p.access.call
        key = (c.lineno, c.col_offset, "tl.load" if p.access.kind == "load" else "tl.store")
        if p.access.kind == "load":
            calls[key] = (lambda code: (lambda _call: expr(code)))(_load_expr(p, plan.mode, plan.int32_coords))
        else:
            calls[key] = _store_builder(p, plan.mode, plan.int32_coords)
    creations = [_creation(d, plan.mode) for d in plan.descs]

    def body(original, updated, line_of):
        out = []
        placed = False
        for o, u in zip(original, updated):
            if line_of(o) not in wrap_lines:
                out.append(u)
                continue
            lead = list(getattr(o, "leading_lines", []))
            if not placed:
                note = ("tensor descriptors (2D block I/O, TMA) when the operands qualify, else the original code"
                        if plan.mode == DESCRIPTOR else
                        "block pointers when the operands qualify, else the original code")
                out.append(if_else(FLAG, [s for c in creations for s in statements(c)], None).with_changes(
                    leading_lines=[*lead, cst.EmptyLine(comment=cst.Comment(f"# {note}"))]))
                lead = []
                placed = True
            out.append(if_else(FLAG, [_bare(u)], [_bare(o)]).with_changes(leading_lines=lead))
        return out

    edit = FunctionEdit(plan.kernel, calls=calls, remove_lines=set(plan.remove_lines), body=body,
                        new_params=[f"{FLAG}: tl.constexpr"])
    source = edit_function(source, edit)
    model = parse_kernel(source)
    site = single_launch(model, plan.kernel)
    fwd_names = {n.id for n in ast.walk(model.tree) if isinstance(n, ast.Name)}
    var = fresh_name(fwd_names, "use_block_io")
    cond = " and ".join(plan.guards) or "True"
    before = [f"{var} = bool({cond})" if len(cond) < 60 else
              f"{var} = all((\n    " + ",\n    ".join(plan.guards) + ",\n))"]
    if allocator and plan.mode == DESCRIPTOR:
        t = launch_bindings(site, model.functions[plan.kernel], source)[plan.descs[0].base].strip()
        before.append(
            f'if {var} and {t}.device.type == "cuda":\n'
            f"    # device-side tensor descriptors (TMA) need a scratch allocation on NVIDIA GPUs\n"
            f"    triton.set_allocator(lambda size, align, stream, dev={t}.device: "
            f"torch.empty(size, dtype=torch.int8, device=dev))")
    return edit_launch(source, LaunchEdit(plan.kernel, site.line, set_kwargs={FLAG: var}, before=before))


def off_where(source: str, kernel: str, tests: list[str]) -> str:
    """``source``, a block_io rewrite of ``kernel``, with its fast path also off where one of ``tests`` holds (host
    expressions valid at the launch: the shape classes the rewrite lost at, which keep the original code):
    ``USE_BLOCK_IO=<guard> and not (<test>)``."""
    model = parse_kernel(source)
    site = single_launch(model, kernel)
    guard = site.other_kwargs.get(FLAG)
    if guard is None:
        raise NotApplicable(f"the launch of {kernel} at line {site.line} passes no {FLAG} (not a block_io rewrite)")
    expr = " and ".join([guard, *(f"not ({t})" for t in tests)])
    return edit_launch(source, LaunchEdit(kernel, site.line, set_kwargs={FLAG: expr}))


NO_GEMM = "no launched kernel calls tl.dot, itself or in a jit helper (block_io rewrites the tile loops of GEMM-like " \
          "kernels)"


def choose_kernel(model: KernelModel) -> str:
    kernels = gemm_kernels(model)
    if not kernels:
        raise NotApplicable(NO_GEMM)
    return kernels[0]


def rewrite(source: str, mode: str = DESCRIPTOR, allocator: bool = True, kernel: str | None = None,
            epilogue_loads: bool = False) -> tuple[str, BlockIOPlan]:
    source = hoist_program_ids(source)  # ``tl.program_id(0) * BLOCK_M + tl.arange(...)``: a named tile start
    model = parse_kernel(source)
    errors = []
    names = [kernel] if kernel else gemm_kernels(model) + [s.kernel for s in live_launches(model)
                                                             if dot_helpers(model, s.kernel)]
    for name in dict.fromkeys(names):
        helpers, src, m = dot_helpers(model, name), source, model
        try:
            if helpers:  # the K loop is in a jit helper: inlined, so the kernel's own body holds it
                src = inline_helpers(source, name, lambda h: h.name.value in helpers)[0]
                m = parse_kernel(src)
            plan = plan_block_io(m, name, mode, epilogue_loads)
        except NotApplicable as exc:
            errors.append(f"{name}: {exc}")
            continue
        plan.inlined = helpers
        return apply_block_io(src, plan, allocator), plan
    if not errors:
        raise NotApplicable(NO_GEMM)
    raise NotApplicable("; ".join(errors))


