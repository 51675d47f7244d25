"""Swap-AB: a GEMM computes its tile transposed, so that the N dimension fills the matrix unit's M side.

Owns :func:`swap_ab`, and :func:`swapped_branch`, which gives one branch of a per-shape dispatch a swapped copy of
the kernel (the small-M class gets it, the other shapes keep the kernel as it is). At decode-sized M (1-64 rows) a ``[BM, BN]`` tile with ``BM = 16`` leaves most of a Hopper
warpgroup MMA idle (``wgmma`` is 64 rows deep) and falls back to ``mma.sync``; on Intel's DPAS the M side is the
systolic depth (8) and the N side the SIMD width, the same asymmetry. Computing ``C^T = B^T A^T`` puts BN (128, say)
on the MMA's M side and the few rows on its N side, which may be as small as 8: the serving libraries' ``swap_ab``
GEMMs. The rewrite keeps every load as it is and changes three statements of the kernel:

- the accumulator ``acc = tl.zeros((BM, BN), ...)`` becomes ``tl.zeros((BN, BM), ...)``;
- its K-loop update ``acc += tl.dot(a, b)`` (or ``acc = tl.dot(a, b, acc)``, ``acc = acc + tl.dot(a, b)``) becomes
  ``acc += tl.dot(tl.trans(b), tl.trans(a))``, keyword arguments kept;
- right after the K loop ``acc = tl.trans(acc)``, so the epilogue and the store see the tile as before.

Applies to a kernel with one K loop accumulating ``tl.dot`` into one ``tl.zeros`` tile in one of those three forms
(a rescaled accumulator, flash attention's ``acc * alpha[:, None]``, would not survive the transpose); otherwise
:class:`NotApplicable` names what stops it. Whether it wins is the GPU's to say (gate 3 over every timed shape): a
candidate, not a rule; the per-shape dispatch may then keep it for the small-M class only.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from xeforge.rewrite import NotApplicable
from xeforge.rewrite.device_tuning.branch_copy import branch_copy
from xeforge.rewrite.cst_tools import call_name, code, expr, is_tl, names_in, small, statements, walk
from xeforge.rewrite.device_tuning.epilogue import one_k_loop, zeros_shape


@dataclass(frozen=True)
class SwapPlan:
    kernel: str
    acc: str
    shape: tuple[str, str]  # the accumulator's (rows, cols) as written

    def describe(self) -> str:
        return (f"{self.kernel}: the tile computed transposed, acc[{self.shape[1]}, {self.shape[0]}] += "
                f"dot(trans(b), trans(a)), transposed back after the K loop (N on the MMA's M side: swap-AB for "
                "few rows)")


def _plain_update(stmt: cst.CSTNode, acc: str, dot: cst.Call) -> bool:
    """``acc += tl.dot(a, b)``, ``acc = tl.dot(a, b, acc)`` or ``acc = acc + tl.dot(a, b)`` (keywords allowed)."""
    s = small(stmt)
    if isinstance(s, cst.AugAssign) and isinstance(s.operator, cst.AddAssign):
        return s.value is dot
    if not (isinstance(s, cst.Assign) and len(s.targets) == 1):
        return False
    v = s.value
    if v is dot:
        pos = [a for a in dot.args if a.keyword is None]
        return len(pos) == 3 and isinstance(pos[2].value, cst.Name) and pos[2].value.value == acc
    return isinstance(v, cst.BinaryOperation) and isinstance(v.operator, cst.Add) and (
        (isinstance(v.left, cst.Name) and v.left.value == acc and v.right is dot)
        or (isinstance(v.right, cst.Name) and v.right.value == acc and v.left is dot))


def _swapped_dot(call: cst.Call) -> cst.Call:
    pos = [a for a in call.args if a.keyword is None]
    if len(pos) < 2:
        raise NotApplicable(f"`{code(call)}` does not pass both operands positionally")
    a, b = pos[0], pos[1]
    trans = lambda x: expr(f"tl.trans({code(x.value)})")  # noqa: E731
    args = list(call.args)
    args[args.index(a)] = a.with_changes(value=trans(b))
    args[args.index(b)] = b.with_changes(value=trans(a))
    return call.with_changes(args=args)


class _Swap(cst.CSTTransformer):
    def __init__(self, acc: str, loop: cst.For, init: cst.CSTNode) -> None:
        self.acc, self.loop, self.init = acc, loop, init
        self.in_loop = 0
        self.dots = 0

    def visit_For(self, node: cst.For) -> None:
        self.in_loop += node is self.loop

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if self.in_loop and is_tl(call_name(original), "dot"):
            self.dots += 1
            return _swapped_dot(updated)
        return updated

    def leave_SimpleStatementLine(self, original, updated):
        if original is self.init:
            call, shape = zeros_shape(updated, self.acc)
            els = list(shape.elements)
            new_shape = shape.with_changes(elements=[els[0].with_changes(value=els[1].value),
                                                     els[1].with_changes(value=els[0].value)])
            new_call = call.with_changes(args=[call.args[0].with_changes(value=new_shape), *call.args[1:]])
            return updated.deep_replace(call, new_call)
        return updated

    def leave_For(self, original: cst.For, updated: cst.For):
        if original is self.loop:
            self.in_loop -= 1
            return cst.FlattenSentinel([updated, *statements(f"{self.acc} = tl.trans({self.acc})")])
        return updated


def swap_ab(source: str, kernel: str) -> tuple[str, SwapPlan]:
    parsed, fn, loop, acc = one_k_loop(source, kernel, "swap-AB")
    # the block the K loop is a statement of (the kernel's body, or a persistent kernel's tile loop)
    block = next((b for b in walk(fn) if isinstance(b, cst.IndentedBlock) and any(st is loop for st in b.body)), None)
    inits = [s for s in (block.body if block is not None else []) if zeros_shape(s, acc)]
    if len(inits) != 1:
        raise NotApplicable(f"{kernel}: {acc} is not made once by tl.zeros((BM, BN), ...) in the K loop's block")
    dots = [n for n in walk(loop.body) if isinstance(n, cst.Call) and is_tl(call_name(n), "dot")]
    if len(dots) != 1:
        raise NotApplicable(f"{kernel}: the K loop has {len(dots)} tl.dot calls (swap-AB rewrites one)")
    uses = [s for s in walk(loop.body) if isinstance(s, cst.SimpleStatementLine) and acc in names_in(s)]
    if len(uses) != 1 or not _plain_update(uses[0], acc, dots[0]):
        raise NotApplicable(f"{kernel}: the K loop reads {acc} outside a plain tl.dot update (rescaled, masked ...: "
                            "a row-wise factor would not survive the transpose)")
    if list(block.body).index(inits[0]) > list(block.body).index(loop):
        raise NotApplicable(f"{kernel}: the K loop comes before {acc}'s tl.zeros")
    shape = tuple(code(e.value) for e in zeros_shape(inits[0], acc)[1].elements)
    tr = _Swap(acc, loop, inits[0])
    new = parsed.module.visit(tr)
    if tr.dots != 1:
        raise NotApplicable(f"{kernel}: the tl.dot update was not rewritten")
    return new.code, SwapPlan(kernel, acc, shape)


def swapped_branch(dispatched: str, original: str, kernel: str, test: str) -> str:
    """``dispatched`` (a per-shape dispatch of ``kernel``) with the branch under ``if <test>:`` launching a swap-AB
    copy of the kernel (``<kernel>_swapab``, made from ``original``'s and placed right after it); the other branches
    keep the kernel as it is. NotApplicable where the kernel cannot be swapped or the branch is not found."""
    return branch_copy(dispatched, swap_ab(original, kernel)[0], kernel, "_swapab", test)
