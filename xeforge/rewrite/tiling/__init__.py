"""Static analysis of tiled Triton kernels, shared by the structural rewrites of the rules engine.

Owns: a small symbolic evaluator over a ``@triton.jit`` function's ``ast`` that recognises the shapes the
memory_access, block_io, persistent and device_tuning (swizzle) tactics rewrite:

1. scalars as polynomials over single-assignment names (``pid_m * BLOCK_M``);
2. index vectors ``start + tl.arange(0, B)`` and their broadcasts (``offs_m[:, None]``);
3. pointer tiles ``base + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak`` and bounds masks
   ``(offs_m[:, None] < M) & (offs_k[None, :] < K)``, block pointers (``tl.make_block_ptr``/``tl.advance``),
   including pointers advanced once per iteration of a loop (``a_ptrs += BLOCK_K * stride_ak``);
4. every ``tl.load``/``tl.store`` as an :class:`Access` with the loops around it.

The grid side (program ids, tile axes, launch bindings, grid expressions) is in
:mod:`xeforge.rewrite.tiling.grid`. Both only read. The rewrites (:mod:`xeforge.rewrite.blockio`,
:mod:`xeforge.rewrite.persistent`, :mod:`xeforge.rewrite.device_tuning.swizzle`, :mod:`xeforge.rewrite.autotune`,
:mod:`xeforge.rewrite.memory`) build on them; :mod:`xeforge.rewrite.tiling.edit` holds the libcst editing helpers
they share, :mod:`xeforge.rewrite.tiling.configs` the launch configurations (KB spaces, trial store) and
:mod:`xeforge.rewrite.tiling.dispatch` the per-shape dispatch of one launch over several configurations.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace
from typing import Any

from xeforge.kernel_model import JitFunction, dotted_name, is_literal, literal
from xeforge.rewrite import NotApplicable  # noqa: F401  (the package's "does not apply", re-exported)


# ------------------------------------------------------------------------------------------------ polynomials
def _factor_key(name: str) -> tuple[bool, str]:
    # run-time names before constexpr-looking ones: ``pid_m * BLOCK_M`` reads better than ``BLOCK_M * pid_m``
    return (name.isupper(), name)


@dataclass(frozen=True)
class Poly:
    """An integer polynomial over names: ``{(name, ...): coefficient}`` stored as a sorted tuple."""

    terms: tuple[tuple[tuple[str, ...], int], ...] = ()

    @staticmethod
    def make(d: dict[tuple[str, ...], int]) -> "Poly":
        return Poly(tuple(sorted(((m, c) for m, c in d.items() if c), key=lambda t: (len(t[0]), t[0]))))

    @staticmethod
    def const(c: int) -> "Poly":
        return Poly.make({(): int(c)})

    @staticmethod
    def sym(name: str) -> "Poly":
        return Poly.make({(name,): 1})

    def as_dict(self) -> dict[tuple[str, ...], int]:
        return dict(self.terms)

    def __add__(self, other: "Poly") -> "Poly":
        d = self.as_dict()
        for m, c in other.terms:
            d[m] = d.get(m, 0) + c
        return Poly.make(d)

    def __neg__(self) -> "Poly":
        return Poly.make({m: -c for m, c in self.terms})

    def __sub__(self, other: "Poly") -> "Poly":
        return self + (-other)

    def __mul__(self, other: "Poly") -> "Poly":
        d: dict[tuple[str, ...], int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                m = tuple(sorted(m1 + m2, key=_factor_key))
                d[m] = d.get(m, 0) + c1 * c2
        return Poly.make(d)

    @property
    def is_zero(self) -> bool:
        return not self.terms

    @property
    def is_const(self) -> bool:
        return all(not m for m, _ in self.terms)

    @property
    def const_value(self) -> int | None:
        return self.as_dict().get((), 0) if self.is_const else None

    def symbols(self) -> set[str]:
        return {s for m, _ in self.terms for s in m}

    def single_symbol(self) -> str | None:
        """``name`` when the polynomial is exactly ``name``."""
        if len(self.terms) == 1 and self.terms[0][1] == 1 and len(self.terms[0][0]) == 1:
            return self.terms[0][0][0]
        return None

    def div_exact(self, other: "Poly") -> "Poly | None":
        """``self / other`` when ``other`` is one monomial that divides every term of ``self``."""
        if len(other.terms) != 1:
            return None
        (om, oc), = other.terms
        out: dict[tuple[str, ...], int] = {}
        for m, c in self.terms:
            rest = list(m)
            for s in om:
                if s not in rest:
                    return None
                rest.remove(s)
            if c % oc:
                return None
            key = tuple(sorted(rest, key=_factor_key))
            out[key] = out.get(key, 0) + c // oc
        return Poly.make(out)

    def substitute(self, name: str, value: "Poly") -> "Poly":
        out = Poly.const(0)
        for m, c in self.terms:
            term = Poly.const(c)
            for s in m:
                term = term * (value if s == name else Poly.sym(s))
            out = out + term
        return out

    def evaluate(self, values: dict[str, int]) -> int | None:
        total = 0
        for m, c in self.terms:
            v = c
            for s in m:
                x = values.get(s)
                if x is None and "//" in s:  # a halved block, ``BLOCK_N//2`` (see ``_binop``)
                    base, div = s.split("//")
                    x = values[base] // int(div) if values.get(base) is not None else None
                if x is None:
                    return None
                v *= x
            total += v
        return total

    def code(self, int64: frozenset[str] = frozenset()) -> str:
        """As source; each term's first factor among ``int64`` (tensor-valued names) cast with ``.to(tl.int64)``, so
        the product is 64-bit (a batch's start, ``off_z * stride_qz``, can pass 2**31 elements)."""
        if not self.terms:
            return "0"
        parts: list[str] = []
        for i, (m, c) in enumerate(sorted(self.terms, key=lambda t: (-len(t[0]), t[0]))):
            factors = [s for s in m]
            wide = next((j for j, s in enumerate(factors) if s in int64), None)
            if wide is not None:
                factors[wide] = f"{factors[wide]}.to(tl.int64)"
            mag = abs(c)
            if mag != 1 or not factors:
                factors = [str(mag)] + factors
            text = " * ".join(factors)
            if i == 0:
                parts.append(("-" if c < 0 else "") + text)
            else:
                parts.append(("- " if c < 0 else "+ ") + text)
        return " ".join(parts)

    def __str__(self) -> str:  # pragma: no cover - debugging aid
        return self.code()


ZERO = Poly.const(0)
ONE = Poly.const(1)


# ------------------------------------------------------------------------------------------------ symbolic values
class _Opaque:
    """A scalar the evaluator cannot express as a polynomial (program ids, ``//``, ``%``, ``tl.cdiv``...)."""

    def __repr__(self) -> str:  # pragma: no cover
        return "OPAQUE"


class _Unknown:
    def __repr__(self) -> str:  # pragma: no cover
        return "UNKNOWN"


OPAQUE = _Opaque()
UNKNOWN = _Unknown()


@dataclass(frozen=True)
class Vec:
    """``start + tl.arange(0, size)``."""

    start: Poly
    size: Poly


@dataclass(frozen=True)
class Bcast:
    """A :class:`Vec` placed on dimension ``dim`` of a rank-``rank`` tile (``v[:, None]`` is dim 0 of 2)."""

    vec: Vec
    dim: int
    rank: int


@dataclass(frozen=True)
class Term:
    dim: int
    vec: Vec
    stride: Poly


@dataclass(frozen=True)
class Offs:
    rank: int
    terms: tuple[Term, ...]
    scalar: Poly = ZERO

    def dims(self) -> set[int]:
        return {t.dim for t in self.terms}


@dataclass(frozen=True)
class Ptr:
    """``base + offs``: a tile of pointers into the tensor passed as parameter ``base``."""

    base: str
    offs: Offs

    @property
    def rank(self) -> int:
        return self.offs.rank

    def term(self, dim: int) -> Term | None:
        return next((t for t in self.offs.terms if t.dim == dim), None)


@dataclass(frozen=True)
class Bound:
    """``vec < limit`` on dimension ``dim``."""

    dim: int
    vec: Vec
    limit: Poly


@dataclass(frozen=True)
class Mask:
    rank: int
    bounds: tuple[Bound, ...]


@dataclass(frozen=True)
class BlockPtr:
    base: str
    shape: tuple[Poly, ...]
    strides: tuple[Poly, ...]
    offsets: tuple[Poly, ...]
    block: tuple[Poly, ...]
    start: Poly | None = None  # where the matrix starts in ``base`` (``Q + off_z * stride_qz``: a batch's), if not 0


@dataclass
class LoopInfo:
    node: ast.For
    var: str | None
    start: Poly | None
    step: Poly | None
    stop: Poly | None
    assigned: set[str]  # names assigned anywhere inside the loop (the loop variable included)
    carried: dict[str, Any] = field(default_factory=dict)  # pointer name -> per-iteration increment

    def iter_poly(self, per_iter: Poly) -> Poly | None:
        """``iteration_index * per_iter`` in terms of the loop variable, when it divides exactly."""
        if self.var is None or self.start is None or self.step is None:
            return None
        q = per_iter.div_exact(self.step) if not self.step.is_zero else None
        if q is None:
            return None
        return (Poly.sym(self.var) - self.start) * q


@dataclass
class Access:
    kind: str  # load | store
    call: ast.Call
    stmt: ast.stmt  # the statement of the function body (top level) that contains the access
    loops: tuple[LoopInfo, ...]
    ptr: Any
    mask: Any = None
    mask_node: ast.AST | None = None
    other: Any = None  # literal value of other=, None when absent
    has_other: bool = False
    boundary_check: tuple[int, ...] | None = None
    padding: str | None = None
    value_node: ast.AST | None = None  # stores: the value

    @property
    def line(self) -> int:
        return self.call.lineno


def is_value_hint(st: ast.AST) -> bool:
    """``if H > 1: x = (x // H) * H`` (and more such lines for other names): a divisibility hint the memory_access
    stage writes (:mod:`xeforge.rewrite.align_hints`), the value itself at every call. The analyses read through it."""
    if not (isinstance(st, ast.If) and not st.orelse and isinstance(st.test, ast.Compare)
            and isinstance(st.test.left, ast.Name) and len(st.test.ops) == 1 and isinstance(st.test.ops[0], ast.Gt)
            and literal(st.test.comparators[0]) == 1):
        return False
    h = st.test.left.id
    return all(isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name)
               and ast.unparse(a.value) == f"{a.targets[0].id} // {h} * {h}" for a in st.body)


