"""Gate 1: static checks on a candidate's source, before anything runs.

Owns: the structural rules (parses, has a jit kernel that ``Model.forward`` launches, every kernel is
launched), the safety rules (no processes, sockets, ctypes, exec, environment access, file writes, threads or
streams, try/except around launches, module-level output caches, tensor subclasses), the "no torch compute
handed back to vendor libraries" rule, no torch internals (mode stacks, ``torch._C``, ``torch.ops``, profilers) and
no patched library attributes — these three read the whole file, aliases followed (:mod:`xeforge.host_refs`)
— and the hook where the knowledge base's hard constraints plug in. The starting file is the baseline: what it
already does (its own imports, its torch calls, the internals it names) stays allowed in a candidate, and a finding
names only what the candidate added, with the line and form of each place. Each finding names its rule id, the
line and the fix.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable

from xeforge.errors import KernelSourceError
from xeforge.host_refs import VENDOR_KERNEL, HostRefs, Ref
from xeforge.kernel_model import KernelModel, dotted_name, literal, parse_kernel


@dataclass(frozen=True)
class Finding:
    rule: str
    line: int
    message: str
    fix: str

    def render(self) -> str:
        return f"[{self.rule}] line {self.line}: {self.message} (fix: {self.fix})"


ConstraintHook = Callable[[KernelModel], Iterable[Finding]]

ALLOWED_IMPORTS = {"torch", "triton", "math", "typing", "dataclasses", "functools", "numbers", "operator",
                   "itertools", "enum", "__future__", "collections", "abc", "warnings"}
FORBIDDEN_BUILTINS = {"exec", "eval", "compile", "__import__", "open", "globals", "vars", "breakpoint", "input",
                      "setattr", "delattr"}
FORBIDDEN_ATTRS = {  # dotted-name suffixes
    "Stream": "uses a device stream", "stream": "uses a device stream", "set_stream": "uses a device stream",
    "save": "writes a file", "write_text": "writes a file", "write_bytes": "writes a file",
    "environ": "reads environment variables", "getenv": "reads environment variables",
    "lru_cache": "caches results across calls", "cache": "caches results across calls",
}
# reflection that reaches what the rules above forbid by other roads (frames, builtins, the class graph)
REFLECTION_ATTRS = {"__builtins__", "__import__", "__subclasses__", "__globals__", "__code__", "__base__", "__bases__",
                    "__mro__", "__dict__", "__getattribute__", "__closure__", "__loader__", "__spec__", "f_back",
                    "f_globals", "f_locals", "gi_frame", "tb_frame", "__reduce__", "__reduce_ex__"}
# modules that are never kernel code, also when reached as an attribute of an allowed one (torch.os.system)
ESCAPE_MODULES = {"os", "sys", "subprocess", "ctypes", "socket", "builtins", "importlib", "shutil", "pathlib", "io",
                  "pickle", "marshal", "signal", "inspect", "gc", "posix", "pty", "urllib", "http", "requests"}
def _line(node: ast.AST) -> int:
    return getattr(node, "lineno", 0)


def torch_compute_calls(model: KernelModel) -> Counter:
    """Multiset of torch compute calls reachable from ``Model.forward`` (allocation and views excluded): what the
    fusion stage could move into a kernel. Gate 1 reads the whole file (:class:`HostRefs`)."""
    spans = [(fn.lineno, fn.end_lineno or fn.lineno) for fn in _forward_closure(model)]
    return Counter(r.key for r in HostRefs(model).of("compute")
                   if r.call and any(lo <= r.line <= hi for lo, hi in spans))


def _forward_closure(model: KernelModel) -> list[ast.FunctionDef]:
    """``Model.forward`` plus what it calls in the file, transitively: module functions, ``self`` methods, methods of
    the file's other classes called on any object (``self.op.launch(...)``), the ``forward`` of a
    ``torch.autograd.Function`` subclass reached through ``.apply``, and the Python body of a ``torch.library`` op
    called as ``torch.ops.<ns>.<op>(...)``. By name: a static over-approximation."""
    fwd = model.forward()
    if fwd is None:
        return []
    module_fns = {n.name: n for n in model.tree.body if isinstance(n, ast.FunctionDef) and n.name not in model.functions}
    methods: dict[str, list[ast.FunctionDef]] = {}
    for cls in (n for n in model.tree.body if isinstance(n, ast.ClassDef) and n is not model.model_class):
        defs = [d for d in cls.body if isinstance(d, ast.FunctionDef)]
        for d in defs:
            methods.setdefault(d.name, []).append(d)
        if any((dotted_name(b) or "").endswith("autograd.Function") for b in cls.bases):
            methods.setdefault("apply", []).extend(d for d in defs if d.name == "forward")
    ops = _library_ops(model)
    seen: dict[int, ast.FunctionDef] = {id(fwd): fwd}
    todo = [fwd]
    while todo:
        fn = todo.pop()
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            targets: list[ast.FunctionDef] = []
            called = (dotted_name(node.func) or "").split(".")
            if isinstance(node.func, ast.Name) and node.func.id in module_fns:
                targets = [module_fns[node.func.id]]
            elif called[:2] == ["torch", "ops"] and len(called) >= 4:  # torch.ops.<ns>.<op>[.default](...)
                targets = ops.get(f"{called[2]}::{called[3]}", []) or ops.get(f"*::{called[3]}", [])
            elif isinstance(node.func, ast.Attribute):
                if isinstance(node.func.value, ast.Name) and node.func.value.id == "self" and model.method(node.func.attr):
                    targets = [model.method(node.func.attr)]
                else:
                    targets = methods.get(node.func.attr, [])
            for target in targets:
                if id(target) not in seen:
                    seen[id(target)] = target
                    todo.append(target)
    return list(seen.values())


def _library_ops(model: KernelModel) -> dict[str, list[ast.FunctionDef]]:
    """``"ns::op"`` -> the module functions that implement it: decorated with ``torch.library.custom_op("ns::op")``,
    ``torch.library.impl("ns::op", ...)``, ``triton_op`` or ``register_kernel``; ``impl(lib, "op")`` (the namespace in a
    ``Library`` object) is keyed ``"*::op"``."""
    out: dict[str, list[ast.FunctionDef]] = {}
    for n in model.tree.body:
        if not isinstance(n, ast.FunctionDef):
            continue
        for dec in n.decorator_list:
            if not (isinstance(dec, ast.Call) and (dotted_name(dec.func) or "").rsplit(".", 1)[-1] in
                    ("custom_op", "impl", "triton_op", "register_kernel")) or not dec.args:
                continue
            first = literal(dec.args[0])
            if isinstance(first, str) and "::" in first:
                out.setdefault(first, []).append(n)
            elif len(dec.args) > 1 and isinstance(literal(dec.args[1]), str):
                out.setdefault(f"*::{literal(dec.args[1]).split('.')[0]}", []).append(n)
    return out


def _is_called(tree: ast.AST, name: ast.Name) -> bool:
    """Whether ``name`` is the function of a call (``eval(...)``), not a value (``e = eval``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.func is name:
            return True
    return False


def _dead_kernels(m: KernelModel) -> list[str]:
    """@triton.jit functions that forward never launches, directly or through the functions it calls."""
    if m.model_class is None or m.forward() is None:
        return []
    launched = {site.kernel for fn in _forward_closure(m) for site in m.launches if site.function == fn.name}
    called_in_jit = {c.name.rsplit(".", 1)[-1] for c in m.calls if c.function in m.functions}
    return [name for name in m.functions if name not in launched and name not in called_in_jit]


class StaticChecker:
    """Runs every gate-1 rule; ``constraint_hooks`` add knowledge-base constraints for the target."""

    def __init__(self, starting: KernelModel | None = None, constraint_hooks: list[ConstraintHook] | None = None):
        self.starting = starting
        self.hooks = list(constraint_hooks or [])
        # kernels the starting file already holds without forward launching them (backward kernels, helpers of
        # other entry points): they may stay, and are noted, not rejected
        self.dead_at_start = set(_dead_kernels(starting)) if starting is not None else set()
        # the starting file is the user's: what it already does is the baseline a candidate is judged against
        self._start_refs = HostRefs(starting) if starting is not None else None
        self._start_safety = Counter(_key(f) for f in self._safety(starting)) if starting is not None else Counter()
        self.notes: list[str] = []  # what the last check noted without failing

    def check(self, source: str, path: str = "candidate.py") -> tuple[KernelModel | None, list[Finding]]:
        try:
            model = parse_kernel(source, path)
        except KernelSourceError as exc:
            return None, [Finding("S001-parse", 0, exc.what, exc.fix)]
        refs = HostRefs(model)
        self.notes = []
        structure = self._structure(model)
        safety, kept = [], Counter(self._start_safety)
        for f in self._safety(model):
            if kept[_key(f)] > 0:  # the starting file does the same: the user's own code
                kept[_key(f)] -= 1
                self.notes.append(f"as in the starting kernel: {f.message}")
            else:
                safety.append(f)
        findings = [*structure, *safety, *self._torch_compute(refs), *self._internals(refs), *self._kernel_names(model)]
        if not findings:
            for hook in self.hooks:
                findings.extend(hook(model))
        return model, findings

    # -- structure -----------------------------------------------------------------------------------
    def _structure(self, m: KernelModel) -> list[Finding]:
        out = []
        if not m.functions:
            out.append(Finding("S002-no-kernel", 1, "no @triton.jit function in the file",
                               "write the computation as a @triton.jit kernel launched from Model.forward"))
        if m.model_class is None or m.forward() is None:
            out.append(Finding("S003-no-model", 1, "no class Model with a forward method",
                               "define class Model(torch.nn.Module) whose forward launches the kernel"))
            return out
        launched_from_forward = set()
        for fn in _forward_closure(m):
            for site in m.launches:
                if site.function == fn.name:
                    launched_from_forward.add(site.kernel)
        if m.functions and not launched_from_forward:
            out.append(Finding("S004-not-launched", m.forward().lineno,
                               "Model.forward launches no @triton.jit kernel",
                               "launch the kernel from forward: kernel[grid](...)"))
        for name in _dead_kernels(m):
            if name in self.dead_at_start:
                self.notes.append(f"kernel {name} is not launched by forward (as in the starting kernel: kept)")
            else:
                out.append(Finding("S005-dead-kernel", m.functions[name].line, f"kernel {name} is never launched",
                                   f"launch {name} from Model.forward or delete it"))
        return out

    # -- safety ---------------------------------------------------------------------------------------
    def _safety(self, m: KernelModel) -> list[Finding]:
        out = []
        for node in ast.walk(m.tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for mod in mods:
                    if mod.split(".")[0] not in ALLOWED_IMPORTS:
                        out.append(Finding("S010-import", _line(node), f"imports {mod!r} (process, file, network or "
                                           "environment access is not allowed in a kernel file)",
                                           f"remove the import; allowed: {', '.join(sorted(ALLOWED_IMPORTS))}"))
                    if mod.split(".")[0] in {"threading", "multiprocessing", "concurrent", "asyncio"}:
                        out.append(Finding("S012-threads", _line(node), "uses threads or processes",
                                           "launch kernels synchronously from forward"))
            if isinstance(node, ast.Call):
                name = dotted_name(node.func) or ""
                if name in FORBIDDEN_BUILTINS:
                    out.append(Finding("S011-builtin", _line(node), f"calls {name}()",
                                       "kernels may not execute code dynamically, open files or change attributes by name"))
            if isinstance(node, ast.Call) and (dotted_name(node.func) or "") in {"getattr", "hasattr"} \
                    and len(node.args) >= 2 and not isinstance(node.args[1], ast.Constant):
                out.append(Finding("S018-reflection", _line(node), "getattr with a computed attribute name (what it "
                                   "reaches cannot be checked)", "name the attribute: obj.name"))
            if isinstance(node, ast.Name) and node.id in FORBIDDEN_BUILTINS | {"getattr", "__builtins__"} \
                    and isinstance(node.ctx, ast.Load) and not _is_called(m.tree, node):
                out.append(Finding("S018-reflection", _line(node), f"{node.id} is used as a value (an alias of it "
                                   "would escape the checks)", f"do not pass {node.id} around"))
            if isinstance(node, ast.Attribute) and node.attr in REFLECTION_ATTRS:
                out.append(Finding("S018-reflection", _line(node), f".{node.attr} reaches the interpreter's "
                                   "internals (frames, builtins or the class graph)", "remove it"))
            if isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Name, ast.Attribute)):
                parts = (dotted_name(node) or "").split(".")
                hit = next((p for p in parts[1:] if p in ESCAPE_MODULES), None)
                if hit and parts[-1] == hit:  # reported once, at the attribute that names the module
                    out.append(Finding("S018-reflection", _line(node), f"{'.'.join(parts)} reaches the {hit} module "
                                       f"through {parts[0]}", "remove it: kernel files use torch and triton only"))
            if isinstance(node, ast.Attribute):
                full = dotted_name(node) or node.attr
                why = FORBIDDEN_ATTRS.get(node.attr)
                if why and not full.startswith(("tl.", "triton.language.")):
                    rule = "S013-environment" if "environment" in why else ("S012-threads" if "stream" in why else
                                                                             "S014-side-effect")
                    out.append(Finding(rule, _line(node), f"{full}: {why}",
                                       "remove it: kernels compute from their inputs only, on the default stream"))
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                out.append(Finding("S015-cache", _line(node), "uses global/nonlocal state (a module-level cache of "
                                   "outputs would survive between calls)", "keep all state local to forward"))
            elif isinstance(node, ast.ClassDef):
                bases = [dotted_name(b) or "" for b in node.bases]
                defines = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                if any(b.endswith("Tensor") for b in bases) or defines & {"__torch_function__", "__torch_dispatch__"}:
                    out.append(Finding("S016-tensor-subclass", _line(node), f"class {node.name} is a tensor subclass",
                                       "return a plain torch.Tensor"))
            elif isinstance(node, ast.Try):
                launches = [s for s in m.launches if any(s.node is n for n in ast.walk(node))]
                if launches:
                    out.append(Finding("S017-try-launch", _line(node), "try/except around a kernel launch hides failures",
                                       "remove the try/except; a failing launch must fail"))
        return out

    # -- torch compute and internals, anywhere in the file ----------------------------------------------------
    def _torch_compute(self, refs: HostRefs) -> list[Finding]:
        allowed = self._start_refs.counts("compute") if self._start_refs is not None else Counter()
        extra = refs.counts("compute") - allowed
        out = []
        for key, n in sorted(extra.items()):
            sites = [r for r in refs.of("compute") if r.key == key]
            out.append(Finding("S020-torch-compute", sites[0].line,
                               f"{key} beyond the starting kernel ({n} more than it has): {_sites(sites)}",
                               "do the work in Triton kernels; the host code may only allocate, view and launch"))
        return out

    def _internals(self, refs: HostRefs) -> list[Finding]:
        """torch internals and library patches the starting file does not reference (by path)."""
        start = self._start_refs
        out = []
        for kind, rule, what, fix in (
                ("internal", "S021-torch-internals", "reaches {why} through {key}, which the starting kernel does not "
                 "reference", "remove it: kernel host code uses torch's public tensor API, the mode stacks and "
                 "profilers are the verifier's"),
                ("patch", "S022-patches-library", "patches {key}, which the starting kernel does not",
                 "do not assign to torch or triton attributes")):
            have = {r.key for r in start.of(kind)} if start is not None else set()
            by_key: dict[str, list[Ref]] = {}
            for r in refs.of(kind):
                if r.key not in have:
                    by_key.setdefault(r.key, []).append(r)
            for key, sites in by_key.items():
                out.append(Finding(rule, sites[0].line, what.format(why=sites[0].why, key=key) + f": {_sites(sites)}",
                                   fix))
        return out

    def _kernel_names(self, m: KernelModel) -> list[Finding]:
        """A Triton kernel named like a vendor library's would pass for it in the run-time device account."""
        start = set(self.starting.functions) if self.starting is not None else set()
        return [Finding("S023-kernel-name", fn.line, f"kernel {name} is named like a vendor library's kernel",
                        "give the @triton.jit function a name of its own")
                for name, fn in m.functions.items() if VENDOR_KERNEL.match(name) and name not in start]


def _key(f: Finding) -> tuple[str, str]:
    return f.rule, f.message


def _sites(sites: list[Ref]) -> str:
    shown = "; ".join(r.describe() for r in sites[:4])
    return shown + (f"; and {len(sites) - 4} more" if len(sites) > 4 else "")
