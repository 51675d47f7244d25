"""Gate 3: the statistics on CPU (synthetic times), and the A/A test on a real GPU (skipped elsewhere, with why)."""

from __future__ import annotations

import random

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import FIXTURES, ROOT, skip_without_gpu
from xeforge.timing import LATE_RETRIES, Stats, decide, delay_flushes, noise_margin, roofline_floor, timed_call


def test_stats_median_and_iqr():
    s = Stats.of([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.median_ms == 3.0 and s.q1_ms == 2.0 and s.q3_ms == 4.0 and s.iqr_ms == 2.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=6, max_size=60), st.floats(0.0, 0.05))
def test_identical_distributions_are_never_a_win(times, jitter):
    """A/A on synthetic data: shuffled copies of the same sample never clear the margin."""
    rng = random.Random(len(times))
    a = list(times)
    b = [t * (1 + rng.uniform(-jitter, jitter)) for t in rng.sample(times, len(times))]
    margin = noise_margin(a, b, 0.02)
    assert margin >= 0.02
    d = decide(a, b, margin, None, 10.0)
    assert not d.accepted or d.speedup > 1 + margin  # accepted only beyond the margin
    same = decide(a, list(a), noise_margin(a, list(a), 0.02), None, 10.0)
    assert not same.accepted


def test_clear_win_is_accepted_and_huge_win_flagged():
    inc = [1.0 + 0.01 * (i % 3) for i in range(20)]
    cand = [t / 1.5 for t in inc]
    d = decide(inc, cand, 0.02, None, 10.0)
    assert d.accepted and 1.45 < d.speedup < 1.55 and not d.flagged
    big = decide(inc, [t / 20 for t in inc], 0.02, None, 10.0)
    assert big.flagged


def test_below_roofline_is_rejected():
    floor = roofline_floor(flop=2e12, nbytes=None, peak_flops=1e15, bw=None)  # 2 ms at best
    d = decide([5.0] * 10, [1.0] * 10, 0.02, floor, 10.0)
    assert not d.accepted and d.implausible and "roofline" in d.implausible


def test_the_floor_of_a_variant_without_a_dtype_follows_its_inputs(tmp_path):
    """``xeforge new`` gives dtypes per input, not per bench variant: gate 3's floor at a bf16 GEMM shape takes the
    bf16 peak (on the H100, the fp32 peak's floor, 2.05 ms at 4096^3, rejected every correct 0.23 ms candidate)."""
    from types import SimpleNamespace

    from xeforge.kb import load_kb
    from xeforge.problem import load_problem
    from xeforge.verifier import Verifier

    d = tmp_path / "p"
    d.mkdir()
    (d / "kernel.py").write_text((ROOT / "kernels" / "gemm_square" / "kernel.py").read_text())
    spec = (ROOT / "kernels" / "gemm_square" / "spec.yaml").read_text()
    head = "bench-gpu:\n  - params: [A, B]\n"
    assert head + "    dtype: bfloat16\n" in spec
    (d / "spec.yaml").write_text(spec.replace(head + "    dtype: bfloat16\n", head, 1))  # no dtype of its own
    p = load_problem(d)
    bench = p.spec.variants["bench-gpu"]
    assert bench.dtype is None and p.compute_dtype(bench) == "bfloat16"
    entry = load_kb().devices["h100"]
    floor = Verifier._floor(SimpleNamespace(device_entry=entry, problem=p), bench)
    assert floor == pytest.approx(roofline_floor(bench.flop, bench.bytes, entry.peak_flops("bf16"),
                                                 entry.bandwidth_bytes_per_s))
    assert floor * 1e3 < 0.2  # 2 * 4096^3 at 989 TFLOP/s: 0.14 ms, not the fp32 peak's 2.05


@given(st.floats(0.0, 50.0), st.floats(0.001, 5.0))
def test_launch_delay_covers_the_host_time_within_its_cap(host_ms, flush_ms):
    k = delay_flushes(host_ms, flush_ms)
    assert k >= 1
    assert k * flush_ms <= max(20.0, flush_ms) + 1e-9  # never more than the cap (or one flush)
    if max(4 * host_ms, 0.5) + flush_ms <= 20.0:  # within the cap: the writes outlast 4x the host's launch work
        assert k * flush_ms >= max(4 * host_ms, 0.5)


def test_launch_delay_degenerate_inputs_fall_back_to_one_flush():
    assert delay_flushes(0.1, 0.0) == 1
    assert delay_flushes(float("nan"), 0.03) == 1
    assert delay_flushes(0.0, 0.025) == 21  # the 0.5 ms floor: 20 writes of 25 us, + 1
    assert delay_flushes(0.2, 0.025) == 33  # 4 x 200 us of host work / 25 us per write, + 1