def _walk_unhinted(node: ast.AST):
    """``ast.walk`` that does not enter a divisibility hint (:func:`is_value_hint`)."""
    todo = [node]
    while todo:
        n = todo.pop()
        if is_value_hint(n):
            continue
        yield n
        todo.extend(ast.iter_child_nodes(n))


def _assign_counts(root: ast.AST | list[ast.stmt]) -> dict[str, int]:
    """How many times each name is assigned (targets of =, +=, for, with, :=) under ``root`` (a divisibility hint's
    ``x = (x // H) * H`` is the value itself: not counted)."""
    counts: dict[str, int] = {}

    def bump(target: ast.AST) -> None:
        if isinstance(target, ast.Name):
            counts[target.id] = counts.get(target.id, 0) + 1
        elif isinstance(target, (ast.Tuple, ast.List)):
            for e in target.elts:
                bump(e)
        elif isinstance(target, ast.Starred):
            bump(target.value)

    roots = root if isinstance(root, list) else [root]
    for node in (n for r in roots for n in _walk_unhinted(r)):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                bump(t)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            bump(node.target)
        elif isinstance(node, ast.For):
            bump(node.target)
        elif isinstance(node, (ast.With,)):
            for item in node.items:
                if item.optional_vars is not None:
                    bump(item.optional_vars)
        elif isinstance(node, ast.NamedExpr):
            bump(node.target)
    return counts


