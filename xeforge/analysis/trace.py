"""The traced model of ``forward``: one real call, every Triton launch and torch op in it, as plain data.

Owns both halves of the trace. In a worker, :func:`record` calls the Model once with two observers installed:

- **Triton launches**: every launch path of Triton — ``kernel[grid](...)``, ``@triton.autotune``,
  ``@triton.heuristics`` — ends in the ``run`` method of the JIT function (``JITFunction.run`` compiled,
  ``InterpretedFunction.run`` on the interpreter), with the constexprs and options as really used: the config the
  autotuner chose, the heuristics' values, module constants, variables. ``run`` is wrapped for the call; the grid
  (a tuple, or a META lambda called with the bound arguments) is resolved as Triton resolves it. Triton's own
  launch hooks (``triton.knobs.runtime.launch_enter_hook``) are not used: they do not fire on the interpreter, on
  which CI and every dry run trace. The autotuner's own timing launches (hundreds per config) are counted, not
  listed: listing them filled the trace and cut the launch that produced the output.
- **torch ops**: a ``TorchFunctionMode`` sees every torch function and tensor method ``forward`` calls (metadata
  queries such as ``.shape`` or ``.stride()`` left out), with its input and output tensors. On the meta device a
  ``torch.library.custom_op`` runs its Python body instead of its fake, so the launches inside it are seen; so does
  an op made with ``torch.library.define`` + a Python ``@torch.library.impl`` (the worker notes those functions when
  it loads a file: :func:`register_impls`).

Each launch and each autotuner timing run is also wrapped in a range of the run-time account
(:mod:`xeforge.analysis.account`, the ``scope`` argument), so that what Triton itself does there is told apart
below Python too.

Each event carries the Python call stack from ``forward`` down to it (the frames in the code under trace, with
what each frame is: a method, a ``torch.autograd.Function``'s forward, a lambda), and tensors are named by their
storage, so which op or kernel produced what a later one reads is exact. Dynamo (which captures user Triton
kernels into an FX graph) was the alternative; it needs a compile per variant, graph-breaks on the data-dependent
host code wrappers often have, and does not run on the interpreter.

In the parent, :class:`Trace` reads that JSON (never trusting its shape: a malformed trace is an error, not a
crash) and answers what the detectors and tactics ask: which kernels ran, from where, with which dtypes and
constexprs.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from xeforge.kernel_model import parse_python

MAX_EVENTS = 2048  # launches + torch ops kept per trace (a forward with more is cut, and says so)
#: bytes an element of each dtype a trace records (``Arg.dtype``, torch's name without ``torch.``) takes
ITEMSIZE = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2, "int16": 2,
            "int8": 1, "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "bool": 1}

# torch functions that read metadata or allocate nothing: not "ops" of the program
_METADATA = {"size", "stride", "dim", "numel", "is_contiguous", "data_ptr", "element_size", "__get__", "ndimension",
             "nelement", "storage_offset", "__len__", "__format__", "__repr__", "__bool__", "__index__", "__int__",
             "__float__", "type", "is_floating_point", "get_device", "untyped_storage", "__hash__", "__eq__"}
ALLOCATIONS = {"empty", "empty_like", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "new_empty",
               "new_zeros", "new_ones", "new_full", "empty_strided"}
VIEWS = {"view", "reshape", "contiguous", "t", "transpose", "permute", "flatten", "unsqueeze", "squeeze", "expand",
         "__getitem__", "T", "view_as", "reshape_as", "narrow", "select", "as_strided", "unflatten", "detach",
         "to", "float", "half", "bfloat16", "cuda", "cpu"}


# ------------------------------------------------------------------------------------------------ recording
class _Recorder:
    """Installed for one call: records launches and torch ops into ``events`` (worker side)."""

    def __init__(self, torch: Any, code_dir: str, execute: bool = True,
                 on_compiled: Callable[[str, Any], None] | None = None,
                 scope: Callable[[str], Any] | None = None) -> None:
        self.torch = torch
        self.scope = scope or (lambda kind: contextlib.nullcontext())  # the run-time account's ranges
        self.on_compiled = on_compiled  # called with (kernel name, compiled kernel) after each launch that ran
        self.code_dir = code_dir
        self.execute = execute  # False: launches are recorded, not run (a trace on the meta device)
        self.events: list[dict] = []
        self.storages: dict[int, str] = {}
        self.truncated = False
        self._benchmarking = 0
        self.tuning_launches = 0
        self._inside = 0  # > 0 inside Triton's launcher or autotuner: their torch calls are not recorded
        self._patched: list[tuple[Any, str, Any]] = []
        self._alive: list[Any] = []  # every storage named so far (see key)

    # -- identities -------------------------------------------------------------------------------------
    def key(self, t: Any) -> str:
        try:
            owner: Any = t.untyped_storage()
            ptr = owner._cdata  # the storage itself: shared by views, distinct on the meta device too
        except (AttributeError, RuntimeError, NotImplementedError):
            owner, ptr = t, id(t)
        if ptr not in self.storages:
            self.storages[ptr] = f"s{len(self.storages)}"
            # held until the call ends: a freed storage's address is reused by the next allocation, which would
            # then be named like it (kb30's fp32 GEMM buffer and the result allocated after it was freed)
            self._alive.append(owner)
        return self.storages[ptr]

    def tensor(self, t: Any) -> dict:
        return {"kind": "tensor", "storage": self.key(t), "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape), "strides": list(t.stride()), "offset": int(t.storage_offset()),
                "contiguous": bool(t.is_contiguous()), "device": t.device.type}

    def value(self, v: Any) -> dict:
        torch = self.torch
        if isinstance(v, torch.Tensor):
            return self.tensor(v)
        if v is None or isinstance(v, (bool, int, float, str)):
            return {"kind": "scalar", "value": v if not isinstance(v, float) or v == v else "nan"}
        if isinstance(v, torch.dtype):
            return {"kind": "dtype", "value": str(v).removeprefix("torch.")}
        inner = getattr(v, "value", None)  # tl.constexpr
        if inner is not None and isinstance(inner, (bool, int, float, str)):
            return {"kind": "scalar", "value": inner}
        if hasattr(v, "base") and isinstance(getattr(v, "base"), torch.Tensor):  # a tensor descriptor
            return {"kind": "descriptor", "base": self.tensor(v.base), "block": [int(b) for b in getattr(v, "block_shape", [])]}
        return {"kind": "other", "type": type(v).__qualname__}

    def stack(self) -> list[dict]:
        """The frames of the code under trace, outermost first, with what each frame is."""
        out = []
        frame = sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            if code.co_filename.startswith(self.code_dir):
                loc = frame.f_locals
                kind = "function"
                if code.co_name == "<lambda>":
                    kind = "lambda"
                elif "ctx" in loc and type(loc["ctx"]).__name__.endswith("Backward"):
                    kind = "autograd.Function"
                elif "self" in loc and isinstance(loc["self"], self.torch.nn.Module):
                    kind = "Module method"
                elif "self" in loc:
                    kind = "method"
                out.append({"function": getattr(code, "co_qualname", code.co_name), "line": frame.f_lineno,
                            "kind": kind})
            frame = frame.f_back
        return out[::-1]

    def add(self, event: dict) -> None:
        if len(self.events) >= MAX_EVENTS:
            self.truncated = True
            return
        self.events.append(event)

    # -- Triton -----------------------------------------------------------------------------------------
    def launch(self, fn: Any, args: tuple, kwargs: dict) -> None:
        if self._benchmarking:  # the autotuner timing its configs: hundreds of launches, counted, not listed
            self.tuning_launches += 1
            return

        base = getattr(fn, "fn", fn)
        names = list(getattr(fn, "arg_names", None) or inspect.signature(base).parameters)
        sig = inspect.signature(base)
        constexpr = {p.name for p in sig.parameters.values() if "constexpr" in str(p.annotation)}
        bound = dict(zip(names, args))
        options = {}
        for k, v in kwargs.items():
            if k in ("grid", "warmup"):
                continue
            if k in names:
                bound[k] = v
            else:
                options[k] = v
        grid = kwargs.get("grid")
        if callable(grid):
            try:
                grid = grid({**bound, **options})
            except Exception as exc:  # noqa: BLE001 — a META grid the trace cannot evaluate is reported as such
                grid = f"<grid function raised {type(exc).__name__}>"
        if isinstance(grid, int):
            grid = (grid,)
        self.add({"event": "launch", "kernel": base.__name__, "stack": self.stack(),
                  "args": {n: self.value(v) for n, v in bound.items()}, "constexprs": sorted(constexpr & set(bound)),
                  "options": {k: v.get("value") if v["kind"] == "scalar" else str(options[k])
                              for k, v in ((k, self.value(o)) for k, o in options.items())},
                  "grid": [int(g) for g in grid] if isinstance(grid, (tuple, list)) else str(grid)})

    def autotuned(self, tuner: Any) -> None:
        """After an autotuned launch: its config list and the one it ran."""
        for e in reversed(self.events):
            if e["event"] == "launch":
                e["autotune"] = {"configs": [_config(c) for c in tuner.configs],
                                 "chosen": _config(getattr(tuner, "best_config", None)),
                                 "key": list(getattr(tuner, "keys", []))}
                break

    # -- install ----------------------------------------------------------------------------------------
    def patch(self, owner: Any, name: str, wrapper: Any) -> None:
        self._patched.append((owner, name, getattr(owner, name)))
        setattr(owner, name, wrapper)

    def __enter__(self) -> "_Recorder":
        # lazy: triton and torch (seconds to import) are there only in the worker that records; the parent imports
        # this module to read traces back
        from triton.runtime import autotuner
        from triton.runtime.jit import JITFunction

        rec = self
        runners = [JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction  # lazy, as above

            runners.append(InterpretedFunction)
        except ImportError:
            pass
        for cls in runners:
            original = cls.run

            def run(self, *args, _original=original, **kwargs):
                if kwargs.get("warmup"):  # a compile, not a launch
                    return _original(self, *args, **kwargs)
                rec.launch(self, args, kwargs)
                if not rec.execute:
                    return None
                rec._inside += 1  # torch calls Triton's launcher makes are its own, not the program's
                try:
                    with rec.scope("launch"):
                        ret = _original(self, *args, **kwargs)
                finally:
                    rec._inside -= 1
                if rec.on_compiled is not None and not rec._benchmarking and ret is not None:
                    rec.on_compiled(getattr(getattr(self, "fn", self), "__name__", "kernel"), ret)
                return ret

            self.patch(cls, "run", run)
        tuner_run, tuner_bench = autotuner.Autotuner.run, autotuner.Autotuner._bench

        def tuned(self, *args, **kwargs):
            ret = tuner_run(self, *args, **kwargs)
            rec.autotuned(self)
            return ret

        def bench(self, *args, **kwargs):
            if not rec.execute:
                return [0.0, 0.0, 0.0]  # nothing runs: the autotuner keeps its first config
            rec._benchmarking += 1
            rec._inside += 1  # the autotuner's timing (cache flushes, events) is not the program's either
            try:
                with rec.scope("tuning"):
                    return tuner_bench(self, *args, **kwargs)
            finally:
                rec._benchmarking -= 1
                rec._inside -= 1

        self.patch(autotuner.Autotuner, "run", tuned)
        self.patch(autotuner.Autotuner, "_bench", bench)
        self.mode = _mode(self)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.mode.__exit__(*exc)
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)


def _config(c: Any) -> dict | None:
    if c is None:
        return None
    return {"kwargs": {k: v for k, v in dict(getattr(c, "kwargs", {})).items() if isinstance(v, (int, float, bool, str))},
            "num_warps": getattr(c, "num_warps", None), "num_stages": getattr(c, "num_stages", None)}


def _mode(rec: _Recorder):
    from torch.overrides import TorchFunctionMode, resolve_name  # lazy, as in _Recorder.__enter__

    torch = rec.torch

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            body = None if rec.execute or rec._inside else _custom_op_body(func)
            # a torch.library op on the meta device would run its fake (shapes only): run its Python body instead,
            # so its launches are recorded as they are on a device. The op itself is recorded either way (as a real
            # call records it: the body's own torch ops are not seen there), so a meta trace and a real one agree.
            out = body(*args, **kwargs) if body is not None else func(*args, **kwargs)
            if rec._inside:
                return out
            name = _op_name(torch, func, resolve_name)
            for mine, written in NAMESPACE_ALIASES.items():  # a file's own torch.library namespace, as written
                name = name.replace(f"{mine}.", f"{written}.")
            short = name.rsplit(".", 1)[-1]
            if short in _METADATA or name.endswith(".__get__"):
                return out
            flat_in = [a for a in _flatten(list(args) + list(kwargs.values())) if isinstance(a, torch.Tensor)]
            flat_out = [o for o in _flatten([out]) if isinstance(o, torch.Tensor)]
            kind = "allocation" if short in ALLOCATIONS else "view" if short in VIEWS else "compute"
            if name.split(".")[0] in NAMESPACE_ALIASES.values():
                kind = "own-op"  # a torch.library op the loaded file defines: its body's launches are recorded
            rec.add({"event": "torch", "op": name, "kind": kind, "stack": rec.stack(),
                     "inputs": [rec.tensor(t) for t in flat_in], "outputs": [rec.tensor(t) for t in flat_out]})
            return out

    return Mode()


def _op_name(torch: Any, func: Any, resolve_name: Callable[[Any], str | None]) -> str:
    """The name a traced torch function is reported by: ``torch.mm`` for torch.mm, which torch's own
    ``resolve_name`` gives as ``torch.spmm`` (the same function object is bound to both names)."""
    short = getattr(func, "__name__", None)
    if isinstance(short, str) and getattr(torch, short, None) is func:
        return f"torch.{short}"
    return resolve_name(func) or short or str(func)


#: torch.library namespaces the worker gave a loaded file (``ns_x3`` -> ``ns``): op names are reported as written
NAMESPACE_ALIASES: dict[str, str] = {}


#: ``ns::op`` -> the Python function a loaded file registered with ``@torch.library.impl("ns::op", ...)``
PYTHON_IMPLS: dict[str, Any] = {}


def register_impls(module: Any, source: str, filename: str) -> None:
    """Note the functions ``source`` (loaded as ``module`` from ``filename``) registers with
    ``@torch.library.impl("ns::op", ...)``: an op made with ``define`` + ``impl`` keeps no Python body torch could
    hand back (the decorator returns None), and on the meta device its fake would run instead of it. Each such
    function is compiled again from the file, undecorated, with the module's globals: the same code, at the same
    lines."""

    if ".impl(" not in source:
        return
    for node in parse_python(source).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        quals = [d.args[0].value for d in node.decorator_list
                 if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "impl" and d.args
                 and isinstance(d.args[0], ast.Constant) and isinstance(d.args[0].value, str)
                 and "::" in d.args[0].value]
        if not quals:
            continue
        plain = ast.Module(body=[ast.FunctionDef(**{**node.__dict__, "decorator_list": []})], type_ignores=[])
        local: dict[str, Any] = {}
        # the same definition the worker has just run with the whole file, compiled again without its decorators
        exec(compile(plain, filename, "exec"), module.__dict__, local)  # noqa: S102
        for q in quals:
            PYTHON_IMPLS[q] = local[node.name]


def _custom_op_body(func: Any) -> Any:
    """The Python implementation of a ``torch.library.custom_op`` overload (or of an op ``define``d and given a
    Python ``impl``), or None."""
    schema = getattr(func, "_schema", None)
    name = schema.name if schema is not None else getattr(func, "_qualified_op_name", None)  # an overload packet
    if not isinstance(name, str):
        return None
    try:
        from torch._library.custom_ops import OPDEFS  # lazy, as in _mode: torch's registry of custom_ops (2.4+)
    except ImportError:
        return None
    opdef = OPDEFS.get(name)
    return getattr(opdef, "_init_fn", None) or PYTHON_IMPLS.get(name)


def _flatten(xs: list) -> list:
    out = []
    for x in xs:
        if isinstance(x, (list, tuple)):
            out.extend(_flatten(list(x)))
        else:
            out.append(x)
    return out


def record(model: Any, args: list, torch: Any, code_dir: str, execute: bool = True) -> dict:
    """Call ``model(*args)`` once with the observers installed; the trace as JSON-ready data (worker side).

    With ``execute=False`` (a model and inputs on the meta device) the launches are recorded and not run: the host
    code, the grids and every dtype and shape are real, at any size, in milliseconds and without a device.
    """
    return record_call(model, args, torch, code_dir, execute)[0]


def record_call(model: Any, args: list, torch: Any, code_dir: str, execute: bool = True,
                on_compiled: Callable[[str, Any], None] | None = None,
                scope: Callable[[str], Any] | None = None) -> tuple[dict, Any]:
    """:func:`record`, and what the call returned (the worker's correctness run observes the call it checks).
    ``on_compiled`` receives each launch's compiled kernel (:mod:`xeforge.diagnosis.capture` writes them out);
    ``scope(kind)`` opens the run-time account's range around each launch and autotuner timing run
    (:mod:`xeforge.analysis.account`)."""
    rec = _Recorder(torch, str(Path(code_dir).resolve()) + "/", execute, on_compiled, scope)
    params = {name: rec.tensor(t) for name, t in list(model.named_parameters()) + list(model.named_buffers())}
    inputs = [rec.value(a) for a in args]
    with torch.no_grad(), rec:
        out = model(*args)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return {"events": rec.events, "truncated": rec.truncated, "tuning_launches": rec.tuning_launches,
            "params": params, "inputs": inputs, "returns": [rec.value(o) for o in outs]}, out


# ------------------------------------------------------------------------------------------------ reading
class TraceError(Exception):
    """A trace that is not the shape :func:`record` writes."""


@dataclass(frozen=True)
class Arg:
    kind: str  # tensor | scalar | dtype | descriptor | other
    dtype: str | None = None
    shape: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    storage: str | None = None
    contiguous: bool = True
    value: Any = None


@dataclass(frozen=True)
class Frame:
    function: str
    line: int
    kind: str

    def describe(self) -> str:
        what = {"autograd.Function": "torch.autograd.Function.forward", "lambda": "a lambda"}.get(self.kind, self.kind)
        return f"{self.function} (line {self.line}, {what})"


@dataclass(frozen=True)
class Launch:
    kernel: str
    stack: tuple[Frame, ...]
    args: dict[str, Arg]
    constexprs: tuple[str, ...]
    options: dict[str, Any]
    grid: tuple[int, ...] | str
    autotune: dict | None = None

    @property
    def site(self) -> Frame | None:
        """The innermost frame of the traced code: where the launch is written."""
        return self.stack[-1] if self.stack else None

    def via(self) -> str:
        """How ``forward`` reaches the launch: 'forward -> linear (line 12, function)'."""
        return " -> ".join(f.describe() for f in self.stack) or "(no frame of the traced file)"


@dataclass(frozen=True)
class TorchOp:
    op: str
    kind: str  # allocation | view | compute | own-op (an op of the file's own torch.library namespace)
    stack: tuple[Frame, ...]
    inputs: tuple[Arg, ...]
    outputs: tuple[Arg, ...]


@dataclass
class Trace:
    variant: str
    launches: list[Launch] = field(default_factory=list)
    tuning: int = 0  # launches the autotuner made to time its configs (real launches, not listed)
    ops: list[TorchOp] = field(default_factory=list)
    order: list[Launch | TorchOp] = field(default_factory=list)
    params: dict[str, Arg] = field(default_factory=dict)
    returns: list[Arg] = field(default_factory=list)
    truncated: bool = False

    @classmethod
    def from_json(cls, variant: str, data: Any) -> "Trace":
        try:
            t = cls(variant, truncated=bool(data.get("truncated")), tuning=int(data.get("tuning_launches", 0)))
            t.params = {str(k): _arg(v) for k, v in data.get("params", {}).items()}
            t.returns = [_arg(v) for v in data.get("returns", [])]
            for e in data["events"]:
                stack = tuple(Frame(str(f["function"]), int(f["line"]), str(f["kind"])) for f in e["stack"])
                if e["event"] == "launch":
                    grid = e["grid"]
                    ev: Launch | TorchOp = Launch(
                        str(e["kernel"]), stack, {str(k): _arg(v) for k, v in e["args"].items()},
                        tuple(str(c) for c in e["constexprs"]), dict(e["options"]),
                        tuple(int(g) for g in grid) if isinstance(grid, list) else str(grid), e.get("autotune"))
                    t.launches.append(ev)
                else:
                    ev = TorchOp(str(e["op"]), str(e["kind"]), stack, tuple(_arg(a) for a in e["inputs"]),
                                 tuple(_arg(a) for a in e["outputs"]))
                    t.ops.append(ev)
                t.order.append(ev)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise TraceError(f"a malformed trace ({type(exc).__name__}: {exc})") from None
        return t

    def launches_of(self, kernel: str) -> list[Launch]:
        return [la for la in self.launches if la.kernel == kernel]

    def kernels(self) -> list[str]:
        return list(dict.fromkeys(la.kernel for la in self.launches))

    def arg_dtypes(self, kernel: str, param: str) -> set[str | None]:
        """The element dtypes pointer argument ``param`` of ``kernel`` had at its launches."""
        out: set[str | None] = set()
        for la in self.launches_of(kernel):
            a = la.args.get(param)
            if a is None:
                out.add(None)
            elif a.kind == "tensor":
                out.add(a.dtype)
            elif a.kind == "descriptor":
                out.add(a.dtype)
            else:
                out.add(None)
        return out

    def compute_ops(self) -> list[TorchOp]:
        return [o for o in self.ops if o.kind == "compute"]

    def summary(self) -> list[str]:
        """Human lines: each launch with how forward reaches it, then the torch compute ops."""
        lines = []
        for la in self.launches:
            consts = ", ".join(f"{c}={la.args[c].value}" for c in la.constexprs if c in la.args)
            opts = ", ".join(f"{k}={v}" for k, v in la.options.items())
            tuned = (f"; @triton.autotune ran config {la.autotune['chosen']['kwargs']} of "
                     f"{len(la.autotune['configs'])}" if la.autotune and la.autotune.get("chosen") else "")
            lines.append(f"launch {la.kernel} grid {la.grid}" + (f" [{consts}]" if consts else "")
                         + (f" ({opts})" if opts else "") + tuned + f" via {la.via()}")
        for op in self.compute_ops():
            lines.append(f"torch {op.op} via {' -> '.join(f.describe() for f in op.stack) or 'outside the file'}")
        if self.truncated:
            lines.append(f"(trace cut after {MAX_EVENTS} events)")
        return lines


def _arg(v: Any) -> Arg:
    kind = str(v["kind"])
    if kind == "tensor":
        return Arg("tensor", str(v["dtype"]), tuple(int(s) for s in v["shape"]), tuple(int(s) for s in v["strides"]),
                   str(v["storage"]), bool(v["contiguous"]))
    if kind == "descriptor":
        base = _arg(v["base"])
        return Arg("descriptor", base.dtype, base.shape, base.strides, base.storage, base.contiguous)
    return Arg(kind, value=v.get("value"))
