"""Host-side tensor descriptors: the descriptors a kernel makes with ``tl.make_tensor_descriptor`` become kernel
arguments the host builds with ``triton.tools.tensor_descriptor.TensorDescriptor``.

Owns: planning and applying that codemod. A descriptor qualifies when it is made once, outside any loop (at the
kernel's top level or inside a top-level ``if``: the block_io stage's ``if USE_BLOCK_IO:``), from kernel parameters
only: a base pointer, a shape and strides of scalar parameters (the last stride a literal 1) and a block shape of
constexpr parameters. Each one becomes a parameter of the same name; at every launch of the kernel the host builds
it from the expressions the launch passes for those parameters, right before the launch::

    x_desc = TensorDescriptor(x, [M, K], [x.stride(0), 1], [128, 64]) if host_descriptors else None

where ``host_descriptors`` is the launch's ``USE_BLOCK_IO`` value and every shape extent positive (a
``TensorDescriptor`` refuses an empty dimension; the kernel then takes its pointer path, and ``None`` goes to the
descriptor parameters that path never reads). A kernel without that flag gets its descriptors unconditionally. The
block shape is the launch's own constexpr expressions; for an ``@triton.autotune``'d kernel, whose block sizes the
autotuner picks, the host builds the descriptors with a placeholder block shape and a ``pre_hook`` on each of its
configurations (installed after the kernel's definition) sets the block shape of the configuration being run.
Where no descriptor is left in the file, the ``triton.set_allocator`` the block_io stage put before the launch
(scratch for device-side descriptors on NVIDIA) is removed.

Why: on the H200 (Triton 3.6) host-side descriptors were 2.5-3.3% faster than device-side ones in a persistent bf16
GEMM with a fused epilogue (KB ``bio-host-descriptors-on-hopper``). Not for Intel GPUs: their 2D block path needs the
descriptor made in the same function (KB ``bio-descriptor-fast-path-conditions``); which devices get it is the KB's
choice (:mod:`stages.device_tuning_host_desc`).
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field

import libcst as cst

from xeforge.kernel_model import JitFunction, KernelModel, LaunchSite, dotted_name, parent_map, parse_kernel, \
    parse_python, pure_expression
from xeforge.rewrite.blockio import FLAG  # the block_io stage's fast-path flag (USE_BLOCK_IO)
from xeforge.rewrite.cst_tools import dotted
from xeforge.rewrite.tiling import NotApplicable
from xeforge.rewrite.tiling.edit import FunctionEdit, LaunchEdit, add_import, add_after_function, edit_function, \
    edit_launch
from xeforge.rewrite.tiling.grid import enclosing_function, fresh_name, launch_bindings

IMPORT = "from triton.tools.tensor_descriptor import TensorDescriptor"
#: calls a host expression may make and still be evaluated once more for a descriptor (no side effects)
_PURE_METHODS = frozenset({"stride", "size", "numel", "dim", "cdiv", "next_power_of_2"})
_PURE_FUNCTIONS = frozenset({"min", "max", "int", "len"})


@dataclass
class DeviceDesc:
    """One ``name = tl.make_tensor_descriptor(base, shape=[...], strides=[...], block_shape=[...])`` of the kernel."""

    name: str
    line: int
    base: ast.expr
    shape: list[ast.expr]
    strides: list[ast.expr]
    block: list[ast.expr]
    padding: str | None = None  # padding_option, when given


@dataclass
class HostDescPlan:
    kernel: str
    descs: list[DeviceDesc]
    kept: list[str]  # descriptors left in the kernel, with the reason
    sites: list[LaunchSite]
    autotuned: bool
    host_code: dict[int, list[str]] = field(default_factory=dict)  # launch line -> the statements before it
    kwargs: dict[int, dict[str, str]] = field(default_factory=dict)  # launch line -> keyword -> host expression

    def describe(self) -> str:
        names = ", ".join(d.name for d in self.descs)
        how = " (block shapes set per configuration by an @triton.autotune pre_hook)" if self.autotuned else ""
        text = f"{self.kernel}: tensor descriptors {names} built on the host and passed in{how}"
        if self.kept:
            text += f"; left in the kernel: {'; '.join(self.kept)}"
        return text


def _list_arg(call: ast.Call, pos: int, kw: str) -> list[ast.expr] | None:
    node = call.args[pos] if len(call.args) > pos else next((k.value for k in call.keywords if k.arg == kw), None)
    return list(node.elts) if isinstance(node, (ast.List, ast.Tuple)) else None


def _names(nodes: list[ast.expr]) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}


def device_descriptors(fn: JitFunction) -> tuple[list[DeviceDesc], list[str]]:
    """The kernel's descriptors that can be made on the host, and the others with the reason."""
    parents = parent_map(fn.node)
    params = set(fn.params)
    constexprs = set(fn.constexpr_params)
    assigned: dict[str, int] = {}
    for node in ast.walk(fn.node):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For)) else []
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    assigned[n.id] = assigned.get(n.id, 0) + 1
    found, kept = [], []
    for node in ast.walk(fn.node):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and (dotted_name(node.value.func) or "").endswith("make_tensor_descriptor")):
            continue
        call = node.value
        name = node.targets[0].id if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) else None
        where = f"line {node.lineno}"
        if name is None:
            kept.append(f"{where}: the descriptor is not assigned to one name")
            continue
        up, nested = parents.get(id(node)), False
        while up is not None and up is not fn.node:
            if not isinstance(up, ast.If) or parents.get(id(up)) is not fn.node:
                nested = True
            up = parents.get(id(up))
        if nested:
            kept.append(f"{name} ({where}): made inside a loop or a nested block")
            continue
        base = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "base"), None)
        shape, strides = _list_arg(call, 1, "shape"), _list_arg(call, 2, "strides")
        block = _list_arg(call, 3, "block_shape")
        other = [k.arg for k in call.keywords if k.arg not in ("base", "shape", "strides", "block_shape",
                                                               "padding_option")]
        padding = next((k.value for k in call.keywords if k.arg == "padding_option"), None)
        if base is None or shape is None or strides is None or block is None or other or len(call.args) > 4:
            kept.append(f"{name} ({where}): its shape, strides and block shape are not list literals")
            continue
        if padding is not None and not isinstance(padding, ast.Constant):
            kept.append(f"{name} ({where}): padding_option is not a literal")
            continue
        if not (isinstance(base, ast.Name) and base.id in params and base.id not in constexprs):
            kept.append(f"{name} ({where}): its base is not a pointer parameter of {fn.name}")
            continue
        local = sorted(_names(shape + strides) - (params - constexprs) - constexprs)
        if local:
            kept.append(f"{name} ({where}): its shape or strides use {', '.join(local)}, computed in the kernel")
            continue
        not_const = sorted(_names(block) - constexprs)
        if not_const:
            kept.append(f"{name} ({where}): its block shape uses {', '.join(not_const)}, not constexpr parameters")
            continue
        if not (isinstance(strides[-1], ast.Constant) and strides[-1].value == 1):
            kept.append(f"{name} ({where}): its last stride is not a literal 1")
            continue
        if name in params or assigned.get(name, 0) != 1:
            kept.append(f"{name} ({where}): the name is a parameter or assigned more than once")
            continue
        found.append(DeviceDesc(name, node.lineno, base, shape, strides, block,
                                padding.value if padding is not None else None))
    return found, kept


