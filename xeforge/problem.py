"""Problem loading: a folder with ``kernel.py``, ``spec.yaml`` and ``reference.py`` becomes a :class:`Problem`.

Owns: the spec schema (pydantic, Xe-Forge compatible keys plus ``precision``, ``bytes``, tolerances, ragged
shapes), the dims as numbers (integers where they size a tensor or bound a range; any number, or a string that
reads as one, where they only reach ``inits`` or a formula, as the published format writes init scalars), safe
evaluation of ``flop``/``bytes`` formulas, the KernelBench ``get_inputs`` fallback, ragged shape derivation and
input generation. Every malformed spec raises :class:`SpecError` naming the file, the key (with its YAML line),
what was expected and the fix. Format: ``docs/problem-format.md``.
"""

from __future__ import annotations

import ast
import hashlib
import math
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from xeforge.errors import ProblemError, SpecError
from xeforge.inputs import FLOAT_DTYPES, TensorPlan
from xeforge.isolation import WorkerFailure, facts_worker
from xeforge.kb.yamlio import YamlSyntaxError, parse_yaml
from xeforge.kernel_model import parse_python

DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int32", "int64", "bool")
PRECISIONS = ("strict", "tf32", "bf16", "fp16")
_DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "float": "float32",
                  "fp64": "float64", "double": "float64"}
_VARIANT_RE = re.compile(r"^(ci|bench-.+)$")
_INT_RE = re.compile(r"^[+-]?\d+$")


# --------------------------------------------------------------------------------------------- schema
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


def _norm_dtype(v: Any) -> Any:
    if isinstance(v, str):
        v = v.strip().removeprefix("torch.")
        v = _DTYPE_ALIASES.get(v, v)
        if v not in DTYPES:
            raise ValueError(f"unknown dtype {v!r}; expected one of {', '.join(DTYPES)}")
    return v


class InputModel(_Strict):
    shape: list[Union[str, int]]
    dtype: str = "float32"
    range: list[Union[str, int]] | None = None

    _dt = field_validator("dtype", mode="before")(_norm_dtype)


class InitModel(_Strict):
    dim: str | None = None
    value: Any = None


class VariantModel(_Strict):
    params: list[str] | None = None
    dtype: str | None = None
    # a dim is an integer, a number (an init scalar: SCALING_FACTOR: 1.5), a string that reads as one (BN_EPS:
    # '1e-5', or 1e-5 unquoted, which YAML 1.1 reads as a string) or a list of them (a shape passed to inits):
    # read by _SpecReader._dims (pydantic's coercion errors would not say which), integers checked where needed
    dims: dict[str, Any] = Field(default_factory=dict)
    flop: Union[str, int, float, None] = None
    bytes: Union[str, int, float, None] = None
    rtol: float | None = None
    atol: float | None = None
    weight: float | None = None  # a timed (bench-*) shape's share of gate 3's objective (default 1)

    _dt = field_validator("dtype", mode="before")(_norm_dtype)


class SpecModel(_Strict):
    model_config = ConfigDict(extra="allow")  # variant names are free-form keys; checked below
    inputs: dict[str, InputModel]
    inits: list[InitModel] = Field(default_factory=list)
    precision: Literal["strict", "tf32", "bf16", "fp16"] = "strict"
    nondeterministic: bool = False
    kind: Literal["gemm", "reduction", "elementwise", "attention", "other"] | None = None
    origin: Literal["naive-port", "nvidia-tuned", "other"] | None = None
    description: str | None = None
    fixed: list[str] = Field(default_factory=list)
    ragged: Union[bool, list[dict[str, Any]]] = True  # dims to override: checked like a variant's dims
    default_variant: str | None = None  # published format: the variant its runs use by default (checked, a note)
    lowering: Any = None  # published format: its lowering pipeline's settings (not used here; a note says so)


# --------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[Union[str, int], ...]
    dtype: str
    range: tuple[Union[str, int], Union[str, int]] | None = None


