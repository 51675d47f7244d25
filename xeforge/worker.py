"""The worker process (gate 0): loads kernels and runs or times them, isolated from the pipeline.

Owns: the child side of the worker protocol. Started by :mod:`xeforge.isolation` as
``python -m xeforge.worker --device KIND`` with a scrubbed environment and its own folder as working directory.
Requests and replies are length-prefixed JSON (:mod:`xeforge.wire`) on the original stdout/stdin; the code's own
prints go to stderr (the worker log). Code arrives as source text and is written to the worker's own ``src/``
folder before it is imported: the worker never imports a file the parent names. Tensors travel as safetensors
files. Two roles, each its own process: a candidate worker (``load``, ``run``, ``time``) and an oracle worker
(``reference``, ``oracle``, and the problem facts ``param_shapes`` / ``kernelbench``) that runs the user's
reference; a candidate never shares a process with the oracle. A candidate worker never receives expected
outputs: it returns what the candidate produced, a rerun of it, and the input buffers after the call, and the
parent decides from those (mutation, out-of-bounds writes into canary padding, bit stability).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from xeforge import wire
from xeforge.devices import Runtime
from xeforge.analysis import account
from xeforge.host_refs import OP_NAMESPACE
from xeforge.analysis.trace import NAMESPACE_ALIASES, record, record_call, register_impls
from xeforge.diagnosis.capture import dump_compiled, write_call_cost
from xeforge.inputs import TensorPlan, generate_inputs
from xeforge.timing import delay_flushes, timed_call
from xeforge.integrity import CANARY, canary_value, weight_changes
from xeforge.sandbox import apply_own_limits


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes  # lazy: prctl, only on Linux, only in the worker process
            import signal  # lazy: with ctypes

            ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _poisoned_allocations(torch: Any, on: bool) -> Any:
    """While on: every tensor the call allocates uninitialized (``torch.empty`` and its kin) starts as NaN (floats)
    or the canary sentinel, so an output element the call never writes shows in the rerun (the parent's diagnosis
    of a start whose two runs differ)."""
    import contextlib  # lazy: only the diagnosis uses it

    if not on:
        return contextlib.nullcontext()
    from torch.overrides import TorchFunctionMode  # lazy: torch, in the worker only

    class Poison(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if getattr(func, "__name__", "") in ("empty", "empty_like", "new_empty", "empty_strided") \
                    and isinstance(out, torch.Tensor) and out.numel():
                out.fill_(canary_value(torch, out.dtype))
            return out

    return Poison()


def _outputs(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def own_op_namespaces(source: str, n: int) -> str:
    """``source`` with the ``torch.library`` namespaces it defines made its own (``ns`` -> ``ns_x<n>``).

    Custom ops live in one process-wide registry by name: two files that define ``ns::op`` (the starting kernel
    and a candidate made from it) would both run whichever was loaded last, so the incumbent would be timed and
    checked as the candidate. Each loaded file's definitions and its ``torch.ops.ns.op`` / ``"ns::op"`` uses are
    renamed together; the trace reports them under the name the file wrote (:data:`trace.NAMESPACE_ALIASES`).
    """
    spaces = {a or b for a, b in OP_NAMESPACE.findall(source)}
    for ns in sorted(spaces):
        mine = f"{ns}_x{n}"
        NAMESPACE_ALIASES[mine] = ns
        source = re.sub(rf"""(["']){ns}(::|["'])""", rf"\g<1>{mine}\g<2>", source)
        source = re.sub(rf"\btorch\.ops\.{ns}\b", f"torch.ops.{mine}", source)
    return source


class WorkerState:
    def __init__(self, device: str) -> None:
        import torch  # lazy: torch, after the sandbox limits are in place


        self.torch = torch
        self.device = device
        self.rt = Runtime(device)
        self.models: dict[str, Any] = {}
        self.counter = 0
        self._flush_ms_by_size: dict[int | None, float] = {}  # one L2-flush write's device time, measured once
        self._oracles: dict[str, tuple[Any, list[str]]] = {}  # slot -> (the float64 copy, the output dtypes)
        self.pinned: set[str] = set()  # @triton.autotune kernels run at their first config (interpreter)
        self._buffers: dict[str, list] = {}  # plan -> padded input buffers, reused (see _buffers_for)
        self._called: set[str] = set()  # slots whose Model has been called (its first call may convert weights)
        self.filenames: dict[str, str] = {}  # the file the worker wrote -> the name the code came with
        if device == "cpu":
            self._pin_autotune()
        self._set_allocator()

    def _set_allocator(self) -> None:
        """A Triton allocator for the scratch memory kernels ask for at launch (device-side tensor descriptors on
        Hopper): torch's caching allocator, as torch's own Triton integration sets one. A start that builds its
        descriptors in the kernel then runs as it does in the user's process; a file's own ``set_allocator`` still
        replaces it."""
        import triton  # lazy: triton, with torch

        if hasattr(triton, "set_allocator"):
            torch, device = self.torch, self.device
            triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device))

    def release_cached(self) -> None:
        """Hand the caching allocator's free blocks back to the driver. Where lanes share the GPU, each worker
        otherwise keeps the peak of its last request (a float64 oracle of a large shape is gigabytes): on an
        80 GB H100, four lanes of the real-world corpus ran each other out of memory that way. What the worker
        holds on purpose (the oracle's model, the reused input buffers) stays allocated."""
        mod = getattr(self.torch, self.device, None) if self.device != "cpu" else None
        if mod is not None and hasattr(mod, "empty_cache"):
            try:
                mod.empty_cache()
            except Exception:  # noqa: BLE001 — a device the request broke says so on the next request
                pass

    def _pin_autotune(self) -> None:
        """On the interpreter, an ``@triton.autotune`` kernel with several configs runs its first (pruned) one.

        Triton's autotuner benchmarks configs with a GPU timer, which the interpreter lacks; every config is a
        legal launch of the same kernel, so correctness is checked at the first, and the verdict says so.
        """
        from triton.runtime import autotuner  # lazy: triton, with torch

        state = self

        def first_config(tuner, *args, config=None, **kwargs):
            state.pinned.add(getattr(getattr(tuner, "base_fn", None), "__name__", "?"))
            return [0.0, 0.0, 0.0]  # equal times: the autotuner keeps the first config it was given

        autotuner.Autotuner._bench = first_config

    def healthy(self) -> bool:
        """Whether the device still runs a trivial op (False after a sticky fault of a candidate's kernel)."""
        if self.device == "cpu":
            return True
        try:
            ok = float(self.torch.ones(8, device=self.device).sum().item()) == 8.0
            self.rt.synchronize()
            return ok
        except Exception:  # noqa: BLE001 — any failure here means the context is gone
            return False

    # -- loading ---------------------------------------------------------------------------------
    # (see own_op_namespaces: each loaded file gets its own torch.library namespaces)
    def _module(self, source: str, filename: str, need_model: bool = True):
        """Import ``source`` from a file of the worker's own (Triton's JIT reads kernels back from their file)."""
        self.counter += 1
        stem = re.sub(r"[^A-Za-z0-9_]", "_", Path(filename).stem)[:60] or "code"
        folder = Path("src")
        folder.mkdir(exist_ok=True)
        path = (folder / f"{self.counter:04d}_{stem}.py").resolve()
        mine = own_op_namespaces(source, self.counter)
        path.write_text(mine)
        self.filenames[str(path)] = Path(filename).name  # errors name the file as the user knows it
        name = f"xeforge_code_{self.counter}_{stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        register_impls(module, mine, str(path))
        if need_model and not hasattr(module, "Model"):
            raise LookupError(f"{filename} defines no class Model")
        return module

    def load(self, slot: str, source: str, filename: str, init_args: list, weights_file: str | None,
             dtype: str | None, compile_mode: str | None = None, weight_order: list | None = None,
             seed: int = 0) -> dict:
        """Build ``Model(*init_args)`` into ``slot``: seeded with ``seed``, the oracle's weights loaded, cast, moved.

        ``seed`` is the one the oracle's Model was built with: ``load_state_dict`` carries parameters and persistent
        buffers, and nothing else ``__init__`` draws or derives (a non-persistent buffer, a plain tensor attribute,
        a packed copy of a weight), so the same seed makes those the oracle's too (a start is its own oracle).
        """
        torch = self.torch
        module = self._module(source, filename)
        torch.manual_seed(seed)
        model = module.Model(*init_args)
        renamed: dict[str, str] = {}
        if weights_file:
            from safetensors.torch import load_file  # lazy: safetensors pulls in torch

            state = load_file(weights_file)
            own = model.state_dict()
            if set(state) != set(own) and weight_order and set(weight_order) == set(state) and len(own) == len(state) \
                    and all(state[a].shape == b.shape for a, b in zip(weight_order, own.values())):
                # the kernel names its parameters differently (self.weight for the reference's fc.weight): the
                # reference's, in its order, onto the kernel's, in its order — a wrong pairing fails gate 2
                renamed = dict(zip(weight_order, own))
                state = {renamed[k]: v for k, v in state.items()}
            model.load_state_dict(state, strict=True)
        if dtype:
            model = model.to(dtype=getattr(torch, dtype))
        model = model.to(self.device)
        model.eval()
        if compile_mode:
            model = torch.compile(model, mode=None if compile_mode == "default" else compile_mode)
        self.models[slot] = model
        self._called.discard(slot)
        # weights that hold NaN / Inf once loaded: nn.Parameter(torch.empty(...)) that nothing initializes
        nonfinite = [k for k, t in [*model.named_parameters(), *model.named_buffers()]
                     if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all())]
        return {"ok": True, "weights_by_position": renamed, "nonfinite_weights": nonfinite[:16]}

    # -- running ---------------------------------------------------------------------------------
    def _padded(self, t):
        """A copy of ``t`` placed in the middle of a buffer whose padding is NaN (floats) or a sentinel."""
        torch = self.torch
        flat = t.reshape(-1)
        buf = torch.empty(flat.numel() + 2 * CANARY, dtype=t.dtype, device=t.device)
        buf.fill_(canary_value(torch, t.dtype))
        buf[CANARY:CANARY + flat.numel()] = flat
        return buf, buf[CANARY:CANARY + flat.numel()].view(t.shape)

    def _buffers_for(self, plan: list, inputs: list) -> list:
        """The padded input buffers for this plan, reused by every call: fresh values at the same addresses, so a
        result cached by address or shape, or state kept from an earlier call, is stale and fails the comparison."""
        key = json.dumps([[tp.name, list(tp.shape), tp.dtype] for tp in plan])
        bufs = self._buffers.pop(key, None)
        if bufs is None or any(view.shape != x.shape for (_, view), x in zip(bufs, inputs)):
            bufs = [self._padded(x) for x in inputs]
        else:
            for (buf, view), x in zip(bufs, inputs):
                buf.fill_(canary_value(self.torch, buf.dtype))
                view.copy_(x)
        self._buffers[key] = bufs  # most recent last; a few shapes kept (a port checks 3-5 variants)
        while len(self._buffers) > 6:
            self._buffers.pop(next(iter(self._buffers)))
        return bufs

    def run(self, slot: str, plan: list, seed: int, distribution: str, out_file: str, rerun: bool,
            compiled_dir: str | None = None, compiled_irs: list[str] | None = None, account_call: bool = True,
            poisoned: bool = False) -> dict:
        """Call the model once (twice with ``rerun``) and write what it returned and its input buffers after it.

        ``out_file`` holds ``out.i`` (the outputs), ``rerun.i`` (a second call on pristine copies of the same
        inputs) and ``input.j`` (each input's padded buffer after the first call); the parent decides mutation,
        canaries and bit stability from them. The facts only this process can see (output types, pointer
        aliasing, weights changed) come back in the reply, with the first call's trace (launch accounting and the
        torch ops it ran, for the parent's run-time checks). The slot's first call may convert its weights (same
        values, another dtype or device: a start that moves its parameters once); that is reported, not refused.
        """

        torch = self.torch
        model = self.models[slot]
        plan = [TensorPlan.from_wire(d) for d in plan]
        inputs = generate_inputs(plan, seed, distribution, self.device)
        padded = self._buffers_for(plan, inputs)
        args = [view for _, view in padded]
        weights_before = {k: v.detach().clone() for k, v in model.state_dict().items()}
        first_call = slot not in self._called
        self._called.add(slot)
        dump = None
        if compiled_dir:  # what the compiler made of each kernel this call launched (read back as data)
            import triton  # lazy: as torch, in the worker only

            seen: set[int] = set()

            def dump(name, kernel):
                if id(kernel) not in seen:
                    seen.add(id(kernel))
                    dump_compiled(name, kernel, Path(compiled_dir), triton.__version__, irs=compiled_irs)
        # the call, observed: what launched, what torch computed (the Python trace), and below Python what ran
        t_call = time.perf_counter()
        with account.Recorder(torch, self.device, on=account_call) as acct:
            data, out = record_call(model, args, torch, "src", on_compiled=dump, scope=acct.scope)
            self.rt.synchronize()
        if compiled_dir:
            write_call_cost(Path(compiled_dir), time.perf_counter() - t_call)
        outs = _outputs(out)
        facts: dict[str, Any] = {"ok": True, "container": type(out).__name__, "n_outputs": len(outs),
                                 "types": [type(o).__module__ + "." + type(o).__qualname__ for o in outs],
                                 "exact_tensor": [type(o) is torch.Tensor for o in outs], "trace": data,
                                 "account": acct.data}
        ranges = [(buf.data_ptr(), buf.data_ptr() + buf.numel() * buf.element_size()) for buf, _ in padded]
        alias = []
        for o in outs:
            if not isinstance(o, torch.Tensor) or o.numel() == 0:
                alias.append(False)
                continue
            lo = o.data_ptr()
            hi = lo + o.numel() * o.element_size()
            alias.append(any(lo < r_hi and r_lo < hi for r_lo, r_hi in ranges))
        facts["aliases_input"] = alias
        if self.pinned:
            facts["autotune_pinned"] = sorted(self.pinned)
        changed, converted = weight_changes(weights_before, model.state_dict(), first_call)
        facts["weights_mutated"] = changed
        if converted:
            facts["weights_converted"] = converted
        tensors = {f"out.{i}": o for i, o in enumerate(outs) if isinstance(o, torch.Tensor)}
        tensors.update({f"input.{j}": buf for j, (buf, _) in enumerate(padded)})
        if rerun:
            fresh = generate_inputs(plan, seed, distribution, self.device)
            with torch.no_grad(), _poisoned_allocations(torch, poisoned):
                out2 = model(*[self._padded(x)[1] for x in fresh])
            self.rt.synchronize()
            outs2 = _outputs(out2)
            facts["n_rerun_outputs"] = len(outs2)
            tensors.update({f"rerun.{i}": o for i, o in enumerate(outs2) if isinstance(o, torch.Tensor)})
        wire.save_tensors(out_file, tensors)
        return facts

    def trace(self, slot: str, plan: list, seed: int, distribution: str) -> dict:
        """One call of the model with every launch and torch op recorded (:mod:`xeforge.analysis.trace`), and its
        run-time account (:mod:`xeforge.analysis.account`)."""

        inputs = generate_inputs([TensorPlan.from_wire(d) for d in plan], seed, distribution, self.device)
        self._called.add(slot)
        with account.Recorder(self.torch, self.device) as acct:
            data = record_call(self.models[slot], inputs, self.torch, "src", scope=acct.scope)[0]
            self.rt.synchronize()
        return {"ok": True, "trace": data, "account": acct.data, "autotune_pinned": sorted(self.pinned)}

    def trace_meta(self, source: str, filename: str, init_args: list, dtype: str | None, plan: list) -> dict:
        """A trace on the meta device: the Model built and called there, launches recorded but not run."""

        torch = self.torch
        model = self._meta_model(source, filename, init_args, dtype)
        inputs = [torch.empty(tp.shape, dtype=getattr(torch, tp.dtype), device="meta")
                  for tp in (TensorPlan.from_wire(d) for d in plan)]
        return {"ok": True, "trace": record(model, inputs, torch, "src", execute=False)}

    def _meta_model(self, source: str, filename: str, init_args: list, dtype: str | None, on: str | None = None):
        """The Model built on the meta device in the variant dtype, in eval mode; ``on``: then given uninitialized
        storage there (``to_empty``)."""
        torch = self.torch
        module = self._module(source, filename)
        with torch.device("meta"):
            model = module.Model(*init_args)
        if on is not None:
            model = model.to_empty(device=on)
        if dtype:
            model = model.to(dtype=getattr(torch, dtype))
        return model.eval()

    def trace_host(self, source: str, filename: str, init_args: list, dtype: str | None, plan: list) -> dict:
        """A trace with real values on the CPU, for host code that reads tensor data (routing offsets turned into
        a block map, ``.item()``, ``.tolist()``), which the meta device cannot run: the Model built on the meta
        device and given uninitialized CPU storage, floating inputs zeros, integer inputs drawn as a run draws
        them; launches recorded, not run."""

        torch = self.torch
        model = self._meta_model(source, filename, init_args, dtype, on="cpu")
        plans = [TensorPlan.from_wire(d) for d in plan]
        drawn = iter(generate_inputs([tp for tp in plans if not tp.is_float], 0, "normal", "cpu"))
        inputs = [torch.zeros(tp.shape, dtype=getattr(torch, tp.dtype)) if tp.is_float else next(drawn)
                  for tp in plans]
        return {"ok": True, "trace": record(model, inputs, torch, "src", execute=False)}

    # -- the oracle ------------------------------------------------------------------------------
    def reference(self, slot: str, source: str, filename: str, init_args: list, seed: int, dtype: str | None,
                  weights_out: str) -> dict:
        """Build the oracle's Model with ``seed`` in the variant dtype; its weights go to ``weights_out``."""
        torch = self.torch
        module = self._module(source, filename)
        torch.manual_seed(seed)
        model = module.Model(*init_args)
        if dtype:
            model = model.to(dtype=getattr(torch, dtype))
        model.eval()
        state = {k: v for k, v in model.state_dict().items()}
        if state:
            wire.save_tensors(weights_out, state)
        self.models[slot] = model
        self._oracles.pop(slot, None)
        return {"ok": True, "weights": bool(state),
                "params": {k: [list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in state.items()}}

    def oracle(self, slot: str, plan: list, seed: int, distribution: str, out_file: str, float64: bool,
               compute_device: str | None = None) -> dict:
        """Expected outputs for these inputs: the reference in float64 (``float64``), or the model as built.

        The output dtypes the kernel must return come from one run in the variant dtype; the float64 copy (weights
        rounded to that dtype, then cast up, TF32 off) stays on the device for every later call.
        """


        torch = self.torch
        plan = [TensorPlan.from_wire(d) for d in plan]
        inputs = generate_inputs(plan, seed, distribution, self.device)
        model = self.models[slot]
        with torch.no_grad():
            if not float64:
                outs = _outputs(model.to(self.device)(*inputs))
                self.rt.synchronize()
                wire.save_tensors(out_file, {f"out.{i}": o for i, o in enumerate(outs)})
                return {"ok": True, "dtypes": [str(o.dtype).removeprefix("torch.") for o in outs]}
            if slot not in self._oracles:
                low = _outputs(model.to(self.device)(*inputs))
                dtypes = [str(o.dtype).removeprefix("torch.") for o in low]
                del low
                self._oracles[slot] = (copy.deepcopy(model).to(compute_device or self.device, torch.float64), dtypes)
                model.to("cpu")
            m64, dtypes = self._oracles[slot]
            inputs = [x.to(compute_device or self.device) for x in inputs]  # drawn on the device, like the candidate's
            cuda = (compute_device or self.device) == "cuda"
            prev = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) if cuda else None
            if cuda:
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.backends.cudnn.allow_tf32 = False
            try:
                x64 = [x.to(torch.float64) if x.dtype.is_floating_point else x for x in inputs]
                refs = _outputs(m64(*x64))
                self.rt.synchronize()
            finally:
                if cuda:
                    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev
        bad = [i for i, r in enumerate(refs) if not isinstance(r, torch.Tensor)]
        if bad:
            raise TypeError(f"the reference's forward returned {type(refs[bad[0]]).__name__} at output {bad[0]}, "
                            "not a tensor")
        wire.save_tensors(out_file, {f"out.{i}": r for i, r in enumerate(refs)})
        return {"ok": True, "dtypes": dtypes}

    # -- problem facts ---------------------------------------------------------------------------
    def param_shapes(self, source: str, filename: str, init_args: list) -> dict:
        """Shapes of the Model's parameters and buffers, built on the meta device (nothing is allocated)."""
        torch = self.torch
        module = self._module(source, filename)
        with torch.device("meta"):
            model = module.Model(*init_args)
        return {"ok": True, "shapes": {k: list(v.shape) for k, v in model.state_dict().items()}}

    def kernelbench(self, source: str, filename: str) -> dict:
        """KernelBench's ``get_inputs()`` / ``get_init_inputs()``: input shapes and dtypes, init values as JSON."""
        torch = self.torch
        module = self._module(source, filename, need_model=False)
        tensors = list(module.get_inputs())
        init = list(module.get_init_inputs()) if hasattr(module, "get_init_inputs") else []
        inputs = []
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"get_inputs()[{i}] is a {type(t).__name__}, not a tensor")
            inputs.append([list(t.shape), str(t.dtype).removeprefix("torch.")])
        try:
            json.dumps(init, allow_nan=False)
        except (TypeError, ValueError):
            raise TypeError("get_init_inputs() returned values that are not plain numbers, strings or lists") from None
        return {"ok": True, "inputs": inputs, "init": init}

    # -- timing ----------------------------------------------------------------------------------
    def time(self, slots: list[str], plan: list, seed: int, pairs: int, warmup: int, l2_bytes: int | None,
             budget_bytes: int | None) -> dict:

        torch = self.torch
        base = generate_inputs([TensorPlan.from_wire(d) for d in plan], seed, "normal", self.device)
        set_bytes = sum(x.numel() * x.element_size() for x in base) or 1
        calls = pairs * len(slots)
        n_sets = calls
        if budget_bytes:
            n_sets = max(2, min(calls, budget_bytes // set_bytes))
        sets = [[x.clone() for x in base] for _ in range(n_sets)]
        models = [self.models[s] for s in slots]
        self._called.update(slots)
        host_ms: list[float] = []
        with torch.no_grad():
            for m in models:
                for w in range(max(warmup, 2)):
                    self.rt.synchronize()
                    t0 = time.perf_counter()
                    m(*sets[0])
                    if w:  # the first call may compile; the host time of later ones is the launch overhead
                        host_ms.append((time.perf_counter() - t0) * 1e3)
            self.rt.synchronize()
            flush_ms = self._flush_ms(l2_bytes)
            delay = delay_flushes(max(host_ms, default=0.0), flush_ms)
            times: dict[str, list[float]] = {s: [] for s in slots}
            k = late = 0
            # the same cyclic order every round, so no slot ever runs twice in a row: a model called again right
            # after itself ran faster (on the H200, kb41's GEMM: 0.216 ms after itself, 0.231 ms after another
            # model, the L2 flushed both times; warm address translations of its weights, most likely); reversing
            # every other round made half of each slot's calls such repeats, its times bimodal, A/A medians 2.5% off
            for _ in range(pairs):
                for j in range(len(slots)):
                    args = sets[k % n_sets]
                    k += 1
                    # the L2 flush, repeated so the device is still busy when the host has queued the call
                    ms, n_late, delay = timed_call(self.rt, lambda m=models[j], a=args: m(*a), l2_bytes, delay,
                                                   flush_ms)
                    late += n_late
                    times[slots[j]].append(ms)
        return {"ok": True, "times_ms": times, "rotated_sets": n_sets, "calls": calls,
                "host_ms_max": max(host_ms, default=0.0), "flush_ms": flush_ms, "delay_flushes": delay,
                "late_starts": late}

    def profile(self, slot: str, plan: list, seed: int, iters: int) -> dict:
        """Per-kernel device times of ``iters`` calls (torch.profiler, after one warm-up call): the events with
        device time, averaged per call, largest first. A device-timeline view for the diagnosis, not gate 3's
        timer (no L2 flush, no interleaving)."""
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile  # lazy: torch, in the worker only

        acts = [a for name in ("CUDA", "XPU")
                if self.device == name.lower() and (a := getattr(ProfilerActivity, name, None))]
        if not acts:
            return {"ok": True, "events": [], "iters": 0, "why": f"no device timeline on {self.device}"}
        inputs = generate_inputs([TensorPlan.from_wire(d) for d in plan], seed, "normal", self.device)
        model = self.models[slot]
        self._called.add(slot)
        with torch.no_grad():
            model(*inputs)
            self.rt.synchronize()
            with profile(activities=[ProfilerActivity.CPU, *acts]) as prof:
                for _ in range(iters):
                    model(*inputs)
                self.rt.synchronize()
        events = []
        for e in prof.key_averages():
            dev = getattr(e, "self_device_time_total", None)
            if dev is None:
                dev = getattr(e, "self_cuda_time_total", 0)
            if dev and dev > 0:
                events.append({"name": str(e.key)[:300], "device_us": float(dev) / iters,
                               "calls": int(e.count) / iters})
        events.sort(key=lambda e: -e["device_us"])
        return {"ok": True, "events": events[:64], "iters": iters}

    def deep(self, slot: str, plan: list, seed: int) -> dict:
        """One call inside the ``xeforge_deep`` NVTX range, after a warm-up call outside it (which compiles):
        the vendor profiler the worker runs under (``--profile deep``) collects the kernels of that call only."""
        torch = self.torch
        from xeforge.diagnosis.deep import RANGE  # lazy: only this request needs it

        inputs = generate_inputs([TensorPlan.from_wire(d) for d in plan], seed, "normal", self.device)
        model = self.models[slot]
        self._called.add(slot)
        nvtx = getattr(getattr(torch, self.device, None), "nvtx", None)
        if nvtx is None:
            return {"ok": True, "why": f"no NVTX ranges on {self.device}"}
        with torch.no_grad():
            model(*inputs)
            self.rt.synchronize()
            nvtx.range_push(RANGE)
            model(*inputs)
            self.rt.synchronize()
            nvtx.range_pop()
        return {"ok": True}

    def _flush_ms(self, l2_bytes: int | None) -> float:
        """Device time of one L2-flush write (median of 5; measured on the worker's first timing request)."""
        if l2_bytes in self._flush_ms_by_size:
            return self._flush_ms_by_size[l2_bytes]
        samples = []
        for _ in range(5):
            start, end = self.rt.event(), self.rt.event()
            start.record()
            self.rt.flush_l2(l2_bytes)
            end.record()
            self.rt.synchronize()
            samples.append(start.elapsed_time(end))
        self._flush_ms_by_size[l2_bytes] = sorted(samples)[2]
        return self._flush_ms_by_size[l2_bytes]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    device = argv[argv.index("--device") + 1] if "--device" in argv else "cpu"
    shared = "--shared-gpu" in argv  # other lanes' workers use this GPU too (xeforge.device_lock)
    _die_with_parent()

    apply_own_limits()
    proto_out = os.fdopen(os.dup(1), "wb")
    proto_in = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)  # the code's prints go to the worker log, never into the protocol
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    try:
        state = WorkerState(device)
    except Exception as exc:  # report start-up failure to the parent instead of dying silently
        wire.write_message(proto_out, {"ok": False, "error": type(exc).__name__, "message": str(exc)[:2000],
                                       "where": "start"})
        return 1
    wire.write_message(proto_out, {"ok": True, "ready": True, "pid": os.getpid()})
    while True:
        try:
            req = wire.read_message(proto_in)
        except wire.ProtocolError:
            return 1
        if req is None or req.get("op") == "exit":
            # nothing of the worker's is kept: skip the interpreter's teardown (a second with torch loaded, paid
            # for every worker a port or the test suite closes)
            sys.stderr.flush()
            os._exit(0)
        op = req.pop("op")
        try:
            if op not in OPS:
                raise LookupError(f"unknown request {op!r}")
            reply = getattr(state, op)(**req)
        except BaseException as exc:  # noqa: BLE001 — anything the code raises is data for the verdict
            reply = failure_reply(exc, state)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)) or reply.get("poisoned"):
                wire.write_message(proto_out, reply)
                return 1
        if shared:
            state.release_cached()
        wire.write_message(proto_out, reply)


