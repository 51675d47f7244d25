"""The GEMV form of a GEMM kernel, for decode-sized M: the K loop's ``tl.dot`` as a multiply and a sum.

Owns :func:`gemv_form` (the rewrite), :func:`gemv_configs` (its tiles) and :func:`gemv_branch` (one branch of a
per-shape dispatch launching it). ``tl.dot`` needs a tile of at least 16 rows on NVIDIA GPUs (8 on Intel's DPAS),
so at M = 1 a GEMM's tile computes mostly padding and its few programs each stream a wide slice of the weight. The
form the serving libraries use for decode instead reduces with ``tl.sum``: no matrix unit, one row a program, and
more programs over N, each streaming its columns of the weight once. The rewrite changes one expression of the
kernel, the K loop's product::

    acc += tl.dot(a, b)        ->  acc += tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    acc = tl.dot(a, b, acc)    ->  acc = acc + tl.sum(...)

(``out_dtype=`` sets the type the operands are widened to; ``input_precision`` and ``allow_tf32`` have nothing left
to say), so the loads, masks, epilogue and store stay as the user wrote them and the copy is correct at every M.
Applies to a kernel whose one K loop holds its only ``tl.dot``; otherwise :class:`NotApplicable` says what stops it.
The ``[rows, BLOCK_K, BLOCK_N]`` product lives in registers: :data:`PRODUCT_ELEMENTS` bounds its size per four
warps. Whether the form wins is gate 3's to say, at every timed shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import libcst as cst

from xeforge.kernel_model import parse_kernel
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.cst_tools import arg, call_name, code, expr, is_tl, names_in, walk
from xeforge.rewrite.device_tuning.branch_copy import branch_copy
from xeforge.rewrite.device_tuning.epilogue import one_k_loop, zeros_shape

#: the copy's name: ``<kernel><SUFFIX>``
SUFFIX = "_gemv"
#: a class of at most this many rows may take the GEMV form. On an H100 (docs/measurements/gemv-probe-h100-2026-12-06)
#: one row a program won at M = 1 (1.56-1.61x over kb09's and gemm_square's dot tiles) and lost at M = 8 (0.28-0.97x):
#: each row's program streams the weight again
GEMV_ROWS = 2
#: elements of the ``[rows, BLOCK_K, BLOCK_N]`` product per 4 warps (128 fp32 registers a thread)
PRODUCT_ELEMENTS = 16384
#: the (BLOCK_N, BLOCK_K) shapes tried with one row a program, the H100's fastest at M = 1 first (64 x 256, then
#: 128 x 128; 32 x 512 not measured). Tiles of 8 rows ran 2.5-6x slower there: the product's registers
TILES = ((64, 256), (128, 128), (32, 512))
#: launch options of every configuration
OPTIONS = {"num_warps": 4, "num_stages": 3}


@dataclass(frozen=True)
class GemvPlan:
    kernel: str
    rows: str  # the block size of the tile's rows (the accumulator's first dim)
    cols: str  # ... of its columns
    depth: str | None  # the block size the K loop steps by, when a constexpr names it

    def describe(self) -> str:
        return (f"{self.kernel}{SUFFIX}: the K loop's tl.dot as tl.sum(a[:, :, None] * b[None, :, :], axis=1) in "
                "fp32, one row a program (the GEMV form for M = 1-2)")


def _operand(node: cst.BaseExpression, dtype: str) -> str:
    text = code(node)
    return f"{text}.to({dtype})" if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)) \
        else f"({text}).to({dtype})"


def _summed(call: cst.Call) -> cst.BaseExpression:
    pos = [a for a in call.args if a.keyword is None]
    if len(pos) < 2:
        raise NotApplicable(f"`{code(call)}` does not pass both operands positionally")
    out_dtype = arg(call, 6, "out_dtype")
    dtype = code(out_dtype) if out_dtype is not None else "tl.float32"
    a, b = pos[0].value, pos[1].value
    product = f"tl.sum({_operand(a, dtype)}[:, :, None] * {_operand(b, dtype)}[None, :, :], axis=1)"
    acc = arg(call, 2, "acc")
    return expr(f"{code(acc)} + {product}" if acc is not None else product)


class _Sum(cst.CSTTransformer):
    def __init__(self, loop: cst.For) -> None:
        self.loop, self.in_loop, self.done = loop, 0, 0

    def visit_For(self, node: cst.For) -> None:
        self.in_loop += node is self.loop

    def leave_For(self, original: cst.For, updated: cst.For) -> cst.For:
        self.in_loop -= original is self.loop
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if self.in_loop and is_tl(call_name(original), "dot"):
            self.done += 1
            return _summed(updated)
        return updated


def gemv_form(source: str, kernel: str) -> tuple[str, GemvPlan]:
    """``source`` with ``kernel``'s K-loop ``tl.dot`` as a multiply and a sum, and the block sizes that tile it."""
    parsed, fn, loop, acc = one_k_loop(source, kernel, "the GEMV form")
    model = parse_kernel(source)
    dots = [n for n in walk(fn) if isinstance(n, cst.Call) and is_tl(call_name(n), "dot")]
    in_loop = [n for n in walk(loop.body) if isinstance(n, cst.Call) and is_tl(call_name(n), "dot")]
    if len(in_loop) != 1 or len(dots) != 1:
        raise NotApplicable(f"{kernel} has {len(dots)} tl.dot call(s), {len(in_loop)} in its K loop: the GEMV form "
                            "rewrites a kernel whose one tl.dot is the K loop's (a tile of fewer than 16 rows "
                            "cannot reach another)")
    made = next((z for st in walk(fn) if (z := zeros_shape(st, acc))), None)
    if made is None:
        raise NotApplicable(f"{kernel}: {acc} is not made by tl.zeros((BM, BN), ...)")
    constexprs = set(model.functions[kernel].constexpr_params)
    rows, cols = (code(e.value) for e in made[1].elements)
    if rows not in constexprs or cols not in constexprs:
        raise NotApplicable(f"{kernel}: the tile ({rows}, {cols}) is not sized by constexpr block sizes")
    stepped = [n for n in names_in(loop.iter) if n in constexprs and n not in (rows, cols)]
    tr = _Sum(loop)
    new = parsed.module.visit(tr)
    if tr.done != 1:
        raise NotApplicable(f"{kernel}: the K loop's tl.dot was not rewritten")
    return new.code, GemvPlan(kernel, rows, cols, stepped[0] if len(stepped) == 1 else None)


def gemv_configs(plan: GemvPlan, current: dict[str, Any], names: set[str]) -> list[dict[str, Any]]:
    """The form's configurations: one row a program, each of :data:`TILES`' column and K tiles (the K tile only where
    a constexpr steps the K loop; otherwise the kernel's own), the rest of ``current`` kept. Only ``names`` (the
    launch's tunable block sizes and options) change."""
    out: list[dict[str, Any]] = []
    for n, k in TILES:
        cfg = {**current, plan.rows: 1, plan.cols: n}
        if plan.depth is not None:
            cfg[plan.depth] = k
        cfg.update({o: v for o, v in OPTIONS.items() if o in names})
        cfg = {key: v for key, v in cfg.items() if key in names or key in current}
        if cfg not in out:
            out.append(cfg)
    return out


def gemv_branch(dispatched: str, original: str, kernel: str, test: str) -> str:
    """``dispatched`` (a per-shape dispatch of ``kernel``) with the branch under ``if <test>:`` launching the GEMV
    form (``<kernel>_gemv``, placed right after the kernel); the other branches keep the kernel."""
    return branch_copy(dispatched, gemv_form(original, kernel)[0], kernel, SUFFIX, test)
