"""Launch values the host makes, and the edit that retunes them where they are made.

Owns: which block sizes and launch options of a launch the host code computes — into a variable of the launching
function (``block_m, block_n, warps = _pick_blocks(M, N)``, ``BLOCK_N = min(next_power_of_2(N), cap)``,
``num_warps = _warps_for(BLOCK_N)``) or into a dict the launch unpacks (``**cfg`` from a table keyed on M) — with
the values the traces saw at each variant (:func:`host_made`); whether a block size may take one new value at every
shape (:func:`overridable`: the grid divides by it, or the kernel loops over its dimension in steps of it); and the
rule a configuration is written as (:func:`override`): one statement right after the last one that makes the
values, so the grid, the launch and every other reader of them follow, and the user's heuristic stays above it; a
loop's step sized from the row is capped there rather than set (:func:`is_capped`), so a cap at or above every
traced value changes nothing (:func:`changes_nothing`).

A kernel's own ``@triton.heuristics({"BLOCK_N": fn, "num_warps": fn})`` is such a maker too
(:func:`heuristic_made`): Triton sets those values after the launch's arguments, over any the launch passes, so a
new value goes into the decorator's entry (:func:`override_heuristics`), the user's function kept beside it.

Pure reading and text edits; never runs user code.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from typing import Any

from xeforge.analysis.launches import Binding, bindings, observed
from xeforge.kernel_model import (JitFunction, KernelModel, LaunchSite, axis_blocks, dotted_name, parse_python,
                                  source_offset)
from xeforge.rewrite.tiling import NotApplicable
from xeforge.rewrite.tiling.grid import enclosing_function

#: ``HostMade.var`` of a value a kernel's ``@triton.heuristics`` entry makes
HEURISTICS = "@triton.heuristics"

#: the variant whose traced value stands for a host-made value when a search needs one (the primary timed shape)
PRIMARY = "bench-gpu"


@dataclass(frozen=True)
class HostMade:
    """One constexpr or option whose value the launching function computes."""

    name: str  # the kernel's constexpr or the launch option
    target: str  # what the override assigns: ``block_m`` or ``cfg["BLOCK_M"]``
    var: str  # the host variable behind it: ``block_m`` or ``cfg``
    values: dict[str, Any]  # variant -> the traced value

    @property
    def value(self) -> Any:
        """The value at the primary timed shape (else the first bench shape, else any traced one)."""
        return at_primary(self.values)

    def shown(self) -> str:
        return ", ".join(f"{v!r} at {k}" for k, v in sorted(self.values.items()))


def at_primary(values: dict[str, Any]) -> Any:
    """Of ``values`` (variant -> what the traces saw), the one at the primary timed shape, else at the first bench
    shape, else any; None when there is none."""
    if not values:
        return None
    if PRIMARY in values:
        return values[PRIMARY]
    bench = sorted(k for k in values if k.startswith("bench-"))
    return values[bench[0] if bench else sorted(values)[0]]


def _stores(node: ast.AST, var: str) -> bool:
    """``node`` assigns ``var``, an item of it, or calls a method of it (``cfg.pop``, ``cfg.update``)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id == var and isinstance(n.ctx, (ast.Store, ast.Del)):
            return True
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, (ast.Store, ast.Del)) and \
                isinstance(n.value, ast.Name) and n.value.id == var:
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) \
                and n.func.value.id == var:
            return True
    return False


def host_made(model: KernelModel, site: LaunchSite, binds: dict[str, Binding] | None = None) -> dict[str, HostMade]:
    """Constexprs and options at ``site`` that a variable of the launching function (or a key of the dict it
    unpacks) gives, with the values the traces saw; only where every traced variant has a value."""
    fn = enclosing_function(model, site)
    if fn is None:
        return {}
    params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    seen = observed(model, site)
    out: dict[str, HostMade] = {}
    for name, bd in (binds if binds is not None else bindings(model, site)).items():
        if bd.how != "expression" or not bd.expr or name not in seen:
            continue
        node = parse_python(bd.expr.strip(), mode="eval").body
        if isinstance(node, ast.Name):
            var, target = node.id, node.id
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
                isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            var, target = node.value.id, bd.expr.strip()
        else:
            continue
        if var in params or not any(_stores(st, var) for st in ast.walk(fn) if isinstance(st, ast.stmt)
                                    and not isinstance(st, ast.FunctionDef) and st.lineno < site.line):
            continue
        values = seen[name]
        if values and all(v is not None for v in values.values()):
            out[name] = HostMade(name, target, var, dict(values))
    return out


def heuristic_entries(fn: ast.FunctionDef) -> dict[str, ast.expr] | None:
    """Name -> the value expression of each entry of ``fn``'s ``@triton.heuristics({...})`` decorators (empty
    without one); None when a decorator's argument is not a dict literal with string keys (what it sets cannot be
    read)."""
    out: dict[str, ast.expr] = {}
    for dec in fn.decorator_list:
        if isinstance(dec, ast.Call) and (dotted_name(dec.func) or "").rsplit(".", 1)[-1] == "heuristics":
            arg = dec.args[0] if dec.args else next((k.value for k in dec.keywords if k.arg == "values"), None)
            if not isinstance(arg, ast.Dict) or not all(isinstance(k, ast.Constant) and isinstance(k.value, str)
                                                        for k in arg.keys):
                return None
            out.update({k.value: v for k, v in zip(arg.keys, arg.values)})
    return out


