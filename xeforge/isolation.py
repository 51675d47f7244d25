"""Gate 0, parent side: a long-lived worker process per device, with timeouts, crash detection and restart.

Owns: starting ``python -m xeforge.worker`` with a scrubbed environment (no API keys or other secrets) in
its own folder, inside the OS sandbox with its resource limits (:mod:`xeforge.sandbox`), copying its output
into the worker log up to a cap, sending requests with a compile or run timeout, and turning a crash, a hang,
an exception or a malformed reply into a :class:`WorkerFailure` the verifier records. Requests and replies are bounded JSON
(:mod:`xeforge.wire`): nothing a worker sends can run code here. A dead or hung worker is killed and replaced on
the next request; the pipeline itself never runs candidate code.
"""

from __future__ import annotations

import atexit
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from xeforge import device_lock, sandbox, wire
from xeforge.settings import load_settings

# Only these variables reach a worker; anything that looks like a secret is dropped even if allow-listed.
_ALLOW_PREFIXES = ("TRITON_", "CUDA_", "NVIDIA_", "ZE_", "ONEAPI_", "SYCL_", "LC_", "TORCH_", "PYTORCH_",
                   "OMP_", "MKL_", "KMP_", "XEFORGE_WORKER_")
_ALLOW_EXACT = {"PATH", "HOME", "LANG", "TERM", "TMPDIR", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV",
                "XDG_CACHE_HOME", "USER", "SHELL", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "PYTHONHASHSEED"}
_SECRET = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION)", re.I)


def scrubbed_env(device: str, base: dict[str, str] | None = None) -> dict[str, str]:
    base = dict(os.environ if base is None else base)
    env = {k: v for k, v in base.items()
           if (k in _ALLOW_EXACT or k.startswith(_ALLOW_PREFIXES)) and not _SECRET.search(k)}
    src_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src_root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the run folder
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


def worker_command(prefix: list[str], device: str) -> list[str]:
    """The worker's command line (before the sandbox wraps it). ``--shared-gpu`` where lanes share this GPU
    (:mod:`xeforge.device_lock`): the worker then hands its allocator's free memory back after each request."""
    shared = ["--shared-gpu"] if device != "cpu" and device_lock.lock_path() else []
    return [*prefix, sys.executable, "-m", "xeforge.worker", "--device", device, *shared]


class WorkerFailure(Exception):
    """The candidate crashed the worker, hung past its timeout, or raised."""

    def __init__(self, kind: str, detail: str, where: str = "") -> None:
        self.kind = kind  # "crash" | "timeout" | "exception" | "start" | "protocol"
        self.detail = detail
        self.where = where
        super().__init__(f"{kind}: {detail}")


