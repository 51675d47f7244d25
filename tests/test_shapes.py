"""Gate 3 over every timed shape (issue 17): the weighted objective, each shape's own margin, the primary first.

Timings are scripted through a stand-in worker, so the real decision code (:func:`xeforge.timing.decide_shapes`
and :meth:`xeforge.verifier.Verifier.performance`) runs on the CPU; no test here measures anything.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from tests.conftest import FIXTURES
from xeforge.problem import Code
from xeforge.timing import ShapeVerdict, decide, decide_shapes

SPEC = """kind: elementwise
precision: strict
inputs:
  X: {shape: [N], dtype: float32}
  Y: {shape: [N], dtype: float32}
ci:
  - params: [X, Y]
    dims: {N: 256}
bench-gpu:
  - params: [X, Y]
    dims: {N: 4096}
    weight: 2
bench-gpu-1:
  - params: [X, Y]
    dims: {N: 64}
bench-gpu-2:
  - params: [X, Y]
    dims: {N: 1000}
"""


def shape(name: str, speedup: float, weight: float = 1.0, margin: float = 0.02) -> ShapeVerdict:
    inc = [1.0] * 9
    return ShapeVerdict(name, weight, decide(inc, [1.0 / speedup] * 9, margin, None, 10.0))


def test_one_shape_slower_beyond_its_margin_blocks_a_candidate_the_objective_favours():
    d = decide_shapes([shape("bench-gpu", 1.30, weight=2), shape("bench-gpu-1", 0.95), shape("bench-gpu-2", 1.2)], [])
    assert d.objective > 1.1 and not d.accepted and d.blocked_by == "bench-gpu-1"
    assert "bench-gpu-1" in d.summary() and "0.950x" in d.summary()


def test_a_shape_within_its_own_margin_does_not_block():
    d = decide_shapes([shape("bench-gpu", 1.10), shape("bench-gpu-1", 0.99, margin=0.03)], [])
    assert d.accepted and d.blocked_by is None
    assert math.isclose(d.objective, math.sqrt(1.10 * 0.99), rel_tol=1e-9)


def test_the_objective_must_clear_the_weighted_margin():
    d = decide_shapes([shape("bench-gpu", 1.03, margin=0.02), shape("bench-gpu-1", 1.0, margin=0.05)], [])
    assert not d.accepted and d.blocked_by is None and "needed >" in d.summary()


def test_one_shape_reads_as_before():
    one = shape("bench-gpu", 1.5)
    assert decide_shapes([one], []).summary() == one.decision.summary()


def test_weights_must_be_positive(tmp_path):
    from xeforge.errors import SpecError
    from xeforge.problem import load_problem

    folder = _problem(tmp_path, SPEC.replace("weight: 2", "weight: 0"))
    with pytest.raises(SpecError) as exc:
        load_problem(folder)
    assert "bench-gpu.weight" in str(exc.value) or "weight" in str(exc.value)


# ------------------------------------------------------------------------------------------------ the verifier
def _problem(tmp_path, spec: str):
    folder = tmp_path / "p"
    folder.mkdir()
    for f in ("kernel.py", "reference.py"):
        (folder / f).write_text((FIXTURES / "problems" / "vadd" / f).read_text())
    (folder / "spec.yaml").write_text(spec)
    return folder


@pytest.fixture
def scripted(tmp_path, monkeypatch):
    """A GPU verifier whose worker times each slot by a script: ms[(source tag, N)]."""
    from xeforge import devices, verifier as vmod
    from xeforge.problem import load_problem
    from xeforge.settings import Settings
    from tests.test_timing import _FakeWorker

    script: dict[tuple[str, int], float] = {}
    timed: list[int] = []

    class Worker(_FakeWorker):
        sources: dict[str, str] = {}

        def request(self, op, timeout, **kw):
            if op == "load":
                Worker.sources[kw["slot"]] = kw["source"].strip()
                return {}
            if op == "time":
                n = kw["plan"][0]["shape"][0]
                timed.append(n)
                return {"times_ms": {s: [script[(Worker.sources[s], n)]] * kw["pairs"] for s in kw["slots"]}}
            return {}

    monkeypatch.setattr(vmod, "Worker", Worker)
    problem = load_problem(_problem(tmp_path, SPEC))
    gpu = dataclasses.replace(devices.describe("cpu"), kind="cuda", interpreter=False)
    v = vmod.Verifier(problem, gpu, Settings(), tmp_path / "work")
    return v, script, timed


def _set(script, inc: dict[int, float], cand: dict[int, float]):
    for n, ms in inc.items():
        script[("# inc", n)] = ms
    for n, ms in cand.items():
        script[("# cand", n)] = ms


def test_gate3_rejects_a_candidate_slower_at_one_shape_and_names_it(scripted):
    v, script, timed = scripted
    _set(script, {4096: 1.0, 64: 1.0, 1000: 1.0}, {4096: 0.7, 64: 1.2, 1000: 0.8})
    res = v.performance(Code("# inc\n", "inc.py"), Code("# cand\n", "cand.py"))
    assert res.status == "fail" and res.details["blocked_by"] == "bench-gpu-1"
    assert "bench-gpu-1" in res.summary and "slower" in res.summary
    assert [s["variant"] for s in res.details["shapes"]] == ["bench-gpu", "bench-gpu-1", "bench-gpu-2"]
    assert set(timed) == {4096, 64, 1000}


def test_gate3_times_the_other_shapes_only_when_the_primary_improves(scripted):
    v, script, timed = scripted
    _set(script, {4096: 1.0, 64: 1.0, 1000: 1.0}, {4096: 1.0, 64: 0.5, 1000: 0.5})
    res = v.performance(Code("# inc\n", "inc.py"), Code("# cand\n", "cand.py"))
    assert res.status == "fail" and res.details["untimed"] == ["bench-gpu-1", "bench-gpu-2"]
    assert set(timed) == {4096} and "not timed" in res.summary


def test_gate3_accepts_a_candidate_faster_on_the_weighted_objective(scripted):
    v, script, _ = scripted
    _set(script, {4096: 1.0, 64: 1.0, 1000: 1.0}, {4096: 0.8, 64: 1.0, 1000: 0.9})
    res = v.performance(Code("# inc\n", "inc.py"), Code("# cand\n", "cand.py"))
    assert res.status == "pass", res.summary
    speedups = {s["variant"]: s["speedup"] for s in res.details["shapes"]}
    want = math.exp((2 * math.log(1.25) + math.log(1.0) + math.log(1 / 0.9)) / 4)
    assert math.isclose(res.details["objective"], want, rel_tol=1e-9) and speedups["bench-gpu"] == pytest.approx(1.25)


# ------------------------------------------------------------------------------------- candidates timed at every shape
# A per-shape dispatch (device_tuning's per-shape-config) is the incumbent at the primary by construction: it asks gate 3
# for every shape (Candidate.time_all_shapes -> Verifier.verify/performance(all_shapes=True)), and is judged by the
# same rule over every shape. An ordinary candidate with the same timings is still cut off at the primary.
def _adopted(v, res):
    """What the pipeline adopts of one outcome with gate 3's result ``res`` (its real choice, on a GPU)."""
    from stages.base import Candidate, TrialOutcome
    from xeforge.pipeline import Pipeline
    from xeforge.verifier import Verdict

    verdict = Verdict("h", gates=[res], correct=True, timed=True, accepted=res.status == "pass",
                      speedup=res.details.get("speedup"), margin=res.details.get("margin"))
    outcome = TrialOutcome("0001-device_tuning-per-shape-config", Candidate("# cand\n", "per-shape-config", "d",
                                                                            time_all_shapes=True), verdict)
    return Pipeline._choose(None, [outcome], v.device) is outcome