@dataclass(frozen=True)
class Variant:
    name: str
    params: tuple[str, ...]
    dtype: str | None
    dims: dict[str, Any]
    flop_expr: str | None
    bytes_expr: str | None
    rtol: float | None = None
    atol: float | None = None
    ragged: bool = False  # derived for the ragged-shape check
    weight: float = 1.0  # a timed shape's weight in gate 3's objective

    @property
    def flop(self) -> float | None:
        return None if self.flop_expr is None else float(eval_formula(self.flop_expr, self.dims))

    @property
    def bytes(self) -> float | None:
        return None if self.bytes_expr is None else float(eval_formula(self.bytes_expr, self.dims))

    def with_dims(self, name: str, **dims: Any) -> "Variant":
        return Variant(name, self.params, self.dtype, {**self.dims, **dims}, self.flop_expr, self.bytes_expr,
                       self.rtol, self.atol, ragged=True)

    def describe(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.dims.items())
        return f"{self.name} ({shown})"


@dataclass
class Spec:
    inputs: dict[str, InputSpec]
    inits: list[tuple[str, Any]]  # ("dim", NAME) or ("value", literal)
    variants: dict[str, Variant]
    precision: str = "strict"
    nondeterministic: bool = False
    kind: str | None = None
    origin: str | None = None
    description: str | None = None
    fixed: frozenset[str] = frozenset()
    ragged: Union[bool, list[dict[str, Any]]] = True
    from_kernelbench: bool = False
    notes: list[str] = field(default_factory=list)  # what the loader read and does not use, said once


@dataclass(frozen=True)
class Code:
    """Source text and the file name it came from: what crosses to a worker (never a path it would re-read)."""

    text: str
    filename: str

    @property
    def hash(self) -> str:
        return source_hash(self.text)


