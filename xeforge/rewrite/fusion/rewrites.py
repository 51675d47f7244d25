"""The fusion rewrites: fewer launches and fewer round trips of an intermediate through memory.

Owns:

- :func:`fuse_consumer_kernel` — an elementwise Triton kernel that reads exactly the tile another kernel
  wrote (same tensor, same flat index, same bound) is folded into the producer: its body runs on the
  producer's tile before the producer's one store, the consumer's launch and definition go away.
- :func:`fuse_forward_ops` — elementwise torch ops after a launch in ``Model.forward`` (translated by
  :mod:`xeforge.rewrite.fusion.tl_ops`, lowered from one primitive table) become ``tl`` code in the kernel's
  epilogue; a trailing ``.to(dtype)`` of the result becomes the output buffer's dtype; several returned values of
  the tile are each stored.
- :func:`fuse_row_reduction` — a row reduction (sum, mean, max, min, amax, amin, logsumexp over the last
  dim) after a 2D-tiled kernel, with the elementwise ops around it, when one tile can cover the row:
  the column block becomes ``next_power_of_2(N)`` (one program per row block) and the kernel stores one
  value per row. Not applicable, with the reason, when N at the spec's largest shapes needs a tile wider
  than :data:`MAX_ROW_TILE`.
- :func:`fuse_split_row_reduction` — the same reduction when no tile covers the row (sum, mean, max, min,
  logsumexp): each tile writes its row partial into a small partials buffer and forward's reduction runs on
  that buffer with the same torch call (a mean's partial is the tile's sum / N times the slot count); the full
  output is no longer written, unless forward reads the reduced tile again after it (``m = y.mean(1,
  keepdim=True)``, then ``y - m``): the kernel then stores the tile as before, and forward's later ops read it.
  An ``avg_pool1d`` over the features before it (stride = window, a power of two up to 16) runs inside the tile as a reshape-and-mean.
- ``group-norm`` (:mod:`xeforge.rewrite.fusion.norm`) — ``F.group_norm`` and the elementwise ops after it as
  one generated kernel.
- ``combine-partials`` (:mod:`xeforge.rewrite.fusion.combine`) — forward's reduction of a kernel's partials and
  the small ops after it as one generated kernel (it follows the split or the GroupNorm's partials in a chain).
- :func:`fuse_all` — one of them followed by any others that then apply (e.g. torch ops fused first make a
  consumer kernel adjacent to its producer).

The fused kernels keep the producer's masks (ragged shapes stay correct) and output dtype; the new
``forward`` only drops torch ops and allocations, never adds compute (gate 1 rule S020).
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field
from typing import Any, Callable

import libcst as cst

from xeforge.kernel_model import LaunchSite, axis_blocks, dotted_name, literal
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.context import Ctx, dead_code, fresh_namer, loads, pure_stmt
from xeforge.rewrite.cst_tools import (Edits, Substitute, add_to_list_kwarg, apply_edits, body_statements, code, names_in, rename,
                                       set_call_kwargs, small, statements)
from xeforge.rewrite.dtype_narrow import narrow_intermediates
from xeforge.analysis.launches import live_launches
from xeforge.analysis.forward_env import Val
from xeforge.rewrite.fusion.combine import combine_partials
from xeforge.rewrite.fusion.common import (SPLIT_IDENTITY, SPLIT_KINDS, _is_to_dtype, _last_assign, _operand_resolver,
                                           _reduction, row_reduce_lines, traced_scalar, traced_shape)
from xeforge.rewrite.fusion.norm import group_norm_kernel
from xeforge.rewrite.fusion.tile import TileStore, elementwise_kernel, tile_store
from xeforge.rewrite.fusion.tl_ops import VALUE_VIEWS, EpilogueBuilder, Unsupported, reduction_call

#: widest column tile a fused row reduction keeps in registers (BLOCK_N = next_power_of_2(N) must not exceed it)
MAX_ROW_TILE = 256
#: smallest column tile (tl.dot needs N >= 16 on the GPUs we target)
MIN_DOT_N = 16
#: partial slots per row: cdiv(N, SPLIT_MIN_BLOCK) covers any column tile a later stage may choose
SPLIT_MIN_BLOCK = 16


def _store_stmt(ts: TileStore, value: str, pointer: str | None = None, mask: str | None = "__keep__") -> str:
    mask = ts.mask_src if mask == "__keep__" else mask
    m = f", mask={mask}" if mask else ""
    return f"tl.store({pointer or ts.ptr_src}, {value}{m})"


def store_with_value(ts: TileStore, value: str) -> cst.BaseStatement:
    """The kernel's original store statement (its formatting kept) storing ``value`` instead."""
    stmt = ts.stmt_node
    sm = small(stmt)
    call = sm.value
    args = []
    positional = 0
    for a in call.args:
        if (a.keyword is None and positional == 1) or (a.keyword is not None and a.keyword.value == "value"):
            a = a.with_changes(value=cst.parse_expression(value))
        if a.keyword is None:
            positional += 1
        args.append(a)
    return stmt.with_changes(body=[sm.with_changes(value=call.with_changes(args=args))], leading_lines=[])


def _comment_stmts(comment: str, body: list[str]) -> list[cst.BaseStatement]:
    text = "\n".join([f"# {comment}", *body])
    return statements(text)


# ------------------------------------------------------------------------------------------------ (a) consumer kernel
@dataclass
class ConsumerPair:
    producer: LaunchSite
    consumer: LaunchSite
    tile: TileStore
    y: str  # the intermediate the producer writes and the consumer reads
    out: str  # the consumer's output


def consumer_pairs(c: Ctx) -> tuple[list[ConsumerPair], list[str]]:
    """Producer/consumer launch pairs that can fuse, and why the other launches cannot."""
    pairs, why = [], []
    for site in c.model.launches:
        if site.function != "forward":
            continue
        try:
            ek = elementwise_kernel(c.parsed, site.kernel)
        except NotApplicable as exc:
            if len(c.model.launches) > 1 and site is not c.model.launches[0]:
                why.append(str(exc))
            continue
        bind = c.env.binding(site)
        inputs = {q: bind.get(q) for q in ek.flat_loads}
        names = {q: a.id for q, a in inputs.items() if isinstance(a, ast.Name)}
        prods = []
        for prod in c.model.launches:
            if prod.line >= site.line or prod.function != "forward":
                continue
            try:
                ts = tile_store(c.parsed, prod.kernel)
            except NotApplicable:
                continue
            pb = c.env.binding(prod)
            ya = pb.get(ts.ptr_param)
            if isinstance(ya, ast.Name) and ya.id in names.values():
                prods.append((prod, ts, ya.id))
        if not prods:
            why.append(f"{site.kernel} (line {site.line}) reads no tensor that an earlier kernel's tile store wrote")
            continue
        prod, ts, y = prods[-1]
        try:
            out = _check_pair(c, prod, site, ts, ek, y)
        except NotApplicable as exc:
            why.append(str(exc))
            continue
        pairs.append(ConsumerPair(prod, site, ts, y, out))
    return pairs, why


