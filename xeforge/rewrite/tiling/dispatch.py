"""A small dispatch on a launch's shape arguments: one launch per shape class, each with its own configuration.

Owns: :func:`dispatch`, the edit behind the device_tuning stage's ``per-shape-config`` tactic. The statement that
launches ``kernel`` becomes::

    if M <= 128:
        kernel[(triton.cdiv(M, 16), triton.cdiv(N, 128))](..., BLOCK_M=16, BLOCK_N=128, ...)
    else:
        kernel[grid](...)                      # the launch as it was

Each branch's launch is the original one with :func:`~xeforge.rewrite.tiling.configs.apply_config`'s edits (block
sizes, launch options, and grid axes that follow the block sizes), so every branch is consistent on its own; when
the original launch names a grid variable whose value the new block sizes change, the branch writes its own grid
inline and the variable is left as it was (other launches may read it). The ``else`` branch is the incumbent's
launch, unchanged. Works wherever the launch is (``forward``, a wrapper function, a launcher method); the statement
is replaced with libcst, the formatting and comments of the original launch kept.

And :func:`undispatch`, the way back for the autotuning stage: such an ``if``/``elif``/``else`` over launches of one
kernel becomes its ``else`` branch's launch again, with every branch's configuration returned, so one
``@triton.autotune`` keyed on the shape arguments can choose among them (and more) per shape.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from xeforge.kernel_model import KernelModel, LaunchSite, parse_kernel, parse_python, segment_of
from xeforge.rewrite.cst_tools import expr
from xeforge.rewrite.tiling import NotApplicable
from xeforge.rewrite.tiling.configs import apply_config, current_config
from xeforge.rewrite.tiling.grid import enclosing_function, launch_grid, single_launch

INDENT = "    "


@dataclass(frozen=True)
class Branch:
    """One branch of the dispatch: the host test (``M <= 128``) and the configuration its launch uses."""

    test: str
    config: dict[str, Any]


def _segment(source: str, node: ast.AST) -> str:
    text = segment_of(source, node)
    if text is None:
        raise NotApplicable(f"no source text for the node at line {getattr(node, 'lineno', '?')}")
    return text


def launch_statement(model: KernelModel, site: LaunchSite) -> ast.stmt:
    """The simple statement whose value is the launch (``kernel[grid](...)``, ``y = kernel[grid](...)``), alone on
    its lines; NotApplicable (naming the line) for a launch inside a larger expression or sharing a line."""
    fn = enclosing_function(model, site)
    root = fn if fn is not None else model.tree
    for node in ast.walk(root):
        if isinstance(node, (ast.Expr, ast.Assign, ast.AnnAssign, ast.Return)) and node.value is not None and \
                (node.value.lineno, node.value.col_offset) == (site.node.lineno, site.node.col_offset):
            lines = model.source.splitlines()
            before = lines[node.lineno - 1][:node.col_offset]
            after = lines[node.end_lineno - 1][node.end_col_offset:].strip()
            if before.strip() or (after and not after.startswith("#")):
                raise NotApplicable(f"the launch of {site.kernel} at line {site.line} shares its line with another "
                                    "statement (a dispatch needs it on lines of its own)")
            return node
    raise NotApplicable(f"the launch of {site.kernel} at line {site.line} is part of a larger expression, not a "
                        "statement of its own (a dispatch replaces the statement)")


def branch_call(source: str, kernel: str, cfg: dict[str, Any]) -> str:
    """The launch of ``kernel`` with ``cfg`` applied, as source text (continuation lines as in ``source``): its grid
    written inline when the configuration changes the value of a grid variable."""
    model = parse_kernel(source)
    site = single_launch(model, kernel)
    new_source = apply_config(source, kernel, cfg)
    new_model = parse_kernel(new_source)
    new_site = single_launch(new_model, kernel)
    text = _segment(new_source, new_site.node)
    old, new = launch_grid(model, site), launch_grid(new_model, new_site)
    if new is not None and new.variable and new.assign is not None and old is not None and old.assign is not None:
        before, after = _segment(source, old.assign.value), _segment(new_source, new.assign.value)
        if before != after:
            call = cst.parse_expression(text)
            if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Subscript):
                raise NotApplicable(f"the launch of {kernel} at line {site.line} is not kernel[grid](...)")
            inline = call.func.slice[0].with_changes(slice=cst.Index(value=expr(after)))
            call = call.with_changes(func=call.func.with_changes(slice=[inline]))
            text = cst.Module([]).code_for_node(call)
    return text


def _nested(first: str, rest: Sequence[str], indent: int) -> list[str]:
    """Lines of a statement moved one level deeper, relative to the column the dispatch starts at: the first line
    as it is, continuation lines shifted so they keep their place relative to it."""
    out = [INDENT + first]
    for line in rest:
        lead = len(line) - len(line.lstrip(" "))
        out.append(INDENT + line[min(lead, indent):] if line.strip() else "")
    return out


def _statement_lines(text: str, indent: int) -> list[str]:
    lines = text.split("\n")
    return _nested(lines[0], lines[1:], indent)


def dispatch(source: str, kernel: str, branches: Sequence[Branch]) -> str:
    """``source`` with the launch of ``kernel`` split by shape: ``if b0.test: <launch with b0.config> elif ...
    else: <the launch as it was>``."""
    if not branches:
        raise NotApplicable("a dispatch needs at least one branch")
    model = parse_kernel(source)
    site = single_launch(model, kernel)
    stmt = launch_statement(model, site)
    indent = stmt.col_offset
    lines = source.splitlines()
    call = site.node
    # the statement's text around the call: ``y = `` or ``return `` before it, nothing after it but a comment
    if call.lineno != stmt.lineno or call.end_lineno != stmt.end_lineno:
        raise NotApplicable(f"the launch of {kernel} at line {site.line} does not span its statement's lines")
    head = lines[stmt.lineno - 1][indent:call.col_offset]
    original = "\n".join([lines[stmt.lineno - 1][indent:], *lines[stmt.lineno:stmt.end_lineno]])
    out: list[str] = []
    for i, br in enumerate(branches):
        out.append(f"{'if' if i == 0 else 'elif'} {br.test}:")
        out += _statement_lines(head + branch_call(source, kernel, br.config), indent)
    out.append("else:")
    out += _statement_lines(original, indent)
    new_stmt = cst.parse_statement("\n".join(out) + "\n")
    return _replace_statement(source, stmt.lineno, new_stmt, kernel, site.line)


class _StatementReplacer(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, line: int, new: cst.BaseStatement) -> None:
        super().__init__()
        self.line, self.new, self.hits = line, new, 0

    def leave_SimpleStatementLine(self, original, updated):
        if self.get_metadata(PositionProvider, original).start.line != self.line:
            return updated
        self.hits += 1
        return self.new.with_changes(leading_lines=updated.leading_lines)


def _replace_statement(source: str, line: int, new: cst.BaseStatement, kernel: str, launch_line: int) -> str:
    editor = _StatementReplacer(line, new)
    code = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True).visit(editor).code
    if editor.hits != 1:
        raise NotApplicable(f"the statement launching {kernel} at line {launch_line} could not be located")
    try:
        parse_python(code)
    except SyntaxError as exc:  # never hand on a source that does not parse
        raise NotApplicable(f"the dispatch around line {launch_line} did not parse ({exc.msg}, line {exc.lineno})")
    return code


def _leaves(node: ast.If, launches: set[int]) -> list[ast.stmt] | None:
    """The one-statement branches of ``if``/``elif``/``else`` (the ``else`` last), each one of ``launches`` (the
    ids of a kernel's launch statements); None when any branch is anything else or the chain has no ``else``."""
    out: list[ast.stmt] = []
    while True:
        if len(node.body) != 1 or id(node.body[0]) not in launches:
            return None
        out.append(node.body[0])
        if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
            node = node.orelse[0]
            continue
        if len(node.orelse) != 1 or id(node.orelse[0]) not in launches:
            return None
        out.append(node.orelse[0])
        return out


def _dedented(source: str, stmt: ast.stmt, col: int) -> list[str]:
    """``stmt``'s lines, moved left so that its first line starts at column ``col``."""
    lines = source.splitlines()[stmt.lineno - 1:stmt.end_lineno]
    shift = stmt.col_offset - col
    return [ln[shift:] if ln[:shift].strip() == "" else ln.lstrip() for ln in lines]


def undispatch(source: str, kernel: str) -> tuple[str, list[dict[str, Any]]] | None:
    """``source`` with the per-shape dispatch of ``kernel`` (every launch of it a branch of one ``if``/``elif``/
    ``else``) replaced by its ``else`` launch, and each branch's configuration (the ``else``'s first); None when
    ``kernel``'s launches are not such a dispatch."""
    model = parse_kernel(source)
    sites = [s for s in model.launches if s.kernel == kernel]
    if len(sites) < 2:
        return None
    launches = set()
    for site in sites:
        try:
            launches.add(id(launch_statement(model, site)))
        except NotApplicable:
            return None
    for node in ast.walk(model.tree):
        if isinstance(node, ast.If):
            leaves = _leaves(node, launches)
            if leaves is not None and len(leaves) == len(sites):
                lines = source.splitlines(keepends=True)

                def with_leaf(leaf: ast.stmt) -> str:
                    body = "".join(ln + "\n" for ln in _dedented(source, leaf, node.col_offset))
                    return "".join(lines[:node.lineno - 1]) + body + "".join(lines[node.end_lineno:])

                configs = []
                for leaf in [leaves[-1], *leaves[:-1]]:
                    m = parse_kernel(with_leaf(leaf))
                    try:
                        configs.append(current_config(m, single_launch(m, kernel)))
                    except NotApplicable:
                        return None
                return with_leaf(leaves[-1]), configs
    return None
