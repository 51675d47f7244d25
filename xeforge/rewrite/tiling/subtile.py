"""Epilogue subtiling: a kernel's C tile stored through a tensor descriptor in two halves along N.

Owns: finding, in a ``@triton.jit`` function, a descriptor made by ``tl.make_tensor_descriptor(...,
block_shape=[BM, BN])`` that is only ever stored to (``desc.store([r, c], value)``), and rewriting it to
``block_shape=[BM, BN // 2]`` with two stores of the value's halves (``tl.reshape`` -> ``tl.permute`` ->
``tl.split``). The staging tile that a descriptor store keeps in shared memory halves with it: a 128x256 tile
whose fp32 epilogue needs 128 KB of staging fits beside three 48 KB operand stages on a 227 KB part (H200) once
the staging is 64 KB. The engine proposes it as a shared-memory refit (``engines.refit_candidates``) before it
gives up pipeline stages, which cost more than the second store does. Its inverse, :func:`whole_stores`, gives a
tactic that reads the K loop's store (split-K) the kernel as it was before the halves.
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


def _halved_store(stmts: list) -> tuple[str, str, str, str, cst.BaseExpression] | None:
    """(descriptor, row, column, half, value) where ``stmts`` (four statements of one block) are the two-halves
    store :func:`subtile_stores` writes; None otherwise."""
    first, split, lo_store, hi_store = (small(s) for s in stmts)
    if not (isinstance(first, cst.Assign) and isinstance(split, cst.Assign) and isinstance(lo_store, cst.Expr)
            and isinstance(hi_store, cst.Expr) and len(first.targets) == 1 and len(split.targets) == 1):
        return None
    permute = first.value
    if not (isinstance(permute, cst.Call) and is_tl(call_name(permute), "permute") and len(permute.args) == 2
            and code(permute.args[1].value) == "(0, 2, 1)"):
        return None
    reshape = permute.args[0].value
    if not (isinstance(reshape, cst.Call) and is_tl(call_name(reshape), "reshape") and len(reshape.args) == 2):
        return None
    dims = reshape.args[1].value
    if not (isinstance(dims, cst.Tuple) and len(dims.elements) == 3 and code(dims.elements[1].value) == "2"):
        return None
    half = code(dims.elements[2].value)
    both = code(first.targets[0].target)
    pair = split.targets[0].target
    if not (isinstance(split.value, cst.Call) and is_tl(call_name(split.value), "split")
            and [code(a.value) for a in split.value.args] == [both]
            and isinstance(pair, cst.Tuple) and len(pair.elements) == 2):
        return None
    lo, hi = (code(e.value) for e in pair.elements)
    calls = []
    for st, want in ((lo_store, lo), (hi_store, hi)):
        call = st.value
        base, _, method = (call_name(call) or "").rpartition(".") if isinstance(call, cst.Call) else ("", "", "")
        coords, value = (arg(call, 0, "offsets"), arg(call, 1, "value")) if method == "store" else (None, None)
        if not (isinstance(coords, (cst.List, cst.Tuple)) and len(coords.elements) == 2 and value is not None
                and code(value) == want):
            return None
        calls.append((base, [code(e.value) for e in coords.elements]))
    (desc, (row, col)), (desc_hi, coords_hi) = calls
    if desc_hi != desc or coords_hi != [row, f"{col} + {half}"]:
        return None
    return desc, row, col, half, reshape.args[0].value


def whole_stores(source: str, kernel: str) -> tuple[str, list[str]] | None:
    """``source`` with ``kernel``'s C tiles stored whole again where :func:`subtile_stores` halved them: each
    two-halves store back to one ``desc.store([r, c], value)``, the descriptor's block back to ``[BM, BN]``. A
    tactic that reads the K loop's store (split-K's plan takes ``acc`` or a cast of it) plans on this form; the
    engine halves its candidates' stores again where shared memory needs it. Returns the source and one line per
    descriptor, or None where nothing is halved (or a halved descriptor is also stored some other way)."""
    parsed = Parsed.of(source)
    fn = parsed.function(kernel)
    if fn is None:
        return None
    found: dict[str, list[tuple[int, str]]] = {}  # descriptor -> (index of the block's statement, half) per store

    class Find(cst.CSTVisitor):
        def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
            body = list(node.body)
            for i in range(len(body) - 3):
                hit = _halved_store(body[i:i + 4])
                if hit is not None:
                    found.setdefault(hit[0], []).append((parsed.line(body[i]), hit[3]))

    fn.visit(Find())
    descs = _descriptors(fn)
    whole: dict[str, str] = {}  # descriptor -> its block's columns, whole
    for name, stores in found.items():
        d = descs.get(name)
        halves = {h for _, h in stores}
        if d is None or d.other_use or len(halves) != 1 or d.cols not in halves or len(d.stores) != 2 * len(stores):
            continue
        cols = d.cols.removesuffix(" // 2").strip()
        if cols == d.cols:
            continue
        whole[name] = cols[1:-1] if cols.startswith("(") and cols.endswith(")") else cols
    if not whole:
        return None
    changed = [f"{kernel}: {n} [{descs[n].rows}, {descs[n].cols}] -> [{descs[n].rows}, {c}]" for n, c in whole.items()]

    class Undo(cst.CSTTransformer):
        def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
            body, out, i = list(updated.body), [], 0
            while i < len(body):
                hit = _halved_store(body[i:i + 4]) if i + 4 <= len(body) else None
                if hit is None or hit[0] not in whole:
                    out.append(body[i])
                    i += 1
                    continue
                desc, row, col, _, value = hit
                store = statements(f"{desc}.store([{row}, {col}], {code(value)})\n")[0]
                lead = [ln for ln in body[i].leading_lines
                        if ln.comment is None or not ln.comment.value.startswith("# C in two [")]
                out.append(store.with_changes(leading_lines=lead))
                i += 4
            return updated.with_changes(body=out)

    new_fn = fn.visit(Undo())
    for name, cols in whole.items():
        d = _descriptors(new_fn)[name]
        shape = arg(d.call, 3, "block_shape")
        new_shape = shape.with_changes(elements=[shape.elements[0], shape.elements[1].with_changes(value=expr(cols))])
        new_fn = new_fn.deep_replace(d.assign, d.assign.deep_replace(d.call, d.call.deep_replace(shape, new_shape)))
    return parsed.module.deep_replace(fn, new_fn).code, changed
