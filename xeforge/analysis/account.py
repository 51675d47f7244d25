"""The run-time account of one call below Python: the aten operators and device kernels that really ran.

Owns both halves. In a worker, :class:`Recorder` runs the call under ``torch.profiler`` — every thread, and on a
GPU the device activity (CUPTI on CUDA; on XPU the PTI / Level Zero tracing ``torch.profiler`` uses). The profiler
is fed by torch's C++ RecordFunction callbacks and the device runtime's own tracing: popping the Python mode
stacks, disabling ``__torch_function__`` or dispatch modes, or calling torch through an alias hides nothing from
it. The trace recorder (:mod:`xeforge.analysis.trace`) marks each Triton launch and each autotuner timing run
with a range whose name holds a nonce of this worker process, so that what Triton's own launcher does (the
interpreter's copies, the autotuner's cache flushes) is told from what the program does. The summary kept:

- ``aten``: the outermost aten operators of the call outside any launch, allocations and views left out;
- ``in_launch``: aten compute inside a launch range (a hook or an allocator that computes);
- ``threads``: aten operators on a thread other than the call's;
- ``device``: device kernels and copies that no Triton launch, allocation or autotuner run made, by name;
- ``device_owner``: the same, as ``<outermost aten operator>|<kernel>`` (``-`` where no aten operator issued it);
- ``launched``: the device kernels inside launch ranges, by name (Triton kernels, by the name of their function);
- ``ranges``: how many call / launch / tuning ranges the profile holds (a profile without its call range was
  stopped or tampered with).

In the parent, :func:`account_problems` compares a candidate's account with the starting kernel's at the same
variant. This is still the candidate's own process, so it is evidence, not proof: SECURITY.md says what it sees
and what it cannot.
"""

from __future__ import annotations

import contextlib
import re
import secrets
from collections import Counter
from typing import Any

#: this worker's nonce: a range a candidate opens itself does not carry it
NONCE = secrets.token_hex(6)
RANGE = f"xeforge.{NONCE}."
MAX_NAMES = 256  # distinct names kept per field (a call with more is cut, and says so)

#: aten operators that allocate, view or describe: not compute
ATEN_PLAIN = {
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "scalar_tensor", "lift_fresh",
    "lift_fresh_copy", "view", "reshape", "_reshape_alias", "_unsafe_view", "as_strided", "t", "numpy_T", "mT", "T",
    "transpose", "permute", "expand", "expand_as", "unsqueeze", "squeeze", "slice", "select", "narrow", "alias",
    "detach", "view_as", "unflatten", "flatten", "split", "split_with_sizes", "chunk", "unbind", "resolve_conj",
    "resolve_neg", "_local_scalar_dense", "item", "is_nonzero", "set_", "result_type", "size", "stride", "dim",
    "unfold", "diagonal", "movedim", "swapaxes", "_has_compatible_shallow_copy_type", "record_stream",
}
#: copies: the interpreter's own inside a launch, compute outside one
ATEN_COPY = {"to", "_to_copy", "copy_", "clone", "contiguous", "_copy_from", "_copy_from_and_resize"}
_ALLOCATING = {"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
               "full_like", "new_empty", "new_zeros", "new_ones", "new_full", "scalar_tensor"}


def _aten(name: str) -> str | None:
    return name[6:] if name.startswith("aten::") else None