class _Substitute(ast.NodeTransformer):
    def __init__(self, values: dict[str, ast.expr]) -> None:
        self.values = values

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return copy.deepcopy(self.values[node.id]) if node.id in self.values else node


def _host(node: ast.expr, values: dict[str, ast.expr]) -> str:
    return ast.unparse(_Substitute(values).visit(copy.deepcopy(node)))


def _autotune_outermost(fn: JitFunction) -> bool:
    decs = fn.node.decorator_list
    first = decs[0].func if decs and isinstance(decs[0], ast.Call) else decs[0] if decs else None
    return bool(first is not None and (dotted_name(first) or "").endswith("autotune"))


def plan_host_descriptors(model: KernelModel, kernel: str) -> HostDescPlan:
    fn = model.functions[kernel]
    descs, kept = device_descriptors(fn)
    if not descs:
        why = "; ".join(kept) if kept else "it makes no tensor descriptor with tl.make_tensor_descriptor"
        raise NotApplicable(f"{kernel}: {why}")
    sites = [s for s in model.launches if s.kernel == kernel]
    if not sites:
        raise NotApplicable(f"{kernel} is not launched in this file")
    autotuned = fn.is_autotuned
    if autotuned:
        if not _autotune_outermost(fn):
            raise NotApplicable(f"{kernel} (line {fn.line}): @triton.autotune is not its outermost decorator, so "
                                "its configurations cannot be given a pre_hook")
        deco = ast.get_source_segment(model.source, fn.node.decorator_list[0]) or ""
        if "pre_hook" in deco:
            raise NotApplicable(f"{kernel} (line {fn.line}): its @triton.autotune configurations have a pre_hook "
                                "of their own")
    plan = HostDescPlan(kernel, descs, kept, sites, autotuned)
    module_names = {n.id for st in model.tree.body if not isinstance(st, (ast.FunctionDef, ast.ClassDef))
                    for n in ast.walk(st) if isinstance(n, ast.Name)} | \
        {st.name for st in model.tree.body if isinstance(st, (ast.FunctionDef, ast.ClassDef))}
    for site in sites:
        host_fn = enclosing_function(model, site)
        taken = set(module_names) | ({n.id for n in ast.walk(host_fn) if isinstance(n, ast.Name)} |
                                     {a.arg for a in host_fn.args.args + host_fn.args.kwonlyargs}
                                     if host_fn is not None else set())
        bind = launch_bindings(site, fn, model.source)
        values: dict[str, ast.expr] = {}
        for p in fn.params:
            if p not in bind:
                continue
            try:
                node = parse_python(bind[p].strip(), mode="eval").body
            except SyntaxError:
                continue
            values[p] = node
        defaults = dict(zip(reversed(fn.params), reversed(fn.node.args.defaults)))
        needed = _names([e for d in descs for e in [d.base, *d.shape, *d.strides]])
        if not autotuned:
            needed |= _names([e for d in descs for e in d.block])
        for p in sorted(needed):
            if p in values:
                if not pure_expression(values[p], _PURE_METHODS, _PURE_FUNCTIONS):
                    raise NotApplicable(f"the launch of {kernel} at line {site.line} passes {p}={bind[p].strip()}, "
                                        "which the host would evaluate a second time for a descriptor")
            elif p in defaults:
                values[p] = defaults[p]
            else:
                raise NotApplicable(f"the launch of {kernel} at line {site.line} does not pass {p}, which a "
                                    "descriptor needs")
        flag = bind.get(FLAG, "").strip() if FLAG in fn.constexpr_params else None
        if flag is not None and not flag:
            raise NotApplicable(f"the launch of {kernel} at line {site.line} does not pass {FLAG}")
        code = ["# tensor descriptors built on the host and passed in (no device-side descriptor creation)"]
        kwargs: dict[str, str] = {}
        cond = None
        if flag is not None:
            extents = list(dict.fromkeys(_host(e, values) for d in descs for e in d.shape))
            cond = fresh_name(taken, "host_descriptors")
            taken.add(cond)
            code.append(f"{cond} = bool({flag}) and min({', '.join(extents)}) > 0")
            kwargs[FLAG] = cond
        for d in descs:
            var = fresh_name(taken, d.name)
            taken.add(var)
            block = "[" + ", ".join("1" if autotuned else _host(e, values) for e in d.block) + "]"
            pad = f", padding={d.padding!r}" if d.padding and d.padding != "zero" else ""
            build = (f"TensorDescriptor({_host(d.base, values)}, [{', '.join(_host(e, values) for e in d.shape)}], "
                     f"[{', '.join(_host(e, values) for e in d.strides)}], {block}{pad})")
            code.append(f"{var} = {build} if {cond} else None" if cond else f"{var} = {build}")
            kwargs[d.name] = var
        plan.host_code[site.line] = code
        plan.kwargs[site.line] = kwargs
    return plan


