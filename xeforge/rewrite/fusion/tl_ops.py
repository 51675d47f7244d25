"""Elementwise torch ops that translate to ``tl`` code: the table behind epilogue fusion.

Owns: :data:`TORCH_OPS` (op name -> translation) and :class:`EpilogueBuilder`, which turns statements of
``Model.forward`` such as ``y = F.gelu(y * self.scale)`` into ``tl`` statements applied to a kernel's tile
value, collecting the extra kernel inputs they need (Python scalars, per-column vectors, one-element
tensors). Anything outside the table raises :class:`Unsupported` with the reason. Also the row reductions
(:data:`REDUCTIONS`, :func:`reduction_call`) and the ops over a whole row (:data:`ROW_OPS`: softmax,
log_softmax): inside an expression they are lowered through the builder's ``row_reduce`` where one tile covers
the row, their ``[rows, 1]`` result broadcast back (``y - y.mean(1, keepdim=True)``).

Numerics follow torch's definitions in fp32: ``tanh(z) = 2*sigmoid(2z) - 1`` (no ``tl.tanh`` in core Triton),
``gelu`` erf form ``0.5*z*(1 + erf(z/sqrt(2)))`` and tanh form, ``softplus`` with torch's threshold 20,
``mish(z) = z*tanh(softplus(z))``, inference ``batch_norm`` as ``z * scale + shift`` with the per-column
``scale = w / sqrt(var + eps)`` and ``shift = b - mean * scale`` computed once per column, not per element.
A division by something that is not the tile value (a scalar, a per-column vector) is a multiplication by its
reciprocal, computed once: fp32 division is a multi-instruction sequence per element, the reciprocal's extra
rounding (an ulp of fp32) is far inside any tolerance a 16-bit output allows.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Callable

from xeforge.kernel_model import dotted_name, is_literal, literal
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.fusion.decompose import DecompositionError, lower_call

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
        snap = (len(self.lines), dict(self.operands), dict(self.loaded), len(self.ops))
        try:
            self.value_names = names
            self.assign(value)
        except (Unsupported, NotApplicable) as exc:
            del self.lines[snap[0]:], self.ops[snap[3]:]
            self.operands, self.loaded = snap[1], snap[2]
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
            return f"(-{self.expr(node.operand)})"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd):
            return self.expr(node.operand)
        if isinstance(node, ast.BinOp):
            ops = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
            sym = ops.get(type(node.op))
            if sym is not None:
                left, right = self.expr(node.left), self.expr(node.right)
                self.ops.append({"+": "add", "-": "sub", "*": "mul", "/": "div"}[sym])
                return self.divide(left, right, node.right) if sym == "/" else f"({left} {sym} {right})"
            if isinstance(node.op, ast.Pow) and literal(node.right) == 2:
                t = self.temp(self.expr(node.left))
                self.ops.append("square")
                return f"({t} * {t})"
            raise Unsupported(f"operator {type(node.op).__name__} is not in the fusion table")
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            sym = {ast.Gt: ">", ast.Lt: "<", ast.GtE: ">=", ast.LtE: "<=", ast.Eq: "==", ast.NotEq: "!="}.get(
                type(node.ops[0]))
            if sym is None:
                raise Unsupported(f"comparison {type(node.ops[0]).__name__} is not in the fusion table")
            self.ops.append("compare")
            return f"({self.expr(node.left)} {sym} {self.expr(node.comparators[0])})"
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
            if key and key.endswith("_") and key[:-1] in TORCH_OPS:
                key = key[:-1]  # y.mul_(s): the in-place op is the op (the statement assigns its receiver)
            if key == "to" and len(args) == 2 and dotted_name(args[1]) in ("torch.float32", "torch.float"):
                return self.expr(args[0])
            if key in TORCH_OPS and self._mentions_value(node):
                out = TORCH_OPS[key](self, node, args)
                self.ops.append(key)
                return out
            if not self._mentions_value(node):
                return self.operand(node)
            out = self.decomposed(node)
            self.ops.append(key or ast.unparse(node.func))
            return out
        if isinstance(node, (ast.Attribute, ast.Name, ast.Subscript)):
            return self.operand(node)
        raise Unsupported(f"{ast.unparse(node)} is not an elementwise expression the fusion table supports")

    def decomposed(self, node: ast.Call) -> str:
        """An op outside the table, reduced by torch's decompositions to primitives and lowered from them
        (:mod:`xeforge.rewrite.fusion.decompose`); its tensor arguments are translated here, literals stay."""
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
                args.append(("tensor", self.temp(self.expr(a))))
        try:
            return lower_call(node.func.attr if method else name, method, args,
                              tuple(k.arg for k in node.keywords), lambda code, base: self.temp(code, base))
        except DecompositionError as exc:
            raise Unsupported(f"{exc} (the fusion table has: {', '.join(sorted(TORCH_OPS))})") from None

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
        return name

    def scalar_arg(self, node: ast.expr | Any, default: float) -> str:
        if node is None:
            return repr(float(default))
        if not isinstance(node, ast.AST):
            return repr(node)
        return self.expr(node)


# ------------------------------------------------------------------------------------------------ the table
def _unary(fmt: str) -> Callable[[EpilogueBuilder, ast.Call, list[ast.expr]], str]:
    def build(b: EpilogueBuilder, call: ast.Call, args: list[ast.expr]) -> str:
        if len(args) != 1 or call.keywords:
            raise Unsupported(f"{ast.unparse(call)}: only the one-argument form is supported")
        z = b.expr(args[0])
        if fmt.count("{z}") > 1:
            z = b.temp(z)
        return fmt.format(z=z)

    return build


def _tanh_code(z: str) -> str:
    return f"(2.0 * tl.sigmoid(2.0 * {z}) - 1.0)"


def _binary(sym: str) -> Callable[[EpilogueBuilder, ast.Call, list[ast.expr]], str]:
    def build(b: EpilogueBuilder, call: ast.Call, args: list[ast.expr]) -> str:
        if len(args) != 2 or call.keywords:
            raise Unsupported(f"{ast.unparse(call)}: only the two-operand form is supported")
        left, right = b.expr(args[0]), b.expr(args[1])
        return b.divide(left, right, args[1]) if sym == "/" else f"({left} {sym} {right})"

    return build


def _minmax(fn: str) -> Callable[[EpilogueBuilder, ast.Call, list[ast.expr]], str]:
    def build(b: EpilogueBuilder, call: ast.Call, args: list[ast.expr]) -> str:
        if len(args) != 2 or call.keywords:
            raise Unsupported(f"{ast.unparse(call)}: only the two-operand form is supported")
        return f"tl.{fn}({b.expr(args[0])}, {b.expr(args[1])})"

    return build


def _relu(b, call, args):
    if len(args) != 1:
        raise Unsupported(f"{ast.unparse(call)}: unexpected arguments")
    return f"tl.maximum({b.expr(args[0])}, 0.0)"


def _leaky_relu(b, call, args):
    z = b.temp(b.expr(args[0]))
    s = b.scalar_arg(_kw(call, args, 1, "negative_slope"), 0.01)
    return f"tl.where({z} >= 0, {z}, {z} * {s})"


def _silu(b, call, args):
    z = b.temp(b.expr(args[0]))
    return f"({z} * tl.sigmoid({z}))"


def _tanh(b, call, args):
    return _tanh_code(b.expr(args[0]))


def _gelu(b, call, args):
    approx = _kw(call, args, 1, "approximate", "none")
    approx = literal(approx) if isinstance(approx, ast.AST) else approx
    z = b.temp(b.expr(args[0]))
    if approx == "tanh":
        inner = b.temp(f"0.7978845608028654 * ({z} + 0.044715 * {z} * {z} * {z})")
        return f"(0.5 * {z} * (1.0 + {_tanh_code(inner)}))"
    if approx != "none":
        raise Unsupported(f"{ast.unparse(call)}: approximate={approx!r} is not a literal 'none' or 'tanh'")
    return f"(0.5 * {z} * (1.0 + tl.erf({z} * 0.7071067811865476)))"


def _hardtanh(b, call, args):
    lo = b.scalar_arg(_kw(call, args, 1, "min_val"), -1.0)
    hi = b.scalar_arg(_kw(call, args, 2, "max_val"), 1.0)
    return f"tl.minimum(tl.maximum({b.expr(args[0])}, {lo}), {hi})"


def _clamp(b, call, args):
    lo = _kw(call, args, 1, "min")
    hi = _kw(call, args, 2, "max")
    if isinstance(lo, ast.Constant) and lo.value is None:
        lo = None
    if isinstance(hi, ast.Constant) and hi.value is None:
        hi = None
    if lo is None and hi is None:
        raise Unsupported(f"{ast.unparse(call)}: clamp without bounds")
    out = b.expr(args[0])
    if lo is not None:
        out = f"tl.maximum({out}, {b.expr(lo)})"
    if hi is not None:
        out = f"tl.minimum({out}, {b.expr(hi)})"
    return out


def _clamp_min(b, call, args):
    return f"tl.maximum({b.expr(args[0])}, {b.expr(_kw(call, args, 1, 'min'))})"


def _clamp_max(b, call, args):
    return f"tl.minimum({b.expr(args[0])}, {b.expr(_kw(call, args, 1, 'max'))})"


def _softplus_code(b: EpilogueBuilder, z: str, beta: str = "1.0", threshold: str = "20.0") -> str:
    z = b.temp(z)
    if beta in ("1.0", "1"):
        return f"tl.where({z} > {threshold}, {z}, tl.log(1.0 + tl.exp({z})))"
    bz = b.temp(f"{beta} * {z}")
    return f"tl.where({bz} > {threshold}, {z}, tl.log(1.0 + tl.exp({bz})) / {beta})"


def _softplus(b, call, args):
    beta = b.scalar_arg(_kw(call, args, 1, "beta"), 1.0)
    threshold = b.scalar_arg(_kw(call, args, 2, "threshold"), 20.0)
    return _softplus_code(b, b.expr(args[0]), beta, threshold)


def _mish(b, call, args):
    z = b.temp(b.expr(args[0]))
    sp = b.temp(_softplus_code(b, z))
    return f"({z} * {_tanh_code(sp)})"


def _batch_norm(b, call, args):
    training = _kw(call, args, 5, "training", None)
    if training is not None and literal(training) is not False:
        raise Unsupported("F.batch_norm with training=True normalises over the batch (a column reduction)")
    mean, var = _kw(call, args, 1, "running_mean"), _kw(call, args, 2, "running_var")
    if mean is None or var is None:
        raise Unsupported("F.batch_norm without running statistics")
    weight, bias = _kw(call, args, 3, "weight"), _kw(call, args, 4, "bias")
    eps = b.scalar_arg(_kw(call, args, 7, "eps"), 1e-5)
    for name, node in (("running_mean", mean), ("running_var", var), ("weight", weight), ("bias", bias)):
        if node is not None and b._mentions_value(node):
            raise Unsupported(f"F.batch_norm whose {name} is computed from the value itself")
    given = [n is not None and not (isinstance(n, ast.Constant) and n.value is None) for n in (weight, bias)]
    z = b.expr(args[0])
    # per column once: scale = w / sqrt(var + eps), shift = b - mean * scale; per element one multiply-add
    std = f"tl.sqrt({b.expr(var)} + {eps})"
    scale = b.temp(f"{b.expr(weight)} / {std}" if given[0] else f"1.0 / {std}", "bn_scale")
    mean_s = b.expr(mean)
    shift = b.temp(f"{b.expr(bias)} - {mean_s} * {scale}" if given[1] else f"-{mean_s} * {scale}", "bn_shift")
    return f"({z} * {scale} + {shift})"


def _where(b, call, args):
    if len(args) != 3 or call.keywords:
        raise Unsupported(f"{ast.unparse(call)}: only torch.where(condition, a, b) is supported")
    return f"tl.where({b.expr(args[0])}, {b.expr(args[1])}, {b.expr(args[2])})"


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

#: torch op (as ``torch.X`` / ``F.X`` / ``tensor.X()``) -> translation into tl code
TORCH_OPS: dict[str, Callable[[EpilogueBuilder, ast.Call, list[ast.expr]], str]] = {
    "add": _binary("+"), "sub": _binary("-"), "subtract": _binary("-"), "mul": _binary("*"),
    "multiply": _binary("*"), "div": _binary("/"), "divide": _binary("/"), "true_divide": _binary("/"),
    "relu": _relu, "leaky_relu": _leaky_relu, "sigmoid": _unary("tl.sigmoid({z})"), "silu": _silu,
    "tanh": _tanh, "gelu": _gelu, "hardtanh": _hardtanh, "clamp": _clamp, "clip": _clamp,
    "clamp_min": _clamp_min, "clamp_max": _clamp_max, "mish": _mish, "softplus": _softplus,
    "exp": _unary("tl.exp({z})"), "log": _unary("tl.log({z})"), "abs": _unary("tl.abs({z})"),
    "sqrt": _unary("tl.sqrt({z})"), "rsqrt": _unary("tl.rsqrt({z})"), "neg": _unary("(-{z})"),
    "negative": _unary("(-{z})"), "square": _unary("({z} * {z})"), "reciprocal": _unary("(1.0 / {z})"),
    "maximum": _minmax("maximum"), "minimum": _minmax("minimum"), "batch_norm": _batch_norm, "where": _where,
}
