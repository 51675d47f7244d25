"""Split reduction (device_tuning): a kernel whose few programs each run a long reduction loop gets SPLIT programs
per program, each over a slice of the loop, and a second kernel that combines their partial states.

Owns :func:`find` (which loop, and what it carries), :func:`sizes` (programs and loop steps at a variant) and
:func:`apply` (the rewrite). Real kernels reduce a long row in one program: cross-entropy over a 128k vocabulary
with one program a token, decode attention with one program a (sequence, kv head) over 32k keys. At 16 tokens or
one sequence that is 16 or 8 programs for a GPU of 132 cores. Split-K does this for a GEMM; this does it for a loop
whose carried state is one of:

- a **max** (``m = tl.maximum(m, ...)``, or ``m_new = tl.maximum(m, ...)`` ... ``m = m_new``), started at -inf;
- a **sum** (``t += ...``, ``t = t + ...``, ``acc = tl.dot(p, v, acc)``), started at zero;
- a **sum rescaled by the max** (``s = s * tl.exp(m - m_new) + ...``, ``acc = acc * alpha[:, None] + ...`` with
  ``alpha = tl.exp2(m_i - m_new)``): an online softmax or a flash-decoding accumulator, started at zero.

``<kernel>_split`` runs on the grid with axis 0 widened SPLIT times (program ``p * SPLIT + j`` is slice ``j`` of
program ``p``): the code before the loop as written, the loop over its slice of whole steps (the last short or
empty), and then, in place of the code after the loop, its states stored as float32 partials. ``<kernel>_combine``
runs on the original grid: the code before the loop, then the max over the slices' maxima, each rescaled sum as
``sum_j s_j * f(m_j, m)`` (the loop's own factor with the slice's max for the old one and the combined max for
the new one; a slice that saw only -inf adds nothing), each sum as ``sum_j t_j`` — in slice order, the same bits
every run — and then the code after the loop as written. The host launches the two where it launched the kernel,
with the partials in one float32 buffer per state; with ``when`` (a test such as ``n_rows <= 256``: the
per-shape-config tactic's class of few rows) only there, the kernel as written in the ``else``.

Anything else the loop carries (a pointer it advances, a counter, a running product), a step that adds a value made
from another state (or from the max, to a sum the max does not rescale), a store or atomic before or in the loop, a
``return``/``break`` in it, a persistent kernel, a grid made by a function of the meta-parameters or a state whose
size the launch does not pass is left alone, with the reason and its line.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from xeforge.kernel_model import dotted_name, parse_kernel, segment_of
from xeforge.rewrite.cst_tools import (Edits, Parsed, apply_edits, branch_block, expr, function_copy, place_copies,
                                      set_call_kwargs, statements, walk)
from xeforge.rewrite.device_tuning.splitk import Inline, node_at
from xeforge.rewrite.device_tuning.splitk_plan import carried as carried_names
from xeforge.rewrite.device_tuning.splitk_plan import trip_count
from xeforge.rewrite.memory import launch_facts
from xeforge.rewrite.persistent import launched_programs
from xeforge.rewrite.tiling import NotApplicable, _assign_counts, _kw, assigned_names, is_tl_call
from xeforge.rewrite.tiling.grid import (enclosing_function, fresh_name, launch_bindings, launch_grid,
                                         program_id_vars, single_launch)
from xeforge.rewrite.tiling.pids import hoist_program_ids

PARAM = "SPLIT"
SPLIT_SUFFIX = "_split"
COMBINE_SUFFIX = "_combine"
#: SPLIT values the tactics draw from
SPLITS = (2, 4, 8, 16, 32)
#: loop steps each slice keeps at the sized variant
MIN_STEPS = 2
#: programs per core the split may reach
PROGRAMS_PER_CORE = 4
_RANGES = ("range", "tl.range", "triton.language.range")
_EXPS = ("exp", "exp2")


@dataclass
class State:
    name: str
    kind: str  # max | sum | rescaled
    shape: list[str]  # the state's block shape as written ([] for a scalar): constexpr names or int literals
    factor: ast.expr | None = None  # rescaled: the factor at its use, loop-local aliases spelled out
    line: int = 0  # where the loop updates it (the first time)


@dataclass
class Plan:
    kernel: str
    loop_line: int
    start: str | None
    stop: str
    step: str | None
    states: list[State]
    new_max: set[str] = field(default_factory=set)  # loop-locals that hold the max's next value
    after_lines: list[int] = field(default_factory=list)  # top-level statements after the loop
    pid0: tuple[str, str | None] | None = None  # (name, cast) of the axis-0 program id, if the kernel reads it

    @property
    def split_kernel(self) -> str:
        return self.kernel + SPLIT_SUFFIX

    @property
    def combine_kernel(self) -> str:
        return self.kernel + COMBINE_SUFFIX

    def describe(self, split: int | None = None) -> str:
        kinds = ", ".join(f"{s.name} ({'a ' if s.kind != 'rescaled' else ''}{s.kind}"
                          f"{' by the max' if s.kind == 'rescaled' else ''})" for s in self.states)
        n = f"{split} programs" if split else "SPLIT programs"
        return (f"{self.kernel}: {n} per program over slices of the loop at line {self.loop_line}, carrying {kinds}; "
                f"{self.combine_kernel} combines them and runs the rest")


# ------------------------------------------------------------------------------------------------------- analysis
def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _updates(loop: ast.For, name: str) -> list[ast.stmt]:
    return [n for n in ast.walk(loop) if (isinstance(n, ast.Assign) and name in {t.id for t in n.targets
                                                                                  if isinstance(t, ast.Name)})
            or (isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name) and n.target.id == name)]


def _terms(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _terms(node.left) + _terms(node.right)
    return [node]


def _dot_into(value: ast.AST, name: str) -> bool:
    """``tl.dot(a, b, name)`` or ``tl.dot(a, b, acc=name)``."""
    if not is_tl_call(value, "dot"):
        return False
    acc = _kw(value, "acc", 2)
    return isinstance(acc, ast.Name) and acc.id == name and \
        not any(name in _names(a) for a in value.args[:2])


def _maximum_of(value: ast.AST, name: str) -> bool:
    """``tl.maximum(name, e)`` or ``tl.maximum(e, name)`` with ``e`` free of ``name``."""
    if not is_tl_call(value, "maximum") or len(value.args) != 2:
        return False
    a, b = value.args
    return (isinstance(a, ast.Name) and a.id == name and name not in _names(b)) or \
        (isinstance(b, ast.Name) and b.id == name and name not in _names(a))


def _update_kind(st: ast.stmt, name: str) -> tuple[str, ast.expr | None] | None:
    """("add", None) or ("scale", factor) for one update of a sum; None for anything else."""
    if isinstance(st, ast.AugAssign):
        if name in _names(st.value):
            return None
        if isinstance(st.op, ast.Add):
            return "add", None
        if isinstance(st.op, ast.Mult):
            return "scale", st.value
        return None
    if not isinstance(st, ast.Assign) or len(st.targets) != 1:
        return None
    if _dot_into(st.value, name):
        return "add", None
    terms = _terms(st.value)
    mine = [t for t in terms if name in _names(t)]
    if len(mine) != 1:
        return None
    t = mine[0]
    if isinstance(t, ast.Name):
        return ("add", None) if len(terms) > 1 else None
    if isinstance(t, ast.BinOp) and isinstance(t.op, ast.Mult):
        for own, other in ((t.left, t.right), (t.right, t.left)):
            if isinstance(own, ast.Name) and own.id == name and name not in _names(other):
                return "scale", other
    return None


def _added_names(st: ast.stmt, name: str) -> set[str]:
    """The names an additive update of ``name`` reads in what it adds (``name`` itself left out)."""
    value = st.value
    if isinstance(st, ast.Assign) and _dot_into(value, name):
        return _names(value.args[0]) | _names(value.args[1])
    if isinstance(st, ast.Assign):
        return set().union(*(_names(t) for t in _terms(value) if name not in _names(t)))
    return _names(value) - {name}


def _dependencies(loop: ast.For, carried: set[str]) -> dict[str, set[str]]:
    """Per name the loop assigns, the carried states and max-values it is made from (through the loop's other names,
    every assignment counted); a carried name depends on itself."""
    direct: dict[str, set[str]] = {}
    for n in ast.walk(loop):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AugAssign) else []
        for t in targets:
            for name in (x.id for x in ast.walk(t) if isinstance(x, ast.Name)):
                direct.setdefault(name, set()).update(_names(n.value))
    out = {name: ({name} if name in carried else set()) | direct[name] for name in direct}
    for _ in range(len(out) + 1):
        changed = False
        for name, got in out.items():
            more = set().union(*(out.get(d, set()) for d in got if d not in carried))
            if not more <= got:
                got |= more
                changed = True
        if not changed:
            break
    return out


def _exp_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (dotted_name(node.func) or "").rsplit(".", 1)[-1] in _EXPS


def _init(fn: ast.FunctionDef, loop: ast.For, name: str) -> ast.Assign | None:
    """The last top-level assignment of ``name`` before the loop."""
    found = None
    for st in fn.body:
        if st is loop:
            break
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) \
                and st.targets[0].id == name:
            found = st
    return found


def _is_neg_inf(node: ast.AST) -> bool:
    """-inf as kernels write it (``float("-inf")``, ``-float("inf")``, ``-math.inf``), or a finite stand-in for it
    (``-1e30``): a slice that saw nothing then adds nothing to the combine."""
    text = ast.unparse(node).replace(" ", "")
    if "inf" in text and ("-inf" in text or "-float" in text or "-math.inf" in text):
        return True
    try:
        value = float(ast.literal_eval(node))
    except (ValueError, TypeError, SyntaxError):
        return False
    return value <= -1e20


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0 and not isinstance(node.value, bool)


def _shape_of(value: ast.AST, kind: str, source: str) -> list[str]:
    """The block shape of a state's start (``tl.zeros([BLOCK_H, BLOCK_D], ...)`` -> [BLOCK_H, BLOCK_D], a scalar ->
    []); raises when the start is not the reduction's identity in float32."""
    what = "-inf" if kind == "max" else "0"
    text = segment_of(source, value) or ast.unparse(value)
    if isinstance(value, (ast.Constant, ast.UnaryOp)) or (isinstance(value, ast.Call) and
                                                          dotted_name(value.func) == "float"):
        ok = _is_neg_inf(value) if kind == "max" else _is_zero(value)
        if not ok:
            raise NotApplicable(f"starts at {text}, not {what}")
        return []
    if kind == "max" and isinstance(value, ast.BinOp) and isinstance(value.op, ast.Sub) and \
            is_tl_call(value.left, "zeros") and _is_neg_inf(ast.UnaryOp(ast.USub(), value.right)):
        value = value.left  # tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf"): its shape and dtype
        return _shape_of(ast.Call(ast.Attribute(ast.Name("tl", ast.Load()), "full", ast.Load()),
                                  [_kw(value, "shape", 0), ast.UnaryOp(ast.USub(), ast.Name("inf", ast.Load()))],
                                  [k for k in value.keywords if k.arg == "dtype"] or
                                  ([ast.keyword("dtype", value.args[1])] if len(value.args) > 1 else [])),
                         kind, source)
    if is_tl_call(value, "zeros") or is_tl_call(value, "full"):
        full = is_tl_call(value, "full")
        if kind == "max" and not (full and _is_neg_inf(_kw(value, "value", 1) or ast.Constant(0))):
            raise NotApplicable(f"starts at {text}, not {what}")
        if kind != "max" and full and not _is_zero(_kw(value, "value", 1) or ast.Constant(1)):
            raise NotApplicable(f"starts at {text}, not {what}")
        dtype = _kw(value, "dtype", 2 if full else 1)
        if dtype is not None and (dotted_name(dtype) or "").rsplit(".", 1)[-1] != "float32":
            raise NotApplicable(f"starts as {text}: the partials are stored in float32")
        shape = _kw(value, "shape", 0)
        if isinstance(shape, (ast.List, ast.Tuple)) and len(shape.elts) <= 2 and all(
                isinstance(e, ast.Name) or (isinstance(e, ast.Constant) and isinstance(e.value, int))
                for e in shape.elts):
            return [ast.unparse(e) for e in shape.elts]
        raise NotApplicable(f"starts as {text}: its shape is not a list of up to two block sizes")
    raise NotApplicable(f"starts as {text}, which is not tl.zeros/tl.full or a number")


