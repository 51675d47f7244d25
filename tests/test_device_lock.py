"""Lanes sharing one GPU (xeforge.device_lock): timing alone, everything else shared, timers first."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from xeforge import bench, device_lock, schedule
from xeforge.isolation import Worker


class Holder(threading.Thread):
    """Holds the lock for ``op`` in a thread of its own until ``release`` is set (its own file descriptors, so
    flock treats it as another holder, as another process would be)."""

    def __init__(self, path: str, op: str) -> None:
        super().__init__(daemon=True)
        self.path, self.op = path, op
        self.acquired, self.release = threading.Event(), threading.Event()
        self.mode = None

    def run(self) -> None:
        with device_lock.hold(self.op, "cuda", self.path) as mode:
            self.mode = mode
            self.acquired.set()
            self.release.wait(10)


def _start(path: str, op: str) -> Holder:
    h = Holder(path, op)
    h.start()
    return h


def test_no_lock_without_a_path_or_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.delenv(device_lock.ENV, raising=False)
    with device_lock.hold("time", "cuda") as mode:
        assert mode == "none"
    with device_lock.hold("time", "cpu", str(tmp_path / "l")) as mode:
        assert mode == "none"
    assert not (tmp_path / "l").exists()


def test_shared_holders_overlap_and_a_timer_waits_for_them(tmp_path):
    path = str(tmp_path / "gpu.lock")
    a, b = _start(path, "run"), _start(path, "load")
    assert a.acquired.wait(5) and b.acquired.wait(5)  # two correctness lanes at once
    assert (a.mode, b.mode) == ("shared", "shared")
    t = _start(path, "time")
    assert not t.acquired.wait(0.3)  # the timer waits for both
    a.release.set()
    assert not t.acquired.wait(0.3)
    b.release.set()
    assert t.acquired.wait(5) and t.mode == "exclusive"
    t.release.set()


def test_a_timer_has_the_device_alone_and_goes_before_later_lanes(tmp_path):
    path = str(tmp_path / "gpu.lock")
    r1 = _start(path, "run")
    assert r1.acquired.wait(5)
    t = _start(path, "time")
    time.sleep(0.2)  # the timer is waiting now
    r2 = _start(path, "run")  # a lane that asks after the timer
    assert not t.acquired.wait(0.3) and not r2.acquired.wait(0.1)
    r1.release.set()
    assert t.acquired.wait(5)
    assert not r2.acquired.wait(0.3)  # not while the timer times
    t.release.set()
    assert r2.acquired.wait(5)
    r2.release.set()


def test_a_killed_lane_leaves_the_device_free(tmp_path):
    path = str(tmp_path / "gpu.lock")
    code = ("import sys, time; from xeforge import device_lock\n"
            "with device_lock.hold('time', 'cuda', sys.argv[1]):\n    print('held', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        r = _start(path, "run")
        assert not r.acquired.wait(0.3)
        proc.kill()
        assert r.acquired.wait(5)
        r.release.set()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("op, mode", [("time", "exclusive"), ("profile", "exclusive"), ("deep", "exclusive"),
                                      ("run", "shared"), ("load", "shared")])
def test_a_gpu_worker_request_holds_the_lock_for_its_op(tmp_path, monkeypatch, op, mode):
    monkeypatch.setenv(device_lock.ENV, str(tmp_path / "gpu.lock"))
    seen = []
    w = Worker("cuda", tmp_path / "w")
    monkeypatch.setattr(w, "alive", lambda: True)
    monkeypatch.setattr(w, "_await_hello", lambda timeout: None)
    monkeypatch.setattr(w, "_write", lambda obj: seen.append(("write", obj["op"])))

    def read(timeout):
        # what a third party sees while the request is in flight
        other = _start(str(tmp_path / "gpu.lock"), "run")
        seen.append(("other lane ran during it", other.acquired.wait(0.3)))
        other.release.set()
        return {"ok": True}

    monkeypatch.setattr(w, "_read", read)
    assert w.request(op, 1.0) == {"ok": True}
    assert seen == [("write", op), ("other lane ran during it", mode == "shared")]


def test_bench_lanes_share_one_lock_per_gpu(tmp_path):
    four = schedule.gpu_slots("cuda", 2, env={}, count=2, cpus=32, lanes=2, lock_dir=tmp_path)
    assert [s["CUDA_VISIBLE_DEVICES"] for s in four] == ["0", "0", "1", "1"]
    assert [s[device_lock.ENV] for s in four] == [str(tmp_path / "cuda-0.lock")] * 2 + [str(tmp_path / "cuda-1.lock")] * 2
    assert {s["TORCHINDUCTOR_COMPILE_THREADS"] for s in four} == {"4"}  # half of 32 CPUs over 4 lanes
    assert device_lock.ENV not in schedule.gpu_slots("cuda", 2, env={}, count=2)[0]  # one lane per GPU: no lock
    opt = bench.BenchOptions(problems=[], lanes_per_gpu=2)
    assert "2 problems at once per GPU" in bench.timing_method(type("D", (), {"can_time": True, "kind": "cuda"}),
                                                             bench.bench_settings(opt, "cuda", env={}), 20, 2)


def test_lanes_on_the_cpu_interpreter_are_refused_with_the_fix(tmp_path):
    from tests.conftest import FIXTURES
    from xeforge.errors import UsageError

    VADD = FIXTURES / "problems" / "vadd"

    with pytest.raises(UsageError) as err:
        bench.run_bench(bench.BenchOptions(problems=[str(VADD)], device="cpu", lanes_per_gpu=2, out=tmp_path / "o"))
    assert "--lanes-per-gpu" in str(err.value) and "--workers" in err.value.fix
    with pytest.raises(UsageError):
        bench.run_bench(bench.BenchOptions(problems=[str(VADD)], device="cpu", lanes_per_gpu=0, out=tmp_path / "o"))
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_lane_locks_live_in_the_bench_folder_unless_one_is_given(tmp_path, monkeypatch):
    slots = schedule.gpu_slots("cuda", 1, env={}, count=1, cpus=16, lanes=2)
    monkeypatch.delenv(device_lock.ENV, raising=False)
    own = schedule.lane_locks(slots, tmp_path / "gpu-locks")
    assert {s[device_lock.ENV] for s in own} == {str(tmp_path / "gpu-locks" / "cuda-0.lock")}
    assert (tmp_path / "gpu-locks").is_dir()
    monkeypatch.setenv(device_lock.ENV, "/tmp/shared-gpu0.lock")  # two benches on one machine
    assert {s[device_lock.ENV] for s in schedule.lane_locks(slots, tmp_path / "other")} == {"/tmp/shared-gpu0.lock"}
    assert not (tmp_path / "other").exists()