def test_a_per_shape_candidate_faster_at_the_decode_shape_and_equal_at_the_primary_is_adopted(scripted):
    v, script, timed = scripted
    _set(script, {4096: 1.0, 64: 1.0, 1000: 1.0}, {4096: 1.0, 64: 0.5, 1000: 1.0})
    res = v.performance(Code("# inc\n", "inc.py"), Code("# cand\n", "cand.py"), all_shapes=True)
    assert res.status == "pass", res.summary
    assert set(timed) == {4096, 64, 1000} and res.details["untimed"] == [] and res.details["all_shapes"]
    assert res.details["improved"] == ["bench-gpu-1"] and "faster at bench-gpu-1" in res.summary
    assert "timed at every shape" in res.summary
    assert res.details["speedup"] == pytest.approx(2 ** 0.25)  # weights 2, 1, 1: only the decode shape gained 2x
    assert _adopted(v, res)


def test_the_same_timings_do_not_pass_an_ordinary_candidate(scripted):
    v, script, timed = scripted
    _set(script, {4096: 1.0, 64: 1.0, 1000: 1.0}, {4096: 1.0, 64: 0.5, 1000: 1.0})
    res = v.performance(Code("# inc\n", "inc.py"), Code("# cand\n", "cand.py"))
    assert res.status == "fail" and res.details["untimed"] == ["bench-gpu-1", "bench-gpu-2"] and set(timed) == {4096}
    assert not res.details["all_shapes"] and not _adopted(v, res)


