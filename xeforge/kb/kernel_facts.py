"""What the knowledge-base checks need from a parsed kernel, beyond :mod:`xeforge.kernel_model`.

Owns: :class:`LaunchConfig` (one concrete set of constexpr values and launch options, with the line it
comes from) and the helpers that derive them from a :class:`~xeforge.kernel_model.KernelModel`: each
launch site of a plain kernel, and each ``triton.Config`` of an autotuned one (merged with the literal
values at its launch site); whether a jit function uses ``tl.dot`` (directly or through jit helpers it
calls); which names bound ``tl.arange``; the line of each ``triton.Config``; the tile roles of constexprs whose
names follow no convention, read from their use (:func:`roles_by_use`).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from typing import Any

from xeforge.kb.roles import role_of
from xeforge.kernel_model import JitFunction, KernelModel, dotted_name

DOT_CALLS = frozenset({"tl.dot", "triton.language.dot", "tl.dot_scaled", "triton.language.dot_scaled"})
ARANGE_CALLS = frozenset({"tl.arange", "triton.language.arange"})


@dataclass
class LaunchConfig:
    """One configuration a kernel runs with: constexpr values and launch options by name."""

    values: dict[str, Any]
    line: int | None = None
    kernel: str | None = None
    fn: JitFunction | None = field(default=None, repr=False)
    origin: str = "config"  # "launch" | "autotune" | "config"
    uses_dot: bool | None = None  # None: unknown
    arange_bounds: frozenset[str] = frozenset()

    @property
    def roles(self) -> dict[str, str]:
        """Roles of the kernel's constexprs that their names do not give (:func:`roles_by_use`)."""
        return roles_by_use(self.fn) if self.fn is not None else {}


def _names(node: ast.AST | None) -> list[str]:
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name)] if node is not None else []


def roles_by_use(fn: JitFunction) -> dict[str, str]:
    """Tile roles of ``fn``'s constexprs that no naming convention covers (``TM``, ``TN``, ``TK``), read from how a
    GEMM-like kernel uses them: the accumulator ``acc = tl.zeros((TM, TN), ...)`` that a ``tl.dot`` adds into gives
    block_m and block_n; the step of the loop around the ``tl.dot`` (``range(0, K, TK)``), or the block its trip
    count divides by (``range(0, tl.cdiv(K, TK))``), gives block_k. Empty for a kernel without ``tl.dot``."""
    return dict(_roles_by_use(fn.node, tuple(fn.constexpr_params)))


@functools.lru_cache(maxsize=512)  # asked per configuration and constraint while a search checks its space
def _roles_by_use(node: ast.FunctionDef, constexprs: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    unnamed = {c for c in constexprs if role_of(c) is None}
    dots = [c for c in _calls(node) if dotted_name(c.func) in DOT_CALLS]
    if not unnamed or not dots:
        return ()
    zeros: dict[str, list[ast.expr]] = {}
    for n in ast.walk(node):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) and \
                isinstance(n.value, ast.Call) and dotted_name(n.value.func) in ("tl.zeros", "triton.language.zeros") \
                and n.value.args and isinstance(n.value.args[0], (ast.Tuple, ast.List)):
            zeros[n.targets[0].id] = list(n.value.args[0].elts)
    accs = {n.target.id for n in ast.walk(node) if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)
            and any(dotted_name(c.func) in DOT_CALLS for c in _calls(n.value))}
    for d in dots:
        acc = d.args[2] if len(d.args) > 2 else next((k.value for k in d.keywords if k.arg == "acc"), None)
        if isinstance(acc, ast.Name):
            accs.add(acc.id)
    out: dict[str, str] = {}
    for acc in sorted(accs & set(zeros)):
        shape = zeros[acc]
        if len(shape) == 2:
            for role, el in zip(("block_m", "block_n"), shape):
                if isinstance(el, ast.Name) and el.id in unnamed:
                    out.setdefault(el.id, role)
    dot_ids = {id(d) for d in dots}
    for loop in ast.walk(node):
        if not (isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call) and loop.iter.args and
                (dotted_name(loop.iter.func) or "").rsplit(".", 1)[-1] in ("range", "static_range")):
            continue
        if not any(id(c) in dot_ids for st in loop.body for c in _calls(st)):
            continue
        args = loop.iter.args
        if len(args) > 2:  # range(0, K, TK)
            steps = _names(args[2])
        else:  # range(0, tl.cdiv(K, TK))
            steps = [n for c in _calls(args[-1]) if (dotted_name(c.func) or "").endswith("cdiv") and len(c.args) == 2
                     for n in _names(c.args[1])]
        for name in steps:
            if name in unnamed:
                out.setdefault(name, "block_k")
    return tuple(out.items())


