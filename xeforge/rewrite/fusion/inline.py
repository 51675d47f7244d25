"""Calls that reach a kernel launch, brought into ``Model.forward``: wrappers, methods, autograd Functions, ops.

Owns: :func:`into_forward`, which replaces each call in ``forward`` that leads (directly or through further
calls) to a ``kernel[grid](...)`` launch by the callee's body, until the launches are ``forward``'s own
statements, and the reason, naming the construct and its line, when a call cannot be inlined. The fusion
rewrites edit ``forward``'s statements (the torch ops after a launch become the kernel's epilogue); people
write the launch in a module-level wrapper, a method of a launcher object, a ``torch.autograd.Function``'s
``forward`` (Liger-Kernel style) or a ``torch.library`` op, so the fusion tactics inline first and fuse after.

What is resolved: ``f(...)`` for a module-level function (also one decorated as a ``torch.library.custom_op``),
``Fn.apply(...)`` for a ``torch.autograd.Function`` (its ``ctx`` bookkeeping dropped: the port is forward-only,
the Function and its backward are no longer used by ``forward``), ``Cls.method(...)`` for a static method,
``self.method(...)`` and ``self.attr.method(...)`` where ``__init__`` sets ``self.attr = Cls(...)``, and
``torch.ops.ns.op(...)`` for an op made with ``@torch.library.custom_op``/``triton_op`` or ``torch.library.impl``.
Parameters bound to plain names or attributes are substituted; other arguments are evaluated once, into a
local, in the order they were written. Callee locals that clash with ``forward``'s names are renamed.

Refused, with the line: a callee with ``*args``/``**kwargs``, a call with ``*``/``**`` arguments, more than one
``return`` (or one that is not the last statement), ``yield``/``global``/``nonlocal``, a ``ctx`` used for more
than saving for backward, and a launching call inside a lambda, a comprehension, ``and``/``or`` or ``x if c
else y`` (where it may not run). A decorator other than ``staticmethod``/``classmethod`` and the op
registrations is named in the description: its effect is not kept, and the verifier judges the result.
Inlined module-level definitions that nothing references any more are removed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

import libcst as cst

from xeforge.kernel_model import parse_python
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.context import fresh_namer
from xeforge.rewrite.cst_tools import Parsed, code, dotted, expr, names_in, rename, statements, walk

#: calls inlined into one forward at most (a chain of wrappers is one call per level)
MAX_INLINES = 8
_TRANSPARENT = {"staticmethod", "classmethod"}
_OP_DECORATORS = ("custom_op", "triton_op", "impl")
_NESTED = (cst.FunctionDef, cst.ClassDef, cst.Lambda)  # their returns, yields and names are their own
_UNSAFE_CONTEXTS = (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp, cst.BooleanOperation,
                    cst.IfExp)


@dataclass
class Callee:
    fn: cst.FunctionDef
    what: str  # how the description names it
    owner: str | None  # the class the function is a method of
    self_expr: cst.BaseExpression | None = None  # what a method's first parameter stands for
    ctx_param: bool = False  # autograd Function.forward: the first parameter is ctx
    defined: str | None = None  # the module-level def / class it comes from (removed when unused)


@dataclass
class CallSites:
    """The module-level definitions a call in ``forward`` can reach."""

    parsed: Parsed
    jit: set[str] = field(default_factory=set)
    functions: dict[str, cst.FunctionDef] = field(default_factory=dict)
    classes: dict[str, cst.ClassDef] = field(default_factory=dict)
    ops: dict[str, str] = field(default_factory=dict)  # "ns::op" -> function name
    attrs: dict[str, dict[str, str]] = field(default_factory=dict)  # class -> {attribute: class of its value}

    @classmethod
    def of(cls, source: str) -> "CallSites":
        m = cls(Parsed.of(source))
        for node in m.parsed.module.body:
            if isinstance(node, cst.FunctionDef):
                decs = [dotted(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator) or ""
                        for d in node.decorators]
                if any(d in ("triton.jit", "jit") or d.endswith("autotune") or d.endswith("heuristics") for d in decs):
                    m.jit.add(node.name.value)
                    continue
                m.functions[node.name.value] = node
                for d in node.decorators:
                    name = _op_name(d.decorator)
                    if name:
                        m.ops[name] = node.name.value
            elif isinstance(node, cst.ClassDef):
                m.classes[node.name.value] = node
        for name, c in m.classes.items():
            m.attrs[name] = _init_attrs(c, m.classes)
        return m

    def method(self, cls: str, name: str) -> cst.FunctionDef | None:
        c = self.classes.get(cls)
        if c is None:
            return None
        for item in c.body.body:
            if isinstance(item, cst.FunctionDef) and item.name.value == name:
                return item
        return None

    def line(self, node: cst.CSTNode) -> int:
        return self.parsed.line(node)

    # -- which call is which ---------------------------------------------------------------------------
    def resolve(self, call: cst.Call, owner: str | None) -> Callee | None:
        f = call.func
        name = dotted(f) or ""
        if isinstance(f, cst.Name) and f.value in self.functions:
            fn = self.functions[f.value]
            op = next((n for n, fname in self.ops.items() if fname == f.value), None)
            what = f"the torch.library op {op} ({f.value})" if op else f"the wrapper {f.value}"
            return Callee(fn, what, None, defined=f.value)
        if name.startswith("torch.ops."):
            parts = name.split(".")[2:]
            if parts and parts[-1] in ("default",):
                parts = parts[:-1]
            if len(parts) == 2 and f"{parts[0]}::{parts[1]}" in self.ops:
                fname = self.ops[f"{parts[0]}::{parts[1]}"]
                return Callee(self.functions[fname], f"the torch.library op {parts[0]}::{parts[1]} ({fname})", None,
                              defined=fname)
            return None
        if not isinstance(f, cst.Attribute):
            return None
        base, meth = f.value, f.attr.value
        if isinstance(base, cst.Name) and base.value in self.classes:
            c = base.value
            if meth == "apply" and _is_autograd(self.classes[c]):
                fn = self.method(c, "forward")
                if fn is not None:
                    return Callee(fn, f"{c}.apply (a torch.autograd.Function: the port is forward-only, {c} and its "
                                  "backward are no longer used by forward)", c, ctx_param=True, defined=c)
            fn = self.method(c, meth)
            if fn is not None and _decorated(fn, "staticmethod"):
                return Callee(fn, f"{c}.{meth}", c, defined=f"{c}.{meth}")
            return None
        if isinstance(base, cst.Name) and base.value == "self" and owner is not None:
            fn = self.method(owner, meth)
            if fn is not None and not _decorated(fn, "staticmethod"):
                return Callee(fn, f"self.{meth} ({owner}.{meth})", owner, self_expr=cst.Name("self"),
                              defined=f"{owner}.{meth}")
            return None
        if isinstance(base, cst.Attribute) and isinstance(base.value, cst.Name) and base.value.value == "self" \
                and owner is not None:
            cls = self.attrs.get(owner, {}).get(base.attr.value)
            fn = self.method(cls, meth) if cls else None
            if fn is not None and not _decorated(fn, "staticmethod"):
                return Callee(fn, f"self.{base.attr.value}.{meth} ({cls}.{meth})", cls, self_expr=base,
                              defined=f"{cls}.{meth}")
        return None

    def launches(self, fn: cst.FunctionDef, owner: str | None, seen: frozenset = frozenset()) -> bool:
        """Whether running ``fn`` launches a kernel (itself or through the calls it makes)."""
        if id(fn) in seen:
            return False
        seen = seen | {id(fn)}
        for n in walk(fn.body, skip=(cst.FunctionDef, cst.ClassDef)):
            if isinstance(n, cst.Call):
                if isinstance(n.func, cst.Subscript) and dotted(n.func.value) in self.jit:
                    return True
                callee = self.resolve(n, owner)
                if callee is not None and self.launches(callee.fn, callee.owner, seen):
                    return True
        return False


def _op_name(dec: cst.BaseExpression) -> str | None:
    """``ns::op`` for ``@torch.library.custom_op("ns::op", ...)`` / ``triton_op`` / ``impl``."""
    if not isinstance(dec, cst.Call) or not (dotted(dec.func) or "").endswith(_OP_DECORATORS) or not dec.args:
        return None
    first = dec.args[0].value
    if isinstance(first, cst.SimpleString) and "::" in first.evaluated_value:
        return first.evaluated_value
    return None


def _is_autograd(c: cst.ClassDef) -> bool:
    return any((dotted(b.value) or "").endswith("autograd.Function") or dotted(b.value) == "Function" for b in c.bases)


def _decorated(fn: cst.FunctionDef, name: str) -> bool:
    return any(dotted(d.decorator) == name for d in fn.decorators)


def _init_attrs(c: cst.ClassDef, classes: dict) -> dict[str, str]:
    """``self.attr = Cls(...)`` in ``__init__``: attribute -> Cls (a class of this module)."""
    out: dict[str, str] = {}
    for item in c.body.body:
        if isinstance(item, cst.FunctionDef) and item.name.value == "__init__":
            for n in walk(item.body, skip=(cst.FunctionDef, cst.ClassDef)):
                if isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.value, cst.Call):
                    t = n.targets[0].target
                    cls = dotted(n.value.func)
                    if isinstance(t, cst.Attribute) and isinstance(t.value, cst.Name) and t.value.value == "self" \
                            and cls in classes:
                        out[t.attr.value] = cls
    return out


# ------------------------------------------------------------------------------------------------ substitution
def _simple(e: cst.BaseExpression) -> bool:
    """A plain name, an attribute chain of names, or a number / string / None / True / False."""
    if dotted(e) is not None:
        return True
    return isinstance(e, (cst.Integer, cst.Float, cst.SimpleString))


def bound_names(fn_source: str) -> tuple[set[str], set[str]]:
    """(names the function binds, names it reads) — nested functions and lambdas keep their own."""
    tree = parse_python(fn_source).body[0]
    bound, read = set(), set()

    def visit(n: ast.AST, top: bool) -> None:
        for ch in ast.iter_child_nodes(n):
            if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(ch.name)
                continue
            if isinstance(ch, ast.Lambda):
                inner = {a.arg for a in ch.args.args}
                read.update(x.id for x in ast.walk(ch.body) if isinstance(x, ast.Name) and x.id not in inner)
                continue
            if isinstance(ch, ast.Name):
                (bound if isinstance(ch.ctx, (ast.Store, ast.Del)) else read).add(ch.id)
            elif isinstance(ch, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in ch.names)
            elif isinstance(ch, ast.ExceptHandler) and ch.name:
                bound.add(ch.name)
            visit(ch, False)

    for stmt in tree.body:
        visit(ast.Module(body=[stmt], type_ignores=[]), True)
    return bound, read


# ------------------------------------------------------------------------------------------------ one call
@dataclass
class Inlined:
    stmts: list[cst.BaseStatement]
    ret: cst.BaseExpression | None
    locals: set[str]  # names the inlined statements bind (after renaming)
    note: str
    guarded: bool = False  # its early exits (``if C: ... return X``) became ``if C: return EXIT()``


def param_list(fn: cst.FunctionDef) -> list[cst.Param]:
    p = fn.params
    if isinstance(p.star_arg, cst.Param) or p.star_kwarg is not None:
        raise NotApplicable("it takes *args / **kwargs")
    return [*p.posonly_params, *p.params, *p.kwonly_params]


def _bind(callee: Callee, call: cst.Call, m: CallSites) -> list[tuple[str, cst.BaseExpression]]:
    """(parameter, argument) in the order of the parameters; defaults filled in."""
    params = param_list(callee.fn)
    if callee.ctx_param or callee.self_expr is not None:
        if not params:
            raise NotApplicable(f"{callee.fn.name.value} has no first parameter")
        first, params = params[0], params[1:]
    positional = [a for a in call.args if a.keyword is None]
    if any(a.star for a in call.args):
        raise NotApplicable("the call passes *args / **kwargs")
    by_kw = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    if len(positional) > len(params):
        raise NotApplicable(f"the call passes {len(positional)} positional arguments, "
                            f"{callee.fn.name.value} takes {len(params)}")
    out: list[tuple[str, cst.BaseExpression]] = []
    if callee.self_expr is not None:
        out.append((first.name.value, callee.self_expr))
    for i, p in enumerate(params):
        name = p.name.value
        if i < len(positional) and p not in callee.fn.params.kwonly_params:
            out.append((name, positional[i].value))
        elif name in by_kw:
            out.append((name, by_kw.pop(name)))
        elif p.default is not None:
            out.append((name, p.default))
        else:
            raise NotApplicable(f"the call does not pass {name}")
    if by_kw:
        raise NotApplicable(f"{callee.fn.name.value} has no parameter {', '.join(by_kw)}")
    return out


def inline_body(callee: Callee, call: cst.Call, m: CallSites, taken: set[str], fwd_bound: set[str]) -> Inlined:
    """The statements that stand for ``call`` of ``callee`` and the value it returns: parameters bound to the
    arguments (plain names substituted, anything else evaluated once into a local), the callee's locals renamed away
    from ``taken``; refused where the callee reads a module name the caller binds (``fwd_bound``). Shared by
    :func:`into_forward` and :mod:`xeforge.rewrite.jit_inline`."""
    fn = callee.fn
    fname = fn.name.value
    body = list(fn.body.body) if isinstance(fn.body, cst.IndentedBlock) else []
    if body and _docstring(body[0]):
        body = body[1:]
    for n in walk(fn.body, skip=_NESTED):
        if isinstance(n, (cst.Yield, cst.Global, cst.Nonlocal)):
            raise NotApplicable(f"{fname} (line {m.line(n)}) uses {type(n).__name__.lower()}")
    if callee.ctx_param:
        ctx = param_list(fn)[0].name.value
        body = [s for s in body if not _ctx_bookkeeping(s, ctx)]
        for s in body:
            if ctx in names_in(s):
                raise NotApplicable(f"{fname} uses {ctx} (line {m.line(s)}) beyond saving for backward")
    returns = [n for s in body for n in walk(s, skip=_NESTED)
               if isinstance(n, cst.Return)]
    last = body[-1] if body else None
    ret_stmt = last.body[0] if isinstance(last, cst.SimpleStatementLine) and len(last.body) == 1 \
        and isinstance(last.body[0], cst.Return) else None
    # early exits at the top level, ``if M == 0: return out`` or a torch fallback off the GPU: each is kept as a
    # call of the callee itself, whose value forward's rest takes (_inline_one writes that rest as a function)
    guards = {id(g): g for g in (_guard_return(st) for st in body[:-1]) if g is not None}
    early = [r for r in returns if r is not ret_stmt]
    if ret_stmt is None and returns or any(id(r) not in guards for r in early):
        lines = ", ".join(str(m.line(r)) for r in returns if r is ret_stmt or id(r) not in guards)
        raise NotApplicable(f"{fname} returns from more than one place or before its end (line {lines}), "
                            "not only from `if ...: return` statements of its own body")
    if ret_stmt is not None:
        body = body[:-1]
    ret = ret_stmt.value if ret_stmt is not None else None
    if early:
        body = [st.visit(_ExitGuards(guards)) for st in body]

    bindings = _bind(callee, call, m)
    fn_code = code(fn.with_changes(decorators=[]))
    bound, read = bound_names(fn_code)
    params = {p for p, _ in bindings}
    if callee.ctx_param:
        params.add(param_list(fn)[0].name.value)
    free = read - bound - params
    clash = sorted(free & fwd_bound)
    if clash:
        raise NotApplicable(f"{fname} reads the module name(s) {', '.join(clash)}, which forward also assigns")
    fresh = fresh_namer(taken)
    renames: dict[str, cst.BaseExpression] = {}
    locals_: set[str] = set()
    for name in sorted(bound - params):
        new = fresh(name) if name in taken else name
        if new != name:
            renames[name] = cst.Name(new)
        locals_.add(new)
    prologue: list[cst.BaseStatement] = []
    for p, arg in bindings:
        if _simple(arg) and p not in bound:
            renames[p] = arg
            continue
        new = fresh(p) if p in taken else p
        locals_.add(new)
        if new != p:
            renames[p] = cst.Name(new)
        prologue.append(cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(new))], arg)]))
    stmts = [*prologue, *(rename(s, renames) for s in body)]
    ret = rename(ret, renames) if ret is not None else None
    dropped = [dotted(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator) or code(d.decorator)
               for d in fn.decorators]
    dropped = [d for d in dropped if d not in _TRANSPARENT and not d.endswith(_OP_DECORATORS)]
    shown = code(call)
    shown = shown if len(shown) <= 72 else shown[:69] + "..."
    note = f"inlined {callee.what} into forward: {shown}"
    if dropped:
        note += f" (its decorator {', '.join('@' + d for d in dropped)} is not applied in forward)"
    return Inlined(stmts, ret, locals_, note, bool(early))


#: the placeholder an early exit of an inlined callee calls: the callee as it was, then forward's rest
EXIT = "__xeforge_rest_of_forward__"
#: the comment that marks that call (a later inlining pass leaves it alone: it is the exit, not a launch path)
EXIT_COMMENT = "# early exit: the call as written (xeforge)"


def _guard_return(stmt: cst.BaseStatement) -> cst.Return | None:
    """The return that ends ``if C: ...; return X`` (no else), where it is that block's only return."""
    if not isinstance(stmt, cst.If) or stmt.orelse is not None or not isinstance(stmt.body, cst.IndentedBlock):
        return None
    end = stmt.body.body[-1] if stmt.body.body else None
    ret = end.body[0] if isinstance(end, cst.SimpleStatementLine) and len(end.body) == 1 and \
        isinstance(end.body[0], cst.Return) else None
    inner = [n for n in walk(stmt, skip=_NESTED) if isinstance(n, cst.Return)]
    return ret if ret is not None and len(inner) == 1 else None


