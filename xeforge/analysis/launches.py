"""What each launch passes: the value of every constexpr and launch option, where it comes from, which kernels ran.

Owns the answer every detector and tactic reads to "what is ``BM`` at this launch, and may a rewrite change it
here?", whatever the code style:

- :func:`block_params` — the constexprs of a kernel that are tile extents (``tl.arange`` sizes, block shapes, loop
  steps, sizes that scale a program id) or are named like one (``BLOCK_*``, ``TILE_*``, ``GROUP_SIZE_*``);
- :func:`bindings` — per constexpr and launch option of a launch site: its value and how it is given — a literal
  at the launch; an expression (a variable, a module constant, an attribute) whose value is read statically
  (module constant, a single literal assignment or tuple unpacking in the launching function) or observed in
  every traced variant (the same value at every shape, so a literal may replace it); the ``@triton.autotune``
  configs; the kernel's default; or missing — with the reason when the value is not one constant;
- :func:`live_kernels` — the kernels the traces saw run (a file may hold backward kernels forward never launches);
- :func:`autotune_configs` — an autotuned kernel's configs, literal in the code or as the traces saw them.

Observed values come from the traces of :mod:`xeforge.analysis.observe`, which :func:`remember` s each one per
source text: a rewrite's own re-parse of the same text finds them again without the problem in hand. Pure
reading; never runs user code.
"""

from __future__ import annotations

import ast
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from xeforge.kernel_model import (LAUNCH_OPTIONS, JitFunction, KernelModel, LaunchSite, axis_blocks, dotted_name,
                                  is_literal, literal, parse_kernel, parse_python, segment_of)

#: names that say "block size" even where the body does not show it (a group size, a tile count)
BLOCK_HINTS = ("BLOCK", "TILE", "GROUP_SIZE")

_SEEN: "OrderedDict[str, dict]" = OrderedDict()  # source digest -> {"ran": set, "values": {(kernel, line): ...}}
_MAX_SOURCES = 256


@dataclass(frozen=True)
class Binding:
    """One constexpr or launch option at one launch."""

    name: str
    value: Any  # the constant value, or None where it is not one constant
    how: str  # literal | expression | autotune | default | positional | missing
    expr: str | None = None  # the host expression the launch passes (literal or not)
    why: str = ""  # why ``value`` is None, or where it was read
    traced: bool = False  # the value was read from the traces, not the code (the host computes it)

    @property
    def constant(self) -> bool:
        """A single value at every shape, given at the launch: a rewrite may write another literal there."""
        return self.how in ("literal", "expression") and self.value is not None


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()


def remember(source: str, trace: Any) -> None:
    """Keep what ``trace`` (one variant) saw of ``source``: which kernels ran, each launch's constexpr values."""
    key = _digest(source)
    entry = _SEEN.setdefault(key, {"ran": set(), "values": {}, "variants": set()})
    _SEEN.move_to_end(key)
    while len(_SEEN) > _MAX_SOURCES:
        _SEEN.popitem(last=False)
    entry["variants"].add(trace.variant)
    for la in trace.launches:
        entry["ran"].add(la.kernel)
        if la.autotune and la.autotune.get("configs"):
            entry.setdefault("autotune", {})[la.kernel] = [
                {**c.get("kwargs", {}), **{k: c[k] for k in ("num_warps", "num_stages") if c.get(k) is not None}}
                for c in la.autotune["configs"] if c]
        line = la.site.line if la.site is not None else 0
        values = entry["values"].setdefault((la.kernel, line), {})
        for name in list(la.constexprs) + list(la.options):
            arg = la.args.get(name)
            v = arg.value if arg is not None else la.options.get(name)
            values.setdefault(name, {})[trace.variant] = v


def forget(source: str) -> None:
    _SEEN.pop(_digest(source), None)


def carry_seen(old: str, new: str) -> None:
    """What the traces saw of ``old``, kept for ``new``: a rewrite that changes kernel bodies only (the same
    launches in the same order; their lines may move) runs the same kernels with the same values, so which kernels
    forward launches stays known."""
    entry = _seen(old)
    if not entry or new == old:
        return
    a, b = parse_kernel(old).launches, parse_kernel(new).launches
    if [s.kernel for s in a] != [s.kernel for s in b]:
        return
    moved = {(s.kernel, s.line): (t.kernel, t.line) for s, t in zip(a, b)}
    _SEEN[_digest(new)] = {**entry, "values": {moved.get(k, k): v for k, v in entry["values"].items()}}
    while len(_SEEN) > _MAX_SOURCES:
        _SEEN.popitem(last=False)


def _seen(source: str) -> dict | None:
    return _SEEN.get(_digest(source))


def live_kernels(model: KernelModel) -> set[str] | None:
    """Kernels the traces of this source saw launched; None when it has not been traced."""
    entry = _seen(model.source)
    return set(entry["ran"]) if entry and entry["variants"] else None