OPS = frozenset({"load", "run", "time", "trace", "trace_meta", "trace_host", "reference", "oracle", "param_shapes",
                 "kernelbench", "profile", "deep"})


def failure_reply(exc: BaseException, state: Any) -> dict:
    """The reply for an exception in a request; ``poisoned`` when the device is unusable after it.

    A kernel that faults on a GPU (illegal instruction, illegal address) leaves a sticky error in the process's
    device context: every later launch in this worker would fail the same way, whatever it runs. The worker then
    exits after replying, and the parent starts a fresh one for the next candidate.
    """
    tb = traceback.extract_tb(exc.__traceback__)
    code = str(Path("src").resolve()) + os.sep  # where the worker writes the code it imports
    user = [f for f in tb if f.filename.startswith(code)]
    frame = (user or tb)[-1] if tb else None
    names = getattr(state, "filenames", {})
    reply = {"ok": False, "error": type(exc).__name__, "message": str(exc)[:2000],
             "where": f"{names.get(frame.filename, Path(frame.filename).name)}:{frame.lineno}" if frame else "",
             "traceback": "".join(traceback.format_exception(exc))[-4000:]}
    if not isinstance(exc, (KeyboardInterrupt, SystemExit)) and not state.healthy():
        reply["poisoned"] = True
    return reply


if __name__ == "__main__":
    sys.exit(main())
