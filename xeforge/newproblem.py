"""``xeforge new``: a problem folder from a kernel file where it lives in the user's repository.

Owns: the request (a ``new.yaml`` or the same on the command line: the file or module, one call expression, the
example inputs as ``dtype[dims]``, derived values, in-place outputs, a reference function), the dims inferred
from it (sizes shared by inputs share a name), the variants (``ci`` scaled down for the interpreter, the bench
shapes, suggested decode-sized and odd shapes) and the files it writes: ``kernel.py`` (the user's file as it is,
the marker line, a generated ``Model`` making the call), ``spec.yaml``, ``reference.py`` (the user's reference
function behind the same ``Model``, when one is named) and ``upstream.yaml`` (where the file came from, for the
patch back: :mod:`xeforge.upstream`). The folder is written only after it loads as a problem. Format:
``docs/new.md``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from xeforge import __version__
from xeforge.errors import KernelSourceError, SpecError, UsageError
from xeforge.kb.yamlio import YamlSyntaxError, parse_yaml
from xeforge.kernel_model import parse_python, tf32_dots
from xeforge.problem import DTYPES, _norm_dtype, _odd_near, load_problem
from xeforge.upstream import UPSTREAM_FILE, marker, sha256

#: a tensor as the request writes it: ``bfloat16[tokens, hidden=4096, 8]``
_TENSOR_RE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*\[(.*)\]\s*$")
_DIM_RE = re.compile(r"^\s*(?:([A-Za-z_]\w*)\s*(?:=\s*(\d+))?|(\d+))\s*$")
#: an unnamed size at least this large is a dim (inputs with the same size share it); smaller ones are constants
#: of the layout (the 2 of stacked halves, a head count) and stay literal
INFER_MIN = 64
#: ci sizes: what the interpreter runs in seconds
CI_KEEP, CI_SIZE, CI_WARN_ELEMENTS = 128, 64, 1 << 18


# --------------------------------------------------------------------------------------------- the request
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TensorDecl(_Strict):
    tensor: str
    range: list[Union[int, str]] | None = None


class NewRequest(_Strict):
    source: str | None = None
    module: str | None = None
    name: str | None = None
    call: str
    inputs: dict[str, Union[str, TensorDecl]]
    derived: dict[str, str] = Field(default_factory=dict)
    outputs: list[str] = Field(default_factory=list)
    returns: Union[str, list[str], None] = None
    reference: str | None = None
    setup: dict[str, str] = Field(default_factory=dict)
    reference_setup: dict[str, str] = Field(default_factory=dict)
    dims: dict[str, int] = Field(default_factory=dict)
    bench: list[dict[str, int]] = Field(default_factory=list)
    ci: dict[str, int] = Field(default_factory=dict)
    ci_dtype: str = "float32"
    suggest: bool = True
    fixed: list[str] = Field(default_factory=list)
    ragged: Union[bool, list[dict[str, int]]] = True
    precision: str | None = None
    nondeterministic: bool = False
    kind: str | None = None
    description: str | None = None
    flop: Union[str, int, None] = None
    bytes: Union[str, int, None] = None
    rtol: float | None = None
    atol: float | None = None

    _dt = field_validator("ci_dtype", mode="before")(_norm_dtype)


@dataclass
class Tensor:
    name: str
    dtype: str
    shape: list[Union[str, int]]
    range: list[Union[int, str]] | None = None


@dataclass
class NewProblem:
    """What ``xeforge new`` writes and what it tells the user."""

    name: str
    files: dict[str, str]
    inferred: list[str] = field(default_factory=list)
    check: list[str] = field(default_factory=list)
    dims: dict[str, int] = field(default_factory=dict)
    variants: dict[str, dict[str, int]] = field(default_factory=dict)
    oracle: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "files": sorted(self.files), "dims": self.dims, "variants": self.variants,
                "oracle": self.oracle, "inferred": self.inferred, "check": self.check}


# --------------------------------------------------------------------------------------------- reading it
def read_request(path: Path) -> NewRequest:
    """A ``new.yaml``; every mistake is a :class:`SpecError` naming the file, the key and the fix."""
    try:
        raw = parse_yaml(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(str(path), f"cannot be read ({exc.strerror})", "give an existing new.yaml") from None
    except YamlSyntaxError as exc:
        raise SpecError(f"{path}:{exc.line}", exc.what, "fix the YAML syntax at that line") from None
    if not isinstance(raw, dict):
        raise SpecError(str(path), "is not a mapping", "write `source:`, `call:` and `inputs:` (docs/new.md)")
    return _validate(raw, str(path))


def _validate(raw: dict, where: str) -> NewRequest:
    try:
        return NewRequest.model_validate(_plain(raw))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        line = getattr(raw, "lines", {}).get(err["loc"][0]) if hasattr(raw, "lines") else None
        place = f"{where}:{line}" if line else where
        if err["type"] == "extra_forbidden":
            fix = ("remove it; the keys are source, module, name, call, inputs, derived, outputs, returns, reference, "
                   "setup, reference_setup, dims, bench, ci, ci_dtype, suggest, fixed, ragged, precision, "
                   "nondeterministic, kind, description, flop, bytes, rtol, atol (docs/new.md)")
            raise SpecError(place, f"unknown key `{loc}`", fix) from None
        if err["type"] == "missing":
            raise SpecError(place, f"`{loc}` is missing", "docs/new.md shows a complete new.yaml") from None
        raise SpecError(place, f"`{loc}`: {err['msg']}", "docs/new.md shows what each key takes") from None


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def request_from_args(args: argparse.Namespace) -> tuple[NewRequest, Path]:
    """The request and the folder its relative paths start from: a ``new.yaml``, or the command line."""
    src = Path(args.source)
    flags = [f"--{k.replace('_', '-')}" for k in ("call", "input", "range", "derived", "output", "returns",
                                                  "reference", "dims", "bench", "ci", "fixed")
             if getattr(args, k, None)]
    if src.suffix in (".yaml", ".yml"):
        if flags:
            raise UsageError(" ".join(flags), f"given with {src}: a new.yaml says everything itself",
                             f"put them in {src}, or give the kernel file instead of the YAML")
        req = read_request(src)
        if args.name:
            req = req.model_copy(update={"name": args.name})
        return req, src.resolve().parent
    if not args.call or not args.input:
        raise UsageError("xeforge new", "needs --call and at least one --input (or a new.yaml)",
                         'e.g. xeforge new rmsnorm.py --call "rms_norm(x, w, eps=1e-6)" '
                         "--input x=bfloat16[4096,4096] --input w=bfloat16[4096]")
    inputs: dict[str, Any] = {}
    for item in args.input:
        name, decl = _pair(item, "--input", "x=bfloat16[tokens=4096,hidden=4096]")
        inputs[name] = decl
    for item in args.range or []:
        name, rng = _pair(item, "--range", "slot_mapping=0:slots")
        if name not in inputs:
            raise UsageError(f"--range {item}", f"{name} is not an --input", "name an integer --input")
        lo, _, hi = rng.partition(":")
        inputs[name] = {"tensor": inputs[name], "range": [_int_or_name(lo), _int_or_name(hi)]}
    module = None
    if src.suffix != ".py" and not src.exists():
        module, src = args.source, None
    raw = {"source": str(src) if src else None, "module": module, "name": args.name, "call": args.call,
           "inputs": inputs, "derived": dict(_pair(d, "--derived", "cu=torch.arange(b + 1, device=x.device)")
                                             for d in args.derived or []),
           "outputs": list(args.output or []), "reference": args.reference,
           "returns": args.returns.split(",") if args.returns else None,
           "dims": _sizes(args.dims, "--dims") if args.dims else {},
           "bench": [_sizes(b, "--bench") for b in args.bench or []],
           "ci": _sizes(args.ci, "--ci") if args.ci else {}, "fixed": args.fixed.split(",") if args.fixed else [],
           "ci_dtype": args.ci_dtype}
    return _validate({k: v for k, v in raw.items() if v is not None}, "the command line"), Path.cwd()


def _pair(item: str, flag: str, example: str) -> tuple[str, str]:
    name, eq, value = item.partition("=")
    if not eq or not name.strip().isidentifier():
        raise UsageError(f"{flag} {item}", "is not NAME=VALUE", f"write it as {flag} {example}")
    return name.strip(), value.strip()


def _int_or_name(s: str) -> Union[int, str]:
    s = s.strip()
    return int(s) if re.fullmatch(r"-?\d+", s) else s


def _sizes(text: str, flag: str) -> dict[str, int]:
    out = {}
    for part in text.split(","):
        name, value = _pair(part, flag, "tokens=16,hidden=4096")
        if not value.isdigit():
            raise UsageError(f"{flag} {text}", f"{name}={value} is not a size", "sizes are non-negative integers")
        out[name] = int(value)
    return out


# --------------------------------------------------------------------------------------------- building it
class _Builder:
    def __init__(self, req: NewRequest, base: Path) -> None:
        self.req, self.base = req, base
        self.inferred: list[str] = []
        self.check: list[str] = []

    def fail(self, key: str, what: str, fix: str) -> SpecError:
        return SpecError(f"{self.where}: {key}" if key else self.where, what, fix)

    where = "new"

    # -- the kernel file
    def source(self) -> tuple[Path, str]:
        req = self.req
        if bool(req.source) == bool(req.module):
            raise self.fail("source", "give exactly one of `source` (a file) or `module` (an importable module)",
                            "source: path/to/kernels.py (relative to the new.yaml), or module: pkg.kernels")
        path = (self.base / req.source) if req.source else _module_file(req.module, self.base)
        if path is None or not path.is_file():
            what = f"{req.source or req.module} is not a file" if req.source else f"module {req.module} is not found"
            raise self.fail("source" if req.source else "module", what,
                            "give the kernel file's path relative to the new.yaml (or the current folder), or a "
                            "module importable from it (its .py file is read, never imported)")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise KernelSourceError(str(path), f"cannot be read ({exc})", "give a UTF-8 Python file") from None
        return path.resolve(), text

    def check_source(self, path: Path, text: str) -> set[str]:
        """The file's top-level names; errors for what would keep it from running alone in a worker."""
        try:
            tree = parse_python(text, filename=str(path))
        except SyntaxError as exc:
            raise KernelSourceError(f"{path}:{exc.lineno}", f"is not valid Python ({exc.msg})",
                                    "give the kernel file as it runs in your project") from None
        names: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level:
                raise KernelSourceError(f"{path}:{node.lineno}", f"relative import `from {'.' * node.level}"
                                        f"{node.module or ''} import ...`: the file must run on its own in a worker",
                                        "copy what it imports into the file (or into a file beside it with absolute "
                                        "imports) and give that file")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    names.add((alias.asname or alias.name).split(".")[0])
                top = (node.module if isinstance(node, ast.ImportFrom) else node.names[0].name) or ""
                if top and not _importable(top.split(".")[0]):
                    self.check.append(f"{path.name}:{node.lineno} imports {top}, which this Python cannot find: "
                                      "the worker will not either (install it, or inline what the kernel needs)")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                if isinstance(node, ast.ClassDef) and node.name == "Model":
                    raise KernelSourceError(f"{path}:{node.lineno}", "defines a top-level `Model`, the name of the "
                                            "class xeforge new generates", "rename your class in a copy of the "
                                            "file, or write the problem folder by hand (docs/problem-format.md)")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for tgt in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    names.update(n.id for n in ast.walk(tgt) if isinstance(n, ast.Name))
        return names

    # -- tensors and dims
    def tensors(self) -> tuple[list[Tensor], dict[str, int]]:
        sizes: dict[str, int] = dict(self.req.dims)
        out: list[Tensor] = []
        unnamed: list[tuple[Tensor, int, int]] = []
        for name, decl in self.req.inputs.items():
            if not name.isidentifier():
                raise self.fail(f"inputs.{name}", "is not a Python name", "name each input as the call names it")
            text, rng = (decl.tensor, decl.range) if isinstance(decl, TensorDecl) else (decl, None)
            m = _TENSOR_RE.match(text)
            if not m:
                raise self.fail(f"inputs.{name}", f"{text!r} is not dtype[dims]",
                                "write e.g. bfloat16[tokens, hidden] or float32[4096, 128]")
            try:
                dtype = _norm_dtype(m.group(1))
            except ValueError as exc:
                raise self.fail(f"inputs.{name}", str(exc), f"use one of {', '.join(DTYPES)}") from None
            t = Tensor(name, dtype, [], rng)
            for axis, part in enumerate(p for p in m.group(2).split(",") if p.strip() or m.group(2).strip()):
                dm = _DIM_RE.match(part)
                if not dm:
                    raise self.fail(f"inputs.{name}", f"axis {axis} ({part.strip()!r}) is not NAME, NAME=size or a "
                                    "size", "write e.g. [tokens=4096, hidden] (a name once sized holds everywhere)")
                dname, dsize, lit = dm.groups()
                if dname:
                    if dsize is not None:
                        if sizes.get(dname, int(dsize)) != int(dsize):
                            raise self.fail(f"inputs.{name}", f"{dname} is {dsize} here and {sizes[dname]} elsewhere",
                                            "give each dim one size (or two names)")
                        sizes[dname] = int(dsize)
                    t.shape.append(dname)
                elif int(lit) >= INFER_MIN:
                    t.shape.append(int(lit))
                    unnamed.append((t, axis, int(lit)))
                else:
                    t.shape.append(int(lit))
            if rng is not None and dtype not in ("int8", "int32", "int64"):
                raise self.fail(f"inputs.{name}", f"has a range but is {dtype}", "ranges are for integer tensors")
            out.append(t)
        self._name_unnamed(unnamed, sizes)
        return out, sizes

    def _name_unnamed(self, unnamed: list[tuple[Tensor, int, int]], sizes: dict[str, int]) -> None:
        by_size: dict[int, str] = {v: k for k, v in reversed(list(sizes.items())) if isinstance(v, int)}
        for t, axis, size in unnamed:
            dim = by_size.get(size)
            if dim is None:
                dim = f"{t.name}_{axis}"
                while dim in sizes:
                    dim += "_"
                sizes[dim], by_size[size] = size, dim
                self.inferred.append(f"{dim} = {size} (from {t.name}, axis {axis})")
            else:
                self.inferred.append(f"{t.name} axis {axis} ({size}) is {dim}: the same size")
            t.shape[axis] = dim
        for t in {id(t): t for t, _, _ in unnamed}.values():
            named = [d for d in t.shape if isinstance(d, str)]
            for d in {d for d in named if named.count(d) > 1}:
                self.check.append(f"{t.name} has two axes of size {sizes[d]}, both taken as {d}: if they can "
                                  "differ, name them (e.g. [m=4096, k=4096])")

    # -- the call
    def call(self, top_names: set[str], known: set[str]) -> ast.Call:
        try:
            node = parse_python(self.req.call.strip(), mode="eval").body
        except SyntaxError as exc:
            raise self.fail("call", f"is not a Python expression ({exc.msg})",
                            'write one call, e.g. call: "rms_norm(x, weight, eps=1e-6)"') from None
        if not isinstance(node, ast.Call):
            raise self.fail("call", "is not a call", 'write one call, e.g. call: "rms_norm(x, weight, eps=1e-6)"')
        head = node.func
        while isinstance(head, ast.Attribute):
            head = head.value
        if not isinstance(head, ast.Name):
            raise self.fail("call", "calls something that is not a name of the file",
                            "call a function, class or object the file defines or imports")
        if head.id not in top_names and head.id not in self.req.setup:
            raise self.fail("call", f"{head.id} is not defined or imported at the top level of the file",
                            "call a function the file defines (or one it imports), or a `setup` object")
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and n is not head and n.id not in known and n.id not in top_names \
                    and n.id not in ("torch", "triton", "math", "True", "False", "None"):
                raise self.fail("call", f"uses {n.id}, which is not an input, a derived value, a dim or a setup "
                                "object", f"add {n.id} to `inputs`, `derived` or `dims`")
        return node