def live_launches(model: KernelModel) -> list[LaunchSite]:
    """The launch sites of kernels that really run (every site when the source has not been traced)."""
    ran = live_kernels(model)
    return [s for s in model.launches if ran is None or s.kernel in ran]


def observed(model: KernelModel, site: LaunchSite) -> dict[str, dict[str, Any]]:
    """name -> {variant: value} the traces saw at ``site`` (matched by kernel and line, else the kernel's only
    site)."""
    entry = _seen(model.source)
    if not entry:
        return {}
    values = entry["values"]
    if (site.kernel, site.line) in values:
        return values[(site.kernel, site.line)]
    mine = [k for k in values if k[0] == site.kernel]
    sites = [s for s in model.launches if s.kernel == site.kernel]
    return values[mine[0]] if len(mine) == 1 and len(sites) == 1 else {}


def autotune_configs(model: KernelModel, kernel: str) -> list[dict[str, Any]]:
    """The ``@triton.autotune`` configs of ``kernel`` (constexprs and options in one dict each): the literal list
    in the code, else the list the traces saw (configs built by a comprehension or a function)."""
    fn = model.functions[kernel]
    if fn.autotune_configs:
        return [dict(c) for c in fn.autotune_configs]
    entry = _seen(model.source) or {}
    return [dict(c) for c in entry.get("autotune", {}).get(kernel, [])]


# ------------------------------------------------------------------------------------------------ block params
def block_params(fn: JitFunction) -> set[str]:
    """Constexpr parameters used as tile extents, or named like a block size."""
    consts = set(fn.constexpr_params)
    out = {c for c in consts if any(h in c.upper() for h in BLOCK_HINTS)}
    for names in axis_blocks(fn).values():
        out |= names & consts
    for node in ast.walk(fn.node):
        if not isinstance(node, ast.Call):
            continue
        last = (dotted_name(node.func) or "").rsplit(".", 1)[-1]
        used: list[ast.AST] = []
        if last == "arange" and len(node.args) == 2:
            used = [node.args[1]]
        elif last in ("zeros", "full", "make_block_ptr") and node.args:
            shape = node.args[0] if last != "make_block_ptr" else next(
                (k.value for k in node.keywords if k.arg == "block_shape"), None)
            used = list(shape.elts) if isinstance(shape, (ast.Tuple, ast.List)) else []
        elif last in ("range", "static_range") and len(node.args) >= 3:
            used = [node.args[2]]
        for u in used:
            out |= {n.id for n in ast.walk(u) if isinstance(n, ast.Name) and n.id in consts}
    return out


# ------------------------------------------------------------------------------------------------ bindings
def _enclosing(model: KernelModel, site: LaunchSite) -> ast.FunctionDef | None:
    best = None
    for node in ast.walk(model.tree):
        if isinstance(node, ast.FunctionDef) and node.name == site.function and \
                node.lineno <= site.line <= (node.end_lineno or node.lineno):
            if best is None or node.lineno > best.lineno:
                best = node
    return best


def _assigned_values(body: list[ast.stmt] | ast.AST, name: str, before: int | None = None) -> list[Any]:
    """Every value assigned to ``name`` (literal or ``_NOT_LITERAL``), tuple unpacking of a tuple literal included."""
    out: list[Any] = []
    nodes = ast.walk(body) if isinstance(body, ast.AST) else (n for st in body for n in ast.walk(st))
    for node in nodes:
        if before is not None and getattr(node, "lineno", 0) >= before:
            continue
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id == name:
                    out.append(literal(node.value))
                elif isinstance(t, (ast.Tuple, ast.List)):
                    for i, el in enumerate(t.elts):
                        if isinstance(el, ast.Name) and el.id == name:
                            src = node.value
                            ok = isinstance(src, (ast.Tuple, ast.List)) and len(src.elts) == len(t.elts)
                            out.append(literal(src.elts[i]) if ok else literal(None))
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name) \
                and node.target.id == name:
            out.append(literal(node.value) if isinstance(node, ast.AnnAssign) else literal(None))
        elif isinstance(node, (ast.For, ast.With)) and name in {n.id for n in ast.walk(
                node.target if isinstance(node, ast.For) else ast.Tuple([i.optional_vars for i in node.items
                                                                        if i.optional_vars], ast.Load()))
                if isinstance(n, ast.Name)}:
            out.append(literal(None))
    return out


def static_value(model: KernelModel, site: LaunchSite, node: ast.AST) -> Any:
    """The value of a host expression at ``site`` when the code alone fixes it: a literal, a name assigned once
    from a literal in the launching function, or a module constant assigned once. Else ``_NOT_LITERAL``."""
    val = literal(node)
    if is_literal(val) or not isinstance(node, ast.Name):
        return val
    fn = _enclosing(model, site)
    if fn is not None:
        params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        if node.id in params:
            return literal(None)
        local = _assigned_values(fn, node.id, before=site.line)
        if local:
            return local[0] if len(local) == 1 else literal(None)
    module = [st for st in model.tree.body if not isinstance(st, (ast.FunctionDef, ast.ClassDef))]
    found = _assigned_values(module, node.id)
    return found[0] if len(found) == 1 else literal(None)