def heuristic_made(model: KernelModel, site: LaunchSite) -> dict[str, HostMade]:
    """The values ``site``'s kernel's ``@triton.heuristics`` entries make, with the values the traces saw (only
    where every traced variant has one)."""
    entries = heuristic_entries(model.functions[site.kernel].node) or {}
    seen = observed(model, site)
    return {name: HostMade(name, name, HEURISTICS, dict(seen[name])) for name in entries
            if seen.get(name) and all(v is not None for v in seen[name].values())}


def override_heuristics(source: str, kernel: str, made: dict[str, HostMade], cfg: dict[str, Any],
                        capped: set[str]) -> str:
    """``source`` with each ``cfg`` entry (a key of ``kernel``'s ``@triton.heuristics``) made to give its new value:
    ``lambda args: 512``, or for a block in ``capped`` (a loop's step the entry sizes from the row) ``lambda args:
    min((user's entry)(args), 512)``, so a shorter row keeps its narrower block. A comment above the decorator says
    what the entries gave."""
    model = parse_python(source)
    fn = next((n for n in ast.walk(model) if isinstance(n, ast.FunctionDef) and n.name == kernel), None)
    if fn is None:
        raise NotApplicable(f"no kernel {kernel} in the source")
    entries = heuristic_entries(fn) or {}
    missing = [n for n in cfg if n not in entries]
    if missing:
        raise NotApplicable(f"{', '.join(missing)} of {kernel} are not entries of its @triton.heuristics")
    text = source
    for name in sorted(cfg, key=lambda n: (entries[n].lineno, entries[n].col_offset), reverse=True):
        node = entries[name]  # spliced bottom-up: the spans above it keep their offsets in source
        a = source_offset(source, node.lineno, node.col_offset)
        b = source_offset(source, node.end_lineno, node.end_col_offset)
        orig = " ".join(text[a:b].split())
        new = f"lambda args: min(({orig})(args), {cfg[name]!r})" if name in capped else \
            f"lambda args: {cfg[name]!r}"
        text = text[:a] + new + text[b:]
    first = min(fn.decorator_list, key=lambda d: d.lineno)
    pad = " " * fn.col_offset  # a decorator's node starts after its "@"
    note = [f"{pad}# xeforge launch-params: retuned for the port's device; the @triton.heuristics entries gave"]
    for n in sorted(cfg):
        note += [f"{pad}#   {ln}" for ln in textwrap.wrap(f"{n}: {made[n].shown()}", 100, subsequent_indent="  ")]
    out = text.splitlines(keepends=True)
    return "".join(out[:first.lineno - 1] + [ln + "\n" for ln in note] + out[first.lineno - 1:])


def _loop_steps(fn: JitFunction) -> set[str]:
    """Constexprs a loop of the kernel walks its dimension by, whatever their value: the step of
    ``for start in range(0, N, BLOCK_N)``, or the block of ``for k in range(0, tl.cdiv(K, BLOCK_K))`` — also through
    names the kernel assigns once (a persistent kernel's ``tiles_m = tl.cdiv(M, BLOCK_M)``, ``num_tiles = tiles_m *
    tiles_n``, ``for tile_id in range(pid, num_tiles, NUM_SMS)``: every tile of any size is visited)."""
    defs: dict[str, list[ast.expr]] = {}
    for node in ast.walk(fn.node):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            defs.setdefault(node.targets[0].id, []).append(node.value)

    def spelled(expr: ast.AST, depth: int = 0) -> list[ast.AST]:
        """``expr`` and the values of the once-assigned names it reads, transitively."""
        out = [expr]
        if depth > 6:
            return out
        for n in ast.walk(expr):
            if isinstance(n, ast.Name) and len(defs.get(n.id, ())) == 1:
                out += spelled(defs[n.id][0], depth + 1)
        return out

    out: set[str] = set()
    for node in ast.walk(fn.node):
        if not (isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and
                (dotted_name(node.iter.func) or "").rsplit(".", 1)[-1] in ("range", "static_range")):
            continue
        args = node.iter.args
        if len(args) >= 3:
            out |= {n.id for n in ast.walk(args[2]) if isinstance(n, ast.Name)}
        for a in args[:2]:
            for part in spelled(a):
                for c in ast.walk(part):
                    if isinstance(c, ast.Call) and (dotted_name(c.func) or "").endswith("cdiv") and len(c.args) == 2:
                        out |= {n.id for n in ast.walk(c.args[1]) if isinstance(n, ast.Name)}
    return out