def _check_pair(c: Ctx, prod: LaunchSite, cons: LaunchSite, ts: TileStore, ek, y: str) -> str:
    c.stmt_of(prod)
    c.stmt_of(cons)
    for s in c.between(prod.line, cons.line):
        if not pure_stmt(s, c.env):
            if any(isinstance(n, ast.Name) and n.id == y for n in ast.walk(s)):
                raise NotApplicable(f"{cons.kernel} reads {y} after line {s.lineno} ({c.seg(s).splitlines()[0]}), "
                                    f"not the tile {prod.kernel} wrote")
            raise NotApplicable(f"line {s.lineno} ({c.seg(s).splitlines()[0]}) runs between {prod.kernel} and "
                                f"{cons.kernel}")
    if len(c.launches_of(prod.kernel)) != 1 or len(c.launches_of(cons.kernel)) != 1:
        raise NotApplicable(f"{prod.kernel} or {cons.kernel} is launched more than once")
    if c.called_in_jit(cons.kernel) or c.called_in_jit(prod.kernel):
        raise NotApplicable(f"{prod.kernel} or {cons.kernel} is also called from another jit function")
    bind = c.env.binding(cons)
    outa = bind.get(ek.out_param)
    if not isinstance(outa, ast.Name):
        raise NotApplicable(f"{cons.kernel}'s output is not a plain tensor variable")
    if outa.id != y and loads(c.after(cons.line), y):
        raise NotApplicable(f"{y} is used again after {cons.kernel}; fusing would lose the value {prod.kernel} wrote")
    yv = c.env.lookup(y, prod.line)
    ov = c.env.lookup(outa.id, cons.line)
    if not (yv.is_tensor and yv.shape and yv.contiguous):
        raise NotApplicable(f"{y}'s shape or contiguity is not known from its allocation (flat indexing needs a "
                            "contiguous tensor)")
    if not (ov.is_tensor and ov.shape == yv.shape and ov.contiguous):
        raise NotApplicable(f"{outa.id} is not a contiguous tensor with {y}'s shape")
    # the consumer's bound covers exactly the tile: n == y.numel()
    if ek.n_param is None or ek.n_param not in bind:
        raise NotApplicable(f"{cons.kernel}'s element count is not passed")
    if not _is_numel(c, bind[ek.n_param], yv, cons.line):
        raise NotApplicable(f"{cons.kernel}'s bound {c.seg(bind[ek.n_param])} is not {y}.numel()")
    for q, k in ek.flat_loads.items():
        a = bind.get(q)
        if isinstance(a, ast.Name) and a.id == y:
            continue
        av = c.env.eval(a, cons.line) if a is not None else None
        if not (av is not None and av.is_tensor and av.shape == yv.shape and av.contiguous):
            raise NotApplicable(f"{cons.kernel} also reads {q} element by element, which is not a contiguous "
                                f"tensor of {y}'s shape")
    for q in ek.constexprs:
        if q != ek.block_param:
            raise NotApplicable(f"{cons.kernel} has a constexpr parameter {q} besides its block size")
    return outa.id


def _is_numel(c: Ctx, node: ast.AST, yv: Val, line: int) -> bool:
    v = c.env.eval(node, line)
    if v.kind == "scalar" and v.value == ("numel",) + tuple(yv.shape):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and len(yv.shape) == 2:
        a, b = c.env.eval(node.left, line), c.env.eval(node.right, line)
        return a.kind == b.kind == "scalar" and (a.value, b.value) == tuple(yv.shape)
    return False


def fuse_consumer_kernel(source: str, problem: Any) -> tuple[str, str]:
    c = Ctx(source, problem)
    if len(c.model.launches) < 2:
        names = ", ".join(s.kernel for s in c.model.launches) or "none"
        raise NotApplicable(f"forward launches one kernel ({names}); there is no second kernel to fold in")
    pairs, why = consumer_pairs(c)
    if not pairs:
        raise NotApplicable("; ".join(why) or "no elementwise kernel reads another kernel's output")
    p = pairs[0]
    prod, cons, ts, y, out = p.producer, p.consumer, p.tile, p.y, p.out
    ek = elementwise_kernel(c.parsed, cons.kernel)
    cbind, pbind = c.env.binding(cons), c.env.binding(prod)
    replaced = [q for q in ek.flat_loads if isinstance(cbind.get(q), ast.Name) and cbind[q].id == y]
    skip_loads = [n for q in replaced for n in ek.flat_nodes[q]]
    for q in replaced:
        if ek.uses(q, skip_loads):
            raise NotApplicable(f"{cons.kernel} uses {q} other than to load the tile")
    # where the fused launch goes: in place (out is y), aliasing (out = empty_like(y)), or moved to the consumer
    out_bind = next((s for s in c.fwd if isinstance(s, ast.Assign) and len(s.targets) == 1
                     and isinstance(s.targets[0], ast.Name) and s.targets[0].id == out and s.lineno < cons.line), None)
    mode = "move"
    if out == y:
        mode = "inplace"
    elif out_bind is not None and isinstance(out_bind.value, ast.Call) \
            and (dotted_name(out_bind.value.func) or "").endswith("empty_like") and out_bind.value.args \
            and isinstance(out_bind.value.args[0], ast.Name) and out_bind.value.args[0].id == y \
            and not any(k.arg == "dtype" for k in out_bind.value.keywords) \
            and loads([s for s in c.fwd if out_bind.lineno < s.lineno < cons.line], out) == 0:
        mode = "alias"
    if mode == "move":
        moved = c.env.assigned_between(prod.line, cons.line) - {y}
        used = {n.id for a in prod.node.args + [k.value for k in prod.node.keywords] for n in ast.walk(a)
                if isinstance(n, ast.Name)} | {n.id for n in ast.walk(prod.node.func) if isinstance(n, ast.Name)}
        clash = moved & used
        if clash:
            raise NotApplicable(f"{prod.kernel}'s launch cannot move after {cons.kernel}: "
                                f"{', '.join(sorted(clash))} change in between")
    # carried parameters
    cfn = c.parsed.function(cons.kernel)
    fresh = fresh_namer(ts.names | set(ts.params) | names_in(cfn))
    taken = ts.names | set(ts.params)
    mapping: dict[str, str] = {ek.out_param: ts.ptr_param}
    new_params: list[str] = []
    kwargs: dict[str, str] = {}
    later = c.env.assigned_between(prod.line, cons.line)
    for q in ek.params:
        if q in replaced or q == ek.out_param:
            continue
        if q == ek.n_param and not ek.uses(q, []):
            continue
        if q == ek.block_param and not ek.uses(q, []):
            continue
        a = cbind.get(q)
        if a is None:
            raise NotApplicable(f"{cons.kernel}'s parameter {q} is not passed at its launch")
        src = c.seg(a)
        if mode != "move":
            names = {n.id for n in ast.walk(a) if isinstance(n, ast.Name)}
            if names & later:
                raise NotApplicable(f"{cons.kernel}'s argument {src} is computed after {prod.kernel}'s launch")
        same = [pp for pp, pa in pbind.items() if pp not in ts.constexprs and c.seg(pa) == src
                and not ({n.id for n in ast.walk(pa) if isinstance(n, ast.Name)} & later)]
        if same:
            mapping[q] = same[0]
        else:
            mapping[q] = q if q not in taken else fresh(q)
            taken.add(mapping[q])
            new_params.append(mapping[q])
            kwargs[mapping[q]] = src
    # the consumer's locals that clash with the producer's names
    for n in sorted(names_in(cfn.body)):
        if n in mapping or n in ek.params or n in ("tl", "triton", "float", "int"):
            continue
        if n in ts.names or n in new_params:
            mapping[n] = fresh(n)
    tile = ts.value_src if ts.value_is_name else fresh("tile")
    lines: list[str] = []
    if not ts.value_is_name:
        lines.append(f"{tile} = {ts.value_src}")
    if ek.uses(ek.offs, skip_loads):
        mapping[ek.offs] = fresh(ek.offs)
        lines.append(f"{mapping[ek.offs]} = {ts.offset_src}")
    if ek.mask is not None and ek.uses(ek.mask, skip_loads):
        if ts.mask_src is None:
            raise NotApplicable(f"{cons.kernel} uses its mask but {prod.kernel}'s store has none")
        mapping[ek.mask] = fresh(ek.mask)
        lines.append(f"{mapping[ek.mask]} = {ts.mask_src}")
    ids = {id(n) for n in skip_loads}
    tile_node = cst.Name(tile)

    def subst(node: cst.CSTNode):
        return tile_node if id(node) in ids else None

    body = []
    for s in ek.body:
        s2 = s.visit(Substitute(subst))
        body.append(rename(s2, mapping))
    value = rename(ek.store_value.visit(Substitute(subst)), mapping)
    head = _comment_stmts(f"fused from {cons.kernel}: its elementwise body runs on this tile before the one store",
                          lines) if lines else []
    store = store_with_value(ts, code(value))
    store = store.with_changes(leading_lines=list(getattr(ek.store_stmt, "leading_lines", ())))
    epilogue = [*head, *body, store]
    if not head:
        cm = cst.EmptyLine(comment=cst.Comment(f"# fused from {cons.kernel}: its elementwise body runs on this "
                                               "tile before the one store"))
        epilogue[0] = epilogue[0].with_changes(leading_lines=[cm, *epilogue[0].leading_lines])
    edits = Edits()
    edits.replace[ts.line] = epilogue
    if ts.cast_line:
        edits.replace[ts.cast_line] = []
    if new_params:
        edits.params[prod.kernel] = new_params
    edits.remove_functions.add(cons.kernel)

    def launch_edit(call: cst.Call) -> cst.Call:
        call = set_call_kwargs(call, kwargs) if kwargs else call
        if mode == "move":
            call = call.with_changes(args=[a.with_changes(value=rename(a.value, {y: out})) for a in call.args])
        return call

    if mode == "inplace":
        edits.replace[cons.line] = []
        edits.calls[prod.line] = launch_edit
    elif mode == "alias":
        # out was a fresh buffer like y: the producer's buffer serves, and later statements name it
        edits.replace[out_bind.lineno] = []
        edits.replace[cons.line] = []
        for s in c.after(cons.line):
            if loads([s], out) or any(isinstance(n, ast.Name) and n.id == out for n in ast.walk(s)):
                edits.replace[s.lineno] = [rename(c.cst_stmt(s.lineno), {out: y})]
        edits.calls[prod.line] = launch_edit
    else:
        stmt = c.cst_stmt(prod.line)
        sm = small(stmt)
        new_call = launch_edit(sm.value)
        edits.replace[prod.line] = []
        edits.replace[cons.line] = [stmt.with_changes(body=[sm.with_changes(value=new_call)])]
    new = apply_edits(source, edits, c.parsed)
    dead = {n.id for n in ast.walk(cons.node) if isinstance(n, ast.Name)} | {y}
    new = dead_code(new, dead)
    desc = (f"fused {cons.kernel} into {prod.kernel}'s store: one launch instead of two, {y} no longer "
            f"round-trips through memory (line {cons.line})")
    return new, desc


