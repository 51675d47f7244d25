"""The OS sandbox around every worker (gate 0): bubblewrap namespaces plus resource limits.

Owns: finding bubblewrap and checking once that it works here, the command line that wraps a worker, the
resource limits each worker sets on itself at start-up (:func:`apply_own_limits`), and the report of what was
applied and what could not be had — shown by ``xeforge env`` and recorded in every verdict. The worker, inside:

- has no network (its own network namespace: not even the host's loopback);
- sees no other process (its own PID namespace and ``/proc``): the parent's environment and memory are out of
  reach, and every process it starts dies with it (the namespace's first process is bubblewrap's reaper;
  ``--die-with-parent`` ends it with xeforge);
- can write only its own folder, the run's Triton cache and a private ``/tmp`` (the rest of the file system is
  read-only); ``$HOME`` is an empty tmpfs except the paths Python and xeforge are installed in;
- runs with every capability dropped, a new session (no terminal injection), a minimal ``/dev`` plus the GPU's
  device files, and rlimits on memory (CPU workers), CPU time, file size, open files, core dumps and processes.

``XEFORGE_SANDBOX`` chooses: ``auto`` (default: bubblewrap where it works, else plain processes with the limits,
said in every verdict), ``require`` (refuse to run code without it) or ``off``. bubblewrap is Debian's
``bubblewrap`` package (``make setup`` installs it where it can); ``XEFORGE_BWRAP`` names another binary.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import resource
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xeforge.errors import DeviceError

MODES = ("auto", "require", "off")
GPU_DEVICE_GLOBS = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/dri")


@dataclass(frozen=True)
class Limits:
    """Per-worker resource caps (rlimits). ``memory_bytes`` applies to CPU workers only (see ``limits_for``)."""

    memory_bytes: int | None
    cpu_seconds: int
    file_bytes: int
    open_files: int = 4096
    processes: int = 1024


@dataclass
class SandboxReport:
    mode: str
    tool: str | None = None  # "bubblewrap 0.8.0"
    applied: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def isolated(self) -> bool:
        return self.tool is not None

    def summary(self) -> str:
        head = f"sandbox: {self.tool}" if self.tool else "sandbox: none (a plain process)"
        text = head + (f"; {', '.join(self.applied)}" if self.applied else "")
        if self.missing:
            text += f"; not applied: {'; '.join(self.missing)}"
        return text

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def bwrap_binary() -> str | None:
    named = os.environ.get("XEFORGE_BWRAP")
    if named:
        return named if os.access(named, os.X_OK) else None
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=8)
def _works(binary: str) -> tuple[bool, str]:
    """(usable, version or why not): bubblewrap must be able to build the namespaces here."""
    try:
        ver = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        probe = subprocess.run([binary, *_namespace_args(), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
                                "true"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{binary} did not run ({exc})"
    if probe.returncode != 0:
        why = " ".join(probe.stderr.split())[:300] or f"exit code {probe.returncode}"
        return False, f"{binary} cannot create namespaces here ({why}; user namespaces may be disabled)"
    return True, ver or "bubblewrap"


def _namespace_args() -> list[str]:
    # a user namespace only for an unprivileged user (bubblewrap needs it then); root keeps real uids, minus caps
    user = ["--unshare-user"] if os.geteuid() != 0 else []
    return [*user, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL"]


def mode_from_env() -> str:
    mode = os.environ.get("XEFORGE_SANDBOX", "auto").strip().lower()
    if mode not in MODES:
        raise DeviceError("environment variable XEFORGE_SANDBOX", f"{mode!r} is not a sandbox mode",
                          f"set XEFORGE_SANDBOX to one of {', '.join(MODES)}")
    return mode


def report(device: str, mode: str | None = None, limits: Limits | None = None) -> SandboxReport:
    """What a worker for ``device`` gets on this machine."""
    mode = mode or mode_from_env()
    rep = SandboxReport(mode)
    if mode == "off":
        rep.missing.append("the OS sandbox (XEFORGE_SANDBOX=off)")
    else:
        binary = bwrap_binary()
        ok, info = _works(binary) if binary else (False, "bubblewrap (bwrap) is not installed: apt-get install "
                                                         "bubblewrap, or set XEFORGE_BWRAP")
        if ok:
            rep.tool = info
            rep.applied += ["no network", "own PID namespace and /proc", "children die with the worker",
                            "read-only file system but its own folder, the run's Triton cache and a private /tmp",
                            "$HOME hidden", "no capabilities"]
        else:
            if mode == "require":
                raise DeviceError("XEFORGE_SANDBOX=require", info, "install Debian's bubblewrap package (make setup "
                                  "does where it can) or set XEFORGE_SANDBOX=auto to run without it")
            rep.missing.append(info)
    if limits is not None:
        rep.applied.append(f"rlimits: CPU {limits.cpu_seconds} s, files {limits.file_bytes >> 20} MiB, "
                           f"{limits.open_files} open files, no core dumps")
        if limits.memory_bytes is not None and device == "cpu":
            rep.applied.append(f"memory {limits.memory_bytes >> 20} MiB (address space)")
        else:
            rep.missing.append(f"a memory cap on {device} (GPU runtimes reserve more address space than any rlimit; "
                               "device memory is the driver's)")
        if os.geteuid() == 0:
            rep.missing.append("a process cap (RLIMIT_NPROC does not bind root; the PID namespace still ends every "
                               "child with the worker)" if rep.tool else "a process cap (RLIMIT_NPROC does not bind root)")
        else:
            rep.applied.append(f"{limits.processes} processes")
    return rep


def wrap(argv: list[str], device: str, own: Path, writable: list[Path], readable: list[Path],
         rep: SandboxReport, hidden: list[Path] = ()) -> list[str]:
    """``argv`` inside bubblewrap (or unchanged where the report has no tool).

    The file system is read-only; ``/tmp``, ``$HOME`` and every ``hidden`` folder are replaced by empty tmpfs,
    through which Python's and xeforge's own install paths and the ``readable`` folders are bound back read-only;
    ``own`` and ``writable`` are bound read-write.
    """
    if not rep.isolated:
        return argv
    args = [bwrap_binary(), *_namespace_args(), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    if device != "cpu":
        for pattern in GPU_DEVICE_GLOBS:
            for node in sorted(glob.glob(pattern)):
                args += ["--dev-bind", node, node]
    home = Path(os.path.expanduser("~")).resolve()
    masked = [Path("/tmp")] + ([home] if str(home) != "/" and home.exists() else []) + [Path(h).resolve() for h in hidden]
    masked = [m for m in masked if not any(m != o and _under(m, o) for o in masked)]  # the outermost only
    for m in masked:
        args += ["--tmpfs", str(m)]
    for p in [*_install_paths(), *readable]:
        p = Path(p).resolve()
        if p.exists() and any(_under(p, m) for m in masked):
            args += ["--ro-bind", str(p), str(p)]
    for p in [own, *writable]:
        p.mkdir(parents=True, exist_ok=True)
        args += ["--bind", str(p), str(p)]
    args += ["--chdir", str(own), "--"]
    return args + argv


def _install_paths() -> list[Path]:
    """Where Python, its packages and xeforge live (kept visible when $HOME is hidden)."""
    here = Path(__file__).resolve().parent.parent
    out = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), here,
           Path(sys.executable).resolve().parent.parent}
    out |= {Path(p).resolve() for p in sys.path if p and Path(p).exists()}
    return sorted(out)


def _under(p: Path, root: Path) -> bool:
    try:
        p.resolve().relative_to(root)
        return True
    except ValueError:
        return False


def limits_for(settings: Any, device: str) -> Limits:
    if settings.worker_memory_gib > 0:
        mem = int(settings.worker_memory_gib * (1 << 30))
    else:  # three quarters of the machine's memory: a runaway allocation fails in the worker, not the host
        mem = int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * 3 // 4)
    return Limits(memory_bytes=mem if device == "cpu" else None, cpu_seconds=int(settings.worker_cpu_s),
                  file_bytes=int(settings.max_tensor_file_gib * (1 << 30)))


LIMITS_ENV = "XEFORGE_WORKER_LIMITS"  # how a worker learns its caps (set by the parent, read at start-up)


def limits_env(limits: Limits) -> dict[str, str]:
    return {LIMITS_ENV: json.dumps(asdict(limits))}


def apply_own_limits() -> None:
    """In the worker, before it reads a request: cap itself (soft = hard, so the code it runs cannot raise them
    back without a capability the sandbox drops); every process it starts inherits them. Done here rather than in
    a ``preexec_fn``, which is not safe in a parent with threads (prewarm starts workers from several)."""
    raw = os.environ.get(LIMITS_ENV)
    if not raw:
        return
    limits = Limits(**json.loads(raw))

    def cap(which: int, value: int) -> None:
        _, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))

    cap(resource.RLIMIT_CPU, limits.cpu_seconds)
    cap(resource.RLIMIT_FSIZE, limits.file_bytes)
    cap(resource.RLIMIT_NOFILE, limits.open_files)
    cap(resource.RLIMIT_CORE, 0)
    if limits.memory_bytes is not None:
        cap(resource.RLIMIT_AS, limits.memory_bytes)
    if os.geteuid() != 0:
        cap(resource.RLIMIT_NPROC, limits.processes)
