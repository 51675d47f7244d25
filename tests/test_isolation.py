"""The worker after a kernel fault: a GPU fault poisons the process's device context, so the worker replies,
exits, and the parent gives the next candidate a fresh worker (one faulting candidate must not fail every
candidate after it, as it did for gemm_square on the H200: docs/measurements/h200-ports/gemm_square/report.md)."""

from __future__ import annotations

import pytest

from xeforge.isolation import Worker, WorkerFailure
from xeforge.worker import failure_reply


class _State:
    def __init__(self, healthy: bool) -> None:
        self._healthy = healthy

    def healthy(self) -> bool:
        return self._healthy


def _raise(msg: str) -> BaseException:
    try:
        raise RuntimeError(msg)
    except RuntimeError as exc:
        return exc


def test_a_fault_that_leaves_the_device_unusable_is_marked_poisoned():
    exc = _raise("CUDA error: an illegal instruction was encountered")
    bad = failure_reply(exc, _State(healthy=False))
    assert bad["poisoned"] and bad["error"] == "RuntimeError" and "illegal instruction" in bad["message"]
    fine = failure_reply(_raise("shape mismatch"), _State(healthy=True))
    assert "poisoned" not in fine  # an ordinary exception keeps the worker (and its compiled slots)


def test_the_parent_replaces_a_poisoned_worker(tmp_path):
    w = Worker("cpu", tmp_path)
    killed = []
    w.alive = lambda: True
    w.kill = lambda: killed.append(True)
    w._write = lambda obj: None
    w._read = lambda timeout: {"ok": False, "error": "AcceleratorError", "message": "CUDA error: illegal instruction",
                               "poisoned": True}
    with pytest.raises(WorkerFailure) as info:
        w.request("run", 1.0)
    assert killed and info.value.kind == "exception" and "next candidate gets a new worker" in info.value.detail
    w._read = lambda timeout: {"ok": False, "error": "ValueError", "message": "bad input"}
    killed.clear()
    with pytest.raises(WorkerFailure):
        w.request("run", 1.0)
    assert not killed  # an ordinary exception does not cost a restart


def test_a_cpu_worker_is_always_healthy(tmp_path):
    from xeforge.worker import WorkerState

    assert WorkerState("cpu").healthy()


def test_a_worker_on_a_gpu_that_lanes_share_hands_its_free_memory_back(monkeypatch):
    """Four lanes of the real-world corpus ran each other out of memory on an 80 GB H100: each worker's allocator
    kept the peak of its last request. Where lanes share the GPU the worker is told so and empties its cache after
    each request; alone on it, or on the CPU, nothing changes."""
    from types import SimpleNamespace

    from xeforge.isolation import worker_command
    from xeforge.worker import WorkerState

    monkeypatch.delenv("XEFORGE_GPU_LOCK", raising=False)
    assert "--shared-gpu" not in worker_command([], "cuda")
    monkeypatch.setenv("XEFORGE_GPU_LOCK", "/tmp/cuda-0.lock")
    assert worker_command([], "cuda")[-3:] == ["--device", "cuda", "--shared-gpu"]
    assert "--shared-gpu" not in worker_command([], "cpu")
    emptied = []
    state = WorkerState.__new__(WorkerState)
    state.torch, state.device = SimpleNamespace(cuda=SimpleNamespace(empty_cache=lambda: emptied.append(1))), "cuda"
    state.release_cached()
    assert emptied == [1]
    state.device = "cpu"
    state.release_cached()  # nothing to hand back
    assert emptied == [1]