# ------------------------------------------------------------------------------------------------ (b)/(c) op chains
@dataclass
class Chain:
    site: LaunchSite
    tile: TileStore
    y: str
    builder: EpilogueBuilder
    stmts: list[ast.stmt] = field(default_factory=list)  # translated forward statements (deleted on fusion)
    cur: str = ""  # the name holding the result after the chain
    tile_var: str = ""  # the kernel variable the epilogue starts from
    reduction: dict | None = None  # {"kind", "keepdim", "line", "src"}
    broadcast: list[str] = field(default_factory=list)  # row reductions whose [rows, 1] result a later op reads
    pool: dict | None = None  # split mode: {"param": constexpr name or None, "size": its source} of an avg_pool1d
    to_dtype: ast.AST | None = None  # a trailing .to(D) absorbed into the output buffer
    ret: ast.Return | None = None  # the return statement when the chain ends there
    stop: str = ""  # why the chain ended before the return
    ops: list[str] = field(default_factory=list)
    older: set[str] = field(default_factory=set)  # names of values the chain went past (y included)
    #: several outputs: the forward names ``return a, b, ...`` returns, each a value of the tile (the result, or an
    #: earlier value the epilogue kept); None for one output
    outputs: list[str] | None = None
    #: reshapes the chain went through that keep the last dim (``y.reshape(*x.shape[:-1], N)``: a wrapper giving
    #: back the caller's leading dims): the same elements, so the ops after them run in the tile and the result is
    #: the buffer seen through them, in order
    views: list[ast.Call] = field(default_factory=list)


