"""Elementwise torch ops outside the fusion table, reduced by torch's own decompositions and lowered to ``tl`` code.

Owns :func:`lower_call` and :data:`PRIMS`, the one table from ATen primitives to ``tl`` code. An op the hand-written
table of :mod:`xeforge.rewrite.fusion.tl_ops` does not name (``F.hardswish``, ``F.elu``, ``F.softsign``,
``torch.lerp``, ``torch.special.expit``, ...) is traced with ``make_fx`` on small sample tensors under torch's
decomposition table (``torch._decomp``), until every node is a primitive of :data:`PRIMS` (add, mul, where, exp,
comparisons, ...); each node then becomes one ``tl`` expression. The graph's inputs are the tile's value and the
operands the caller already translated; Python literals stay constants.

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


def _div(p: dict[str, Any]) -> str:
    if p.get("rounding_mode") is not None:
        raise DecompositionError(f"div with rounding_mode={p['rounding_mode']!r}")
    return f"({_c(p['self'])} / {_c(p['other'])})"


_CMP = {"gt": ">", "lt": "<", "ge": ">=", "le": "<=", "eq": "==", "ne": "!="}

#: ATen primitive (overload packet name) -> tl code from its arguments by schema name (tl code of a tensor
#: argument, or the Python value of a scalar one). Every ``tl`` code that epilogue fusion writes for an op outside
#: the hand-written table comes from here.
PRIMS: dict[str, Callable[[dict[str, Any]], str]] = {
    "add": lambda p: f"({_c(p['self'])} + {_alpha(_c(p['other']), p.get('alpha'))})",
    "sub": lambda p: f"({_c(p['self'])} - {_alpha(_c(p['other']), p.get('alpha'))})",
    "rsub": lambda p: f"({_c(p['other'])} - {_alpha(_c(p['self']), p.get('alpha'))})",
    "mul": lambda p: f"({_c(p['self'])} * {_c(p['other'])})",
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
    "full": lambda p: _f(p["fill_value"]),
    "scalar_tensor": lambda p: _f(p["s"]),
    "_to_copy": lambda p: p["self"],
    "clone": lambda p: p["self"],
    "alias": lambda p: p["self"],
}


def _resolve(name: str, method: bool) -> tuple[Callable, str]:
    """The torch function ``name`` (as written, ``F.hardswish`` / a method's ``lerp``) with a ``torch._refs``
    reference, and its display name; else DecompositionError."""
    import torch  # lazy: torch is needed only when an op outside the fusion table is met
    import torch._refs as refs

    def attr(root: Any, path: str) -> Any:
        for part in filter(None, path.split(".")):
            root = getattr(root, part, None)
        return root

    if method:
        if getattr(refs, name, None) is None or getattr(torch.Tensor, name, None) is None:
            raise DecompositionError(f".{name}() has no elementwise reference in torch._refs")
        return (lambda *a, **k: getattr(a[0], name)(*a[1:], **k)), f".{name}()"
    for prefix, mod in MODULES:
        if name.startswith(prefix) and "." not in name[len(prefix):]:
            short = name[len(prefix):]
            fn = attr(torch, f"{mod}.{short}")
            # torch.nn.functional and torch.special hold tensor math only; of torch's own namespace (torch.save,
            # torch.set_*, ...) only what torch._refs has a reference for
            if fn is None or not callable(fn) or (not mod and attr(refs, short) is None):
                raise DecompositionError(f"{name}() is not an op with a reference implementation in torch._refs")
            return fn, f"{name}()"
    raise DecompositionError(f"{name}() is not a function of torch, torch.nn.functional or torch.special")


@lru_cache(maxsize=256)
def _graph(name: str, method: bool, kinds: tuple[str, ...], consts: tuple, kw_names: tuple[str, ...]):
    """The decomposed FX graph of the call: ``kinds[i]`` is 'tensor' for a traced input, 'const' for the literal
    at the same place of ``consts``; the last ``len(kw_names)`` arguments are keywords."""
    import torch  # lazy, as in _resolve
    from torch._decomp import core_aten_decompositions, decomposition_table
    from torch.fx.experimental.proxy_tensor import make_fx

    fn, shown = _resolve(name, method)
    table = dict(core_aten_decompositions())
    table.update({op: f for op, f in decomposition_table.items()
                  if getattr(getattr(op, "overloadpacket", None), "__name__", None) not in PRIMS})
    n_tensors = kinds.count("tensor")

    def call(*tensors):
        it = iter(tensors)
        vals = [next(it) if k == "tensor" else c for k, c in zip(kinds, consts)]
        npos = len(vals) - len(kw_names)
        return fn(*vals[:npos], **dict(zip(kw_names, vals[npos:])))

    samples = [torch.randn(2, 4) for _ in range(n_tensors)]
    try:
        gm = make_fx(call, decomposition_table=table)(*samples)
    except Exception as exc:  # noqa: BLE001 - torch's error for a call it rejects, said as the reason
        raise DecompositionError(f"{shown} could not be traced on sample tensors: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    return gm.graph, shown


def lower_call(name: str, method: bool, args: list[tuple[str, Any]], kw_names: tuple[str, ...],
               bind: Callable[[str, str], str]) -> str:
    """tl code of the elementwise call ``name(*args)``: each arg is ('tensor', its tl code) or ('const', a Python
    literal); the last ``len(kw_names)`` are keywords. ``bind(code, base)`` binds an intermediate that more than one
    node reads to a fresh variable (and returns its name), so it is computed once."""
    kinds = tuple(k for k, _ in args)
    consts = tuple(None if k == "tensor" else v for k, v in args)
    try:
        graph, shown = _graph(name, method, kinds, consts, kw_names)
    except TypeError as exc:  # an unhashable literal (a list): not an elementwise call's argument
        raise DecompositionError(f"{name}(): {exc}") from None
    inputs = iter(code for k, code in args if k == "tensor")
    env: dict[Any, Any] = {}
    out = None
    for node in graph.nodes:
        if node.op == "placeholder":
            env[node] = next(inputs)
        elif node.op == "output":
            res = node.args[0]
            res = res[0] if isinstance(res, (list, tuple)) and len(res) == 1 else res
            if not hasattr(res, "op"):
                raise DecompositionError(f"{shown} does not return one tensor")
            out = env[res]
        elif node.op == "call_function":
            packet = getattr(getattr(node.target, "overloadpacket", None), "__name__", str(node.target))
            if packet not in PRIMS:
                raise DecompositionError(f"{shown} decomposes to aten.{packet}, which has no tl lowering (not "
                                         "elementwise, or not in the primitive table)")
            params, from_graph = _by_schema(node, env)
            if not any(isinstance(params[k], str) for k in from_graph):
                env[node] = _fold(node, params)  # constants only: torch computes it now (a Python scalar)
                continue
            for k in from_graph:  # a constant of the graph beside a tile value: as tl source
                if not isinstance(params[k], str):
                    params[k] = str(params[k]) if isinstance(params[k], bool) else _f(params[k])
            code = PRIMS[packet](params)
            # a value read by more than one node is computed once; one read once stays inline
            env[node] = code if code.isidentifier() or _is_number(code) or len(node.users) <= 1 else bind(code, "d")
        else:
            raise DecompositionError(f"{shown}: graph node {node.op} {node.target}")
    if out is None:
        raise DecompositionError(f"{shown} has no output")
    return out


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


def _by_schema(node: Any, env: dict) -> tuple[dict[str, Any], set[str]]:
    """The node's arguments by their schema names (tl code or a folded Python scalar for a graph value, the literal
    otherwise), and the names whose value came from the graph."""
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
        out[a.name] = v
    return out, from_graph
