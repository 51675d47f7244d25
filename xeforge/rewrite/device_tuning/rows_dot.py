"""Rows on the matrix unit: a GEMV written one row a program becomes a small GEMM over 16 rows a program.

Owns :func:`dot_rows` (the kernel rewrite) and :func:`dot_branch` (one branch of a per-shape dispatch launching it).
A decode GEMV reduces each row against the weight with ``acc += tl.sum(w * x[None, :], axis=1)``: on the CUDA cores,
one row a program. Serving 8 rows a program by copies (:mod:`~xeforge.rewrite.device_tuning.shared_rows`) reads the
weight once but still runs 8 such sums: on an H100 (2026-12-07) gemv_decode at B = 8 stayed at 0.53-0.61x of
cuBLAS, which runs the rows on the tensor cores. Here the rows become the M side of ``tl.dot`` (16 rows, its
smallest on NVIDIA GPUs; Intel's DPAS takes 8):

- ``row = tl.program_id(1)`` becomes ``row = tl.program_id(1) * 16 + tl.arange(0, 16)[:, None]``, a [16, 1] column,
  and ``row_ok = row < N_ROWS`` (``N_ROWS``, a new parameter, is the grid axis's length);
- every other value computed from the row keeps its statement: a scalar becomes a [16, 1] column and a vector a
  [16, n] tile by broadcasting, so loads and stores whose address depends on the row get ``& row_ok`` on their mask;
- the accumulator ``acc = tl.zeros((BLOCK_N,), ...)`` becomes ``tl.zeros((16, BLOCK_N), ...)``;
- ``acc += tl.sum(w * x[None, :], axis=1)`` (either operand order, ``acc = acc + ...``) becomes
  ``acc += tl.dot(x, tl.trans(w), ...)``: [16, K] by [K, N]. Where both ``x`` and ``w`` are
  up-cast to fp32 right at their loads (``.to(tl.float32)``) and read by nothing else, the up-casts are dropped (and
  ``w`` meets ``x``'s dtype), so 16-bit operands reach the matrix unit: a product of two 16-bit floats is exact in
  fp32, only the order of the sum changes; fp32 operands are multiplied exactly (``input_precision="ieee"``, chosen
  when the kernel compiles), not as tf32;
- the launch's grid axis ``B`` becomes ``triton.cdiv(B, 16)`` and ``N_ROWS=B`` is passed.

What would change meaning is refused with the reason: what :func:`~xeforge.rewrite.device_tuning.shared_rows.
check_rows` refuses, a row-dependent value indexed or reduced other than in that one sum, and a row-dependent
statement that reads a value of two or more dimensions (it would not broadcast against a [16, n] tile).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from xeforge.rewrite import NotApplicable
from xeforge.rewrite.cst_tools import add_params, arg, call_name, code, expr, is_tl, names_in, statements, walk
from xeforge.rewrite.device_tuning.shared_rows import (COUNT, MASK, RowMasker, assigned, launch_rows, plain_axis,
                                                        rows_site, simple_statements)
from xeforge.rewrite.tiling.grid import fresh_name

#: the copy's name, and the rows a program (tl.dot's smallest M on NVIDIA GPUs)
SUFFIX, ROWS = "_dotrows", 16
#: calls a row-dependent statement may make beyond memory and elementwise math: none that reshapes or reduces
_REFUSED = ("sum", "max", "min", "reduce", "argmax", "argmin", "xor_sum", "cumsum", "cumprod", "associative_scan",
            "sort", "dot", "dot_scaled", "trans", "permute", "reshape", "view", "expand_dims", "broadcast_to", "join",
            "split", "interleave", "flip", "ravel", "zeros", "full")


@dataclass
class DotRowsPlan:
    kernel: str
    axis: int
    acc: str
    x: str  # the row's vector in the sum
    w: str  # the weight's tile in the sum
    dropped: tuple[str, ...]  # operands whose fp32 up-cast was dropped
    count: str

    def describe(self) -> str:
        cast = f"; fp32 up-cast of {', '.join(self.dropped)} dropped" if self.dropped else ""
        return (f"{self.kernel}{SUFFIX}: {ROWS} rows of grid axis {self.axis} a program on the matrix unit, "
                f"{self.acc} += tl.dot({self.x}, tl.trans({self.w})){cast}")


def _rank(node: cst.BaseExpression, ranks: dict[str, int]) -> int | None:
    """How many dimensions ``node`` has (None where it cannot be told): tl.arange is 1, a subscript has as many as
    its entries, a load its pointer's, tl.zeros its shape's, arithmetic the largest of its operands'."""
    if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString)):
        return 0
    if isinstance(node, cst.Name):
        return ranks.get(node.value, 0 if node.value in ("True", "False", "None") else None)
    if isinstance(node, (cst.BinaryOperation, cst.BooleanOperation)):
        a, b = _rank(node.left, ranks), _rank(node.right, ranks)
        return None if a is None or b is None else max(a, b)
    if isinstance(node, cst.Comparison):
        parts = [_rank(node.left, ranks)] + [_rank(c.comparator, ranks) for c in node.comparisons]
        return None if None in parts else max(parts)
    if isinstance(node, cst.UnaryOperation):
        return _rank(node.expression, ranks)
    if isinstance(node, cst.Subscript):
        return len(node.slice)
    if isinstance(node, cst.Attribute):
        return 0 if code(node).endswith(("dtype", "element_ty")) else None
    if isinstance(node, cst.Call):
        name = call_name(node) or ""
        if is_tl(name, "arange"):
            return 1
        if is_tl(name, "program_id", "num_programs", "cdiv"):
            return 0
        if is_tl(name, "zeros", "full"):
            shape = arg(node, 0, "shape")
            return len(shape.elements) if isinstance(shape, (cst.Tuple, cst.List)) else None
        if is_tl(name, "load"):
            ptr = arg(node, 0, "pointer")
            return None if ptr is None else _rank(ptr, ranks)
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "to":
            return _rank(node.func.value, ranks)
        if is_tl(name, "where", "maximum", "minimum", "exp", "log", "sqrt", "abs", "sigmoid", "fma"):
            parts = [_rank(a.value, ranks) for a in node.args if a.keyword is None]
            return None if not parts or None in parts else max(parts)
    return None