def assigned_names(stmts: list[ast.stmt]) -> set[str]:
    return set(_assign_counts(list(stmts)))


def names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def block_symbol(size: Poly, constexprs: set[str]) -> str | None:
    """The block constexpr an index vector of ``size`` elements walks: ``BLOCK_N`` for ``BLOCK_N`` and for a part
    of it, ``BLOCK_N//2`` (the column halves of a tile); None otherwise."""
    s = size.single_symbol()
    if s in constexprs:
        return s
    if s and "//" in s and s.split("//")[0] in constexprs:
        return s.split("//")[0]
    return None


def is_tl_call(node: ast.AST, attr: str) -> bool:
    """``tl.<attr>(...)`` (or ``triton.language.<attr>``)."""
    if not isinstance(node, ast.Call):
        return False
    name = dotted_name(node.func) or ""
    return name in (f"tl.{attr}", f"triton.language.{attr}")


def _kw(call: ast.Call, name: str, pos: int | None = None) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if pos is not None and len(call.args) > pos:
        return call.args[pos]
    return None


#: tl calls that keep a helper's results scalars (the rest make or read tensors)
_SCALAR_TL = ("cdiv", "minimum", "maximum", "program_id", "num_programs", "multiple_of", "max_contiguous")


def _scalar_only(node: ast.FunctionDef) -> bool:
    """Whether a jit helper computes from its arguments with scalar arithmetic only: no tl call that makes or reads
    a tensor (arange, load, zeros, dot, ...), no call of anything but Python's min / max and tl's scalar ones."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            name = dotted_name(n.func) or ""
            if name in ("min", "max") or any(is_tl_call(n, a) for a in _SCALAR_TL):
                continue
            return False
    return True


class KernelAnalysis:
    """The symbolic reading of one jit function (see the module docstring)."""

    def __init__(self, fn: JitFunction, helpers: dict[str, JitFunction] | None = None,
                 scalar_loads: bool = False) -> None:
        """``helpers``: the file's other jit functions; a call of one that only computes scalars from scalar
        arguments (``pid_m, pid_n = _tile_coords(tile_id, ...)``) then gives a fixed scalar per name, not an
        unknown. ``scalar_loads``: a load through one scalar pointer (``seq_start = tl.load(Cu_seqlens + b)``) is
        a fixed scalar too."""
        self.scalar_loads = scalar_loads
        self.fn = fn
        self.node = fn.node
        self.helpers = {name: h for name, h in (helpers or {}).items() if name != fn.name and _scalar_only(h.node)}
        self.params = list(fn.params)
        self.constexprs = set(fn.constexpr_params)
        self.counts = _assign_counts(fn.node)
        self.env: dict[str, Any] = {}
        self.accesses: list[Access] = []
        self.loops: list[LoopInfo] = []
        self._loop_stack: list[LoopInfo] = []
        self._top_stmt: ast.stmt | None = None
        for p in self.params:
            self.env[p] = Poly.sym(p) if self.counts.get(p, 0) == 0 else UNKNOWN
        for p in fn.node.args.kwonlyargs:
            self.env[p.arg] = Poly.sym(p.arg)
        self._block(fn.node.body, top=True)

    # -- queries ----------------------------------------------------------------------------------------
    def single_assignment(self, name: str) -> bool:
        return self.counts.get(name, 0) <= 1

    def dot_loops(self) -> list[LoopInfo]:
        """Loops whose body calls ``tl.dot`` (the K loops of a tiled GEMM)."""
        out = []
        for lp in self.loops:
            if any(is_tl_call(n, "dot") for n in ast.walk(lp.node)):
                out.append(lp)
        return out

    def has_call(self, attr: str) -> bool:
        return any(is_tl_call(n, attr) for n in ast.walk(self.node))

    # -- statements -------------------------------------------------------------------------------------
    def _block(self, stmts: list[ast.stmt], top: bool = False) -> None:
        for st in stmts:
            if top:
                self._top_stmt = st
            self._stmt(st)

    def _bind(self, name: str, value: Any) -> None:
        if isinstance(value, Poly) or value is OPAQUE:
            if not self.single_assignment(name) and not (isinstance(value, Poly) and value == self.env.get(name)):
                self.env[name] = UNKNOWN
                return
            if value is OPAQUE:
                value = Poly.sym(name)
        self.env[name] = value

    def _stmt(self, st: ast.stmt) -> None:
        if is_value_hint(st):
            return  # x = (x // H) * H: the value x had
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call) and isinstance(st.value.func, ast.Name) \
                and st.value.func.id in self.helpers:
            # each name a scalar the helper computed from scalars: a symbol of its own (else unknown)
            scalar = self._scalar_args(st.value)
            for t in st.targets:
                for n in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(n, ast.Name) and scalar:
                        self._bind(n.id, OPAQUE)
                    else:
                        for x in names_in(n):
                            self.env[x] = UNKNOWN
        elif isinstance(st, ast.Assign):
            value = self.eval(st.value)
            for t in st.targets:
                if isinstance(t, ast.Name):
                    self._bind(t.id, value)
                else:
                    for n in names_in(t):
                        self.env[n] = UNKNOWN
        elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
            self._bind(st.target.id, self.eval(st.value))
        elif isinstance(st, ast.AugAssign):
            self.eval(st.value)
            if isinstance(st.target, ast.Name):
                self.env[st.target.id] = UNKNOWN
        elif isinstance(st, ast.Expr):
            self.eval(st.value)
        elif isinstance(st, ast.For):
            self._for(st)
        elif isinstance(st, (ast.If,)):
            self.eval(st.test)
            self._block(st.body)
            self._block(st.orelse)
        elif isinstance(st, ast.While):
            for n in assigned_names(st.body):
                self.env[n] = UNKNOWN
            self._block(st.body)
            for n in assigned_names(st.body):
                self.env[n] = UNKNOWN
        elif isinstance(st, ast.Return) and st.value is not None:
            self.eval(st.value)

    def _scalar_args(self, call: ast.Call) -> bool:
        """Whether every argument of ``call`` is a scalar here (each is read once, as any call's are)."""
        args = [self.eval(a) for a in [*call.args, *(k.value for k in call.keywords)]]
        return all(isinstance(a, Poly) or a is OPAQUE for a in args)

    def _range_args(self, it: ast.AST) -> tuple[Poly | None, Poly | None, Poly | None]:
        """(start, step, stop) of ``range``/``tl.range`` as polynomials (None where not one)."""
        if not isinstance(it, ast.Call):
            return None, None, None
        name = dotted_name(it.func) or ""
        if name not in ("range", "tl.range", "tl.static_range", "triton.language.range"):
            return None, None, None
        args = [self.eval(a) for a in it.args]
        if not args:
            return None, None, None
        if len(args) == 1:
            return ZERO, ONE, args[0] if isinstance(args[0], Poly) else None
        start = args[0] if isinstance(args[0], Poly) else None
        stop = args[1] if isinstance(args[1], Poly) else None
        step = ONE
        if len(args) >= 3:
            step = args[2] if isinstance(args[2], Poly) else None
        for kw in it.keywords:
            if kw.arg == "step":
                v = self.eval(kw.value)
                step = v if isinstance(v, Poly) else None
        return start, step, stop

    def _for(self, st: ast.For) -> None:
        var = st.target.id if isinstance(st.target, ast.Name) else None
        start, step, stop = self._range_args(st.iter)
        inner = assigned_names(st.body) | ({var} if var else set())
        info = LoopInfo(st, var, start, step, stop, inner)
        # loop-carried pointers: p += delta, p = p + delta, p = tl.advance(p, (d0, d1))
        skip: set[int] = set()
        for s in st.body:
            inc = self._increment(s)
            if inc is None:
                continue
            name, delta = inc
            cur = self.env.get(name)
            if isinstance(cur, (Ptr, BlockPtr)) and _invariant(delta, inner):
                info.carried[name] = delta
                skip.add(id(s))
        if var is not None:
            self.env[var] = Poly.sym(var) if self.single_assignment(var) else UNKNOWN
        saved = {n: self.env.get(n) for n in info.carried}
        for name, delta in info.carried.items():
            self.env[name] = _advance_in_loop(self.env[name], delta, info)
        self.loops.append(info)
        self._loop_stack.append(info)
        for s in st.body:
            if id(s) in skip:
                continue
            self._stmt(s)
        self._loop_stack.pop()
        for n in inner:
            if n in saved or not self.single_assignment(n):
                self.env[n] = UNKNOWN
        self._block(st.orelse)

    def _increment(self, s: ast.stmt) -> tuple[str, Any] | None:
        if isinstance(s, ast.AugAssign) and isinstance(s.op, ast.Add) and isinstance(s.target, ast.Name):
            d = self.eval(s.value)
            return (s.target.id, d) if isinstance(d, Poly) else None
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
            name = s.targets[0].id
            v = s.value
            if isinstance(v, ast.BinOp) and isinstance(v.op, ast.Add):
                for a, b in ((v.left, v.right), (v.right, v.left)):
                    if isinstance(a, ast.Name) and a.id == name:
                        d = self.eval(b)
                        return (name, d) if isinstance(d, Poly) else None
            if is_tl_call(v, "advance") and len(v.args) >= 2 and isinstance(v.args[0], ast.Name) \
                    and v.args[0].id == name and isinstance(v.args[1], (ast.Tuple, ast.List)):
                ds = [self.eval(e) for e in v.args[1].elts]
                if all(isinstance(d, Poly) for d in ds):
                    return name, tuple(ds)
        return None

    # -- expressions -------------------------------------------------------------------------------------
    def eval(self, node: ast.AST) -> Any:
        try:
            return self._eval(node)
        except (ArithmeticError, TypeError, ValueError, RecursionError):
            return UNKNOWN

    def _eval(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int):
                return UNKNOWN
            return Poly.const(node.value)
        if isinstance(node, ast.Name):
            return self.env.get(node.id, UNKNOWN)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            v = self._eval(node.operand)
            return -v if isinstance(v, Poly) else (OPAQUE if v is OPAQUE else UNKNOWN)
        if isinstance(node, ast.BinOp):
            return self._binop(node)
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.Subscript):
            return self._subscript(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Attribute):
            self._eval(node.value)
            return UNKNOWN
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self._eval(child)
        return UNKNOWN

    def _binop(self, node: ast.BinOp) -> Any:
        a, b = self._eval(node.left), self._eval(node.right)
        op = node.op
        if isinstance(op, ast.BitAnd):
            if isinstance(a, Mask) and isinstance(b, Mask) and a.rank == b.rank:
                return Mask(a.rank, a.bounds + b.bounds)
            return UNKNOWN
        if isinstance(a, Poly) and isinstance(b, Poly):
            if isinstance(op, ast.Add):
                return a + b
            if isinstance(op, ast.Sub):
                return a - b
            if isinstance(op, ast.Mult):
                return a * b
            if isinstance(op, ast.FloorDiv) and a.single_symbol() and b.const_value and b.const_value > 0 \
                    and b.is_const:
                # a block constexpr halved (the epilogue halves' ``tl.arange(0, BLOCK_N // 2)``): a symbol of its own,
                # which :func:`block_symbol` maps back to its block
                return Poly.sym(f"{a.single_symbol()}//{b.const_value}")
            return OPAQUE
        if a is OPAQUE or b is OPAQUE:
            if isinstance(a, (Poly, _Opaque)) and isinstance(b, (Poly, _Opaque)):
                return OPAQUE
            return UNKNOWN
        if isinstance(op, ast.Add):
            return _add(a, b)
        if isinstance(op, ast.Sub) and isinstance(b, Poly):
            if isinstance(a, Vec):
                return Vec(a.start - b, a.size)
            return _add(a, -b)
        if isinstance(op, ast.Mult):
            return _mul(a, b)
        return UNKNOWN

    def _compare(self, node: ast.Compare) -> Any:
        if len(node.ops) != 1:
            return UNKNOWN
        a, b = self._eval(node.left), self._eval(node.comparators[0])
        op = node.ops[0]
        if isinstance(op, (ast.Gt, ast.GtE)):
            a, b = b, a
            op = ast.Lt() if isinstance(op, ast.Gt) else ast.LtE()
        if not isinstance(op, (ast.Lt, ast.LtE)) or not isinstance(b, Poly):
            return UNKNOWN
        limit = b + ONE if isinstance(op, ast.LtE) else b
        if isinstance(a, Vec):
            return Mask(1, (Bound(0, a, limit),))
        if isinstance(a, Bcast):
            return Mask(a.rank, (Bound(a.dim, a.vec, limit),))
        return UNKNOWN

    def _subscript(self, node: ast.Subscript) -> Any:
        v = self._eval(node.value)
        sl = node.slice
        if isinstance(v, (Vec, Mask)) and isinstance(sl, ast.Tuple) and len(sl.elts) == 2 and \
                (isinstance(v, Vec) or v.rank == 1):
            kinds = ["none" if isinstance(e, ast.Constant) and e.value is None else
                     "full" if isinstance(e, ast.Slice) and e.lower is None and e.upper is None and e.step is None
                     else "other" for e in sl.elts]
            dim = {("full", "none"): 0, ("none", "full"): 1}.get(tuple(kinds))
            if dim is not None and isinstance(v, Mask):
                # a named 1-D bound broadcast into the tile (``k_ok = offs_k < K`` ... ``k_ok[None, :]``)
                return Mask(2, tuple(Bound(dim, b.vec, b.limit) for b in v.bounds))
            if dim is not None:
                return Bcast(v, dim, 2)
        return UNKNOWN

    def _call(self, node: ast.Call) -> Any:
        name = dotted_name(node.func) or ""
        if is_tl_call(node, "load"):
            raw = self._record("load", node)
            if self.scalar_loads and len(node.args) == 1 and not node.keywords and isinstance(raw, Poly):
                return OPAQUE  # one element through a scalar pointer: a value fixed for the program
            return UNKNOWN
        if is_tl_call(node, "store"):
            self._record("store", node)
            return UNKNOWN
        if is_tl_call(node, "arange") and len(node.args) >= 2:
            lo, hi = self._eval(node.args[0]), self._eval(node.args[1])
            if isinstance(lo, Poly) and isinstance(hi, Poly):
                return Vec(lo, hi - lo)
            return UNKNOWN
        if is_tl_call(node, "program_id") or is_tl_call(node, "num_programs") or is_tl_call(node, "cdiv"):
            return OPAQUE
        if name in ("min", "max", "tl.minimum", "tl.maximum"):
            for a in node.args:
                self._eval(a)
            return OPAQUE
        if is_tl_call(node, "multiple_of") or is_tl_call(node, "max_contiguous"):
            return self._eval(node.args[0]) if node.args else UNKNOWN
        if is_tl_call(node, "make_block_ptr"):
            return self._block_ptr(node)
        if is_tl_call(node, "advance") and len(node.args) >= 2:
            bp = self._eval(node.args[0])
            if isinstance(bp, BlockPtr) and isinstance(node.args[1], (ast.Tuple, ast.List)):
                ds = [self._eval(e) for e in node.args[1].elts]
                if all(isinstance(d, Poly) for d in ds) and len(ds) == len(bp.offsets):
                    return replace(bp, offsets=tuple(o + d for o, d in zip(bp.offsets, ds)))
            return UNKNOWN
        # x.to(tl.int64) keeps the value
        if isinstance(node.func, ast.Attribute) and node.func.attr == "to":
            v = self._eval(node.func.value)
            for a in node.args:
                self._eval(a)
            return v if isinstance(v, (Poly, Vec, _Opaque)) else UNKNOWN
        if isinstance(node.func, ast.Attribute):
            self._eval(node.func.value)
        for a in node.args:
            self._eval(a)
        for kw in node.keywords:
            self._eval(kw.value)
        return UNKNOWN

    def _pointer(self, v: Any) -> Any:
        """Name the base pointer of an access: ``x_ptr + offs`` on a 1D index vector evaluates to a :class:`Vec`
        whose start holds the base, and ``(x_ptr + pid * stride) + tile`` to :class:`Offs` whose scalar does."""
        poly = v.start if isinstance(v, Vec) else (v.scalar if isinstance(v, Offs) else None)
        if poly is None:
            return v
        bases = [m[0] for m, c in poly.terms if len(m) == 1 and c == 1 and m[0] in self.params
                 and m[0] not in self.constexprs]
        if len(bases) != 1:
            return v
        base = bases[0]
        if isinstance(v, Vec):
            return Ptr(base, Offs(1, (Term(0, Vec(v.start - Poly.sym(base), v.size), ONE),)))
        return Ptr(base, Offs(v.rank, v.terms, v.scalar - Poly.sym(base)))

    def _block_ptr(self, node: ast.Call) -> Any:
        names = ["base", "shape", "strides", "offsets", "block_shape", "order"]
        got = {n: _kw(node, n, i) for i, n in enumerate(names)}
        base, start = got["base"], None
        if not isinstance(base, ast.Name) or base.id not in self.params:
            # a matrix inside the tensor: ``base=q_base`` made as ``Q + off_z * stride_qz + off_h * stride_qh``
            at = self._eval(base) if base is not None else UNKNOWN
            params = [m[0] for m, c in at.terms if len(m) == 1 and c == 1 and m[0] in self.params
                      and m[0] not in self.constexprs] if isinstance(at, Poly) else []
            if len(params) != 1:
                return UNKNOWN
            base, start = ast.Name(params[0]), at - Poly.sym(params[0])
        parts = []
        for key in ("shape", "strides", "offsets", "block_shape"):
            seq = got[key]
            if not isinstance(seq, (ast.Tuple, ast.List)):
                return UNKNOWN
            vals = [self._eval(e) for e in seq.elts]
            if not all(isinstance(v, Poly) for v in vals):
                return UNKNOWN
            parts.append(tuple(vals))
        if len({len(p) for p in parts}) != 1:
            return UNKNOWN
        return BlockPtr(base.id, *parts, start=start)

    def _record(self, kind: str, node: ast.Call) -> Any:
        """Record the access ``node`` makes; the value its pointer argument evaluated to."""
        raw = self._eval(node.args[0]) if node.args else UNKNOWN
        acc = Access(kind, node, self._top_stmt, tuple(self._loop_stack), self._pointer(raw))
        if kind == "load":
            mask_node, other_node = _kw(node, "mask", 1), _kw(node, "other", 2)
        else:
            acc.value_node = _kw(node, "value", 1)
            if acc.value_node is not None:
                self._eval(acc.value_node)
            mask_node, other_node = _kw(node, "mask", 2), None
        acc.mask_node = mask_node
        acc.mask = self._eval(mask_node) if mask_node is not None else None
        if other_node is not None:
            acc.has_other = True
            val = literal(other_node)
            acc.other = val if is_literal(val) else UNKNOWN
        bc = _kw(node, "boundary_check")
        if bc is not None:
            val = literal(bc)
            acc.boundary_check = tuple(val) if is_literal(val) and isinstance(val, (tuple, list)) else ()
        pad = _kw(node, "padding_option")
        if pad is not None:
            val = literal(pad)
            acc.padding = val if is_literal(val) else "?"
        self.accesses.append(acc)
        return raw