def _calls(node: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def _reachable_calls(fn: JitFunction, functions: dict[str, JitFunction] | None):
    """(dotted name, call) of every call in ``fn`` and in the jit functions of the module it calls, transitively."""
    functions = functions or {}
    seen: set[str] = set()
    stack = [fn]
    while stack:
        cur = stack.pop()
        if cur.name in seen:
            continue
        seen.add(cur.name)
        for call in _calls(cur.node):
            name = dotted_name(call.func)
            yield name, call
            if name in functions:
                stack.append(functions[name])


def uses_dot(fn: JitFunction, functions: dict[str, JitFunction] | None = None) -> bool:
    """True when ``fn`` calls ``tl.dot`` itself or through jit functions of the same module."""
    return any(name in DOT_CALLS for name, _ in _reachable_calls(fn, functions))


def arange_bounds(fn: JitFunction, functions: dict[str, JitFunction] | None = None) -> frozenset[str]:
    """Names used as the end of ``tl.arange(start, END)`` in ``fn`` and the jit helpers it calls."""
    out: set[str] = set()
    for name, call in _reachable_calls(fn, functions):
        if name in ARANGE_CALLS:
            end = call.args[1] if len(call.args) >= 2 else next(
                (k.value for k in call.keywords if k.arg == "end"), None
            )
            if isinstance(end, ast.Name):
                out.add(end.id)
    return frozenset(out)


def autotune_config_lines(fn: JitFunction) -> list[int]:
    """The line of each ``triton.Config(...)`` in ``fn``'s ``@triton.autotune``, in order."""
    for dec in fn.node.decorator_list:
        if isinstance(dec, ast.Call) and dotted_name(dec.func) in {"triton.autotune", "autotune"}:
            for kw in dec.keywords:
                if kw.arg == "configs" and isinstance(kw.value, (ast.List, ast.Tuple)):
                    return [
                        elt.lineno
                        for elt in kw.value.elts
                        if isinstance(elt, ast.Call) and dotted_name(elt.func) in {"triton.Config", "Config"}
                    ]
    return []


def launch_configs(model: KernelModel) -> list[LaunchConfig]:
    """Every configuration the file pins down statically (literal values only).

    A launch of a plain kernel gives one (at the launch line). A launch of an autotuned kernel gives one per
    ``triton.Config`` (at the config's line), merged with the literal values at the launch. An autotuned
    kernel that is never launched still gives its configs.
    """
    out: list[LaunchConfig] = []
    info = {
        name: (uses_dot(fn, model.functions), arange_bounds(fn, model.functions))
        for name, fn in model.functions.items()
    }
    launched: set[str] = set()
    for site in model.launches:
        fn = model.functions.get(site.kernel)
        if fn is None:
            continue
        launched.add(site.kernel)
        dot, bounds = info[site.kernel]
        base = {**site.constexprs, **site.options}
        if fn.is_autotuned:
            for cfg, line in zip(fn.autotune_configs, _lines_for(fn)):
                out.append(LaunchConfig({**base, **cfg}, line, fn.name, fn, "autotune", dot, bounds))
        else:
            out.append(LaunchConfig(base, site.line, fn.name, fn, "launch", dot, bounds))
    for name, fn in model.functions.items():
        if fn.is_autotuned and name not in launched:
            dot, bounds = info[name]
            for cfg, line in zip(fn.autotune_configs, _lines_for(fn)):
                out.append(LaunchConfig(dict(cfg), line, fn.name, fn, "autotune", dot, bounds))
    return out


def _lines_for(fn: JitFunction) -> list[int]:
    lines = autotune_config_lines(fn)
    if len(lines) < len(fn.autotune_configs):
        lines += [fn.line] * (len(fn.autotune_configs) - len(lines))
    return lines


def config_for(
    values: dict[str, Any],
    kernel: JitFunction | None = None,
    functions: dict[str, JitFunction] | None = None,
    assume_dot: bool | None = None,
) -> LaunchConfig:
    """A :class:`LaunchConfig` for a candidate configuration (the tuner's view, no source line)."""
    if kernel is not None:
        return LaunchConfig(
            dict(values),
            None,
            kernel.name,
            kernel,
            "config",
            uses_dot(kernel, functions),
            arange_bounds(kernel, functions),
        )
    return LaunchConfig(dict(values), None, None, None, "config", assume_dot, frozenset())


def attribute_uses(model: KernelModel, names: set[str]) -> list[tuple[str, int]]:
    """``(dotted name, line)`` of every attribute reference such as ``tl.float64`` inside jit functions."""
    out: list[tuple[str, int]] = []
    for fn in model.functions.values():
        for node in ast.walk(fn.node):
            if isinstance(node, ast.Attribute):
                name = dotted_name(node)
                if name is None:
                    continue
                alias = "tl." + name[len("triton.language.") :] if name.startswith("triton.language.") else name
                if name in names or alias in names:
                    out.append((alias, node.lineno))
    return out
