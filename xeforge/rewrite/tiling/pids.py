"""Program ids read inline, hoisted to names at the top of the kernel.

Owns :func:`hoist_program_ids`. Real kernels often read the program id where they use it
(``rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)``). The rewrites that remap program ids (split-K, the
grouped tile order, the persistent loop, row batching) need one ``pid = tl.program_id(axis)`` assignment at the top
of the kernel to remap. This rewrite gives them one: each inline ``tl.program_id(<literal axis>)`` of a launched
kernel becomes a fresh name (``pid_0``), assigned once at the top of the body, after the docstring. It changes no
value: a program id is the same wherever the kernel reads it. Applying it twice changes nothing more. A persistent
kernel (one that calls ``tl.num_programs``) is left as it is: its tile loop starts at an inline program id.
"""

from __future__ import annotations

import ast

import libcst as cst

from xeforge.analysis.launches import carry_seen, live_launches
from xeforge.kernel_model import dotted_name, is_literal, literal, parse_kernel
from xeforge.rewrite.cst_tools import statements
from xeforge.rewrite.tiling import NotApplicable, _assign_counts, _kw, is_tl_call
from xeforge.rewrite.tiling.edit import FunctionEdit, edit_function
from xeforge.rewrite.tiling.grid import fresh_name, program_id_vars


def hoist_program_ids(source: str) -> str:
    """``source`` with the inline ``tl.program_id(axis)`` calls of every kernel it launches (that runs, where
    traced) read from names assigned at the top of the kernel (the source as it was where there are none, or an axis
    is not a literal); what the traces saw of ``source`` is kept for the result."""
    original = source
    model = parse_kernel(source)
    for kernel in dict.fromkeys(s.kernel for s in live_launches(model)):
        fn = model.functions.get(kernel)
        if fn is None:
            continue
        pids, inline = program_id_vars(fn.node)
        axes = [literal(_kw(c, "axis", 0)) for c in inline]
        if not inline or not all(is_literal(a) and isinstance(a, int) for a in axes) or \
                any(is_tl_call(n, "num_programs") for n in ast.walk(fn.node)):
            continue  # a persistent kernel's tile loop starts at tl.program_id(0): the rewrites read that form
        taken = {n.id for n in ast.walk(fn.node) if isinstance(n, ast.Name)} | set(fn.params)
        counts = _assign_counts(fn.node)  # an axis already named, and never reassigned: that name is reused
        names: dict[int, str] = {p.axis: p.name for p in pids if not p.cast and counts.get(p.name, 0) == 1}
        new: dict[int, str] = {}
        for a in sorted(set(axes)):
            if a not in names:
                names[a] = new[a] = fresh_name(taken, f"pid_{a}")
                taken.add(names[a])
        edit = FunctionEdit(kernel)
        for call, a in zip(inline, axes):
            edit.calls[(call.lineno, call.col_offset, dotted_name(call.func))] = lambda _c, n=names[a]: cst.Name(n)

        def body(original, updated, line_of, new=new):
            first = 1 if updated and _is_docstring(updated[0]) else 0
            head = statements("\n".join(f"{n} = tl.program_id({a})" for a, n in sorted(new.items())))
            return [*updated[:first], *head, *updated[first:]] if head else updated

        edit.body = body
        try:
            source = edit_function(source, edit)
        except NotApplicable:  # a call the edit cannot address (non-ASCII before it): the kernel stays as written
            continue
        model = parse_kernel(source)
    carry_seen(original, source)  # the same launches: what the traces saw (which kernels run) still holds
    return source


def _is_docstring(st: cst.BaseStatement) -> bool:
    return isinstance(st, cst.SimpleStatementLine) and len(st.body) == 1 and isinstance(st.body[0], cst.Expr) \
        and isinstance(st.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
