"""The CoVeR loop as a dspy.Module (cover_agent.module) and the pieces of its optional compile
(cover_agent.optimize): predictors listed, the loop's refine and stopping rules, the engine calling through the
module, the metric reading verdicts. The compile end to end, with the real verifier, is in test_cover_loop.py
(whose verifier is shared by the module)."""

from __future__ import annotations

import dspy
import pytest

from cover_agent.module import Check, CoVeR
from cover_agent.scripted import kernel_answer, scripted
from tests.conftest import FIXTURES
from xeforge.errors import EngineError
from xeforge.problem import load_problem

VADD = FIXTURES / "problems" / "vadd"
START = load_problem(VADD).kernel_source
GOOD = START.replace("cdiv(n, 64)", "cdiv(n, 128)").replace("BLOCK=64", "BLOCK=128")
WRONG = GOOD.replace("x + y, mask=mask", "x - y, mask=mask")


def test_the_module_lists_one_predictor_per_signature():
    from cover_agent.signatures import SIGNATURES

    module = CoVeR()
    named = dict(module.named_predictors())
    assert set(named) == {"analyze", "optimize", "rewrite", "discover"}
    assert {p.signature.__name__ for p in named.values()} == {
        sig.__name__ for sig, _ in SIGNATURES.values()}
    assert module.predictor("algorithmic") is named["rewrite"]
    with pytest.raises(EngineError):
        module.predictor("poetry")


def test_forward_refines_with_the_feedback_until_verify_says_done():
    model = scripted([kernel_answer("wrong one"), kernel_answer("right one"), kernel_answer("never asked")])
    seen = []

    def verify(answer, problem):
        seen.append((answer.kernel_code, problem))
        ok = "right" in answer.kernel_code
        return Check("ACCEPTED" if ok else "REJECTED: the sign is wrong", 1.0 if ok else 0.0, done=ok)

    with dspy.context(lm=model.lm(), adapter=dspy.ChatAdapter(use_json_adapter_fallback=False)):
        pred = CoVeR(verify=verify, rounds=3)(brief="make it faster", problem="p1")
    assert [p for _, p in seen] == ["p1", "p1"] and model.remaining == 1  # stopped once done
    assert pred.score == 1.0 and "right one" in pred.answer.kernel_code and len(pred.rounds) == 2
    # the second request carried the first verdict (refine), the first did not
    first, second = model.prompts()
    assert "the sign is wrong" in second and "the sign is wrong" not in first


def test_forward_without_a_verifier_says_how_to_give_one():
    with pytest.raises(EngineError) as err:
        CoVeR()(brief="x")
    assert "verify=" in err.value.render()


def test_the_engine_calls_through_the_module_predictors(tmp_path):
    """LLMEngine's calls go through its CoVeR module: a demo put on the module's predictor reaches the model."""
    from cover_agent.client import LMClient
    from cover_agent.config import LMConfig
    from cover_agent.engine import LLMEngine

    model = scripted([kernel_answer(GOOD)])
    cfg = LMConfig(max_iters=1, best_k=1, retries=0).with_lm(model.lm())
    engine = LLMEngine(cfg, LMClient(cfg, progress=lambda m: None), progress=lambda m: None)
    engine.module.optimize.demos = [dspy.Example(brief="DEMO BRIEF", changes="demo change", kernel_code="demo code")]
    result = engine.client.call("optimization", "the brief", "test", engine.module.predictor("optimization"))
    assert result.fields is not None and "DEMO BRIEF" in model.prompts()[0]


def test_the_metric_fails_an_example_the_verifier_rejects():
    """No demo from an answer the verifier rejected: the metric is the verdict, not the answer's existence."""
    from cover_agent import optimize

    problem = optimize.Problem("p", START)
    rejected = type("V", (), {"failed_gate": type("G", (), {"gate": "2-correctness", "summary": "mismatch",
                                                            "details": {}})(), "correct": False, "accepted": False,
                              "gates": [], "note": "", "diagnosis": None})()
    check = optimize.check_answer(dspy.Prediction(kernel_code=f"```python\n{GOOD}```"), problem,
                                  lambda p, code: rejected)
    assert check.score < 5 / 6 and "REJECTED at gate 2-correctness" in check.feedback and not check.done
    assert optimize.check_answer(dspy.Prediction(kernel_code="no code here"), problem, None).score == 0.0
    log = optimize.MetricLog()
    metric = optimize.verdict_metric(log=log)
    example = optimize.make_trainset([(problem, "brief", "optimization")])[0]
    assert metric(example, dspy.Prediction(score=check.score)) is False and log.scores == [("p", check.score)]
