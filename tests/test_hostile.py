"""Hostile candidates that hide a torch fallback (``tests/hostile.py``), on the CPU interpreter through the real
verifier: gate 1 names each one's class; with gate 1 out of the way, gate 2's run-time checks (the account below
Python, the work accounting) still reject it, naming what ran. The honest starting kernel passes both."""

from __future__ import annotations

import json

import pytest

from tests import hostile
from xeforge.analysis.account import account_problems
from xeforge.analysis.trace import Trace
from xeforge.devices import describe
from xeforge.problem import Code, load_problem
from xeforge.settings import Settings
from xeforge.verifier import Verifier


@pytest.fixture(scope="module")
def verifier(tmp_path_factory):
    p = load_problem(hostile.START.parent)
    v = Verifier(p, describe("cpu"), Settings(compile_timeout_s=60.0, run_timeout_s=60.0, correctness_rounds=1),
                 tmp_path_factory.mktemp("hostile"))
    yield v
    v.close()


@pytest.mark.parametrize("name", sorted(hostile.CASES))
def test_gate1_names_the_class(verifier, name):
    rules, _, _ = hostile.CASES[name]
    g1 = verifier.static(hostile.source(name), f"{name}.py")
    assert g1.status == "fail", f"{name} passed gate 1"
    found = {f["rule"] for f in g1.details["findings"]}
    assert set(rules) <= found, f"{name}: {sorted(found)} lacks {rules}: {g1.summary}"
    assert hostile.CLASS_WORDS[name] in g1.summary, g1.summary


@pytest.mark.parametrize("name", sorted(hostile.CASES))
def test_runtime_checks_reject_it_without_gate1(verifier, name):
    _, reason, _ = hostile.CASES[name]
    g0, g2 = verifier.correctness(Code(hostile.source(name), f"{name}.py"))
    assert g0.passed, g0.summary
    assert g2 is not None and g2.status == "fail", f"{name} passed gate 2 with gate 1 bypassed"
    assert reason in g2.summary, f"{name}: {reason!r} not in {g2.summary!r}"


@pytest.mark.parametrize("name", sorted(hostile.CASES))
def test_the_account_alone_sees_it(verifier, name):
    """The account below Python on its own (the Python-level trace left aside): what it names for each."""
    _, _, seen = hostile.CASES[name]
    variant = verifier.correctness_variants()[0][0]
    _, facts = verifier._run(Code(hostile.source(name), f"{name}.py"), variant, 7, "normal", rerun=False)
    launches = len(Trace.from_json(variant.name, facts["trace"]).launches)
    kernels = set(verifier.static_checker.starting.functions)
    problem = account_problems(facts["account"], verifier._start_account(variant), kernels, launches)
    assert problem is not None and seen in problem, f"{name}: {seen!r} not in {problem!r}"


def test_the_start_passes_with_its_account(verifier):
    verdict = verifier.verify(verifier.problem.kernel_path)
    assert verdict.correct, verdict.feedback()
    assert verifier._start_accounts, "no run-time account was taken"
    acct = next(iter(verifier._start_accounts.values()))
    assert acct["ranges"]["call"] == 1 and acct["ranges"]["launch"] >= 2 and not acct["aten"]


def test_the_llm_engine_port_does_not_adopt_the_dummy_launch(tmp_path):
    """The issue's own path: the dummy launch served to `port --engine llm --stages fusion` (a scripted model, the
    real engine and pipeline). It was the port's final kernel; now it is rejected and the start is the result."""
    from cover_agent.config import LMConfig
    from cover_agent.scripted import kernel_answer, scripted
    from xeforge.pipeline import Pipeline, PortOptions

    model = scripted([kernel_answer(hostile.source("dummy_launch"), "fused the ReLU; the GEMM is launched once")])
    settings = Settings(compile_timeout_s=60.0, run_timeout_s=60.0, correctness_rounds=1)
    cfg = LMConfig(max_iters=1, best_k=1, retries=0).with_lm(model.lm())
    opts = PortOptions(device="cpu", engine="llm", stages=["fusion"], llm=cfg, settings=settings,
                       run_dir=tmp_path / "run")
    report = Pipeline(load_problem(hostile.START.parent), opts).run()
    (cand,) = report["stages"][0]["tactics"][0]["candidates"]
    assert not cand["correct"] and not cand["adopted"]
    assert "S021-torch-internals" in json.dumps(cand) and "the mode stack" in json.dumps(cand), cand
    final = (tmp_path / "run" / "final" / "kernel.py").read_text()
    assert "_pop_torch_function_stack" not in final and final.strip() == hostile.START.read_text().strip()


def _account(aten: dict, device: dict, owners: dict) -> dict:
    return {"aten": aten, "in_launch": {}, "threads": {}, "device": device, "device_owner": owners,
            "launched": {"kern": 1}, "ranges": {"call": 1, "launch": 1}, "device_activity": True}


def test_a_torch_op_of_the_users_host_code_that_picks_another_device_kernel_is_not_a_stranger():
    """On the H100 a MoE wrapper's ``torch.cat`` ran CatArrayBatchedCopy at a larger block where the start's ran
    another copy kernel: the same aten operator, as often, so the candidate was wrongly rejected. A device kernel
    the starting call's operators do not explain (another operator, or none: a raw launch) still is one."""
    start = _account({"aten::cat": 1}, {"CatCopy_small": 1}, {"cat|CatCopy_small": 1})
    same_op = _account({"aten::cat": 1}, {"CatArrayBatchedCopy": 1}, {"cat|CatArrayBatchedCopy": 1})
    assert account_problems(same_op, start, {"kern"}, 1) is None
    gemm = _account({"aten::cat": 1}, {"CatCopy_small": 1, "sm90_gemm": 1},
                    {"cat|CatCopy_small": 1, "mm|sm90_gemm": 1})
    why = account_problems(gemm, start, {"kern"}, 1)
    assert why and "sm90_gemm" in why and "CatCopy" not in why.split("shows what")[1], why
    raw = _account({"aten::cat": 1}, {"CatArrayBatchedCopy": 1}, {"-|CatArrayBatchedCopy": 1})
    assert "CatArrayBatchedCopy" in (account_problems(raw, start, {"kern"}, 1) or "")
    older = _account({"aten::cat": 1}, {"CatArrayBatchedCopy": 1}, {})
    older.pop("device_owner")  # an account without owners: every extra kernel is a stranger, as before
    assert account_problems(older, start, {"kern"}, 1)
