"""``xeforge bench --cluster ray[://ADDRESS]``: the bench's jobs as Ray tasks, on the GPUs of many hosts.

Owns: :class:`RayScheduler` (the :class:`xeforge.schedule.Scheduler` interface on a Ray cluster) and
:func:`run_on_node`, the task body. Ray is an optional extra (``pip install -e '.[ray]'``), imported only here,
only when a bench asks for a cluster.

What runs where:

1. The driver (this process) connects: ``ray://ADDRESS`` through Ray Client; ``ray`` alone to ``RAY_ADDRESS``,
   else to a cluster ``ray start`` made on this host, else to a Ray instance it starts here (and says so).
2. Each job (one problem) is a task holding one GPU (``num_gpus=1``), ``1/K`` of one with ``--lanes-per-gpu K``,
   none on the CPU interpreter; and one CPU. Ray decides the node. A port with ``--check-lanes K`` holds K GPUs of
   one node (as many as its largest node has, if fewer), so its lanes check candidates on GPUs of their own.
3. On the node, :func:`run_on_node` starts the same child command the local scheduler starts (``xeforge bench
   --json`` on that problem), with the GPU Ray gave the task made visible, in the driver's working directory
   (every node needs the checkout at the same path). The child's candidates still run in its bubblewrap'd
   workers: Ray only decides where the child runs. Lanes sharing a GPU of a node share that GPU's lock file
   in the node's temporary folder (:mod:`xeforge.device_lock`): one timing at a time per GPU, as locally.
4. The task returns plain data only: the exit code, the files the child wrote into its part folder (bytes, by
   relative path), its log and stdout, where it ran. The driver checks that and writes the files into its own
   part folder, where :mod:`xeforge.bench` reads the row as it does for a local child.
5. A task whose Ray worker or node is lost, or whose child was killed by a signal before it wrote a result, is
   submitted again, up to ``retries`` times. The driver retries (tasks carry ``max_retries=0``) so that it knows
   which problems were retried: a line on stderr each time, and each outcome carries its attempts.

``xeforge port --cluster`` runs one job the same way (:mod:`xeforge.port_cluster`): the port's run folder is its
part folder, kept between attempts so that a retried port resumes. Not done here: one port's lanes on several
nodes (one port runs in one task, on one node).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from xeforge import device_lock
from xeforge.errors import ClusterError, UsageError
from xeforge.schedule import Done, Job, Outcome

INSTALL_FIX = "pip install -e '.[ray]' (on the driver and on every node of the cluster)"
RETRIES = 2  # a lost task is submitted again up to this many times
RETURN_CAP_BYTES = 64 << 20  # a task returns at most this much of its part folder; the rest is named, not sent
# the driver's environment a task carries to its node: xeforge's own settings; nothing else (no API keys)
FORWARD_ENV_PREFIXES = ("XEFORGE_",)
FORWARD_ENV = ("TORCHINDUCTOR_COMPILE_THREADS", "OMP_NUM_THREADS")
# set by Ray in a task's worker (to the task's num_cpus, 1 here) where the node's environment has none; a port's
# child uses the host's threads as it would locally, so it gets the driver's value (forwarded) or none
RAY_THREAD_DEFAULTS = ("OMP_NUM_THREADS",)
PLAIN = (str, bytes, int, float, bool, type(None))
# Ray Client: the cluster's proxy starts a server process per client; that start can fail transiently (seen on a
# loaded 2-core host: the new process died in gRPC's fork handling). A connection that fails so is tried again.
CONNECT_ATTEMPTS = 3
CONNECT_PAUSE_S = 2.0
TRANSIENT_CLIENT_FAILURES = ("Starting Ray client server failed", "Proxy failed to Connect to backend")


def parse_cluster(flag: str, env: dict[str, str] | None = None) -> str | None:
    """The Ray address ``--cluster`` names: ``ray://HOST:PORT`` as given, ``ray`` -> ``RAY_ADDRESS`` or None
    (None: a cluster ``ray start`` made on this host, else a new local instance)."""
    env = os.environ if env is None else env
    if flag == "ray":
        return env.get("RAY_ADDRESS") or None
    if flag.startswith("ray://") and len(flag) > len("ray://"):
        return flag
    raise UsageError("--cluster", f"{flag!r} is not a cluster xeforge knows",
                     "use --cluster ray (RAY_ADDRESS, or a cluster on this host) or --cluster ray://HOST:10001")


def import_ray():
    """The ``ray`` module, or a UsageError naming the install command."""
    try:
        import ray  # lazy: the optional extra, only for --cluster ray
    except ImportError:
        raise UsageError("--cluster", "Ray is not installed", INSTALL_FIX) from None
    return ray


def is_plain(value: Any) -> bool:
    """True when ``value`` is built only of str, bytes, numbers, bools, None, lists and str-keyed dicts."""
    if isinstance(value, PLAIN):
        return True
    if isinstance(value, list):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    return False


# ------------------------------------------------------------------------------------------------ on the node
def _die_with_parent() -> None:
    import ctypes  # lazy: prctl, only on Linux, only in the child before it execs

    ctypes.CDLL("libc.so.6").prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: the child ends with a lost Ray worker


def _collect(part: Path, cap: int, first: str = "bench.json") -> tuple[dict[str, bytes], list[str]]:
    """The part folder's files by relative path (``first`` first, then the smallest), up to ``cap`` bytes."""
    files = sorted((f for f in part.rglob("*") if f.is_file() and not f.is_symlink()),
                   key=lambda f: (f.relative_to(part) != Path(first), f.stat().st_size))
    out: dict[str, bytes] = {}
    left: list[str] = []
    total = 0
    for f in files:
        size = f.stat().st_size
        rel = str(f.relative_to(part))
        if total + size > cap:
            left.append(f"{rel} ({size} bytes: over the {cap >> 20} MiB a task returns)")
            continue
        out[rel] = f.read_bytes()
        total += size
    return out, left


