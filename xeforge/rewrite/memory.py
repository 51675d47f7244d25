"""Memory-access analysis: uncoalesced tiles and int32 offset overflow at the spec's largest shapes.

Owns: the memory_access stage's detectors and its int64 codemod.

- **Uncoalesced access**: a load or store whose fast-moving (last) tile dimension has a stride that is not 1 —
  a literal other than 1, or a stride argument bound to ``t.stride(i)`` while the other dimension gets a
  later ``t.stride(j)`` (``j > i``): typically a weight used as ``W^T`` through ``w.stride(0)``.
- **int32 offset overflow**: Triton computes pointer offsets in int32 unless an operand is int64. For every
  variant of the spec, each kernel argument and the grid are read from the trace at that variant
  (:func:`launch_facts`; where host code cannot run on the meta device, the launching function is evaluated
  statically: input shapes from the spec, parameter shapes from the reference ``Model`` built on the meta device,
  outputs from ``torch.empty``-style allocations, strides of contiguous tensors); each access's largest offset
  ``sum(max index * stride)`` is then bounded with the program ids at their grid maxima, loop variables at
  their last iteration and masked dimensions at their bounds. An offset that can reach 2**31 is reported.
- **Codemod**: ``tl.program_id(a)`` becomes ``tl.program_id(a).to(tl.int64)`` in kernels with such an access,
  which makes every offset derived from the program id int64. Terms that overflow without a program id
  (e.g. a loop index times a large stride) are named in the reason, not rewritten.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst

from xeforge.analysis.observe import trace_at
from xeforge.analysis.observe import trace_at
from xeforge.analysis.trace import Trace
from xeforge.isolation import facts_worker
from xeforge.kernel_model import KernelModel, LaunchSite, dotted_name, is_literal, literal, parse_kernel
from xeforge.problem import plan_inputs
from xeforge.rewrite.tiling import BlockPtr, KernelAnalysis, Mask, NotApplicable, Poly, Ptr, is_tl_call
from xeforge.rewrite.tiling.grid import (enclosing_function, launch_bindings, launch_grid, pid_derived_names,
                                        program_id_vars)
from xeforge.rewrite.tiling.edit import FunctionEdit, edit_function

INT32_LIMIT = 2**31


# ------------------------------------------------------------------------------------------------ coalescing
@dataclass(frozen=True)
class Uncoalesced:
    kernel: str
    line: int
    kind: str
    base: str
    stride: str
    arg: str

    def message(self) -> str:
        return (f"{self.kernel}: the {self.kind} of {self.base} moves fastest along a dimension whose stride "
                f"{self.stride} is {self.arg}, not 1 (uncoalesced; load the tile in the tensor's own layout and "
                "transpose it with .T, or describe the transposed view with a tensor descriptor)")


def _stride_index(arg: str) -> tuple[str, int] | None:
    arg = arg.replace(" ", "")
    if arg.endswith(")") and ".stride(" in arg:
        tensor, _, idx = arg[:-1].rpartition(".stride(")
        try:
            return tensor, int(idx)
        except ValueError:
            return None
    return None


def uncoalesced(model: KernelModel) -> list[Uncoalesced]:
    out: list[Uncoalesced] = []
    for site in model.launches:
        fn = model.functions[site.kernel]
        try:
            bind = launch_bindings(site, fn, model.source)
        except NotApplicable:
            continue
        an = KernelAnalysis(fn)
        for acc in an.accesses:
            strides: list[Poly] = []
            if isinstance(acc.ptr, Ptr) and len(acc.ptr.offs.terms) == acc.ptr.rank:
                strides = [acc.ptr.term(d).stride for d in range(acc.ptr.rank)]
            elif isinstance(acc.ptr, BlockPtr):
                strides = list(acc.ptr.strides)
            if not strides:
                continue
            last = strides[-1]
            if last.const_value == 1:
                continue
            name = last.single_symbol()
            if last.is_const:
                out.append(Uncoalesced(site.kernel, acc.line, acc.kind, acc.ptr.base, last.code(), "a literal"))
                continue
            if name is None or name not in bind:
                continue
            mine = _stride_index(bind[name])
            others = [_stride_index(bind.get(s.single_symbol() or "", "")) for s in strides[:-1]]
            if mine and any(o and o[0] == mine[0] and (o[1] > mine[1] or o[1] == -1) and mine[1] != -1
                            for o in others):
                out.append(Uncoalesced(site.kernel, acc.line, acc.kind, acc.ptr.base, name, bind[name].strip()))
    return out


# ------------------------------------------------------------------------------------------------ host values
@dataclass(frozen=True)
class TensorVal:
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @staticmethod
    def contiguous(shape: tuple[int, ...]) -> "TensorVal":
        strides, acc = [], 1
        for d in reversed(shape):
            strides.append(acc)
            acc *= max(int(d), 1)
        return TensorVal(tuple(int(d) for d in shape), tuple(reversed(strides)))

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


_ALLOC = {"empty", "zeros", "ones", "full", "randn", "rand", "empty_strided"}
_LIKE = {"empty_like", "zeros_like", "ones_like", "full_like"}
_SAME = {"contiguous", "float", "half", "bfloat16", "to", "clone", "detach"}


class HostEval:
    """Evaluates ``forward`` statically for one variant: names -> ints / tensors (None when unknown)."""

    def __init__(self, env: dict[str, Any] | None = None, attrs: dict[str, Any] | None = None) -> None:
        self.env: dict[str, Any] = dict(env or {})
        self.attrs = dict(attrs or {})

    @classmethod
    def run(cls, fn: ast.FunctionDef, inputs: list[TensorVal], attrs: dict[str, Any]) -> "HostEval":
        """Follow ``fn``'s top-level statements (``self`` first, then one tensor per input)."""
        params = [a.arg for a in fn.args.args[1:]]
        ev = cls(dict(zip(params, inputs)), attrs)
        for st in fn.body:
            ev._stmt(st)
        return ev

    def _stmt(self, st: ast.stmt) -> None:
        if isinstance(st, ast.Assign):
            val = self.eval(st.value)
            for t in st.targets:
                self._assign(t, val)
        elif isinstance(st, (ast.If, ast.With)):
            for s in st.body:
                self._stmt(s)

    def _assign(self, target: ast.AST, val: Any) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = val
        elif isinstance(target, (ast.Tuple, ast.List)):
            vals = list(val) if isinstance(val, tuple) and len(val) == len(target.elts) else [None] * len(target.elts)
            for t, v in zip(target.elts, vals):
                self._assign(t, v)

    def eval(self, node: ast.AST) -> Any:
        try:
            return self._eval(node)
        except (ArithmeticError, TypeError, ValueError, IndexError, KeyError, AttributeError):
            return None

    def _eval(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, (int, float)) and not isinstance(node.value, bool) else None
        if isinstance(node, ast.Name):
            return self.env.get(node.id)
        if isinstance(node, ast.Tuple):
            return tuple(self._eval(e) for e in node.elts)
        if isinstance(node, ast.Attribute):
            full = dotted_name(node) or ""
            if full.startswith("self.") and full[len("self."):] in self.attrs:
                return self.attrs[full[len("self."):]]
            if full.count(".") == 1 and full.startswith("self."):
                return None
            base = self._eval(node.value)
            if isinstance(base, TensorVal):
                if node.attr == "shape":
                    return base.shape
                if node.attr in ("T", "mT") and len(base.shape) == 2:
                    return TensorVal(base.shape[::-1], base.strides[::-1])
            return None
        if isinstance(node, ast.Subscript):
            base = self._eval(node.value)
            idx = self._eval(node.slice)
            if isinstance(base, tuple) and isinstance(idx, int):
                return base[idx]
            return None
        if isinstance(node, ast.BinOp):
            a, b = self._eval(node.left), self._eval(node.right)
            if not isinstance(a, int) or not isinstance(b, int):
                return None
            ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                   ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b}
            f = ops.get(type(node.op))
            return f() if f else None
        if isinstance(node, ast.Call):
            return self._call(node)
        return None

    def _shape_arg(self, args: list[ast.AST]) -> tuple[int, ...] | None:
        if len(args) == 1:
            v = self._eval(args[0])
            if isinstance(v, tuple) and all(isinstance(x, int) for x in v):
                return v
            if isinstance(v, int):
                return (v,)
            return None
        vals = tuple(self._eval(a) for a in args)
        return vals if vals and all(isinstance(x, int) for x in vals) else None

    def _call(self, node: ast.Call) -> Any:
        name = dotted_name(node.func) or ""
        last = name.rsplit(".", 1)[-1] if name else (node.func.attr if isinstance(node.func, ast.Attribute) else "")
        args = [self._eval(a) for a in node.args]
        if last == "cdiv" and len(args) == 2 and all(isinstance(a, int) for a in args):
            return -(-args[0] // args[1])
        if last == "next_power_of_2" and len(args) == 1 and isinstance(args[0], int):
            return 1 << max(0, (args[0] - 1).bit_length())
        if name in ("min", "max") and args and all(isinstance(a, int) for a in args):
            return min(args) if name == "min" else max(args)
        if name.startswith("torch.") and last in _ALLOC:
            shape = self._shape_arg(node.args[:1] if last != "full" else node.args[:1])
            return TensorVal.contiguous(shape) if shape is not None else None
        if name.startswith("torch.") and last in _LIKE and args and isinstance(args[0], TensorVal):
            return TensorVal.contiguous(args[0].shape)
        if isinstance(node.func, ast.Attribute):
            obj = self._eval(node.func.value)
            if isinstance(obj, TensorVal):
                if last == "size":
                    return obj.shape[args[0]] if args else obj.shape
                if last == "stride":
                    return obj.strides[args[0]] if args else obj.strides
                if last == "numel":
                    return obj.numel
                if last == "dim":
                    return len(obj.shape)
                if last == "element_size":
                    return None
                if last in _SAME:
                    return TensorVal.contiguous(obj.shape) if last == "contiguous" else obj
                if last in ("view", "reshape"):
                    shape = self._shape_arg(node.args)
                    if shape is None:
                        return None
                    if -1 in shape:
                        known = 1
                        for d in shape:
                            if d != -1:
                                known *= d
                        shape = tuple(obj.numel // known if d == -1 else d for d in shape)
                    return TensorVal.contiguous(shape)
                if last in ("new_empty", "new_zeros", "new_ones"):
                    shape = self._shape_arg(node.args)
                    return TensorVal.contiguous(shape) if shape else None
                if last == "t" and len(obj.shape) == 2:
                    return TensorVal(obj.shape[::-1], obj.strides[::-1])
        return None


@functools.lru_cache(maxsize=32)
def _parameter_shapes(source: str, filename: str, init_args: tuple) -> dict[str, TensorVal]:
    """Shapes of the Model's parameters and buffers, built on the meta device in a worker (user code never runs
    in this process)."""
    reply = facts_worker().request("param_shapes", 120.0, source=source, filename=filename, init_args=list(init_args))
    return {str(k): TensorVal.contiguous(tuple(int(d) for d in v)) for k, v in reply["shapes"].items()}


def parameter_shapes(problem: Any, variant: Any) -> dict[str, TensorVal]:
    code = problem.oracle_code
    try:
        init = tuple(tuple(a) if isinstance(a, list) else a for a in problem.init_args(variant))
        return dict(_parameter_shapes(code.text, code.filename, init))
    except Exception:  # user code that cannot be built on the meta device: parameter shapes stay unknown
        return {}


def launch_values(model: KernelModel, site: LaunchSite, problem: Any, variant: Any) -> tuple[dict, dict] | None:
    """(kernel parameter -> value, host env) for ``site`` at ``variant``; None when forward cannot be followed."""
    fn = enclosing_function(model, site)
    if fn is None or any(isinstance(a, ast.Starred) for a in site.node.args):
        return None
    inputs = [TensorVal.contiguous(tp.shape) for tp in plan_inputs(problem, variant)]
    host = HostEval.run(fn, inputs, parameter_shapes(problem, variant))
    kfn = model.functions[site.kernel]
    values: dict[str, Any] = {}
    for p, a in zip(kfn.params, site.node.args):
        values[p] = host.eval(a)
    for kw in site.node.keywords:
        if kw.arg:
            values[kw.arg] = host.eval(kw.value)
    return values, host.env


def launch_facts(model: KernelModel, site: LaunchSite, problem: Any, variant: Any
                 ) -> tuple[dict[str, Any], list[int | None]] | None:
    """(kernel parameter -> value, grid size per axis) of ``site`` at ``variant``: from the trace of the source at
    that variant (what the launch really got, wherever it is launched from: a wrapper, a method, an autograd
    Function), else — host code the meta device cannot run — from the static evaluation of the launching
    function; None when neither can follow it. Tensors are :class:`TensorVal` (shape, strides)."""
    t = trace_at(problem, variant, model.source)
    if isinstance(t, Trace):
        mine = t.launches_of(site.kernel)
        at = [la for la in mine if la.site is not None and la.site.line == site.line]
        only = sum(s.kernel == site.kernel for s in model.launches) == 1
        la = at[0] if at else (mine[0] if mine and only else None)
        if la is not None:
            values: dict[str, Any] = {}
            for name, arg in la.args.items():
                values[name] = TensorVal(arg.shape, arg.strides) if arg.kind in ("tensor", "descriptor") \
                    else arg.value
            values.update(la.options)
            grid = list(la.grid) if isinstance(la.grid, tuple) else []
            return values, grid
    bound = launch_values(model, site, problem, variant)
    if bound is None:
        return None
    return bound[0], _grid_sizes(model, site, bound[1], bound[0])


# ------------------------------------------------------------------------------------------------ overflow
@dataclass
class Overflow:
    kernel: str
    line: int
    kind: str
    base: str
    offset: int
    variant: str
    pid_driven: bool  # the largest term comes from a program-id-derived index

    def message(self) -> str:
        how = "" if self.pid_driven else " (not through the program id: cast that index or stride to int64)"
        return (f"{self.kernel}: the {self.kind} of {self.base} can reach offset {self.offset:,} >= 2**31 at "
                f"variant {self.variant}; int32 offsets overflow{how}")


def _grid_sizes(model: KernelModel, site: LaunchSite, host_env: dict, values: dict) -> list[int | None]:
    grid = launch_grid(model, site)
    if grid is None:
        return []
    ev = HostEval(host_env)
    if grid.kind == "lambda" and grid.meta:
        ev.env[grid.meta] = {**site.constexprs, **{k: v for k, v in values.items() if isinstance(v, int)}}
    out = []
    for el in grid.elements:
        v = _eval_meta(ev, el, grid.meta)
        out.append(v if isinstance(v, int) else None)
    return out


def _eval_meta(ev: HostEval, node: ast.AST, meta: str | None) -> Any:
    if meta and isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == meta:
        key = literal(node.slice)
        return ev.env.get(meta, {}).get(key) if is_literal(key) else None
    if isinstance(node, ast.BinOp):
        a, b = _eval_meta(ev, node.left, meta), _eval_meta(ev, node.right, meta)
        if not (isinstance(a, int) and isinstance(b, int)):
            return None
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and b == 0:
            return None
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
               ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b}
        f = ops.get(type(node.op))
        return f() if f else None
    if isinstance(node, ast.Call) and (dotted_name(node.func) or "").rsplit(".", 1)[-1] in ("cdiv", "min", "max"):
        args = [_eval_meta(ev, a, meta) for a in node.args]
        if not all(isinstance(a, int) for a in args):
            return None
        name = (dotted_name(node.func) or "").rsplit(".", 1)[-1]
        return -(-args[0] // args[1]) if name == "cdiv" else (min(args) if name == "min" else max(args))
    return ev.eval(node)


def _num(node: ast.AST, vals: dict[str, int]) -> int | None:
    """A kernel-side integer expression with known names (params, constexprs), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        v = vals.get(node.id)
        return v if isinstance(v, int) else None
    if isinstance(node, ast.BinOp):
        a, b = _num(node.left, vals), _num(node.right, vals)
        if a is None or b is None:
            return None
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if isinstance(node.op, ast.FloorDiv) and b:
            return a // b
        return None
    if isinstance(node, ast.Call) and is_tl_call(node, "cdiv") and len(node.args) == 2:
        a, b = _num(node.args[0], vals), _num(node.args[1], vals)
        return -(-a // b) if a is not None and b else None
    return None


def overflows(model: KernelModel, problem: Any) -> list[Overflow]:
    """Accesses whose largest offset reaches 2**31 at some variant of the spec (largest variants first)."""
    variants = sorted(problem.spec.variants.values(),
                      key=lambda v: -max((_prod(tp) for tp in _input_shapes(problem, v)), default=0))
    out: list[Overflow] = []
    seen: set[tuple[str, int]] = set()
    for variant in variants:
        for site in model.launches:
            bound = launch_facts(model, site, problem, variant)
            if bound is None:
                continue
            values, sizes = bound
            fn = model.functions[site.kernel]
            an = KernelAnalysis(fn)
            nums = {k: v for k, v in values.items() if isinstance(v, int) and not isinstance(v, bool)}
            nums.update({k: v for k, v in site.constexprs.items() if isinstance(v, int)})
            maxima = dict(nums)
            for pv in program_id_vars(fn.node)[0]:
                if pv.axis < len(sizes) and sizes[pv.axis]:
                    maxima[pv.name] = sizes[pv.axis] - 1
            for lp in an.loops:
                if lp.var and isinstance(lp.node.iter, ast.Call) and lp.node.iter.args:
                    rargs = [_num(a, nums) for a in lp.node.iter.args]
                    if all(r is not None for r in rargs):
                        start, stop, step = (0, rargs[0], 1) if len(rargs) == 1 else (
                            rargs[0], rargs[1], rargs[2] if len(rargs) > 2 else 1)
                        if step > 0 and stop > start:
                            maxima[lp.var] = start + ((stop - start - 1) // step) * step
            derived = pid_derived_names(fn.node)
            cast = program_ids_cast(fn.node)
            for acc in an.accesses:
                key = (site.kernel, acc.line)
                if key in seen:
                    continue
                res = _max_offset(acc, maxima, values)
                if res is None:
                    continue
                offset, driver = res
                if offset >= INT32_LIMIT and not (cast and driver & derived):
                    seen.add(key)
                    out.append(Overflow(site.kernel, acc.line, acc.kind, acc.ptr.base, offset, variant.name,
                                        bool(driver & derived)))
    return out


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _input_shapes(problem: Any, variant: Any) -> list[tuple[int, ...]]:
    try:
        return [tp.shape for tp in plan_inputs(problem, variant)]
    except Exception:  # a variant whose dims do not resolve: the spec loader reports it elsewhere
        return []


def _max_offset(acc: Any, maxima: dict[str, int], values: dict[str, Any]) -> tuple[int, set[str]] | None:
    """(largest element offset, symbols of its largest term) or None when it cannot be bounded."""
    ptr = acc.ptr
    base_val = values.get(getattr(ptr, "base", ""))
    terms: list[tuple[int, set[str]]] = []
    if isinstance(ptr, Ptr):
        for t in ptr.offs.terms:
            stride = t.stride.evaluate(maxima)
            idx = t.vec.start.evaluate(maxima)
            size = t.vec.size.evaluate(maxima)
            if idx is not None and size is not None and all(c >= 0 for _, c in t.vec.start.terms):
                idx = idx + size - 1
            else:
                idx = _masked_max(acc, t, maxima)
            if stride is None or idx is None:
                return _numel_fallback(base_val)
            terms.append((max(idx, 0) * stride, t.vec.start.symbols() | t.stride.symbols()))
        scalar = ptr.offs.scalar.evaluate(maxima)
        if scalar is None:
            return _numel_fallback(base_val)
        terms.append((scalar, ptr.offs.scalar.symbols()))
    elif isinstance(ptr, BlockPtr):
        for off, stride, shape in zip(ptr.offsets, ptr.strides, ptr.shape):
            s, sh = stride.evaluate(maxima), shape.evaluate(maxima)
            if s is None or sh is None:
                return _numel_fallback(base_val)
            terms.append((max(sh - 1, 0) * s, off.symbols()))
    else:
        return None
    total = sum(v for v, _ in terms)
    driver = max(terms, key=lambda t: t[0])[1] if terms else set()
    return total, driver


def _masked_max(acc: Any, term: Any, maxima: dict[str, int]) -> int | None:
    if not isinstance(acc.mask, Mask):
        return None
    for b in acc.mask.bounds:
        if b.dim == term.dim and b.vec.size == term.vec.size:
            limit = (b.limit - b.vec.start + term.vec.start).evaluate(maxima)
            if limit is not None:
                return limit - 1
    return None


def _numel_fallback(base_val: Any) -> tuple[int, set[str]] | None:
    if isinstance(base_val, TensorVal):
        return max(base_val.numel - 1, 0), set()
    return None


# ------------------------------------------------------------------------------------------------ codemod
def _uncast_program_ids(fn_node: ast.FunctionDef) -> list[ast.Call]:
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(fn_node):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    out = []
    for node in ast.walk(fn_node):
        if is_tl_call(node, "program_id"):
            parent = parents.get(id(node))
            if not (isinstance(parent, ast.Attribute) and parent.attr == "to"):
                out.append(node)
    return out


def program_ids_cast(fn_node: ast.FunctionDef) -> bool:
    """Every ``tl.program_id`` of the function is already followed by ``.to(...)``."""
    return any(is_tl_call(n, "program_id") for n in ast.walk(fn_node)) and not _uncast_program_ids(fn_node)


def int64_program_ids(source: str, kernel: str) -> str:
    """``tl.program_id(a)`` -> ``tl.program_id(a).to(tl.int64)`` throughout ``kernel`` (raises if none/done)."""
    model = parse_kernel(source)
    fn = model.functions[kernel]
    calls = {(n.lineno, n.col_offset, dotted_name(n.func) or "tl.program_id"): _cast_builder
             for n in _uncast_program_ids(fn.node)}
    if not calls:
        raise NotApplicable(f"{kernel}'s program ids are already cast (or it reads none)")
    return edit_function(source, FunctionEdit(kernel, calls=calls))


def _cast_builder(call: cst.Call) -> cst.BaseExpression:
    return cst.Call(func=cst.Attribute(value=call, attr=cst.Name("to")),
                    args=[cst.Arg(cst.parse_expression("tl.int64"))])
