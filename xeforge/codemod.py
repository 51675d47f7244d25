"""Source rewriting with libcst: edits that keep the user's formatting and comments.

Owns: the shared rewriting primitives the tactics use — today, setting keyword arguments at a launch site
(``kernel[grid](..., BLOCK_M=64, num_warps=4)``), addressed by kernel name and line. Tactic-specific
rewrites live in their stage modules and build on these.
"""

from __future__ import annotations

from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider


def _value_node(value: Any) -> cst.BaseExpression:
    return cst.parse_expression(repr(value))


class _LaunchKwargSetter(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, kernel: str, line: int, updates: dict[str, Any]) -> None:
        super().__init__()
        self.kernel = kernel
        self.line = line
        self.updates = updates
        self.hits = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        func = original.func
        if not (isinstance(func, cst.Subscript) and isinstance(func.value, cst.Name) and func.value.value == self.kernel):
            return updated
        if self.get_metadata(PositionProvider, original).start.line != self.line:
            return updated
        self.hits += 1
        remaining = dict(self.updates)
        args = []
        for arg in updated.args:
            if arg.keyword is not None and arg.keyword.value in remaining:
                arg = arg.with_changes(value=_value_node(remaining.pop(arg.keyword.value)))
            args.append(arg)
        for key, value in remaining.items():
            if args and args[-1].comma is cst.MaybeSentinel.DEFAULT:
                args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            args.append(cst.Arg(keyword=cst.Name(key), value=_value_node(value),
                                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                      whitespace_after=cst.SimpleWhitespace(""))))
        return updated.with_changes(args=args)


def set_launch_kwargs(source: str, kernel: str, line: int, updates: dict[str, Any]) -> str:
    """Return ``source`` with keyword arguments of the launch ``kernel[...](...)`` at ``line`` set to ``updates``."""
    wrapper = MetadataWrapper(cst.parse_module(source))
    setter = _LaunchKwargSetter(kernel, line, updates)
    new = wrapper.visit(setter)
    if setter.hits == 0:
        raise LookupError(f"no launch of {kernel} at line {line}")
    return new.code


def _is_cdiv(node: cst.BaseExpression) -> bool:
    if not isinstance(node, cst.Call):
        return False
    f = node.func
    name = f.attr.value if isinstance(f, cst.Attribute) else (f.value if isinstance(f, cst.Name) else "")
    return name == "cdiv" and len(node.args) == 2


class _GridSetter(cst.CSTTransformer):
    """Rewrites ``cdiv(x, OLD)`` at position ``axis`` of a grid tuple to ``cdiv(x, NEW)``."""

    def __init__(self, axis: int, old: int, new: int) -> None:
        super().__init__()
        self.axis, self.old, self.new = axis, old, new
        self.hits = 0

    def rewrite_tuple(self, node: cst.Tuple) -> cst.Tuple:
        elts = list(node.elements)
        if self.axis >= len(elts):
            return node
        el = elts[self.axis].value
        if _is_cdiv(el) and isinstance(el.args[1].value, cst.Integer) and int(el.args[1].value.value) == self.old:
            el = el.with_changes(args=[el.args[0], el.args[1].with_changes(value=cst.Integer(str(self.new)))])
            elts[self.axis] = elts[self.axis].with_changes(value=el)
            self.hits += 1
            return node.with_changes(elements=elts)
        return node


def grid_axis_literal(source: str, kernel: str, line: int, axis: int) -> tuple[str, int | None]:
    """How the grid of the launch at ``line`` sizes ``axis``: ("inline" | "variable:<name>" | "other", literal or None)."""
    module = cst.parse_module(source)
    wrapper = MetadataWrapper(module)
    found: dict[str, Any] = {}

    class V(cst.CSTVisitor):
        METADATA_DEPENDENCIES = (PositionProvider,)

        def visit_Call(self, node: cst.Call) -> None:
            f = node.func
            if isinstance(f, cst.Subscript) and isinstance(f.value, cst.Name) and f.value.value == kernel \
                    and self.get_metadata(PositionProvider, node).start.line == line:
                found["slice"] = f.slice[0].slice.value if f.slice else None

        def visit_Assign(self, node: cst.Assign) -> None:
            pos = self.get_metadata(PositionProvider, node).start.line
            if pos < line and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
                found.setdefault("assigns", {})[node.targets[0].target.value] = node.value

    wrapper.visit(V())
    sl = found.get("slice")
    kind = "inline"
    if isinstance(sl, cst.Name):
        found["grid_name"] = sl.value
        sl = found.get("assigns", {}).get(sl.value)
        kind = "variable"
    if isinstance(sl, cst.Tuple) and axis < len(sl.elements):
        el = sl.elements[axis].value
        if _is_cdiv(el) and isinstance(el.args[1].value, cst.Integer):
            return (f"variable:{found['grid_name']}" if kind == "variable" else kind), int(el.args[1].value.value)
    return "other", None


def set_grid_block(source: str, kernel: str, line: int, axis: int, old: int, new: int) -> str:
    """Change the literal block size in ``cdiv(x, old)`` at ``axis`` of the grid used by the launch at ``line``.

    Handles an inline grid tuple and a grid tuple assigned to a variable earlier in the same function.
    """
    kind, lit = grid_axis_literal(source, kernel, line, axis)
    if lit != old:
        raise LookupError(f"grid axis {axis} of the launch at line {line} is not cdiv(..., {old})")
    module = cst.parse_module(source)
    wrapper = MetadataWrapper(module)
    setter = _GridSetter(axis, old, new)

    class T(cst.CSTTransformer):
        METADATA_DEPENDENCIES = (PositionProvider,)

        def __init__(self) -> None:
            super().__init__()
            self.grid_name: str | None = None
            self.last_assign_line = -1

        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
            f = updated.func
            if kind == "inline" and isinstance(f, cst.Subscript) and isinstance(f.value, cst.Name) \
                    and f.value.value == kernel and self.get_metadata(PositionProvider, original).start.line == line:
                el = f.slice[0]
                tup = el.slice.value
                if isinstance(tup, cst.Tuple):
                    new_slice = el.slice.with_changes(value=setter.rewrite_tuple(tup))
                    return updated.with_changes(func=f.with_changes(slice=[el.with_changes(slice=new_slice)]))
            return updated

    if kind == "inline":
        new = wrapper.visit(T())
    else:
        # the last assignment of the grid variable before the launch line
        target_line = _last_assign_line(source, kind.split(":", 1)[1], line)

        class A(cst.CSTTransformer):
            METADATA_DEPENDENCIES = (PositionProvider,)

            def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
                if self.get_metadata(PositionProvider, original).start.line == target_line and isinstance(updated.value, cst.Tuple):
                    return updated.with_changes(value=setter.rewrite_tuple(updated.value))
                return updated

        new = wrapper.visit(A())
    if setter.hits != 1:
        raise LookupError(f"could not rewrite grid axis {axis} of the launch at line {line}")
    return new.code


def _last_assign_line(source: str, name: str, before: int) -> int:
    import ast

    best = -1
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and node.lineno < before and isinstance(node.value, ast.Tuple) \
                and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            best = max(best, node.lineno)
    return best