def _sum_pattern(stmt: cst.SimpleStatementLine, dep: set[str]) -> tuple[str, str, str] | None:
    """(acc, x, w) of ``acc += tl.sum(w * x[None, :], axis=1)`` (or ``x[None, :] * w``, ``acc = acc + ...``, the axis
    positional): x and acc row-dependent names, w a name that is not."""
    if len(stmt.body) != 1:
        return None
    s = stmt.body[0]
    if isinstance(s, cst.AugAssign) and isinstance(s.operator, cst.AddAssign) and isinstance(s.target, cst.Name):
        acc, value = s.target.value, s.value
    elif isinstance(s, cst.Assign) and len(s.targets) == 1 and isinstance(s.targets[0].target, cst.Name) and \
            isinstance(s.value, cst.BinaryOperation) and isinstance(s.value.operator, cst.Add) and \
            isinstance(s.value.left, cst.Name) and s.value.left.value == s.targets[0].target.value:
        acc, value = s.targets[0].target.value, s.value.right
    else:
        return None
    if not (isinstance(value, cst.Call) and is_tl(call_name(value), "sum")):
        return None
    axis, operand = arg(value, 1, "axis"), arg(value, 0, "input")
    if axis is None or code(axis) != "1" or not isinstance(operand, cst.BinaryOperation) or \
            not isinstance(operand.operator, cst.Multiply) or len(value.args) > 2:
        return None
    for vec, tile in ((operand.right, operand.left), (operand.left, operand.right)):
        if isinstance(vec, cst.Subscript) and isinstance(vec.value, cst.Name) and isinstance(tile, cst.Name) and \
                code(vec).replace(" ", "") == f"{vec.value.value}[None,:]" and vec.value.value in dep and \
                tile.value not in dep and acc in dep:
            return acc, vec.value.value, tile.value
    return None