def _avg_pool(node: ast.AST, cur: str) -> ast.expr | None:
    """The window of ``F.avg_pool1d(cur.unsqueeze(1), k).squeeze(1)`` (stride = window, no padding), else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "squeeze"
            and [literal(a) for a in node.args] == [1] and isinstance(node.func.value, ast.Call)):
        return None
    pool = node.func.value
    if (dotted_name(pool.func) or "").rsplit(".", 1)[-1] != "avg_pool1d" or not pool.args:
        return None
    src = pool.args[0]
    if not (isinstance(src, ast.Call) and isinstance(src.func, ast.Attribute) and src.func.attr == "unsqueeze"
            and isinstance(src.func.value, ast.Name) and src.func.value.id == cur
            and [literal(a) for a in src.args] == [1]):
        return None
    kw = {k.arg: k.value for k in pool.keywords}
    size = pool.args[1] if len(pool.args) > 1 else kw.pop("kernel_size", None)
    kw.pop("kernel_size", None)
    stride = pool.args[2] if len(pool.args) > 2 else kw.pop("stride", None)
    if size is None or len(pool.args) > 3 or (stride is not None and ast.dump(stride) != ast.dump(size)) \
            or any(literal(v) not in (0, False, True) or k not in ("padding", "ceil_mode", "count_include_pad")
                   for k, v in kw.items()) or literal(kw.get("padding", ast.Constant(0))) != 0 \
            or literal(kw.get("ceil_mode", ast.Constant(False))) is not False:
        raise Unsupported(f"{ast.unparse(node)}: only avg_pool1d with stride = window and no padding is fused")
    return size


def _translate_pool(c: Ctx, ch: Chain, site: LaunchSite, size: ast.expr, line: int) -> None:
    """A windowed mean over ``size`` adjacent columns, inside the tile (split mode: a row reduction must follow)."""
    b, ts = ch.builder, ch.tile
    if ch.pool is not None or ch.reduction is not None or b.column is None:
        raise Unsupported("only one avg_pool1d, on the full tile before the row reduction, is fused")
    val = c.env.eval(size, line)
    sizes = _dim_values(c, val) if val.kind == "scalar" else []
    if isinstance(literal(size), int):
        sizes = [("all", literal(size))]
    if not sizes or len(sizes) < len(c.problem.spec.variants) and not isinstance(literal(size), int):
        raise Unsupported(f"cannot tell the pool window {ast.unparse(size)} at every spec variant")
    bad = [f"{k}={v}" for k, v in sizes if v < 1 or v & (v - 1) or v > MIN_DOT_N]
    if bad:
        raise Unsupported(f"pool window {', '.join(bad)}: only powers of two up to {MIN_DOT_N} divide every column tile")
    block, _ = _col_block(c, ts, site)
    tile = _col_tile_index(c, ts, block)
    if isinstance(literal(size), int):
        p, pool = str(literal(size)), {"param": None, "size": str(literal(size))}
    else:
        src = c.env.canonical(size, line)
        if src is None:
            raise Unsupported(f"the pool window {ast.unparse(size)} is a forward local, not a model attribute or dim")
        p = b.fresh("POOL")
        pool = {"param": p, "size": src}
    v, pooled, offs = b.var, b.fresh("pooled"), b.fresh("offs_pool")
    b.lines.append(f"{pooled} = tl.sum(tl.reshape({v}, ({v}.shape[0], {v}.shape[1] // {p}, {p})), axis=2) / {p}")
    b.lines.append(f"{offs} = {tile} * ({block} // {p}) + tl.arange(0, {block} // {p})")
    b.var, b.column = pooled, (offs, f"({ts.cols[1]} // {p})")
    b.ops.append("avg_pool1d")
    ch.pool = pool


#: the forward name the op inside a returned tuple stands for (``return y, torch.relu(y)``): no source has it
RETURNED = "__xeforge_returned__"


def op_chain(c: Ctx, site: LaunchSite, allow_reduction: bool, split: bool = False, outputs: bool = False) -> Chain:
    """The forward statements after ``site`` that translate into its epilogue (raises NotApplicable if none).

    ``split``: the chain ends with its first row reduction, computed per tile (see :func:`fuse_split_row_reduction`).
    ``outputs``: a return of several values of the tile (``z = torch.relu(y); return y, z``, or one op in the tuple:
    ``return y, torch.relu(y)``) ends the chain, each value stored by the kernel (:attr:`Chain.outputs`).
    """
    c.stmt_of(site)
    ts = tile_store(c.parsed, site.kernel)
    bind = c.env.binding(site)
    ya = bind.get(ts.ptr_param)
    if not isinstance(ya, ast.Name):
        raise NotApplicable(f"{site.kernel} does not store into a plain tensor variable")
    y = ya.id
    yv = c.env.lookup(y, site.line)
    if yv.is_tensor and yv.shape is None:  # a buffer a wrapper sized from shapes it read: the trace knows it
        yv = Val("tensor", traced_shape(c.problem, launch=(site.kernel, ts.ptr_param)),
                 contiguous=yv.contiguous, src=yv.src, line=yv.line)
    if len(c.launches_of(site.kernel)) != 1 or c.called_in_jit(site.kernel):
        raise NotApplicable(f"{site.kernel} is launched more than once")
    fresh = fresh_namer(ts.names | set(ts.params))
    var = ts.value_src if ts.value_is_name else fresh("out")
    col = ts.cols if ts.two_d else None
    state = {"line": site.line}
    b = EpilogueBuilder(var, {y}, lambda n: None, fresh, column=col, rows=ts.rows if ts.two_d else None)
    b.resolve = _operand_resolver(c, site, yv, fresh, {}, state)
    ch = Chain(site, ts, y, b, cur=y, tile_var=var)
    older: set[str] = set()  # forward names that held the tile's value at some point (not after the chain)
    live = {y}  # forward names whose value is the tile's value now; earlier values a later op reads are b.saved
    full = {y}  # forward names holding a full [rows, cols] value (not a row's reduction kept as [rows, 1])
    rest = c.after(site.line)

    def row_reduce(kind: str, value: str) -> str:
        """The row's ``kind`` reduction of the tile ``value`` as ``[rows, 1]`` (the fuse-row-reduction tactic
        widens the column tile so that one tile covers each row)."""
        if b.column is None or not ts.two_d:
            raise Unsupported(f"a {kind} over the row after the row reduction, or of a tile that is not 2D")
        offs_n, n = b.column
        row = b.fresh(f"row_{kind}")
        lines = row_reduce_lines(kind, value, f"{offs_n}[None, :] < {n}", row, b.fresh)
        if kind == "mean":
            lines[-1] += f" / {n}"
        b.lines.extend(lines)
        ch.broadcast.append(kind)
        return f"{row}[:, None]"

    if allow_reduction and not split:
        b.row_reduce = row_reduce

    def later_reads(after: int) -> set[str]:
        return {n.id for s2 in rest if s2.lineno > after for n in ast.walk(s2)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}

    def translate(value: ast.expr, lineno: int, target: str | None = None, keep: frozenset[str] = frozenset()) -> bool:
        """Translate one op on the tile into the epilogue (False, with ``ch.stop`` set, when it does not);
        ``target``: the forward name it assigns (the names that held the value before and are read again later
        keep it, b.saved; ``keep``: names to keep too, read later on the same line)."""
        snap = (len(b.lines), dict(b.operands), dict(b.loaded), len(b.ops), b.var, b.column, b.value_names, ch.pool,
                dict(b.saved))
        try:
            if target is not None:
                b.save(((live - {target}) & later_reads(lineno)) | (keep & live))
            pool = _avg_pool(value, ch.cur) if split else None
            red = None if pool is not None else _reduction(value, ch.cur)
            if red is not None and red[1] and b.row_reduce is not None and (live - {target}) & later_reads(lineno):
                red = None  # `m = y.mean(1, keepdim=True)` and y read again: m is broadcast back, not the result
            if pool is not None:
                _translate_pool(c, ch, site, pool, lineno)
            elif red is not None:
                if not allow_reduction:
                    raise Unsupported(f"{c.seg(value)} is a row reduction (the fuse-row-reduction tactic's shape)")
                _translate_reduction(ch, red, value, lineno, split)
            else:
                b.value_names = set(live)
                b.assign(value)
        except (Unsupported, NotApplicable) as exc:
            b.lines[snap[0]:] = []
            b.operands, b.loaded = snap[1], snap[2]
            b.ops[snap[3]:] = []
            b.var, b.column, b.value_names = snap[4], snap[5], snap[6]
            ch.pool = snap[7]
            b.saved = snap[8]
            ch.stop = f"line {lineno}: {exc}"
            return False
        return True

    def receiver(call: ast.expr) -> str | None:
        """``y`` of an in-place statement ``y.mul_(s)`` / ``y.mul_(s).add_(y0)``."""
        while isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr.endswith("_"):
            call = call.func.value
        return call.id if isinstance(call, ast.Name) else None

    def last_dim_view(node: ast.expr) -> str | None:
        """The tile name ``node`` reshapes keeping its last dim (``y.reshape(*x.shape[:-1], N)``, ``y.view(B, S,
        N)`` with N the column bound the launch passes), else None."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("reshape", "view") and isinstance(node.func.value, ast.Name)
                and node.func.value.id in live and node.args and not node.keywords and ts.two_d):
            return None
        last = node.args[-1]
        n = bind.get(ts.cols[1])
        if isinstance(last, ast.Starred) or n is None or ast.dump(last) != ast.dump(n):
            return None
        return node.func.value.id

    def value_of(node: ast.expr) -> str | None:
        """The tile name ``node`` stands for unchanged: ``y``, ``y.clone()``, ``y.detach()``, ``y.contiguous()``."""
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in VALUE_VIEWS and not node.args and not node.keywords:
            node = node.func.value
        return node.id if isinstance(node, ast.Name) and (node.id in live or node.id in b.saved) else None

    for s in rest:
        tiles = live | set(b.saved)
        if isinstance(s, ast.Return):
            names = {n.id for n in ast.walk(s.value) if isinstance(n, ast.Name)} if s.value is not None else set()
            if isinstance(s.value, ast.Name) and s.value.id == ch.cur:
                ch.ret = s
            elif s.value is not None and _is_to_dtype(s.value, ch.cur) is not None:
                ch.ret, ch.to_dtype = s, _is_to_dtype(s.value, ch.cur)
            elif outputs and isinstance(s.value, ast.Tuple) and len(s.value.elts) > 1 and \
                    all(value_of(e) is not None for e in s.value.elts) and \
                    any(value_of(e) in live for e in s.value.elts):
                ch.ret, ch.outputs = s, [value_of(e) for e in s.value.elts]
            elif outputs and isinstance(s.value, ast.Tuple) and len(s.value.elts) > 1 and \
                    sum(value_of(e) is None for e in s.value.elts) == 1 and names & tiles:
                # `return y, torch.relu(y)`: the one op of the tuple is the result, the other values are kept
                op = next(e for e in s.value.elts if value_of(e) is None)
                others = frozenset(value_of(e) for e in s.value.elts if e is not op)
                state["line"] = s.lineno
                if translate(op, s.lineno, RETURNED, keep=others):
                    live, ch.cur, ch.ret = {RETURNED}, RETURNED, s
                    ch.outputs = [RETURNED if e is op else value_of(e) for e in s.value.elts]
            elif s.value is not None and names & tiles and not (split and ch.reduction is not None):
                # `return y + residual`: the last op is the return's own expression
                state["line"] = s.lineno
                if translate(s.value, s.lineno, ch.cur):
                    ch.ret = s
                    if names & full and reduction_call(s.value) is None:
                        full.add(ch.cur)
                    else:
                        full.discard(ch.cur)
            else:
                ch.stop = f"line {s.lineno}: `{c.seg(s)}` is not a plain return of the result" + (
                    " (several outputs are fused when each is a name holding a value of the tile, the result among "
                    "them: `z = torch.relu(y)` then `return y, z`)" if outputs and isinstance(s.value, ast.Tuple)
                    else "")
            break
        state["line"] = s.lineno
        mentions = {n.id for n in ast.walk(s) if isinstance(n, ast.Name)}
        if pure_stmt(s, c.env) and not isinstance(s.value, ast.Name) and not (mentions & tiles):
            continue  # allocations, sizes, aliases of Model attributes stay where they are
        if _inert(s, ch.cur):
            continue  # a synchronize or an assert of something else: stays where it is, computes nothing
        launched = [l.kernel for l in c.model.launches if any(l.node is n for n in ast.walk(s))]
        if launched:
            ch.stop = (f"line {s.lineno}: {launched[0]} reads {ch.cur} (a kernel, not a torch op: the "
                       "fuse-elementwise-chain tactic's shape)" if mentions & tiles else
                       f"line {s.lineno}: another kernel ({launched[0]}) runs before any op on {ch.cur}")
            break
        if not mentions & tiles:
            ch.stop = f"line {s.lineno}: `{c.seg(s).splitlines()[0]}` is not an op on {ch.cur}"
            break
        if isinstance(s, ast.Expr) and receiver(s.value) in live and s.value is not None:
            target, value = receiver(s.value), s.value  # y.mul_(s).add_(y0): an op assigning y
        elif isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
            target, value = s.targets[0].id, s.value
        else:
            ch.stop = f"line {s.lineno}: `{c.seg(s).splitlines()[0]}` is not an assignment of an op on {ch.cur}"
            break
        viewed = last_dim_view(value) if not (split or allow_reduction) else None
        if viewed is not None:  # y.reshape(*x.shape[:-1], N): the same elements, the result seen through it
            ch.stmts.append(s)
            ch.views.append(value)
            older |= live
            live = {target}
            b.saved.pop(target, None)
            ch.cur = target
            continue
        alias = value_of(value)
        if alias is not None:  # y, y.clone(), y.detach(): another name for a value, no kernel code
            ch.stmts.append(s)
            older |= live
            if alias in live:
                live = live | {target}
                b.saved.pop(target, None)
            else:
                b.saved[target] = b.saved[alias]
                live = live - {target}
            if target in live:
                ch.cur = target
            continue
        if not translate(value, s.lineno, target):
            break
        ch.stmts.append(s)
        if ch.reduction is not None and ch.reduction["line"] == s.lineno:
            ch.reduction["reads"] = set(live)  # the names holding the full tile the reduction read
        reads = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
        if reads & full and reduction_call(value) is None:
            full.add(target)
        else:
            full.discard(target)
        older |= live
        live = {target}
        b.saved.pop(target, None)
        ch.cur = target
        if split and ch.reduction is not None:
            ch.stop = f"line {s.lineno}: the ops after the row reduction run on the combined partials"
            break
    ch.ops = list(b.ops)
    ch.older = (older | set(b.saved) | live) - {ch.cur}
    if ch.broadcast and ch.reduction is None and ch.cur not in full:
        raise NotApplicable(f"the ops after {site.kernel} end on a row's reduction kept as [rows, 1] while the full "
                            "tile is read too: the output's shape is not the kernel's tile")
    return ch


