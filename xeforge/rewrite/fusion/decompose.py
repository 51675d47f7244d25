"""Elementwise torch ops reduced by torch's own decompositions and lowered to ``tl`` code: the one lowering.

Owns :func:`lower_call` and :data:`PRIMS`, the one table from ATen primitives to ``tl`` code. Every torch op an
epilogue applies (``F.gelu``, ``torch.relu``, ``F.batch_norm``, ``F.hardswish``, ``torch.lerp``, ``y.mul_(s)``,
...) is traced with ``make_fx`` on small sample tensors under torch's decomposition table (``torch._decomp``),
until every node is a primitive of :data:`PRIMS` (add, mul, where, exp, comparisons, ...); each node then becomes
one ``tl`` expression. The graph's inputs are the operands the caller already translated, each traced with the
shape of how it varies (:data:`SAMPLE_SHAPES`: the tile, a per-column vector, one element, a mask); a Python scalar
the kernel receives at run time is traced as a stand-in value and written back by name; Python literals stay
constants. A division by what does not vary over the tile is one reciprocal and a multiply per element.

A run of adds, subtracts, multiplies, divides and negations between the tile's value and what does not vary over
the tile (per-column vectors, one-element tensors, scalars) is folded into one multiply-add, ``x * scale + shift``,
its scale and shift computed once per column (:func:`_affine`): inference batch_norm's ``(x - mean) * invstd *
weight + bias`` keeps two column vectors alive beside the accumulator instead of four. On an H100 (2026-12-07,
docs/measurements/ports-h100-2026-12-07d) kb41's 128 x 256 GEMM with that epilogue spilled 38 registers unfolded and
14 folded, and its port reached 0.98-0.99x of torch.compile at every timed shape (from 0.70-0.91x); the same fold, in
the per-family code this module replaced, had taken it from 0.90x to 0.98x on the H200 (BENCHMARKS.md, issues 4 and 6).

What is traced is only ever a torch function resolved by name from ``torch.nn.functional``, ``torch.special``, or
(with a reference implementation in ``torch._refs``, so never ``torch.save`` and the like) ``torch`` and
``torch.Tensor``, called on this module's own sample tensors with the literal arguments the call wrote: no user code
runs here. A node whose inputs are all constants is computed by torch at once. Anything else, or a graph with a node
outside :data:`PRIMS` (a reduction, a view, an op with no ``tl`` form), raises :class:`DecompositionError` naming
the op.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Callable

#: where a name of the call is looked up: (prefix as written, the torch module's attribute path)
MODULES = (("torch.nn.functional.", "nn.functional"), ("nn.functional.", "nn.functional"), ("F.", "nn.functional"),
           ("torch.special.", "special"), ("torch.", ""))


class DecompositionError(Exception):
    """The op cannot be reduced to :data:`PRIMS`; ``str(exc)`` says which op or node and why."""


def _f(x: Any) -> str:
    """A Python scalar as tl source (floats keep a dot; inf and nan as float(...))."""
    if isinstance(x, bool):
        return "1.0" if x else "0.0"
    x = float(x)
    if math.isinf(x) or math.isnan(x):
        return f'float("{x}")'
    return repr(x)


def _c(x: Any) -> str:
    return x if isinstance(x, str) else _f(x)


def _tanh(z: str) -> str:
    return f"(2.0 * tl.sigmoid(2.0 * {z}) - 1.0)"  # no tl.tanh in core Triton


def _pow(a: str, e: Any) -> str:
    if isinstance(e, str):
        raise DecompositionError("a power with a tensor exponent (the base's sign decides torch's result)")
    if float(e).is_integer() and 1 <= abs(e) <= 4:
        prod = " * ".join([a] * int(abs(e)))
        return f"({prod})" if e > 0 else f"(1.0 / ({prod}))"
    if e == 0.5:
        return f"tl.sqrt({a})"
    if e == 0:
        return "1.0"
    return f"tl.exp({_f(e)} * tl.log({a}))"  # a negative base gives nan, as torch's pow does for a fractional e


def _clamp(a: str, lo: Any, hi: Any) -> str:
    if lo is not None:
        a = f"tl.maximum({a}, {_c(lo)})"
    if hi is not None:
        a = f"tl.minimum({a}, {_c(hi)})"
    return a


def _gelu(a: str, approximate: str) -> str:
    if approximate == "tanh":
        inner = f"0.7978845608028654 * ({a} + 0.044715 * {a} * {a} * {a})"
        return f"(0.5 * {a} * (1.0 + {_tanh(f'({inner})')}))"
    return f"(0.5 * {a} * (1.0 + tl.erf({a} * 0.7071067811865476)))"


def _alpha(b: str, alpha: Any) -> str:
    return b if alpha in (None, 1) else f"{b} * {_c(alpha)}"


def _is_one(x: Any) -> bool:
    """A literal 1 (not a tile value's code): multiplying by it changes nothing."""
    return not isinstance(x, (str, bool)) and x == 1


def _div(p: dict[str, Any]) -> str:
    if p.get("rounding_mode") is not None:
        raise DecompositionError(f"div with rounding_mode={p['rounding_mode']!r}")
    return f"({_c(p['self'])} / {_c(p['other'])})"


_CMP = {"gt": ">", "lt": "<", "ge": ">=", "le": "<=", "eq": "==", "ne": "!="}

#: ATen primitive (overload packet name) -> tl code from its arguments by schema name (tl code of a tensor
#: argument, or the Python value of a scalar one). Every ``tl`` code that epilogue fusion writes for elementwise
#: math comes from here (Python's operators in ``forward`` too).
PRIMS: dict[str, Callable[[dict[str, Any]], str]] = {
    "add": lambda p: f"({_c(p['self'])} + {_alpha(_c(p['other']), p.get('alpha'))})",
    "sub": lambda p: f"({_c(p['self'])} - {_alpha(_c(p['other']), p.get('alpha'))})",
    "rsub": lambda p: f"({_c(p['other'])} - {_alpha(_c(p['self']), p.get('alpha'))})",
    "mul": lambda p: _c(p["self"]) if _is_one(p["other"]) else f"({_c(p['self'])} * {_c(p['other'])})",
    "div": lambda p: _div(p),
    "neg": lambda p: f"(-{p['self']})",
    "exp": lambda p: f"tl.exp({p['self']})",
    "exp2": lambda p: f"tl.exp2({p['self']})",
    "expm1": lambda p: f"(tl.exp({p['self']}) - 1.0)",
    "log": lambda p: f"tl.log({p['self']})",
    "log2": lambda p: f"tl.log2({p['self']})",
    "log1p": lambda p: f"tl.log(1.0 + {p['self']})",
    "sqrt": lambda p: f"tl.sqrt({p['self']})",
    "rsqrt": lambda p: f"tl.rsqrt({p['self']})",
    "abs": lambda p: f"tl.abs({p['self']})",
    "sigmoid": lambda p: f"tl.sigmoid({p['self']})",
    "tanh": lambda p: _tanh(p["self"]),
    "erf": lambda p: f"tl.erf({p['self']})",
    "sin": lambda p: f"tl.sin({p['self']})",
    "sinh": lambda p: f"(0.5 * (tl.exp({p['self']}) - tl.exp(-{p['self']})))",
    "cosh": lambda p: f"(0.5 * (tl.exp({p['self']}) + tl.exp(-{p['self']})))",
    "cos": lambda p: f"tl.cos({p['self']})",
    "floor": lambda p: f"tl.floor({p['self']})",
    "ceil": lambda p: f"tl.ceil({p['self']})",
    "reciprocal": lambda p: f"(1.0 / {p['self']})",
    "pow": lambda p: _pow(p["self"], p["exponent"]),
    "sign": lambda p: f"tl.where({p['self']} > 0, 1.0, tl.where({p['self']} < 0, -1.0, 0.0))",
    "isnan": lambda p: f"({p['self']} != {p['self']})",
    "where": lambda p: ({"True": _c(p["self"]), "False": _c(p["other"])}.get(p["condition"]) or
                        f"tl.where({p['condition']}, {_c(p['self'])}, {_c(p['other'])})"),
    "maximum": lambda p: f"tl.maximum({_c(p['self'])}, {_c(p['other'])})",
    "minimum": lambda p: f"tl.minimum({_c(p['self'])}, {_c(p['other'])})",
    "clamp": lambda p: _clamp(p["self"], p.get("min"), p.get("max")),
    "clamp_min": lambda p: _clamp(p["self"], p["min"], None),
    "clamp_max": lambda p: _clamp(p["self"], None, p["max"]),
    "relu": lambda p: f"tl.maximum({p['self']}, 0.0)",
    "gelu": lambda p: _gelu(p["self"], p.get("approximate") or "none"),
    "logical_not": lambda p: f"({p['self']} == 0)",
    "logical_and": lambda p: f"(({p['self']} != 0) & ({p['other']} != 0))",
    "logical_or": lambda p: f"(({p['self']} != 0) | ({p['other']} != 0))",
    **{k: (lambda sym: lambda p: f"({_c(p['self'])} {sym} {_c(p['other'])})")(v) for k, v in _CMP.items()},
    # constants (folded before they get here) and casts: the epilogue computes in fp32
    "full": lambda p: _c(p["fill_value"]),
    "scalar_tensor": lambda p: _c(p["s"]),
    "_to_copy": lambda p: p["self"],
    "clone": lambda p: p["self"],
    "alias": lambda p: p["self"],
}


def _resolve(name: str, method: bool) -> tuple[Callable, str]:
    """The torch function ``name`` (as written, ``F.hardswish`` / a method's ``lerp``) with a ``torch._refs``
    reference, and its display name; else DecompositionError."""
    import torch  # lazy: torch is needed only when an epilogue op is lowered
    import torch._refs as refs

    def attr(root: Any, path: str) -> Any:
        for part in filter(None, path.split(".")):
            root = getattr(root, part, None)
        return root

    def has_ref(short: str) -> bool:  # torch.relu's reference lives in torch._refs.nn.functional
        return attr(refs, short) is not None or attr(refs, f"nn.functional.{short}") is not None

    if method:
        if not has_ref(name) or getattr(torch.Tensor, name, None) is None:
            raise DecompositionError(f".{name}() has no elementwise reference in torch._refs")
        return (lambda *a, **k: getattr(a[0], name)(*a[1:], **k)), f".{name}()"
    for prefix, mod in MODULES:
        if name.startswith(prefix) and "." not in name[len(prefix):]:
            short = name[len(prefix):]
            fn = attr(torch, f"{mod}.{short}")
            # torch.nn.functional and torch.special hold tensor math only; of torch's own namespace (torch.save,
            # torch.set_*, ...) only what torch._refs has a reference for
            if fn is None or not callable(fn) or (not mod and not has_ref(short)):
                raise DecompositionError(f"{name}() is not an op with a reference implementation in torch._refs")
            return fn, f"{name}()"
    raise DecompositionError(f"{name}() is not a function of torch, torch.nn.functional or torch.special")


#: an operand's kind -> the shape of its sample tensor: the tile's value and operands of the output's shape
#: [rows, cols]; a per-column vector broadcast over the rows; a one-element tensor; a boolean mask of the tile
SAMPLE_SHAPES = {"tile": (2, 4), "column": (4,), "element": (), "mask": (2, 4)}
#: A Python scalar the kernel receives at run time (a Model attribute, a forward local) is traced as a stand-in
#: value, twice, with one set of these each: a graph whose constants differ between the two traces anywhere else
#: computed with the scalar while it was traced (``1 - eps`` folded in Python) and is refused. Each set ascends
#: (``hardtanh(y, lo, hi)`` checks lo <= hi) and is positive (an eps must be); the first is below one and the second
#: above, so a decomposition that branches on a scalar against one (``beta == 1``) traces another graph the second
#: time and is refused too.
_SENTINELS = ((0.1192029220221178, 0.2689414213699951, 0.7310585786300049, 0.8807970779778823),
              (1.6487212707001282, 2.718281828459045, 7.38905609893065, 20.085536923187668))


class _Scalar:
    """Where the i-th run-time scalar operand stands in a traced graph's arguments."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<scalar operand {self.index}>"


def _trace(fn: Callable, kinds: tuple[str, ...], consts: tuple, kw_names: tuple[str, ...], sentinels: tuple,
           table: dict, shown: str):
    import torch  # lazy, as in _resolve
    from torch.fx.experimental.proxy_tensor import make_fx

    scalars = iter(sentinels)
    fixed = [next(scalars) if k == "scalar" else c for k, c in zip(kinds, consts)]
    traced = [i for i, k in enumerate(kinds) if k in SAMPLE_SHAPES]

    def call(*tensors):
        vals = list(fixed)
        for i, t in zip(traced, tensors):
            vals[i] = t
        npos = len(vals) - len(kw_names)
        return fn(*vals[:npos], **dict(zip(kw_names, vals[npos:])))

    gen = torch.Generator().manual_seed(0)
    samples = [torch.randn(SAMPLE_SHAPES[kinds[i]], generator=gen) for i in traced]
    samples = [t > 0 if kinds[i] == "mask" else t for i, t in zip(traced, samples)]
    try:
        return make_fx(call, decomposition_table=table)(*samples)
    except Exception as exc:  # noqa: BLE001 - torch's error for a call it rejects, said as the reason
        raise DecompositionError(f"{shown} could not be traced on sample tensors: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}") from None


def _mark_scalars(a: Any, b: Any, shown: str) -> Any:
    """``a`` (an argument of the first trace) with the run-time scalars' sentinels replaced by :class:`_Scalar`;
    ``b`` is the same argument in the second trace."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return type(a)(_mark_scalars(x, y, shown) for x, y in zip(a, b))
    if hasattr(a, "op") or a == b or (a != a and b != b):  # a graph node, an unchanged constant, nan
        return a
    for i, (x, y) in enumerate(zip(*_SENTINELS)):
        if a == x and b == y:
            return _Scalar(i)
    raise DecompositionError(f"{shown} computes a constant from a run-time scalar while it is traced (torch's "
                             "decomposition does that math in Python): pass that argument as a literal")


@lru_cache(maxsize=256)
def _graph(name: str, method: bool, kinds: tuple[str, ...], consts: tuple, kw_names: tuple[str, ...]):
    """The decomposed FX graph of the call: ``kinds[i]`` is a key of :data:`SAMPLE_SHAPES` for an input traced as
    a tensor, 'scalar' for a run-time Python scalar (its uses are :class:`_Scalar` in the graph), 'const' for the
    literal at the same place of ``consts``; the last ``len(kw_names)`` arguments are keywords."""
    from torch._decomp import core_aten_decompositions, decomposition_table  # lazy, as in _resolve

    fn, shown = _resolve(name, method)
    if kinds.count("scalar") > len(_SENTINELS[0]):
        raise DecompositionError(f"{shown} takes more than {len(_SENTINELS[0])} run-time scalars")
    table = dict(core_aten_decompositions())
    table.update({op: f for op, f in decomposition_table.items()
                  if getattr(getattr(op, "overloadpacket", None), "__name__", None) not in PRIMS})
    gm = _trace(fn, kinds, consts, kw_names, _SENTINELS[0], table, shown)
    if "scalar" in kinds:
        other = _trace(fn, kinds, consts, kw_names, _SENTINELS[1], table, shown)
        nodes, others = list(gm.graph.nodes), list(other.graph.nodes)
        if [(n.op, n.target) for n in nodes] != [(n.op, n.target) for n in others]:
            raise DecompositionError(f"{shown} decomposes differently for different values of its run-time scalars: "
                                     "pass them as literals")
        for n, m in zip(nodes, others):
            n.args = _mark_scalars(n.args, m.args, shown)
            n.kwargs = {k: _mark_scalars(v, m.kwargs.get(k), shown) for k, v in n.kwargs.items()}
    return gm.graph, shown


def lower_call(name: str, method: bool, args: list[tuple[str, Any]], kw_names: tuple[str, ...],
               bind: Callable[[str, str], str]) -> str:
    """tl code of the elementwise call ``name(*args)``. Each arg is (kind, its tl code) for an operand — kind
    'tile', 'column', 'element' or 'mask' (see :data:`SAMPLE_SHAPES`), or 'scalar' for a Python scalar the kernel
    receives — or ('const', a Python literal); the last ``len(kw_names)`` are keywords. ``bind(code, base)`` binds
    a value that more than one place reads to a fresh variable (and returns its name), so it is computed once."""
    kinds = tuple(k for k, _ in args)
    consts = tuple(v if k == "const" else None for k, v in args)
    try:
        graph, shown = _graph(name, method, kinds, consts, kw_names)
    except TypeError as exc:  # an unhashable literal (a list): not an elementwise call's argument
        raise DecompositionError(f"{name}(): {exc}") from None
    inputs = iter((k, code) for k, code in args if k in SAMPLE_SHAPES)
    scalars = [code for k, code in args if k == "scalar"]
    env: dict[Any, Any] = {}
    tiled = _tiled_nodes(graph, kinds)  # the nodes whose value varies over the tile (not one per column or program)
    steps = _affine_steps(graph, tiled)  # node -> (schema name, tile input): a step of a multiply-add run
    affine: dict[Any, tuple[str, Any, Any]] = {}  # node -> (tile code, scale, shift): its value is code * scale + shift
    out = None
    for node in graph.nodes:
        if node.op == "placeholder":
            kind, code = next(inputs)
            # an input read in more than one place is bound once; read once, it stays inline
            env[node] = code if code.isidentifier() or _is_number(code) or len(node.users) <= 1 else bind(code, "d")
        elif node.op == "output":
            res = node.args[0]
            res = res[0] if isinstance(res, (list, tuple)) and len(res) == 1 else res
            if not hasattr(res, "op"):
                raise DecompositionError(f"{shown} does not return one tensor")
            out = env[res]
        elif node.op == "call_function":
            if not node.users:
                continue  # a result nothing reads (batch_norm's saved statistics of training)
            packet = getattr(getattr(node.target, "overloadpacket", None), "__name__", str(node.target))
            if packet not in PRIMS:
                raise DecompositionError(f"{shown} decomposes to aten.{packet}, which has no tl lowering (not "
                                         "elementwise, or not in the primitive table)")
            params, from_graph = _by_schema(node, env, scalars)
            if not any(isinstance(params[k], str) for k in from_graph) and node not in tiled:
                env[node] = _fold(node, params)  # constants only: torch computes it now (a Python scalar)
                continue
            if node in steps:
                name, src = steps[node]
                base, scale, shift = affine.get(src) or (env[src], None, None)
                affine[node] = (base, *_affine(packet, name, params, scale, shift, bind))
                if all(u in steps for u in node.users):
                    env[node] = None  # read only by further steps of the run: never written out
                    continue
                code = _affine_code(*affine[node], bind)
            else:
                for k in from_graph:  # a constant of the graph beside a tile value: as tl source
                    if not isinstance(params[k], str):
                        params[k] = str(params[k]) if isinstance(params[k], bool) else _f(params[k])
                code = _once(PRIMS[packet], params, from_graph, bind)
            env[node] = code if code.isidentifier() or _is_number(code) or len(node.users) <= 1 else bind(code, "d")
        else:
            raise DecompositionError(f"{shown}: graph node {node.op} {node.target}")
    if out is None:
        raise DecompositionError(f"{shown} has no output")
    return out


#: the primitives a run of multiply-adds is folded through (:func:`_affine`)
AFFINE = {"add", "sub", "rsub", "mul", "div", "neg"}


def _tiled_nodes(graph: Any, kinds: tuple[str, ...]) -> set[Any]:
    """The graph's nodes whose value varies over the tile: the tile and mask inputs and what reads them."""
    fed = iter(k for k in kinds if k in SAMPLE_SHAPES)
    out: set[Any] = set()
    for node in graph.nodes:
        if node.op == "placeholder":
            if next(fed) in ("tile", "mask"):
                out.add(node)
        elif any(a in out for a in node.all_input_nodes):
            out.add(node)
    return out


def _affine_steps(graph: Any, tiled: set[Any]) -> dict[Any, tuple[str, Any]]:
    """The nodes that are one step of a multiply-add run on the tile, each with its tile input (schema name, node):
    an add, subtract, multiply or negation of one tiled value by what does not vary over the tile, or its division
    by that."""
    out: dict[Any, tuple[str, Any]] = {}
    for node in graph.nodes:
        packet = getattr(getattr(node.target, "overloadpacket", None), "__name__", None)
        if node not in tiled or node.op != "call_function" or packet not in AFFINE or node.kwargs.get("alpha", 1) != 1:
            continue
        if (packet == "div" and node.kwargs.get("rounding_mode") is not None) or \
                len(node.args) > (1 if packet == "neg" else 2):
            continue
        names = [a.name for a in node.target._schema.arguments]
        ins = [(names[i], a) for i, a in enumerate(node.args) if hasattr(a, "op") and a in tiled]
        if len(ins) == 1 and not (packet == "div" and ins[0][0] != "self"):  # x / c, never c / x
            out[node] = ins[0]
    return out


def _times(a: Any, b: Any) -> Any:
    """``a * b`` where None is one: tl code, or a Python number when both are numbers."""
    if a is None or b is None:
        return b if a is None else a
    if not isinstance(a, str) and not isinstance(b, str):
        return a * b
    return f"({_c(a)} * {_c(b)})"


def _plus(a: Any, b: Any, sign: str = "+") -> Any:
    """``a + b`` (``a - b``) where None is zero."""
    if b is None:
        return a
    if a is None:
        return b if sign == "+" else (-b if not isinstance(b, str) else f"(-{b})")
    if not isinstance(a, str) and not isinstance(b, str):
        return a + b if sign == "+" else a - b
    return f"({_c(a)} {sign} {_c(b)})"


def _affine(packet: str, name: str, params: dict[str, Any], scale: Any, shift: Any,
            bind: Callable[[str, str], str]) -> tuple[Any, Any]:
    """The (scale, shift) of ``packet`` applied to a value ``x * scale + shift`` passed as argument ``name``, the
    other argument (tl code of something that does not vary over the tile, or a number) from ``params``; ``bind``
    as :func:`lower_call`'s."""
    other = params.get("other" if name == "self" else "self")
    factor = {"neg": -1.0, "mul": other}.get(packet)
    if packet == "div":  # x / 0.0 is x * inf, in IEEE arithmetic as in torch (0 / 0 and 0 * inf both nan)
        factor = f"(1.0 / {other})" if isinstance(other, str) else \
            (1.0 / other if other != 0 else math.copysign(math.inf, other))
    if factor is not None:  # the shift scales too, where there is one (None: zero)
        if shift is not None and isinstance(factor, str) and not factor.isidentifier():
            factor = bind(factor, "factor")  # read by the scale and the shift: computed once
        return _times(scale, factor), None if shift is None else _times(shift, factor)
    if packet == "add":
        return scale, _plus(shift, other)
    # sub(self, other) = self - other; rsub(self, other) = other - self
    if (packet == "sub") == (name == "self"):
        return scale, _plus(shift, other, "-")
    return _times(scale, -1.0), _plus(other, shift, "-")


def _affine_code(base: str, scale: Any, shift: Any, bind: Callable[[str, str], str]) -> str:
    """``base * scale + shift`` as tl code, scale and shift bound once (they do not vary over the tile)."""
    code = base
    if isinstance(scale, str):
        code = f"({code} * {bind(scale, 'scale')})"
    elif scale is not None and scale != 1:
        code = f"({code} * {_f(scale)})"
    if isinstance(shift, str):
        code = f"({code} + {bind(shift, 'shift')})"
    elif shift is not None and shift != 0:
        code = f"({code} + {_f(shift)})"
    return code


def _once(prim: Callable[[dict[str, Any]], str], params: dict[str, Any], names: set[str],
          bind: Callable[[str, str], str]) -> str:
    """``prim(params)``; an operand's code that the primitive's formula repeats (gelu, sign) is bound first."""
    code = prim(params)
    repeated = {k for k in names if isinstance(params[k], str) and not params[k].isidentifier()
                and not _is_number(params[k]) and code.count(params[k]) > 1}
    if not repeated:
        return code
    return prim({**params, **{k: bind(params[k], "d") for k in repeated}})


def _fold(node: Any, params: dict[str, Any]) -> Any:
    """A node whose inputs are all constants, computed by torch itself (in fp64, as the reference computes)."""
    import torch  # lazy, as in _resolve

    args = {}
    for a in node.target._schema.arguments:
        v = params[a.name]
        if str(a.type).startswith("Tensor") and isinstance(v, (int, float, bool)):
            v = torch.tensor(v, dtype=torch.bool if isinstance(v, bool) else torch.float64)
        args[a.name] = v
    try:
        got = node.target(**args)
    except Exception as exc:  # noqa: BLE001 - torch's refusal of these constants, said as the reason
        raise DecompositionError(f"aten.{node.target} on constants: {type(exc).__name__}: {exc}") from None
    if not hasattr(got, "numel"):
        return got
    flat = got.flatten()
    if flat.numel() == 0 or not bool((flat == flat[0]).all()):
        raise DecompositionError(f"aten.{node.target} makes a constant tensor that is not one value")
    return flat[0].item()


def _is_number(code: str) -> bool:
    try:
        float(code)
    except ValueError:
        return code.startswith("float(")
    return True


def _by_schema(node: Any, env: dict, scalars: list[str]) -> tuple[dict[str, Any], set[str]]:
    """The node's arguments by their schema names (tl code or a folded Python scalar for a graph value, the code of
    a run-time scalar, the literal otherwise), and the names whose value came from the graph or a scalar."""
    schema = node.target._schema
    out, from_graph = {}, set()
    for i, a in enumerate(schema.arguments):
        if i < len(node.args):
            v = node.args[i]
        elif a.name in node.kwargs:
            v = node.kwargs[a.name]
        else:
            v = a.default_value if a.has_default_value() else None
        if hasattr(v, "op"):
            v = env[v]
            from_graph.add(a.name)
        elif isinstance(v, _Scalar):
            v = scalars[v.index]
            from_graph.add(a.name)
        elif isinstance(v, (list, tuple)) and any(isinstance(x, _Scalar) for x in v):
            raise DecompositionError(f"aten.{node.target} takes a run-time scalar inside a list: pass it as a literal")
        out[a.name] = v
    return out, from_graph
