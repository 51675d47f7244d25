"""Check lanes (xeforge.check_lanes): a tactic's candidates checked side by side by several verifiers, their
verdicts continued by gate 3 on the port's own verifier, and a port that uses them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from xeforge.check_lanes import CheckLanes, lane_envs
from xeforge.devices import describe
from xeforge.problem import load_problem, source_hash
from xeforge.settings import Settings
from xeforge.verifier import Verifier


def test_lanes_take_the_visible_gpus_in_turn():
    assert lane_envs("cuda", 3, {"CUDA_VISIBLE_DEVICES": "3,5"}) == [{"CUDA_VISIBLE_DEVICES": v} for v in "353"]
    assert lane_envs("xpu", 2, {}, count=1) == [{"ZE_AFFINITY_MASK": "0"}] * 2  # one GPU: the lanes share it
    assert lane_envs("cuda", 2, {}, count=4) == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    assert lane_envs("cpu", 2, {"CUDA_VISIBLE_DEVICES": "1"}) == [{}, {}]


def test_candidates_are_checked_side_by_side_and_gate_3_continues_their_verdicts(tmp_path):
    problem = load_problem(ROOT / "kernels" / "vector_add")
    start = problem.kernel_source
    wrong = start.replace("x + y, mask=mask", "x - y, mask=mask")
    offset = start.replace("x + y, mask=mask", "x + y + 1.0, mask=mask")
    assert len({start, wrong, offset}) == 3
    settings = Settings(compile_timeout_s=60.0, run_timeout_s=30.0, correctness_rounds=1)
    device = describe("cpu")
    made = []

    def make(folder, env):
        made.append(folder)
        return Verifier(problem, device, settings, folder, cache=tmp_path / "triton-cache", hide=tmp_path, env=env)

    said = []
    with Verifier(problem, device, settings, tmp_path) as main, \
            CheckLanes(2, tmp_path / "lanes", "cpu", main, make, said.append) as lanes:
        verdicts = lanes.check([start, wrong, offset, start])  # the same source twice is checked once
        assert made == [tmp_path / "lanes" / "lane-1"] and lanes.checked == 3
        # a lane's workers write the port's Triton cache and are sandboxed away from the whole run folder
        lane = lanes.verifiers[1]
        assert lane.worker.hidden == (tmp_path.resolve(),) and lane.oracle_worker.hidden == (tmp_path.resolve(),)
        assert (tmp_path / "triton-cache").resolve() in lane.worker.writable
        assert set(verdicts) == {source_hash(s) for s in (start, wrong, offset)}
        assert verdicts[source_hash(start)].correct
        for bad in (wrong, offset):
            v = verdicts[source_hash(bad)]
            assert not v.correct and v.failed_gate.gate == "2-correctness", v.feedback()
        used = {g.details.get("lane") for v in verdicts.values() for g in v.gates if g.gate == "2-correctness"}
        assert used == {0, 1}, used  # both lanes took candidates
        assert "lane 1: cpu" in said[0]

        # gate 3 continues a checked verdict: the port's verifier runs nothing more for it
        path = tmp_path / "cand.py"
        path.write_text(wrong)
        loaded = dict(main._slots)
        checked = verdicts[source_hash(wrong)]
        assert main.verify(path, problem.kernel_path, source_hash=source_hash(wrong), checked=checked) is checked
        assert main._slots == loaded
        with pytest.raises(ValueError):
            main.verify(path, problem.kernel_path, source_hash=source_hash(start), checked=checked)
    assert not lane.worker.alive() and not lane.oracle_worker.alive()  # the lanes it made are closed with it


@pytest.mark.slow  # a port of gemm_relu's device-tuning stage on the interpreter (about 30 s)
def test_a_port_checks_a_search_in_lanes_and_says_so(tmp_path):
    """The launch search proposes two candidates at once: two lanes check them, and the report says where."""
    proc = subprocess.run([sys.executable, "-m", "xeforge", "port", str(ROOT / "kernels" / "gemm_relu"), "--device",
                           "cpu", "--engine", "rules", "--stages", "device_tuning", "--check-lanes", "2",
                           "--runs-dir", str(tmp_path), "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(proc.stdout)
    assert rep["check_lanes"]["lanes"] == 2 and rep["check_lanes"]["checked"] >= 2
    assert "check lanes: 2 (lane 0: the port's verifier; lane 1: cpu)" in proc.stderr
    trials = [json.loads(p.read_text()) for p in sorted((tmp_path / "gemm_relu").glob("*/trials/*/verdict.json"))]
    lanes = [g["details"].get("lane") for t in trials for g in t["gates"] if g["gate"] == "2-correctness"]
    assert 1 in lanes and 0 in lanes, lanes
    assert rep["outcome"] in {"rewritten", "unchanged"} and rep["final"]["verdict"]["correct"]
