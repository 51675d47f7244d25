"""libcst plumbing for the dtype and fusion rewrites: edits addressed by line, formatting and comments kept.

Owns: parsing with positions, statement replacement/deletion/insertion by the statement's first line,
launch-call edits by line, adding parameters to a ``@triton.jit`` function, removing a function, renaming
plain names (never attributes, keywords or parameters), and small expression helpers.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

_EMPTY = cst.Module(body=[])


def code(node: cst.CSTNode) -> str:
    """Source text of ``node``."""
    return _EMPTY.code_for_node(node)


def expr(text: str) -> cst.BaseExpression:
    return cst.parse_expression(text)


def statements(text: str) -> list[cst.BaseStatement]:
    """Statements parsed from ``text`` (dedented); ready to drop into any indented block.

    Leading comment lines stay attached to the first statement (libcst would make them a module header).
    """
    module = cst.parse_module(textwrap.dedent(text).strip("\n") + "\n")
    body = list(module.body)
    if body and module.header:
        body[0] = body[0].with_changes(leading_lines=[*module.header, *body[0].leading_lines])
    return body


def dotted(node: cst.CSTNode | None) -> str | None:
    """``tl.load`` for the expression ``tl.load``; None for anything that is not a dotted name."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if isinstance(node, cst.Name):
        parts.append(node.value)
        return ".".join(reversed(parts))
    return None


def call_name(node: cst.CSTNode) -> str | None:
    return dotted(node.func) if isinstance(node, cst.Call) else None


def is_tl(name: str | None, *attrs: str) -> bool:
    """``tl.<attr>`` or ``triton.language.<attr>`` for one of ``attrs``."""
    if not name:
        return False
    for a in attrs:
        if name in (f"tl.{a}", f"triton.language.{a}"):
            return True
    return False


def arg(call: cst.Call, pos: int, kw: str | None = None) -> cst.BaseExpression | None:
    """The argument at position ``pos`` or keyword ``kw``."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if kw is not None:
        for a in call.args:
            if a.keyword is not None and a.keyword.value == kw:
                return a.value
    if 0 <= pos < len(positional):
        return positional[pos].value
    return None


def plain_names(node: cst.CSTNode) -> list[cst.Name]:
    """Every plain name read or written in ``node``, in order (attribute names and keywords excluded)."""
    found: list[cst.Name] = []

    class V(cst.CSTVisitor):
        def visit_Attribute(self, n: cst.Attribute) -> bool:
            n.value.visit(self)
            return False

        def visit_Arg(self, n: cst.Arg) -> bool:
            n.value.visit(self)
            return False

        def visit_Name(self, n: cst.Name) -> None:
            found.append(n)

    node.visit(V())
    return found


def names_in(node: cst.CSTNode) -> set[str]:
    """Plain names read or written in ``node`` (attribute names and keywords excluded)."""
    return {n.value for n in plain_names(node)}


class Renamer(cst.CSTTransformer):
    """Rename plain names (a ``str`` in the mapping) or replace them by an expression (a node); attribute names,
    call keywords, parameters, definition names and import names keep their spelling."""

    def __init__(self, mapping: dict[str, str | cst.BaseExpression]) -> None:
        super().__init__()
        self.mapping = mapping

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        new = self.mapping.get(updated.value)
        if not new:
            return updated
        return updated.with_changes(value=new) if isinstance(new, str) else new

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)

    def leave_Param(self, original: cst.Param, updated: cst.Param) -> cst.Param:
        return updated.with_changes(name=original.name)

    def leave_ImportAlias(self, original: cst.ImportAlias, updated: cst.ImportAlias) -> cst.ImportAlias:
        return original

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        return updated.with_changes(name=original.name)


def rename(node: cst.CSTNode, mapping: dict[str, str | cst.BaseExpression]) -> cst.CSTNode:
    return node.visit(Renamer(mapping)) if mapping else node


class Substitute(cst.CSTTransformer):
    """Replace every sub-expression for which ``fn`` returns a node (checked bottom-up on the original)."""

    def __init__(self, fn: Callable[[cst.CSTNode], cst.BaseExpression | None]) -> None:
        super().__init__()
        self.fn = fn
        self.hits = 0

    def on_leave(self, original, updated):  # type: ignore[override]
        if isinstance(original, cst.BaseExpression):
            new = self.fn(original)
            if new is not None:
                self.hits += 1
                return new
        return updated


# ------------------------------------------------------------------------------------------------ parsing
@dataclass
class Parsed:
    """A module with the start line of each node."""

    module: cst.Module
    lines: dict[cst.CSTNode, int]

    @classmethod
    def of(cls, source: str) -> "Parsed":
        wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
        pos = wrapper.resolve(PositionProvider)
        return cls(wrapper.module, {n: p.start.line for n, p in pos.items()})

    def line(self, node: cst.CSTNode) -> int:
        return self.lines.get(node, -1)

    def function(self, name: str) -> cst.FunctionDef | None:
        for node in self.module.body:
            if isinstance(node, cst.FunctionDef) and node.name.value == name:
                return node
        return None

    def method(self, cls: str, name: str) -> cst.FunctionDef | None:
        for node in self.module.body:
            if isinstance(node, cst.ClassDef) and node.name.value == cls:
                for item in node.body.body:
                    if isinstance(item, cst.FunctionDef) and item.name.value == name:
                        return item
        return None


def function_copy(source: str, name: str, copy: str) -> cst.FunctionDef:
    """Top-level function ``name`` of ``source`` renamed ``copy``, with two blank lines before it (a kernel's copy
    to place beside it); LookupError when ``source`` has no such function."""
    fn = Parsed.of(source).function(name)
    if fn is None:
        raise LookupError(f"{name} is not a top-level function")
    return fn.with_changes(name=cst.Name(copy), leading_lines=[cst.EmptyLine(), cst.EmptyLine()])


def place_copies(source: str, kernel: str, copies: list[cst.FunctionDef], keep: bool) -> str:
    """``source`` with ``copies`` (new kernels: a split copy and its second kernel) right after top-level function
    ``kernel``; without ``keep`` they take its place (nothing launches it any more). LookupError when ``kernel`` is
    not there or a copy's name is taken."""
    module = cst.parse_module(source)
    body = list(module.body)
    names = {c.name.value for c in copies}
    taken = [st.name.value for st in body if isinstance(st, cst.FunctionDef) and st.name.value in names]
    if taken:
        raise LookupError(f"the file already defines {', '.join(taken)}")
    at = next((i for i, st in enumerate(body) if isinstance(st, cst.FunctionDef) and st.name.value == kernel), None)
    if at is None:
        raise LookupError(f"{kernel} is not a top-level function")
    body[at:at + 1] = [body[at], *copies] if keep else [
        copies[0].with_changes(leading_lines=body[at].leading_lines), *copies[1:]]
    return module.with_changes(body=body).code


