"""Shared context of the dtype and fusion rewrites: one parse of the kernel file, three views of it.

Owns: :class:`Ctx` (the ``ast`` model, the libcst tree with positions, the abstract ``forward``), helpers to
find a launch's statement and the statements around it, the test for statements that only allocate, view
or compute sizes, a fresh-name generator, dead-code removal of such statements after a rewrite, and the
memo key and error guard the stage tactics wrap their rewrites in.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Callable

import libcst as cst

from xeforge.kernel_model import KernelModel, LaunchSite, dotted_name, parse_kernel
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.cst_tools import Edits, Parsed, apply_edits, body_statements
from xeforge.analysis.forward_env import ALLOC, ALLOC_LIKE, ForwardEnv

#: calls that allocate, view or compute sizes: torch.<alloc>, triton.<helper>, builtins, tensor methods
PURE_TORCH = ALLOC | ALLOC_LIKE
PURE_TRITON = {"cdiv", "next_power_of_2"}
PURE_BUILTINS = {"max", "min", "int", "len", "float"}
PURE_METHODS = {"numel", "size", "stride", "dim", "contiguous", "view", "reshape", "is_contiguous", "element_size",
                "data_ptr", "squeeze", "unsqueeze"}


def _pure_call(n: ast.Call) -> bool:
    name = dotted_name(n.func) or ""
    if isinstance(n.func, ast.Name):
        return n.func.id in PURE_BUILTINS
    last = name.rsplit(".", 1)[-1] if name else (n.func.attr if isinstance(n.func, ast.Attribute) else "")
    if name.startswith("torch."):
        return last in PURE_TORCH
    if name.startswith("triton."):
        return last in PURE_TRITON
    return isinstance(n.func, ast.Attribute) and last in PURE_METHODS


@dataclass
class Ctx:
    source: str
    problem: Any
    model: KernelModel = field(init=False)
    parsed: Parsed = field(init=False)
    env: ForwardEnv = field(init=False)

    def __post_init__(self) -> None:
        self.model = parse_kernel(self.source, str(getattr(self.problem, "kernel_path", "kernel.py")))
        self.parsed = Parsed.of(self.source)
        if self.model.forward() is None:
            raise NotApplicable("no Model.forward to fuse in")
        self.env = ForwardEnv(self.model, self.problem)

    @property
    def fwd(self) -> list[ast.stmt]:
        return list(self.model.forward().body)

    def stmt_of(self, site: LaunchSite) -> ast.stmt:
        for s in self.fwd:
            if isinstance(s, ast.Expr) and s.value is site.node:
                return s
        raise NotApplicable(f"the launch of {site.kernel} (line {site.line}) is not a top-level statement of forward")

    def after(self, line: int) -> list[ast.stmt]:
        return [s for s in self.fwd if s.lineno > line]

    def between(self, a: int, b: int) -> list[ast.stmt]:
        return [s for s in self.fwd if a < s.lineno < b]

    def launches_of(self, kernel: str) -> list[LaunchSite]:
        return [s for s in self.model.launches if s.kernel == kernel]

    def called_in_jit(self, kernel: str) -> bool:
        return any(c.function in self.model.functions and c.name.rsplit(".", 1)[-1] == kernel for c in self.model.calls)

    def seg(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.source, node) or ast.unparse(node)

    def cst_stmt(self, line: int) -> cst.BaseStatement:
        fwd = self.parsed.method("Model", "forward")
        for s in body_statements(fwd):
            if self.parsed.line(s) == line:
                return s
        raise NotApplicable(f"no statement of forward starts at line {line}")


def loads(nodes: list[ast.AST], name: str) -> int:
    return sum(1 for s in nodes for n in ast.walk(s) if isinstance(n, ast.Name) and n.id == name
               and isinstance(n.ctx, ast.Load))


def pure_expr(node: ast.AST, env: ForwardEnv | None = None, line: int | None = None) -> bool:
    """No kernel, no torch compute: allocations, views, sizes, and arithmetic on scalars (per ``env``)."""
    for n in ast.walk(node):
        if env is not None and isinstance(n, (ast.BinOp, ast.UnaryOp, ast.Compare)):
            for leaf in ast.walk(n):
                if isinstance(leaf, ast.Name) and env.lookup(leaf.id, line).kind not in ("scalar", "shape"):
                    return False
        if isinstance(n, ast.Call):
            if not _pure_call(n):
                return False
        elif isinstance(n, (ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield)):
            return False
    return True


def pure_stmt(stmt: ast.stmt, env: ForwardEnv | None = None) -> bool:
    """An assignment that only allocates, views, aliases or computes sizes (no kernel, no torch compute)."""
    return isinstance(stmt, ast.Assign) and all(isinstance(t, (ast.Name, ast.Tuple)) for t in stmt.targets) \
        and pure_expr(stmt.value, env, stmt.lineno)


def fresh_namer(taken: set[str]) -> Callable[[str], str]:
    used = set(taken)

    def fresh(base: str) -> str:
        base = base if base.isidentifier() else "v"
        name, i = base, 1
        while name in used:
            name = f"{base}_{i}"
            i += 1
        used.add(name)
        return name

    return fresh


def dead_code(source: str, candidates: set[str]) -> str:
    """Drop pure top-level forward assignments to ``candidates`` that nothing reads any more."""
    for _ in range(8):
        model = parse_kernel(source)
        fwd = model.forward()
        if fwd is None:
            return source
        drop: list[int] = []
        for i, s in enumerate(fwd.body):
            if not (pure_stmt(s) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)):
                continue
            name = s.targets[0].id
            if name in candidates and loads(fwd.body[i + 1:], name) == 0:
                drop.append(s.lineno)
                candidates = candidates | {n.id for n in ast.walk(s.value) if isinstance(n, ast.Name)}
        if not drop:
            return source
        source = apply_edits(source, Edits(replace={ln: [] for ln in drop}))
    return source


def memo_key(ctx: Any) -> tuple[str, str]:
    """A tactic's memo key for a stage context: the source and the spec it is read against."""
    return ctx.source, repr(getattr(ctx.problem, "spec", None))


def guarded(fn: Callable[[], Any]) -> Any:
    """``fn()``, or the reason it does not apply. A rewrite that breaks on an unforeseen source shape is
    reported as not applicable (with what broke) instead of ending the port."""
    try:
        return fn()
    except NotApplicable as exc:
        return str(exc)
    except Exception as exc:  # a gap in the rewrite, not in the user's kernel: say so, keep the run going
        return f"the rewrite could not handle this source ({type(exc).__name__}: {exc}); it is left unchanged"
