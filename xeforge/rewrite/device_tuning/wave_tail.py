"""Wave tail (device_tuning): a GEMM whose output tiles fill the device's cores a whole number of times and then part
of once more runs that last part in smaller tiles.

Owns :func:`wave_tail`, the edit, and the helper :data:`ROWS_FN` it adds to the file. A launch of ``T`` output tiles
on ``P`` cores runs ``ceil(T / P)`` waves; where the last is far from full, its time is nearly a whole wave's for a
fraction of the work (on an H100, 3000 x 4096 x 3000 in 128 x 256 tiles: 288 tiles, 2.2 waves of 132, run in the
time of 3). The launch becomes, per call::

    wave_rows = wave_tail_rows(M, <tiles>, 128, <tiles at the small configuration>, 64, 0.25, 132)
    if wave_rows:
        kernel[<grid over wave_rows rows>](a[:wave_rows], b, c[:wave_rows], wave_rows, N, K, ...)   # whole waves
        kernel[<grid over M - wave_rows>](a[wave_rows:], b, c[wave_rows:], M - wave_rows, N, K, ..., BLOCK_M=64,
                                          BLOCK_N=128, ...)                                          # the tail
    else:
        kernel[grid](a, b, c, M, N, K, ...)        # the launch as it was

Both launches are the kernel as written on a block of rows: the tensors whose first dim is the rows (the trace shows
it at every traced shape) are passed as row slices, which keep their strides, and every use of the rows' host name in
the arguments and the grid reads the block's row count (a divisibility hint computed from it too). The first block is
whole row blocks of the kernel's tile that fill whole waves; the rest runs at the small configuration, whose more
numerous tiles spread over all cores. :data:`ROWS_FN` decides per call from the two tile counts: the split is taken
where it is expected to save :data:`MIN_SAVING` of a wave or more and :data:`MIN_SHARE` of the waves, counting a
small tile's work at its share of the large tile's area times :data:`SMALL_TILE_COST` (small tiles run less
efficiently); elsewhere the launch runs as written.
Gate 3 times every shape.
"""

from __future__ import annotations

import ast
import math
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from xeforge.kernel_model import parse_kernel, parse_python, segment_of
from xeforge.rewrite.device_tuning.splitk import host_tiles, insert_before_model
from xeforge.rewrite.tiling import NotApplicable
from xeforge.rewrite.tiling.configs import apply_config
from xeforge.rewrite.tiling.dispatch import launch_statement
from xeforge.rewrite.tiling.grid import fresh_name, launch_grid

#: the helper the rewrite adds to the file
ROWS_FN = "wave_tail_rows"
#: a small tile's work relative to its area share of the large tile's (fewer operands reused per load)
SMALL_TILE_COST = 1.25
#: the least a split must save, in waves of the large tile, to be taken
MIN_SAVING = 0.25
#: ... and as a share of the launch's waves (at many waves the last one's fill matters little)
MIN_SHARE = 0.06

ROWS_FN_CODE = '''
def {name}(rows, tiles, block, small_tiles, small_block, area, programs, cost={cost}, saving={saving}, share={share}):
    """Rows for the launch of whole waves (a multiple of ``block``), the rest to run in ``small_block`` rows: where
    ``tiles`` output tiles of ``block`` rows run a last wave on ``programs`` cores far from full, and the rows left
    over in ``small_tiles``' smaller tiles (``area`` of a large one each, ``cost`` times as slow per element) save
    ``saving`` of a wave or more and ``share`` of the waves; 0 where they would not (the launch runs as written)."""
    blocks, small_blocks = -(-rows // block), -(-rows // small_block)
    if tiles <= programs or blocks < 2 or small_blocks < 1:
        return 0
    per_block, small_per_block = tiles // blocks, small_tiles // small_blocks
    whole = tiles // programs * programs // max(per_block, 1)
    if whole <= 0 or whole >= blocks:
        return 0
    tail = -(-(rows - whole * block) // small_block) * small_per_block
    waves = -(-tiles // programs)
    split = -(-(whole * per_block) // programs) + -(-tail // programs) * area * cost
    return whole * block if split <= waves - max(saving, waves * share) else 0
'''