def branch_block(block: list[str], when: str | None, original: str) -> list[str]:
    """``block`` (host statements) under ``if <when>:`` with ``original`` in the ``else``; ``block`` as it is
    without ``when``."""
    if when is None:
        return block
    return [f"if {when}:", *("    " + ln for b in block for ln in b.splitlines()), "else:",
            *("    " + ln for ln in original.splitlines())]


def body_statements(fn: cst.FunctionDef) -> Sequence[cst.BaseStatement]:
    return fn.body.body if isinstance(fn.body, cst.IndentedBlock) else ()


def small(stmt: cst.CSTNode) -> cst.BaseSmallStatement | None:
    """The single small statement of a simple statement line (None for compound or multi-statement lines)."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        return stmt.body[0]
    return None


def walk(node: cst.CSTNode, skip: tuple[type, ...] = ()) -> Iterable[cst.CSTNode]:
    """``node`` and every node under it (pre-order); a node of a ``skip`` type (``node`` itself too) is yielded,
    not entered (nested definitions keep their own returns and names)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if not isinstance(n, skip):
            stack.extend(reversed(list(n.children)))


# ------------------------------------------------------------------------------------------------ edits
@dataclass
class Edits:
    """Edits addressed by the first line of a statement or call in the *original* source; applied in one pass.

    ``replace[line]``: statements that replace the statement starting at ``line`` (an empty list deletes it;
    its comment lines move to the next statement). ``insert_after[line]``: statements added after it.
    ``calls[line]``: a function that rewrites the launch call ``kernel[grid](...)`` on that line.
    ``plain_calls[line]``: the same for a ``torch.*`` call (an allocation) on that line.
    ``tuples[line]``: rewrites a tuple display (a launch grid) on that line.
    ``params[fn]``: parameters added to function ``fn`` before its first ``tl.constexpr`` parameter.
    ``autotune[fn]``: a function that rewrites the ``@triton.autotune(...)`` decorator call of function ``fn``.
    ``remove_functions``: top-level functions deleted.
    """

    replace: dict[int, list[cst.BaseStatement]] = field(default_factory=dict)
    insert_after: dict[int, list[cst.BaseStatement]] = field(default_factory=dict)
    calls: dict[int, Callable[[cst.Call], cst.Call]] = field(default_factory=dict)
    plain_calls: dict[int, Callable[[cst.Call], cst.Call]] = field(default_factory=dict)
    tuples: dict[int, Callable[[cst.Tuple], cst.Tuple | None]] = field(default_factory=dict)
    params: dict[str, list[str]] = field(default_factory=dict)
    autotune: dict[str, Callable[[cst.Call], cst.Call]] = field(default_factory=dict)
    remove_functions: set[str] = field(default_factory=set)