def _pre_hook(plan: HostDescPlan, name: str, constexprs: list[str]) -> str:
    nargs = {c: parse_python(f'nargs["{c}"]', mode="eval").body for c in constexprs}
    lines = [f"def {name}(nargs):",
             f'    """@triton.autotune pre_hook: the block shapes of {plan.kernel}\'s host-side tensor descriptors',
             '    for the configuration being run."""']
    for d in plan.descs:
        lines += [f'    if nargs["{d.name}"] is not None:',
                  f'        nargs["{d.name}"].block_shape = [{", ".join(_host(e, nargs) for e in d.block)}]']
    return "\n".join(lines)


class _DropAllocator(cst.CSTTransformer):
    """Removes ``if <cond with .device.type == "cuda">: triton.set_allocator(...)`` (what the block_io stage writes)."""

    def leave_If(self, original: cst.If, updated: cst.If):
        body = original.body.body if isinstance(original.body, cst.IndentedBlock) else []
        code = cst.Module(body=[]).code_for_node(original.test)
        if original.orelse is None and len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine) and \
                len(body[0].body) == 1 and isinstance(body[0].body[0], cst.Expr) and \
                isinstance(body[0].body[0].value, cst.Call) and \
                dotted(body[0].body[0].value.func) == "triton.set_allocator" and '.device.type == "cuda"' in code:
            return cst.RemovalSentinel.REMOVE
        return updated


