"""What the fusion rewrites that generate a kernel share: reading ``forward`` and writing the result back.

Owns the pieces :mod:`xeforge.rewrite.fusion.rewrites`, :mod:`xeforge.rewrite.fusion.norm` and
:mod:`xeforge.rewrite.fusion.combine` all build on: the fill of an empty partial slot per reduction
(:data:`SPLIT_IDENTITY`); recognising a reduction of a ``forward`` name over the last dim (:func:`_reduction`)
and a ``.to(dtype)`` (:func:`_is_to_dtype`) in ``forward``; turning a value ``forward`` reads into a kernel operand
(:func:`_operand_resolver`); the ``tl`` lines of a masked row reduction (:func:`row_reduce_lines`); the last
assignment of a name in ``forward`` (:func:`_last_assign`); and the edit of ``forward``'s result plus the
generated ``@triton.jit`` function (:func:`result_lines`, :func:`with_generated_kernel`). It imports none of the
three, so each of them imports it at module level.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Callable

from xeforge.kernel_model import LaunchSite, literal
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.context import Ctx
from xeforge.rewrite.cst_tools import Edits, apply_edits, statements
from xeforge.analysis.forward_env import Val
from xeforge.rewrite.tiling.edit import add_module_function
from xeforge.rewrite.fusion.tl_ops import Operand, reduction_call

#: reductions whose per-tile partials combine with the same torch op, and the partials' fill for empty slots
SPLIT_IDENTITY = {"sum": "0.0", "max": 'float("-inf")', "amax": 'float("-inf")', "min": 'float("inf")',
                  "amin": 'float("inf")', "logsumexp": 'float("-inf")'}
#: the reductions a split computes per tile and combines: those whose partials combine with the same op, and a mean
#: (each tile's partial scaled so that the mean of the partials is the row's)
SPLIT_KINDS = frozenset({*SPLIT_IDENTITY, "mean"})


def _reduction(node: ast.AST, cur: str) -> tuple[str, bool] | None:
    """(kind, keepdim) for ``torch.sum(cur, dim=1, keepdim=True)``, ``torch.max(cur, dim=-1)[0]`` ... of ``cur``."""
    red = reduction_call(node)
    if red is None or not (isinstance(red[2], ast.Name) and red[2].id == cur):
        return None
    return red[0], red[1]


def _is_to_dtype(node: ast.AST, cur: str) -> ast.AST | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to" \
            and isinstance(node.func.value, ast.Name) and node.func.value.id == cur and len(node.args) == 1 \
            and not node.keywords:
        return node.args[0]
    return None


def _symbolic(problem: Any, shapes: dict[str, tuple]) -> tuple | None:
    """Concrete shapes per variant -> one shape in the spec's dim names: each axis a dim whose size it has at every
    variant (or that size, where it is the same everywhere and no dim has it); None where no dim fits an axis."""
    axes: list[set] | None = None
    for vname, shape in shapes.items():
        dims = problem.spec.variants[vname].dims
        here = [{d for d, val in dims.items() if val == size} or {size} for size in shape]
        if axes is not None and len(axes) != len(here):
            return None
        axes = here if axes is None else [a & h for a, h in zip(axes, here)]
    if not axes or any(not a for a in axes):
        return None
    # several names left on an axis have its size at every variant: any of them sizes it (compare with _same_sizes)
    return tuple(sorted(a, key=str)[0] for a in axes)


def _traced_args(problem: Any, kernel: str, param: str) -> dict[str, Any] | None:
    """Variant -> the argument (a trace's ``Arg``) the one launch of ``kernel`` passes for ``param`` in the starting
    kernel's traces (a kernel copied for an inlined launch, ``K_fused``, is its original's); None where a trace or
    that one launch is missing (one trace per problem, cached)."""
    from xeforge.analysis.observe import traces  # lazy: the trace worker is only asked for what the code hides

    kernels = {kernel, re.sub(r"_fused(_\d+)?$", "", kernel)}
    out = {}
    for vname, t in traces(problem).items():
        got = [] if isinstance(t, str) else [la.args[param] for la in t.launches
                                             if la.kernel in kernels and param in la.args]
        if len(got) != 1:
            return None
        out[vname] = got[0]
    return out


def traced_shape(problem: Any, param: str | None = None, launch: tuple[str, str] | None = None):
    """What the static reading of forward and ``__init__`` does not show, as the traces of the starting kernel saw
    it (shapes are the Model's, which no rewrite changes), in the spec's dim names: the shape of a Model parameter or
    buffer (``param``: ``self.bias2`` made by ``nn.Parameter(torch.randn(n) * 0.1)``), or of the tensor a launch
    passes for a kernel parameter (``launch``: (kernel, parameter), a buffer a wrapper sized from shapes it read).
    None where a trace is missing."""
    from xeforge.analysis.observe import traces  # lazy, as in _traced_args

    shapes: dict[str, tuple] = {}
    if launch is not None and param is None:
        args = _traced_args(problem, *launch)
        if args is None:
            return None
        shapes = {v: a.shape for v, a in args.items()}
    else:
        for vname, t in traces(problem).items():
            if isinstance(t, str):
                return None
            if param is not None and param.removeprefix("self.") in t.params:
                shapes[vname] = t.params[param.removeprefix("self.")].shape
    return _symbolic(problem, shapes) if shapes else None


def traced_scalar(problem: Any, kernel: str, param: str) -> list[tuple[str, int]]:
    """[(variant, value)] of the integer a launch of ``kernel`` passes for ``param`` in the starting kernel's traces
    (a row width the wrapper read from a weight's shape, say); empty where a trace or that launch is missing."""
    args = _traced_args(problem, kernel, param) or {}
    if any(not isinstance(a.value, int) or isinstance(a.value, bool) for a in args.values()):
        return []
    return [(v, a.value) for v, a in args.items()]


def _same_sizes(problem: Any, a: tuple, b: tuple) -> bool:
    """Two shapes in dim names that have the same sizes at every variant of the spec (a square layer's input and
    output: ``(M, K)`` and ``(M, N)`` with K = N wherever it runs)."""
    variants = getattr(getattr(problem, "spec", None), "variants", {}) or {}
    if len(a) != len(b) or not variants:
        return False
    for v in variants.values():
        size = lambda d: v.dims.get(d) if isinstance(d, str) else d  # noqa: E731
        if any(size(x) is None or size(x) != size(y) for x, y in zip(a, b)):
            return False
    return True


def _operand_resolver(c: Ctx, site: LaunchSite, yv: Val, fresh, taken_srcs: dict[str, Operand], state: dict):
    col_dim = yv.shape[-1] if yv.shape else None

    def resolve(node: ast.expr) -> Operand | None:
        line = state["line"]  # the forward statement being translated
        v = c.env.eval(node, line)
        src = c.env.canonical(node, line)
        if src is None and isinstance(node, ast.Name):
            # a local scalar defined before the launch and not changed since
            if v.kind == "scalar" and c.env.lookup(node.id, site.line) is v:
                src = node.id
        if src is None:
            return None
        if src in taken_srcs:
            return taken_srcs[src]
        base = src.removeprefix("self.").replace(".", "_")
        if v.is_tensor and v.shape is None and src.startswith("self."):
            v = Val("tensor", traced_shape(c.problem, param=src), contiguous=v.contiguous, src=v.src)
        if v.kind == "scalar":
            op = Operand("scalar", src, fresh(base))
        elif v.is_tensor and v.shape is not None:
            shape = list(v.shape)
            while shape and shape[0] == 1:
                shape.pop(0)
            if not shape:
                op = Operand("element", src, fresh(base + "_ptr"))
            elif len(shape) == 1 and col_dim is not None and (shape[0] == col_dim or
                                                               _same_sizes(c.problem, (shape[0],), (col_dim,))):
                op = Operand("column", src, fresh(base + "_ptr"))
            elif len(shape) == 2 and yv.shape is not None and None not in shape and \
                    (tuple(shape) == tuple(yv.shape) or _same_sizes(c.problem, tuple(shape), tuple(yv.shape))):
                op = Operand("tile", src, fresh(base + "_ptr"), (fresh(f"stride_{base}_m"), fresh(f"stride_{base}_n")))
            else:
                return None
        else:
            return None
        taken_srcs[src] = op
        return op

    return resolve


def row_reduce_lines(kind: str, value: str, mask: str, target: str, fresh: Callable[[str], str]) -> list[str]:
    """``target`` = the ``kind`` reduction of the 2D ``value`` over axis 1, the columns outside ``mask`` left out
    (a mean is the sum here: the caller divides)."""
    if kind in ("sum", "mean"):
        return [f"{target} = tl.sum(tl.where({mask}, {value}, 0.0), axis=1)"]
    if kind in ("max", "amax"):
        return [f'{target} = tl.max(tl.where({mask}, {value}, float("-inf")), axis=1)']
    if kind in ("min", "amin"):
        return [f'{target} = tl.min(tl.where({mask}, {value}, float("inf")), axis=1)']
    mx = fresh(f"{target}_max")  # logsumexp
    return [f'{mx} = tl.max(tl.where({mask}, {value}, float("-inf")), axis=1)',
            f"{target} = {mx} + tl.log(tl.sum(tl.where({mask}, tl.exp({value} - {mx}[:, None]), 0.0), axis=1))"]


def _last_assign(c: Ctx, name: str, before: int) -> ast.Assign | None:
    """The last ``name = ...`` statement of forward before line ``before``."""
    found = None
    for s in c.fwd:
        if s.lineno >= before:
            break
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) \
                and s.targets[0].id == name:
            found = s
    return found


def result_lines(edits: Edits, at: int, lines: list[str], out: str, cur: str, ret: ast.Return | None) -> None:
    """The statement on line ``at`` becomes ``lines``, which compute ``out``, the value forward had in ``cur``:
    forward returns ``out`` where ``ret`` returned ``cur``, otherwise ``cur = out`` follows the lines."""
    if ret is not None:
        edits.replace[at] = statements("\n".join(lines))
        edits.replace[ret.lineno] = statements(f"return {out}")
    else:
        edits.replace[at] = statements("\n".join([*lines, f"{cur} = {out}"]))


def with_generated_kernel(c: Ctx, edits: Edits, name: str, kernel_code: str) -> str:
    """``c``'s source with forward's ``edits`` applied and the generated ``@triton.jit`` function ``name`` added."""
    try:
        new = apply_edits(c.source, edits, c.parsed)
    except LookupError as exc:
        raise NotApplicable(f"could not rewrite forward: {exc}") from None
    return add_module_function(new, name, kernel_code)
