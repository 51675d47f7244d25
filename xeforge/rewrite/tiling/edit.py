"""libcst editing helpers shared by the structural rewrites (block I/O, persistent, swizzle, autotune, int64).

Owns: the edits that keep the user's formatting and comments while changing a kernel file's structure —
replacing calls and statements inside one ``@triton.jit`` function by position, wrapping statements, adding
a parameter to a kernel's signature, editing a launch site (grid, keyword arguments, statements inserted
before it), adding a decorator, a module-level helper function, an import, or statements after a function.
Positions come from the ``ast`` model (:mod:`xeforge.kernel_model`); kernel sources are ASCII in practice, so
``ast`` columns and libcst columns agree (a line with non-ASCII text before an edited call is refused rather than
mis-edited).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from xeforge.rewrite.cst_tools import dotted, expr, statements
from xeforge.rewrite.tiling import NotApplicable


def if_else(test: str, body: Sequence[cst.BaseStatement], orelse: Sequence[cst.BaseStatement] | None) -> cst.If:
    """``if test: body`` (``else: orelse`` when given), statements reused as they are."""
    return cst.If(
        test=expr(test),
        body=cst.IndentedBlock(body=list(body)),
        orelse=cst.Else(body=cst.IndentedBlock(body=list(orelse))) if orelse else None,
    )


@dataclass
class FunctionEdit:
    """Edits inside one function, addressed by ``ast`` positions.

    - ``calls``: (line, col, dotted func name) -> a builder ``(updated_call) -> new expression``;
    - ``remove_lines``: simple statements (by first line) to delete;
    - ``body``: a builder ``(original_body, updated_body, line_of) -> new body`` for the function's top level,
      where ``line_of(stmt)`` gives the first line of an original top-level statement;
    - ``new_params``: parameters appended to the signature (``"NAME: tl.constexpr"``).
    """

    function: str
    calls: dict[tuple[int, int, str], Callable[[cst.Call], cst.BaseExpression]] = field(default_factory=dict)
    remove_lines: set[int] = field(default_factory=set)
    body: Callable | None = None
    new_params: list[str] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)


class _FunctionEditor(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, edit: FunctionEdit) -> None:
        super().__init__()
        self.edit = edit
        self.depth = 0  # > 0 inside the target function

    def _line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if node.name.value == self.edit.function or self.depth:
            self.depth += 1
        return True

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not self.depth:
            return updated
        pos = self.get_metadata(PositionProvider, original).start
        key = (pos.line, pos.column, dotted(original.func))
        builder = self.edit.calls.get(key)
        if builder is None:
            return updated
        self.edit.hits["calls"] = self.edit.hits.get("calls", 0) + 1
        return builder(updated)

    def leave_SimpleStatementLine(self, original, updated):
        if self.depth and self._line(original) in self.edit.remove_lines:
            self.edit.hits["removed"] = self.edit.hits.get("removed", 0) + 1
            return cst.RemovalSentinel.REMOVE
        return updated

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if not self.depth:
            return updated
        self.depth -= 1
        if self.depth or original.name.value != self.edit.function:
            return updated
        self.edit.hits["function"] = 1
        if self.edit.body is not None:
            new_body = self.edit.body(list(original.body.body), list(updated.body.body), self._line)
            updated = updated.with_changes(body=updated.body.with_changes(body=new_body))
        if self.edit.new_params:
            params = list(updated.params.params)
            if updated.params.star_arg not in (cst.MaybeSentinel.DEFAULT, None) or updated.params.kwonly_params \
                    or updated.params.star_kwarg is not None:
                raise NotApplicable(f"{self.edit.function} has *args/**kwargs or keyword-only parameters")
            if params and any(p.default is not None for p in params):
                raise NotApplicable(f"{self.edit.function} has parameters with defaults")
            for spec in self.edit.new_params:
                name, _, ann = spec.partition(":")
                param = cst.Param(name=cst.Name(name.strip()),
                                  annotation=cst.Annotation(expr(ann.strip())) if ann.strip() else None)
                if params:
                    last = params[-1]
                    params[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                params.append(param)
            updated = updated.with_changes(params=updated.params.with_changes(params=params))
        return updated


def edit_function(source: str, edit: FunctionEdit) -> str:
    _ascii_guard(source, edit)
    wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
    new = wrapper.visit(_FunctionEditor(edit))
    if not edit.hits.get("function"):
        raise NotApplicable(f"function {edit.function} not found")
    want = len(edit.calls)
    if edit.hits.get("calls", 0) != want:
        raise NotApplicable(f"could not locate {want - edit.hits.get('calls', 0)} of {want} calls to rewrite "
                            f"in {edit.function}")
    return new.code


def _ascii_guard(source: str, edit: FunctionEdit) -> None:
    lines = source.splitlines()
    for (line, col, _name) in edit.calls:
        if 0 < line <= len(lines) and not lines[line - 1][:col].isascii():
            raise NotApplicable(f"line {line} has non-ASCII text before the call to rewrite")


# ------------------------------------------------------------------------------------------------ launch sites
@dataclass
class LaunchEdit:
    kernel: str
    line: int
    grid: str | None = None  # new grid expression for the launch (inline)
    grid_assign: tuple[int, str] | None = None  # (line of `grid = ...`, new value) instead of an inline grid
    set_kwargs: dict[str, str] = field(default_factory=dict)  # name -> expression source
    drop_kwargs: set[str] = field(default_factory=set)
    before: list[str] = field(default_factory=list)  # statements inserted before the launch statement
    before_line: int | None = None  # ... or before the statement at this line (e.g. the grid assignment)
    hits: dict[str, int] = field(default_factory=dict)


class _LaunchEditor(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, edit: LaunchEdit) -> None:
        super().__init__()
        self.edit = edit

    def _is_launch(self, node: cst.Call) -> bool:
        f = node.func
        return isinstance(f, cst.Subscript) and dotted(f.value) == self.edit.kernel and \
            self.get_metadata(PositionProvider, node).start.line == self.edit.line

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not self._is_launch(original):
            return updated
        self.edit.hits["launch"] = 1
        args = []
        remaining = dict(self.edit.set_kwargs)
        for arg in updated.args:
            kw = arg.keyword.value if arg.keyword is not None else None
            if kw in self.edit.drop_kwargs:
                continue
            if kw in remaining:
                arg = arg.with_changes(value=expr(remaining.pop(kw)))
            args.append(arg)
        for key, value in remaining.items():
            if args:
                args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            args.append(cst.Arg(keyword=cst.Name(key), value=expr(value),
                                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                      whitespace_after=cst.SimpleWhitespace(""))))
        if args:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        func = updated.func
        if self.edit.grid is not None:
            el = func.slice[0]
            func = func.with_changes(slice=[el.with_changes(slice=cst.Index(value=expr(self.edit.grid)))])
        return updated.with_changes(func=func, args=args)

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        ga = self.edit.grid_assign
        if ga and self.get_metadata(PositionProvider, original).start.line == ga[0]:
            self.edit.hits["grid"] = 1
            return updated.with_changes(value=expr(ga[1]))
        return updated

    def leave_SimpleStatementLine(self, original, updated):
        if not self.edit.before:
            return updated
        pos = self.get_metadata(PositionProvider, original)
        at = self.edit.before_line or self.edit.line
        if not self.edit.hits.get("before") and pos.start.line <= at <= pos.end.line and any(
                isinstance(n, cst.Expr) or isinstance(n, cst.Assign) for n in original.body):
            self.edit.hits["before"] = 1
            new = []
            for code in self.edit.before:
                new.extend(statements(code))
            if new and hasattr(updated, "leading_lines"):
                new[0] = new[0].with_changes(leading_lines=[*updated.leading_lines, *new[0].leading_lines])
                updated = updated.with_changes(leading_lines=[])
            return cst.FlattenSentinel([*new, updated])
        return updated


def edit_launch(source: str, edit: LaunchEdit) -> str:
    wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
    new = wrapper.visit(_LaunchEditor(edit))
    if not edit.hits.get("launch"):
        raise NotApplicable(f"no launch of {edit.kernel} at line {edit.line}")
    if edit.grid_assign and not edit.hits.get("grid"):
        raise NotApplicable(f"grid assignment at line {edit.grid_assign[0]} not found")
    if edit.before and not edit.hits.get("before"):
        raise NotApplicable(f"the launch of {edit.kernel} at line {edit.line} is not a plain statement")
    return new.code


# ------------------------------------------------------------------------------------------------ module level
def add_module_function(source: str, name: str, code: str) -> str:
    """Insert a module-level helper (``def name(...)``) before the first function or class, once."""
    module = cst.parse_module(source)
    for st in module.body:
        if isinstance(st, cst.FunctionDef) and st.name.value == name:
            return source
    body = list(module.body)
    idx = next((i for i, st in enumerate(body) if isinstance(st, (cst.FunctionDef, cst.ClassDef))), len(body))
    new = statements(code)
    new[0] = new[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    if idx < len(body):
        first = body[idx]
        body[idx] = first.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *[
            ln for ln in first.leading_lines if ln.comment is not None]])
    body[idx:idx] = new
    return module.with_changes(body=body).code


def add_decorator(source: str, function: str, decorator: str, outermost: bool = True) -> str:
    module = cst.parse_module(source)

    class T(cst.CSTTransformer):
        hit = False

        def leave_FunctionDef(self, original, updated):
            if original.name.value != function:
                return updated
            T.hit = True
            dec = cst.Decorator(decorator=expr(decorator))
            decs = [dec, *updated.decorators] if outermost else [*updated.decorators, dec]
            return updated.with_changes(decorators=decs)

    new = module.visit(T())
    if not T.hit:
        raise NotApplicable(f"function {function} not found")
    return new.code


def _is_decorator(dec: cst.Decorator, names: tuple[str, ...]) -> bool:
    d = dec.decorator
    return dotted(d.func if isinstance(d, cst.Call) else d) in names


def remove_decorator(source: str, function: str, names: tuple[str, ...]) -> str:
    """``source`` without the decorators of ``function`` whose dotted name is one of ``names``."""
    module = cst.parse_module(source)

    class T(cst.CSTTransformer):
        hit = False

        def leave_FunctionDef(self, original, updated):
            if original.name.value != function:
                return updated
            kept = [d for d in updated.decorators if not _is_decorator(d, names)]
            T.hit = len(kept) != len(updated.decorators)
            return updated.with_changes(decorators=kept, leading_lines=[
                *updated.leading_lines, *[ln for d in updated.decorators if _is_decorator(d, names)
                                          for ln in d.leading_lines if ln.comment is not None]])

    new = module.visit(T())
    if not T.hit:
        raise NotApplicable(f"{function} has no {' / '.join(names)} decorator")
    return new.code


def _edit_decorator_call(source: str, function: str, names: tuple[str, ...],
                         edit: Callable[[cst.Call], cst.Call | str]) -> str:
    """``source`` with the call of ``function``'s decorator named one of ``names`` replaced by ``edit(call)``;
    NotApplicable with the reason ``edit`` returns (a string) or when there is no such decorator call."""
    module = cst.parse_module(source)
    state = {"hit": False, "why": f"{function} has no {' / '.join(names)} decorator"}

    class T(cst.CSTTransformer):
        def leave_FunctionDef(self, original, updated):
            if original.name.value != function:
                return updated
            decs = list(updated.decorators)
            for i, d in enumerate(decs):
                if not (_is_decorator(d, names) and isinstance(d.decorator, cst.Call)):
                    continue
                new = edit(d.decorator)
                if isinstance(new, str):
                    state["why"] = new
                    return updated
                decs[i] = d.with_changes(decorator=new)
                state["hit"] = True
                return updated.with_changes(decorators=decs)
            return updated

    new = module.visit(T())
    if not state["hit"]:
        raise NotApplicable(state["why"])
    return new.code


def extend_decorator_list(source: str, function: str, names: tuple[str, ...], keyword: str, items: list[str]) -> str:
    """Append ``items`` (expression sources) to the list literal passed as ``keyword=`` to the decorator of
    ``function`` named one of ``names`` (``configs=[...]`` of ``@triton.autotune``)."""

    def extend(call: cst.Call) -> cst.Call | str:
        args = list(call.args)
        for j, a in enumerate(args):
            if a.keyword is None or a.keyword.value != keyword:
                continue
            if not isinstance(a.value, cst.List):
                return f"{keyword}= of {function}'s decorator is not a list literal"
            els = list(a.value.elements)
            if els and els[-1].comma is cst.MaybeSentinel.DEFAULT:
                els[-1] = els[-1].with_changes(comma=cst.Comma())
            last = els[-1] if els else None
            for code in items:
                el = cst.Element(value=expr(code), comma=cst.Comma())
                if last is not None and isinstance(last.comma, cst.Comma):
                    el = el.with_changes(comma=last.comma)
                els.append(el)
            args[j] = a.with_changes(value=a.value.with_changes(elements=els))
            return call.with_changes(args=args)
        return f"{function}'s decorator passes no {keyword}= list"

    return _edit_decorator_call(source, function, names, extend)


def rewrite_decorator_args(source: str, function: str, names: tuple[str, ...],
                           edits: dict[str, Callable[[str], str]]) -> str:
    """``source`` with keyword arguments of ``function``'s decorator named one of ``names`` rewritten: each
    ``keyword=value`` in ``edits`` becomes ``keyword=edits[keyword](<value's source>)``. NotApplicable when the
    decorator or one of the keywords is not there."""
    empty = cst.Module(body=[])

    def rewrite(call: cst.Call) -> cst.Call | str:
        args = list(call.args)
        done = set()
        for j, a in enumerate(args):
            if a.keyword is not None and a.keyword.value in edits:
                args[j] = a.with_changes(value=expr(edits[a.keyword.value](empty.code_for_node(a.value))))
                done.add(a.keyword.value)
        missing = sorted(set(edits) - done)
        if missing:
            return f"{function}'s decorator passes no {', '.join(k + '=' for k in missing)}"
        return call.with_changes(args=args)

    return _edit_decorator_call(source, function, names, rewrite)


def add_import(source: str, line: str) -> str:
    """``source`` with the import statement ``line`` after its last top-level import (first, when it has none),
    unless the module already has it."""
    module = cst.parse_module(source)
    empty = cst.Module(body=[])
    body = list(module.body)
    if any(empty.code_for_node(st).strip() == line for st in body):
        return source
    idx = 0
    for i, st in enumerate(body):
        if isinstance(st, cst.SimpleStatementLine) and \
                any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in st.body):
            idx = i + 1
    new = statements(line)
    if idx == 0 and body:
        new[-1] = new[-1].with_changes(leading_lines=[])
    body[idx:idx] = new
    return module.with_changes(body=body).code


def add_after_function(source: str, function: str, code: str) -> str:
    """``source`` with the module-level statements ``code`` right after the definition of ``function``."""
    module = cst.parse_module(source)
    body = list(module.body)
    idx = next((i for i, st in enumerate(body) if isinstance(st, cst.FunctionDef) and st.name.value == function), None)
    if idx is None:
        raise NotApplicable(f"function {function} is not defined at the module's top level")
    new = statements(code)
    new[0] = new[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    body[idx + 1:idx + 1] = new
    return module.with_changes(body=body).code


def add_before_function(source: str, function: str, code: str) -> str:
    """``source`` with the module-level statements ``code`` right before the definition of ``function`` (and its
    decorators, which may read them), unless the module already defines what ``code`` defines first."""
    module = cst.parse_module(source)
    body = list(module.body)
    new = statements(code)
    first = new[0]
    if isinstance(first, cst.FunctionDef) and any(isinstance(st, cst.FunctionDef) and st.name.value ==
                                                  first.name.value for st in body):
        return source
    idx = next((i for i, st in enumerate(body) if isinstance(st, cst.FunctionDef) and st.name.value == function), None)
    if idx is None:
        raise NotApplicable(f"function {function} is not defined at the module's top level")
    new[0] = new[0].with_changes(leading_lines=body[idx].leading_lines)
    body[idx] = body[idx].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    body[idx:idx] = new
    return module.with_changes(body=body).code


def drop_dict_entries(source: str, function: str, names: tuple[str, ...], keys: set[str]) -> str:
    """``source`` without the entries ``keys`` of the dict literal ``function``'s decorator named one of ``names``
    takes first (``@triton.heuristics({...})``), and without that decorator where no entry is left."""
    emptied = {"all": False}

    def drop(call: cst.Call) -> cst.Call | str:
        if not call.args or not isinstance(call.args[0].value, cst.Dict):
            return f"{function}'s decorator takes no dict literal"
        d = call.args[0].value
        kept = [e for e in d.elements if not (isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
                                               and e.key.evaluated_value in keys)]
        emptied["all"] = not kept
        args = [call.args[0].with_changes(value=d.with_changes(elements=kept)), *call.args[1:]]
        return call.with_changes(args=args)

    source = _edit_decorator_call(source, function, names, drop)
    return remove_decorator(source, function, names) if emptied["all"] else source
