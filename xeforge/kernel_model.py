"""A small static model of a kernel file: its ``@triton.jit`` functions and the launch sites in ``Model``.

Owns: parsing a kernel source (``ast``) into :class:`KernelModel` — jit functions with their constexpr
parameters and ``@triton.autotune`` configs, the launch sites ``kernel[grid](...)`` reachable from
``Model.forward`` with literal constexpr values and launch options, and the calls made inside each
function (``tl.dot``, ``tl.make_block_ptr`` ...), and the ``ast`` helpers the tactics share (a parent map, whether a
host expression may be evaluated twice); what gate 2's work accounting reads of a kernel (the parameters it
stores into, whether it loops over program ids); and whether a file's ``tl.dot`` runs float32 as TF32
(:func:`tf32_dots`). Static checks (gate 1), knowledge-base constraints and the rules engine's tactics read this
model; source *rewriting* lives in :mod:`xeforge.rewrite`.
"""

from __future__ import annotations

import ast
import functools
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from xeforge.errors import KernelSourceError

#: keyword arguments of a Triton launch that are compiler options rather than kernel parameters
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "grf_mode", "warp_size", "threads_per_warp", "maxnreg")

_NOT_LITERAL = object()

#: CPython before 3.11.8 / 3.12.1 counts the AST constructor's depth in state every thread shares, and two
#: ``ast.parse`` calls at once can fail with "SystemError: AST constructor recursion depth mismatch"
#: (python/cpython#106905); the verifier is built from threads (the published-format tests, prewarm), so every
#: parse in xeforge goes through this lock.
_PARSE_LOCK = threading.Lock()


