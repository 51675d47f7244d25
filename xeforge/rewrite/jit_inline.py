"""A kernel's calls of its file's ``@triton.jit`` helpers, inlined into the kernel's own body.

Owns :func:`inline_helpers`. Tactics read a kernel's own statements: a K loop and its ``tl.dot`` inside a helper
(the tutorial attention's ``_attn_fwd_inner``) is out of their reach. Inlining makes it the kernel's, with the
same code the host-side inliner (:func:`xeforge.rewrite.fusion.inline.inline_body`) writes: parameters passed a plain
name or a constant are that name (a ``tl.constexpr`` stays one), other arguments are evaluated once into a local,
the helper's locals are renamed away from the kernel's names, and its value (``return acc, l_i, m_i``, its last
statement) replaces the call. Each call site gets its own copy; the helper stays defined for other callers, or is
removed when nothing names it any more.

Refused, naming the helper and why: a call inside a larger expression than ``x = h(...)`` / ``a, b = h(...)`` /
``h(...)`` (where its statements would run in another order), a helper that returns before its end or takes
``*args``, a helper that calls itself.
"""

from __future__ import annotations

from typing import Callable

import libcst as cst

from xeforge.rewrite import NotApplicable
from xeforge.rewrite.cst_tools import code, dotted, names_in, walk
from xeforge.rewrite.fusion.inline import (Callee, CallSites, ReplaceStatement, SwapNode, bound_names,
                                           drop_unreferenced, inline_body, param_list)

#: calls inlined into one kernel at most (a helper calling a helper is one call per level)
MAX_INLINES = 8


def _jit_defs(module: cst.Module) -> dict[str, cst.FunctionDef]:
    out = {}
    for node in module.body:
        if isinstance(node, cst.FunctionDef):
            decs = [dotted(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator) or ""
                    for d in node.decorators]
            if any(d in ("triton.jit", "jit") for d in decs):
                out[node.name.value] = node
    return out


def _statement_call(stmt: cst.SimpleStatementLine, helpers: set[str]) -> cst.Call | None:
    """The helper call ``stmt`` makes as its whole value (``h(...)``, ``x = h(...)``, ``a, b = h(...)``); None when
    it makes none; NotApplicable for one inside a larger expression."""
    calls = [n for n in walk(stmt) if isinstance(n, cst.Call) and dotted(n.func) in helpers]
    if not calls:
        return None
    s = stmt.body[0] if len(stmt.body) == 1 else None
    if isinstance(s, (cst.Expr, cst.Assign)) and len(calls) == 1 and s.value is calls[0]:
        return calls[0]
    raise NotApplicable(f"the call of {dotted(calls[0].func)} is part of a larger expression "
                        f"({code(stmt).strip()[:60]}); it is inlined only as a statement of its own")


def _inline_one(source: str, kernel: str, want: Callable[[cst.FunctionDef], bool]) -> tuple[str, str] | None:
    """The first selected helper call of ``kernel`` inlined: (new source, the helper's name), or None."""
    parsed = CallSites.of(source)
    module = parsed.parsed.module
    jit = _jit_defs(module)
    fn = jit.get(kernel)
    if fn is None:
        raise NotApplicable(f"no @triton.jit function {kernel}")
    helpers = {name for name, h in jit.items() if name != kernel and want(h)}
    found: list[tuple[cst.SimpleStatementLine, cst.Call]] = []
    for n in walk(fn.body):
        if isinstance(n, cst.SimpleStatementLine) and not found:
            call = _statement_call(n, helpers)
            if call is not None:
                found.append((n, call))
    if not found:
        return None
    stmt, call = found[0]
    name = dotted(call.func)
    helper = jit[name]
    if name in names_in(helper.body):
        raise NotApplicable(f"the jit helper {name} calls itself")
    bound, read = bound_names(code(fn.with_changes(decorators=[])))
    taken = bound | read | {p.name.value for p in param_list(fn)} | set(jit) | set(parsed.functions) | set(parsed.classes)
    try:
        inl = inline_body(Callee(helper, f"the jit helper {name}", None, defined=name), call, parsed, taken, bound)
    except NotApplicable as exc:
        raise NotApplicable(f"the jit helper {name} (line {parsed.line(call)}) cannot be inlined into {kernel}: "
                            f"{exc}") from None
    if inl.guarded:
        raise NotApplicable(f"the jit helper {name} returns before its end: it cannot be inlined into {kernel}")
    s = stmt.body[0]
    if isinstance(s, cst.Expr):
        new = list(inl.stmts)
    elif inl.ret is None:
        raise NotApplicable(f"the jit helper {name} returns nothing, and line {parsed.line(call)} assigns its value")
    else:
        new = [*inl.stmts, stmt.visit(SwapNode(call, inl.ret))]
    comment = cst.EmptyLine(comment=cst.Comment(f"# {name}(...), inlined (xeforge)"))
    new[0] = new[0].with_changes(leading_lines=[*stmt.leading_lines, comment, *new[0].leading_lines])
    return module.visit(ReplaceStatement(stmt, new)).code, name


def inline_helpers(source: str, kernel: str, want: Callable[[cst.FunctionDef], bool] = lambda h: True
                   ) -> tuple[str, list[str]]:
    """``source`` with every call ``kernel`` makes of a jit helper that ``want`` selects inlined (and the helpers
    those bring in), and a note per helper; ``(source, [])`` when it calls none. Raises :class:`NotApplicable`
    naming the helper and the construct."""
    names: list[str] = []
    for _ in range(MAX_INLINES):
        step = _inline_one(source, kernel, want)
        if step is None:
            break
        source, name = step
        names += [name] if name not in names else []
    else:
        if _inline_one(source, kernel, want) is not None:
            raise NotApplicable(f"{kernel} still calls jit helpers after {MAX_INLINES} inlined calls")
    notes = [f"the jit helper {n} inlined into {kernel}" for n in names]
    return (drop_unreferenced(source, set(names)) if names else source), notes
