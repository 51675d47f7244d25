"""One interface over the three device kinds: ``xpu`` (Intel, torch.xpu), ``cuda`` and ``cpu`` (Triton interpreter).

Owns: picking a device (``auto`` = xpu, then cuda, then cpu), synchronisation, event timers, the L2 flush,
device properties (core count, L2, SLM/shared memory, sub-group sizes, fp64) and version strings. Import
torch lazily: the CLI must start without it for ``--help``. The interpreter device never times anything.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

from xeforge.errors import DeviceError

KINDS = ("auto", "xpu", "cuda", "cpu")


@dataclass
class DeviceInfo:
    kind: str  # xpu | cuda | cpu
    name: str
    cores: int | None = None  # SMs / Xe-cores / CPU cores
    l2_bytes: int | None = None
    shared_mem_bytes: int | None = None  # per block / work-group
    total_memory_bytes: int | None = None
    subgroup_sizes: list[int] = field(default_factory=list)
    has_fp64: bool = True
    architecture: str | None = None
    driver: str | None = None
    torch: str = ""
    triton: str = ""
    interpreter: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def can_time(self) -> bool:
        return not self.interpreter

    def props_for_kb(self) -> dict[str, Any]:
        return {"backend": self.kind, "name": self.name, "architecture": self.architecture, "cores": self.cores}


def _torch():
    # lazy: torch (seconds to import) only when a device is probed; `xeforge --help` and the CLI's parsing import
    # this module without it
    import torch

    return torch


def available(kind: str) -> bool:
    if kind == "cpu":
        return True
    torch = _torch()
    mod = getattr(torch, kind, None)
    return bool(mod is not None and mod.is_available())


def resolve(kind: str) -> str:
    """``auto`` -> xpu, then cuda, then cpu. An explicit kind that is not available is an error."""
    if kind not in KINDS:
        raise DeviceError("--device", f"unknown device {kind!r}", f"use one of {', '.join(KINDS)}")
    if kind == "auto":
        for k in ("xpu", "cuda"):
            if available(k):
                return k
        return "cpu"
    if not available(kind):
        raise DeviceError("--device", f"{kind} was asked for but torch.{kind}.is_available() is False",
                          "run on a machine with that GPU, or use --device cpu (correctness only) or --device auto")
    return kind


def versions() -> dict[str, str]:
    """The Python, torch and Triton versions, read from the installed distributions' metadata (importing torch
    takes seconds, and a port on the interpreter never needs it in this process)."""
    import importlib.metadata  # lazy: the workers import this module and never ask

    out = {"python": platform.python_version()}
    for name in ("torch", "triton"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def describe(kind: str) -> DeviceInfo:
    """Properties of device 0 of ``kind`` (already resolved)."""
    ver = versions()
    if kind == "cpu":
        return DeviceInfo("cpu", f"Triton interpreter on {platform.processor() or platform.machine()}",
                          cores=os.cpu_count(), torch=ver["torch"], triton=ver["triton"], interpreter=True,
                          architecture=platform.machine())
    torch = _torch()
    if kind == "cuda":
        p = torch.cuda.get_device_properties(0)
        driver = None
        try:
            driver = torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None
        except Exception:  # driver query is best-effort
            driver = None
        return DeviceInfo(
            "cuda", p.name, cores=p.multi_processor_count, l2_bytes=getattr(p, "L2_cache_size", None),
            shared_mem_bytes=getattr(p, "shared_memory_per_block_optin", None), total_memory_bytes=p.total_memory,
            subgroup_sizes=[32], has_fp64=True, architecture=f"sm_{p.major}{p.minor}",
            driver=str(driver) if driver else torch.version.cuda and f"CUDA {torch.version.cuda}",
            torch=ver["torch"], triton=ver["triton"])
    if kind == "xpu":
        p = torch.xpu.get_device_properties(0)
        cores, slm, sg = None, None, list(getattr(p, "sub_group_sizes", []) or [])
        try:
            import triton  # lazy: triton imports torch

            dp = triton.runtime.driver.active.utils.get_device_properties(0)
            cores, slm = dp.get("multiprocessor_count"), dp.get("max_shared_mem")
            sg = list(dp.get("sub_group_sizes", sg))
        except Exception:  # Intel backend property query is best-effort; torch props still describe the part
            cores = getattr(p, "gpu_subslice_count", None) or getattr(p, "max_compute_units", None)
        return DeviceInfo(
            "xpu", p.name, cores=cores, l2_bytes=getattr(p, "l2_cache_size", None), shared_mem_bytes=slm,
            total_memory_bytes=getattr(p, "total_memory", None), subgroup_sizes=sg,
            has_fp64=bool(getattr(p, "has_fp64", True)), architecture=str(getattr(p, "architecture", "") or "") or None,
            driver=getattr(p, "driver_version", None), torch=ver["torch"], triton=ver["triton"])
    raise DeviceError("--device", f"unknown device {kind!r}", f"use one of {', '.join(KINDS)}")


class Runtime:
    """Device operations used inside a worker: sync, events, L2 flush. One per process."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.torch = _torch()
        self._flush_buf = None

    @property
    def mod(self):
        return getattr(self.torch, self.kind)

    def synchronize(self) -> None:
        if self.kind != "cpu":
            self.mod.synchronize()

    def event(self):
        return self.mod.Event(enable_timing=True)

    def flush_l2(self, l2_bytes: int | None, repeats: int = 1) -> None:
        """Overwrite a buffer of at least twice the L2 size, so no timed call starts with a warm cache.

        ``repeats`` > 1 queues the write several times: device work that keeps the device busy while the host
        issues the timed call (see :func:`xeforge.timing.delay_flushes`).
        """
        if self.kind == "cpu":
            return
        if self._flush_buf is None:
            n = max(2 * (l2_bytes or 64 * 2**20), 64 * 2**20)
            self._flush_buf = self.torch.empty(n // 4, dtype=self.torch.int32, device=self.kind)
        for _ in range(max(1, repeats)):
            self._flush_buf.zero_()

    def free_memory(self) -> int | None:
        if self.kind == "cuda":
            return self.torch.cuda.mem_get_info()[0]
        if self.kind == "xpu" and hasattr(self.torch.xpu, "mem_get_info"):
            return self.torch.xpu.mem_get_info()[0]
        return None