@dataclass
class Problem:
    """A loaded problem. Its files are read once, here: every later use takes these copies (the snapshot), so a
    file changed after loading (by a candidate, say) changes nothing the tool runs or compares against."""

    name: str
    root: Path
    kernel_path: Path
    kernel_source: str
    spec: Spec
    spec_path: Path | None
    reference_path: Path | None
    notes: list[str] = field(default_factory=list)
    reference_source: str | None = None

    @property
    def has_reference(self) -> bool:
        return self.reference_path is not None

    @property
    def kernel_code(self) -> Code:
        return Code(self.kernel_source, self.kernel_path.name)

    @property
    def oracle_code(self) -> Code:
        """The reference (or, without one, the starting kernel) as loaded."""
        if self.reference_path is not None and self.reference_source is not None:
            return Code(self.reference_source, self.reference_path.name)
        return self.kernel_code

    def code_for(self, path: Path) -> Code | None:
        """The snapshot of one of the problem's own files, or None for any other path."""
        path = Path(path).resolve()
        if path == self.kernel_path.resolve():
            return self.kernel_code
        if self.reference_path is not None and path == Path(self.reference_path).resolve():
            return self.oracle_code
        return None

    @property
    def source_hash(self) -> str:
        return source_hash(self.kernel_source)

    def variant(self, name: str) -> Variant:
        if name not in self.spec.variants:
            raise ProblemError(str(self.spec_path or self.kernel_path), f"no variant named {name!r}",
                               f"use one of: {', '.join(self.spec.variants)}")
        return self.spec.variants[name]

    def variants_for(self, device_kind: str) -> list[Variant]:
        """Variants small enough for the device: ``ci`` only on the interpreter, all of them on a GPU."""
        names = list(self.spec.variants)
        if device_kind == "cpu":
            names = [n for n in names if n == "ci"] or names[:1]
            return [self.spec.variants[n] for n in names]
        out = [self.spec.variants[n] for n in names]
        gpu = self.timing_variant(device_kind)
        ci = self.spec.variants.get("ci")
        gpu_dtype = self.compute_dtype(gpu)
        if ci is not None and gpu.name != "ci" and gpu_dtype and gpu_dtype != self.compute_dtype(ci):
            # ci exists for the interpreter (which cannot run bf16 dots); on a GPU its shapes are checked in the
            # problem's GPU dtype (the bench variant's own, or its inputs' as `xeforge new` writes them), with that
            # variant's tolerances: a tile that fits shared memory in bf16 need not fit in the float32 of ci_dtype
            out[names.index("ci")] = Variant(f"ci@{gpu_dtype}", ci.params, gpu.dtype, ci.dims, ci.flop_expr,
                                             ci.bytes_expr, gpu.rtol, gpu.atol)
        return out

    def correctness_variants(self, device_kind: str, ragged: bool = True) -> list[Variant]:
        """The shapes gate 2 runs on the device: :meth:`variants_for`, then the ragged shapes derived from the first
        of them (when ``ragged``). A tactic that dispatches on shapes reads the same list, so each of its branches
        is known to be verified."""
        out = self.variants_for(device_kind)
        return out + (self.ragged_variants(out[0]) if ragged and out else [])

    def timing_variant(self, device_kind: str) -> Variant:
        """The variant gate 3 times: ``bench-gpu`` on a GPU, ``ci`` on the interpreter."""
        v = self.spec.variants
        if device_kind != "cpu":
            for name in ("bench-gpu", *sorted(n for n in v if n.startswith("bench-"))):
                if name in v:
                    return v[name]
        return v.get("ci") or next(iter(v.values()))

    def timed_variants(self, device_kind: str) -> list[Variant]:
        """The shapes gate 3 times, the primary (:meth:`timing_variant`) first: every ``bench-*`` variant on a GPU,
        ``ci`` alone on the interpreter."""
        primary = self.timing_variant(device_kind)
        if device_kind == "cpu":
            return [primary]
        rest = sorted(n for n in self.spec.variants if n.startswith("bench-") and n != primary.name)
        return [primary, *(self.spec.variants[n] for n in rest)]

    def init_args(self, variant: Variant) -> list[Any]:
        out = []
        for kind, val in self.spec.inits:
            if kind == "dim":
                d = variant.dims[val]
                out.append(tuple(d) if isinstance(d, list) else d)
            else:
                out.append(val)
        return out

    def input_specs(self, variant: Variant) -> list[InputSpec]:
        names = variant.params or tuple(self.spec.inputs)
        return [self.spec.inputs[n] for n in names]

    def compute_dtype(self, variant: Variant) -> str | None:
        """The dtype a variant computes in: its own ``dtype``, else its first floating or int8 input's (an int64 index
        tensor listed first says nothing of it; a W8A8 GEMM's int8 operands come before their float32 scales, and it
        runs on the int8 matrix units: its roofline and baselines are int8's)."""
        return variant.dtype or next((i.dtype for i in self.input_specs(variant)
                                      if str(i.dtype).startswith(("float", "bfloat")) or str(i.dtype) == "int8"), None)

    def tolerance_dtype(self, variant: Variant) -> str | None:
        """The dtype whose rounding a variant's outputs carry: its compute dtype, except that an int8 GEMM's output
        is dequantized into a float (a W8A8 kernel's bias or scale dtype): its narrowest floating input's, which
        the int8 product's exact integers then meet."""
        dt = self.compute_dtype(variant)
        if dt != "int8":
            return dt
        floats = [str(i.dtype) for i in self.input_specs(variant) if str(i.dtype).startswith(("float", "bfloat"))]
        if variant.dtype and variant.dtype != "int8" and floats:
            return variant.dtype
        half = [d for d in floats if d in ("float16", "bfloat16")]
        return half[0] if half else (floats[0] if floats else dt)

    def ragged_variants(self, base: Variant) -> list[Variant]:
        """Ragged shapes for the correctness gate, derived from ``base`` (normally ``ci``)."""
        rg = self.spec.ragged
        if rg is False or self.spec.from_kernelbench:
            return []
        if isinstance(rg, list):
            return [base.with_dims(f"{base.name}-ragged{i}", **d) for i, d in enumerate(rg)]
        free = [d for d in _shape_dims(self.spec) if d not in self.spec.fixed and isinstance(base.dims.get(d), int)]
        if not free:
            return []
        odd = {d: _odd_near(base.dims[d]) for d in free}
        out = []
        if any(odd[d] != base.dims[d] for d in free):
            out.append(base.with_dims(f"{base.name}-ragged-odd", **odd))
        small = {d: 17 for d in free if base.dims[d] != 17 and base.dims[d] >= 2}
        if small:
            out.append(base.with_dims(f"{base.name}-ragged-17", **small))
        return out


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _shape_dims(spec: Spec) -> list[str]:
    seen: list[str] = []
    for inp in spec.inputs.values():
        for d in inp.shape:
            if isinstance(d, str) and d not in seen:
                seen.append(d)
    return seen


def _odd_near(v: int) -> int:
    """A non-power-of-two close to ``v`` (odd where possible): 64 -> 63, 100 -> 99, 1 -> 1."""
    if v <= 2:
        return v
    cand = v - 1 if v % 2 == 0 else v
    if cand & (cand - 1) == 0:
        cand += 2
    return cand


# --------------------------------------------------------------------------------------------- formulas
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow, ast.Mod: operator.mod}