def _invariant(delta: Any, inner: set[str]) -> bool:
    polys = delta if isinstance(delta, tuple) else (delta,)
    return all(isinstance(p, Poly) and not (p.symbols() & inner) for p in polys)


def _advance_in_loop(value: Any, delta: Any, loop: LoopInfo) -> Any:
    """The value of a pointer advanced by ``delta`` once per iteration, inside the loop."""
    if isinstance(value, BlockPtr) and isinstance(delta, tuple) and len(delta) == len(value.offsets):
        offs = []
        for o, d in zip(value.offsets, delta):
            if d.is_zero:
                offs.append(o)
                continue
            step = loop.iter_poly(d)
            if step is None:
                return UNKNOWN
            offs.append(o + step)
        return replace(value, offsets=tuple(offs))
    if isinstance(value, Ptr) and isinstance(delta, Poly):
        for t in value.offs.terms:
            if t.stride.is_zero:
                continue
            q = delta.div_exact(t.stride) if len(t.stride.terms) == 1 else None
            if q is None:
                continue
            step = loop.iter_poly(q)
            if step is None:
                return UNKNOWN
            terms = tuple(Term(x.dim, Vec(x.vec.start + step, x.vec.size), x.stride) if x is t else x
                          for x in value.offs.terms)
            return Ptr(value.base, Offs(value.offs.rank, terms, value.offs.scalar))
    return UNKNOWN