def rows_at(rows: int, tiles: int, block: int, small_tiles: int, small_block: int, area: float,
            programs: int) -> int:
    """:data:`ROWS_FN` evaluated here, for the tactic's check at a traced shape (the same code the file runs)."""
    env: dict[str, Any] = {}
    exec(ROWS_FN_CODE.format(name=ROWS_FN, cost=SMALL_TILE_COST, saving=MIN_SAVING, share=MIN_SHARE), env)  # noqa: S102 - our code
    return env[ROWS_FN](rows, tiles, block, small_tiles, small_block, area, programs)


class _Rows(cst.CSTTransformer):
    """Inside a launch: the rows' name -> ``count``, each row tensor ``t`` -> ``t[rows_slice]`` (not an attribute's
    name, a keyword's name or a lambda's parameter)."""

    def __init__(self, rows: str, count: str, tensors: set[str], part: str) -> None:
        self.rows, self.count, self.tensors, self.part = rows, count, tensors, part

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)  # only the value side is read: ``a.stride`` keeps ``stride``
        return False

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
        return updated.with_changes(value=original.value.visit(self))

    def visit_Arg(self, node: cst.Arg) -> bool:
        return True

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)  # ``M=M``: the keyword stays the parameter's name

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return True

    def leave_Lambda(self, original: cst.Lambda, updated: cst.Lambda) -> cst.Lambda:
        return updated.with_changes(params=original.params)

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        if original.value == self.rows:
            return cst.parse_expression(self.count)
        if original.value in self.tensors:
            return cst.parse_expression(f"{original.value}[{self.part}]")
        return updated


def _call_text(source: str, kernel: str, line: int) -> tuple[str, str, list[str]]:
    """The launch of ``kernel`` at ``line`` as text with its grid written inline, the grid's text, and the grid's
    axes as host expressions (:func:`~xeforge.rewrite.device_tuning.splitk.host_tiles`)."""
    model = parse_kernel(source)
    site = next((s for s in model.launches if s.kernel == kernel and s.line == line), None)
    if site is None:
        raise NotApplicable(f"no launch of {kernel} on line {line}")
    grid = launch_grid(model, site)
    if grid is None or (grid.variable and grid.assign is None):
        raise NotApplicable(f"the grid of the launch at line {line} is not a tuple or a lambda the host can write "
                            "again for a block of rows")
    grid_text = segment_of(source, grid.assign.value if grid.assign is not None else site.node.func.slice)
    text = segment_of(source, site.node)
    if grid_text is None or text is None:
        raise NotApplicable(f"no source text for the launch at line {line}")
    call = cst.parse_expression(text)
    if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Subscript):
        raise NotApplicable(f"the launch of {kernel} at line {line} is not kernel[grid](...)")
    inline = call.func.slice[0].with_changes(slice=cst.Index(value=cst.parse_expression(grid_text)))
    call = call.with_changes(func=call.func.with_changes(slice=[inline]))
    return cst.Module([]).code_for_node(call), grid_text, host_tiles(model, site, grid)


def _launch_line(source: str, kernel: str, near: int) -> int:
    lines = [s.line for s in parse_kernel(source).launches if s.kernel == kernel]
    if not lines:
        raise NotApplicable(f"no launch of {kernel}")
    return min(lines, key=lambda n: abs(n - near))


