"""Several lanes on one GPU: every use of the device is shared, except timing, which has the device alone.

Owns: the cross-process lock that lets ``xeforge bench --lanes-per-gpu K`` run K problems on one GPU at once
without one lane's correctness runs or compiles landing inside another lane's timed region. A lane's worker
requests that time something (gate 3 and the bench's ``time``, the profiler's ``profile`` and ``deep``) hold the
lock exclusively; every other request to a GPU worker (``load``, ``run``, ``trace``, ...) holds it shared, so
correctness and compiles of all lanes overlap, and timing waits until they have drained. A waiting timer has
priority: new shared holders queue behind it (a turnstile file), so a busy lane cannot starve another's timing.

The lock is off unless ``XEFORGE_GPU_LOCK`` names a file (the bench sets one per GPU for its lanes; two
``xeforge port`` runs by hand on one GPU can share one the same way). ``flock`` locks die with their process, so
a killed lane never leaves the device locked. The lock is taken in the xeforge process, around the request to
the worker: the sandboxed worker never sees it.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "XEFORGE_GPU_LOCK"
EXCLUSIVE_OPS = frozenset({"time", "profile", "deep"})  # requests whose result is a measurement of the device


def lock_path() -> str | None:
    """The lock file lanes on this GPU share, or None (one lane: no lock)."""
    return os.environ.get(ENV) or None


def _open(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)


@contextmanager
def hold(op: str, device: str, path: str | None = None) -> Iterator[str]:
    """Hold the device for one request: exclusively for a measurement (``EXCLUSIVE_OPS``), shared otherwise.
    Yields the mode taken ("exclusive", "shared", or "none" when no lock is set or the device is the CPU)."""
    path = lock_path() if path is None else path
    if not path or device == "cpu":
        yield "none"
        return
    exclusive = op in EXCLUSIVE_OPS
    gate, main = _open(path + ".gate"), _open(path)
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)  # waits behind a timer that is waiting or timing
        if exclusive:
            fcntl.flock(main, fcntl.LOCK_EX)  # keeps the gate: no new shared holder until this one is done
        else:
            fcntl.flock(main, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield "exclusive" if exclusive else "shared"
    finally:
        os.close(main)  # closing drops the flock
        os.close(gate)
