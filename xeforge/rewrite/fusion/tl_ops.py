"""Forward statements after a kernel's launch, translated to ``tl`` code on the kernel's tile value.

Owns :class:`EpilogueBuilder`, which turns statements of ``Model.forward`` such as ``y = F.gelu(y * self.scale)``
into ``tl`` statements applied to a kernel's tile value, collecting the extra kernel inputs they need (run-time
Python scalars, per-column vectors, one-element tensors, tensors of the output's shape). It keeps no table of its
own: Python's operators are primitives of :data:`xeforge.rewrite.fusion.decompose.PRIMS`, and every torch op
(``F.gelu``, ``torch.where``, ``y.mul_(s)``, ``F.batch_norm``, ...) is traced with torch's decompositions down to
those primitives and lowered from the same table (:func:`~xeforge.rewrite.fusion.decompose.lower_call`), each
argument passed with how it varies (the tile, a column, one element, a run-time scalar). An op that does not
reduce to that table raises :class:`Unsupported` with the reason.

Also the row reductions (:data:`REDUCTIONS`, :func:`reduction_call`) and the ops over a whole row
(:data:`ROW_OPS`: softmax, log_softmax): inside an expression they are lowered through the builder's
``row_reduce`` where one tile covers the row, their ``[rows, 1]`` result broadcast back (``y - y.mean(1,
keepdim=True)``). A division by something that does not vary over the tile (a scalar, a per-column vector) is a
multiplication by its reciprocal, computed once: fp32 division is a multi-instruction sequence per element, the
reciprocal's extra rounding (an ulp of fp32) is far inside any tolerance a 16-bit output allows.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from xeforge.kernel_model import dotted_name, is_literal, literal
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.fusion.decompose import PRIMS, DecompositionError, lower_call

TORCH_PREFIXES = ("torch.", "F.", "torch.nn.functional.", "nn.functional.")


class Unsupported(Exception):
    """The expression cannot be translated; ``str(exc)`` names the op and why."""


#: the row reductions over the last dim fusion knows
REDUCTIONS = {"sum", "mean", "max", "min", "amax", "amin", "logsumexp"}


def reduction_call(node: ast.AST) -> tuple[str, bool, ast.expr] | None:
    """(kind, keepdim, the reduced expression) for ``torch.sum(e, dim=1, keepdim=True)``, ``e.amax(-1)``,
    ``torch.max(e, dim=-1)[0]`` ...; None for anything else. Raises :class:`Unsupported` for a reduction over
    another dim or with a keepdim that is not a literal."""
    if isinstance(node, ast.Subscript) and literal(node.slice) == 0:
        node = node.value
    elif isinstance(node, ast.Attribute) and node.attr == "values":
        node = node.value
    if not isinstance(node, ast.Call):
        return None
    key, args = op_key(node, set())
    if key not in REDUCTIONS or not args:
        return None
    dim = next((k.value for k in node.keywords if k.arg == "dim"), args[1] if len(args) > 1 else None)
    keep = next((k.value for k in node.keywords if k.arg == "keepdim"), args[2] if len(args) > 2 else None)
    d = literal(dim) if dim is not None else None
    if isinstance(d, (list, tuple)) and len(d) == 1:
        d = d[0]
    if d not in (1, -1):
        raise Unsupported(f"{ast.unparse(node)} does not reduce over the last dim")
    k = literal(keep) if keep is not None else False
    if not isinstance(k, bool):
        raise Unsupported(f"{ast.unparse(node)}: keepdim is not a literal")
    return key, k, args[0]


@dataclass
class Operand:
    """An extra kernel input an epilogue needs."""

    kind: str  # scalar | column | element | tile (a tensor of the output's [rows, cols] shape)
    src: str  # the forward expression passed at the launch
    param: str  # the kernel parameter that receives it
    strides: tuple[str, str] | None = None  # tile: the parameters of its row and column strides

    def params(self) -> list[str]:
        """The kernel parameters it adds."""
        return [self.param, *(self.strides or ())]

    def launch_args(self) -> dict[str, str]:
        """Kernel parameter -> the forward expression passed for it."""
        out = {self.param: self.src}
        if self.strides:
            out.update({self.strides[0]: f"{self.src}.stride(0)", self.strides[1]: f"{self.src}.stride(1)"})
        return out


def strip_parens(code: str) -> str:
    """``(a + b)`` -> ``a + b`` when the outer parentheses enclose the whole expression."""
    while code.startswith("(") and code.endswith(")"):
        depth = 0
        for i, ch in enumerate(code):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and i < len(code) - 1:
                return code
        code = code[1:-1]
    return code


def op_key(call: ast.Call, value_names: set[str]) -> tuple[str | None, list[ast.expr]]:
    """(``relu``, [args]) for ``torch.relu(y)``, ``F.relu(y)`` or ``y.relu()``; (None, []) otherwise."""
    name = dotted_name(call.func)
    if name:
        for pre in TORCH_PREFIXES:
            if name.startswith(pre) and "." not in name[len(pre):]:
                return name[len(pre):], list(call.args)
    if isinstance(call.func, ast.Attribute):
        return call.func.attr, [call.func.value, *call.args]
    return None, []


def _kw(call: ast.Call, args: list[ast.expr], pos: int, name: str, default: Any = None) -> ast.expr | Any:
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return args[pos] if pos < len(args) else default


@dataclass
class EpilogueBuilder:
    """Translate forward statements into ``tl`` statements that update ``var`` (the tile value, fp32).

    ``resolve(node)`` classifies a non-value operand (a ``self.*`` attribute, a forward local) as an
    :class:`Operand` (or None: unsupported). ``column`` is ``(offs_n, N)`` of the tile when per-column
    vectors may be loaded (2D tile), None for a 1D value (after a row reduction); ``column_2d`` says ``offs_n``
    is already a 2D block of channel indices (loads use it as is instead of broadcasting a row of them).
    """

    var: str
    value_names: set[str]
    resolve: Callable[[ast.expr], Operand | None]
    fresh: Callable[[str], str]
    column: tuple[str, str] | None = None
    column_2d: bool = False
    rows: tuple[str, str | None] | None = None  # (offs_m, M) of a 2D tile: operands of the output's shape load
    lines: list[str] = field(default_factory=list)
    operands: dict[str, Operand] = field(default_factory=dict)
    loaded: dict[str, str] = field(default_factory=dict)  # operand param -> tl variable holding it
    kinds: dict[str, str] = field(default_factory=dict)  # tl name of an operand -> its Operand.kind
    ops: list[str] = field(default_factory=list)  # names of the torch ops translated (for descriptions)
    #: earlier values of the tile a later op reads again (a residual, a gate's input): forward name -> tl variable
    saved: dict[str, str] = field(default_factory=dict)
    #: ``row_reduce(kind, tile_code)`` -> the code of the row's reduction as a ``[rows, 1]`` value, where one tile
    #: covers each row (a reduction broadcast back: ``y - y.mean(1, keepdim=True)``, softmax); None elsewhere, and a
    #: reduction inside an expression is then refused with the reason
    row_reduce: Callable[[str, str], str] | None = None

    # -- statements ------------------------------------------------------------------------------------
    def assign(self, value: ast.expr) -> None:
        self.lines.append(f"{self.var} = {strip_parens(self.expr(value))}")

    def try_assign(self, value: ast.expr, names: set[str]) -> str | None:
        """:meth:`assign` with ``names`` as the value; if it does not translate, undo what it added and say why."""
        snap = (len(self.lines), dict(self.operands), dict(self.loaded), len(self.ops), dict(self.kinds))
        try:
            self.value_names = names
            self.assign(value)
        except (Unsupported, NotApplicable) as exc:
            del self.lines[snap[0]:], self.ops[snap[3]:]
            self.operands, self.loaded, self.kinds = snap[1], snap[2], snap[4]
            return str(exc)
        return None

    # -- expressions -----------------------------------------------------------------------------------
    def temp(self, code: str, base: str = "t") -> str:
        """``code`` as a simple name (binding it to a fresh variable named after ``base`` unless it is one)."""
        if code.isidentifier():
            return code
        t = self.fresh(base)
        self.lines.append(f"{t} = {code}")
        return t

    def save(self, names: set[str]) -> None:
        """Keep the tile's current value under ``names`` (forward names a later op reads again) before it changes."""
        if names:
            keep = self.fresh("_".join(sorted(names))[:24] or "kept")
            self.lines.append(f"{keep} = {self.var}")
            self.saved.update({n: keep for n in names})

    def expr(self, node: ast.expr) -> str:
        if isinstance(node, ast.Name) and node.id in self.value_names:
            return self.var
        if isinstance(node, ast.Name) and node.id in self.saved:
            return self.saved[node.id]
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return repr(float(node.value)) if isinstance(node.value, float) else repr(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return PRIMS["neg"]({"self": self.expr(node.operand)})
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd):
            return self.expr(node.operand)
        if isinstance(node, ast.BinOp):  # Python's operators are primitives of the one table
            prim = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}.get(type(node.op))
            if prim is not None:
                left, right = self.expr(node.left), self.expr(node.right)
                self.ops.append(prim)
                if prim == "div":
                    return self.divide(left, right, node.right)
                return PRIMS[prim]({"self": left, "other": right})
            if isinstance(node.op, ast.Pow) and is_literal(literal(node.right)) and \
                    isinstance(literal(node.right), (int, float)):
                self.ops.append("pow")
                try:
                    return PRIMS["pow"]({"self": self.temp(self.expr(node.left)), "exponent": literal(node.right)})
                except DecompositionError as exc:
                    raise Unsupported(str(exc)) from None
            raise Unsupported(f"operator {type(node.op).__name__} is not in the fusion table")
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            prim = {ast.Gt: "gt", ast.Lt: "lt", ast.GtE: "ge", ast.LtE: "le", ast.Eq: "eq", ast.NotEq: "ne"}.get(
                type(node.ops[0]))
            if prim is None:
                raise Unsupported(f"comparison {type(node.ops[0]).__name__} is not in the fusion table")
            self.ops.append("compare")
            return PRIMS[prim]({"self": self.expr(node.left), "other": self.expr(node.comparators[0])})
        red = reduction_call(node) if self._mentions_value(node) else None
        if red is not None:
            return self.reduce_back(node, *red)
        if isinstance(node, ast.Call):
            key, args = op_key(node, self.value_names)
            if key in ROW_OPS and self._mentions_value(node):
                out = ROW_OPS[key](self, node, args)
                self.ops.append(key)
                return out
            if key in ("float",) and len(args) == 1 and not node.keywords:
                return self.expr(args[0])
            if key in VALUE_VIEWS and len(args) == 1 and not node.keywords and self._mentions_value(node):
                return self.expr(args[0])  # y.clone(), y.detach(), y.contiguous(): the same values
            if key == "to" and len(args) == 2 and dotted_name(args[1]) in ("torch.float32", "torch.float"):
                return self.expr(args[0])
            if not self._mentions_value(node):
                return self.operand(node)
            if key in ("reshape", "view"):
                raise Unsupported(f"{ast.unparse(node)} changes the tile's shape: a reshape is followed where it keeps "
                                  "the last dim (its last size the column bound the launch passes)")
            out = self.decomposed(node)
            self.ops.append((key or ast.unparse(node.func)).removesuffix("_"))
            return out
        if isinstance(node, (ast.Attribute, ast.Name, ast.Subscript)):
            return self.operand(node)
        raise Unsupported(f"{ast.unparse(node)} is not an elementwise expression the fusion table supports")

    def decomposed(self, node: ast.Call) -> str:
        """A torch op, reduced by torch's decompositions to primitives and lowered from them
        (:mod:`xeforge.rewrite.fusion.decompose`): its tensor arguments are translated here and passed with their
        kind (the tile's value, a per-column vector, ...), a Python scalar the kernel receives as a run-time scalar,
        literals as they are. An in-place method (``y.mul_(s)``) is its op: the statement assigns its receiver."""
        name = dotted_name(node.func) or ""
        method = not any(name.startswith(p) for p in (*TORCH_PREFIXES, "torch.special."))
        if method and not isinstance(node.func, ast.Attribute):
            raise Unsupported(f"{ast.unparse(node.func)}() is not a torch op")
        raw = [node.func.value, *node.args] if method else list(node.args)
        raw += [k.value for k in node.keywords]
        if any(isinstance(a, ast.Starred) for a in raw) or any(k.arg is None for k in node.keywords):
            raise Unsupported(f"{ast.unparse(node)}: * or ** arguments")
        args: list[tuple[str, Any]] = []
        for a in raw:
            val = literal(a)
            if is_literal(val) and (val is None or isinstance(val, (bool, int, float, str))):
                args.append(("const", val))
            else:
                code = self.expr(a)
                args.append((self.kind(a, code), code))
        op = node.func.attr if method else name
        if method and op.endswith("_") and not op.endswith("__"):
            op = op[:-1]
        try:
            return lower_call(op, method, args, tuple(k.arg for k in node.keywords),
                              lambda code, base: self.temp(code, base))
        except DecompositionError as exc:
            raise Unsupported(str(exc)) from None

    def kind(self, node: ast.expr, code: str) -> str:
        """How an argument (``node``, translated to ``code``) varies: 'mask' for a comparison, 'tile' for anything
        that reads the value or an operand of the output's shape, 'column', 'element', or 'scalar' for an
        expression of run-time Python scalars only."""
        if isinstance(node, (ast.Compare, ast.BoolOp)) or (isinstance(node, ast.UnaryOp)
                                                          and isinstance(node.op, ast.Not)):
            return "mask"
        if self._mentions_value(node):
            return "tile"
        kinds = {self.kinds[n] for n in re.findall(r"[A-Za-z_]\w*", code) if n in self.kinds}
        return next((k for k in ("tile", "column", "element") if k in kinds), "scalar")

    def reduce_back(self, node: ast.AST, kind: str, keep: bool, arg: ast.expr) -> str:
        """A row reduction inside an expression, its ``[rows, 1]`` result broadcast back over the row."""
        if self.row_reduce is None:
            raise Unsupported(f"{ast.unparse(node)} is a row reduction: fused where one tile covers the row (the "
                              "fuse-row-reduction tactic's shape)")
        if not keep:
            raise Unsupported(f"{ast.unparse(node)} drops the reduced dim inside an expression: only keepdim=True "
                              "broadcasts back over the row")
        code = self.row_reduce(kind, self.temp(self.expr(arg)))
        self.ops.append(kind)
        return code

    def divide(self, left: str, right: str, divisor: ast.expr) -> str:
        """``left / right``; a multiplication by ``1.0 / right``, bound once, when the divisor is not the value."""
        if self._mentions_value(divisor):
            return f"({left} / {right})"
        return f"({left} * {self.temp(f'1.0 / {right}', 'inv')})"

    def _mentions_value(self, node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and (n.id in self.value_names or n.id in self.saved)
                   for n in ast.walk(node))

    def operand(self, node: ast.expr) -> str:
        val = literal(node)
        if is_literal(val) and isinstance(val, (int, float)) and not isinstance(val, bool):
            return repr(val)
        op = self.resolve(node)
        if op is None:
            raise Unsupported(f"{ast.unparse(node)} is neither a scalar, a per-column vector nor a tensor of the "
                              "output's shape")
        known = self.operands.setdefault(op.src, op)
        if known.kind == "scalar":
            self.kinds[known.param] = "scalar"
            return known.param
        if known.param in self.loaded:
            return self.loaded[known.param]
        if known.kind == "element":
            name = self.fresh(known.param.removesuffix("_ptr"))
            self.lines.append(f"{name} = tl.load({known.param}).to(tl.float32)")
        elif known.kind == "tile":
            if self.column is None or self.rows is None or self.column_2d:
                raise Unsupported(f"{ast.unparse(node)} has the output's shape, which does not broadcast over a "
                                  "reduced row")
            (offs_m, m), (offs_n, n) = self.rows, self.column
            sm, sn = known.strides
            mask = " & ".join(x for x in (f"({offs_m}[:, None] < {m})" if m else "",
                                          f"({offs_n}[None, :] < {n})" if n else "") if x)
            name = self.fresh(known.param.removesuffix("_ptr"))
            self.lines.append(f"{name} = tl.load({known.param} + {offs_m}[:, None] * {sm} + {offs_n}[None, :] * {sn}"
                              f"{f', mask={mask}, other=0.0' if mask else ''}).to(tl.float32)")
        else:
            if self.column is None:
                raise Unsupported(f"{ast.unparse(node)} is a per-column vector, which does not broadcast over a "
                                  "reduced row")
            offs_n, n = self.column
            name = self.fresh(known.param.removesuffix("_ptr"))
            self.lines.append(f"{name} = tl.load({known.param} + {offs_n}, mask={offs_n} < {n}, "
                              f"other=0.0).to(tl.float32){'' if self.column_2d else '[None, :]'}")
        self.loaded[known.param] = name
        self.kinds[name] = known.kind
        return name


