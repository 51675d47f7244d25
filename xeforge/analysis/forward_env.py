"""What ``Model.forward`` holds, statically: tensors with symbolic shapes, scalars, module aliases, bindings.

Owns: a small abstract interpretation of ``Model.__init__`` and the top-level statements of ``Model.forward``
(``ast``, read-only), for the fusion rewrites, which *write* code into forward and so need what the trace cannot
give them (the trace has concrete values of one call only): shapes as tuples of spec dim names (``"M"``,
``"N"``), ints or None, so that two tensors are known to have the same shape at every size and a generated
kernel can be sized by name; contiguity; which Model attributes are scalars, per-column vectors or one-element
tensors; the argument expression bound to each kernel parameter at a launch (:meth:`ForwardEnv.binding`);
which names each top-level statement binds; the canonical source of an expression (local aliases of ``self.*``
resolved, :meth:`ForwardEnv.canonical`); and what value each dim takes at a variant.

Not dtypes: which element type a tensor has in a variant is read from that variant's trace
(:func:`xeforge.rewrite.dtype.param_dtypes`) and which dtype a forward input has from the spec
(:func:`xeforge.problem.plan_inputs`). A cast (``.float()``, ``.half()``, ``.to(...)``) is a tensor of its
base's shape here.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from xeforge.kernel_model import KernelModel, LaunchSite, dotted_name, is_literal, literal, segment_of

ALLOC = {"empty", "zeros", "ones", "full", "rand", "randn", "empty_strided"}
ALLOC_LIKE = {"empty_like", "zeros_like", "ones_like", "full_like"}


@dataclass(frozen=True)
class Val:
    """An abstract value: a tensor (shape, contiguity), a shape, a scalar (its dim or literal), or a module."""

    kind: str  # tensor | shape | scalar | module | unknown
    shape: tuple | None = None
    contiguous: bool = False
    value: Any = None  # scalar: spec dim name, int/float literal, or None
    src: str = ""  # canonical source (aliases resolved to self.* / forward params)
    module: str | None = None  # module: its class name (Linear, BatchNorm1d ...)
    line: int = 0  # where it was defined in forward (0: parameter / attribute)

    @property
    def is_tensor(self) -> bool:
        return self.kind == "tensor"


UNKNOWN = Val("unknown")


@dataclass
class ModelAttrs:
    """``Model.__init__`` read statically: init parameter bindings, sub-modules, parameters, scalars."""

    init_values: dict[str, Any] = field(default_factory=dict)  # init param -> spec dim name or literal
    attrs: dict[str, Val] = field(default_factory=dict)  # "linear.weight" -> Val, "scale" -> Val, "bn" -> module

    @classmethod
    def read(cls, model: KernelModel, problem: Any) -> "ModelAttrs":
        out = cls()
        init = model.method("__init__")
        if init is None:
            return out
        names = [a.arg for a in init.args.args[1:]]
        defaults = init.args.defaults
        for name, default in zip(names[len(names) - len(defaults):], defaults):
            val = literal(default)
            if is_literal(val):
                out.init_values[name] = val
        inits = list(getattr(getattr(problem, "spec", None), "inits", []) or [])
        for name, (kind, val) in zip(names, inits):
            out.init_values[name] = val  # a dim name for ("dim", N), the literal for ("value", v)
        for node in ast.walk(init):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute) \
                    and isinstance(node.targets[0].value, ast.Name) and node.targets[0].value.id == "self":
                out._assign(node.targets[0].attr, node.value)
            elif isinstance(node, ast.Call) and (dotted_name(node.func) or "").endswith("register_buffer") \
                    and len(node.args) >= 2:
                key = literal(node.args[0])
                if isinstance(key, str):
                    out._assign(key, node.args[1], buffer=True)
        return out

    def dim(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Name):
            return self.init_values.get(node.id)
        val = literal(node)
        return val if is_literal(val) and isinstance(val, int) else None

    def _shape(self, args: list[ast.AST]) -> tuple | None:
        if len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List)):
            args = list(args[0].elts)
        dims = tuple(self.dim(a) for a in args)
        return dims if all(d is not None for d in dims) else None

    def _assign(self, attr: str, value: ast.AST, buffer: bool = False) -> None:
        if isinstance(value, ast.Call):
            name = dotted_name(value.func) or ""
            last = name.rsplit(".", 1)[-1]
            kw = {k.arg: k.value for k in value.keywords if k.arg}
            pos = list(value.args)
            if last == "Parameter" and pos:
                inner = pos[0]
                if isinstance(inner, ast.Call) and (dotted_name(inner.func) or "").rsplit(".", 1)[-1] in ALLOC | {"tensor"}:
                    shape = self._shape([a for a in inner.args if not isinstance(a, ast.Starred)])
                    if (dotted_name(inner.func) or "").endswith("tensor"):
                        v = literal(inner.args[0]) if inner.args else None
                        shape = () if isinstance(v, (int, float)) else (len(v),) if isinstance(v, list) else None
                    self.attrs[attr] = Val("tensor", shape, contiguous=True, src=f"self.{attr}")
                else:
                    self.attrs[attr] = Val("tensor", None, contiguous=True, src=f"self.{attr}")
                return
            if buffer and last in ALLOC:
                self.attrs[attr] = Val("tensor", self._shape(list(value.args)), contiguous=True, src=f"self.{attr}")
                return
            if last == "Linear":
                i = self.dim(pos[0]) if pos else self.dim(kw.get("in_features"))
                o = self.dim(pos[1]) if len(pos) > 1 else self.dim(kw.get("out_features"))
                bias = literal(pos[2]) if len(pos) > 2 else literal(kw["bias"]) if "bias" in kw else True
                self.attrs[attr] = Val("module", module="Linear", src=f"self.{attr}")
                self.attrs[f"{attr}.weight"] = Val("tensor", (o, i) if o is not None and i is not None else None,
                                                   contiguous=True, src=f"self.{attr}.weight")
                if bias is not False:
                    self.attrs[f"{attr}.bias"] = Val("tensor", (o,) if o is not None else None, contiguous=True,
                                                     src=f"self.{attr}.bias")
                return
            if last in {"BatchNorm1d", "GroupNorm", "LayerNorm"}:
                if last == "GroupNorm":
                    n = self.dim(pos[1]) if len(pos) > 1 else self.dim(kw.get("num_channels"))
                else:
                    n = self.dim(pos[0]) if pos else self.dim(kw.get("num_features", kw.get("normalized_shape")))
                self.attrs[attr] = Val("module", module=last, src=f"self.{attr}")
                members = ("weight", "bias") + (("running_mean", "running_var") if last == "BatchNorm1d" else ())
                for m in members:
                    self.attrs[f"{attr}.{m}"] = Val("tensor", (n,) if n is not None else None, contiguous=True,
                                                    src=f"self.{attr}.{m}")
                eps = literal(kw["eps"]) if "eps" in kw else (literal(pos[2]) if last == "GroupNorm" and len(pos) > 2
                                                             else 1e-5)
                self.attrs[f"{attr}.eps"] = Val("scalar", value=eps if is_literal(eps) else None, src=f"self.{attr}.eps")
                if last == "GroupNorm":
                    g = self.dim(pos[0]) if pos else self.dim(kw.get("num_groups"))
                    self.attrs[f"{attr}.num_groups"] = Val("scalar", value=g, src=f"self.{attr}.num_groups")
                return
            if name.startswith(("torch.nn.", "nn.")):
                self.attrs[attr] = Val("module", module=last, src=f"self.{attr}")
                return
            self.attrs[attr] = Val("unknown", src=f"self.{attr}")
            return
        if isinstance(value, ast.Name) and value.id in self.init_values:
            self.attrs[attr] = Val("scalar", value=self.init_values[value.id], src=f"self.{attr}")
            return
        val = literal(value)
        if is_literal(val) and isinstance(val, (int, float)) and not isinstance(val, bool):
            self.attrs[attr] = Val("scalar", value=val, src=f"self.{attr}")
            return
        self.attrs[attr] = Val("unknown", src=f"self.{attr}")


class ForwardEnv:
    """Abstract values of ``Model.forward``'s parameters and top-level assignments, in statement order."""

    def __init__(self, model: KernelModel, problem: Any) -> None:
        self.model = model
        self.problem = problem
        self.attrs = ModelAttrs.read(model, problem)
        self.fn = model.forward()
        self.params: list[str] = [a.arg for a in self.fn.args.args[1:]] if self.fn else []
        self.input_names: dict[str, str] = {}  # forward param -> spec input name
        self.bindings: list[tuple[int, str, Val]] = []  # (line, name, value) in order
        spec = getattr(problem, "spec", None)
        spec_inputs = list(getattr(spec, "inputs", {}) or {})
        variant = next(iter(spec.variants.values()), None) if spec is not None and spec.variants else None
        order = list(variant.params) if variant is not None and variant.params else spec_inputs
        for p, inp in zip(self.params, order):
            self.input_names[p] = inp
        if self.fn is not None:
            for stmt in self.fn.body:
                self._bind(stmt)

    # -- statements --------------------------------------------------------------------------------------
    def _bind(self, stmt: ast.stmt) -> None:
        if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
            for node in ast.walk(stmt):  # names assigned in nested blocks are unknown from here on
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    self.bindings.append((stmt.lineno, node.id, UNKNOWN))
            return
        target = stmt.targets[0]
        if isinstance(target, ast.Name):
            v = self.eval(stmt.value, stmt.lineno)
            self.bindings.append((stmt.lineno, target.id, v if v.kind != "unknown" or v.src else
                                  Val("unknown", src=target.id, line=stmt.lineno)))
        elif isinstance(target, ast.Tuple):
            src = self.eval(stmt.value, stmt.lineno)
            for i, elt in enumerate(target.elts):
                if isinstance(elt, ast.Name):
                    v = UNKNOWN
                    if src.kind == "shape" and src.shape is not None and i < len(src.shape):
                        v = Val("scalar", value=src.shape[i], src=elt.id, line=stmt.lineno)
                    self.bindings.append((stmt.lineno, elt.id, v))

    def lookup(self, name: str, before: int | None = None) -> Val:
        found: Val | None = None
        for line, n, v in self.bindings:
            if n == name and (before is None or line < before):
                found = v
        if found is not None:
            return found
        if name in self.params:
            inp = self.problem.spec.inputs.get(self.input_names.get(name, ""))
            shape = tuple(inp.shape) if inp is not None else None
            return Val("tensor", shape, contiguous=True, src=name)
        return UNKNOWN

    def assigned_between(self, start: int, end: int) -> set[str]:
        return {n for line, n, _ in self.bindings if start < line < end}

    # -- expressions -------------------------------------------------------------------------------------
    def eval(self, node: ast.AST, line: int | None = None) -> Val:
        """The abstract value of ``node`` as seen at ``line`` (names bound before it)."""
        if isinstance(node, ast.Name):
            v = self.lookup(node.id, line)
            if v.kind == "unknown" and not v.src:
                return Val("unknown", src=node.id)
            return v
        if isinstance(node, ast.Attribute):
            if node.attr == "shape":
                base = self.eval(node.value, line)
                return Val("shape", base.shape, src=f"{base.src}.shape")
            if node.attr == "T" or node.attr == "mT":
                base = self.eval(node.value, line)
                sh = tuple(reversed(base.shape)) if base.shape else None
                return Val("tensor", sh, contiguous=False, src=f"{base.src}.{node.attr}")
            base = self.eval(node.value, line)
            if base.src.startswith("self") and base.kind in ("module", "unknown") or base.src == "self":
                key = f"{base.src}.{node.attr}"[len("self."):] if base.src != "self" else node.attr
                v = self.attrs.attrs.get(key)
                if v is not None:
                    return v
                return Val("unknown", src=f"{base.src}.{node.attr}")
            return Val("unknown", src="")
        if isinstance(node, ast.Subscript):
            base = self.eval(node.value, line)
            idx = literal(node.slice)
            if base.kind == "shape" and base.shape is not None and isinstance(idx, int) and -len(base.shape) <= idx < len(base.shape):
                return Val("scalar", value=base.shape[idx])
            return UNKNOWN
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return Val("scalar", value=node.value, src=repr(node.value))
        if isinstance(node, ast.Call):
            return self._call(node, line)
        return UNKNOWN

    def _call(self, node: ast.Call, line: int | None) -> Val:
        name = dotted_name(node.func) or ""
        last = name.rsplit(".", 1)[-1] if name else (node.func.attr if isinstance(node.func, ast.Attribute) else "")
        if name.startswith("torch.") and last in ALLOC:
            shape_args = [a for a in node.args if not isinstance(a, ast.Starred)]
            if last == "full":
                shape_args = shape_args[:1]
            if len(shape_args) == 1 and isinstance(shape_args[0], (ast.Tuple, ast.List)):
                shape_args = list(shape_args[0].elts)
            shape = tuple(self._dim(a, line) for a in shape_args)
            return Val("tensor", shape if all(d is not None for d in shape) else None,
                       contiguous=last != "empty_strided", src="", line=line or 0)
        if name.startswith("torch.") and last in ALLOC_LIKE and node.args:
            base = self.eval(node.args[0], line)
            return Val("tensor", base.shape, contiguous=base.contiguous, src="", line=line or 0)
        if isinstance(node.func, ast.Attribute):
            base = self.eval(node.func.value, line)
            if base.is_tensor:
                if last in ("float", "half", "bfloat16") or (last == "to" and node.args):
                    # a cast (or a move): the same shape; which dtype it has is the trace's to say
                    return Val("tensor", base.shape, contiguous=base.contiguous, src=base.src)
                if last == "contiguous":
                    return Val("tensor", base.shape, contiguous=True, src=base.src)
                if last in ("size",) and node.args:
                    idx = literal(node.args[0])
                    if base.shape is not None and isinstance(idx, int) and -len(base.shape) <= idx < len(base.shape):
                        return Val("scalar", value=base.shape[idx])
                if last == "numel" and base.shape is not None:
                    return Val("scalar", value=("numel",) + tuple(base.shape))
                if last in ("stride", "data_ptr", "element_size"):
                    return Val("scalar", value=None)
        return UNKNOWN

    def _dim(self, node: ast.AST, line: int | None) -> Any:
        v = self.eval(node, line)
        return v.value if v.kind == "scalar" else None

    # -- queries ---------------------------------------------------------------------------------------
    def dim_value(self, dim: Any, variant: Any) -> int | None:
        if isinstance(dim, int):
            return dim
        if isinstance(dim, str):
            v = variant.dims.get(dim)
            return v if isinstance(v, int) else None
        return None

    def binding(self, site: LaunchSite) -> dict[str, ast.AST]:
        """Kernel parameter -> the argument expression passed at ``site``."""
        jf = self.model.functions[site.kernel]
        out: dict[str, ast.AST] = {}
        for p, a in zip(jf.params, site.node.args):
            out[p] = a
        for k in site.node.keywords:
            if k.arg:
                out[k.arg] = k.value
        return out

    def canonical(self, node: ast.AST, line: int) -> str | None:
        """Source of ``node`` with local aliases of ``self.*`` resolved, or None when it names a local."""
        src = segment_of(self.model.source, node) or ""
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        for n in names - {"self"}:
            if n in self.params:
                continue
            v = self.lookup(n, line)
            if v.src.startswith("self") and v.kind in ("module", "tensor", "scalar"):
                src = _replace_name(src, n, v.src)
            else:
                return None
        return src


def _replace_name(src: str, name: str, repl: str) -> str:
    return re.sub(rf"(?<![\w.]){re.escape(name)}(?!\w)", repl, src)