def unpacked_dict(site: LaunchSite) -> str | None:
    """The variable a launch unpacks as its only ``**kwargs`` (``kernel[grid](..., **cfg)``), else None."""
    spread = [kw.value for kw in site.node.keywords if kw.arg is None]
    return spread[0].id if len(spread) == 1 and isinstance(spread[0], ast.Name) else None


def _kwarg(site: LaunchSite, name: str) -> ast.keyword | None:
    return next((k for k in site.node.keywords if k.arg == name), None)


def bindings(model: KernelModel, site: LaunchSite) -> dict[str, Binding]:
    """Every constexpr of the kernel and every launch option given at ``site``, with value and provenance."""
    fn = model.functions[site.kernel]
    seen = observed(model, site)
    tuned = {k for cfg in autotune_configs(model, site.kernel) for k in cfg}
    defaults = dict(zip(reversed(fn.params), reversed(fn.node.args.defaults)))
    out: dict[str, Binding] = {}
    spread = unpacked_dict(site)
    for name in list(fn.constexpr_params) + [o for o in LAUNCH_OPTIONS if _kwarg(site, o) is not None or o in tuned]:
        kw = _kwarg(site, name)
        expr = None
        if kw is None and spread is not None and name not in tuned and name not in defaults and \
                fn.params.index(name) >= len(site.node.args):
            # ``**cfg``: the dict gives it (the traces say which value at each shape)
            expr = f'{spread}["{name}"]'
            kw = ast.keyword(arg=name, value=parse_python(expr, mode="eval").body)
        if kw is None:
            if name in tuned or (fn.is_autotuned and not tuned and name in fn.constexpr_params):
                out[name] = Binding(name, None, "autotune", None, f"{name} comes from the @triton.autotune configs "
                                    f"of {site.kernel}")
            elif name in defaults:
                out[name] = Binding(name, literal(defaults[name]) if is_literal(literal(defaults[name])) else None,
                                    "default", None, f"{name} takes the kernel's default")
            elif name in fn.constexpr_params and fn.params.index(name) < len(site.node.args):
                i = fn.params.index(name)
                expr = segment_of(model.source, site.node.args[i]) or ast.unparse(site.node.args[i])
                out[name] = Binding(name, None, "positional", expr,
                                    f"{name} is passed positionally at line {site.line} (argument {i + 1}: {expr}); "
                                    f"a rewrite edits keyword arguments: pass it as {name}={expr}")
            elif name in fn.constexpr_params:
                out[name] = Binding(name, None, "missing", None, f"{name} is not passed at line {site.line}")
            continue
        expr = expr or segment_of(model.source, kw.value) or ast.unparse(kw.value)
        val = static_value(model, site, kw.value)
        if is_literal(val) and isinstance(kw.value, ast.Constant):
            out[name] = Binding(name, val, "literal", expr)
            continue
        if is_literal(val):
            out[name] = Binding(name, val, "expression", expr, f"{expr} = {val!r} in the code")
            continue
        per_variant = seen.get(name, {})
        values = set(map(repr, per_variant.values()))
        if len(values) == 1:
            v = next(iter(per_variant.values()))
            out[name] = Binding(name, v, "expression", expr,
                                f"{expr} = {v!r} in every traced variant ({', '.join(sorted(per_variant))})",
                                traced=True)
        elif per_variant:
            shown = ", ".join(f"{v!r} at {k}" for k, v in sorted(per_variant.items()))
            out[name] = Binding(name, None, "expression", expr, f"{name}={expr} changes with the shape ({shown})")
        else:
            out[name] = Binding(name, None, "expression", expr,
                                f"{name}={expr} at line {site.line} has no value known from the code or a trace")
    return out


def launch_options(model: KernelModel, site: LaunchSite) -> dict[str, Any]:
    """The launch options (``num_warps``, ``num_stages``...) ``site`` passes with one constant value: literal, or an
    expression the code or every trace fixes (``num_warps=NUM_WARPS``)."""
    return {k: b.value for k, b in bindings(model, site).items() if k in LAUNCH_OPTIONS and b.constant}


def expression_uses(model: KernelModel, site: LaunchSite, expr_node: ast.AST) -> list[int]:
    """Lines of the launching function, other than the launch and its grid, that read a name of ``expr_node``
    (a rewrite that replaces the expression at the launch would leave those behind)."""
    fn = _enclosing(model, site)
    names = {n.id for n in ast.walk(expr_node) if isinstance(n, ast.Name)}
    if fn is None or not names:
        return []
    launch_lines = set(range(site.node.lineno, (site.node.end_lineno or site.node.lineno) + 1))
    grid_lines: set[int] = set()
    sl = site.node.func.slice
    if isinstance(sl, ast.Name):
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == sl.id for t in node.targets):
                grid_lines |= set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    out = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id in names and isinstance(node.ctx, ast.Load) \
                and node.lineno not in launch_lines | grid_lines:
            out.append(node.lineno)
    return sorted(set(out))