def parse_python(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """``ast.parse``, one thread at a time (see ``_PARSE_LOCK``)."""
    with _PARSE_LOCK:
        return ast.parse(source, filename=filename, mode=mode)


_LINE_END = re.compile(r"\r\n|\r|\n")


@functools.lru_cache(maxsize=16)
def _lines(source: str) -> tuple[str, ...]:
    """``source`` split after each line end, as ``ast`` counts lines (a form feed does not end one)."""
    out, start = [], 0
    for m in _LINE_END.finditer(source):
        out.append(source[start:m.end()])
        start = m.end()
    if start < len(source):
        out.append(source[start:])
    return tuple(out)


@functools.lru_cache(maxsize=16)
def _line_starts(source: str) -> tuple[int, ...]:
    out, at = [0], 0
    for line in _lines(source):
        at += len(line)
        out.append(at)
    return tuple(out)


def source_offset(source: str, lineno: int, col: int) -> int:
    """The index in ``source`` of ``ast``'s position (``lineno``, ``col``: a column in UTF-8 bytes), for text edits
    that splice a node's span."""
    return _line_starts(source)[lineno - 1] + len(_lines(source)[lineno - 1].encode()[:col].decode())


def segment_of(source: str, node: ast.AST) -> str | None:
    """``ast.get_source_segment(source, node)``, with the source's lines split once per source: the tactics ask
    for thousands of segments of one kernel file, and ``ast`` splits the whole file again for each."""
    lineno, end = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
    col, end_col = getattr(node, "col_offset", None), getattr(node, "end_col_offset", None)
    if None in (lineno, end, col, end_col):
        return None
    lines = _lines(source)
    if end > len(lines):
        return None
    first = lines[lineno - 1].encode()
    if lineno == end:
        return first[col:end_col].decode()
    return "".join([first[col:].decode(), *lines[lineno:end - 1], lines[end - 1].encode()[:end_col].decode()])


def tf32_dots(text: str) -> bool:
    """Whether the file has a ``tl.dot`` that runs float32 operands as TF32 on NVIDIA GPUs (Triton's default: no
    ``input_precision="ieee"`` / ``allow_tf32=False``)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "dot" \
                and ast.unparse(node.func.value) in ("tl", "triton.language"):
            kw = {k.arg: k.value for k in node.keywords}
            ieee = isinstance(kw.get("input_precision"), ast.Constant) and kw["input_precision"].value == "ieee"
            no_tf32 = isinstance(kw.get("allow_tf32"), ast.Constant) and kw["allow_tf32"].value is False
            if not (ieee or no_tf32):
                return True
    return False


def literal(node: ast.AST | None) -> Any:
    """The Python value of a literal expression, or ``_NOT_LITERAL``."""
    if node is None:
        return _NOT_LITERAL
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOT_LITERAL


def is_literal(value: Any) -> bool:
    return value is not _NOT_LITERAL


def dotted_name(node: ast.AST) -> str | None:
    """``tl.make_block_ptr`` for the expression ``tl.make_block_ptr``; None for anything not a dotted name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


@dataclass
class CallSite:
    name: str  # dotted name as written, e.g. "tl.dot"
    line: int
    col: int
    function: str  # enclosing function ("<module>" at top level)
    node: ast.Call = field(repr=False, compare=False)


@dataclass
class JitFunction:
    name: str
    line: int
    params: list[str]
    constexpr_params: list[str]
    autotune_configs: list[dict[str, Any]]  # kwargs + options of each triton.Config, literal values only
    autotune_key: list[str]
    has_heuristics: bool
    node: ast.FunctionDef = field(repr=False, compare=False)
    autotuned: bool = False  # decorated with @triton.autotune (its configs may not be literals: a comprehension)

    @property
    def is_autotuned(self) -> bool:
        return self.autotuned or bool(self.autotune_configs)


@dataclass
class LaunchSite:
    kernel: str
    line: int
    function: str  # the Model method the launch is in
    grid: str  # the grid expression's source
    args: list[str]  # positional argument sources
    constexprs: dict[str, Any]  # literal keyword values for the kernel's constexpr parameters
    options: dict[str, Any]  # literal launch options (num_warps, num_stages, grf_mode, ...)
    other_kwargs: dict[str, str]  # any other keyword arguments, as source
    node: ast.Call = field(repr=False, compare=False)


@dataclass
class KernelModel:
    source: str
    path: str
    tree: ast.Module = field(repr=False)
    functions: dict[str, JitFunction]
    launches: list[LaunchSite]
    calls: list[CallSite]
    model_class: ast.ClassDef | None = field(repr=False)

    # -- queries -------------------------------------------------------------------------------------
    def calls_to(self, *names: str) -> list[CallSite]:
        """Calls whose dotted name is one of ``names`` (also matched by the last component after ``tl.``)."""
        wanted = set(names)
        return [c for c in self.calls if c.name in wanted or _tl_alias(c.name) in wanted]

    def launched_kernels(self) -> set[str]:
        return {site.kernel for site in self.launches}

    def forward(self) -> ast.FunctionDef | None:
        return self.method("forward")

    def method(self, name: str) -> ast.FunctionDef | None:
        if self.model_class is None:
            return None
        for item in self.model_class.body:
            if isinstance(item, ast.FunctionDef) and item.name == name:
                return item
        return None

    def segment(self, node: ast.AST) -> str:
        return segment_of(self.source, node) or ""


def parent_map(root: ast.AST) -> dict[int, ast.AST]:
    """``id(node)`` -> its parent, for every node under ``root``."""
    out: dict[int, ast.AST] = {}
    for node in ast.walk(root):
        for child in ast.iter_child_nodes(node):
            out[id(child)] = node
    return out


_PLAIN_NODES = (ast.Expression, ast.Name, ast.Attribute, ast.Subscript, ast.Constant, ast.BinOp, ast.UnaryOp,
                ast.Tuple, ast.Slice, ast.expr_context, ast.operator, ast.unaryop)


def pure_expression(node: ast.AST, methods: frozenset[str] | set[str],
                    functions: frozenset[str] | set[str] = frozenset()) -> bool:
    """Whether a rewrite may evaluate the host expression ``node`` once more: names, attributes, indexing, literals,
    arithmetic, calls of the ``methods`` (``x.stride(0)``, ``triton.cdiv(...)``) and of the plain ``functions``
    (``min(...)``) only."""
    def ok(n: ast.AST) -> bool:
        if isinstance(n, ast.Call):
            f = n.func
            return (isinstance(f, ast.Attribute) and f.attr in methods) or \
                (isinstance(f, ast.Name) and f.id in functions)
        return isinstance(n, _PLAIN_NODES)

    return all(ok(n) for n in ast.walk(node))


def _tl_alias(name: str) -> str:
    """Normalise ``triton.language.x`` and ``tl.x`` to ``tl.x``."""
    if name.startswith("triton.language."):
        return "tl." + name[len("triton.language.") :]
    return name


def _is_jit_decorator(dec: ast.AST) -> bool:
    target = dec.func if isinstance(dec, ast.Call) else dec
    return dotted_name(target) in {"triton.jit", "jit"}


def _autotune_info(dec: ast.AST) -> tuple[list[dict[str, Any]], list[str]] | None:
    if not isinstance(dec, ast.Call) or dotted_name(dec.func) not in {"triton.autotune", "autotune"}:
        return None
    configs: list[dict[str, Any]] = []
    key: list[str] = []
    for kw in dec.keywords:
        if kw.arg == "configs" and isinstance(kw.value, (ast.List, ast.Tuple)):
            for elt in kw.value.elts:
                if isinstance(elt, ast.Call) and dotted_name(elt.func) in {"triton.Config", "Config"}:
                    cfg: dict[str, Any] = {}
                    if elt.args and isinstance(elt.args[0], ast.Dict):
                        for k, v in zip(elt.args[0].keys, elt.args[0].values):
                            kv, vv = literal(k), literal(v)
                            if is_literal(kv) and is_literal(vv):
                                cfg[kv] = vv
                    for ckw in elt.keywords:
                        vv = literal(ckw.value)
                        if ckw.arg and is_literal(vv):
                            cfg[ckw.arg] = vv
                    configs.append(cfg)
        elif kw.arg == "key":
            val = literal(kw.value)
            if is_literal(val):
                key = list(val)
    return configs, key


def _constexpr_params(fn: ast.FunctionDef) -> list[str]:
    out = []
    for arg in fn.args.args + fn.args.kwonlyargs:
        ann = arg.annotation
        if ann is not None and (dotted_name(ann) or "").endswith("constexpr"):
            out.append(arg.arg)
    return out


class _CallCollector(ast.NodeVisitor):
    def __init__(self) -> None:
        self.calls: list[CallSite] = []
        self.stack: list[str] = ["<module>"]

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Call(self, node: ast.Call) -> None:
        name = dotted_name(node.func)
        if name:
            self.calls.append(CallSite(name, node.lineno, node.col_offset, self.stack[-1], node))
        self.generic_visit(node)


def parse_kernel(source: str, path: str = "kernel.py") -> KernelModel:
    """Parse a kernel file. Raises :class:`KernelSourceError` (with the line) when it is not valid Python."""
    try:
        tree = parse_python(source, filename=path)
    except SyntaxError as exc:
        raise KernelSourceError(
            path, f"line {exc.lineno}: {exc.msg}", "fix the syntax error; the file must be valid Python"
        ) from None

    functions: dict[str, JitFunction] = {}
    model_class: ast.ClassDef | None = None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(_is_jit_decorator(d) for d in node.decorator_list):
            configs: list[dict[str, Any]] = []
            key: list[str] = []
            for dec in node.decorator_list:
                info = _autotune_info(dec)
                if info:
                    configs, key = info
            functions[node.name] = JitFunction(
                name=node.name,
                line=node.lineno,
                params=[a.arg for a in node.args.args],
                constexpr_params=_constexpr_params(node),
                autotune_configs=configs,
                autotune_key=key,
                has_heuristics=any(
                    isinstance(d, ast.Call) and dotted_name(d.func) in {"triton.heuristics", "heuristics"}
                    for d in node.decorator_list
                ),
                node=node,
                autotuned=any(isinstance(d, ast.Call) and dotted_name(d.func) in {"triton.autotune", "autotune"}
                              for d in node.decorator_list),
            )
        elif isinstance(node, ast.ClassDef) and node.name == "Model":
            model_class = node

    launches: list[LaunchSite] = []
    # launch sites: kernel[grid](...) anywhere in the module (Model methods or module-level helpers)
    for fn_node in ast.walk(tree):
        if not isinstance(fn_node, ast.FunctionDef) or fn_node.name in functions:
            continue
        for node in ast.walk(fn_node):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)):
                continue
            kname = dotted_name(node.func.value)
            if kname not in functions:
                continue
            jf = functions[kname]
            constexprs: dict[str, Any] = {}
            options: dict[str, Any] = {}
            other: dict[str, str] = {}
            for kw in node.keywords:
                if kw.arg is None:
                    other["**"] = segment_of(source, kw.value) or ""
                    continue
                val = literal(kw.value)
                if kw.arg in LAUNCH_OPTIONS and is_literal(val):
                    options[kw.arg] = val
                elif kw.arg in jf.constexpr_params and is_literal(val):
                    constexprs[kw.arg] = val
                else:
                    other[kw.arg] = segment_of(source, kw.value) or ""
            launches.append(
                LaunchSite(
                    kernel=kname,
                    line=node.lineno,
                    function=fn_node.name,
                    grid=segment_of(source, node.func.slice) or "",
                    args=[segment_of(source, a) or "" for a in node.args],
                    constexprs=constexprs,
                    options=options,
                    other_kwargs=other,
                    node=node,
                )
            )
    launches.sort(key=lambda s: s.line)
    collector = _CallCollector()
    collector.visit(tree)
    return KernelModel(
        source=source,
        path=path,
        tree=tree,
        functions=functions,
        launches=launches,
        calls=collector.calls,
        model_class=model_class,
    )


