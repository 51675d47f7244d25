"""Where ``xeforge bench`` runs its per-problem subprocesses: the scheduler interface and its local implementation.

Owns: the :class:`Scheduler` interface, the :class:`Job` it runs and the :class:`Outcome` it reports, and
:class:`LocalScheduler`, the subprocess-per-slot runner behind ``--workers N`` / ``--lanes-per-gpu K`` with the
slots' environments (:func:`gpu_slots`, :func:`lane_locks`). A job is one problem's child command (``xeforge
bench --json`` on that problem, into its part folder); what the command is and how its row is read back belong to
:mod:`xeforge.bench`, which schedules the same jobs on this host or on a Ray cluster
(:class:`xeforge.ray_cluster.RayScheduler`, the same interface): one pipeline, two places to run it.

A scheduler calls ``done(outcome)`` in the calling thread as each job finishes, in any order, and starts no job
after ``deadline`` (``time.monotonic()``; ``--stop-after``). On an exception (Ctrl-C included) it stops the jobs
it started and re-raises.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from xeforge import device_lock
from xeforge.errors import UsageError


@dataclass(frozen=True)
class Job:
    """One problem's child command. ``argv[0]`` is the Python interpreter; the child writes into ``part`` (its
    ``--out``, or a port's run folder), its stderr to ``log`` and its stdout beside them."""

    index: int  # the problem's place in the bench's order
    name: str
    argv: list[str]
    part: Path
    result: str = "bench.json"  # the file in ``part`` the child writes once it got to an end
    keep: bool = False  # an attempt keeps what an earlier one left in ``part`` (a port's run folder resumes)

    @property
    def log(self) -> Path:
        return self.part.with_name(self.part.name + ".log")

    @property
    def stdout(self) -> Path:
        return self.part.with_name(self.part.name + ".stdout")


@dataclass
class Outcome:
    """A finished job: the child's exit code (None when it never ran to an end), the environment the scheduler
    gave it, and for a cluster where it ran, how many attempts it took and why the earlier ones were lost."""

    job: Job
    exit_code: int | None
    env: dict[str, str]
    elapsed_s: float
    where: dict | None = None  # a cluster's record of the attempt that finished (host, node, GPUs); None locally
    attempts: int = 1
    lost: list[str] = field(default_factory=list)  # why each earlier attempt was lost
    error: str | None = None  # the scheduler could not run the job to an end: why


Done = Callable[[Outcome], None]


class Scheduler(Protocol):
    """Runs jobs; ``describe()`` is its record for bench.json (None: the local default, which adds nothing)."""

    def run(self, jobs: list[Job], done: Done, deadline: float | None) -> None: ...

    def describe(self) -> dict | None: ...


# ------------------------------------------------------------------------------------------------ local slots
def device_count(kind: str) -> int:
    """The GPUs of ``kind`` this process sees."""
    import torch  # lazy: torch, seconds to import, only where GPUs are counted

    return torch.cuda.device_count() if kind == "cuda" else torch.xpu.device_count()


def visible_gpus(kind: str, env: dict[str, str] | None = None, count: int | None = None) -> tuple[str, list[str]]:
    """The variable that picks a process's GPUs of ``kind`` (``CUDA_VISIBLE_DEVICES`` / ``ZE_AFFINITY_MASK``) and
    the ids it can name: those ``env`` lists, else ``0 .. count - 1`` (``count``: :func:`device_count` unless given)."""
    env = os.environ if env is None else env
    var = "CUDA_VISIBLE_DEVICES" if kind == "cuda" else "ZE_AFFINITY_MASK"
    listed = [s.strip() for s in env.get(var, "").split(",") if s.strip()]
    if listed:
        return var, listed
    return var, [str(i) for i in range(device_count(kind) if count is None else count)]