def _upcast_load(stmt: cst.SimpleStatementLine, name: str) -> cst.BaseExpression | None:
    """The load of ``name = tl.load(...).to(tl.float32)``, None for any other statement."""
    s = stmt.body[0] if len(stmt.body) == 1 else None
    if not (isinstance(s, cst.Assign) and len(s.targets) == 1 and isinstance(s.targets[0].target, cst.Name)
            and s.targets[0].target.value == name and isinstance(s.value, cst.Call)
            and isinstance(s.value.func, cst.Attribute) and s.value.func.attr.value == "to"):
        return None
    inner, to = s.value.func.value, arg(s.value, 0, "dtype")
    if not (isinstance(inner, cst.Call) and is_tl(call_name(inner), "load")) or to is None or \
            code(to) not in ("tl.float32", "triton.language.float32"):
        return None
    return inner


def dot_rows(source: str, kernel: str, axis: int) -> tuple[str, DotRowsPlan]:
    """``source`` with ``kernel`` serving 16 rows of grid axis ``axis`` a program through ``tl.dot`` (its launch
    untouched: see :func:`dot_branch`); NotApplicable with the reason."""
    rs = rows_site(source, kernel, axis)
    fn, dep, pid = rs.fn, rs.dep, rs.pid
    simple = simple_statements(fn.body)
    found = [(st, m) for st in simple if (m := _sum_pattern(st, dep))]
    if len(found) != 1:
        raise NotApplicable(f"{kernel} has {len(found)} statement(s) of the form acc += tl.sum(w * x[None, :], "
                            "axis=1) with x from the row and w not (the rows-on-the-matrix-unit form rewrites one)")
    (sum_stmt, (acc, x, w)), = found
    inits = [st for st in simple if acc in assigned(st) and st is not sum_stmt]
    zeros = [st for st in inits if isinstance(st.body[0], cst.Assign) and isinstance(st.body[0].value, cst.Call)
             and is_tl(call_name(st.body[0].value), "zeros")]
    if len(zeros) != 1:
        raise NotApplicable(f"{kernel}: {acc} is not made once by tl.zeros((BLOCK,), ...)")
    if len(inits) != 1:
        raise NotApplicable(f"{kernel}: {acc} is assigned by more than its tl.zeros and the sum (line "
                            f"{rs.parsed.line(next(st for st in inits if st is not zeros[0]))}): the product "
                            "replaces the sum alone")
    init = zeros[0]
    shape = arg(init.body[0].value, 0, "shape")
    if not isinstance(shape, (cst.Tuple, cst.List)) or len(shape.elements) != 1:
        raise NotApplicable(f"{kernel}: {acc} = {code(init.body[0].value)} is not a vector")
    # ranks of the values the row's statements read, in the order the kernel assigns them
    ranks: dict[str, int] = {p: 0 for p in rs.jf.params}
    made: set[str] = set()
    for node in walk(fn.body):
        if isinstance(node, cst.For):
            for t in names_in(node.target):
                ranks[t] = 0
                made.add(t)
        if isinstance(node, cst.SimpleStatementLine):
            made |= assigned(node)
            for s in node.body:
                if isinstance(s, cst.Assign) and len(s.targets) == 1 and isinstance(s.targets[0].target, cst.Name):
                    r = _rank(s.value, ranks)
                    if r is not None:
                        ranks[s.targets[0].target.value] = r
    users = {n: [st for st in simple if n in names_in(st) and st is not sum_stmt and n not in assigned(st)]
             for n in (x, w)}
    dropped: list[str] = []
    for st in simple:
        if st is sum_stmt or st is init or not names_in(st) & dep:
            continue
        for c in (n for n in walk(st) if isinstance(n, cst.Call)):
            short = (call_name(c) or "").rsplit(".", 1)[-1]
            if short in _REFUSED and (is_tl(call_name(c), short) or isinstance(c.func, cst.Attribute)):
                raise NotApplicable(f"a row's statement reshapes, reduces or makes a tile (`{code(st).strip()}`): "
                                    "only the one tl.sum becomes the product")
        for sub in (n for n in walk(st) if isinstance(n, cst.Subscript)):
            if names_in(sub.value) & dep:
                raise NotApplicable(f"a row's value is indexed (`{code(sub)}`): it gains a row dimension")
        for name in sorted(names_in(st) - dep):
            if name not in made and name not in ranks:
                continue  # a module, a global or a constexpr of the file: no tensor of the kernel
            r = ranks.get(name)
            if r is None or r >= 2:
                what = "a value whose dimensions cannot be told" if r is None else f"a {r}-D value"
                raise NotApplicable(f"a row's statement reads {name}, {what} (`{code(st).strip()}`): it must "
                                    "broadcast against the rows' [16, n] tiles")
    if ranks.get(w, 2) != 2:
        raise NotApplicable(f"{kernel}: {w} is not a 2-D tile")
    taken = {n.value for n in walk(rs.parsed.module) if isinstance(n, cst.Name)}
    count, ok = fresh_name(taken, COUNT), fresh_name(taken, MASK)

    def upcast(name: str) -> bool:
        defs = [st for st in simple if name in assigned(st)]
        return len(defs) == 1 and not users[name] and _upcast_load(defs[0], name) is not None

    if upcast(x) and upcast(w):  # both or neither: tl.dot takes operands of one dtype
        dropped += [x, w]

    class Edit(cst.CSTTransformer):
        def leave_SimpleStatementLine(self, original, updated):
            if original is sum_stmt:
                # fp32 operands (the fp32 problems, and up-casts kept) are multiplied exactly (ieee), not as tf32;
                # 16-bit ones take the matrix unit as they are. Loads of two dtypes meet at x's
                other = f"tl.trans({w}).to({x}.dtype)" if dropped else f"tl.trans({w})"
                dot = f'tl.dot({x}, {other}, input_precision="ieee" if {x}.dtype == tl.float32 else None)'
                return statements(f"{acc} += {dot}")[0].with_changes(leading_lines=updated.leading_lines)
            if original is init:
                call = updated.body[0].value
                new_shape = expr(f"({ROWS}, {code(shape.elements[0].value)})")
                new_call = call.with_changes(args=[call.args[0].with_changes(value=new_shape), *call.args[1:]])
                return updated.deep_replace(call, new_call)
            if rs.parsed.line(original) == pid.stmt.lineno:
                made = statements(f"{pid.name} = {pid.read()} * {ROWS} + tl.arange(0, {ROWS})[:, None]\n"
                                  f"{ok} = {pid.name} < {count}")
                made[0] = made[0].with_changes(leading_lines=updated.leading_lines)
                return cst.FlattenSentinel(made)
            name = next((n for n in dropped if n in assigned(original)), None)
            if name is not None:
                updated = updated.deep_replace(updated.body[0].value, _upcast_load(updated, name))
            if names_in(original) & dep:
                return updated.visit(RowMasker(dep, ok))
            return updated

    new_fn = fn.visit(Edit())
    new_fn = new_fn.with_changes(params=add_params(new_fn.params, [count]))
    module = rs.parsed.module.with_changes(body=[new_fn if s is fn else s for s in rs.parsed.module.body])
    return module.code, DotRowsPlan(kernel, axis, acc, x, w, tuple(dropped), count)


def dot_branch(dispatched: str, original: str, kernel: str, test: str, axis: int) -> str:
    """``dispatched`` (a per-shape dispatch of ``kernel``) with the branch under ``if <test>:`` launching
    ``<kernel>_dotrows`` (:func:`dot_rows` of ``original``'s kernel), its grid axis ``axis`` divided by 16 and the row
    count passed; the other branches keep the kernel."""
    count = plain_axis(original, kernel, axis)
    new, plan = dot_rows(original, kernel, axis)
    return launch_rows(dispatched, new, kernel, SUFFIX, test, axis, ROWS, plan.count, count)
