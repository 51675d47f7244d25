"""What the knowledge-base checks need from a parsed kernel, beyond :mod:`xeforge.kernel_model`.

Owns: :class:`LaunchConfig` (one concrete set of constexpr values and launch options, with the line it
comes from) and the helpers that derive them from a :class:`~xeforge.kernel_model.KernelModel`: each
launch site of a plain kernel, and each ``triton.Config`` of an autotuned one (merged with the literal
values at its launch site); whether a jit function uses ``tl.dot`` (directly or through jit helpers it
calls); which names bound ``tl.arange``; the line of each ``triton.Config``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

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