def _translate_reduction(ch: Chain, red: tuple[str, bool], value: ast.expr, line: int, split: bool = False) -> None:
    kind, keep = red
    b, ts = ch.builder, ch.tile
    if split and kind not in SPLIT_KINDS:
        raise Unsupported(f"{ast.unparse(value)}: per-tile partials of a {kind} do not combine with the same op")
    if ch.reduction is not None:
        # the value is already one per row: a reduction over a size-1 last dim is the identity
        if not ch.reduction["keepdim"]:
            raise Unsupported(f"{ast.unparse(value)} reduces across rows after the row reduction")
        ch.reduction["keepdim"] = keep
        b.ops.append(f"{kind}(size-1 dim)")
        return
    if not ts.two_d or ts.row_stride is None:
        raise Unsupported(f"{ts.fn}'s store is not a 2D tile with row and column offsets")
    offs_n, n = b.column or ts.cols  # after an avg_pool1d: the pooled columns
    cm = b.fresh("col_mask")
    row = b.fresh("row")
    b.lines.append(f"{cm} = {offs_n}[None, :] < {n}")
    lines = row_reduce_lines(kind, b.var, cm, row, b.fresh)
    if kind == "mean" and split:
        # forward takes the same mean over the partials' S = cdiv(N, SPLIT_MIN_BLOCK) slots (those no tile reduces
        # into hold 0): each tile's sum / N, times S, makes that mean the row's
        lines[-1] += f" / {n} * (({ts.cols[1]} + {SPLIT_MIN_BLOCK - 1}) // {SPLIT_MIN_BLOCK})"
    elif kind == "mean":
        lines[-1] += f" / {n}"
    b.lines += lines
    b.ops.append(kind)
    tile_var = b.var
    b.var, b.column = row, None
    ch.reduction = {"kind": kind, "keepdim": keep, "line": line, "src": ast.unparse(value), "tile_var": tile_var}


def _alloc_stmt(c: Ctx, name: str, before: int) -> ast.Assign | None:
    found = _last_assign(c, name, before)
    if found is not None and isinstance(found.value, ast.Call):
        fname = dotted_name(found.value.func) or ""
        if fname.startswith("torch.") and fname.rsplit(".", 1)[-1] in {"empty", "zeros", "empty_like", "zeros_like"}:
            return found
    return None