def _program_id_axis(node: ast.AST) -> int | None:
    """The literal axis of a ``tl.program_id(0)`` / ``tl.program_id(axis=0)`` call, else None."""
    if not (isinstance(node, ast.Call) and (dotted_name(node.func) or "").endswith("program_id")):
        return None
    arg = node.args[0] if node.args else next((kw.value for kw in node.keywords if kw.arg == "axis"), None)
    val = literal(arg) if arg is not None else None
    return val if is_literal(val) and isinstance(val, int) and not isinstance(val, bool) else None


def axis_blocks(fn: JitFunction) -> dict[int, set[str]]:
    """Which constexpr block sizes scale each grid axis: ``pid = tl.program_id(0)`` ... ``pid * BLOCK`` -> {0: {BLOCK}};
    ``tl.program_id(axis=0) * BLOCK`` written inline counts the same."""
    pid_axis: dict[str, int] = {}
    for node in ast.walk(fn.node):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            axis = _program_id_axis(node.value)
            if axis is not None:
                pid_axis[node.targets[0].id] = axis
    out: dict[int, set[str]] = {}
    consts = set(fn.constexpr_params)
    for node in ast.walk(fn.node):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
            continue
        for side, other in ((node.left, node.right), (node.right, node.left)):
            if not (isinstance(other, ast.Name) and other.id in consts):
                continue
            axis = pid_axis.get(side.id) if isinstance(side, ast.Name) else _program_id_axis(side)
            if axis is not None:
                out.setdefault(axis, set()).add(other.id)
    return out