def test_a_per_shape_candidate_slower_at_another_shape_is_rejected_and_the_shape_named(scripted):
    v, script, _ = scripted
    _set(script, {4096: 1.0, 64: 1.0, 1000: 1.0}, {4096: 1.0, 64: 0.5, 1000: 1.1})
    res = v.performance(Code("# inc\n", "inc.py"), Code("# cand\n", "cand.py"), all_shapes=True)
    assert res.status == "fail" and res.details["blocked_by"] == "bench-gpu-2", res.summary
    assert "slower at bench-gpu-2" in res.summary and "faster at bench-gpu-1" in res.summary
    assert not _adopted(v, res)


def test_a_per_shape_candidate_must_still_clear_the_weighted_margin(scripted):
    v, script, _ = scripted
    _set(script, {4096: 1.0, 64: 1.0, 1000: 1.0}, {4096: 1.0, 64: 0.99, 1000: 1.0})
    res = v.performance(Code("# inc\n", "inc.py"), Code("# cand\n", "cand.py"), all_shapes=True)
    assert res.status == "fail" and res.details["blocked_by"] is None and "needed >" in res.summary


def test_the_pipeline_passes_the_request_to_gate_3_only_for_candidates_that_ask(tmp_path):
    from stages.base import Candidate
    from stages.device_tuning import STAGE
    from xeforge.pipeline import Pipeline, PortOptions
    from xeforge.problem import load_problem
    from xeforge.store import RunStore
    from xeforge.verifier import Verdict

    seen = []

    class Recorder:
        def verify(self, path, incumbent=None, *, source_hash="", **kw):
            seen.append(kw)
            return Verdict(source_hash, correct=True)

    pipe = Pipeline(load_problem(_problem(tmp_path, SPEC)), PortOptions(device="cpu"))
    store = RunStore(tmp_path / "run")
    inc = store.root / "baseline" / "kernel.py"
    for i, asks in enumerate((True, False)):
        cand = Candidate(f"# cand {i}\n", "per-shape-config", "d", time_all_shapes=asks)
        pipe._evaluate(store, Recorder(), STAGE, cand, inc, "# inc\n")
    assert seen == [{"all_shapes": True}, {}]