def _apply_chain(c: Ctx, ch: Chain, extra_launch: dict[str, str] | None = None,
                 grid_edit: tuple[ast.Tuple, int] | None = None, row_store: bool = False) -> tuple[str, bool]:
    """Rewrite the kernel's store into the chain's epilogue and drop the chain from forward.

    Returns the new source and whether a trailing ``.to(dtype)`` became the output buffer's dtype.
    """
    ts, b, site, y = ch.tile, ch.builder, ch.site, ch.y
    edits = Edits()
    # output dtype from a trailing .to(D): the buffer takes D, the kernel's store casts once
    alloc = _alloc_stmt(c, y, site.line)
    absorb = None
    if ch.to_dtype is not None and alloc is not None:
        dnames = {n.id for n in ast.walk(ch.to_dtype) if isinstance(n, ast.Name)}
        ok = all(n in c.env.params or n == "torch" or
                 any(line < alloc.lineno for line, nm, _ in c.env.bindings if nm == n) for n in dnames)
        others = [s for s in c.fwd if s is not alloc and s is not c.stmt_of(site) and s not in ch.stmts
                  and s is not ch.ret and not pure_stmt(s, c.env)]
        if ok and loads(others, y) == 0:
            absorb = c.seg(ch.to_dtype)
    if not b.ops and absorb is None:
        raise NotApplicable(ch.stop or f"nothing after {site.kernel}'s launch to fuse")
    if ch.views and ch.outputs:
        raise NotApplicable(f"forward returns several values after reshaping {y} "
                            f"({ast.unparse(ch.views[0])}): one output is fused through a reshape")
    # after the chain, y's buffer holds the chain's result: nothing may still want an earlier value
    last = max([s.lineno for s in ch.stmts] + [site.line])
    rest = [s for s in c.after(last) if s is not ch.ret]
    stale = sorted(n for n in (ch.older | {y}) - {ch.cur} if loads(rest, n))
    if stale:
        raise NotApplicable(f"{', '.join(stale)} is read after the ops that would be fused (it would see their result)")
    if row_store:
        users = [s for s in c.fwd if s is not alloc and s is not c.stmt_of(site) and s not in ch.stmts
                 and s is not ch.ret and loads([s], y)]
        if users:
            raise NotApplicable(f"line {users[0].lineno} also uses {y}, whose shape would become one column")
    lines = list(b.lines)
    if not ts.value_is_name:
        lines.insert(0, f"{ch.tile_var} = {ts.value_src}")
    extra = _extra_outputs(c, ch, alloc, edits) if ch.outputs else {}
    what = ", ".join(dict.fromkeys(ch.ops)) or "the output dtype"
    if row_store:
        offs_m, m = ts.rows
        store = _store_stmt(ts, ts.cast(b.var), f"{ts.ptr_param} + {offs_m} * {ts.row_stride}", f"{offs_m} < {m}")
        edits.replace[ts.line] = _comment_stmts(f"fused from Model.forward: {what}", [*lines, store])
    else:
        # the earlier values forward returns are stored together with the result, after every op: stored where
        # each is final instead, several-outputs' 128 x 256 tile ran 0.283 ms against 0.240 on an H100 (call Z2,
        # docs/measurements/ports-h100-2026-12-07g); the persistent stage's epilogue halves are what lower the
        # registers of such a tile
        head = _comment_stmts(f"fused from Model.forward: {what}", lines) if lines else []
        more = [_store_stmt(ts, f"{b.saved[name]}.to({param}.dtype.element_ty)", f"{param} + {ts.offset_src}")
                for name, (param, _) in extra.items()]
        edits.replace[ts.line] = [*head, *statements("\n".join(more)), store_with_value(ts, ts.cast(b.var))]
    if ts.cast_line:
        edits.replace[ts.cast_line] = []
    params = [q for op in b.operands.values() for q in op.params()] + [param for param, _ in extra.values()]
    if params:
        edits.params[site.kernel] = params
    kwargs = {k: v for op in b.operands.values() for k, v in op.launch_args().items()}
    kwargs.update(extra_launch or {})
    kwargs.update({param: buf for param, buf in extra.values()})
    if kwargs:
        edits.calls[site.line] = lambda call: set_call_kwargs(call, kwargs)
    # forward: the translated statements go; the result lives in y's buffer
    for s in ch.stmts:
        edits.replace[s.lineno] = []
    result = y
    if ch.reduction is not None and not ch.reduction["keepdim"]:
        result = f"{y}.squeeze(1)"
    for view in ch.views:  # the buffer seen through the chain's reshapes, as forward saw its result
        result = ast.unparse(ast.Call(ast.Attribute(ast.Name(result), view.func.attr), view.args, []))
    if ch.ret is not None and ch.outputs:
        # each returned value from the buffer that holds it: the result's is y's, an earlier value's its own; a
        # buffer returned again is a copy, as forward returned distinct tensors (y and its clone, say)
        given: list[str] = []
        for n in ch.outputs:
            buf = extra[n][1] if n in extra else result
            given.append(f"{buf}.clone()" if buf in given else buf)
        edits.replace[ch.ret.lineno] = statements("return " + ", ".join(given))
    elif ch.ret is not None:
        ret_val = result if absorb is not None or ch.to_dtype is None else f"{result}.to({c.seg(ch.to_dtype)})"
        edits.replace[ch.ret.lineno] = statements(f"return {ret_val}")
    elif ch.stmts and (ch.cur != y or result != y):
        edits.replace[ch.stmts[-1].lineno] = statements(f"{ch.cur} = {result}")
    if alloc is not None and (absorb is not None or row_store):
        def alloc_edit(call: cst.Call) -> cst.Call:
            if absorb is not None:
                call = set_call_kwargs(call, {"dtype": absorb})
            if row_store:
                first = call.args[0]
                if isinstance(first.value, (cst.Tuple, cst.List)) and len(first.value.elements) == 2:
                    els = list(first.value.elements)
                    els[1] = els[1].with_changes(value=cst.Integer("1"))
                    call = call.with_changes(args=[first.with_changes(value=first.value.with_changes(elements=els)),
                                                   *call.args[1:]])
                else:
                    raise NotApplicable(f"{y}'s allocation shape is not a literal (rows, cols) tuple")
            return call
        edits.plain_calls[alloc.lineno] = alloc_edit
    elif row_store:
        raise NotApplicable(f"{y} is not allocated with torch.empty/zeros in forward, so its shape cannot shrink "
                            "to one column")
    if grid_edit is not None:
        gnode, axis = grid_edit

        def grid_fn(t: cst.Tuple) -> cst.Tuple | None:
            if len(t.elements) != len(gnode.elts):
                return None
            els = list(t.elements)
            els[axis] = els[axis].with_changes(value=cst.Integer("1"))
            return t.with_changes(elements=els)

        edits.tuples[gnode.lineno] = grid_fn
    try:
        new = apply_edits(c.source, edits, c.parsed)
    except LookupError as exc:
        raise NotApplicable(f"could not rewrite the launch: {exc}") from None
    dead = {n.id for s in ch.stmts for n in ast.walk(s) if isinstance(n, ast.Name)}
    return dead_code(new, dead), absorb is not None


def _extra_outputs(c: Ctx, ch: Chain, alloc: ast.Assign | None, edits: Edits) -> dict[str, tuple[str, str]]:
    """For each earlier value of the tile that forward returns beside the result: the kernel parameter that receives
    its buffer and the buffer, allocated like y's after y's allocation (the same shape and strides, so the kernel
    stores it at the result's offsets). NotApplicable with the reason where that cannot hold."""
    ts, b, y = ch.tile, ch.builder, ch.y
    earlier = [n for n in dict.fromkeys(ch.outputs) if n in b.saved]
    if not earlier:
        return {}
    if alloc is None:
        raise NotApplicable(f"forward returns several values of {y}'s tile, and {y} is not allocated in forward: the "
                            "other outputs' buffers would have no shape to follow")
    if ts.offset_src == "0" or ts.ptr_src.strip() == ts.ptr_param:
        raise NotApplicable(f"{ch.site.kernel}'s store has no offsets from {ts.ptr_param} to store another output at")
    fresh = fresh_namer({n.id for n in ast.walk(c.model.tree) if isinstance(n, ast.Name)} | ts.names | set(ts.params))
    out = {name: (fresh(f"{name}_out_ptr"), fresh(f"{name}_out")) for name in earlier}
    edits.insert_after[alloc.lineno] = statements("\n".join(f"{buf} = torch.empty_like({y})"
                                                             for _, buf in out.values()))
    return out


def _first_forward_launch(c: Ctx, attempt: Callable[[LaunchSite], tuple[str, str]]) -> tuple[str, str]:
    """``attempt(site)`` on each launch in ``forward``; the first that applies, else every launch's reason."""
    why = []
    for site in c.model.launches:
        if site.function != "forward":
            continue
        try:
            return attempt(site)
        except NotApplicable as exc:
            why.append(f"{site.kernel}: {exc}")
    raise NotApplicable("; ".join(why) or not_in_forward(c))


def not_in_forward(c: Ctx) -> str:
    """Why there is no launch to fuse at: where the launches are instead (the fusion rewrites edit the statements of
    ``Model.forward``; a launch inside a wrapper, a method, an autograd Function or a custom op is not fused yet)."""
    live = live_launches(c.model)
    if not live:
        return "no kernel launch in the file"
    where = "; ".join(f"the launch of {s.kernel} (line {s.line}) is in {s.function}, not a statement of Model.forward"
                      for s in live)
    return f"{where}: the fusion rewrites work on launches written in forward (not yet through a wrapper)"


def fuse_forward_ops(source: str, problem: Any) -> tuple[str, str]:
    c = Ctx(source, problem)

    def attempt(site: LaunchSite) -> tuple[str, str]:
        ch = op_chain(c, site, allow_reduction=False, outputs=True)
        new, absorbed = _apply_chain(c, ch)
        ops = ", ".join(dict.fromkeys(ch.ops))
        parts = []
        if ch.stmts or ch.ops:
            what = f"{len(ch.stmts)} torch op statement(s)" if ch.stmts else "the returned expression's torch ops"
            if ch.stmts and ch.ret is not None and ch.to_dtype is None and not ch.outputs \
                    and not isinstance(ch.ret.value, ast.Name):
                what += " and the returned expression"
            parts.append(f"{what} ({ops}) after {site.kernel} now run in its epilogue")
            if ch.outputs:
                shown = ", ".join("the op in the return" if n == RETURNED else n for n in ch.outputs)
                parts.append(f"it stores each of the {len(ch.outputs)} returned values ({shown})")
        if absorbed:
            parts.append(f"{site.kernel} writes {c.seg(ch.to_dtype)} directly (no trailing cast pass)")
        return new, "; ".join(parts)

    return _first_forward_launch(c, attempt)