class Worker:
    """One worker process for one device. ``request`` restarts it after a crash or a timeout.

    ``writable`` folders (beside its own ``workdir``) and ``readable`` ones are what the sandbox opens to it,
    ``hidden`` ones it hides (the run folder around it); ``env`` adds variables (never secrets: they pass the
    same scrub).
    """

    def __init__(self, device: str, workdir: Path, log_path: Path | None = None, *, settings: Any = None,
                 writable: tuple[Path, ...] = (), readable: tuple[Path, ...] = (), hidden: tuple[Path, ...] = (),
                 env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> None:
        self.device = device
        self.prefix = tuple(prefix)  # a profiler the worker runs under, inside the sandbox (--profile deep)
        self.workdir = Path(workdir).resolve()
        self.log_path = Path(log_path or self.workdir / "worker.log").resolve()
        self.settings = settings or load_settings()
        self.writable = tuple(Path(p).resolve() for p in writable)
        self.readable = tuple(Path(p).resolve() for p in readable)
        self.hidden = tuple(Path(p).resolve() for p in hidden)
        self.extra_env = dict(env or {})
        self.limits = sandbox.limits_for(self.settings, device)
        self.sandbox = sandbox.report(device, self.settings.sandbox, self.limits)
        self.proc: subprocess.Popen | None = None
        self._drain: threading.Thread | None = None
        self._hello_pending = False
        self.restarts = 0
        self.generation = 0  # bumps on every (re)start: slots loaded earlier are gone
        # where a request's seconds go besides its own work: starting the worker (the sandbox, torch's import, the
        # device context) and waiting for the device while another lane times on it (device_lock)
        self.start_s = 0.0
        self.wait_s = 0.0

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> None:
        """Start the worker and wait until it is ready."""
        self.spawn()
        self._await_hello(timeout)

    def spawn(self) -> None:
        """Start the worker without waiting for it (its interpreter and torch load while the caller goes on); the
        next request waits for it to be ready. Starting two workers this way overlaps their start-up."""
        if self.alive():
            return
        if self.generation > 0:
            self.restarts += 1  # the previous worker died (crash, hang) or was closed: this is its replacement
        self._launch()
        self._hello_pending = True

    def _await_hello(self, timeout: float) -> None:
        if not self._hello_pending:
            return
        self._hello_pending = False
        try:
            hello = self._read(timeout)
        except WorkerFailure as exc:
            raise WorkerFailure("start", exc.detail) from None
        if not hello.get("ok"):
            self.kill()
            raise WorkerFailure("start", f"{hello.get('error')}: {hello.get('message')}")

    def _launch(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = sandbox.wrap(worker_command(self.prefix, self.device), self.device, self.workdir, list(self.writable),
                            list(self.readable), self.sandbox, list(self.hidden))
        env = scrubbed_env(self.device, {**os.environ, **self.extra_env, **sandbox.limits_env(self.limits)})
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     cwd=self.workdir, env=env, start_new_session=True)
        self._drain = threading.Thread(target=_copy_capped, daemon=True,
                                       args=(self.proc.stderr, self.log_path, int(self.settings.max_log_mib * (1 << 20))))
        self._drain.start()
        self.generation += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        self._hello_pending = False
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            if self._drain is not None:
                self._drain.join(timeout=5)  # the log is complete before the failure is read from it
        self.proc = None

    def close(self, wait: float = 5.0) -> None:
        """Ask the worker to exit and wait ``wait`` seconds (a profiler it runs under writes its report then)."""
        if self.alive():
            try:
                self._write({"op": "exit"})
                self.proc.wait(timeout=wait)
            except (OSError, subprocess.TimeoutExpired, BrokenPipeError):
                pass
        self.kill()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- protocol ----------------------------------------------------------------------------------
    def request(self, op: str, timeout: float, **payload: Any) -> dict[str, Any]:
        """Send one request; raise WorkerFailure on a crash, a timeout or an exception in the candidate."""
        t0 = time.monotonic()
        if not self.alive():
            self.spawn()
        self._await_hello(120.0)
        t1 = time.monotonic()
        self.start_s += t1 - t0
        try:
            with device_lock.hold(op, self.device):  # lanes sharing this GPU: only a measurement has it alone
                self.wait_s += time.monotonic() - t1
                self._write({"op": op, **payload})
                reply = self._read(timeout)
        except WorkerFailure:
            self.kill()
            raise
        if not reply.get("ok"):
            detail = f"{reply.get('error')}: {reply.get('message')}"
            if reply.get("poisoned"):
                # the fault left the device context unusable; the worker exits and the next request starts anew
                self.kill()
                detail += " [the fault left the worker's device context unusable: the next candidate gets a new worker]"
            raise WorkerFailure("exception", detail, reply.get("where", ""))
        return reply

    def _write(self, obj: Any) -> None:
        data = wire.encode(obj)
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._crashed() from None

    def _read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        try:
            n = wire.message_length(self._read_exact(wire.HEADER.size, deadline))
            return wire.decode(self._read_exact(n, deadline))
        except wire.ProtocolError as exc:
            self.kill()
            raise WorkerFailure("protocol", f"the worker's reply was not a valid message: {exc}") from None

    def _read_exact(self, n: int, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()
        chunks, got = [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise WorkerFailure("timeout", "no answer within the time limit (hang or endless loop)")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                raise self._crashed()
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _crashed(self) -> WorkerFailure:
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                code = None
        self.kill()
        if code is not None and code > 128 and self.sandbox.isolated:
            code = -(code - 128)  # bubblewrap's reaper exits 128 + the signal that ended the worker
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            detail = f"the worker died with {name}"
        else:
            detail = f"the worker exited with code {code}"
        tail = self._log_tail()
        return WorkerFailure("crash", detail + (f"; last log lines: {tail}" if tail else ""))

    def _log_tail(self, n: int = 400) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        return " ".join(text[-n:].split())


_FACTS: Worker | None = None


def facts_worker() -> Worker:
    """The xeforge process's one CPU worker for problem facts that need user code run (KernelBench's
    ``get_inputs()``, parameter shapes on the meta device): started once, in a temporary folder, closed at exit."""
    global _FACTS
    if _FACTS is None:
        folder = Path(tempfile.mkdtemp(prefix="xeforge-facts-"))
        _FACTS = Worker("cpu", folder)

        def _close() -> None:
            _FACTS.close()
            shutil.rmtree(folder, ignore_errors=True)

        atexit.register(_close)
    return _FACTS


def _copy_capped(stream, log_path: Path, cap: int) -> None:
    """Copy a worker's output into its log until ``cap`` bytes, then note the cut and discard the rest."""
    written = 0
    with open(log_path, "ab") as log:
        while True:
            try:
                chunk = stream.read1(1 << 16)
            except (OSError, ValueError):
                break
            if not chunk:
                break
            if written < cap:
                part = chunk[:cap - written]
                log.write(part)
                written += len(part)
                if written >= cap:
                    log.write(f"\n[xeforge: the worker's output passed {cap >> 20} MiB; the rest is discarded]\n".encode())
                log.flush()
    try:
        stream.close()
    except OSError:
        pass