def apply_host_descriptors(source: str, plan: HostDescPlan) -> str:
    """``source`` with ``plan`` applied: the kernel takes the descriptors as parameters, every launch builds them."""
    creations = {d.line for d in plan.descs}

    def body(original, updated, line_of):
        # an `if USE_BLOCK_IO:` that only made the descriptors goes with them
        return [u for o, u in zip(original, updated)
                if not (isinstance(o, cst.If) and o.orelse is None and isinstance(o.body, cst.IndentedBlock)
                        and all(line_of(st) in creations for st in o.body.body))]

    lines_before = sorted(s.line for s in parse_kernel(source).launches if s.kernel == plan.kernel)
    source = edit_function(source, FunctionEdit(plan.kernel, remove_lines=set(creations), body=body,
                                                new_params=[d.name for d in plan.descs]))
    model = parse_kernel(source)
    lines_after = sorted(s.line for s in model.launches if s.kernel == plan.kernel)
    if len(lines_after) != len(lines_before):
        raise NotApplicable(f"the launches of {plan.kernel} moved while the kernel was edited")
    for old, new in sorted(zip(lines_before, lines_after), key=lambda t: -t[1]):
        source = edit_launch(source, LaunchEdit(plan.kernel, new, set_kwargs=plan.kwargs[old],
                                                before=["\n".join(plan.host_code[old])]))
    if plan.autotuned:
        model = parse_kernel(source)
        taken = {n.id for n in ast.walk(model.tree) if isinstance(n, ast.Name)} | set(model.functions)
        hook = fresh_name(taken, f"_{plan.kernel}_descriptor_blocks")
        var = fresh_name(taken | {hook}, "_config")
        code = (_pre_hook(plan, hook, model.functions[plan.kernel].constexpr_params) + "\n\n" +
                f"for {var} in {plan.kernel}.configs:\n    {var}.pre_hook = {hook}\n")
        source = add_after_function(source, plan.kernel, code)
    if "make_tensor_descriptor" not in source:
        source = cst.parse_module(source).visit(_DropAllocator()).code
    return add_import(source, IMPORT)


def rewrite(source: str, kernel: str | None = None) -> tuple[str, HostDescPlan]:
    """``source`` with the descriptors of ``kernel`` (default: the first launched kernel that makes any) built on
    the host, and the plan; NotApplicable with the reason per kernel otherwise."""
    model = parse_kernel(source)
    names = [kernel] if kernel else list(dict.fromkeys(s.kernel for s in model.launches))
    errors = []
    for name in names:
        if name not in model.functions:
            continue
        try:
            plan = plan_host_descriptors(model, name)
        except NotApplicable as exc:
            errors.append(str(exc))
            continue
        return apply_host_descriptors(source, plan), plan
    raise NotApplicable("; ".join(errors) or "no launched kernel makes a tensor descriptor")