# ------------------------------------------------------------------------------------------------ recording
class Recorder:
    """Installed around one call (worker side). ``scope(kind)`` is the range the trace recorder opens around each
    Triton launch (``"launch"``) and autotuner timing run (``"tuning"``)."""

    def __init__(self, torch: Any, device: str, on: bool = True) -> None:
        self.torch = torch
        self.device = device
        self.on = on  # off: nothing is recorded (the cost measurement's other arm)
        self.data: dict = {}
        self._prof = None
        self._call = None

    def scope(self, kind: str) -> Any:
        if not self.on:
            return contextlib.nullcontext()
        return self.torch.profiler.record_function(RANGE + kind)

    def __enter__(self) -> "Recorder":
        if not self.on:
            return self
        from torch.profiler import ProfilerActivity, profile  # lazy: torch, in the worker only

        activities = [ProfilerActivity.CPU]
        if self.device == "cuda":
            activities.append(ProfilerActivity.CUDA)
        elif self.device == "xpu" and hasattr(ProfilerActivity, "XPU"):
            activities.append(ProfilerActivity.XPU)
        extra: dict[str, Any] = {}
        try:
            from torch.profiler import _ExperimentalConfig  # lazy, as above: every thread, not the caller's alone

            extra["experimental_config"] = _ExperimentalConfig(profile_all_threads=True)
            self.all_threads = True
        except (ImportError, TypeError):
            self.all_threads = False
        self._prof = profile(activities=activities, **extra)
        self._prof.__enter__()
        self._call = self.scope("call")
        self._call.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.on:
            return
        try:
            self._call.__exit__(*exc)
        finally:
            if self.device != "cpu":
                getattr(self.torch, self.device).synchronize()  # device activity is complete when it is read
            try:
                self._prof.__exit__(*exc)
                self.data = summarize(self._prof.events(), self.device, self.all_threads)
            except (RuntimeError, AssertionError, AttributeError) as err:  # stopped or broken during the call
                self.data = {"error": f"{type(err).__name__}: {str(err)[:300]}"}


def summarize(events: Any, device: str, all_threads: bool = True) -> dict:
    """The account of one profiled call from ``torch.profiler``'s events (worker side)."""
    aten: Counter = Counter()
    in_launch: Counter = Counter()
    threads: Counter = Counter()
    device_k: Counter = Counter()
    device_owner: Counter = Counter()
    launched: Counter = Counter()
    ranges: Counter = Counter()
    call_threads = {e.thread for e in events if e.name == RANGE + "call"}
    runtime: dict[int, Any] = {}  # correlation id -> the CPU event of the runtime call that launched the work
    for e in events:
        if str(e.device_type).endswith("CPU"):
            if e.name.startswith(RANGE):
                ranges[e.name[len(RANGE):]] += 1
            elif not e.name.startswith("aten::"):
                runtime.setdefault(e.id, e)
    for e in events:
        if not str(e.device_type).endswith("CPU"):
            if e.name.startswith(RANGE) or e.name.startswith("xeforge."):
                continue  # the device side of a range
            cause = runtime.get(e.id)
            up = [cause.name, *_chain(cause)] if cause is not None else []
            kinds = [n[len(RANGE):] for n in up if n.startswith(RANGE)]
            if "tuning" in kinds or any(_aten(n) in _ALLOCATING for n in up):
                continue  # the autotuner's timing runs; an allocation's fill
            (launched if "launch" in kinds else device_k)[e.name[:160]] += 1
            if "launch" not in kinds:
                ops = [_aten(n) for n in up if _aten(n) is not None]
                device_owner[f"{ops[-1] if ops else '-'}|{e.name[:160]}"] += 1
            continue
        op = _aten(e.name)
        if op is None:
            continue
        chain = _chain(e)
        if any(_aten(n) is not None for n in chain):
            continue  # only the outermost operator counts: its inner ones are its own
        kinds = [n[len(RANGE):] for n in chain if n.startswith(RANGE)]
        if "tuning" in kinds or op in ATEN_PLAIN:
            continue
        if "launch" in kinds:
            if op not in ATEN_COPY:
                in_launch[e.name] += 1
        elif "call" in kinds:
            aten[e.name] += 1
        elif e.thread not in call_threads and call_threads:
            threads[e.name] += 1
    return {"aten": _capped(aten), "in_launch": _capped(in_launch), "threads": _capped(threads),
            "device": _capped(device_k), "device_owner": _capped(device_owner), "launched": _capped(launched),
            "ranges": dict(ranges),
            "device_activity": device != "cpu", "all_threads": all_threads}


def _chain(e: Any) -> list[str]:
    out = []
    p = getattr(e, "cpu_parent", None)
    while p is not None and len(out) < 64:
        out.append(p.name)
        p = p.cpu_parent
    return out