def overridable(fn: JitFunction, name: str, made: HostMade, follows_grid: bool) -> str | None:
    """None when one new value of ``name`` at every shape keeps the kernel covering its data; else why not."""
    if any(not (isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0)
           for v in made.values.values()):
        return f"{name}={made.target} is not a power of two at every shape ({made.shown()})"
    if follows_grid or name in _loop_steps(fn):
        return None
    how = "changes with the shape" if len(set(made.values.values())) > 1 else "is made on the host"
    return (f"{name}={made.target} {how} ({made.shown()}) and neither sizes a grid axis "
            f"(cdiv(..., {made.target})) nor steps a loop of {fn.name}: it may have to cover a whole row")


def is_capped(model: KernelModel, site: LaunchSite, made: HostMade) -> bool:
    """A block a loop walks its row by, which the host sizes from the row (``next_power_of_2(N)``): the rule caps it
    (``min(block, value)``), so a shorter row keeps its own narrower block; a tile the grid divides by takes the
    value at every shape."""
    kfn = model.functions[site.kernel]
    coupled = {n for names in axis_blocks(kfn).values() for n in names}
    return (made.target == made.var or made.var == HEURISTICS) and made.name in _loop_steps(kfn) and \
        made.name not in coupled and len(set(made.values.values())) > 1


def changes_nothing(model: KernelModel, site: LaunchSite, made: HostMade, value: Any) -> bool:
    """Setting ``made`` to ``value`` is a cap at or above every value the traces saw: the rule would change nothing."""
    return is_capped(model, site, made) and all(isinstance(v, int) and v <= value for v in made.values.values())


def _block_of(fn: ast.FunctionDef, line: int) -> tuple[list[ast.stmt], int]:
    """The innermost statement list of ``fn`` holding the statement at ``line``, and that statement's index."""
    found: list[tuple[int, int, list[ast.stmt], int]] = []
    for node in ast.walk(fn):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            for i, st in enumerate(block if isinstance(block, list) else []):
                if isinstance(st, ast.stmt) and st.lineno <= line <= (st.end_lineno or st.lineno):
                    found.append((st.lineno, -(st.end_lineno or st.lineno), block, i))
    if not found:
        raise NotApplicable(f"line {line} is not a statement of {fn.name}")
    _, _, block, i = max(found, key=lambda f: (f[0], f[1]))
    return block, i


def override(source: str, model: KernelModel, site: LaunchSite, made: dict[str, HostMade], cfg: dict[str, Any],
             grid_assign: ast.Assign | None = None) -> tuple[str, int, int]:
    """``source`` with the values of ``cfg`` (name -> value, each a key of ``made``) set right after the last
    statement before the launch that makes them, as a rule beside the user's own: the grid, the launch and every
    other reader of them follow. ``grid_assign``: the launch's grid assignment, which must not come before it.
    Returns the new source, the line the rule follows and how many lines it has (lines after it move down)."""
    fn = enclosing_function(model, site)
    if fn is None or not cfg:
        raise NotApplicable(f"the launch of {site.kernel} at line {site.line} is not in a function")
    block, at = _block_of(fn, site.line)
    vars_ = {made[n].var for n in cfg}
    last = max((i for i in range(at) for v in vars_ if _stores(block[i], v)), default=-1)
    if last < 0:  # made in an enclosing block: the rule opens the launch's block
        anchor_line, indent = block[0].lineno - 1, block[0].col_offset
    else:
        anchor_line, indent = block[last].end_lineno or block[last].lineno, block[last].col_offset
    if grid_assign is not None and grid_assign.lineno <= anchor_line and \
            vars_ & {n.id for n in ast.walk(grid_assign.value) if isinstance(n, ast.Name)}:
        raise NotApplicable(f"the grid at line {grid_assign.lineno} is made from {', '.join(sorted(vars_))} before "
                            "their last assignment: a value set after it would not reach the grid")
    pad = " " * indent
    capped = {n for n in cfg if is_capped(model, site, made[n])}
    plain = [(made[n].target, v) for n, v in cfg.items() if made[n].target == made[n].var and n not in capped]
    keyed: dict[str, list[tuple[str, Any]]] = {}
    for n, v in cfg.items():
        if made[n].target != made[n].var:
            keyed.setdefault(made[n].var, []).append((n, v))
    lines = [f"{pad}# xeforge launch-params: retuned for the port's device; the rule above gave"]
    for n in sorted(cfg):
        lines += [f"{pad}#   {ln}" for ln in textwrap.wrap(f"{n}: {made[n].shown()}", 100, subsequent_indent="  ")]
    for n in sorted(capped):
        lines.append(f"{pad}{made[n].target} = min({made[n].target}, {cfg[n]!r})")
    if plain:
        lines.append(f"{pad}{', '.join(t for t, _ in plain)} = {', '.join(repr(v) for _, v in plain)}")
    for var, items in sorted(keyed.items()):  # a new dict: the user's (perhaps cached) one is left as it was
        lines.append(f"{pad}{var} = {{**{var}, {', '.join(f'{k!r}: {v!r}' for k, v in items)}}}")
    text = source.splitlines(keepends=True)
    return "".join(text[:anchor_line] + [ln + "\n" for ln in lines] + text[anchor_line:]), anchor_line, len(lines)