def _col_block(c: Ctx, ts: TileStore, site: LaunchSite) -> tuple[str, int]:
    """The constexpr that sizes the column tile and the grid axis it spans."""
    fn = c.parsed.function(ts.fn)
    offs_n = ts.cols[0]
    for s in body_statements(fn):
        sm = small(s)
        if isinstance(sm, cst.Assign) and len(sm.targets) == 1 and isinstance(sm.targets[0].target, cst.Name) \
                and sm.targets[0].target.value == offs_n:
            blocks = [p for p in ts.constexprs if p in names_in(sm.value)]
            if len(blocks) == 1:
                axes = axis_blocks(c.model.functions[ts.fn])
                ax = [a for a, names in axes.items() if blocks[0] in names]
                if len(ax) == 1:
                    return blocks[0], ax[0]
    raise NotApplicable(f"{ts.fn}'s column tile ({offs_n}) is not pid * BLOCK + arange on a grid axis of its own")


def fuse_row_reduction(source: str, problem: Any) -> tuple[str, str]:
    c = Ctx(source, problem)

    def attempt(site: LaunchSite) -> tuple[str, str]:
        ch = op_chain(c, site, allow_reduction=True)
        if ch.reduction is None and not ch.broadcast:
            raise NotApplicable(ch.stop or "no row reduction follows it")
        ts = ch.tile
        block, axis = _col_block(c, ts, site)
        bind = c.env.binding(site)
        nparam = ts.cols[1]
        if nparam not in bind:
            raise NotApplicable(f"the column bound {nparam} is not a kernel argument")
        nval = c.env.eval(bind[nparam], site.line)
        widths = _dim_values(c, nval) or traced_scalar(c.problem, site.kernel, nparam)
        if not widths:
            raise NotApplicable(f"cannot tell the row width {c.seg(bind[nparam])} at the spec's shapes")
        worst_variant, worst = max(widths, key=lambda kv: kv[1])
        need = max(MIN_DOT_N, 1 << max(0, (worst - 1).bit_length()))
        what = ch.reduction["src"] if ch.reduction else f"the row {', '.join(dict.fromkeys(ch.broadcast))} read back"
        if need > MAX_ROW_TILE:
            raise NotApplicable(
                f"{what} needs one tile to cover a row, but N={worst} at {worst_variant} would "
                f"need {block}={need} (> {MAX_ROW_TILE}, the widest tile kept in registers)")
        gnode = _grid_tuple(c, site)
        if gnode is None or axis >= len(gnode.elts):
            raise NotApplicable(f"{site.kernel}'s grid is not a literal tuple in forward")
        nsrc = c.seg(bind[nparam])
        new, _ = _apply_chain(c, ch, {block: f"max({MIN_DOT_N}, triton.next_power_of_2({nsrc}))"},
                              grid_edit=(gnode, axis), row_store=ch.reduction is not None)
        ops = ", ".join(dict.fromkeys(ch.ops))
        stores = "one value per row" if ch.reduction else "the full rows, each reduction broadcast back from registers"
        return new, (f"{what} fused into {site.kernel} ({ops}): {block} = next_power_of_2(N) so one "
                     f"tile covers each row (N <= {worst} at the spec's shapes); the kernel stores {stores}")

    return _first_forward_launch(c, attempt)


def fuse_split_row_reduction(source: str, problem: Any) -> tuple[str, str]:
    """A row reduction too wide for one tile, split: each tile reduces its own columns into a partials buffer
    (one slot per row and column tile) and the reduction in forward runs on the partials instead of the full
    output, with the same torch call (sum of sums, max of maxes, logsumexp of tile logsumexps)."""
    c = Ctx(source, problem)

    def attempt(site: LaunchSite) -> tuple[str, str]:
        ch = op_chain(c, site, allow_reduction=True, split=True)
        if ch.reduction is None:
            raise NotApplicable(ch.stop or "no row reduction follows it")
        new, part, read_back = _apply_split(c, ch, site)
        ops = ", ".join(dict.fromkeys(ch.ops))
        return new, (f"{ch.reduction['src']} split over {site.kernel}'s column tiles ({ops}): each tile writes its "
                     f"partial {ch.reduction['kind']} per row into {part}, forward reduces the partials; " + (
                         f"the tile is still written, as forward reads {', '.join(read_back)} again after it"
                         if read_back else "the full output is no longer written"))

    return _first_forward_launch(c, attempt)


def _col_tile_index(c: Ctx, ts: TileStore, block: str) -> str:
    """``pid_n`` from ``offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)``: which column tile a program stores."""
    fn = c.model.functions[ts.fn].node
    offs_n = ts.cols[0]
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id == offs_n and isinstance(node.value, ast.BinOp) \
                and isinstance(node.value.op, ast.Add):
            for start in (node.value.left, node.value.right):
                if isinstance(start, ast.BinOp) and isinstance(start.op, ast.Mult):
                    for idx, blk in ((start.left, start.right), (start.right, start.left)):
                        if isinstance(blk, ast.Name) and blk.id == block:
                            return ast.unparse(idx)
    raise NotApplicable(f"{ts.fn}'s column offsets {offs_n} are not `tile * {block} + tl.arange(0, {block})`")


def _apply_split(c: Ctx, ch: Chain, site: LaunchSite) -> tuple[str, str, list[str]]:
    """The split's source, its partials buffer, and the names forward reads the reduced tile by again (the tile is
    then still stored)."""
    ts, b, y = ch.tile, ch.builder, ch.y
    if not ts.two_d or ts.rows[1] is None:
        raise NotApplicable(f"{ts.fn}'s store is not a 2D tile with a row bound")
    block, _ = _col_block(c, ts, site)
    tile = _col_tile_index(c, ts, block)
    red_stmt = ch.stmts[-1]
    rest = c.after(red_stmt.lineno)
    stale = sorted(n for n in (ch.older | {y}) - {ch.cur} if loads(rest, n))
    # read back: the tile the reduction read is read again after it (`m = y.mean(1, keepdim=True)`, then `y - m`):
    # the kernel stores that tile as before and its partials beside it, so forward's later ops read it from y
    read_back = [n for n in stale if n in ch.reduction.get("reads", set())]
    if len(read_back) < len(stale):
        raise NotApplicable(f"{', '.join(n for n in stale if n not in read_back)} is read after the row reduction, "
                            "and it is not the tile the reduction read (the full output holds only that one)")
    launch_stmt = c.stmt_of(site)
    before = [s for s in c.fwd if s.lineno < launch_stmt.lineno]
    if not before:
        raise NotApplicable("nothing precedes the launch in forward to allocate the partials after")
    fwd_names = {n.id for s in c.fwd for n in ast.walk(s) if isinstance(n, ast.Name)} | set(c.env.params)
    part = fresh_namer(fwd_names)("row_part")
    part_ptr, part_stride = b.fresh("part_ptr"), b.fresh("stride_part")
    # forward: the partials buffer (the reduction's identity in slots no tile writes), the reduction on it
    combine = copy.deepcopy(red_stmt)
    call = combine.value
    while not isinstance(call, ast.Call):  # torch.max(y, dim=1)[0] / .values
        call = call.value
    if isinstance(call.func, ast.Attribute) and not (call.args and isinstance(call.args[0], ast.Name)
                                                       and call.args[0].id in ch.reduction.get("reads", {ch.cur})):
        call.func.value = ast.Name(part)  # y.sum(1, keepdim=True): the method of the partials
    else:
        call.args[0] = ast.Name(part)
    kind = ch.reduction["kind"]
    ident = SPLIT_IDENTITY.get(kind, "0.0")
    n = ts.cols[1]
    edits = Edits()
    # with the column bound known, the tiles write every slot (their own partial, the identity in the rest), so the
    # buffer needs no fill launch and every config of an autotuner leaves it whole; else torch fills the identity
    alloc = (f"torch.empty(({y}.shape[0], triton.cdiv({y}.shape[-1], {SPLIT_MIN_BLOCK})), " if n is not None else
             f"torch.full(({y}.shape[0], triton.cdiv({y}.shape[-1], {SPLIT_MIN_BLOCK})), {ident}, ")
    edits.insert_after[before[-1].lineno] = statements(f"{part} = {alloc}device={y}.device, dtype={y}.dtype)")
    edits.replace[red_stmt.lineno] = statements(ast.unparse(combine))
    for s in ch.stmts[:-1]:
        edits.replace[s.lineno] = []
    # kernel: the epilogue up to the tile's row partial, stored in the tile's slot instead of the full tile
    lines = list(b.lines)
    if not ts.value_is_name:
        lines.insert(0, f"{ch.tile_var} = {ts.value_src}")
    # the copies kept for forward's later reads of the tile: the tile store below serves them
    kept = {f"{b.saved.get(n)} = {ch.reduction['tile_var']}" for n in read_back}
    lines = [ln for ln in lines if ln not in kept]
    offs_m, m = ts.rows
    store = (f"tl.store({part_ptr} + {offs_m} * {part_stride} + {tile}, {b.var}.to({part_ptr}.dtype.element_ty), "
             f"mask={offs_m} < {m})")
    fill = _identity_fill(b, ts, block, tile, part_ptr, part_stride, ident) if n is not None else []
    what = ", ".join(dict.fromkeys(ch.ops))
    full = [store_with_value(ts, ts.cast(ch.reduction["tile_var"]))] if read_back else []
    edits.replace[ts.line] = _comment_stmts(f"fused from Model.forward: {what}; one partial per row for this column "
                                            "tile, reduced in forward" + ("; the tile itself too, read again there"
                                                                          if read_back else ""),
                                            [*lines, store, *fill]) + full
    aliases = [n for n in read_back if n != y]
    if aliases:  # the names forward reads the tile by, now y's buffer
        edits.insert_after[launch_stmt.lineno] = statements("\n".join(f"{n} = {y}" for n in aliases))
    if ts.cast_line:
        edits.replace[ts.cast_line] = []
    edits.params[site.kernel] = [q for op in b.operands.values() for q in op.params()] + [part_ptr, part_stride]
    kwargs = {k: v for op in b.operands.values() for k, v in op.launch_args().items()}
    kwargs.update({part_ptr: part, part_stride: f"{part}.stride(0)"})
    if ch.pool is not None and ch.pool["param"]:
        edits.params[site.kernel].append(f"{ch.pool['param']}: tl.constexpr")
        kwargs[ch.pool["param"]] = ch.pool["size"]
    edits.calls[site.line] = lambda call: set_call_kwargs(call, kwargs)
    if c.model.functions[site.kernel].is_autotuned and not fill:
        # the autotuner runs every config on the same buffers: a config with wider column tiles writes fewer slots,
        # so the slots a narrower config wrote before it would be summed in too; it restores the partials instead
        edits.autotune[site.kernel] = lambda call: add_to_list_kwarg(call, "restore_value", repr(part_ptr))
    try:
        new = apply_edits(c.source, edits, c.parsed)
    except LookupError as exc:
        raise NotApplicable(f"could not rewrite the launch: {exc}") from None
    dead = {n.id for s in ch.stmts[:-1] for n in ast.walk(s) if isinstance(n, ast.Name)} - set(read_back)
    return dead_code(new, dead), part, read_back