def test_the_final_gate_times_every_shape_after_a_per_shape_adoption(tmp_path):
    """A per-shape gain is at shapes other than the primary: the final kernel is judged against the start there too
    (and only then: an ordinary port's final gate is unchanged)."""
    from xeforge.pipeline import Pipeline, PortOptions
    from xeforge.problem import load_problem
    from xeforge.store import RunStore
    from xeforge.verifier import Verdict

    seen = []

    class Recorder:
        def restart_worker(self):
            pass

        def verify(self, path, incumbent=None, *, source_hash="", **kw):
            seen.append(kw)
            return Verdict(source_hash, correct=True, timed=True, accepted=True, speedup=1.1)

    pipe = Pipeline(load_problem(_problem(tmp_path, SPEC)), PortOptions(device="cpu"))
    store = RunStore(tmp_path / "run")
    start, port = store.root / "baseline" / "kernel.py", store.root / "trials" / "0001" / "candidate.py"
    for path, text in ((start, "# start\n"), (port, "# port\n")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for asked in (True, False):
        final = pipe._final(store, Recorder(), type("D", (), {"can_time": True})(), [start, port], start,
                            all_shapes=asked)
        assert final["improved"]
    assert seen == [{"all_shapes": True}, {}]


def test_a_final_kernel_refused_at_one_shape_gives_way_to_the_runner_up_of_its_choice(tmp_path):
    """gemv_decode on the H200: the search adopted its highest objective (0.978x at B = 8, within that shape's margin
    at gate 3); the final gate measured 0.969x there and refused it. A runner-up faster at every shape was accepted
    too: the final gate tries it before it gives up, and the kernel before the port is never reached."""
    from xeforge.pipeline import Pipeline, PortOptions
    from xeforge.problem import load_problem
    from xeforge.store import RunStore
    from xeforge.verifier import GateResult, Verdict

    pipe = Pipeline(load_problem(_problem(tmp_path, SPEC)), PortOptions(device="cpu"))
    store = RunStore(tmp_path / "run")
    start = store.root / "baseline" / "kernel.py"
    best, second, third = (store.root / "trials" / f"000{i}" / "candidate.py" for i in (1, 6, 2))
    for path in (start, best, second, third):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {path.parent.name}\n")
    tried = []

    class Final:
        def restart_worker(self):
            pass

        def verify(self, path, incumbent=None, *, source_hash="", **kw):
            tried.append(path.parent.name)
            ok = path != best  # the adopted kernel is refused at one shape now
            gate3 = GateResult("3-performance", "pass" if ok else "fail",
                               "faster" if ok else "not adopted: slower at bench-gpu-1: 0.969x, beyond its margin")
            return Verdict(source_hash, [gate3], correct=True, timed=True, accepted=ok, speedup=1.7 if ok else 2.0)

    gpu = type("D", (), {"can_time": True})()
    final = pipe._final(store, Final(), gpu, [start, best], start, alternates={best: [second, third]})
    assert tried == ["0001", "0006"] and final["improved"] and final["from"] == "trials/0006/candidate.py"
    # the report says which kernel was refused first, and why (on the H200, gemm_square's final kernel was an
    # earlier trial than its last adoption, and nothing said why)
    assert [f["from"] for f in final["refused"]] == ["trials/0001/candidate.py"]
    assert "slower at bench-gpu-1: 0.969x" in final["refused"][0]["why"]
    # every candidate refused: the start is returned, with the first refusal's verdict as the reason
    tried.clear()
    Final.verify = lambda self, path, incumbent=None, *, source_hash="", **kw: (
        tried.append(path.parent.name), Verdict(source_hash, correct=True, timed=True, accepted=False, speedup=0.97))[1]
    final = pipe._final(store, Final(), gpu, [start, best], start, alternates={best: [second, third]})
    assert tried == ["0001", "0006", "0002"] and not final["improved"] and final["is_start"]
    # the tries are bounded (each is a whole cascade): a long history stops after FINAL_TRIES refusals
    from xeforge.pipeline import FINAL_TRIES

    tried.clear()
    pipe._final(store, Final(), gpu, [start, third, second, best], start, alternates={best: [second, third]})
    assert len(tried) == FINAL_TRIES