def formula_names(expr: str) -> set[str]:
    """Names used by a formula; raises ValueError if it is not plain arithmetic."""
    tree = parse_python(str(expr), mode="eval")
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif not isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.USub, ast.UAdd,
                                   ast.Load, *_BINOPS)):
            raise ValueError(f"{type(node).__name__} is not allowed (only + - * / // ** % and parentheses)")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
            raise ValueError(f"constant {node.value!r} is not a number")
    return names


def eval_formula(expr: Union[str, int, float], dims: dict[str, Any]) -> float:
    if isinstance(expr, (int, float)):
        return expr

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in dims:
                raise ValueError(f"unknown name {node.id!r} (not a dim of this variant)")
            v = dims[node.id]
            return math.prod(v) if isinstance(v, (list, tuple)) else v
        if isinstance(node, ast.UnaryOp):
            return -ev(node.operand) if isinstance(node.op, ast.USub) else ev(node.operand)
        if isinstance(node, ast.BinOp):
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and (abs(right) > 64 or (abs(left) > 1 and abs(right) * math.log2(abs(left)) > 128)):
                raise ValueError(f"{left} ** {right} is beyond any flop or byte count (at most 2**128)")
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise ValueError("division by zero")
            out = _BINOPS[type(node.op)](left, right)
            if abs(out) > _FORMULA_MAX:
                raise ValueError(f"an intermediate value {out:.3g} is beyond any flop or byte count")
            return out
        raise ValueError(type(node).__name__)

    if len(str(expr)) > 1000:
        raise ValueError("a formula longer than 1000 characters")
    formula_names(expr)
    return ev(parse_python(str(expr), mode="eval"))


_FORMULA_MAX = 2.0 ** 128  # flop and byte counts: far beyond any real kernel, far below a hang


# --------------------------------------------------------------------------------------------- YAML lines
def _yaml_lines(text: str) -> dict[tuple, int]:
    """Key path -> 1-based line, for error messages."""
    lines: dict[tuple, int] = {}
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return lines

    def walk(node, path: tuple) -> None:
        lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = k.value
                lines[path + (key,)] = k.start_mark.line + 1
                walk(v, path + (key,))
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                walk(v, path + (i,))

    if root is not None:
        walk(root, ())
    return lines