def _tail(path: Path, limit: int = 1 << 20) -> bytes:
    """The last ``limit`` bytes of a log (a child's stderr is not capped; its last lines say why it ended)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(max(0, size - limit))
        return fh.read()


def _gpu_env(kind: str, lanes: int, ids: list[str], env: dict[str, str]) -> dict[str, str]:
    """The GPU Ray gave the task, made visible the way the local slots do it, and its lane lock."""
    if kind == "cpu" or not ids:
        return {}
    var = "CUDA_VISIBLE_DEVICES" if kind == "cuda" else "ZE_AFFINITY_MASK"
    out = {var: ",".join(ids)}
    if lanes > 1:  # lanes share this GPU of this node: one lock per physical GPU, in the node's temporary folder
        folder = Path(tempfile.gettempdir()) / "xeforge-gpu-locks"
        folder.mkdir(parents=True, exist_ok=True)
        out[device_lock.ENV] = env.get(device_lock.ENV) or str(folder / f"{kind}-{ids[0]}.lock")
    return out


def child_env(worker: Mapping[str, str], forwarded: dict[str, str]) -> dict[str, str]:
    """The environment a task's child starts from: the Ray worker's, less the thread limits Ray set for the task
    (a port in a one-CPU task would otherwise run torch's host-side work on one thread, where the same port run
    locally uses every core), then what the driver forwarded."""
    return {**{k: v for k, v in worker.items() if k not in RAY_THREAD_DEFAULTS}, **forwarded}


def run_on_node(job: dict, ctx: dict) -> dict:
    """The Ray task: run one job's child command on this node and return what it wrote, as plain data.

    ``job``: argv, part (relative to ``ctx["cwd"]`` or absolute), result (the file the child writes at its end),
    keep (an earlier attempt's files stay). ``ctx``: cwd, kind, lanes, env (forwarded from
    the driver), not_after (wall-clock seconds; later than that the job is not started). Returns ``{"skipped":
    True}``, ``{"lost": why}`` (the child was killed before it wrote a result: worth another attempt),
    ``{"error": why}``, or the result: exit_code, files, left_out, log, stdout, host, node, env, elapsed_s.
    """
    host = socket.gethostname()
    cwd = Path(ctx["cwd"])
    if not cwd.is_dir():
        return {"error": f"node {host} has no folder {cwd}: every node needs the xeforge checkout and the problems "
                         "at the driver's path (a shared file system or the same image)", "host": host}
    if ctx.get("not_after") is not None and time.time() > ctx["not_after"]:
        return {"skipped": True}
    import ray  # lazy: the optional extra (the task runs in a Ray worker, so it is installed here)

    rt = ray.get_runtime_context()
    ids = [str(i) for i in (rt.get_accelerator_ids() or {}).get("GPU", [])]
    given = child_env(os.environ, ctx["env"])
    gpu = _gpu_env(ctx["kind"], ctx["lanes"], ids, given)
    part = cwd / job["part"]
    result = job.get("result", "bench.json")
    if not job.get("keep"):
        shutil.rmtree(part, ignore_errors=True)  # an earlier, lost attempt's leftovers
    part.parent.mkdir(parents=True, exist_ok=True)
    log, stdout = part.with_name(part.name + ".log"), part.with_name(part.name + ".stdout")
    argv = [sys.executable, *job["argv"][1:]]  # this node's interpreter (the driver's path may not exist here)
    t0 = time.monotonic()
    with open(log, "wb") as fh, open(stdout, "wb") as so:
        proc = subprocess.Popen(argv, cwd=cwd, env={**given, **gpu}, stdout=so, stderr=fh,
                                preexec_fn=_die_with_parent)
        rc = proc.wait()
    where = {"host": host, "node": rt.get_node_id(), "pid": proc.pid}
    if rc < 0 and not (part / result).exists():
        return {"lost": f"its child was killed by signal {-rc} on {host} before it wrote a result", **where}
    files, left = _collect(part, RETURN_CAP_BYTES, first=result)
    return {"exit_code": rc, "files": files, "left_out": left, "log": _tail(log), "stdout": _tail(stdout), "env": gpu,
            "elapsed_s": round(time.monotonic() - t0, 2), **where}


# ------------------------------------------------------------------------------------------------ the driver
def _recorded_address(ray) -> str | None:
    """The address a plain ``ray.init()`` would connect to: the cluster ``ray start`` recorded on this host (None:
    none recorded, or this Ray keeps it elsewhere; ray.init then starts a local instance or finds it itself)."""
    try:
        return ray._private.services.canonicalize_bootstrap_address(None)
    except Exception:  # noqa: BLE001 — a private helper of Ray's; without it the check is skipped, not the run
        return None


def _check_reachable(address: str, fix: str = "") -> None:
    """A ClusterError at once when nothing listens at the address (Ray itself retries for minutes)."""
    hostport = address.removeprefix("ray://").rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError("--cluster", f"{address!r} is not HOST:PORT", "use ray://HOST:10001, or RAY_ADDRESS=HOST:6379")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5.0).close()
    except OSError as exc:
        raise ClusterError("--cluster", f"nothing answers at {host}:{port} ({exc.strerror or exc})",
                           fix or "start the head node there (ray start --head), or fix RAY_ADDRESS / --cluster"
                           ) from None


def _write_back(job: Job, result: dict) -> None:
    """The task's files into the driver's part folder (on the task's own host they are there already)."""
    for rel, data in result["files"].items():
        dest = job.part / rel
        if not dest.resolve().is_relative_to(job.part.resolve()):
            continue  # a relative path out of the part folder: not written
        if dest.is_file() and dest.stat().st_size == len(data) and dest.read_bytes() == data:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    for dest, tail in ((job.log, result["log"]), (job.stdout, result["stdout"])):
        if not (dest.is_file() and _ends_with(dest, tail)):  # on the task's host the whole file is there already
            dest.write_bytes(tail)


def _ends_with(path: Path, tail: bytes) -> bool:
    size = path.stat().st_size
    if size < len(tail):
        return False
    with open(path, "rb") as fh:
        fh.seek(size - len(tail))
        return fh.read() == tail


def _ray_prints_to_stderr():
    """Ray's driver prints the cluster's error messages ("(raylet) A worker died ...") to ``sys.stdout``; while
    the scheduler runs they go to stderr, so stdout keeps only the bench's data (``--json``)."""
    return contextlib.redirect_stdout(sys.stderr)


class RayScheduler:
    """Jobs as Ray tasks on a cluster; see the module docstring for what runs where."""

    def __init__(self, address: str | None, kind: str, lanes: int = 1, retries: int = RETRIES,
                 cwd: Path | None = None, say=None, gpus: int = 1) -> None:
        if gpus > 1 and lanes > 1:
            raise ValueError("a task holds several whole GPUs or a share of one, not both")
        self.address, self.kind, self.lanes, self.retries = address, kind, lanes, retries
        self.gpus = gpus  # whole GPUs of one node per task (a port's check lanes); capped at connect()
        self.cwd = Path(cwd or os.getcwd()).resolve()
        self.say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.info: dict = {"scheduler": "ray", "address": address or "this host", "retries": retries,
                           "num_gpus_per_task": self.num_gpus}
        self.connected_here = False
        self.ray = None  # the ray module once connected

    @property
    def num_gpus(self) -> float:
        return 0 if self.kind == "cpu" else self.gpus if self.gpus > 1 else 1 / self.lanes

    def describe(self) -> dict | None:
        return self.info

    def connect(self):
        """Connect (or start a local instance) and record the cluster; a ClusterError when it cannot be used."""
        if self.ray is not None:
            return self.ray
        ray = import_ray()
        where = self.info["address"]
        if ray.is_initialized():
            pass  # this process is connected already (a bench's driver, a test's local instance): no record matters
        elif self.address is not None:
            _check_reachable(self.address)
        elif (found := _recorded_address(ray)) is not None:
            _check_reachable(found, f"the cluster `ray start` recorded on this host ({found}) is gone: `ray stop` "
                                    "clears the record; or name a cluster with RAY_ADDRESS or --cluster ray://")
        if not ray.is_initialized():
            self._init(ray, where)
            self.connected_here = True  # disconnected after the run (a Ray instance started here ends with it)
        res = ray.cluster_resources()
        self.info.update(ray=ray.__version__, nodes=len([n for n in ray.nodes() if n.get("Alive")]),
                         cpus=res.get("CPU", 0), gpus=res.get("GPU", 0))
        if self.num_gpus and not res.get("GPU"):
            raise ClusterError("--cluster", f"the Ray cluster at {where} has no GPU for --device {self.kind}",
                               "start the nodes with their GPUs (ray start --num-gpus N), or use --device cpu")
        if self.num_gpus > 1:  # a task never spans nodes: asking for more than the largest node has would wait forever
            most = max((n.get("Resources", {}).get("GPU", 0) for n in ray.nodes() if n.get("Alive")), default=0)
            if most < self.gpus:
                self.say(f"ray: {self.gpus} GPUs of one node were asked for; the largest node has {most:g}: the "
                         f"task holds {most:g} and its lanes share them")
                self.gpus = max(1, int(most))
            self.info["num_gpus_per_task"] = self.num_gpus
        self.say(f"ray: {self.info['nodes']} node(s), {self.info['cpus']:g} CPU(s), {self.info['gpus']:g} GPU(s) "
                 f"at {where}; {self.num_gpus:g} GPU per problem")
        self.ray = ray
        return ray

    def _init(self, ray, where: str) -> None:
        """``ray.init`` to the cluster; a Ray Client server that failed to start is tried again (see
        ``TRANSIENT_CLIENT_FAILURES``); any other failure, or the last one, is a ClusterError."""
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            try:
                # worker logs stay out of this process's stdout (data goes there): each child's log is its own file
                with _ray_prints_to_stderr():
                    ray.init(address=self.address, log_to_driver=False, namespace="xeforge")
                return
            except Exception as exc:  # noqa: BLE001 — Ray raises several types here (connection, auth, client)
                why = " ".join(str(exc).split())[:400]
                transient = any(t in str(exc) for t in TRANSIENT_CLIENT_FAILURES)
                if transient and attempt < CONNECT_ATTEMPTS:
                    self.say(f"ray: the cluster at {where} failed to start a Ray Client server for this driver "
                             f"(attempt {attempt} of {CONNECT_ATTEMPTS}); connecting again in {CONNECT_PAUSE_S:g} s")
                    time.sleep(CONNECT_PAUSE_S)
                    continue
                tries = f" ({attempt} attempts)" if attempt > 1 else ""
                raise ClusterError("--cluster", f"could not connect to the Ray cluster at {where}{tries}: "
                                   f"{type(exc).__name__}: {why}",
                                   "start it (ray start --head) and pass its address; for a cluster with token "
                                   "authentication set RAY_AUTH_MODE=token and its token (~/.ray/auth_token or "
                                   "RAY_AUTH_TOKEN) here") from None

    def run(self, jobs: list[Job], done: Done, deadline: float | None) -> None:
        with _ray_prints_to_stderr():
            self._run(jobs, done, deadline)

    def _run(self, jobs: list[Job], done: Done, deadline: float | None) -> None:
        ray = self.connect()  # connected already by the bench, before it wrote anything: a no-op then
        lost_errors = tuple(getattr(ray.exceptions, n) for n in (
            "WorkerCrashedError", "NodeDiedError", "OutOfMemoryError", "LocalRayletDiedError", "ObjectLostError",
            "RaySystemError") if hasattr(ray.exceptions, n))
        task = ray.remote(run_on_node).options(num_gpus=self.num_gpus, num_cpus=1, max_retries=0)
        env = {k: v for k, v in os.environ.items() if k.startswith(FORWARD_ENV_PREFIXES) or k in FORWARD_ENV}
        ctx = {"cwd": str(self.cwd), "kind": self.kind, "lanes": self.lanes, "env": env,
               "not_after": None if deadline is None else time.time() + (deadline - time.monotonic())}
        t0 = {j.index: time.monotonic() for j in jobs}
        pending: dict[Any, tuple[Job, int, list[str]]] = {}

        def submit(job: Job, attempt: int, lost: list[str]) -> None:
            pending[task.remote({"argv": list(job.argv), "part": str(job.part), "result": job.result,
                                 "keep": job.keep}, ctx)] = (job, attempt, lost)

        for job in jobs:
            submit(job, 1, [])
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                job, attempt, lost = pending.pop(ready[0])
                try:
                    result = ray.get(ready[0])
                except lost_errors as exc:
                    result = {"lost": f"its Ray worker was lost ({type(exc).__name__}: "
                                      f"{' '.join(str(exc).split())[:300]})"}
                except ray.exceptions.RayError as exc:
                    result = {"error": f"the Ray task failed: {type(exc).__name__}: {' '.join(str(exc).split())[:600]}"}
                if not is_plain(result):
                    result = {"error": "the Ray task returned something other than plain data (str, bytes, numbers, "
                                       "lists, str-keyed dicts); none of it was used"}
                if result.get("skipped"):
                    continue
                elapsed = round(time.monotonic() - t0[job.index], 2)
                if "lost" in result:
                    lost = [*lost, result["lost"]]
                    if attempt <= self.retries:
                        self.say(f"ray: {job.name}: {result['lost']}; retrying (attempt {attempt + 1} of "
                                 f"{self.retries + 1})")
                        submit(job, attempt + 1, lost)
                        continue
                    result = {"error": f"lost {attempt} time(s), not retried again: {'; '.join(lost)}"}
                if "error" in result:
                    done(Outcome(job, None, {}, elapsed, where={"host": result.get("host")}, attempts=attempt,
                                 lost=lost, error=result["error"]))
                    continue
                _write_back(job, result)
                where = {k: result[k] for k in ("host", "node", "pid")}
                if result["left_out"]:
                    where["left_out"] = result["left_out"]
                done(Outcome(job, result["exit_code"], result["env"], result["elapsed_s"], where=where,
                             attempts=attempt, lost=lost))
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        finally:
            if self.connected_here:
                ray.shutdown()
                self.ray, self.connected_here = None, False