class _ExitGuards(cst.CSTTransformer):
    """Each guard ``if C: ...; return X`` -> ``if C: return EXIT()``: where C holds, the callee itself is called
    (its own early exit, fallback and all, runs as written) and forward's rest runs on its value."""

    def __init__(self, guards: dict[int, cst.Return]) -> None:
        super().__init__()
        self.guards = guards

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
        if _guard_return(original) is None or id(_guard_return(original)) not in self.guards:
            return updated
        mark = cst.TrailingWhitespace(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(EXIT_COMMENT))
        exit_ = cst.SimpleStatementLine([cst.Return(cst.Call(cst.Name(EXIT), []))], trailing_whitespace=mark)
        return updated.with_changes(body=updated.body.with_changes(body=[exit_]))


def _rest_of_forward(fwd: cst.FunctionDef, stmt: cst.BaseStatement, call: cst.Call, fresh,
                     callee: str) -> tuple[list[cst.BaseStatement], str | None]:
    """Forward's statements from the call's on, as a function of the call's value (for the callee's early exits:
    ``return EXIT()`` becomes ``return <that function>(<the call>, ...)``): its definition and that call's template,
    or none where forward just returns the value. The names it reads that forward bound before the call are passed
    in."""
    body = list(fwd.body.body) if isinstance(fwd.body, cst.IndentedBlock) else []
    at = next((i for i, st in enumerate(body) if st is stmt), None)
    if at is None:
        raise NotApplicable(f"it returns early, and its call is not a statement of forward's own body (a "
                            "statement under if/for/with): the early exit would need forward's rest there")
    value = fresh("value")
    rest = [body[at].visit(SwapNode(call, cst.Name(value))), *body[at + 1:]]
    if len(rest) == 1 and isinstance(rest[0], cst.SimpleStatementLine) and \
            isinstance(rest[0].body[0], cst.Return) and isinstance(rest[0].body[0].value, cst.Name) and \
            rest[0].body[0].value.value == value:
        return [], None
    before = {p.name.value for p in param_list(fwd)}
    if body[:at]:
        before |= bound_names(code(fwd.with_changes(body=fwd.body.with_changes(body=body[:at]),
                                                     decorators=[])))[0]
    rest_code = "\n".join(code(st.with_changes(leading_lines=[]) if hasattr(st, "leading_lines") else st).rstrip("\n")
                          for st in rest)
    reads = bound_names("def _f():\n" + "\n".join("    " + ln for ln in rest_code.splitlines()))[1]
    passed = sorted((reads & before) - {value})
    name = fresh(f"_rest_after_{callee}")
    header = f"def {name}({', '.join([value, *passed])}):"
    comment = f"    # forward from the call of {callee} on, as written: its early exits return through here (xeforge)"
    text = header + "\n" + comment + "\n" + "\n".join("    " + ln if ln.strip() else ln
                                                         for ln in rest_code.splitlines()) + "\n"
    return statements(text), f"{name}({{}}{''.join(', ' + p for p in passed)})"


