"""xeforge.outcome: why nothing was adopted, per stage and in all, and the exit status, from report stage dicts."""

from __future__ import annotations

from xeforge.outcome import EXIT_CODES, outcome, stage_verdict, why_nothing_adopted
from xeforge.report_views import port_view


def cand(correct: bool, gate: str | None = None, adopted: bool = False) -> dict:
    gates = [{"gate": "0-isolation", "status": "pass"}] + ([{"gate": gate, "status": "fail"}] if gate else [])
    return {"trial": "0001", "correct": correct, "adopted": adopted, "gates": gates}


def stage(*cands, engine: str = "llm", tally: dict | None = None) -> dict:
    return {"name": "memory_access", "tactics": [{"name": "llm", "engine": engine, "candidates": list(cands),
                                                  "tally": tally or {}}]}


def test_all_candidates_failed_names_the_gates():
    stages = [stage(cand(False, "2-correctness"), cand(False, "2-correctness")), stage(cand(False, "1-static"))]
    why = why_nothing_adopted(stages, can_time=False)
    assert why == ("starting kernel returned: nothing adopted — all 3 candidate(s) failed verification "
                   "(gate 1-static: 1, gate 2-correctness: 2)")
    assert "search results need a GPU" not in why
    assert stage_verdict(stages[0]) == "2 rejected (gate 2-correctness: 2)"
    assert outcome(stages, {"improved": False, "is_start": True}, None) == "unchanged"


def test_no_code_timeouts_and_budget_are_counted():
    tally = {"no-code": 2, "call timeout": 1, "stopped: budget": 1}
    stages = [stage(tally=tally)]
    why = why_nothing_adopted(stages, can_time=True)
    assert "the model's answers: 2 answer(s) with no kernel, 1 call(s) timed out, stopped: the budget was spent" in why
    assert stage_verdict(stages[0]).startswith("no candidate: 2 answer(s) with no kernel")
    result = outcome(stages, {"improved": False, "is_start": True}, None)
    assert result == "no-usable-answer" and EXIT_CODES[result] == 3


def test_correct_but_unranked_on_the_cpu_and_not_faster_on_a_gpu():
    stages = [stage(cand(True), cand(False, "2-correctness"), engine="rules")]
    assert "1 of 2 candidate(s) correct, none adopted (search results need a GPU to rank" in why_nothing_adopted(
        stages, can_time=False)
    assert "none faster than the incumbent beyond the noise margin; 1 rejected" in why_nothing_adopted(stages, True)
    assert stage_verdict(stages[0]) == "1 rejected (gate 2-correctness: 1); 1 correct, not adopted"
    assert outcome(stages, {"improved": False, "is_start": True}, None) == "unchanged"  # the rules engine: exit 0


def test_report_view_shows_rejections_not_not_run():
    report = {"stages": [stage(cand(False, "2-correctness")), stage(cand(True, adopted=True)),
                         {"name": "fusion", "tactics": []}]}
    assert [s["verified"] for s in port_view(report)["stages"]] == ["1 rejected (gate 2-correctness: 1)", "verified",
                                                                    "not run"]


def test_a_fallback_without_llm_answers_is_no_usable_answer():
    stages = [stage(cand(True, adopted=True), engine="rules")]
    assert outcome(stages, {"improved": True}, "the llm engine could not start: nothing answers") == "no-usable-answer"
    assert outcome(stages, {"improved": True}, None) == "improved"
    assert outcome(stages, {"improved": False, "is_start": False}, None) == "rewritten"
