"""The worker process (gate 0): loads candidate kernels and runs or times them, isolated from the pipeline.

Owns: the child side of the worker protocol. Started by :mod:`xeforge.isolation` as
``python -m xeforge.worker --device KIND`` with a scrubbed environment and the run folder as its working
directory. Requests and replies are length-prefixed pickles on the original stdout/stdin; the candidate's
own prints go to stderr (the worker log). Tensors travel through ``.pt`` files in the run folder. The worker
never receives expected outputs: it returns what the candidate produced, and facts only it can observe
(input mutation, aliasing, out-of-bounds writes into canary padding, rerun bit-stability, output type).
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import struct
import sys
import time
import traceback
from pathlib import Path
from typing import Any

_CANARY = 64  # elements of NaN (or sentinel) padding on each side of every input


def _send(stream, obj: Any) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


def _recv(stream) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(n))


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


class WorkerState:
    def __init__(self, device: str) -> None:
        import torch

        from xeforge.devices import Runtime

        self.torch = torch
        self.device = device
        self.rt = Runtime(device)
        self.models: dict[str, Any] = {}
        self.counter = 0
        self._flush_ms_by_size: dict[int | None, float] = {}  # one L2-flush write's device time, measured once

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
    def load(self, slot: str, path: str, init_args: list, weights_file: str | None, dtype: str | None,
             compile_mode: str | None = None) -> dict:
        torch = self.torch
        self.counter += 1
        name = f"xeforge_candidate_{self.counter}_{Path(path).stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        if not hasattr(module, "Model"):
            raise LookupError(f"{path} defines no class Model")
        torch.manual_seed(0)
        model = module.Model(*init_args)
        if weights_file:
            state = torch.load(weights_file, map_location="cpu", weights_only=True)
            model.load_state_dict(state, strict=True)
        if dtype:
            model = model.to(dtype=getattr(torch, dtype))
        model = model.to(self.device)
        model.eval()
        if compile_mode:
            model = torch.compile(model, mode=None if compile_mode == "default" else compile_mode)
        self.models[slot] = model
        return {"ok": True}

    # -- running ---------------------------------------------------------------------------------
    def _padded(self, t):
        """A copy of ``t`` placed in the middle of a buffer whose padding is NaN (floats) or a sentinel."""
        torch = self.torch
        flat = t.reshape(-1)
        buf = torch.empty(flat.numel() + 2 * _CANARY, dtype=t.dtype, device=t.device)
        if t.dtype.is_floating_point:
            buf.fill_(float("nan"))
        elif t.dtype == torch.bool:
            buf.fill_(True)
        else:
            buf.fill_(torch.iinfo(t.dtype).max if t.dtype != torch.int64 else 2**62)
        buf[_CANARY:_CANARY + flat.numel()] = flat
        return buf, buf[_CANARY:_CANARY + flat.numel()].view(t.shape)

    def run(self, slot: str, plan: list, seed: int, distribution: str, out_file: str, rerun: bool) -> dict:
        from xeforge.problem import generate_inputs

        torch = self.torch
        model = self.models[slot]
        inputs = generate_inputs(plan, seed, distribution, self.device)
        padded = [self._padded(x) for x in inputs]
        args = [view for _, view in padded]
        before = [x.clone() for x in inputs]
        weights_before = {k: v.detach().clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            out = model(*args)
        self.rt.synchronize()
        facts: dict[str, Any] = {"ok": True}
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        facts["container"] = type(out).__name__
        facts["types"] = [type(o).__module__ + "." + type(o).__qualname__ for o in outs]
        facts["exact_tensor"] = [type(o) is torch.Tensor for o in outs]
        ranges = []
        for buf, view in padded:
            start = view.data_ptr()
            ranges.append((buf.data_ptr(), buf.data_ptr() + buf.numel() * buf.element_size(), start))
        alias = []
        for o in outs:
            if type(o) is not torch.Tensor or o.numel() == 0:
                alias.append(False)
                continue
            lo = o.data_ptr()
            hi = lo + o.numel() * o.element_size()
            alias.append(any(lo < r_hi and r_lo < hi for r_lo, r_hi, _ in ranges))
        facts["aliases_input"] = alias
        facts["inputs_mutated"] = [
            plan[i].name for i, (x, b) in enumerate(zip(args, before)) if not _same_bits(torch, x, b)
        ]
        facts["canary_overwritten"] = [
            plan[i].name for i, (buf, view) in enumerate(padded) if not _canary_intact(torch, buf, view)
        ]
        after = model.state_dict()
        facts["weights_mutated"] = [k for k, v in weights_before.items() if not _same_bits(torch, after[k], v)]
        if rerun:
            # rerun on pristine copies of the same inputs: the result must be bit-identical
            args2 = [self._padded(b)[1] for b in before]
            with torch.no_grad():
                out2 = model(*args2)
            self.rt.synchronize()
            outs2 = list(out2) if isinstance(out2, (tuple, list)) else [out2]
            facts["bit_stable"] = len(outs2) == len(outs) and all(
                type(a) is torch.Tensor and type(b) is torch.Tensor and _same_bits(torch, a, b)
                for a, b in zip(outs, outs2))
        cpu_outs = [o.detach().to("cpu").clone() if isinstance(o, torch.Tensor) else o for o in outs]
        torch.save([o if isinstance(o, torch.Tensor) else None for o in cpu_outs], out_file)
        return facts

    # -- timing ----------------------------------------------------------------------------------
    def time(self, slots: list[str], plan: list, seed: int, pairs: int, warmup: int, l2_bytes: int | None,
             budget_bytes: int | None) -> dict:
        from xeforge.problem import generate_inputs
        from xeforge.timing import delay_flushes

        torch = self.torch
        base = generate_inputs(plan, seed, "normal", self.device)
        set_bytes = sum(x.numel() * x.element_size() for x in base) or 1
        calls = pairs * len(slots)
        n_sets = calls
        if budget_bytes:
            n_sets = max(2, min(calls, budget_bytes // set_bytes))
        sets = [[x.clone() for x in base] for _ in range(n_sets)]
        models = [self.models[s] for s in slots]
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
            k = 0
            # the same cyclic order every round, so no slot ever runs twice in a row: a model called again right
            # after itself ran faster (on the H200, kb41's GEMM: 0.216 ms after itself, 0.231 ms after another
            # model, the L2 flushed both times; warm address translations of its weights, most likely); reversing
            # every other round made half of each slot's calls such repeats, its times bimodal, A/A medians 2.5% off
            for _ in range(pairs):
                for j in range(len(slots)):
                    args = sets[k % n_sets]
                    k += 1
                    self.rt.synchronize()
                    # the L2 flush, repeated so the device is still busy when the host has queued the call
                    self.rt.flush_l2(l2_bytes, repeats=delay)
                    start, end = self.rt.event(), self.rt.event()
                    start.record()
                    models[j](*args)
                    end.record()
                    self.rt.synchronize()
                    times[slots[j]].append(start.elapsed_time(end))
        return {"ok": True, "times_ms": times, "rotated_sets": n_sets, "calls": calls,
                "host_ms_max": max(host_ms, default=0.0), "flush_ms": flush_ms, "delay_flushes": delay}

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


def _same_bits(torch, a, b) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        return bool(torch.equal(a.view(-1).view(_int_view(torch, a.dtype)), b.view(-1).view(_int_view(torch, b.dtype))))
    return bool(torch.equal(a, b))


def _int_view(torch, dtype):
    return {2: torch.int16, 4: torch.int32, 8: torch.int64}[torch.empty(0, dtype=dtype).element_size()]


def _canary_intact(torch, buf, view) -> bool:
    n = view.numel()
    pads = torch.cat([buf[:_CANARY], buf[_CANARY + n:]])
    if buf.dtype.is_floating_point:
        return bool(torch.isnan(pads).all())
    if buf.dtype == torch.bool:
        return bool(pads.all())
    sentinel = torch.iinfo(buf.dtype).max if buf.dtype != torch.int64 else 2**62
    return bool((pads == sentinel).all())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    device = argv[argv.index("--device") + 1] if "--device" in argv else "cpu"
    _die_with_parent()
    proto_out = os.fdopen(os.dup(1), "wb")
    proto_in = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)  # the candidate's prints go to the worker log, never into the protocol
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    try:
        state = WorkerState(device)
    except Exception as exc:  # report start-up failure to the parent instead of dying silently
        _send(proto_out, {"ok": False, "error": type(exc).__name__, "message": str(exc), "where": "start"})
        return 1
    _send(proto_out, {"ok": True, "ready": True, "pid": os.getpid()})
    while True:
        req = _recv(proto_in)
        if req is None or req.get("op") == "exit":
            return 0
        op = req.pop("op")
        try:
            reply = getattr(state, op)(**req)
        except BaseException as exc:  # noqa: BLE001 — anything the candidate raises is data for the verdict
            reply = failure_reply(exc, state)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)) or reply.get("poisoned"):
                _send(proto_out, reply)
                return 1
        _send(proto_out, reply)


def failure_reply(exc: BaseException, state: Any) -> dict:
    """The reply for an exception in a request; ``poisoned`` when the device is unusable after it.

    A kernel that faults on a GPU (illegal instruction, illegal address) leaves a sticky error in the process's
    device context: every later launch in this worker would fail the same way, whatever it runs. The worker then
    exits after replying, and the parent starts a fresh one for the next candidate.
    """
    tb = traceback.extract_tb(exc.__traceback__)
    user = [f for f in tb if "xeforge" not in f.filename or "candidates" in f.filename]
    frame = (user or tb)[-1] if tb else None
    reply = {"ok": False, "error": type(exc).__name__, "message": str(exc)[:2000],
             "where": f"{Path(frame.filename).name}:{frame.lineno}" if frame else "",
             "traceback": "".join(traceback.format_exception(exc))[-4000:]}
    if not isinstance(exc, (KeyboardInterrupt, SystemExit)) and not state.healthy():
        reply["poisoned"] = True
    return reply


if __name__ == "__main__":
    sys.exit(main())
