"""Launch configurations for the structural rewrites: drawn from the knowledge base, applied at the launch.

Owns: which block sizes of a launch a configuration may change (:func:`tunable_names`, with the reason for each
one left alone; values and provenance from :mod:`xeforge.analysis.launches`, so a block size passed as a variable,
module constant or attribute is tunable like a literal), reading its current configuration, drawing
KB-valid alternatives from the device's tuning space (seeds first, filtered by ``kb.check_config``), applying
a configuration to a launch site while keeping its grid consistent with the block sizes, and ranking the
configurations that earlier ``device_tuning`` trials measured (from the run folder's trial store), and refitting
``num_stages`` when the compiler reports a configuration over the device's shared memory; and the knowledge-base
family whose tuning space fits a kernel (:func:`kernel_family`, read by the launch-parameter search too).

A structural rewrite that only pays off with larger tiles (descriptors, persistence, swizzling) is proposed
as-is and, on a GPU, also with the top few KB configurations (:func:`xeforge.rewrite.autotune.with_configs`, which
also pins them on an autotuned kernel): the verifier times each one, so the stage can adopt the rewrite together
with the tiles it needs.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from xeforge.analysis.observe import traces
from xeforge.analysis.launches import (Binding, autotune_configs, bindings, block_params, expression_uses,
                                       launch_options, observed)
from xeforge.kernel_model import (JitFunction, KernelModel, LaunchSite, axis_blocks, literal, parse_kernel,
                                  parse_python, segment_of, source_offset)
from xeforge.rewrite.tiling import KernelAnalysis, NotApplicable
from xeforge.kb._base import DTYPE_BYTES, dtype_key
from xeforge.kb.kernel_facts import roles_by_use
from xeforge.kb.roles import first_int
from xeforge.rewrite.tiling.grid import (GridInfo, GridTranslator, _cdiv_args, enclosing_function, launch_grid,
                                         launched_kernels_gemm_first, single_launch)
from xeforge.rewrite.tiling.edit import LaunchEdit, edit_launch
from xeforge.rewrite.tiling.subtile import store_tiles
from xeforge.rewrite.tiling.host_rule import (HostMade, at_primary, heuristic_made, host_made, is_capped, overridable,
                                              override, override_heuristics)

#: launch options a configuration may carry besides constexprs
OPTION_KEYS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "grf_mode", "warp_size", "threads_per_warp")


def _pow2(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0


def grid_literals(model: KernelModel, site: LaunchSite) -> list[int]:
    """The literal block sizes in ``cdiv(x, <int>)`` calls of the grid used by ``site`` (inline or a variable)."""
    grid = launch_grid(model, site)
    out = []
    for el in (grid.elements if grid is not None else []):
        for call in ast.walk(el):
            cd = _cdiv_args(call)
            if cd is not None and isinstance(literal(cd[1]), int):
                out.append(literal(cd[1]))
    return out


def _axis_follows(model: KernelModel, site: LaunchSite, grid: Any, axis: int, name: str, bd: Binding) -> bool:
    """Grid axis ``axis`` is ``cdiv(..., <the block>)``: its literal, the expression the launch passes for it, or
    ``META[name]`` in a lambda grid."""
    if grid is None or axis >= len(grid.elements):
        return False
    cd = _cdiv_args(grid.elements[axis])
    if cd is None:
        return False
    div = cd[1]
    if grid.kind == "lambda" and isinstance(div, ast.Subscript) and isinstance(div.value, ast.Name) \
            and div.value.id == grid.meta and literal(div.slice) == name:
        return True
    if isinstance(div, ast.Constant):
        return div.value == bd.value
    src = (segment_of(model.source, div) or ast.unparse(div)).strip()
    return bd.expr is not None and src == bd.expr.strip()


def _axis_computed_from(model: KernelModel, site: LaunchSite, grid: Any, axis: int, made: HostMade) -> bool:
    """Grid axis ``axis`` is a local the launching function computes, through other locals, from the block's host
    value after the host last sets it: a split-KV wrapper's ``num_splits = triton.cdiv(kv_len, block_seq)``, grid
    ``(batch, heads, num_splits)``; a MoE wrapper's ``row_ids, block_expert = _align(offsets, cfg["BLOCK_M"], T)``,
    ``n_blocks = block_expert.numel()``, grid ``(n_blocks, cdiv(N, BLOCK_N))``. A value set where the block is made
    reaches the grid through them (gate 2 checks the coverage at every correctness shape)."""
    fn = enclosing_function(model, site)
    if fn is None or grid is None or axis >= len(grid.elements):
        return False
    sets = [n.lineno for n in ast.walk(fn) if isinstance(n, ast.stmt) and not isinstance(n, ast.FunctionDef)
            and n.lineno < site.line and _stores_name(n, made.var)]
    if not sets:
        return False
    last_set = max(sets)
    assigns: dict[str, list[ast.Assign]] = {}
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign) and n.lineno < site.line:
            for t in n.targets:
                for name in ast.walk(t):
                    if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Store):
                        assigns.setdefault(name.id, []).append(n)
    target = made.target.replace(" ", "")

    def reads_block(expr: ast.AST) -> bool:
        return any((isinstance(n, ast.Name) and n.id == made.var and made.var == made.target) or
                   ast.unparse(n).replace(" ", "").replace("'", '"') == target.replace("'", '"')
                   for n in ast.walk(expr) if isinstance(n, (ast.Name, ast.Subscript)))

    seen: set[str] = set()
    todo = [n.id for n in ast.walk(grid.elements[axis]) if isinstance(n, ast.Name)]
    while todo:
        name = todo.pop()
        if name in seen or name not in assigns:
            continue
        seen.add(name)
        if len(assigns[name]) != 1 or assigns[name][0].lineno <= last_set:
            continue  # set twice, or before the block takes its value: the new value may not reach it
        value = assigns[name][0].value
        if reads_block(value):
            return True
        todo += [n.id for n in ast.walk(value) if isinstance(n, ast.Name)]
    return False


def _stores_name(node: ast.stmt, var: str) -> bool:
    """``node`` itself (not a statement nested in it) assigns the name ``var``."""
    targets = node.targets if isinstance(node, ast.Assign) else \
        [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For)) else []
    return any(isinstance(n, ast.Name) and n.id == var for t in targets for n in ast.walk(t))


def product_blocks(model: KernelModel, site: LaunchSite, grid: GridInfo | None) -> tuple[dict[str, int], str]:
    """Block constexpr -> grid axis, for axes written as a product of ``cdiv(size, block)`` factors (the 1D tile
    grid ``cdiv(M, 32) * cdiv(N, 32)`` of a kernel that splits ``tl.program_id(0)`` into tile rows and columns),
    each factor matched to its block by :class:`GridTranslator` (the size is the bound of that block's tile axis);
    and, when a product cannot be read, why."""
    if grid is None or not any(isinstance(el, ast.BinOp) and isinstance(el.op, ast.Mult) for el in grid.elements):
        return {}, ""
    try:
        tr = GridTranslator(model, site, KernelAnalysis(model.functions[site.kernel]), grid)
        out: dict[str, int] = {}
        unread = []
        for ax, el in enumerate(grid.elements):
            if isinstance(el, ast.BinOp) and isinstance(el.op, ast.Mult):
                for node in (n for n in ast.walk(el) if _cdiv_args(n) is not None):
                    try:  # a size the kernel is not given too (``cdiv(total, 64)``): its block is the launch's
                        out[tr.cdiv_parts(node, need_param=False)[2]] = ax
                    except NotApplicable as exc:
                        unread.append(str(exc))
        return out, "; ".join(unread)
    except NotApplicable as exc:
        return {}, str(exc)
    except Exception as exc:  # noqa: BLE001 — code the symbolic reading does not cover: a reason, never a crash
        return {}, f"the grid could not be read ({type(exc).__name__}: {exc})"


def _product_text(source: str, model: KernelModel, site: LaunchSite, grid: GridInfo, el: ast.expr,
                  new: dict[str, Any]) -> str:
    """Grid element ``el`` (a product of cdiv factors) with the divisor of each factor whose block is in ``new``
    set to its new value; the rest of the text as written."""
    tr = GridTranslator(model, site, KernelAnalysis(model.functions[site.kernel]), grid)

    def offset(lineno: int, col: int) -> int:
        return source_offset(source, lineno, col)

    base = offset(el.lineno, el.col_offset)
    text = source[base:offset(el.end_lineno, el.end_col_offset)]
    repl = []
    for node in ast.walk(el):
        cd = _cdiv_args(node)
        if cd is None or (grid.kind == "lambda" and isinstance(cd[1], ast.Subscript)):
            continue
        param = tr.host_to_param.get((segment_of(source, cd[0]) or "").strip())
        try:  # a size the kernel is not given (``cdiv(total, 64)``) too: its block is the one the launch passes
            blk = tr.block_of(param, cd[1])
        except NotApplicable:
            blk = None
        if blk in new:
            div = cd[1]
            repl.append((offset(div.lineno, div.col_offset) - base, offset(div.end_lineno, div.end_col_offset) - base,
                         repr(new[blk])))
    for a, b, r in sorted(repl, reverse=True):
        text = text[:a] + r + text[b:]
    return text


def tunable_names(model: KernelModel, site: LaunchSite) -> tuple[list[str], dict[str, str]]:
    """Block-size constexprs at ``site`` a configuration may change, and why each other one is left alone.

    A block size is tunable when the launch gives it one constant value (a literal, or an expression such as a
    variable or module constant whose value the code or every trace fixes: a new literal replaces it at the
    launch) that is a power of two, and the grid axis it scales is ``cdiv(..., <that block>)`` — or a factor of
    a product axis ``cdiv(M, <BLOCK_M>) * cdiv(N, <BLOCK_N>)`` (:func:`product_blocks`).
    """
    fn = model.functions[site.kernel]
    axes = axis_blocks(fn)
    binds = bindings(model, site)
    grid = launch_grid(model, site)
    # grid literals that no program-id axis explains (e.g. a swizzled 1D grid cdiv(M, 128) * cdiv(N, 128)): a block
    # of that value may size the grid in a way the search cannot follow, so it is left alone
    unexplained = grid_literals(model, site) if grid is not None and grid.kind == "tuple" else []
    for ax, names in axes.items():
        for n in names:
            if n in binds and binds[n].value in unexplained:
                unexplained.remove(binds[n].value)
                break
    products, unread = product_blocks(model, site, grid)
    for n in products:
        if n in binds and binds[n].value in unexplained:
            unexplained.remove(binds[n].value)
    ok, why = [], {}
    blocks = block_params(fn)
    made = host_made(model, site, binds)
    heur = heuristic_made(model, site)
    for name in fn.constexpr_params:
        if name in heur and name in blocks:
            # the kernel's @triton.heuristics makes it (over anything the launch passes): a new value goes there,
            # and only a grid that reads it from the meta-parameters follows it
            reason = overridable(fn, name, heur[name], _meta_reads(grid, name))
            if reason is None:
                ok.append(name)
            else:
                why[name] = reason
            continue
        if name not in blocks or name not in binds:
            continue
        bd = binds[name]
        if name in made and _set_where_made(model, site, bd):
            # the host computes it (a heuristic, a table, next_power_of_2): a new value goes where it is made
            coupled = [ax for ax, names in axes.items() if name in names]
            follows = name in products or bool(coupled and (
                _axis_follows(model, site, grid, coupled[0], name, bd) or
                _axis_computed_from(model, site, grid, coupled[0], made[name]))) or _meta_reads(grid, name)
            reason = overridable(fn, name, made[name], follows)
            if reason is None:
                ok.append(name)
            else:
                why[name] = reason
            continue
        if not bd.constant:
            why[name] = bd.why
            continue
        if not _pow2(bd.value):
            why[name] = f"{name}={bd.value!r} is not a power of two"
            continue
        if bd.how == "expression":
            kw = next(k for k in site.node.keywords if k.arg == name)
            others = expression_uses(model, site, kw.value)
            if others:
                why[name] = (f"{name}={bd.expr} is also read at line {', '.join(map(str, others))} of "
                             f"{site.function} (a new value at the launch would leave it behind)")
                continue
        coupled = [ax for ax, names in axes.items() if name in names]
        if not coupled and name in products:
            ok.append(name)  # a factor of a product grid axis: apply_config rewrites that factor
            continue
        if not coupled and bd.value in unexplained:
            why[name] = (f"{name}={bd.value} may size the grid (cdiv(..., {bd.value}) at the launch) through an index "
                         "computation the search cannot follow" + (f" ({unread})" if unread else ""))
            continue
        if coupled and not _axis_follows(model, site, grid, coupled[0], name, bd):
            why[name] = f"{name} sizes grid axis {coupled[0]}, whose size at line {site.line} is not cdiv(..., {name})"
            continue
        ok.append(name)
    return ok, why


def _meta_reads(grid: Any, name: str) -> bool:
    """A lambda grid reads ``name`` from its meta-parameters (``cdiv(N, META["BLOCK_N"])``): it follows any value."""
    return grid is not None and grid.kind == "lambda" and any(
        isinstance(n, ast.Subscript) and literal(n.slice) == name for el in grid.elements for n in ast.walk(el))


def _set_where_made(model: KernelModel, site: LaunchSite, bd: Binding) -> bool:
    """A host-made value is set where it is made, not at the launch, when it changes with the shape or the
    launching function reads it elsewhere too (a new value at the launch would leave those readers behind)."""
    if not bd.constant or bd.traced:  # computed on the host (a heuristic that gave one value at these shapes)
        return True
    kw = next((k for k in site.node.keywords if k.arg == bd.name), None)
    return kw is None or bool(expression_uses(model, site, kw.value))


def values_at(model: KernelModel, site: LaunchSite) -> dict[str, Any]:
    """Each binding's value at ``site``: its one constant value, or for one the host makes, the value at the
    primary timed shape (the one a search starts from)."""
    binds = bindings(model, site)
    made = host_made(model, site, binds)
    out = {}
    for n, b in binds.items():
        if n in made and _set_where_made(model, site, b):
            out[n] = made[n].value
        elif b.value is not None:
            out[n] = b.value
    out.update({n: h.value for n, h in heuristic_made(model, site).items()})  # over what the launch passes
    return out


def tunable(model: KernelModel, site: LaunchSite) -> list[str]:
    return tunable_names(model, site)[0]


def kernel_family(model: KernelModel, fn: JitFunction, declared: str | None = None) -> str:
    """The knowledge-base family whose tuning space fits ``fn``: the spec's kind, unless the kernel cannot be one.

    A matrix product written without ``tl.dot`` (a decode GEMV: each program reduces its outputs' rows over K
    with ``tl.sum``) is ``gemv``: GEMM tiles (64-256 outputs a program) starve it of programs. Any other kernel
    without ``tl.dot`` in a gemm/attention problem (an epilogue kernel) is classified by its body.
    """
    calls = [c.name for c in model.calls if c.function == fn.name]
    dots = sum(1 for c in calls if c.endswith(".dot"))
    reduces = any(c.rsplit(".", 1)[-1] in {"sum", "max", "min", "reduce", "argmax"} for c in calls)
    if declared in {"gemm", "attention"} and not dots:
        return "gemv" if declared == "gemm" and reduces else ("reduction" if reduces else "elementwise")
    if declared in {"gemm", "gemv", "reduction", "elementwise", "attention"}:
        return declared
    if dots >= 2 and any(c.endswith(".exp") or c.endswith(".exp2") for c in calls):
        return "attention"
    if dots:
        return "gemm"
    if reduces:
        return "reduction"
    return "elementwise"


def family(model: KernelModel, kernel: str, declared: str | None) -> str:
    return kernel_family(model, model.functions[kernel], declared)


def option_keys(fn: JitFunction) -> tuple[str, ...]:
    """The launch options a configuration may set for ``fn``: ``num_stages`` only where it has a loop to pipeline
    (for a one-pass row kernel another ``num_stages`` is the same kernel, timed again for nothing)."""
    loops = any(isinstance(n, (ast.For, ast.While)) for n in ast.walk(fn.node))
    return OPTION_KEYS if loops else tuple(k for k in OPTION_KEYS if k != "num_stages")


def traced_options(model: KernelModel, site: LaunchSite, variant: str | None = None) -> dict[str, Any]:
    """The launch options the traces saw at ``site`` at ``variant`` (default: the primary timed shape, as
    :func:`~xeforge.rewrite.tiling.host_rule.at_primary` picks it), including those the host computes
    (``num_warps=_num_warps(BLOCK)``), which :func:`current_config` cannot name: a configuration that sets what the
    heuristic already gives is no change."""
    seen = {k: v for k, v in observed(model, site).items() if k in OPTION_KEYS}
    got = {k: at_primary(vals) if variant is None else vals.get(variant) for k, vals in seen.items()}
    return {k: v for k, v in got.items() if v is not None}


def no_change(effective: dict[str, Any], cfg: dict[str, Any]) -> bool:
    """``cfg`` sets only what the launch already runs with (``effective``: its configuration with the traced
    options)."""
    return all(effective.get(k) == v for k, v in cfg.items())


def current_config(model: KernelModel, site: LaunchSite) -> dict[str, Any]:
    """The tunable block sizes' values and the launch options at ``site`` (for values the host computes per shape,
    the value at the primary timed shape)."""
    values = values_at(model, site)
    options = {k: v for k, v in values.items() if k in OPTION_KEYS}
    return {**{n: values[n] for n in tunable(model, site)}, **launch_options(model, site), **options}


def kb_configs(ctx: Any, source: str, kernel: str, limit: int, include_current: bool = False,
               rows: int | None = None) -> list[dict[str, Any]]:
    """Up to ``limit`` KB-valid configurations for ``kernel`` (seeds first), keyed by its own names.

    Empty when no knowledge base, device entry or tuning space applies. ``include_current``: the launch's own
    configuration may be among them (otherwise it is skipped). ``rows``: those of the device's space for shapes of at
    most this many rows (``max_rows``, decode-sized M), and none where the device has no such space.
    """
    if ctx is None or getattr(ctx, "kb", None) is None or not getattr(ctx, "device_id", None):
        return []
    observe(ctx, source)
    model = parse_kernel(source)
    site = single_launch(model, kernel)
    fn = model.functions[kernel]
    names = tunable(model, site)
    current = current_config(model, site)
    if fn.is_autotuned:  # the space over the constexprs its own configs set, around its first config
        own = autotune_configs(model, kernel)
        blocks = block_params(fn)
        names = sorted({k for c in own for k in c if k in blocks})
        current = {k: v for k, v in (own[0] if own else {}).items() if k in names or k in OPTION_KEYS}
    declared = getattr(getattr(getattr(ctx, "problem", None), "spec", None), "kind", None)
    try:
        space = ctx.kb.space(ctx.device_id, family(model, kernel, declared), ctx.triton, rows=rows)
    except Exception:  # no space for this device/family: the KB raises its own error type; nothing to draw
        return []
    if rows is not None and space.max_rows is None:
        return []
    fixed = {k: b.value for k, b in bindings(model, site).items() if k not in names and b.value is not None}
    out: list[dict[str, Any]] = []
    try:
        pool = space.configs(names, kernel=fn, functions=model.functions, fixed=fixed, dtype=widest_dtype(ctx))
        for cfg in pool:
            cfg = {k: v for k, v in cfg.items() if k in names or k in OPTION_KEYS}
            if not cfg:
                continue
            full = {**current, **cfg}
            if not include_current and full == current:
                continue
            if full in out:
                continue
            out.append(full)
            if len(out) >= limit:
                break
    except (TypeError, AttributeError):
        return []
    return out


def apply_config(source: str, kernel: str, cfg: dict[str, Any], line: int | None = None) -> str:
    """``source`` with ``cfg`` set at the launch of ``kernel``; the grid axes the changed blocks scale follow them
    (``cdiv(M, 64)`` -> ``cdiv(M, 128)``; ``cdiv(M, bm)`` with ``BM=bm`` -> both literal; ``META["BM"]`` as is;
    the factors of a 1D tile grid ``cdiv(M, 32) * cdiv(N, 32)`` each with its own block). ``line``: the launch on
    that line, where the kernel is launched from several (a per-shape dispatch's branch); its grid must then be its
    own or follow the launch's meta-parameters."""
    model = parse_kernel(source)
    if line is None:
        site = single_launch(model, kernel)
    else:
        site = next((s for s in model.launches if s.kernel == kernel and s.line == line), None)
        if site is None:
            raise NotApplicable(f"no launch of {kernel} on line {line}")
    fn = model.functions[kernel]
    binds = bindings(model, site)
    names = tunable(model, site)
    keep = {k: v for k, v in cfg.items() if k in names or k in OPTION_KEYS}
    unknown = [k for k in cfg if k not in keep and k not in binds]
    if unknown:
        raise NotApplicable(f"configuration keys {', '.join(unknown)} are not tunable at the launch of {kernel}")
    # values the host makes are set where it makes them (the grid and every other reader follow); the rest at the
    # launch
    made = host_made(model, site, binds)
    heur = heuristic_made(model, site)
    in_heuristics = {k: v for k, v in keep.items() if k in heur}
    at_source = {k: v for k, v in keep.items() if k in made and k in binds and _set_where_made(model, site, binds[k])
                 and k not in in_heuristics}
    keep = {k: v for k, v in keep.items() if k not in at_source and k not in in_heuristics}
    grid = launch_grid(model, site)
    shared = grid is not None and bool(grid.variable) and sum(
        isinstance(o.node.func.slice, ast.Name) and o.node.func.slice.id == grid.variable for o in model.launches) > 1
    shift, anchor, edited = 0, 0, source
    if at_source:
        edited, anchor, shift = override(source, model, site, made, at_source,
                                         grid.assign if grid is not None else None)
    if keep:
        edited = _apply_at_launch(edited, source, model, site, kernel, keep, names, binds, grid, shift, anchor,
                                  shared)
    if in_heuristics:  # last: the decorator is above the launch, and its entries may change the line count
        capped = {k for k in in_heuristics if is_capped(model, site, heur[k])}
        edited = override_heuristics(edited, kernel, heur, in_heuristics, capped)
    return edited


def _apply_at_launch(edited: str, source: str, model: KernelModel, site: LaunchSite, kernel: str,
                     keep: dict[str, Any], names: list[str], binds: dict, grid: Any, shift: int, anchor: int,
                     shared: bool = False) -> str:
    """``edited`` with ``keep`` set at the launch of ``kernel`` (``shift`` lines below where ``source`` has it, from
    line ``anchor`` on), and the grid axes the changed blocks scale following them (``shared``: the grid variable
    serves other launches too, so a change to it is refused)."""
    fn = model.functions[kernel]
    changed_names = {k for k in keep if k in names and keep[k] != binds[k].value}
    edit = LaunchEdit(kernel, site.line + shift, set_kwargs={k: repr(v) for k, v in keep.items()
                                                             if k in changed_names or k in OPTION_KEYS})
    axes = axis_blocks(fn)
    changed = {ax: keep[n] for n in changed_names for ax, ax_names in axes.items() if n in ax_names}
    products = product_blocks(model, site, grid)[0]
    factors = {n: keep[n] for n in changed_names if n in products and not any(n in v for v in axes.values())}
    if changed or factors:
        if grid is None:
            raise NotApplicable("the grid is not a tuple or a lambda of cdiv(..., BLOCK) axes")
        elems, touched = [], False
        for ax, el in enumerate(grid.elements):
            text = segment_of(source, el) or ast.unparse(el)
            cd = _cdiv_args(el)
            if ax in changed and cd is not None and not (grid.kind == "lambda" and isinstance(cd[1], ast.Subscript)):
                func = segment_of(source, el.func) or ast.unparse(el.func)
                num = segment_of(source, cd[0]) or ast.unparse(cd[0])
                text = f"{func}({num}, {changed[ax]})"
                touched = True
            elif any(products[n] == ax for n in factors):
                new = _product_text(source, model, site, grid, el, factors)
                touched = touched or new != text
                text = new
            elems.append(text)
        if touched and shared and grid.variable and grid.assign is not None:
            raise NotApplicable(f"the launch's grid {grid.variable} serves another launch too: its blocks cannot "
                                "change here alone")
        if touched:
            new = "(" + ", ".join(elems) + ("," if len(elems) == 1 else "") + ")"
            if grid.kind == "lambda":
                new = f"lambda {grid.meta}: {new}"
            if grid.variable and grid.assign is not None:
                edit.grid_assign = (grid.assign.lineno + (shift if grid.assign.lineno > anchor else 0), new)
            else:
                edit.grid = new
    return edit_launch(edited, edit)


def describe(cfg: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in cfg.items())


def measured_configs(run_dir: Path | None, kernel: str, limit: int, tactics: tuple[str, ...] | None = None,
                     by_primary: bool = False) -> list[dict[str, Any]]:
    """Configurations that earlier device_tuning trials of this run verified and timed, fastest first (only those of
    ``tactics`` when given): by the verdict's speedup (over several timed shapes, their weighted objective), or with
    ``by_primary`` by the speedup at the primary shape alone."""
    if run_dir is None:
        return []
    rows: list[tuple[float, dict[str, Any]]] = []
    for meta_path in sorted(Path(run_dir).glob("trials/*/meta.json")):
        vpath = meta_path.parent / "verdict.json"
        try:
            meta = json.loads(meta_path.read_text())
            verdict = json.loads(vpath.read_text()) if vpath.exists() else None
        except (OSError, ValueError):
            continue
        if not verdict or meta.get("stage") != "device_tuning" or not verdict.get("correct"):
            continue
        if tactics is not None and meta.get("tactic") not in tactics:
            continue
        speed = verdict.get("speedup")
        if by_primary:
            shapes = next((g.get("details", {}).get("shapes") for g in verdict.get("gates") or []
                           if str(g.get("gate", "")).startswith("3")), None)
            if shapes and isinstance(shapes[0].get("speedup"), (int, float)):
                speed = shapes[0]["speedup"]
        params = meta.get("params") or {}
        if not params or not isinstance(speed, (int, float)):
            continue
        if not str(meta.get("description", "")).startswith(f"{kernel}:"):
            continue
        rows.append((float(speed), dict(params)))
    rows.sort(key=lambda r: -r[0])
    out: list[dict[str, Any]] = []
    for _, cfg in rows:
        if cfg not in out:
            out.append(cfg)
        if len(out) >= limit:
            break
    return out


def widest_dtype(ctx: Any) -> str | None:
    """The widest dtype the problem computes in at a shape the candidate must pass on this device (gate 2 runs
    every correctness shape: a spec's float32 ``ci`` beside its bfloat16 bench shapes, on a GPU too), or None when
    the problem tells nothing. A configuration whose operands fit shared memory in bfloat16 but not in float32
    fails at ``ci`` (on an H100 four of matmul_config_by_m's launch-search trials did: 288 KB of 227). On the
    interpreter the shapes are the target GPU's, where the configuration is meant to run."""
    problem = getattr(ctx, "problem", None)
    device = getattr(ctx, "device", None)
    if problem is None or device is None:
        return None
    kind = device.kind if device.kind != "cpu" else "cuda"  # a GPU's shapes: which GPU does not change them
    try:
        variants = problem.correctness_variants(kind, getattr(ctx.settings, "ragged_shapes", True))
        sizes = {dt: DTYPE_BYTES.get(dtype_key(dt) or "", 0) for dt in (problem.compute_dtype(v) for v in variants)
                 if dt}
    except (AttributeError, TypeError, ValueError):
        return None
    return max(sizes, key=sizes.get) if sizes else None


def kb_rejects(ctx: Any, cfg: dict[str, Any], fn: JitFunction) -> bool:
    """Whether the knowledge base refuses configuration ``cfg`` of ``fn`` on the target at the widest dtype the
    candidate must run in (False without a KB, or with one that cannot check configurations)."""
    if getattr(ctx, "kb", None) is None or not getattr(ctx, "device_id", None):
        return False
    try:
        return bool(ctx.kb.check_config(cfg, ctx.device_id, ctx.triton, fn, dtype=widest_dtype(ctx)))
    except AttributeError:
        return False


def kb_errors(ctx: Any, source: str) -> list[str]:
    """Gate-1 knowledge-base errors of ``source`` for the target (rule id: message), [] without a KB."""
    if ctx is None or getattr(ctx, "kb", None) is None or not getattr(ctx, "device_id", None):
        return []
    try:
        violations = ctx.kb.check(parse_kernel(source), ctx.device_id, ctx.triton)
    except Exception as exc:  # a KB that cannot check this source is reported, not raised
        return [f"kb check failed: {exc}"]
    return [f"{v.rule_id}: {v.message}" for v in violations if v.is_error]


def observe(ctx: Any, source: str) -> None:
    """Trace ``source`` (a rewrite's result, not yet seen) at the problem's variants, so block sizes passed as
    attributes or computed values are known for it as for the incumbent (:mod:`xeforge.analysis.launches`)."""
    problem = getattr(ctx, "problem", None)
    if getattr(getattr(problem, "spec", None), "variants", None) is None:
        return
    try:
        traces(problem, source)
    except Exception:  # noqa: BLE001 — untraceable: the static reading stands, and says why
        pass


#: Triton's OutOfResources message for shared memory (NVIDIA and Intel backends word it the same)
SMEM_OVER = re.compile(r"out of resource: shared memory, Required: (\d+), Hardware limit: (\d+)")


def staged_smem(source: str, elem_bytes: int = 2) -> tuple[str, int] | None:
    """(kernel, bytes) of shared memory the GEMM launched once in ``source`` needs by the compiler's own arithmetic
    where it stores its C tile through a tensor descriptor: ``num_stages`` x (BM x BK + BN x BK) operand bytes plus
    the largest staging tile it stores (``[BM, BN]``, or ``[BM, BN // 2]`` once halved). On an H100 (Triton 3.6) the
    compiler asked 262,176 B for a 128 x 256 x 64 tile at 4 stages, 213,016 at 3 (this estimate: 262,144 and
    212,992). None where there is no such store, the GEMM is launched from several places, or a size is not known."""
    model = parse_kernel(source)
    for kernel in launched_kernels_gemm_first(model):
        sites = [s for s in model.launches if s.kernel == kernel]
        tiles = store_tiles(source, kernel)
        if len(sites) != 1 or not tiles:
            return None
        cfg = {**{k: b.value for k, b in bindings(model, sites[0]).items() if b.value is not None},
               **launch_options(model, sites[0])}
        by_use = roles_by_use(model.functions[kernel])
        bm, bn, bk = (first_int(r, cfg, by_use) for r in ("block_m", "block_n", "block_k"))
        stages = cfg.get("num_stages")
        sizes = [_int_expr(f"({r}) * ({c})", cfg) for r, c in tiles]
        if not (isinstance(stages, int) and bm and bn and bk) or None in sizes:
            return None
        return kernel, (stages * (bm + bn) * bk + max(sizes)) * elem_bytes
    return None


def _int_expr(text: str, names: dict[str, Any]) -> int | None:
    """The value of an integer expression of constexpr names (``BLOCK_N // 2``) given their values; None otherwise."""
    ops = {ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b if b else None,
           ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b}

    def value(n: ast.AST) -> int | None:
        if isinstance(n, ast.Constant) and isinstance(n.value, int) and not isinstance(n.value, bool):
            return n.value
        if isinstance(n, ast.Name):
            v = names.get(n.id)
            return v if isinstance(v, int) and not isinstance(v, bool) else None
        if isinstance(n, ast.BinOp) and type(n.op) in ops:
            a, b = value(n.left), value(n.right)
            return None if a is None or b is None else ops[type(n.op)](a, b)
        return None

    try:
        return value(parse_python(text, mode="eval").body)
    except SyntaxError:
        return None


#: where a worker's failure names the candidate's line (``at candidate.py:121: ...``)
FAILED_AT = re.compile(r"\bcandidate\.py:(\d+)")


def _failing_launch(model: KernelModel, failure: str, kernel: str) -> int | None:
    """Which of ``kernel``'s launches in ``model`` (their index in source order) the failure is at: the only one, or
    the one on the line the failure names (a per-shape dispatch launches the kernel from each branch); None when
    neither tells."""
    sites = [s for s in model.launches if s.kernel == kernel]
    if len(sites) == 1:
        return 0
    lines = {int(n) for n in FAILED_AT.findall(failure or "")}
    return next((i for i, s in enumerate(sites) if s.line in lines), None)


def fit_stages(source: str, failure: str, elem_bytes: int = 2,
               fixed_scale: float = 1.0, failed_source: str | None = None) -> tuple[str, dict[str, Any]] | None:
    """``source`` with fewer ``num_stages`` at its GEMM launch, so that what the compiler said it needs fits.

    ``failure`` is the text of a compile failure. The compiler's figure includes what the pipeline stages do not
    (the epilogue's staging tile, e.g. an fp32 C tile stored through a descriptor, which the knowledge base's
    estimate cannot see); each stage holds one BM x BK and one BN x BK operand tile of ``elem_bytes``. The largest
    stage count that fits is chosen. None when the failure is not a shared-memory one or no count fits.

    ``fixed_scale`` scales that non-stage part: 0.5 for ``source`` whose staging tile was halved after the failure
    (``subtile.subtile_stores``); then the launch's own stage count may fit, and ``source`` comes back unchanged.

    Where the kernel is launched from several places (a per-shape dispatch), the launch changed is the one the
    failure names by its line in ``failed_source`` (the source that failed; ``source`` by default), taken at the same
    place among the kernel's launches in ``source``.
    """
    m = SMEM_OVER.search(failure or "")
    if m is None:
        return None
    required, limit = int(m.group(1)), int(m.group(2))
    model = parse_kernel(source)
    failed = parse_kernel(failed_source) if failed_source is not None else model
    for kernel in launched_kernels_gemm_first(model):
        at = _failing_launch(failed, failure, kernel)
        sites = [s for s in model.launches if s.kernel == kernel]
        if at is None or at >= len(sites):
            continue
        site = sites[at]
        cfg = {**{k: b.value for k, b in bindings(model, site).items() if b.value is not None}, **launch_options(model, site)}
        stages = cfg.get("num_stages")
        by_use = roles_by_use(model.functions[kernel])
        bm, bn, bk = (first_int(r, cfg, by_use) for r in ("block_m", "block_n", "block_k"))
        if not (isinstance(stages, int) and stages > 1 and bm and bn and bk):
            continue
        per_stage = (bm + bn) * bk * elem_bytes
        fixed = (required - stages * per_stage) * fixed_scale
        top = stages if fixed_scale < 1.0 else stages - 1
        fits = [n for n in range(top, 0, -1) if fixed + n * per_stage <= limit]
        if not fits:
            continue
        if fits[0] == stages:
            new = source
        else:
            try:
                new = apply_config(source, kernel, {"num_stages": fits[0]}, line=site.line if len(sites) > 1 else None)
            except (NotApplicable, LookupError):
                continue
        return new, {"kernel": kernel, "num_stages": fits[0], "was": stages,
                     "estimate": int(fixed + fits[0] * per_stage), "limit": limit}
    return None