class _Exits(cst.CSTTransformer):
    """``EXIT()`` -> the original call, through the rest-of-forward function where there is one."""

    def __init__(self, template: str | None, call: cst.Call) -> None:
        super().__init__()
        self.template, self.call = template, call

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not (isinstance(updated.func, cst.Name) and updated.func.value == EXIT):
            return updated
        return self.call if self.template is None else expr(self.template.format(code(self.call)))


class _KernelNames(cst.CSTTransformer):
    """Launches ``K[grid](...)`` of the kernels in ``names`` -> of their copies."""

    def __init__(self, names: dict[str, str]) -> None:
        super().__init__()
        self.names = names

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.Subscript:
        if isinstance(updated.value, cst.Name) and updated.value.value in self.names:
            return updated.with_changes(value=cst.Name(self.names[updated.value.value]))
        return updated


class _KernelCopies(cst.CSTTransformer):
    """Each kernel of ``names`` followed by its copy under the new name (module level)."""

    def __init__(self, names: dict[str, str]) -> None:
        super().__init__()
        self.names = names

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        body: list[cst.BaseStatement] = []
        for st in updated.body:
            body.append(st)
            if isinstance(st, cst.FunctionDef) and st.name.value in self.names:
                body.append(st.with_changes(name=cst.Name(self.names[st.name.value]),
                                            leading_lines=[cst.EmptyLine(), cst.EmptyLine()]))
        return updated.with_changes(body=body)


