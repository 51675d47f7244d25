"""Epilogue subtiling: a kernel's C tile stored through a tensor descriptor in two halves along N.

Owns: finding, in a ``@triton.jit`` function, a descriptor made by ``tl.make_tensor_descriptor(...,
block_shape=[BM, BN])`` that is only ever stored to (``desc.store([r, c], value)``), and rewriting it to
``block_shape=[BM, BN // 2]`` with two stores of the value's halves (``tl.reshape`` -> ``tl.permute`` ->
``tl.split``). The staging tile that a descriptor store keeps in shared memory halves with it: a 128x256 tile
whose fp32 epilogue needs 128 KB of staging fits beside three 48 KB operand stages on a 227 KB part (H200) once
the staging is 64 KB. The engine proposes it as a shared-memory refit (``engines.refit_candidates``) before it
gives up pipeline stages, which cost more than the second store does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import libcst as cst

from xeforge.kernel_model import parse_kernel
from xeforge.rewrite.context import fresh_namer
from xeforge.rewrite.cst_tools import (Edits, Parsed, apply_edits, arg, call_name, code, expr, is_tl,
                                       names_in, plain_names, small, statements, walk)


@dataclass
class _Desc:
    name: str
    assign: cst.SimpleStatementLine
    call: cst.Call
    rows: str  # BM, as written
    cols: str  # BN, as written
    stores: list[tuple[cst.SimpleStatementLine, cst.Call]]
    other_use: bool = False


def _block_shape(call: cst.Call) -> tuple[str, str] | None:
    node = arg(call, 3, "block_shape")
    if not isinstance(node, (cst.List, cst.Tuple)) or len(node.elements) != 2:
        return None
    return code(node.elements[0].value), code(node.elements[1].value)


def _descriptors(fn: cst.FunctionDef) -> dict[str, _Desc]:
    found: dict[str, _Desc] = {}
    for node in walk(fn):
        stmt = small(node) if isinstance(node, cst.SimpleStatementLine) else None
        if isinstance(stmt, cst.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0].target, cst.Name):
            value = stmt.value
            if isinstance(value, cst.Call) and is_tl(call_name(value), "make_tensor_descriptor"):
                shape = _block_shape(value)
                name = stmt.targets[0].target.value
                if shape is None or name in found:  # an odd shape, or a name made twice: leave it alone
                    found[name] = _Desc(name, node, value, "", "", [], other_use=True)
                else:
                    found[name] = _Desc(name, node, value, shape[0], shape[1], [])
    for node in walk(fn):
        stmt = small(node) if isinstance(node, cst.SimpleStatementLine) else None
        if isinstance(stmt, cst.Expr) and isinstance(stmt.value, cst.Call):
            name = call_name(stmt.value) or ""
            base, _, method = name.rpartition(".")
            if base in found and method == "store":
                found[base].stores.append((node, stmt.value))
    uses = Counter(n.value for n in plain_names(fn.body))
    for d in found.values():  # any use that is not the assignment or a store statement (a load, an argument)
        d.other_use = d.other_use or uses.get(d.name, 0) != 1 + len(d.stores)
    return found


def store_tiles(source: str, kernel: str) -> list[tuple[str, str]]:
    """The block shapes (rows, columns, as written) of ``kernel``'s store-only 2D descriptors: the C tiles the
    compiler stages through shared memory before it stores them (``[BLOCK_M, BLOCK_N // 2]`` once halved)."""
    fn = Parsed.of(source).function(kernel)
    if fn is None:
        return []
    return [(d.rows, d.cols) for d in _descriptors(fn).values() if d.stores and not d.other_use]


def subtile_stores(source: str) -> tuple[str, list[str]] | None:
    """``source`` with every store-only 2D descriptor stored in two halves along its columns.

    Returns the new source and one line per descriptor changed (``kernel: c_desc [BM, BN] -> [BM, BN // 2]``),
    or None when no kernel stores through such a descriptor (or the column block is an odd literal).
    """
    parsed = Parsed.of(source)
    jit = parse_kernel(source).functions  # the kernel model's @triton.jit functions
    edits = Edits()
    changed: list[str] = []
    for fn in parsed.module.body:
        if not (isinstance(fn, cst.FunctionDef) and fn.name.value in jit):
            continue
        fresh = fresh_namer(names_in(fn))
        for d in _descriptors(fn).values():
            if d.other_use or not d.stores:
                continue
            if d.cols.isdigit() and (int(d.cols) % 2 or int(d.cols) < 16):
                continue
            half = f"{d.cols} // 2" if d.cols.isidentifier() or d.cols.isdigit() else f"({d.cols}) // 2"
            shape = arg(d.call, 3, "block_shape")
            new_shape = shape.with_changes(elements=[shape.elements[0],
                                                     shape.elements[1].with_changes(value=expr(half))])
            new_call = d.call.deep_replace(shape, new_shape)
            edits.replace[parsed.line(d.assign)] = [d.assign.deep_replace(d.call, new_call)]
            for line_node, call in d.stores:
                coords = arg(call, 0, "offsets")
                value = arg(call, 1, "value")
                if not isinstance(coords, (cst.List, cst.Tuple)) or len(coords.elements) != 2 or value is None:
                    break
                row, col = (code(e.value) for e in coords.elements)
                both, lo, hi = (fresh(f"{d.name}_{s}") for s in ("halves", "lo", "hi"))
                edits.replace[parsed.line(line_node)] = statements(
                    f"# C in two [{d.rows}, {half}] halves: the descriptor's shared-memory staging tile halves too\n"
                    f"{both} = tl.permute(tl.reshape({code(value)}, ({d.rows}, 2, {half})), (0, 2, 1))\n"
                    f"{lo}, {hi} = tl.split({both})\n"
                    f"{d.name}.store([{row}, {col}], {lo})\n"
                    f"{d.name}.store([{row}, {col} + {half}], {hi})\n")
            else:
                changed.append(f"{fn.name.value}: {d.name} [{d.rows}, {d.cols}] -> [{d.rows}, {half}]")
                continue
            # a store this rewrite cannot read: drop every edit of this descriptor
            edits.replace.pop(parsed.line(d.assign), None)
            for line_node, _ in d.stores:
                edits.replace.pop(parsed.line(line_node), None)
    if not changed:
        return None
    return apply_edits(source, edits, parsed), changed