def wave_tail(source: str, kernel: str, line: int, rows: str, tensors: list[str], block: int,
              small: dict[str, Any], small_block: int, area: float, programs: int) -> str:
    """``source`` with the launch of ``kernel`` at ``line`` run as whole waves plus a tail in smaller tiles (see the
    module's docstring). ``rows``: the host name the launch passes for the rows (a plain name); ``tensors``: the
    arguments (plain names) whose first dim is the rows; ``block``: the launch's rows per tile; ``small``: the
    configuration of the tail's launch (``small_block`` rows per tile, ``area`` of a large tile each)."""
    if not rows.isidentifier():
        raise NotApplicable(f"the rows are passed as {rows!r}, not a name the tail launch can replace")
    if f"def {ROWS_FN}(" in source:
        raise NotApplicable(f"the file already splits a launch by waves ({ROWS_FN})")
    model = parse_kernel(source)
    site = next((s for s in model.launches if s.kernel == kernel and s.line == line), None)
    if site is None:
        raise NotApplicable(f"no launch of {kernel} on line {line}")
    stmt = launch_statement(model, site)
    if not isinstance(stmt, ast.Expr):
        raise NotApplicable(f"the launch of {kernel} at line {line} is assigned; the wave split launches it twice")
    big, _, big_axes = _call_text(source, kernel, line)
    small_source = apply_config(source, kernel, small, line=line)
    small_call, _, small_axes = _call_text(small_source, kernel, _launch_line(small_source, kernel, line))
    names = {n.id for n in ast.walk(model.tree) if isinstance(n, ast.Name)}
    var = fresh_name(names, "wave_rows")
    tset = set(tensors)
    whole = cst.parse_expression(big).visit(_Rows(rows, var, tset, f":{var}"))
    rest = cst.parse_expression(small_call).visit(_Rows(rows, f"({rows} - {var})", tset, f"{var}:"))
    indent = stmt.col_offset
    lines = source.splitlines()
    original = "\n".join([lines[stmt.lineno - 1][indent:], *lines[stmt.lineno:stmt.end_lineno]])
    tiles = " * ".join(f"({a})" for a in big_axes)
    small_tiles = " * ".join(f"({a})" for a in small_axes)
    code = cst.Module([]).code_for_node
    text = (f"{var} = {ROWS_FN}({rows}, {tiles}, {block}, {small_tiles}, {small_block}, {area!r}, {programs})\n"
            f"if {var}:\n"
            f"    # whole waves of the kernel's tiles, then the rows left in smaller tiles over every core "
            f"(xeforge, wave-tail)\n"
            f"    {code(whole)}\n"
            f"    {code(rest)}\n"
            f"else:\n" + "\n".join("    " + ln if ln.strip() else "" for ln in original.split("\n")) + "\n")
    new = cst.parse_module(text).body
    out = _replace_statements(source, stmt.lineno, new, kernel, site.line)
    return insert_before_model(out, ROWS_FN, ROWS_FN_CODE.format(name=ROWS_FN, cost=SMALL_TILE_COST,
                                                                 saving=MIN_SAVING, share=MIN_SHARE))


class _Replace(cst.CSTTransformer):
    """The simple statement at ``line`` -> ``new`` (several statements)."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, line: int, new: list[cst.BaseStatement]) -> None:
        super().__init__()
        self.line, self.new, self.hits = line, new, 0

    def leave_SimpleStatementLine(self, original, updated):
        if self.get_metadata(PositionProvider, original).start.line != self.line:
            return updated
        self.hits += 1
        return cst.FlattenSentinel([self.new[0].with_changes(leading_lines=updated.leading_lines), *self.new[1:]])


def _replace_statements(source: str, line: int, new: list[cst.BaseStatement], kernel: str, launch_line: int) -> str:
    editor = _Replace(line, new)
    code = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True).visit(editor).code
    if editor.hits != 1:
        raise NotApplicable(f"the statement launching {kernel} at line {launch_line} could not be located")
    try:
        parse_python(code)
    except SyntaxError as exc:  # never hand on a source that does not parse
        raise NotApplicable(f"the wave split around line {launch_line} did not parse ({exc.msg}, line {exc.lineno})")
    return code


def area_of(big: dict[str, Any], small: dict[str, Any], block_m: str, block_n: str | None) -> float:
    """The small tile's area as a share of the large one's."""
    share = small[block_m] / big[block_m]
    if block_n is not None:
        share *= small.get(block_n, big[block_n]) / big[block_n]
    return float(math.floor(share * 1e4) / 1e4)