def _docstring(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr) \
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))


def _ctx_bookkeeping(stmt: cst.BaseStatement, ctx: str) -> bool:
    """``ctx.save_for_backward(...)``, ``ctx.eps = eps``: what only the backward reads."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False

    def on_ctx(e: cst.CSTNode) -> bool:
        while isinstance(e, cst.Attribute):
            e = e.value
        return isinstance(e, cst.Name) and e.value == ctx

    for s in stmt.body:
        if isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) and on_ctx(s.value.func):
            continue
        if isinstance(s, cst.Assign) and all(isinstance(t.target, cst.Attribute) and on_ctx(t.target)
                                             for t in s.targets):
            continue
        return False
    return True


# ------------------------------------------------------------------------------------------------ forward
class SwapNode(cst.CSTTransformer):
    """Replace one node (by identity)."""

    def __init__(self, old: cst.CSTNode, new: cst.CSTNode) -> None:
        super().__init__()
        self.old, self.new = old, new

    def on_leave(self, original, updated):  # type: ignore[override]
        return self.new if original is self.old else updated


def _launching_call(stmt: cst.BaseStatement, m: CallSites) -> tuple[cst.Call, Callee] | None:
    """The first call in ``stmt`` (a simple statement line) whose callee launches a kernel."""
    stack: list[tuple[cst.CSTNode, bool]] = [(c, False) for c in reversed(list(stmt.children))]
    while stack:
        n, unsafe = stack.pop()
        if isinstance(n, cst.Call):
            callee = m.resolve(n, "Model")
            if callee is not None and m.launches(callee.fn, callee.owner):
                if unsafe:
                    raise NotApplicable(f"the call of {callee.what.split(' (')[0]} (line {m.line(n)}) is inside a "
                                        "lambda, a comprehension, and/or or a conditional expression")
                return n, callee
        if isinstance(n, (cst.FunctionDef, cst.ClassDef)):
            continue
        stack.extend((c, unsafe or isinstance(n, _UNSAFE_CONTEXTS)) for c in reversed(list(n.children)))
    return None


def _replacement(stmt: cst.SimpleStatementLine, call: cst.Call, inl: Inlined, fresh) -> list[cst.BaseStatement]:
    s = stmt.body[0] if len(stmt.body) == 1 else None
    stmts, ret = list(inl.stmts), inl.ret
    if isinstance(s, cst.Assign) and s.value is call and len(s.targets) == 1 \
            and isinstance(s.targets[0].target, cst.Name):
        t = s.targets[0].target.value
        body_names = set().union(*(names_in(x) for x in stmts)) if stmts else set()
        if isinstance(ret, cst.Name) and ret.value in inl.locals and t not in body_names - {ret.value}:
            # the callee's result variable takes the target's name: y = torch.empty(...) ... launch(..., y, ...)
            return [rename(x, {ret.value: t}) for x in stmts]
        value = ret if ret is not None else cst.Name("None")
        return [*stmts, stmt.with_changes(body=[s.with_changes(value=value)])]
    if isinstance(s, cst.Expr) and s.value is call:
        return stmts
    if isinstance(s, cst.Return) and s.value is call:
        return [*stmts, stmt.with_changes(body=[s.with_changes(value=ret if ret is not None else cst.Name("None"))])]
    if ret is None:
        value: cst.BaseExpression = cst.Name("None")
    elif _simple(ret):
        value = ret
    else:
        tmp = fresh(f"{dotted(call.func).rsplit('.', 1)[-1] if dotted(call.func) else 'call'}_out")
        stmts.append(cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(tmp))], ret)]))
        value = cst.Name(tmp)
    return [*stmts, stmt.visit(SwapNode(call, value))]


def _forward(m: CallSites) -> cst.FunctionDef | None:
    model = m.classes.get("Model")
    return m.method("Model", "forward") if model is not None else None


def _inline_one(source: str) -> tuple[str, str, str | None] | None:
    """Inline the first launching call in forward: (new source, note, the inlined definition), or None."""
    m = CallSites.of(source)
    fwd = _forward(m)
    if fwd is None:
        return None
    fwd_code = code(fwd.with_changes(decorators=[]))
    fwd_bound, fwd_read = bound_names(fwd_code)
    taken = fwd_bound | fwd_read | {p.name.value for p in param_list(fwd)} | set(m.functions) | set(m.classes) | m.jit
    found: list = []

    class Find(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is fwd

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return node.name.value == "Model"

        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
            comment = node.trailing_whitespace.comment
            if not found and not (comment is not None and comment.value == EXIT_COMMENT):
                hit = _launching_call(node, m)
                if hit:
                    found.append((node, *hit))
            return False

        def visit_If(self, node):  # a launching call in a compound statement's header runs where it may not
            return self._header(node, node.test)

        def visit_While(self, node):
            return self._header(node, node.test)

        def visit_For(self, node):
            return self._header(node, node.iter)

        def _header(self, node, head) -> bool:
            if not found:
                hit = _launching_call(cst.SimpleStatementLine([cst.Expr(head)]), m)
                if hit:
                    raise NotApplicable(f"the call of {hit[1].what.split(' (')[0]} (line {m.line(node)}) is in the "
                                        f"header of a {type(node).__name__.lower()} statement")
            return True

    m.parsed.module.visit(Find())
    if not found:
        return None
    stmt, call, callee = found[0]
    try:
        inl = inline_body(callee, call, m, taken, fwd_bound)
    except NotApplicable as exc:
        raise NotApplicable(f"{callee.what.split(' (')[0]} (line {m.line(call)}) cannot be inlined into forward: "
                            f"{exc}") from None
    fresh = fresh_namer(taken | inl.locals)
    rest_def: list[cst.BaseStatement] = []
    copies: dict[str, str] = {}
    if inl.guarded:
        try:
            rest_def, template = _rest_of_forward(fwd, stmt, call, fresh, callee.fn.name.value)
        except NotApplicable as exc:
            raise NotApplicable(f"{callee.what.split(' (')[0]} (line {m.line(call)}) cannot be inlined into forward: "
                                f"{exc}") from None
        inl.stmts = [st.visit(_Exits(template, call)) for st in inl.stmts]
        # the callee stays for its early exits, launching its kernels as written; the inlined launches get copies
        # of them, which fusion may change (the callee's kernels, and the user's wrapper, mean what they meant)
        launched = sorted({n.value.value for st in inl.stmts for n in walk(st) if isinstance(n, cst.Subscript)
                           and isinstance(n.value, cst.Name) and n.value.value in m.jit})
        copies = {k: fresh(f"{k}_fused") for k in launched}
        inl.stmts = [st.visit(_KernelNames(copies)) for st in inl.stmts]
        inl.note += (" (its early returns call it as it was, then run the rest of forward"
                     + (f"; {', '.join(f'{v} is a copy of {k}' for k, v in copies.items())} for the inlined launch"
                        if copies else "") + ")")
    new = [*rest_def, *_replacement(stmt, call, inl, fresh)]
    comment = cst.EmptyLine(comment=cst.Comment(f"# {code(call.func)}(...), inlined (xeforge, fusion)"))
    new[0] = new[0].with_changes(leading_lines=[*stmt.leading_lines, comment, *new[0].leading_lines])
    swapped = m.parsed.module.visit(ReplaceStatement(stmt, new))
    if inl.guarded and copies:
        swapped = swapped.visit(_KernelCopies(copies))
    return swapped.code, inl.note, None if inl.guarded else callee.defined


class ReplaceStatement(cst.CSTTransformer):
    """Replace one statement of a block by several."""

    def __init__(self, old: cst.BaseStatement, new: list[cst.BaseStatement]) -> None:
        super().__init__()
        self.old, self.new = old, new

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        if not any(o is self.old for o in original.body):
            return updated
        body = []
        for o, u in zip(original.body, updated.body):
            body.extend(self.new if o is self.old else [u])
        return updated.with_changes(body=body)


def _decorator_names(node: cst.FunctionDef | cst.ClassDef) -> set[str]:
    return set().union(*(names_in(d) for d in node.decorators)) if node.decorators else set()


def drop_unreferenced(source: str, names: set[str]) -> str:
    """Drop the inlined definitions among ``names`` that no other code of the module names (``Cls.meth``: a method
    whose attribute name is read nowhere else), with the definitions that only decorate them
    (``@op.register_fake``), then the helpers (plain functions and classes, never kernels) only they named."""
    for _ in range(16):
        module = cst.parse_module(source)
        defs = {n.name.value: n for n in module.body if isinstance(n, (cst.FunctionDef, cst.ClassDef))}
        kernels = CallSites.of(source).jit
        drop: set[str] = set()
        for name in names & set(defs):
            users = [n for n in module.body if n is not defs[name] and name in names_in(n)]
            # a definition that names it only in its decorators goes with it (a custom op's fake, its autograd)
            if all(isinstance(u, (cst.FunctionDef, cst.ClassDef)) and name in _decorator_names(u)
                   and name not in names_in(u.body) for u in users):
                drop |= {name, *(u.name.value for u in users)}
        methods = {n.split(".", 1)[1]: n.split(".", 1)[0] for n in names if "." in n}
        gone_methods: dict[str, set[str]] = {}
        for meth, cls in methods.items():
            if cls in defs and not any(_attr_read(n, meth, skip=(cls, meth)) for n in module.body):
                gone_methods.setdefault(cls, set()).add(meth)
        if not drop and not gone_methods:
            return source
        names = (names - drop - {f"{c}.{m}" for c, ms in gone_methods.items() for m in ms}) | {
            n for d in drop for n in names_in(defs[d]) if n in defs and n not in kernels}
        body = []
        for n in module.body:
            if isinstance(n, (cst.FunctionDef, cst.ClassDef)) and n.name.value in drop:
                continue
            if isinstance(n, cst.ClassDef) and n.name.value in gone_methods:
                kept = [x for x in n.body.body if not (isinstance(x, cst.FunctionDef)
                                                       and x.name.value in gone_methods[n.name.value])]
                n = n.with_changes(body=n.body.with_changes(body=kept or [cst.SimpleStatementLine([cst.Pass()])]))
            body.append(n)
        source = module.with_changes(body=body).code
    return source


def _attr_read(node: cst.CSTNode, attr: str, skip: tuple[str, str]) -> bool:
    """Whether ``node`` reads ``.attr`` anywhere outside the method ``skip`` (class, method) itself."""
    cls, meth = skip
    if isinstance(node, cst.ClassDef) and node.name.value == cls:
        return any(_attr_read(x, attr, skip) for x in node.body.body
                   if not (isinstance(x, cst.FunctionDef) and x.name.value == meth))
    return any(isinstance(n, cst.Attribute) and n.attr.value == attr for n in walk(node))


def into_forward(source: str) -> tuple[str, list[str]] | None:
    """``source`` with every launching call in ``Model.forward`` inlined, and a note per inlined call; None when
    forward makes no such call. Raises :class:`NotApplicable` naming the call, its line and the construct."""
    notes: list[str] = []
    defined: set[str] = set()
    for _ in range(MAX_INLINES):
        step = _inline_one(source)
        if step is None:
            break
        source, note, name = step
        notes.append(note)
        if name:
            defined.add(name)
    else:
        if _inline_one(source) is not None:
            raise NotApplicable(f"forward still calls into launches after {MAX_INLINES} inlined calls")
    if not notes:
        return None
    return drop_unreferenced(source, defined), notes