# ------------------------------------------------------------------------------------------------ row ops
def _whole_row(b: EpilogueBuilder, call: ast.Call, args: list[ast.expr]) -> str:
    """The tile value an op over the whole row reads (bound to a name), after checking it reduces over the last dim
    and that one tile covers the row (else Unsupported with the reason)."""
    dim = _kw(call, args, 1, "dim")
    extra = [k.arg for k in call.keywords if k.arg not in ("dim", "dtype")]
    if literal(dim) not in (1, -1) or len(args) > 2 or extra:
        raise Unsupported(f"{ast.unparse(call)}: only over the last dim (dim=1 or -1) is fused")
    if b.row_reduce is None:
        raise Unsupported(f"{ast.unparse(call)} reduces over the row: fused where one tile covers the row (the "
                          "fuse-row-reduction tactic's shape)")
    return b.temp(b.expr(args[0]))


def _softmax(b: EpilogueBuilder, call: ast.Call, args: list[ast.expr]) -> str:
    """``softmax(z, dim=-1)`` = ``exp(z - max) / sum(exp(z - max))`` over the row (one tile covers it)."""
    z = _whole_row(b, call, args)
    e = b.temp(f"tl.exp({z} - {b.row_reduce('max', z)})", "e")
    return f"({e} / {b.row_reduce('sum', e)})"


def _log_softmax(b: EpilogueBuilder, call: ast.Call, args: list[ast.expr]) -> str:
    """``log_softmax(z, dim=-1)`` = ``z - logsumexp(z)`` over the row (one tile covers it)."""
    z = _whole_row(b, call, args)
    return f"({z} - {b.row_reduce('logsumexp', z)})"


#: methods that stand for the tensor they are called on, values unchanged
VALUE_VIEWS = ("clone", "detach", "contiguous")

#: ops over the whole row, lowered with :attr:`EpilogueBuilder.row_reduce` and broadcast back
ROW_OPS: dict[str, Callable[[EpilogueBuilder, ast.Call, list[ast.expr]], str]] = {
    "softmax": _softmax, "log_softmax": _log_softmax,
}