class _Apply(cst.CSTTransformer):
    def __init__(self, parsed: Parsed, edits: Edits) -> None:
        super().__init__()
        self.p = parsed
        self.e = edits
        self.done: set[str] = set()

    def _block(self, original_body, updated_body):
        out: list = []
        carry = None  # leading comment lines of a deleted statement
        for orig, upd in zip(original_body, updated_body):
            line = self.p.line(orig)
            if line in self.e.replace:
                self.done.add(f"replace:{line}")
                new = list(self.e.replace[line])
                lead = list(getattr(upd, "leading_lines", ()))
                if new:
                    first = new[0]
                    new[0] = first.with_changes(leading_lines=[*lead, *getattr(first, "leading_lines", ())])
                    out.extend(new)
                else:
                    carry = [*(carry or []), *[ln for ln in lead if ln.comment is not None]]
                    if not carry:
                        carry = None
            else:
                if carry and hasattr(upd, "leading_lines"):
                    upd = upd.with_changes(leading_lines=[*carry, *upd.leading_lines])
                    carry = None
                out.append(upd)
            if line in self.e.insert_after:
                self.done.add(f"insert:{line}")
                out.extend(self.e.insert_after[line])
        return out

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        body = self._block(original.body, updated.body)
        if not body:
            body = [cst.SimpleStatementLine([cst.Pass()])]
        return updated.with_changes(body=body)

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        origs, upds = [], []
        for orig, upd in zip(original.body, updated.body):
            if isinstance(orig, cst.FunctionDef) and orig.name.value in self.e.remove_functions:
                self.done.add(f"remove:{orig.name.value}")
                continue
            origs.append(orig)
            upds.append(upd)
        return updated.with_changes(body=self._block(origs, upds))

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        line = self.p.line(original)
        fn = self.e.calls.get(line)
        if fn is not None and isinstance(original.func, cst.Subscript):
            self.done.add(f"call:{line}")
            return fn(updated)
        fn = self.e.plain_calls.get(line)
        if fn is not None and (dotted(original.func) or "").startswith("torch."):
            self.done.add(f"plain:{line}")
            return fn(updated)
        return updated

    def leave_Tuple(self, original: cst.Tuple, updated: cst.Tuple) -> cst.BaseExpression:
        line = self.p.line(original)
        fn = self.e.tuples.get(line)
        if fn is not None and f"tuple:{line}" not in self.done:
            new = fn(updated)  # None: not the tuple meant
            if new is not None:
                self.done.add(f"tuple:{line}")
                return new
        return updated

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        name = original.name.value
        tune = self.e.autotune.get(name)
        if tune is not None:
            decs = list(updated.decorators)
            for i, d in enumerate(decs):
                if isinstance(d.decorator, cst.Call) and (dotted(d.decorator.func) or "").rsplit(".", 1)[-1] == "autotune":
                    decs[i] = d.with_changes(decorator=tune(d.decorator))
                    self.done.add(f"autotune:{name}")
            updated = updated.with_changes(decorators=decs)
        new = self.e.params.get(name)
        if not new:
            return updated
        self.done.add(f"params:{name}")
        return updated.with_changes(params=add_params(updated.params, new))


def apply_edits(source: str, edits: Edits, parsed: Parsed | None = None) -> str:
    """Apply ``edits`` to ``source``. Raises LookupError when an edit's target was not found."""
    parsed = parsed or Parsed.of(source)
    tr = _Apply(parsed, edits)
    new = parsed.module.visit(tr)
    wanted = ({f"replace:{k}" for k in edits.replace} | {f"insert:{k}" for k in edits.insert_after}
              | {f"call:{k}" for k in edits.calls} | {f"plain:{k}" for k in edits.plain_calls}
              | {f"tuple:{k}" for k in edits.tuples} | {f"params:{k}" for k in edits.params if edits.params[k]}
              | {f"remove:{k}" for k in edits.remove_functions} | {f"autotune:{k}" for k in edits.autotune})
    missing = wanted - tr.done
    if missing:
        raise LookupError(f"rewrite targets not found: {', '.join(sorted(missing))}")
    return new.code


def _is_constexpr(p: cst.Param) -> bool:
    return p.annotation is not None and (dotted(p.annotation.annotation) or "").endswith("constexpr")


#: line width for wrapping added parameters and arguments
WRAP = 88