def _range(loop: ast.For) -> tuple[str | None, str, str | None]:
    it = loop.iter
    if not (isinstance(it, ast.Call) and (dotted_name(it.func) or "") in _RANGES and 1 <= len(it.args) <= 3):
        raise NotApplicable(f"the loop at line {loop.lineno} is not a for over range()")
    if not isinstance(loop.target, ast.Name):
        raise NotApplicable(f"the loop at line {loop.lineno} unpacks its target")
    a = [ast.unparse(x) for x in it.args]
    if len(a) == 1:
        return None, a[0], None
    step = a[2] if len(a) == 3 else None
    if step is not None and (step.startswith("-") or step == "0"):
        raise NotApplicable(f"the loop at line {loop.lineno} does not count up")
    return a[0], a[1], step


def _plan_loop(fn: ast.FunctionDef, loop: ast.For, source: str, kernel: str) -> Plan:
    start, stop, step = _range(loop)
    at = f"the loop at line {loop.lineno}"
    for n in ast.walk(loop):
        if isinstance(n, (ast.Return, ast.Break, ast.Continue)):
            raise NotApplicable(f"{at} leaves early ({type(n).__name__.lower()} at line {n.lineno})")
        if isinstance(n, ast.For) and n is not loop:
            raise NotApplicable(f"{at} holds another loop (line {n.lineno})")
        if is_tl_call(n, "store") or (isinstance(n, ast.Call) and
                                      (dotted_name(n.func) or "").rsplit(".", 1)[-1].startswith("atomic_")):
            raise NotApplicable(f"{at} writes memory (line {n.lineno}): a slice would write it too")
    carried = carried_names(loop)
    if not carried:
        raise NotApplicable(f"{at} carries no state from step to step")
    counts = _assign_counts(loop.body)
    top_locals = {st.targets[0].id: st for st in loop.body if isinstance(st, ast.Assign) and len(st.targets) == 1
                  and isinstance(st.targets[0], ast.Name) and counts.get(st.targets[0].id) == 1
                  and st.targets[0].id not in carried}

    # the max: m = tl.maximum(m, e), or m = m_new after m_new = tl.maximum(m, e)
    maxes: dict[str, tuple[set[str], int]] = {}
    for name in carried:
        ups = _updates(loop, name)
        if len(ups) != 1 or not isinstance(ups[0], ast.Assign):
            continue
        v = ups[0].value
        if _maximum_of(v, name):
            maxes[name] = (set(), ups[0].lineno)
        elif isinstance(v, ast.Name) and v.id in top_locals and _maximum_of(top_locals[v.id].value, name) \
                and top_locals[v.id].lineno < ups[0].lineno:
            maxes[name] = ({v.id}, ups[0].lineno)
    if len(maxes) > 1:
        raise NotApplicable(f"{at} carries {len(maxes)} running maxima ({', '.join(maxes)}); the combine rescales by one")
    the_max = next(iter(maxes), None)
    new_max, max_line = maxes[the_max] if the_max else (set(), 0)

    deps = _dependencies(loop, set(carried))
    states: list[State] = []
    for name in carried:
        ups = _updates(loop, name)
        line = min(u.lineno for u in ups)
        if name == the_max:
            kind, factor = "max", None
        else:
            kinds = [_update_kind(u, name) for u in ups]
            if any(k is None for k in kinds):
                bad = next(u for u, k in zip(ups, kinds) if k is None)
                raise NotApplicable(f"{at} carries {name} (line {bad.lineno}: "
                                    f"{segment_of(source, bad) or ast.unparse(bad)}), which is not a running max, a "
                                    "sum, or a sum rescaled by the max")
            scales = [(u, f) for u, (k, f) in zip(ups, kinds) if k == "scale"]
            factor = None
            if len(scales) > 1:
                raise NotApplicable(f"{at} rescales {name} {len(scales)} times a step")
            if scales:
                u, f = scales[0]
                factor = _factor(f, top_locals, new_max, the_max, max_line, u, source, at, name)
            kind = "rescaled" if factor is not None else "sum"
            # what a step adds is this slice's own: it may read the max's new value only where the sum is rescaled
            # by it, and no other state at all
            allowed = ({the_max} | new_max) if kind == "rescaled" and the_max else set()
            for u, (k, _) in zip(ups, kinds):
                added = _added_names(u, name) if k == "add" else set()
                reads = set().union(*(deps.get(n, set()) | {n} for n in added)) & ((set(carried) | new_max) - allowed - {name})
                if reads:
                    raise NotApplicable(f"{at} adds to {name} a value made from {', '.join(sorted(reads))} (line "
                                        f"{u.lineno}): a slice's sum would depend on the others'")
        init = _init(fn, loop, name)
        if init is None:
            raise NotApplicable(f"{at} carries {name}, which is not set before the loop at the top of the kernel")
        try:
            shape = _shape_of(init.value, kind, source)
        except NotApplicable as exc:
            v = init.value
            if kind == "sum" and not isinstance(v, (ast.Constant, ast.UnaryOp)) and not (
                    is_tl_call(v, "zeros") or is_tl_call(v, "full")):
                raise NotApplicable(f"{at} advances {name} from {segment_of(source, v) or ast.unparse(v)} (line "
                                    f"{init.lineno}): a pointer or counter, which a slice would have to start mid-way "
                                    "(split-K does that for a GEMM's K loop)") from None
            raise NotApplicable(f"{at} carries {name} (line {init.lineno}), which {exc}") from None
        states.append(State(name, kind, shape, factor, line))

    # what comes after the loop may read the states and what was set before it, not the loop's own names
    idx = fn.body.index(loop)
    after = fn.body[idx + 1:]
    local = (assigned_names(loop.body) | {loop.target.id}) - set(carried)
    stale = _read_before_set(after, local)
    if stale:
        line, used = stale
        raise NotApplicable(f"line {line} reads {', '.join(sorted(used))}, set inside {at}")
    for st in fn.body[:idx]:
        for n in ast.walk(st):
            if is_tl_call(n, "store") or (isinstance(n, ast.Call) and
                                          (dotted_name(n.func) or "").rsplit(".", 1)[-1].startswith("atomic_")):
                raise NotApplicable(f"line {n.lineno} writes memory before {at}: every slice would write it")
    if not after:
        raise NotApplicable(f"nothing follows {at}")
    return Plan(kernel, loop.lineno, start, stop, step, states, new_max,
                [st.lineno for st in after])