def _importable(top: str) -> bool:
    try:
        return top in sys.stdlib_module_names or importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def _module_file(module: str, base: Path) -> Path | None:
    """The .py file of ``module`` under ``base`` or ``sys.path``, found without importing anything."""
    parts = module.split(".")
    for root in [base, *(Path(p) for p in sys.path if p)]:
        stem = root.joinpath(*parts)
        for cand in (stem.with_suffix(".py"), stem / "__init__.py"):
            if cand.is_file():
                return cand
    return None


def _ci_size(v: int) -> int:
    """A size the interpreter runs in seconds, keeping the size's remainder by 64 (alignment stays as it was)."""
    if v <= CI_KEEP:
        return v
    return CI_SIZE if v % CI_SIZE == 0 else v % CI_SIZE + CI_SIZE


class _Rename(ast.NodeTransformer):
    """Setup objects become attributes of the Model (``norm(x)`` -> ``self.norm(x)``)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.names:
            return ast.copy_location(ast.Attribute(ast.Name("self", ast.Load()), node.id, ast.Load()), node)
        return node


def _model_text(doc: str, call: ast.Call, call_text: str, params: list[str], inits: list[str], setup: dict[str, str],
                derived: dict[str, str], outputs: list[str], returns: list[str], dims_in_body: list[str]) -> str:
    setup_names = set(setup)
    call = _Rename(setup_names).visit(parse_python(ast.unparse(call), mode="eval")).body
    lines = ["import torch", "", "", "class Model(torch.nn.Module):", f'    """{doc}"""', "",
             f"    def __init__(self{''.join(', ' + d for d in inits)}):", "        super().__init__()"]
    lines += [f"        self.{d} = {d}" for d in inits]
    for name, expr in setup.items():
        lines.append(f"        self.{name} = {ast.unparse(_Rename(setup_names - {name}).visit(parse_python(expr, mode='eval')).body)}")
    lines += ["", f"    def forward(self{''.join(', ' + p for p in params)}):"]
    if dims_in_body:
        lines.append(f"        {', '.join(dims_in_body)} = {', '.join('self.' + d for d in dims_in_body)}")
    lines += [f"        {o} = self._keep({o})  # written in place by the call: the caller's tensor stays as it was"
              for o in outputs]
    lines += [f"        {name} = {expr}" for name, expr in derived.items()]
    lines.append(f"        result = {call_text if not setup_names else ast.unparse(call)}")
    ret = returns[0] if len(returns) == 1 else "(" + ", ".join(returns) + ")"
    lines.append(f"        return {ret}")
    if outputs:
        lines += ["", "    @staticmethod", "    @torch.compiler.disable",
                  "    def _keep(t):",
                  '        """A copy of an input the call writes in place, made outside torch.compile\'s graph: the copy is '
                  "the\n        harness's, not the problem's work: torch.compile may fold a copy and the reference's in-place "
                  'op into one\n        pass, where the kernel\'s Model runs a copy and then the kernel."""',
                  "        return t.clone()"]
    return "\n".join(lines) + "\n"