def _capped(c: Counter) -> dict:
    return dict(c.most_common(MAX_NAMES))


# ------------------------------------------------------------------------------------------------ reading
_IDENT = re.compile(r"^[A-Za-z_]\w*$")


def _counter(data: Any, key: str) -> Counter:
    raw = data.get(key, {}) if isinstance(data, dict) else {}
    if not isinstance(raw, dict):
        raise ValueError(f"account field {key} is not a mapping")
    return Counter({str(k)[:200]: int(v) for k, v in raw.items()})


def account_problems(cand: Any, start: Any, kernels: set[str], launches: int) -> str | None:
    """What the candidate's call ran below Python that the starting kernel's did not (parent side).

    ``cand`` and ``start`` are the two calls' accounts (as the workers wrote them: data, checked here), ``kernels``
    the ``@triton.jit`` names of both files, ``launches`` the Triton launches the candidate's Python trace saw.
    """
    if not isinstance(cand, dict) or not cand or "error" in cand:
        why = f": {str(cand.get('error'))[:200]}" if isinstance(cand, dict) and cand.get("error") else ""
        return f"the worker returned no run-time account of the call (the profiler was stopped or broken{why})"
    try:
        c = {k: _counter(cand, k) for k in ("aten", "in_launch", "threads", "device", "launched")}
        s = {k: _counter(start, k) for k in ("aten", "in_launch", "threads", "device", "launched")}
        ranges = _counter(cand, "ranges")
    except (TypeError, ValueError, AttributeError) as exc:
        return f"the run-time account of the call was malformed ({exc})"
    if ranges["call"] != 1:
        return ("the run-time account holds no record of the call (the profiler was stopped or tampered with "
                "during it)")
    if launches and not ranges["launch"]:
        return (f"the run-time account saw none of the {launches} Triton launches the call made (the launch "
                "ranges were removed: the recorder was tampered with)")
    if cand.get("device_activity") and ranges["launch"] and not sum(c["launched"].values()):
        return ("the run-time account holds no device kernel for the call's Triton launches (the device "
                "activity was switched off during the call)")
    found = []
    for field, what in (("aten", "ran outside any Triton launch"), ("threads", "ran on another thread"),
                        ("in_launch", "ran inside a Triton launch (in a hook or allocator)")):
        extra = c[field] - s[field]
        if extra:
            found.append(f"{_shown(extra)} {what}")
    extra = c["device"] - s["device"]
    if extra:
        # a device kernel the starting call did not run, issued by an aten operator that call ran as often outside
        # any launch (the aten counts above are equal): the same torch op of the user's host code, which picked
        # another implementation at other sizes (a MoE wrapper's torch.cat at a larger block)
        owners: dict[str, set[str]] = {}
        for key in _counter(cand, "device_owner"):
            op, _, name = key.partition("|")
            owners.setdefault(name, set()).add(op)
        ran = {_aten(k) for k in s["aten"]} - {None}
        extra = Counter({k: n for k, n in extra.items() if not owners.get(k) or not owners[k] <= ran})
    if extra:
        found.append(f"the device ran {_shown(extra)}, which no Triton launch of the file made")
    strangers = Counter({k: n for k, n in c["launched"].items() if k not in kernels or not _IDENT.match(k)})
    if strangers:
        found.append(f"the device ran {_shown(strangers)} inside a Triton launch, which is no @triton.jit kernel "
                     "of the file")
    if not found:
        return None
    seen_by = "torch's C++ op callbacks" + (" and the device's activity records" if cand.get("device_activity") else "")
    return (f"the run-time account below Python ({seen_by}) shows what the starting kernel's call did not: "
            f"{'; '.join(found)}")


def _shown(c: Counter) -> str:
    items = sorted(c.items())
    shown = ", ".join(f"{k} x{n}" if n > 1 else k for k, n in items[:6])
    return shown + (f" and {len(items) - 6} more" if len(items) > 6 else "")
