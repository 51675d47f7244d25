"""Gate 0, parent side: a long-lived worker process per device, with timeouts, crash detection and restart.

Owns: starting ``python -m xeforge.worker`` with a scrubbed environment (no API keys or other secrets) in
the run folder, sending requests with a compile or run timeout, and turning a crash, a hang or an exception
in the candidate into a :class:`WorkerFailure` the verifier records. A dead or hung worker is killed and
replaced on the next request; the pipeline itself never runs candidate code.
"""

from __future__ import annotations

import os
import re
import select
import signal
import struct
import subprocess
import sys
import time
import pickle
from pathlib import Path
from typing import Any

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


class WorkerFailure(Exception):
    """The candidate crashed the worker, hung past its timeout, or raised."""

    def __init__(self, kind: str, detail: str, where: str = "") -> None:
        self.kind = kind  # "crash" | "timeout" | "exception" | "start"
        self.detail = detail
        self.where = where
        super().__init__(f"{kind}: {detail}")


class Worker:
    """One worker process for one device. ``request`` restarts it after a crash or a timeout."""

    def __init__(self, device: str, workdir: Path, log_path: Path | None = None) -> None:
        self.device = device
        self.workdir = Path(workdir).resolve()
        self.log_path = log_path or self.workdir / "worker.log"
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.generation = 0  # bumps on every (re)start: slots loaded earlier are gone

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "xeforge.worker", "--device", self.device],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=self.workdir,
            env=scrubbed_env(self.device), start_new_session=True)
        log.close()
        self.generation += 1
        hello = self._read(timeout)
        if not hello.get("ok"):
            self.kill()
            raise WorkerFailure("start", f"{hello.get('error')}: {hello.get('message')}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
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
        self.proc = None

    def close(self) -> None:
        if self.alive():
            try:
                self._write({"op": "exit"})
                self.proc.wait(timeout=5)
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
        if not self.alive():
            if self.generation > 0:
                self.restarts += 1  # the previous worker died (crash, hang) or was closed: this is its replacement
            self.start()
        try:
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
        data = pickle.dumps(obj)
        try:
            self.proc.stdin.write(struct.pack("<Q", len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._crashed() from None

    def _read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        head = self._read_exact(8, deadline)
        (n,) = struct.unpack("<Q", head)
        return pickle.loads(self._read_exact(n, deadline))

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