def _identity_fill(b: EpilogueBuilder, ts: TileStore, block: str, tile: str, part_ptr: str, part_stride: str,
                   ident: str) -> list[str]:
    """The statements by which column tile ``tile`` also writes the reduction's identity into the partial slots no
    tile reduces into: with T = cdiv(N, BLOCK) tiles and S = cdiv(N, SPLIT_MIN_BLOCK) slots, tile t writes its
    partial into slot t and the identity into t + T * j for j = 1 .. BLOCK // SPLIT_MIN_BLOCK below S. Every slot
    then has exactly one writer (s = s % T + T * (s // T), and s // T < BLOCK // SPLIT_MIN_BLOCK as T * BLOCK >= N),
    whatever BLOCK a later stage picks (a multiple of SPLIT_MIN_BLOCK, as a tl.dot's N is)."""
    (offs_m, m), n = ts.rows, ts.cols[1]
    slots, zero = b.fresh("fill_slots"), b.fresh("fill_zero")
    return [f"{slots} = {tile} + tl.cdiv({n}, {block}) * (1 + tl.arange(0, {block} // {SPLIT_MIN_BLOCK}))",
            f"{zero} = tl.zeros_like({offs_m})[:, None].to(tl.float32) + "
            f"tl.zeros_like({slots})[None, :].to(tl.float32)",
            f"tl.store({part_ptr} + {offs_m}[:, None] * {part_stride} + {slots}[None, :], "
            f"({zero} + {ident}).to({part_ptr}.dtype.element_ty), mask=({offs_m} < {m})[:, None] & "
            f"({slots} < ({n} + {SPLIT_MIN_BLOCK - 1}) // {SPLIT_MIN_BLOCK})[None, :])"]


def _dim_values(c: Ctx, v: Val) -> list[tuple[str, int]]:
    out = []
    if v.kind != "scalar":
        return out
    for name, var in c.problem.spec.variants.items():
        val = c.env.dim_value(v.value, var)
        if val is not None:
            out.append((name, val))
    return out


def _grid_tuple(c: Ctx, site: LaunchSite) -> ast.Tuple | None:
    g = site.node.func.slice
    if isinstance(g, ast.Tuple):
        return g
    if isinstance(g, ast.Name):
        users = [s for s in c.model.launches if isinstance(s.node.func.slice, ast.Name) and s.node.func.slice.id == g.id]
        if len(users) != 1:
            return None
        a = _last_assign(c, g.id, site.line)
        if a is not None and isinstance(a.value, ast.Tuple):
            return a.value
    return None


def _group_norm_narrow(source: str, problem: Any) -> tuple[str, str]:
    """The GroupNorm rewrite, then the fp32 buffer its kernel reads (a GEMM's output, say) stored in the inputs'
    dtype where :func:`xeforge.rewrite.dtype_narrow.narrow_intermediates` applies."""
    new, desc = group_norm_kernel(source, problem)
    try:
        narrowed, how = narrow_intermediates(new, problem)
    except NotApplicable:
        return new, desc
    return narrowed, f"{desc}; {how}"


# ------------------------------------------------------------------------------------------------ combined
REWRITES: dict[str, Callable[[str, Any], tuple[str, str]]] = {
    "consumer-kernel": fuse_consumer_kernel,
    "forward-ops": fuse_forward_ops,
    "row-reduction": fuse_row_reduction,
    "split-row-reduction": fuse_split_row_reduction,
    "group-norm": group_norm_kernel,
    "combine-partials": combine_partials,
}


def fuse_all(source: str, problem: Any, first: str, limit: int = 8, narrow: bool = False) -> tuple[str, list[str]]:
    """``first``'s rewrite, then any rewrite that applies to the result, until none does. ``narrow``: a GroupNorm
    on the way reads its input buffer in the module's result dtype where it can (see
    :mod:`xeforge.rewrite.fusion.norm`)."""
    table = {**REWRITES, "group-norm": _group_norm_narrow} if narrow else REWRITES
    new, desc = table[first](source, problem)
    done = [desc]
    for _ in range(limit):
        for name, fn in table.items():
            try:
                nxt, d = fn(new, problem)
            except NotApplicable:
                continue
            new, done = nxt, [*done, d]
            break
        else:
            break
    return new, done


#: host calls that wait or check and compute nothing (real wrappers put them between a launch and its epilogue)
_INERT_CALLS = ("torch.cuda.synchronize", "torch.xpu.synchronize", "torch.cuda.current_stream().synchronize")


def _inert(s: ast.stmt, cur: str) -> bool:
    """A statement the chain may step over: a device synchronize (also under an ``if``), or an assert that does not
    read ``cur`` (the value the fused ops would no longer make)."""
    if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
        return ast.unparse(s.value.func) in _INERT_CALLS
    if isinstance(s, ast.Assert):
        return cur not in {n.id for n in ast.walk(s) if isinstance(n, ast.Name)}
    if isinstance(s, ast.If):  # `if x.is_cuda: torch.cuda.synchronize()`
        return cur not in {n.id for n in ast.walk(s.test) if isinstance(n, ast.Name)} and \
            all(_inert(b, cur) for b in s.body + s.orelse)
    return False