def _read_before_set(body: list[ast.stmt], names: set[str]) -> tuple[int, set[str]] | None:
    """The first statement of ``body`` that reads one of ``names`` before ``body`` sets it again (a second pass over
    the row that reassigns the loop's names reads its own), with the names; None if there is none."""
    def visit(stmts: list[ast.stmt], written: set[str]) -> tuple[tuple[int, set[str]] | None, set[str]]:
        written = set(written)
        for st in stmts:
            if isinstance(st, (ast.For, ast.While, ast.If)):
                head = st.iter if isinstance(st, ast.For) else st.test
                used = _names(head) & names - written
                if used:
                    return (st.lineno, used), written
                inner = written | (_names(st.target) if isinstance(st, ast.For) else set())
                found, w_body = visit(st.body, inner)
                if found:
                    return found, written
                found, w_else = visit(st.orelse, inner)
                if found:
                    return found, written
                if isinstance(st, ast.If):
                    written |= w_body & w_else
                continue
            used = {n.id for n in ast.walk(st) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            if isinstance(st, ast.AugAssign) and isinstance(st.target, ast.Name):
                used.add(st.target.id)
            used = used & names - written
            if used:
                return (st.lineno, used), written
            written |= assigned_names([st])
        return None, written

    return visit(body, set())[0]


def _factor(f: ast.expr, top_locals: dict[str, ast.Assign], new_max: set[str], the_max: str | None, max_line: int,
            use: ast.stmt, source: str, at: str, name: str) -> ast.expr:
    """The rescale factor of ``name`` with its loop-local aliases spelled out; it must be an exponential of the
    max's old value against its new one, computed before the max moves on."""
    def refuse(why: str) -> NotApplicable:
        return NotApplicable(f"{at} rescales {name} by {segment_of(source, f) or ast.unparse(f)} (line {use.lineno}), "
                             f"{why}")

    if the_max is None:
        raise refuse("and carries no running max to rescale by")
    node = copy.deepcopy(f)
    for _ in range(8):
        inline = {n: top_locals[n].value for n in _names(node) if n in top_locals and n not in new_max}
        if not inline:
            break
        if any(top_locals[n].lineno > max_line for n in inline) and max_line:
            raise refuse(f"computed after the max moves on (line {max_line})")
        node = Inline(inline).visit(node)
    names = _names(node)
    if the_max not in names or not (names & new_max) or not any(_exp_call(n) for n in ast.walk(node)):
        raise refuse(f"which is not an exponential of {the_max} against its next value")
    if use.lineno > max_line and the_max in _names(f):
        raise refuse(f"read after the max moves on (line {max_line})")
    return node


def find(source: str, kernel: str) -> Plan:
    """The split plan of ``kernel`` in ``source`` (program ids hoisted, as :func:`apply` makes them)."""
    source = hoist_program_ids(source)
    model = parse_kernel(source)
    if kernel not in model.functions:
        raise NotApplicable(f"{kernel} is not a kernel of this file")
    fn = model.functions[kernel].node
    if any(is_tl_call(n, "num_programs") for n in ast.walk(fn)):
        raise NotApplicable(f"{kernel} reads tl.num_programs (a persistent kernel spreads its own work)")
    site = single_launch(model, kernel)
    pids, inline = program_id_vars(fn)
    if inline:
        raise NotApplicable(f"{kernel} reads tl.program_id with an axis that is not a number (line {inline[0].lineno})")
    grid = launch_grid(model, site)
    if grid is None:
        raise NotApplicable(f"the grid of {kernel} at line {site.line} is neither a tuple nor a lambda returning one")
    if grid.kind == "lambda" and any(grid.meta in _names(e) for e in grid.elements):
        raise NotApplicable(f"the grid of {kernel} at line {site.line} depends on the meta-parameters")
    jit = model.functions[kernel]
    first_constexpr = next((i for i, a in enumerate(fn.args.args) if a.arg in jit.constexpr_params),
                           len(fn.args.args))
    if len(site.node.args) > first_constexpr:
        raise NotApplicable(f"the launch at line {site.line} passes a tl.constexpr parameter by position")
    loops = [st for st in fn.body if isinstance(st, ast.For)]
    if not loops:
        raise NotApplicable(f"{kernel} has no loop at its top level to split")
    reasons = []
    for loop in loops:
        try:
            plan = _plan_loop(fn, loop, source, kernel)
        except NotApplicable as exc:
            reasons.append(str(exc))
            continue
        bound = launch_bindings(site, jit, source)
        for s in plan.states:
            for d in s.shape:
                if not d.isdigit() and d not in bound:
                    raise NotApplicable(f"{kernel}: the size {d} of {s.name} is not passed at the launch (line "
                                        f"{site.line}), so the host cannot size its partials")
        pid0 = next((p for p in pids if p.axis == 0), None)
        plan.pid0 = (pid0.name, pid0.cast) if pid0 else None
        return plan
    raise NotApplicable(f"{kernel}: {reasons[0]}")


def sizes(source: str, plan: Plan, problem: Any, variant: Any) -> tuple[int, int | None]:
    """(programs launched, steps of the split loop) at ``variant``; the steps are None where the loop's length is
    read from memory (a sequence length) or otherwise not known before the kernel runs."""
    source = hoist_program_ids(source)
    model = parse_kernel(source)
    programs = launched_programs(model, plan.kernel, problem, variant)
    site = single_launch(model, plan.kernel)
    bound = launch_facts(model, site, problem, variant)
    if programs is None or bound is None:
        raise NotApplicable(f"the programs of {plan.kernel} at {variant.name} cannot be read from the trace")
    return programs, trip_count(model.functions[plan.kernel].node, bound[0], plan.start, plan.stop, plan.step)


def split_values(programs: int, steps: int | None, cores: int) -> list[int]:
    """SPLIT candidates, the default first (the smallest that gives every core a program), then the larger ones:
    at most :data:`PROGRAMS_PER_CORE` programs a core, and at least :data:`MIN_STEPS` loop steps a slice where the
    length is known."""
    ok = [s for s in SPLITS if programs * s <= PROGRAMS_PER_CORE * cores and (steps is None or steps // s >= MIN_STEPS)]
    if not ok:
        return []
    default = next((s for s in ok if programs * s >= cores), ok[-1])
    return [default] + [s for s in reversed(ok) if s != default]


# -------------------------------------------------------------------------------------------------------- rewrite
def _offsets(shape: list[str]) -> tuple[str, str]:
    """(elements per partial, offsets of the state's elements within one) for a state of ``shape``."""
    if not shape:
        return "", ""
    if len(shape) == 1:
        return shape[0], f" + tl.arange(0, {shape[0]})"
    a, b = shape
    return f"{a} * {b}", f" + tl.arange(0, {a})[:, None] * {b} + tl.arange(0, {b})[None, :]"


def _loop_code(plan: Plan, names: dict[str, str]) -> tuple[list[str], list[str]]:
    """(statements before the split loop, its new range arguments)."""
    start = plan.start if plan.start not in (None, "0") else None
    step = plan.step if plan.step not in (None, "1") else None
    span = f"{plan.stop} - ({start})" if start else plan.stop
    n_it = f"tl.cdiv({span}, {step})" if step else span
    sp, n, per, lo, hi = (names[k] for k in ("sp", "n_it", "per", "lo", "hi"))
    pre = [f"# split reduction: slice {sp} of {PARAM} runs steps [{lo}, {hi}) of the loop",
           f"{n} = {n_it}", f"{per} = tl.cdiv({n}, {PARAM})", f"{lo} = {sp} * {per}",
           f"{hi} = tl.minimum({n}, {lo} + {per})"]

    def at(i: str) -> str:
        pos = f"{i} * {step}" if step else i
        return f"{start} + {pos}" if start else pos

    return pre, [at(lo), at(hi)] + ([step] if step else [])


def _program(split_axis: bool) -> str:
    """This program's index over the original grid (int64), row-major over the three axes."""
    p0 = f"(tl.program_id(0) // {PARAM})" if split_axis else "tl.program_id(0)"
    return f"(({p0}.to(tl.int64) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) + tl.program_id(2))"


def _split_kernel(source: str, parsed: Parsed, model, plan: Plan, names: dict[str, str],
                  parts: dict[str, str]) -> cst.FunctionDef:
    fn = model.functions[plan.kernel].node
    edits = Edits()
    edits.params[plan.kernel] = [parts[s.name] for s in plan.states] + [f"{PARAM}: tl.constexpr"]
    sp = names["sp"]
    head = [f"{sp} = tl.program_id(0) % {PARAM}"]
    if plan.pid0 is not None:
        pid_name, cast = plan.pid0
        read = f"(tl.program_id(0) // {PARAM})" + (f".to({cast})" if cast else "")
        st = next(s for s in fn.body if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name)
                  and s.targets[0].id == pid_name)
        edits.replace[st.lineno] = statements("\n".join(head + [f"{pid_name} = {read}"]))
    else:
        first = fn.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):  # the docstring stays first
            edits.insert_after[first.lineno] = statements("\n".join(head))
        else:
            node = node_at(parsed, (cst.SimpleStatementLine, cst.For, cst.If, cst.While), first.lineno)
            edits.replace[first.lineno] = statements("\n".join(head)) + [node]
    pre, args = _loop_code(plan, names)
    loop = node_at(parsed, cst.For, plan.loop_line)
    call = loop.iter
    rest = [a for a in call.args if a.keyword is not None]
    new_args = [cst.Arg(expr(t), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for t in args] + rest
    new_args[-1] = new_args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    edits.replace[plan.loop_line] = [*statements("\n".join(pre)),
                                     loop.with_changes(iter=call.with_changes(args=new_args), leading_lines=[])]
    idx = names["idx"]
    store = [f"# split reduction: this slice's states, as float32 partials for {plan.combine_kernel}",
             f"{idx} = {_program(True)} * {PARAM} + {sp}"]
    for s in plan.states:
        size, offs = _offsets(s.shape)
        at = f"{idx} * ({size})" if size else idx
        store.append(f"tl.store({parts[s.name]} + {at}{offs}, {s.name})")
    for i, line in enumerate(plan.after_lines):
        edits.replace[line] = statements("\n".join(store)) if i == 0 else []
    return function_copy(apply_edits(source, edits, parsed), plan.kernel, plan.split_kernel)


def _combine_kernel(source: str, parsed: Parsed, plan: Plan, names: dict[str, str],
                    parts: dict[str, str]) -> cst.FunctionDef:
    edits = Edits()
    edits.params[plan.kernel] = [parts[s.name] for s in plan.states] + [f"{PARAM}: tl.constexpr"]
    idx, j, mj = names["idx"], names["j"], names["m_j"]
    the_max = next((s for s in plan.states if s.kind == "max"), None)

    def load(s: State) -> str:
        size, offs = _offsets(s.shape)
        at = f"({idx} + {j}) * ({size})" if size else f"{idx} + {j}"
        return f"tl.load({parts[s.name]} + {at}{offs})"

    code = [f"# split reduction: the {PARAM} slices' partial states of this program, combined in slice order",
            f"{idx} = {_program(False)} * {PARAM}"]
    if the_max is not None:
        code += [f"for {j} in tl.static_range({PARAM}):",
                 f"    {the_max.name} = tl.maximum({the_max.name}, {load(the_max)})"]
    rest = [s for s in plan.states if s.kind != "max"]
    if rest:
        code.append(f"for {j} in tl.static_range({PARAM}):")
        if any(s.kind == "rescaled" for s in rest):
            code.append(f"    {mj} = {load(the_max)}")
        for s in rest:
            if s.kind == "sum":
                code.append(f"    {s.name} = {s.name} + {load(s)}")
                continue
            mapping = {the_max.name: ast.Name(mj, ast.Load()),
                       **{n: ast.Name(the_max.name, ast.Load()) for n in plan.new_max}}
            f = ast.unparse(Inline(mapping).visit(copy.deepcopy(s.factor)))
            # a slice that saw only -inf (an empty slice, a masked block) adds nothing, even where its sum is NaN
            w = names[f"w:{s.name}"]
            code += [f"    {w} = {f}", f"    {s.name} = {s.name} + tl.where({w} > 0, {load(s)} * {w}, 0.0)"]
    edits.replace[plan.loop_line] = statements("\n".join(code))
    return function_copy(apply_edits(source, edits, parsed), plan.kernel, plan.combine_kernel)


def apply(source: str, plan: Plan, split: int, when: str | None = None) -> str:
    """``source`` with ``plan`` applied: ``split`` programs per program of the kernel, then the combine; with
    ``when`` (a host test such as ``n_rows <= 256``) only at the shapes it holds for, the kernel as written at the
    others."""
    source = hoist_program_ids(source)
    model = parse_kernel(source)
    parsed = Parsed.of(source)
    fn = model.functions[plan.kernel].node
    taken = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} | set(model.functions[plan.kernel].params)
    names: dict[str, str] = {}
    for base in ("sp", "n_it", "it_per", "it_lo", "it_hi", "part_idx", "sj", "m_j"):
        names[base] = fresh_name(taken, base)
        taken.add(names[base])
    names.update(n=names["n_it"], per=names["it_per"], lo=names["it_lo"], hi=names["it_hi"], idx=names["part_idx"],
                 j=names["sj"])
    parts = {}
    for s in plan.states:
        parts[s.name] = fresh_name(taken, f"{s.name}_part")
        names[f"w:{s.name}"] = fresh_name(taken | {parts[s.name]}, f"w_{s.name}")
        taken |= {parts[s.name], names[f"w:{s.name}"]}
    split_fn = _split_kernel(source, parsed, model, plan, names, parts)
    combine_fn = _combine_kernel(source, parsed, plan, names, parts)
    return _host(source, parsed, model, plan, split, when, split_fn, combine_fn, parts)


def _host(source: str, parsed: Parsed, model, plan: Plan, split: int, when: str | None, split_fn: cst.FunctionDef,
          combine_fn: cst.FunctionDef, parts: dict[str, str]) -> str:
    site = single_launch(model, plan.kernel)
    host = enclosing_function(model, site)
    if host is None:
        raise NotApplicable(f"the launch of {plan.kernel} at line {site.line} is not inside a function")
    grid = launch_grid(model, site)
    bound = launch_bindings(site, model.functions[plan.kernel], source)
    taken = {n.id for n in ast.walk(host) if isinstance(n, ast.Name)} | {a.arg for a in host.args.args}
    split_var = fresh_name(taken, "split_r")
    grid_var = fresh_name(taken | {split_var}, "grid_r")
    bufs = {}
    for s in plan.states:
        bufs[s.name] = fresh_name(taken | {split_var, grid_var, *bufs.values()}, f"{s.name}_partials")
    tensor = _a_tensor_argument(model, site, bound)
    launch = next(n for n in walk(parsed.module) if isinstance(n, cst.Call) and parsed.line(n) == site.line
                  and isinstance(n.func, cst.Subscript))
    code = cst.Module([]).code_for_node
    grid_src = code(launch.func.slice[0].slice.value)
    if grid.kind == "lambda":
        grid_src = f"({', '.join(segment_of(source, e) or ast.unparse(e) for e in grid.elements)},)"
    axes = len(grid.elements)
    programs = " * ".join(f"{grid_var}[{i}]" for i in range(axes))

    def relaunch(name: str, grid_text: str) -> str:
        el = launch.func.slice[0]
        c = launch.with_changes(func=cst.Subscript(value=cst.Name(name), slice=[
            el.with_changes(slice=cst.Index(value=expr(grid_text)))]))
        return code(set_call_kwargs(c, {**{parts[s.name]: bufs[s.name] for s in plan.states}, PARAM: split_var}))

    def host_size(s: State) -> str:
        dims = [d if d.isdigit() else bound[d] if bound[d].isidentifier() else f"({bound[d]})" for d in s.shape]
        return " * ".join([programs, split_var, *dims])

    kinds = ", ".join(s.name for s in plan.states)
    block = [f"# split reduction: {split_var} programs per program of {plan.kernel}, each over a slice of its loop; "
             f"their partial {kinds}", f"# go to {plan.combine_kernel}, which combines them and runs the rest",
             f"{split_var} = {split}", f"{grid_var} = {grid_src}"]
    block += [f"{bufs[s.name]} = torch.empty({host_size(s)}, device={tensor}.device, dtype=torch.float32)"
              for s in plan.states]
    wide = ", ".join([f"{grid_var}[0] * {split_var}"] + [f"{grid_var}[{i}]" for i in range(1, axes)])
    wide = f"({wide},)" if axes == 1 else f"({wide})"
    block += [relaunch(plan.split_kernel, wide), relaunch(plan.combine_kernel, grid_var)]
    block = branch_block(block, when, code(launch))
    statement = next(st for st in ast.walk(host) if isinstance(st, ast.Expr) and st.value is site.node)
    host_edits = Edits()
    host_edits.replace[statement.lineno] = statements("\n".join(block))
    try:
        out = apply_edits(source, host_edits, parsed)
        return place_copies(out, plan.kernel, [split_fn, combine_fn], keep=when is not None)
    except LookupError as exc:
        raise NotApplicable(f"the split-reduction edit could not be placed ({exc})") from None


def _a_tensor_argument(model, site, bound: dict[str, str]) -> str:
    """The host expression of a tensor the launch passes (its device holds the partials)."""
    fn = model.functions[site.kernel]
    for p in fn.params:
        text = bound.get(p)
        if text and text.isidentifier() and p not in fn.constexpr_params:
            names = _host_tensors(model, site)
            if names is None or text in names:
                return text
    raise NotApplicable(f"no tensor argument of the launch at line {site.line} is a plain name (the partials are "
                        "allocated on its device)")


def _host_tensors(model, site) -> set[str] | None:
    """Names the launching function reads ``.device``/``.shape``/``.stride`` of, or gets as a tensor from torch:
    a plain name passed to a pointer parameter is one of them in every wrapper seen; None when nothing tells."""
    host = enclosing_function(model, site)
    if host is None:
        return None
    out = set()
    for n in ast.walk(host):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.attr in (
                "device", "shape", "stride", "dtype", "contiguous", "is_contiguous", "numel", "size", "element_size"):
            out.add(n.value.id)
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) and \
                isinstance(n.value, ast.Call) and (dotted_name(n.value.func) or "").startswith("torch."):
            out.add(n.targets[0].id)
    return out or None