def _width(node: cst.Param | cst.Arg) -> int:
    if isinstance(node, cst.Param):
        return len(node.name.value) + 2
    return len(node.keyword.value if node.keyword else "") + len(code(node.value)) + 3


def _breaks_line(comma: cst.Comma | cst.MaybeSentinel) -> bool:
    return isinstance(comma, cst.Comma) and isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace)


def _insert_after(items: list, at: int, new: list) -> list:
    """Insert ``new`` (Param/Arg nodes) at ``at``; on their own line when the list breaks lines there."""
    ws = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    new = [n.with_changes(comma=ws) for n in new]
    if not new:
        return items
    if at == 0:
        return [*new, *items]
    prev = items[at - 1]
    if at == len(items) and at >= 2 and _breaks_line(prev.comma) and _breaks_line(items[at - 2].comma):
        # one item a line with a trailing comma before the closing bracket's line: the new items take the
        # separator between items (their indentation), the last one the closing layout
        sep = items[at - 2].comma
        new = [n.with_changes(comma=sep) for n in new]
        new[-1] = new[-1].with_changes(comma=prev.comma)
        return [*items[:-1], prev.with_changes(comma=sep), *new]
    if _breaks_line(prev.comma):
        # new lines with the same break and indentation as prev's, wrapped at about WRAP characters
        width = 0
        for i, n in enumerate(new):
            width += _width(n)
            nxt = _width(new[i + 1]) if i + 1 < len(new) else 0
            if i + 1 == len(new) or width + nxt > WRAP:
                new[i] = n.with_changes(comma=prev.comma)
                width = 0
    elif at == len(items):
        if prev.comma is cst.MaybeSentinel.DEFAULT:
            items = [*items[:-1], prev.with_changes(comma=ws)]
        new[-1] = new[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return [*items[:at], *new, *items[at:]]


def add_params(params: cst.Parameters, names: list[str]) -> cst.Parameters:
    """``params`` with ``names`` added: runtime ones after the last runtime parameter (before the first constexpr
    one), ``"NAME: tl.constexpr"`` ones at the end."""
    items = list(params.params)
    plain = [n for n in names if ":" not in n]
    annotated = [cst.Param(cst.Name(name.strip()), annotation=cst.Annotation(expr(ann.strip())))
                 for name, ann in (n.split(":", 1) for n in names if ":" in n)]
    at = next((i for i, p in enumerate(items) if _is_constexpr(p)), len(items))
    items = _insert_after(items, at, [cst.Param(cst.Name(n)) for n in plain]) if plain else items
    return params.with_changes(params=_insert_after(items, len(items), annotated) if annotated else items)


def add_to_list_kwarg(call: cst.Call, key: str, item: str) -> cst.Call:
    """``call`` with ``item`` (an expression source) appended to its list keyword ``key`` (``key=[item]`` when it has
    none); a ``key`` that is not a list display cannot be extended and raises LookupError."""
    for i, a in enumerate(call.args):
        if a.keyword is not None and a.keyword.value == key:
            if not isinstance(a.value, cst.List):
                raise LookupError(f"{key}= is not a list the rewrite can extend")
            if any((code(e.value) if isinstance(e, cst.Element) else "") == item for e in a.value.elements):
                return call
            elems = list(a.value.elements)
            if elems:
                elems[-1] = elems[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            elems.append(cst.Element(expr(item)))
            args = list(call.args)
            args[i] = a.with_changes(value=a.value.with_changes(elements=elems))
            return call.with_changes(args=args)
    args = list(call.args)
    eq = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
    arg = cst.Arg(keyword=cst.Name(key), value=expr(f"[{item}]"), equal=eq)
    if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma) and args[-1].keyword is not None:
        # before the last argument, with the separator the one before it has: a call laid out one argument a line
        # keeps its layout
        return call.with_changes(args=[*args[:-1], arg.with_changes(comma=args[-2].comma), args[-1]])
    if args:
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(args=[*args, arg])


def set_call_kwargs(call: cst.Call, kwargs: dict[str, str]) -> cst.Call:
    """``call`` with keyword arguments set to the given expression sources (replaced, or added before the
    first keyword argument so new kernel arguments sit with the others)."""
    remaining = dict(kwargs)
    args = []
    for a in call.args:
        if a.keyword is not None and a.keyword.value in remaining:
            a = a.with_changes(value=expr(remaining.pop(a.keyword.value)))
        args.append(a)
    at = next((i for i, a in enumerate(args) if a.keyword is not None or a.star), len(args))
    eq = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
    new = [cst.Arg(keyword=cst.Name(k), value=expr(v), equal=eq) for k, v in remaining.items()]
    return call.with_changes(args=_insert_after(args, at, new))
