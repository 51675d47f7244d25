"""What a port run came to: why nothing was adopted, per stage and in all, and the exit status that says so.

Owns: :func:`stage_verdict` (a stage's "verified" cell: verified, N rejected — by gate —, or what became of the
llm engine's answers when none reached the verifier), :func:`why_nothing_adopted` (the summary's cause when the
starting kernel is returned: every candidate failed gate N, correct candidates that need a GPU to rank or were not
faster, no kernel in the model's answers, timeouts, the budget spent), :func:`llm_answered` and :func:`outcome`
(``improved`` | ``rewritten`` | ``unchanged`` | ``no-usable-answer``), and :data:`EXIT_CODES`, the status ``xeforge port`` exits
with (documented in docs/llm.md). Everything reads the report's stage dicts (``report.json``'s ``stages``), so
the pipeline and the report views say the same thing.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

#: ``xeforge port`` exit status per outcome (an error is 1: xeforge.cli)
EXIT_CODES = {"improved": 0, "rewritten": 0, "unchanged": 0, "no-usable-answer": 3}

#: tally key -> words, for the llm engine's answers and calls (cover_agent.engine writes the keys)
_WORDS = {"no-code": "answer(s) with no kernel", "invalid": "invalid kernel file(s)",
          "duplicate": "duplicate answer(s)", "call timeout": "call(s) timed out",
          "call transport": "call(s) that found no server", "call server": "server error(s)",
          "call rate-limit": "rate-limited call(s)", "call context": "prompt(s) too long for the context window",
          "stopped: budget": "stopped: the budget was spent", "stopped: timeout": "stopped: the model timed out",
          "stopped: context": "stopped: the brief does not fit the context window"}


def _candidates(stages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for s in stages for t in s.get("tactics", []) for c in t.get("candidates", [])]


def _failed_gate(c: dict[str, Any]) -> str | None:
    return next((g["gate"] for g in c.get("gates", []) if g.get("status") == "fail"), None)


def _tally(stages: Iterable[dict[str, Any]]) -> Counter:
    out: Counter = Counter()
    for s in stages:
        for t in s.get("tactics", []):
            out.update(t.get("tally") or {})
    return out


def _tally_words(tally: Counter, keys: Iterable[str] | None = None) -> list[str]:
    picked = [k for k in (keys if keys is not None else _WORDS) if tally.get(k)]
    extra = sorted(k for k in tally if k.startswith(("call ", "stopped: ")) and k not in _WORDS and tally[k])
    return [f"{tally[k]} {_WORDS.get(k, k)}" if not k.startswith("stopped: ") else _WORDS.get(k, k)
            for k in picked + (extra if keys is None else [])]


def _rejections(cands: list[dict[str, Any]]) -> str:
    gates = Counter(_failed_gate(c) or "unknown gate" for c in cands if not c.get("correct"))
    return ", ".join(f"gate {g}: {n}" for g, n in sorted(gates.items()))


def stage_verdict(stage: dict[str, Any]) -> str:
    """The stage table's "verified" cell."""
    cands = _candidates([stage])
    if any(c.get("adopted") for c in cands):
        return "verified"
    if cands:
        wrong = [c for c in cands if not c.get("correct")]
        right = len(cands) - len(wrong)
        parts = ([f"{len(wrong)} rejected ({_rejections(cands)})"] if wrong else []) + (
            [f"{right} correct, not adopted"] if right else [])
        return "; ".join(parts)
    words = _tally_words(_tally([stage]))
    return ("no candidate: " + ", ".join(words)) if words else "not run"


def llm_answered(stages: list[dict[str, Any]]) -> bool:
    """Some answer of the llm engine reached the verifier."""
    return any(c for s in stages for t in s.get("tactics", []) if t.get("engine") == "llm" for c in t.get("candidates", []))


def llm_ran(stages: list[dict[str, Any]], fallback: str | None) -> bool:
    return bool(fallback) or any(t.get("engine") == "llm" for s in stages for t in s.get("tactics", []))


def why_nothing_adopted(stages: list[dict[str, Any]], can_time: bool, fallback: str | None = None) -> str:
    """Why the starting kernel is returned, counted over the run's stages."""
    cands = _candidates(stages)
    tally = _tally(stages)
    wrong = [c for c in cands if not c.get("correct")]
    right = len(cands) - len(wrong)
    parts = []
    if cands and not right:
        parts.append(f"all {len(cands)} candidate(s) failed verification ({_rejections(cands)})")
    elif right and not can_time:
        parts.append(f"{right} of {len(cands)} candidate(s) correct, none adopted (search results need a GPU to rank; "
                     "speed is not measured on the CPU interpreter)"
                     + (f"; {len(wrong)} rejected ({_rejections(cands)})" if wrong else ""))
    elif right:
        parts.append(f"{right} of {len(cands)} candidate(s) correct, none faster than the incumbent beyond the noise "
                     "margin" + (f"; {len(wrong)} rejected ({_rejections(cands)})" if wrong else ""))
    words = _tally_words(tally)
    if words:
        parts.append(("the model's answers: " if not cands else "besides, ") + ", ".join(words))
    if fallback:
        parts.append(f"engine fallback: {fallback}")
    if not parts:
        parts.append("no stage produced a candidate")
    return "starting kernel returned: nothing adopted — " + "; ".join(parts)


def outcome(stages: list[dict[str, Any]], final: dict[str, Any], fallback: str | None) -> str:
    """``no-usable-answer`` when the llm engine ran and none of its answers reached the verifier (no kernel,
    timeouts, budget, or a failure that --engine auto fell back from); else ``improved`` (a verified speedup),
    ``rewritten`` (a correct kernel whose speed was not measured) or ``unchanged`` (the starting kernel)."""
    if llm_ran(stages, fallback) and not llm_answered(stages):
        return "no-usable-answer"
    if final.get("improved"):
        return "improved"
    return "unchanged" if final.get("is_start") else "rewritten"