class _FakeWorker:
    """Stands in for a worker process: records what it is asked, replies as a worker would."""

    def __init__(self, kind, workdir, log=None, **kw):
        self.workdir = Path(workdir)
        self.generation = 1
        self.requests: list[tuple[str, dict]] = []

    def alive(self) -> bool:
        return True

    def spawn(self) -> None:
        pass

    def request(self, op, timeout, **kw):
        self.requests.append((op, kw))
        if op == "time":
            return {"times_ms": {s: [1.0] * kw["pairs"] for s in kw["slots"]}}
        return {}

    def close(self):
        pass


def test_slots_follow_the_source_not_the_file_name(tmp_path, monkeypatch):
    """Every trial's file is called candidate.py; each source must get its own slot (a slot named after the file
    let the worker time the previous incumbent's module), and an A/A run two independent loads of one source."""
    from xeforge import devices, verifier as vmod
    from xeforge.problem import load_problem
    from xeforge.settings import Settings

    monkeypatch.setattr(vmod, "Worker", _FakeWorker)
    problem = load_problem(FIXTURES / "problems" / "vadd")
    v = vmod.Verifier(problem, devices.describe("cpu"), Settings(), tmp_path / "work")
    first, second = tmp_path / "t1" / "candidate.py", tmp_path / "t2" / "candidate.py"
    for path, text in ((first, "# incumbent 1\n"), (second, "# incumbent 2\n")):
        path.parent.mkdir()
        path.write_text(text)
    variant = problem.timing_variant("cpu")
    v.time_entries([(first, None), (first, None), (second, None)], variant, pairs=2)
    loads = [kw for op, kw in v.worker.requests if op == "load"]
    assert [kw["source"] for kw in loads] == ["# incumbent 1\n", "# incumbent 1\n", "# incumbent 2\n"]
    assert len({kw["slot"] for kw in loads}) == 3  # the A/A pair is two slots
    timed = [kw for op, kw in v.worker.requests if op == "time"][-1]
    assert timed["slots"] == [kw["slot"] for kw in loads]
    v.time_entries([(first, None), (second, None)], variant, pairs=2)
    assert len([1 for op, _ in v.worker.requests if op == "load"]) == 3  # loaded slots are reused


def test_aa_on_gpu_is_never_accepted(tmp_path):
    """The same kernel timed against itself, interleaved, must never be accepted as faster (GPU only)."""
    kind = skip_without_gpu()
    from xeforge import devices
    from xeforge.problem import load_problem
    from xeforge.settings import Settings
    from xeforge.verifier import Verifier

    problem = load_problem(FIXTURES / "problems" / "vadd")
    with Verifier(problem, devices.describe(kind), Settings(), tmp_path) as v:
        for _ in range(5):
            r = v.aa_test(problem.kernel_path)
            assert r["margin"] >= 0.02
            assert not r["accepted"], r


class _FakeRuntime:
    """Stands in for xeforge.devices.Runtime on the CPU: a clock instead of device events, a log of flushes."""

    def __init__(self, late: int = 0) -> None:
        self.log: list = []
        self.now = 0.0
        self.late = late  # how many start events the device reaches before the host has issued the call

    def synchronize(self) -> None:
        self.log.append("sync")

    def event(self):
        rt = self

        class Event:
            def record(self):
                rt.now += 0.25  # every recorded event is 0.25 "ms" after the previous one
                self.t = rt.now
                rt.log.append("record")

            def elapsed_time(self, other):
                return other.t - self.t

            def query(self):
                rt.late -= 1
                return rt.late >= 0

        return Event()

    def flush_l2(self, l2_bytes, repeats: int = 1) -> None:
        self.log.append(("flush", repeats))