def _as_offs(v: Any) -> Offs | None:
    if isinstance(v, Offs):
        return v
    if isinstance(v, Bcast):
        return Offs(v.rank, (Term(v.dim, v.vec, ONE),))
    if isinstance(v, Vec):
        return Offs(1, (Term(0, v, ONE),))
    return None


def _merge(a: Offs, b: Offs) -> Offs | None:
    if a.rank != b.rank or (a.dims() & b.dims()):
        return None
    return Offs(a.rank, tuple(sorted(a.terms + b.terms, key=lambda t: t.dim)), a.scalar + b.scalar)


def _add(a: Any, b: Any) -> Any:
    if isinstance(b, Poly) and not isinstance(a, Poly):
        a, b = b, a
    if isinstance(a, Poly):
        if isinstance(b, Vec):
            return Vec(b.start + a, b.size)
        if isinstance(b, Ptr):
            return Ptr(b.base, Offs(b.offs.rank, b.offs.terms, b.offs.scalar + a))
        offs = _as_offs(b)
        if offs is not None:
            base = a.single_symbol()
            if base is not None:
                return Ptr(base, offs)
            return Offs(offs.rank, offs.terms, offs.scalar + a)
        return UNKNOWN
    if isinstance(a, Ptr) or isinstance(b, Ptr):
        p, o = (a, b) if isinstance(a, Ptr) else (b, a)
        if isinstance(o, Ptr):
            return UNKNOWN
        offs = _as_offs(o)
        if offs is None:
            return UNKNOWN
        merged = _merge(p.offs, offs)
        return Ptr(p.base, merged) if merged is not None else UNKNOWN
    oa, ob = _as_offs(a), _as_offs(b)
    if oa is not None and ob is not None and not (isinstance(a, Vec) and isinstance(b, Vec)):
        merged = _merge(oa, ob)
        return merged if merged is not None else UNKNOWN
    return UNKNOWN


def _mul(a: Any, b: Any) -> Any:
    if isinstance(a, Poly) and not isinstance(b, Poly):
        a, b = b, a
    if not isinstance(b, Poly):
        return UNKNOWN
    if isinstance(a, Bcast):
        return Offs(a.rank, (Term(a.dim, a.vec, b),))
    if isinstance(a, Vec):
        return Offs(1, (Term(0, a, b),))
    if isinstance(a, Offs) and len(a.terms) == 1 and a.scalar.is_zero:
        t = a.terms[0]
        return Offs(a.rank, (Term(t.dim, t.vec, t.stride * b),))
    return UNKNOWN