def _git_root(path: Path) -> Path | None:
    try:
        out = subprocess.run(["git", "-C", str(path.parent), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out.stdout.strip()).resolve() if out.returncode == 0 and out.stdout.strip() else None


def build(req: NewRequest, base: Path, where: str = "new.yaml") -> NewProblem:
    """Everything ``xeforge new`` writes, checked; raises :class:`SpecError` / :class:`KernelSourceError`."""
    b = _Builder(req, base)
    b.where = where
    path, text = b.source()
    top = b.check_source(path, text)
    tensors, sizes = b.tensors()
    tnames = [t.name for t in tensors]
    for key, names in (("derived", req.derived), ("setup", req.setup)):
        for n in names:
            if not n.isidentifier() or n in tnames:
                raise b.fail(f"{key}.{n}", "is not a new Python name", "give each derived value or setup object a "
                             "name of its own (not an input's)")
    for o in req.outputs:
        if o not in tnames:
            raise b.fail("outputs", f"{o} is not an input", "outputs name inputs the call writes in place")
    dim_names = set(sizes) | {d for t in tensors for d in [*t.shape, *(t.range or [])] if isinstance(d, str)}
    known = set(tnames) | set(req.derived) | dim_names | set(req.setup)
    call = b.call(top, known)
    # the dims the call, the derived values and the setup read: Model(*inits) gets them
    used: list[str] = []
    for expr in [ast.unparse(call), *req.derived.values(), *req.setup.values(), *req.reference_setup.values()]:
        try:
            tree = parse_python(expr, mode="eval")
        except SyntaxError as exc:
            raise b.fail("derived" if expr in req.derived.values() else "setup", f"{expr!r} is not a Python "
                         f"expression ({exc.msg})", "write one expression over the inputs and dims") from None
        for n in ast.walk(tree):
            if isinstance(n, ast.Name) and n.id in dim_names and n.id not in tnames and n.id not in used:
                used.append(n.id)
    missing = sorted((dim_names | set(used)) - set(sizes))
    if missing:
        raise b.fail("dims", f"no size for {', '.join(missing)}",
                     f"give it in `dims` ({missing[0]}: 4096) or inline ([{missing[0]}=4096])")
    for d in req.fixed:
        if d not in sizes:
            raise b.fail("fixed", f"{d} is not a dim", f"the dims are {', '.join(sizes)}")
    returns = ([req.returns] if isinstance(req.returns, str) else list(req.returns or [])) or \
        (list(req.outputs) or ["result"])
    for r in returns:
        if r != "result" and r not in known:
            raise b.fail("returns", f"{r} is not `result`, an input or a derived value",
                         "return the call's value (`result`) and the outputs written in place")
    # variants
    for key, over in [("ci", req.ci), *((f"bench[{i}]", o) for i, o in enumerate(req.bench))]:
        for d in over:
            if d not in sizes:
                raise b.fail(key, f"{d} is not a dim", f"the dims are {', '.join(sizes)}")
    ci = {d: (req.ci[d] if d in req.ci else v if d in req.fixed else _ci_size(v)) for d, v in sizes.items()}
    for d in sizes:
        if d not in req.ci and ci[d] != sizes[d]:
            b.inferred.append(f"ci: {d} = {ci[d]} (from {sizes[d]}: the interpreter runs small shapes)")
    variants: dict[str, dict[str, int]] = {"ci": ci, "bench-gpu": dict(sizes)}
    for i, over in enumerate(req.bench, 1):
        variants[f"bench-gpu-{i}"] = {**sizes, **over}
    lead = next((d for t in tensors for d in t.shape[:1] if isinstance(d, str)), None)
    if req.suggest and not req.bench and lead and lead not in req.fixed and sizes[lead] > CI_KEEP:
        variants["bench-decode"] = {**sizes, lead: 16}
        variants["bench-odd"] = {**sizes, lead: _odd_near(sizes[lead] - 1)}
        b.inferred.append(f"suggested shapes: bench-decode ({lead} = 16) and bench-odd ({lead} = "
                          f"{variants['bench-odd'][lead]}); give `bench:` to choose your own, `suggest: false` for none")
    for t in tensors:
        n = 1
        for d in t.shape:
            n *= ci[d] if isinstance(d, str) else d
        if n > CI_WARN_ELEMENTS:
            b.check.append(f"{t.name} has {n} elements at ci: the interpreter will be slow (set smaller `ci` sizes)")
    # the files
    name = req.name or path.stem
    repo = _git_root(path)
    relpath = path.relative_to(repo).as_posix() if repo else path.name
    params = tnames
    dims_in_body = [d for d in used if d not in req.setup]
    fname = ast.unparse(call.func)
    doc = f"Calls {fname}(...) as {relpath}'s users do (generated by `xeforge new`: docs/new.md)."
    kernel = text + "\n\n" + marker(relpath) + "\n" + _model_text(doc, call, req.call.strip(), params, used, req.setup, req.derived,
                                                                 req.outputs, returns, dims_in_body)
    files = {"kernel.py": kernel}
    oracle = "the starting kernel is its own oracle (no reference named): give `reference:` to check it against PyTorch"
    if req.reference:
        ref_path, ref_text, ref_fn = _reference(b, req.reference)
        ref_call = parse_python(ast.unparse(call), mode="eval").body
        if req.setup:
            if not req.reference_setup:
                raise b.fail("reference_setup", "is missing: the call uses setup objects",
                             "give the reference's objects under the same names (norm: RMSNormRef(hidden))")
            rsetup = req.reference_setup
        else:
            ref_call.func = ast.Name(ref_fn, ast.Load())
            rsetup = {}
        ref_text_call = ast.unparse(ref_call)
        if not req.setup:  # the call as the user wrote it, with the reference's name in place of the function's
            ref_text_call = ref_fn + req.call.strip()[call.func.end_col_offset:]
        ref_doc = f"The reference: {ref_fn} from {ref_path.name}, called as the kernel's Model calls {fname}."
        files["reference.py"] = ref_text + "\n\n" + marker(ref_path.name) + "\n" + _model_text(
            ref_doc, ref_call, ref_text_call, params, used, rsetup, req.derived, req.outputs, returns, dims_in_body)
        oracle = f"{ref_fn} ({ref_path.name}), run in float64"
    precision = req.precision
    if precision is None and req.ci_dtype == "float32" and tf32_dots(text):
        precision = "tf32"
        b.inferred.append("precision: tf32 (a tl.dot on float32 operands runs as TF32 on NVIDIA GPUs unless it says "
                          "input_precision=\"ieee\": float32 variants are checked at 1e-2 on a GPU, at 1e-4 on the "
                          "interpreter; give `precision: strict` and input_precision=\"ieee\" to hold fp32)")
    files["spec.yaml"] = _spec_text(req, name, tensors, used, variants, oracle, precision)
    files[UPSTREAM_FILE] = yaml.safe_dump({
        "source": str(path), "repo_root": str(repo) if repo else None, "relpath": relpath, "sha256": sha256(text),
        "call": req.call, "created_by": f"xeforge {__version__} new"}, sort_keys=False)
    return NewProblem(name, files, b.inferred, b.check, sizes, variants, oracle)


def _reference(b: _Builder, ref: str) -> tuple[Path, str, str]:
    target, colon, fn = ref.rpartition(":")
    if not colon or not fn.isidentifier() or not target:
        raise b.fail("reference", f"{ref!r} is not FILE:FUNCTION or MODULE:FUNCTION", "e.g. rmsnorm.py:rms_norm_ref")
    path = (b.base / target) if target.endswith(".py") else _module_file(target, b.base)
    if path is None or not path.is_file():
        raise b.fail("reference", f"{target} is not found", "give the reference file relative to the new.yaml")
    text = path.read_text(encoding="utf-8")
    names = b.check_source(path, text)
    if fn not in names:
        raise b.fail("reference", f"{path.name} defines no top-level {fn}", "name a function the file defines")
    return path.resolve(), text, fn


def _spec_text(req: NewRequest, name: str, tensors: list[Tensor], inits: list[str],
               variants: dict[str, dict[str, int]], oracle: str, precision: str | None = None) -> str:
    spec: dict[str, Any] = {}
    for key, value in (("kind", req.kind), ("description", req.description), ("precision", precision)):
        if value:
            spec[key] = value
    if req.nondeterministic:
        spec["nondeterministic"] = True
    spec["inputs"] = {t.name: {"shape": t.shape, "dtype": t.dtype, **({"range": t.range} if t.range else {})}
                      for t in tensors}
    if inits:
        spec["inits"] = [{"dim": d} for d in inits]
    if req.fixed:
        spec["fixed"] = list(req.fixed)
    if req.ragged is not True:
        spec["ragged"] = req.ragged
    for vname, dims in variants.items():
        v: dict[str, Any] = {"params": [t.name for t in tensors]}
        if vname == "ci":
            v["dtype"] = req.ci_dtype
        v["dims"] = dims
        for key in ("flop", "bytes", "rtol", "atol"):
            if getattr(req, key) is not None and (vname != "ci" or key in ("flop", "bytes")):
                v[key] = getattr(req, key)
        spec[vname] = [v]
    head = (f"# {name}: written by `xeforge new` (docs/new.md); edit freely (docs/problem-format.md).\n"
            f"# oracle: {oracle}\n")
    return head + yaml.safe_dump(spec, sort_keys=False, default_flow_style=None, width=120)


# --------------------------------------------------------------------------------------------- writing it
def write(np: NewProblem, out: Path, force: bool = False) -> Path:
    """The folder, written only once it loads as a problem; an existing folder only with ``force``."""
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError(str(out), "exists and is not empty", "choose another --out, or pass --force to replace "
                         "the files xeforge new writes there")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for fname, text in np.files.items():
            (tmp / fname).write_text(text, encoding="utf-8")
        load_problem(tmp)  # what was generated is a problem (a bug here is ours: the error says where)
        out.mkdir(exist_ok=True)
        stale = {"kernel.py", "spec.yaml", "reference.py", UPSTREAM_FILE} - set(np.files)
        for fname in stale:
            (out / fname).unlink(missing_ok=True)
        for fname in np.files:
            os.replace(tmp / fname, out / fname)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def cmd_new(args: argparse.Namespace) -> int:
    req, base = request_from_args(args)
    where = args.source if args.source.endswith((".yaml", ".yml")) else "the command line"
    np = build(req, base, where)
    out = Path(args.out) if args.out else Path("problems") / np.name
    write(np, out, force=args.force)
    print(f"problem folder written: {out}", file=sys.stderr)
    if args.json:
        print(json.dumps({**np.as_dict(), "folder": str(out)}, indent=2))
        return 0
    print(f"{np.name}: {out}/ ({', '.join(sorted(np.files))})")
    print(f"oracle: {np.oracle}")
    print("dims: " + ", ".join(f"{d}={v}" for d, v in np.dims.items()))
    for vname, dims in np.variants.items():
        changed = {d: v for d, v in dims.items() if v != np.dims.get(d)} if vname != "bench-gpu" else dims
        print(f"  {vname}: " + ", ".join(f"{d}={v}" for d, v in changed.items()))
    for line in np.inferred:
        print(f"inferred: {line}")
    for line in np.check:
        print(f"check: {line}")
    print("check: dims the kernel needs to stay a power of two or a multiple of its block (a head dim, a group "
          "size) belong in `fixed`, or the ragged shapes change them")
    print(f"next: xeforge verify {out} --device cpu   then   xeforge port {out} --patch")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("new", help="a problem folder from a kernel file where it lives (a new.yaml, or the "
                              "call and inputs on the command line)",
                              description="Write kernel.py (your file as it is + a generated Model making the call), "
                              "spec.yaml, reference.py and upstream.yaml. docs/new.md has the format.")
    p.add_argument("source", help="a new.yaml, a kernel .py file, or an importable module (pkg.kernels)")
    p.add_argument("--call", help='the call, e.g. "rms_norm(x, w, eps=1e-6)"')
    p.add_argument("--input", action="append", help="NAME=DTYPE[dims], e.g. x=bfloat16[tokens=4096,hidden=4096]")
    p.add_argument("--range", action="append", help="NAME=LOW:HIGH for an integer input (dims allowed)")
    p.add_argument("--derived", action="append", help="NAME=EXPR computed in forward, e.g. "
                   "cu=torch.arange(b + 1, device=q.device, dtype=torch.int32) * s")
    p.add_argument("--output", action="append", help="an input the call writes in place (cloned, returned)")
    p.add_argument("--returns", help="comma-separated: result (the call's value), outputs, derived values")
    p.add_argument("--reference", help="FILE:FUNCTION or MODULE:FUNCTION, the PyTorch reference")
    p.add_argument("--dims", help="sizes of named dims: tokens=4096,hidden=4096")
    p.add_argument("--bench", action="append", help="another timed shape as dims overrides: tokens=16")
    p.add_argument("--ci", help="interpreter sizes: tokens=8,hidden=64 (default: scaled down)")
    p.add_argument("--ci-dtype", default="float32", help="floating dtype at ci (default float32)")
    p.add_argument("--fixed", help="comma-separated dims the ragged shapes keep")
    p.add_argument("--name", help="the problem's name (default: the file's stem)")
    p.add_argument("-o", "--out", help="the folder to write (default: problems/<name>)")
    p.add_argument("--force", action="store_true", help="replace the files of an existing folder")
    p.add_argument("--json", action="store_true", help="print what was inferred as JSON")
    p.set_defaults(func=cmd_new)
