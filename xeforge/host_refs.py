"""What a file's host code names from torch, wherever it stands, with aliases followed to what they name.

Owns: every reference the code outside the ``@triton.jit`` bodies makes to

- **torch compute** — a torch function (``torch.mm``, ``F.relu``), a tensor method (``.sum()``, ``.__matmul__``,
  ``.numpy()``, also bound and passed around: ``f = x.sum``), the ``@`` operator, ``operator``'s arithmetic, a call of
  a torch submodule (``self.linear(x)``); inside a ``@triton.jit`` body only what names torch counts (``tl`` has
  methods of the same names), and an ``autograd.Function``'s ``backward`` that nothing calls by name is not read;
- **torch internals** — ``torch._C`` and every other private path, ``torch.ops`` (but the file's own ops),
  ``torch.overrides`` and the mode stacks, ``torch.utils._python_dispatch``, the profilers, ``torch.jit`` (fork),
  ``torch.multiprocessing`` / ``torch.futures`` (threads), a ``torch.library`` registration into a namespace the file
  does not define (``aten``), Triton's private paths and a kernel's private attributes (``kernel._bench``);
- **patches** — an assignment to an attribute of torch or triton (``torch.mm = ...``,
  ``JITFunction.run = ...``),

at module level, in class bodies, default arguments, decorators, lambdas and nested functions alike, each with its
line and the form it takes there. Aliases are followed flow-insensitively: ``import torch as T``, ``from torch
import mm``, ``_mm = torch.mm``, ``a, b = torch.mm, torch._C``, ``self.f = torch.mm`` or a class attribute, a default
argument ``f=torch.mm``, ``getattr(torch, "mm")``. A reference inside a tuple, list or dict literal is a reference
where it is written. Gate 1 (:mod:`xeforge.static_checks`) compares a candidate's references with the starting
kernel's; the fusion stage reads the compute calls of ``forward`` (:func:`forward_compute_calls`).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

from xeforge.kernel_model import KernelModel, dotted_name, literal

#: torch names that allocate, view, describe or configure: never compute
NON_COMPUTE = {
    # allocation and views
    "empty", "empty_like", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "empty_strided",
    "arange", "new_empty", "new_zeros", "new_ones", "new_full", "view", "reshape", "permute", "transpose", "t",
    "contiguous", "unsqueeze", "squeeze", "expand", "expand_as", "flatten", "unflatten", "size", "stride", "numel",
    "dim", "is_contiguous", "data_ptr", "element_size", "chunk", "split", "narrow", "select", "as_strided", "device",
    "get_device", "is_floating_point", "no_grad", "inference_mode", "enable_grad", "dtype", "finfo", "iinfo", "Size",
    "next_power_of_2", "cdiv", "is_tensor", "is_grad_enabled", "get_default_dtype", "manual_seed", "Generator",
    # types, modules, dtypes
    "Tensor", "nn", "Module", "Parameter", "ParameterList", "ModuleList", "Buffer", "autograd", "Function",
    "float16", "float32", "float64", "bfloat16", "half", "float", "double", "int8", "int16", "int32", "int64", "uint8",
    "bool", "int", "long", "short", "complex64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "uint16", "uint32", "uint64", "qint8", "quint8", "cfloat", "cdouble", "functional", "init", "version",
    "__version__", "cuda", "xpu", "backends", "Linear", "Conv2d", "LayerNorm", "GroupNorm", "BatchNorm1d",
    "BatchNorm2d", "Embedding", "Dropout", "Identity", "Sequential", "ReLU", "GELU", "SiLU", "testing",
}
#: tensor methods that compute (a call on any object whose name is not a module's)
COMPUTE_METHODS = {
    "sum", "mean", "max", "min", "amax", "amin", "exp", "log", "relu", "sigmoid", "softmax", "log_softmax", "matmul",
    "mm", "bmm", "addmm", "add", "add_", "mul", "mul_", "sub", "sub_", "div", "div_", "pow", "clamp", "clamp_",
    "clamp_min", "clamp_max", "norm", "var", "std", "tanh", "abs", "sqrt", "rsqrt", "logsumexp", "cumsum", "prod",
    "argmax", "argmin", "sort", "topk", "float", "half", "bfloat16", "double", "to", "type", "copy_", "fill_",
    "zero_", "masked_fill", "where", "gelu", "silu", "mish", "erf", "neg", "reciprocal", "square", "einsum", "conv2d",
    "linear", "layer_norm", "group_norm", "batch_norm", "leaky_relu", "hardtanh", "softplus", "maximum", "minimum",
    "clone", "lerp", "baddbmm", "avg_pool1d", "avg_pool2d", "max_pool1d", "max_pool2d",
    "scaled_dot_product_attention", "dropout", "cat", "stack", "numpy", "__array__", "addmv", "mv", "dot", "outer",
    "index_select", "gather", "scatter", "scatter_add", "index_add", "masked_scatter", "tril", "triu", "flip",
    "roll", "cumprod", "exp_", "log_", "sigmoid_", "relu_", "tanh_", "apply_", "map_",
}
#: ``x.__add__(y)`` and the other arithmetic dunders reach torch's operators by name
COMPUTE_DUNDER = re.compile(r"^__(r|i)?(add|sub|mul|matmul|truediv|floordiv|mod|pow|and|or|xor|neg|pos|abs|"
                            r"lshift|rshift|invert|lt|le|gt|ge)__$")
#: ``operator`` functions that only fetch (everything else there is arithmetic on tensors)
OPERATOR_PLAIN = {"itemgetter", "attrgetter", "index", "methodcaller", "length_hint"}
#: torch paths that are internals whatever their spelling (prefix match), with the class a verdict names
INTERNAL_PREFIXES = {
    "torch.ops": "dispatcher ops", "torch.overrides": "the mode stack",
    "torch.utils._python_dispatch": "the mode stack", "torch.profiler": "the profiler",
    "torch.autograd.profiler": "the profiler", "torch.autograd.graph": "autograd hooks", "torch.jit": "threads",
    "torch.multiprocessing": "threads", "torch.futures": "threads", "torch.utils.data": "threads",
    "torch.fx": "graph tracing", "torch.compiler": "the compiler", "torch.export": "graph tracing",
    "torch.distributed": "processes", "torch.utils.cpp_extension": "native code", "torch.hub": "downloads",
    "torch.package": "code loading",
}
MODE_STACK = re.compile(r"torch_function|torch_dispatch|TorchFunction|TorchDispatch|_mode|Mode$|mode_stack")
#: what the usual short names stand for when a file uses them without an import of its own
IMPLICIT = {"torch": "torch", "F": "torch.nn.functional", "nn": "torch.nn", "operator": "operator",
            "triton": "triton", "tl": "triton.language", "functools": "functools", "math": "math"}
#: namespaces a file defines torch.library ops in (custom_op / triton_op / define "ns::op", a Library DEF/FRAGMENT)
OP_NAMESPACE = re.compile(r"""(?:custom_op|triton_op|define)\(\s*["']([A-Za-z_]\w*)::"""
                           r"""|Library\(\s*["']([A-Za-z_]\w*)["']\s*,\s*["'](?:DEF|FRAGMENT)["']""")
#: vendor-library kernel names: a Triton kernel named like one would pass for it in the device account
VENDOR_KERNEL = re.compile(r"^(nvjet|cublas|cutlass|cudnn|xmma|sm\d+_|ampere_|volta_|turing_|hopper_|gemv2|gemmk|"
                           r"splitKreduce|at_native|onednn|oneapi|mkl|dnnl|gen_gemm|esimd)", re.IGNORECASE)


KERNEL_BODY = "kernel body"  # where a @triton.jit function's own statements stand


def _root_name(node: ast.AST) -> str | None:
    """``a`` of ``a.b.c``; None when the chain starts at something else (a call, an operation)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


BACKWARD_BODY = "backward body"  # an autograd.Function's backward: never run by the no-grad call a verdict judges


@dataclass(frozen=True)
class Ref:
    kind: str  # compute | internal | patch
    key: str  # what it names: torch.mm, .sum, @, operator.matmul, torch._C._pop_torch_function_stack
    line: int
    form: str  # how it stands there: "a call in forward()", "bound to _mm at module level", ...
    call: bool = False  # the expression is called where it stands
    why: str = ""  # internals: the class (the mode stack, threads ...)

    def describe(self) -> str:
        return f"line {self.line}: {self.form}"


class _Scopes(ast.NodeVisitor):
    """For every node of the host code, the description of where it stands (module level, a class body, ...)."""

    def __init__(self, jit: set[int], backward: set[int]) -> None:
        self.jit = jit
        self.backward = backward
        self.where: dict[int, str] = {}
        self.stack: list[str] = ["at module level"]

    def _mark(self, node: ast.AST, where: str) -> None:
        for n in ast.walk(node):
            self.where.setdefault(id(n), where)

    def generic_visit(self, node: ast.AST) -> None:
        self.where.setdefault(id(node), self.stack[-1])
        super().generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for dec in node.decorator_list:
            self._mark(dec, f"in a decorator of {node.name}()")
        for d in [*node.args.defaults, *(k for k in node.args.kw_defaults if k is not None)]:
            self._mark(d, f"in a default argument of {node.name}()")
        if id(node) in self.jit or id(node) in self.backward:
            label = KERNEL_BODY if id(node) in self.jit else BACKWARD_BODY
            self.where[id(node)] = label
            for n in ast.walk(node):
                self.where.setdefault(id(n), label)
            return
        nested = len(self.stack) > 1 and not self.stack[-1].startswith("in class")
        self.stack.append(f"in {node.name}()" + (" (a nested function)" if nested else ""))
        for stmt in node.body:
            self.visit(stmt)
        self.stack.pop()
        self.where.setdefault(id(node), self.stack[-1])

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.stack.append(f"in a lambda {self.stack[-1]}")
        self.generic_visit(node)
        self.stack.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for dec in node.decorator_list:
            self._mark(dec, f"in a decorator of class {node.name}")
        for b in node.bases:
            self._mark(b, f"in the bases of class {node.name}")
        self.stack.append(f"in class {node.name}'s body")
        for stmt in node.body:
            self.visit(stmt)
        self.stack.pop()


class HostRefs:
    """The references of one parsed file (see the module docstring)."""

    def __init__(self, model: KernelModel) -> None:
        self.model = model
        scopes = _Scopes({id(f.node) for f in model.functions.values()}, _backward_bodies(model))
        scopes.visit(model.tree)
        self.where = scopes.where
        self.aliases: dict[str, set[str]] = {}
        # torch.ops.<ns> of a namespace the file defines ops in is a call of its own op, not of the dispatcher's
        self.own_ops = {a or b for a, b in OP_NAMESPACE.findall(model.source)}
        self._imports()
        for _ in range(4):  # aliases of aliases: a few rounds reach the fixpoint of any real file
            if not self._bind_round():
                break
        self.refs: list[Ref] = []
        self._collect()

    # -- aliases ----------------------------------------------------------------------------------
    def _host(self, node: ast.AST) -> bool:
        return self.where.get(id(node), "at module level") not in (KERNEL_BODY, BACKWARD_BODY)

    def _alias(self, name: str, path: str) -> bool:
        have = self.aliases.setdefault(name, set())
        if path in have or len(have) >= 8:
            return False
        have.add(path)
        return True

    def _imports(self) -> None:
        for node in ast.walk(self.model.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self._alias(a.asname, a.name)
                    else:
                        root = a.name.split(".")[0]
                        self._alias(root, root)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if a.name != "*":
                        self._alias(a.asname or a.name, f"{node.module}.{a.name}")

    def resolve(self, node: ast.AST) -> set[str]:
        """The dotted paths an expression may name (``T.mm`` with ``T = torch`` -> {"torch.mm"})."""
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return set(self.aliases[node.id])
            return {IMPLICIT[node.id]} if node.id in IMPLICIT else set()
        if isinstance(node, ast.Attribute):
            base = dotted_name(node.value)
            if base is not None and base.startswith("self.") and base in self.aliases:
                return {f"{p}.{node.attr}" for p in self.aliases[base]}
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                key = f"self.{node.attr}"
                return set(self.aliases.get(key, ()))
            return {f"{p}.{node.attr}" for p in self.resolve(node.value)}
        if isinstance(node, ast.Call) and (dotted_name(node.func) or "") == "getattr" and len(node.args) >= 2:
            name = literal(node.args[1])
            if isinstance(name, str):
                return {f"{p}.{name}" for p in self.resolve(node.args[0])}
        if isinstance(node, ast.Call) and (dotted_name(node.func) or "").endswith("partial") and node.args:
            return self.resolve(node.args[0])
        return set()

    def _targets(self, target: ast.AST, value: ast.AST | None) -> Iterable[tuple[str, ast.AST | None]]:
        if isinstance(target, (ast.Tuple, ast.List)):
            vals = value.elts if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts) \
                else [None] * len(target.elts)
            for t, v in zip(target.elts, vals):
                yield from self._targets(t, v)
        elif isinstance(target, ast.Name):
            yield target.id, value
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            yield f"self.{target.attr}", value

    def _bind_round(self) -> bool:
        grew = False
        for node in ast.walk(self.model.tree):
            if not self._host(node):
                continue
            pairs: list[tuple[str, ast.AST | None]] = []
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    pairs += list(self._targets(t, node.value))
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                pairs += list(self._targets(node.target, node.value))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                args = node.args
                pos = [*args.posonlyargs, *args.args]
                pairs += [(a.arg, d) for a, d in zip(pos[len(pos) - len(args.defaults):], args.defaults)]
                pairs += [(a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            elif isinstance(node, ast.ClassDef):
                for stmt in node.body:  # a class attribute is self.<name> in its methods
                    if isinstance(stmt, ast.Assign):
                        for t in stmt.targets:
                            if isinstance(t, ast.Name):
                                pairs.append((f"self.{t.id}", stmt.value))
            for name, value in pairs:
                if value is None:
                    continue
                for elt in _members(value):
                    for path in self.resolve(elt):
                        grew |= self._alias(name, path)
        return grew

    def _kernel_scopes(self) -> dict[int, tuple[frozenset[str], dict[str, set[str]]]]:
        """Each node of a ``@triton.jit`` function -> (the names that function binds to its own values: parameters,
        assignments, loop targets; the names it binds to something that names torch, with those paths:
        ``T = torch`` or ``mm = torch.mm`` in a kernel body stays torch)."""
        out: dict[int, tuple[frozenset[str], dict[str, set[str]]]] = {}
        for fn in self.model.functions.values():
            names = {a.arg for a in fn.node.args.args + fn.node.args.kwonlyargs}
            names |= {n.id for n in ast.walk(fn.node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            torchy: dict[str, set[str]] = {}
            for n in ast.walk(fn.node):
                if not isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) or n.value is None:
                    continue
                paths = {p for p in (self.resolve(n.value) if _root_name(n.value) not in names else ())
                         if p == "torch" or p.startswith("torch.")}
                if paths:
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    for t in (t for tt in targets for t in ast.walk(tt) if isinstance(t, ast.Name)):
                        torchy.setdefault(t.id, set()).update(paths)
            scope = (frozenset(names - set(torchy)), torchy)
            for n in ast.walk(fn.node):
                out[id(n)] = scope
        return out

    # -- references ---------------------------------------------------------------------------------
    def _collect(self) -> None:
        parents: dict[int, ast.AST] = {}
        for node in ast.walk(self.model.tree):
            for child in ast.iter_child_nodes(node):
                parents[id(child)] = node
        submodules = _submodules(self.model)
        scopes = self._kernel_scopes()
        for node in ast.walk(self.model.tree):
            parent = parents.get(id(node))
            if not self._host(node):
                # a kernel body: tl code has methods of the same names, so only what names torch counts there (the
                # interpreter would run a torch.mm written inside a @triton.jit body); a name the kernel binds
                # itself (``acc.to(...)``) is its own tl value, whatever host code binds to the same name
                if self.where.get(id(node)) == KERNEL_BODY and isinstance(node, (ast.Attribute, ast.Name)) \
                        and not isinstance(parent, ast.Attribute) and isinstance(node.ctx, ast.Load):
                    own, torchy = scopes.get(id(node), (frozenset(), {}))
                    root, dotted = _root_name(node), dotted_name(node) or ""
                    if root in torchy:
                        paths = {p + dotted[len(root):] for p in torchy[root]}
                    else:
                        paths = set() if root in own else self.resolve(node)
                    for path in paths:
                        if path.startswith("torch."):
                            self._classify(path, node.lineno, "in a kernel body", False, node)
                continue
            where = self.where.get(id(node), "at module level")
            called = isinstance(parent, ast.Call) and parent.func is node
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [f"{node.module}.{a.name}" for a in node.names if node.module and not node.level]
                for path in mods:
                    self._classify(path, node.lineno, f"imported {where}", False, node)
                continue
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) or \
                    isinstance(node, ast.AugAssign) and isinstance(node.op, ast.MatMult):
                self.refs.append(Ref("compute", "@", node.lineno, f"the @ operator {where}", True))
                continue
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for t in targets:
                    for tt in ast.walk(t):
                        if isinstance(tt, ast.Attribute) and isinstance(tt.ctx, (ast.Store, ast.Del)):
                            for path in self.resolve(tt.value):
                                if path.split(".")[0] in ("torch", "triton"):
                                    self.refs.append(Ref("patch", f"{path}.{tt.attr}", node.lineno,
                                                         f"assigned {where}"))
                continue
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "self" \
                    and node.func.attr in submodules:
                self.refs.append(Ref("compute", f"self.{node.func.attr}()", node.lineno,
                                     f"a call of the torch submodule self.{node.func.attr} {where}", True))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in self.model.functions and node.attr.startswith("_"):
                # a kernel's private machinery (the autotuner's _bench runs hooks inside its timing range)
                self.refs.append(Ref("internal", f"{node.value.id}.{node.attr}", node.lineno,
                                     _form(node, parent, where, called), called, "Triton's internals"))
            if not isinstance(node, (ast.Attribute, ast.Name, ast.Call)) or isinstance(parent, ast.Attribute):
                continue  # the outermost of a dotted chain stands for it
            if isinstance(node, ast.Call) and (dotted_name(node.func) or "") != "getattr":
                continue
            if getattr(node, "ctx", ast.Load()).__class__ is not ast.Load:
                continue
            holder = parent
            while isinstance(holder, (ast.Tuple, ast.List, ast.Set, ast.Dict)):  # an item of a literal container
                holder = parents.get(id(holder))
            form = _form(node, holder, where, called)
            paths = self.resolve(node)
            for path in paths:
                self._classify(path, node.lineno, form, called, node)
            if not paths and isinstance(node, ast.Attribute):
                self._method(node, form, called, holder)
            if called and any(p.startswith("torch.library.") for p in paths):
                self._library(parent, where)

    def _library(self, call: ast.Call, where: str) -> None:
        """A ``torch.library`` call that registers into a namespace the file does not define (``aten``, ``prims``):
        an override of torch's own operators. Defining and implementing the file's own ops is the public API."""
        texts = [literal(a) for a in [*call.args, *(k.value for k in call.keywords)]]
        names = [t.split("::")[0] for t in texts if isinstance(t, str) and "::" in t]
        if (dotted_name(call.func) or "").endswith("Library") and texts and isinstance(texts[0], str):
            names.append(texts[0])  # Library("aten", "IMPL")
        for ns in names:
            if ns not in self.own_ops:
                self.refs.append(Ref("internal", f"torch.library:{ns}", call.lineno,
                                     f"registers into the {ns} namespace {where}", True, "torch's own operators"))
                return

    def _method(self, node: ast.Attribute, form: str, called: bool, holder: ast.AST | None) -> None:
        """``x.sum()`` on an object that is no module this file imported: a tensor method; ``f = x.sum`` too (a
        bound method passed around), not ``x.device.type == "cuda"`` (an attribute read in a test)."""
        base = dotted_name(node.value) or ""
        if base.split(".")[0] in ("triton", "tl", "math", "functools", "itertools", "collections", "typing"):
            return
        if not called and (node.attr == "type" or isinstance(holder, (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.If,
                                                                        ast.While, ast.IfExp, ast.FormattedValue))):
            return
        if node.attr == "forward" and isinstance(node.value, ast.Attribute) and base.startswith("self."):
            self.refs.append(Ref("compute", "module.forward", node.lineno, form, called))
        elif node.attr in COMPUTE_METHODS or COMPUTE_DUNDER.match(node.attr):
            if node.attr in COMPUTE_METHODS and not called and isinstance(node.value, ast.Name) \
                    and node.value.id == "self":
                return  # self.linear as a value: the submodule itself, not a call of it
            self.refs.append(Ref("compute", f".{node.attr}", node.lineno, form, called))

    def _classify(self, path: str, line: int, form: str, called: bool, node: ast.AST) -> None:
        parts = path.split(".")
        root = parts[0]
        if root == "operator" and len(parts) == 2 and parts[1] not in OPERATOR_PLAIN:
            self.refs.append(Ref("compute", path, line, form, called))
            return
        if root not in ("torch", "triton"):
            return
        if parts[:2] == ["torch", "ops"] and len(parts) > 2 and parts[2] in self.own_ops:
            return
        why = _internal(parts)
        if why:
            self.refs.append(Ref("internal", path, line, form, called, why))
            return
        if root == "triton" or len(parts) < 2:
            return
        if parts[1] in ("cuda", "xpu", "backends", "version", "testing", "library") or parts[-1] in NON_COMPUTE:
            return
        if parts[1] == "nn" and len(parts) >= 3 and parts[2] not in ("functional",) and parts[-1][:1].isupper():
            return  # a module class (nn.Linear): calling an instance is what computes
        if parts[1] == "nn" and len(parts) >= 3 and parts[2] == "init":
            key = f"torch.nn.init.{parts[-1]}"
        else:
            key = f"torch.{parts[-1]}"
        self.refs.append(Ref("compute", key, line, form, called))

    # -- queries -------------------------------------------------------------------------------------
    def of(self, kind: str) -> list[Ref]:
        return [r for r in self.refs if r.kind == kind]

    def counts(self, kind: str) -> Counter:
        return Counter(r.key for r in self.of(kind))


def _internal(parts: list[str]) -> str:
    """The class of a private or internal torch / triton path ("" when it is neither)."""
    path = ".".join(parts)
    for prefix, why in INTERNAL_PREFIXES.items():
        if path == prefix or path.startswith(prefix + "."):
            return why
    private = [p for p in parts[1:] if p.startswith("_") and not (p.startswith("__") and p.endswith("__"))]
    if private or any(p in ("__dict__", "__getattribute__") for p in parts[1:]):
        return "the mode stack" if MODE_STACK.search(path) else \
            ("dispatcher ops" if "VariableFunctions" in path or "_ops" in parts else "internals")
    if parts[0] == "torch" and MODE_STACK.search(parts[-1]) and parts[-1][:1] in ("D", "T", "_"):
        return "the mode stack"  # DisableTorchFunction, TorchFunctionMode reached by another road
    return ""


def _members(value: ast.AST) -> list[ast.AST]:
    """The expressions a bound value may stand for: itself, a literal container's items, a conditional's branches."""
    if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
        return [m for e in value.elts for m in _members(e)]
    if isinstance(value, ast.Dict):
        return [m for e in value.values for m in _members(e)]
    if isinstance(value, ast.IfExp):
        return _members(value.body) + _members(value.orelse)
    if isinstance(value, ast.BoolOp):
        return [m for e in value.values for m in _members(e)]
    if isinstance(value, ast.Subscript):
        return _members(value.value)
    return [value]


def _form(node: ast.AST, parent: ast.AST | None, where: str, called: bool) -> str:
    if called:
        return f"a call {where}"
    if isinstance(parent, (ast.Assign, ast.AnnAssign)):
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        names = ", ".join(ast.unparse(t) for t in targets)
        return f"bound to {names} {where}"
    if "default argument" in where or "decorator" in where:
        return where.removeprefix("in ")
    return f"used as a value {where}"


def _backward_bodies(model: KernelModel) -> set[int]:
    """The ``backward`` / ``setup_context`` methods of the file's ``torch.autograd.Function`` subclasses, when no host
    code calls them by name: torch runs them in a backward pass, never in the no-grad call a verdict is about."""
    called = {n.func.attr for n in ast.walk(model.tree)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    called |= {n.value for n in ast.walk(model.tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    out: set[int] = set()
    for cls in (n for n in ast.walk(model.tree) if isinstance(n, ast.ClassDef)):
        if any((dotted_name(b) or "").endswith("autograd.Function") for b in cls.bases):
            for d in cls.body:
                if isinstance(d, ast.FunctionDef) and d.name in ("backward", "setup_context", "jvp", "vjp") \
                        and d.name not in called:
                    out.add(id(d))
    return out


def _submodules(model: KernelModel) -> set[str]:
    """``self.<name>`` attributes ``__init__`` makes torch modules (``nn.Linear(...)``, not a Parameter)."""
    init = model.method("__init__")
    out: set[str] = set()
    if init is None:
        return out
    for node in ast.walk(init):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Attribute) and t.attr and isinstance(node.value, ast.Call):
                    name = dotted_name(node.value.func) or ""
                    if name.startswith(("nn.", "torch.nn.")) and not name.endswith(("Parameter", "ParameterList")):
                        out.add(t.attr)
    return out