def _param_sources(fn: ast.FunctionDef) -> dict[str, set[str]]:
    """Per local name of a jit function, the parameters its value is made from (assignments followed)."""
    params = {a.arg for a in fn.args.args}
    out: dict[str, set[str]] = {p: {p} for p in params}
    assigns = [n for n in ast.walk(fn) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and
               getattr(n, "value", None) is not None]
    for _ in range(8):
        grew = False
        for node in assigns:
            used = set().union(*(out.get(n.id, set()) for n in ast.walk(node.value) if isinstance(n, ast.Name)))
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for name in (n.id for n in ast.walk(t) if isinstance(n, ast.Name)):
                    if not used <= out.setdefault(name, set()):
                        out[name] |= used
                        grew = True
        if not grew:
            break
    return out


def stored_params(fn: JitFunction) -> set[str]:
    """The pointer (or descriptor) parameters a jit function stores into: ``tl.store(c_ptr + offs, ...)``,
    ``tl.atomic_add(...)``, ``desc.store(...)`` of a descriptor made from a parameter or passed as one."""
    sources = _param_sources(fn.node)
    out: set[str] = set()
    for node in ast.walk(fn.node):
        if not isinstance(node, ast.Call):
            continue
        name = dotted_name(node.func) or ""
        target: ast.AST | None = None
        if _tl_alias(name) in ("tl.store",) or _tl_alias(name).startswith("tl.atomic_"):
            target = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "pointer"), None)
        elif isinstance(node.func, ast.Attribute) and node.func.attr in ("store", "atomic_add", "atomic_max",
                                                                         "atomic_min", "scatter"):
            target = node.func.value
        if target is not None:
            for n in ast.walk(target):
                if isinstance(n, ast.Name):
                    out |= sources.get(n.id, set())
    return out & set(fn.params)


def early_returns(fn: ast.FunctionDef) -> list[ast.Return]:
    """The ``return`` statements of a jit function that leave before its end: all but a bare ``return`` that is its
    last statement (which ends the body as falling off it would)."""
    last = fn.body[-1] if fn.body else None
    return [n for n in ast.walk(fn) if isinstance(n, ast.Return)
            and not (n is last and n.value is None)]


_PID_CALLS = ("program_id", "num_programs")


def loops_over_programs(fn: JitFunction) -> bool:
    """Whether a jit function loops over work by program id (a persistent tile loop, a grid-stride loop)."""
    sources = {name for name, _ in _pid_names(fn.node)}
    for node in ast.walk(fn.node):
        if isinstance(node, (ast.For, ast.While)):
            head = node.iter if isinstance(node, ast.For) else node.test
            for n in ast.walk(head):
                if isinstance(n, ast.Name) and n.id in sources:
                    return True
                if isinstance(n, ast.Call) and (dotted_name(n.func) or "").endswith(_PID_CALLS):
                    return True
    return False


def _pid_names(fn: ast.FunctionDef) -> list[tuple[str, ast.AST]]:
    """Local names bound (directly or through arithmetic) from ``tl.program_id`` / ``tl.num_programs``."""
    found: dict[str, ast.AST] = {}
    for _ in range(4):
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                uses = any(isinstance(n, ast.Call) and (dotted_name(n.func) or "").endswith(_PID_CALLS)
                           or isinstance(n, ast.Name) and n.id in found for n in ast.walk(node.value))
                if uses:
                    for t in node.targets:
                        for n in ast.walk(t):
                            if isinstance(n, ast.Name):
                                found.setdefault(n.id, node)
    return list(found.items())