def _fmt_path(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


class _SpecReader:
    """Turns a parsed YAML document into a :class:`Spec`, raising SpecError with file:line, key and fix."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.text = text
        self.lines: dict[tuple, int] = {}  # key path -> line, once the text passed the YAML limits

    def fail(self, key: tuple, what: str, fix: str) -> SpecError:
        line = None
        for i in range(len(key), -1, -1):
            if key[:i] in self.lines:
                line = self.lines[key[:i]]
                break
        where = f"{self.path}:{line}" if line else str(self.path)
        return SpecError(f"{where} key '{_fmt_path(key)}'", what, fix)

    def read(self) -> Spec:

        try:
            data = parse_yaml(self.text)  # safe, bounded (depth, aliases), a key written twice is an error
        except YamlSyntaxError as exc:
            raise SpecError(f"{self.path}:{exc.line}", exc.what, exc.fix) from None
        self.lines = _yaml_lines(self.text)
        if not isinstance(data, dict):
            raise self.fail((), "the spec must be a mapping with 'inputs' and at least one variant",
                            "see docs/problem-format.md for a complete example")
        self._keyword_inits(data.get("inits"))
        try:
            model = SpecModel.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = tuple(err["loc"])
            raise self.fail(loc, _explain_pydantic(err), _fix_for(loc, err)) from None

        inputs = {}
        if not model.inputs:
            raise self.fail(("inputs",), "no inputs declared", "declare forward()'s tensor arguments under 'inputs'")
        for name, inp in model.inputs.items():
            rng = tuple(inp.range) if inp.range is not None else None
            if rng is not None and len(rng) != 2:
                raise self.fail(("inputs", name, "range"), "range must have two entries [low, high)",
                                "write e.g. range: [0, VOCAB]")
            inputs[name] = InputSpec(name, tuple(inp.shape), inp.dtype, rng)
        inits: list[tuple[str, Any]] = []
        for i, it in enumerate(model.inits):
            if (it.dim is None) == (it.value is None):
                raise self.fail(("inits", i), "each init needs exactly one of 'dim' or 'value'",
                                "write '- dim: NAME' (a variant dim) or '- value: 0.5' (a literal)")
            inits.append(("dim", it.dim) if it.dim is not None else ("value", it.value))

        variants: dict[str, Variant] = {}
        notes: list[str] = []
        extras = model.model_extra or {}
        for vname, raw in extras.items():
            if not _VARIANT_RE.match(vname):
                raise self.fail((vname,), f"unknown key {vname!r}",
                                "top-level keys are inputs, inits, precision, nondeterministic, kind, origin, "
                                "description, fixed, ragged, default_variant, lowering and variants named 'ci', "
                                "'bench-gpu', 'bench-gpu-<n>'")
            entries = raw if isinstance(raw, list) else [raw]
            if len(entries) != 1 or not isinstance(entries[0], dict):
                raise self.fail((vname,), "a variant is a list with exactly one mapping (params, dtype, dims, flop)",
                                f"write '{vname}:\\n  - params: [...]\\n    dims: {{...}}'")
            key0 = (vname, 0) if isinstance(raw, list) else (vname,)
            try:
                vm = VariantModel.model_validate(entries[0])
            except ValidationError as exc:
                err = exc.errors()[0]
                loc = key0 + tuple(err["loc"])
                raise self.fail(loc, _explain_pydantic(err), _fix_for(loc, err)) from None
            variants[vname] = self._variant(vname, key0, vm, inputs, inits)
        if not variants:
            raise self.fail((), "no variant declared", "add a 'ci' variant (tiny shapes for the CPU interpreter)")
        for i, d in enumerate(model.fixed):
            if not any(d in v.dims for v in variants.values()):
                raise self.fail(("fixed", i), f"fixed dim {d!r} is not a dim of any variant", "name a dim from 'dims'")
        ragged = model.ragged
        if isinstance(ragged, list):
            ragged = [self._ragged_entry(i, entry, inputs, variants) for i, entry in enumerate(ragged)]
        if model.default_variant is not None:
            if model.default_variant not in variants:
                raise self.fail(("default_variant",), f"default_variant {model.default_variant!r} is not a variant "
                                "of this spec", f"name one of: {', '.join(variants)} (or remove the key)")
            notes.append(f"default_variant: {model.default_variant} is read and not needed: xeforge checks 'ci' on the "
                         "CPU interpreter and every variant on a GPU, and times 'bench-gpu'")
        if model.lowering is not None:
            notes.append("the spec's 'lowering' settings (the published system's lowering pipeline) are not used here")
        return Spec(inputs, inits, variants, model.precision, model.nondeterministic, model.kind, model.origin,
                    model.description, frozenset(model.fixed), ragged, notes=notes)

    def _keyword_inits(self, raw: Any) -> None:
        """The published rms_norm style, ``- hidden_size: HIDDEN``: a keyword argument, refused with the fix."""
        if not isinstance(raw, list):
            return
        for i, item in enumerate(raw):
            if isinstance(item, dict) and len(item) == 1 and next(iter(item)) not in ("dim", "value"):
                (arg, val), = item.items()
                what = f"dim: {val}" if isinstance(val, str) and val.isidentifier() else f"value: {_yaml_number(val)}"
                raise self.fail(("inits", i), f"init '- {arg}: {val}' names a keyword argument of Model.__init__; "
                                "inits are passed positionally", f"write '- {what}' at the position of '{arg}' in "
                                "Model.__init__'s parameters (a dim by name, or a literal value)")

    def _dims(self, key: tuple, raw: dict[str, Any]) -> dict[str, Any]:
        """A variant's (or ragged entry's) dims as numbers: integers, floats (init scalars), lists of them."""
        dims = {}
        for dname, dval in raw.items():
            try:
                dims[dname] = _dim_value(dval)
            except ValueError as exc:
                raise self.fail(key + (dname,), f"dim {dname} = {dval!r} {exc}",
                                "a dim is an integer (a size), a number such as 1.5 or 1.0e-5 (a scalar passed to "
                                "inits), or a list of them (a shape passed to inits)") from None
        return dims

    def _integer_places(self, dims_key: tuple, dims: dict[str, Any], inputs: dict[str, InputSpec], params) -> None:
        """Every dim that sizes a tensor (a shape) or bounds integer inputs (a range) holds an integer there;
        ``dims_key`` is where the dims are written (``ci[0].dims``, ``ragged[0]``), for the error."""
        for p in params:
            for where, entries, size in (("shape", inputs[p].shape, True), ("range", inputs[p].range or (), False)):
                for j, d in enumerate(entries):
                    if not isinstance(d, str) or d not in dims:
                        continue
                    v = dims[d]
                    ok = isinstance(v, int) and (v >= 0 or not size)
                    if not ok:
                        need = "a non-negative integer (a size)" if size else "an integer (a bound of integer inputs)"
                        at = _fmt_path(("inputs", p, where, j))
                        hint = f" (e.g. {int(v)})" if isinstance(v, float) and v == int(v) and v >= 0 else ""
                        raise self.fail(dims_key + (d,), f"dim {d} = {v!r} is used at '{at}', which needs {need}",
                                        f"give {d} {'a non-negative' if size else 'an'} integer value{hint}; a scalar "
                                        "for Model.__init__ goes in a dim of its own that no shape or range uses")

    def _ragged_entry(self, i: int, entry: dict[str, Any], inputs, variants: dict[str, Variant]) -> dict[str, Any]:
        key = ("ragged", i)
        known = {d for v in variants.values() for d in v.dims}
        for d in entry:
            if d not in known:
                raise self.fail(key + (d,), f"ragged dim {d!r} is not a dim of any variant",
                                "override dims from the variants' 'dims', e.g. {BATCH: 17}")
        dims = self._dims(key, entry)
        self._integer_places(key, dims, inputs, tuple(inputs))
        return dims

    def _variant(self, vname, key0, vm: VariantModel, inputs, inits) -> Variant:
        params = tuple(vm.params) if vm.params is not None else tuple(inputs)
        for i, p in enumerate(params):
            if p not in inputs:
                raise self.fail(key0 + ("params", i), f"param {p!r} is not a declared input",
                                f"use one of the names under 'inputs': {', '.join(inputs)}")
        dims = self._dims(key0 + ("dims",), dict(vm.dims))
        needed: list[tuple[tuple, str]] = []
        for p in params:
            for j, d in enumerate(inputs[p].shape):
                if isinstance(d, str):
                    needed.append((("inputs", p, "shape", j), d))
            for j, d in enumerate(inputs[p].range or ()):
                if isinstance(d, str):
                    needed.append((("inputs", p, "range", j), d))
        for i, (kind, val) in enumerate(inits):
            if kind == "dim":
                needed.append((("inits", i, "dim"), val))
        for key, d in needed:
            if d not in dims:
                raise self.fail(key0 + ("dims",), f"dim {d!r} (used at '{_fmt_path(key)}') is not defined in variant "
                                f"{vname!r}", f"add '{d}: <int>' under {vname}.dims, or fix the name at '{_fmt_path(key)}'")
        self._integer_places(key0 + ("dims",), dims, inputs, params)
        for fname in ("flop", "bytes"):
            expr = getattr(vm, fname)
            if expr is None:
                continue
            try:
                names = formula_names(str(expr))
                unknown = sorted(names - set(dims))
                if unknown:
                    raise ValueError(f"unknown name(s) {', '.join(unknown)}")
                eval_formula(str(expr), dims)
            except (ValueError, SyntaxError, ZeroDivisionError, TypeError, OverflowError, RecursionError) as exc:
                raise self.fail(key0 + (fname,), f"{fname} formula {expr!r} cannot be evaluated: {exc}",
                                f"write {fname} as arithmetic over this variant's dims, e.g. \"2*M*N*K\"") from None
        for tol in ("rtol", "atol"):
            val = getattr(vm, tol)
            if val is not None and not (0 <= val < 1):
                raise self.fail(key0 + (tol,), f"{tol} = {val} is outside [0, 1)", f"use e.g. {tol}: 1.0e-4")
        if vm.weight is not None and not (vm.weight > 0 and math.isfinite(vm.weight)):
            raise self.fail(key0 + ("weight",), f"weight = {vm.weight} is not a positive number",
                            "use e.g. weight: 2 (this shape counts twice in gate 3's objective), or leave it out (1)")
        return Variant(vname, params, vm.dtype, dims, None if vm.flop is None else str(vm.flop),
                       None if vm.bytes is None else str(vm.bytes), vm.rtol, vm.atol,
                       weight=1.0 if vm.weight is None else float(vm.weight))


def _explain_pydantic(err: dict) -> str:
    loc = _fmt_path(tuple(err["loc"]))
    if err["type"] == "missing":
        return f"required key '{loc}' is missing"
    if err["type"] == "extra_forbidden":
        return f"unknown key '{loc}'"
    return f"'{loc}': {err['msg']} (got {err.get('input')!r})"


_FIXES = {
    "inputs": "declare inputs as 'NAME: {shape: [DIM, ...], dtype: float32}'",
    "dtype": f"use one of {', '.join(DTYPES)}",
    "precision": f"use one of {', '.join(PRECISIONS)}",
    "shape": "a shape is a list of dim names or integers, e.g. [BATCH, 64]",
    "dims": "dims map names to integers (sizes) or numbers (init scalars), e.g. {M: 32, N: 64, SCALE: 1.5}",
    "params": "params lists input names, e.g. [X, Y]",
    "inits": "inits is a list of '- dim: NAME' or '- value: literal'",
    "kind": "use gemm, reduction, elementwise, attention or other",
    "origin": "use naive-port, nvidia-tuned or other",
}


def _fix_for(loc: tuple, err: dict) -> str:
    for part in reversed(loc):
        if isinstance(part, str) and part in _FIXES:
            return _FIXES[part]
    if err["type"] == "extra_forbidden":
        return "remove the key or check its spelling against docs/problem-format.md"
    return "see docs/problem-format.md for the expected form"


def _number(v: Any) -> Union[int, float]:
    """One dim entry as a number; ValueError (completing "dim X = v ...") when it is not one."""
    if isinstance(v, bool):
        raise ValueError("is a boolean, not a number")
    if isinstance(v, str):
        text = v.strip()
        if _INT_RE.match(text):
            return int(text)
        try:
            v = float(text)
        except ValueError:
            raise ValueError("is not a number") from None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError("is not a finite number")
        return v
    raise ValueError(f"is a {type(v).__name__}, not a number")


def _yaml_number(v: Any) -> str:
    """``v`` as YAML writes a number (1e-6 -> 1.0e-06: YAML 1.1 reads '1e-6' as a string); other values as given."""
    try:
        n = _number(v)
    except ValueError:
        return str(v)
    text = repr(n)
    if "e" in text and "." not in text:
        mantissa, exp = text.split("e")
        text = f"{mantissa}.0e{exp if exp[0] in '+-' else '+' + exp}"
    return text


def _dim_value(v: Any) -> Union[int, float, list]:
    """A dim as written in YAML, normalised: '1e-5' -> 1e-05, '64' -> 64, [2048] -> [2048]."""
    if isinstance(v, list):
        if not v:
            raise ValueError("is an empty list")
        return [_number(x) for x in v]
    return _number(v)


# --------------------------------------------------------------------------------------------- loading
def load_problem(path: Union[str, Path]) -> Problem:
    """Load a problem folder (or a kernel file with ``spec.yaml`` / ``<stem>.yaml`` beside it)."""
    path = Path(path).resolve()
    if not path.exists():
        raise ProblemError(str(path), "no such file or folder", "pass a problem folder such as kernels/gemm_relu")
    if path.is_dir():
        root = path
        kernel = root / "kernel.py"
        if not kernel.exists():
            cands = sorted(p for p in root.glob("*.py") if not p.name.endswith("_pytorch.py") and p.name != "reference.py")
            if len(cands) != 1:
                raise ProblemError(str(root), "no kernel.py in this folder",
                                   "name the starting Triton kernel file kernel.py (with a Model class)")
            kernel = cands[0]
    else:
        kernel, root = path, path.parent
    source = read_text(kernel, "the starting kernel")
    spec_path = next((p for p in (root / "spec.yaml", kernel.with_suffix(".yaml"), root / f"{kernel.stem}.yaml")
                      if p.exists() and p != kernel), None)
    reference = next((p for p in (root / "reference.py", root / f"{kernel.stem}_pytorch.py") if p.exists()), None)
    ref_source = read_text(reference, "the PyTorch reference") if reference is not None else None
    notes = []
    if spec_path is not None:
        spec = _SpecReader(spec_path, read_text(spec_path, "the spec")).read()
    else:
        spec = _kernelbench_spec(Code(source, kernel.name),
                                 Code(ref_source, reference.name) if reference is not None else None, root)
        notes.append("no spec.yaml: shapes come from get_inputs()/get_init_inputs() (one variant, no ragged shapes)")
    notes += spec.notes
    if reference is None:
        notes.append("no reference.py: the starting kernel is the oracle")
    # a folder's own kernel.py is the folder's problem; another kernel file of it (one style of a problem) is named
    # after both, so two folders' direct.py do not share a run folder or a bench row
    name = root.name if path.is_dir() or kernel.name == "kernel.py" else f"{root.name}-{kernel.stem}"
    return Problem(name, root, kernel, source, spec, spec_path, reference, notes, ref_source)


MAX_SOURCE_BYTES = 4 << 20  # a kernel, reference or spec file larger than this is not a hand-written one


def read_text(path: Path, what: str, limit: int = MAX_SOURCE_BYTES) -> str:
    """A problem file as text: read as bytes first (bounded), decoded as UTF-8, with an error that names it."""
    path = Path(path)
    if path.is_dir():
        raise ProblemError(str(path), f"{what} is a folder, not a file", f"make {path.name} a file")
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise ProblemError(str(path), f"{what} cannot be read: {exc.strerror}", "check the file's permissions") from None
    if len(data) > limit:
        raise ProblemError(str(path), f"{what} is larger than {limit >> 20} MiB",
                           "a problem file is hand-written source or YAML; remove generated or binary content")
    if b"\0" in data:
        raise ProblemError(str(path), f"{what} holds NUL bytes (a binary file?)", "save it as UTF-8 text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ProblemError(str(path), f"{what} is not valid UTF-8 (byte {exc.start}, line {line})",
                           "save it as UTF-8 text") from None


def _kernelbench_spec(kernel: Code, reference: Code | None, root: Path) -> Spec:
    """Build a one-variant spec from KernelBench-style ``get_inputs()`` / ``get_init_inputs()``.

    They are user code: they run in a worker (on the CPU, in a temporary folder), never in this process.
    """

    for src in (reference, kernel):
        if src is None or "def get_inputs" not in src.text:
            continue
        where = str(root / src.filename)
        try:
            facts = facts_worker().request("kernelbench", 120.0, source=src.text, filename=src.filename)
        except WorkerFailure as exc:
            raise ProblemError(where, f"get_inputs()/get_init_inputs() failed: {exc.detail}",
                               "make them runnable on the CPU, or add a spec.yaml") from None
        inputs, dims = {}, {}
        try:
            for i, (shape, dtype) in enumerate(facts["inputs"]):
                names = []
                for j, size in enumerate(shape):
                    dims[f"X{i}_{j}"] = int(size)
                    names.append(f"X{i}_{j}")
                inputs[f"x{i}"] = InputSpec(f"x{i}", tuple(names), _norm_dtype(str(dtype)))
            init = list(facts["init"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProblemError(where, f"get_inputs() described inputs this format cannot hold ({exc})",
                               "add a spec.yaml (docs/problem-format.md)") from None
        variant = Variant("ci", tuple(inputs), None, dims, None, None)
        return Spec(inputs, [("value", v) for v in init], {"ci": variant}, from_kernelbench=True, ragged=False)
    raise ProblemError(str(root), "no spec.yaml and no get_inputs() to derive shapes from",
                       "add a spec.yaml (docs/problem-format.md) or KernelBench-style get_inputs()/get_init_inputs()")


# --------------------------------------------------------------------------------------------- inputs
def plan_inputs(problem: Problem, variant: Variant) -> list[TensorPlan]:
    out = []
    for inp in problem.input_specs(variant):
        shape = tuple(int(variant.dims[d]) if isinstance(d, str) else int(d) for d in inp.shape)
        dtype = variant.dtype if (variant.dtype and inp.dtype in FLOAT_DTYPES) else inp.dtype
        lo, hi = inp.range or (0, 128 if dtype == "int8" else 1024)
        lo = variant.dims[lo] if isinstance(lo, str) else lo
        hi = variant.dims[hi] if isinstance(hi, str) else hi
        out.append(TensorPlan(inp.name, shape, dtype, int(lo), int(hi)))
    return out


def default_tolerance(dtype_name: str | None, settings, tf32: bool = False) -> float:
    """rtol = atol for a variant computed in ``dtype_name``; ``tf32``: float32 whose matmuls may run as TF32 (the
    spec's ``precision: tf32`` on a GPU)."""
    if dtype_name in {"float16", "bfloat16"}:
        return settings.half_tol
    if tf32 and dtype_name == "float32":
        return settings.tf32_tol
    return settings.fp32_tol