def test_worker_timing_loop_delays_every_call_and_interleaves():
    """The GPU-only timing loop, driven on the CPU with a fake runtime: sync, then the flush repeated as many
    times as delay_flushes says for the measured host time, then the call between its two events."""
    from xeforge.inputs import TensorPlan
    from xeforge.worker import WorkerState

    w = WorkerState("cpu")
    w.rt = fake = _FakeRuntime()
    calls: list[str] = []
    w.models = {"a": lambda x: calls.append("a"), "b": lambda x: calls.append("b")}
    reply = w.time(["a", "b"], [TensorPlan("x", (4,), "float32")], seed=1, pairs=4, warmup=2, l2_bytes=None,
                   budget_bytes=None)
    assert reply["delay_flushes"] == delay_flushes(reply["host_ms_max"], reply["flush_ms"])
    assert reply["flush_ms"] == pytest.approx(0.25)
    timed = calls[4:]  # after 2 warm-up calls of each model
    # interleaved in one cyclic order: no model runs twice in a row (its weights' translations would be warm)
    assert timed == ["a", "b", "a", "b", "a", "b", "a", "b"]
    assert all(len(t) == 4 for t in reply["times_ms"].values())
    flushes = [e for e in fake.log if isinstance(e, tuple)]
    assert flushes[-8:] == [("flush", reply["delay_flushes"])] * 8  # every timed call, after the flush probes
    i = len(fake.log) - 1 - fake.log[::-1].index(("flush", reply["delay_flushes"]))
    assert fake.log[i - 1] == "sync" and fake.log[i + 1] == "record"  # sync, flush+delay, start event


@pytest.mark.parametrize("late, retried", [(0, 0), (2, 2), (9, LATE_RETRIES)])
def test_a_call_the_host_issued_late_is_measured_again_with_a_longer_delay(late, retried):
    """When the device reached the start event before the host had issued the call (the host stalled: another lane
    compiling), the interval holds host time: the call is measured again with twice the delay, at most
    LATE_RETRIES times, and the count is returned."""
    fake = _FakeRuntime(late=late)
    calls = []
    ms, n_late, delay = timed_call(fake, lambda: calls.append(1), None, 3, 0.25)
    assert n_late == retried and len(calls) == retried + 1 and ms == pytest.approx(0.25)
    assert delay == min(3 * 2 ** retried, delay_flushes(float("inf"), 0.25))
    assert [e for e in fake.log if isinstance(e, tuple)][-1] == ("flush", delay)


def test_prewarm_compiles_every_correctness_shape(tmp_path, monkeypatch):
    """Prewarm must compile each candidate on the timing variant and on every shape gate 2 runs (each shape is a
    separate Triton specialization); the cascade's serial first calls are what it exists to avoid."""
    import dataclasses

    from xeforge import devices, verifier as vmod
    from xeforge.problem import load_problem
    from xeforge.settings import Settings

    seen: list[tuple[str, str]] = []

    class FakeWorker(_FakeWorker):
        def request(self, op, timeout, **kw):
            if op == "run":
                seen.append((kw["slot"], repr(kw["plan"])))
            return {}

    monkeypatch.setattr(vmod, "Worker", FakeWorker)
    problem = load_problem(FIXTURES / "problems" / "vadd")
    gpu = dataclasses.replace(devices.describe("cpu"), kind="cuda", interpreter=False)
    v = vmod.Verifier(problem, gpu, Settings(), tmp_path)
    wanted = {problem.timing_variant("cuda").name} | {var.name for var, _ in v.correctness_variants()}
    assert len(wanted) >= 2  # the fixture has ci, bench-gpu and ragged shapes on a GPU
    assert v.prewarm(["# a\n", "# b\n"]) == 2
    plans = {plan for _, plan in seen}
    assert len(seen) == 2 * len(wanted) and len(plans) == len(wanted)


def test_an_aa_margin_far_beyond_the_noise_is_measured_once_more(tmp_path, monkeypatch):
    """The incumbent against itself 1.5x apart (a disturbed run) would set a margin no candidate beats: that A/A is
    measured again and the second stands; an ordinary one is measured once."""
    import dataclasses

    from xeforge import devices, verifier as vmod
    from xeforge.problem import load_problem
    from xeforge.settings import Settings

    monkeypatch.setattr(vmod, "Worker", _FakeWorker)
    problem = load_problem(FIXTURES / "problems" / "vadd")
    gpu = dataclasses.replace(devices.describe("cpu"), kind="cuda", interpreter=False)
    v = vmod.Verifier(problem, gpu, Settings(), tmp_path)
    steady = [1.0 + 0.001 * (i % 3) for i in range(20)]
    disturbed = [1.0 if i % 2 else 1.5 for i in range(20)]
    runs = [[steady, disturbed], [steady, steady], [steady, steady]]
    monkeypatch.setattr(v, "_time", lambda codes, variant: runs.pop(0))
    variant = problem.timing_variant("cuda")
    margin, aa = v.margin_for(problem.kernel_path, variant)
    assert margin < vmod.AA_SUSPECT and aa["remeasured"] and len(runs) == 1
    v._margins.clear()
    margin, aa = v.margin_for(problem.kernel_path, variant)
    assert "remeasured" not in aa and not runs
