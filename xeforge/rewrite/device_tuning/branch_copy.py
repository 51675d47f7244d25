"""One branch of a per-shape dispatch launching a rewritten copy of the kernel.

Owns :func:`branch_copy`: given a dispatch of ``kernel`` (:func:`xeforge.rewrite.tiling.dispatch.dispatch`) and a
source in which ``kernel`` was rewritten (swap-AB, the GEMV form), the launch under ``if <test>:`` launches a copy
(``<kernel><suffix>``, placed right after the kernel) and every other branch keeps the kernel as it is. Used by
:mod:`~xeforge.rewrite.device_tuning.swap_ab` and :mod:`~xeforge.rewrite.device_tuning.gemv`.
"""

from __future__ import annotations

import libcst as cst

from xeforge.rewrite import NotApplicable
from xeforge.rewrite.cst_tools import code, function_copy


class _BranchLaunch(cst.CSTTransformer):
    """In the ``if`` whose test is ``test``: its launch of ``kernel`` launches ``copy`` instead."""

    def __init__(self, test: str, kernel: str, copy: str) -> None:
        self.test, self.kernel, self.copy, self.done = test, kernel, copy, 0

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
        if code(original.test) != self.test:
            return updated
        rename = _Rename(self.kernel, self.copy, self)
        body = updated.body.with_changes(body=[s.visit(rename) for s in updated.body.body])
        return updated.with_changes(body=body)


class _Rename(cst.CSTTransformer):
    def __init__(self, old: str, new: str, owner: _BranchLaunch) -> None:
        self.old, self.new, self.owner = old, new, owner

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.Subscript:
        if isinstance(updated.value, cst.Name) and updated.value.value == self.old:
            self.owner.done += 1
            return updated.with_changes(value=cst.Name(self.new))
        return updated


def branch_copy(dispatched: str, rewritten: str, kernel: str, suffix: str, test: str) -> str:
    """``dispatched`` with the branch under ``if <test>:`` launching ``<kernel><suffix>``: ``rewritten``'s
    ``kernel`` renamed, placed right after the kernel. NotApplicable where the branch or the kernel is not found,
    or the copy's name is taken."""
    copy = f"{kernel}{suffix}"
    try:
        fn = function_copy(rewritten, kernel, copy)
    except LookupError as exc:
        raise NotApplicable(str(exc)) from None
    tr = _BranchLaunch(test, kernel, copy)
    module = cst.parse_module(dispatched).visit(tr)
    if tr.done != 1:
        raise NotApplicable(f"no single launch of {kernel} under `if {test}:`")
    body = list(module.body)
    at = next((i for i, st in enumerate(body) if isinstance(st, cst.FunctionDef) and st.name.value == kernel), None)
    if at is None or any(isinstance(st, cst.FunctionDef) and st.name.value == copy for st in body):
        raise NotApplicable(f"{kernel} is not a top-level function, or {copy} exists already")
    body.insert(at + 1, fn)
    return module.with_changes(body=body).code