def gpu_slots(kind: str, n: int, env: dict[str, str] | None = None, count: int | None = None,
              cpus: int | None = None, lanes: int = 1, lock_dir: Path | None = None) -> list[dict[str, str]]:
    """The environment of each worker subprocess: ``n`` GPUs (``CUDA_VISIBLE_DEVICES`` / ``ZE_AFFINITY_MASK``),
    ``lanes`` subprocesses on each. On the CPU interpreter the workers are plain parallel processes.

    Lanes on one GPU share a lock file (``XEFORGE_GPU_LOCK``: its name here, in ``lock_dir`` when given;
    :mod:`xeforge.device_lock`): each lane's timing has the GPU to itself. With several lanes each also gets its
    share of the host's CPUs for torch.compile's compile workers (``TORCHINDUCTOR_COMPILE_THREADS``, unless set;
    half the CPUs over all lanes): a lane compiling with every CPU slows another lane's host side while it is
    being timed.
    """
    env = os.environ if env is None else env
    if kind == "cpu":
        return [{} for _ in range(n)]
    if count is None:
        count = device_count(kind)
    if n > count:
        raise UsageError("--workers", f"{n} workers asked for, but {count} {kind} GPU(s) are visible",
                         f"use --workers {count} or fewer")
    var, ids = visible_gpus(kind, env, count)
    slots = [{var: ids[i]} for i in range(n) for _ in range(lanes)]
    if lanes > 1:
        for s in slots:
            name = f"{kind}-{s[var]}.lock"
            s[device_lock.ENV] = str(lock_dir / name) if lock_dir else name
    if len(slots) > 1 and "TORCHINDUCTOR_COMPILE_THREADS" not in env:
        share = str(max(1, (cpus or os.cpu_count() or 2) // (2 * len(slots))))
        for s in slots:
            s["TORCHINDUCTOR_COMPILE_THREADS"] = share
    return slots


def lane_locks(slots: list[dict[str, str]], folder: Path) -> list[dict[str, str]]:
    """The lanes' lock files made real: in ``folder`` (created), or the ``XEFORGE_GPU_LOCK`` the bench was started
    with, so several benches on one machine share one lock (every GPU's timing then queues on it)."""
    given = device_lock.lock_path()
    if not given:
        folder.mkdir(parents=True, exist_ok=True)
    return [{k: (given or str(folder / Path(v).name)) if k == device_lock.ENV else v for k, v in s.items()}
            for s in slots]


class LocalScheduler:
    """One subprocess per slot of this host at a time (a slot is an environment: a GPU, its lane lock, a share
    of the CPUs); a job takes the next free slot."""

    def __init__(self, slots: list[dict[str, str]]) -> None:
        self.slots = slots

    def describe(self) -> dict | None:
        return None

    def run(self, jobs: list[Job], done: Done, deadline: float | None) -> None:
        free: "queue.Queue[int]" = queue.Queue()
        for i in range(len(self.slots)):
            free.put(i)
        procs: dict[int, subprocess.Popen] = {}
        lock = threading.Lock()

        def one(job: Job) -> Outcome | None:
            slot = free.get()
            try:
                if deadline is not None and time.monotonic() > deadline:
                    return None  # --stop-after: not started
                env = {**os.environ, **self.slots[slot]}
                t0 = time.monotonic()
                with open(job.log, "w") as fh, open(job.stdout, "w") as so:
                    proc = subprocess.Popen(job.argv, stdout=so, stderr=fh, env=env)
                    with lock:
                        procs[job.index] = proc
                    rc = proc.wait()
                return Outcome(job, rc, self.slots[slot], round(time.monotonic() - t0, 2))
            finally:
                with lock:
                    procs.pop(job.index, None)
                free.put(slot)

        with ThreadPoolExecutor(max_workers=len(self.slots)) as pool:
            futs = [pool.submit(one, job) for job in jobs]
            try:
                for fut in as_completed(futs):
                    outcome = fut.result()
                    if outcome is not None:
                        done(outcome)
            except BaseException:
                for f in futs:
                    f.cancel()
                with lock:
                    for proc in procs.values():
                        proc.terminate()
                raise
