"""What the model is told after each attempt: the verifier's verdict, in words it can act on.

Owns: :class:`Attempt` (one round of the CoVeR loop as the next prompt shows it), :func:`verdict_feedback`
(a :class:`~xeforge.verifier.Verdict` -> status, headline and text: the gate that failed, the error text,
the worst mismatching element, the timing and the margin it had to beat), the ranking that decides which
attempt is "the best so far" (kept when older attempts are trimmed), and :func:`trim_attempts`.

Honesty rules: "ACCEPTED" only when ``verdict.accepted``; a correct kernel on a device that times nothing is
"CORRECT; speed not measured"; a correct kernel that gate 3 rejected is "REJECTED" and says by how much.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from xeforge.diagnosis.rules import describe

#: attempt status -> rank (higher is better) for "the best attempt so far"
STATUS_RANK = {"accepted": 6, "slower": 5, "correct-unmeasured": 5, "rejected": 2, "duplicate": 1, "invalid": 1,
               "no-code": 0}
#: the gate an attempt reached, for ranking rejected ones: failing later means closer to right
GATE_RANK = {"1-static": 0, "0-isolation": 1, "2-correctness": 2, "3-performance": 3}


@dataclass
class Attempt:
    chain: int  # which of the --best-k independent candidates (1-based)
    round: int  # CoVeR round within the chain (1-based)
    status: str  # accepted | slower | correct-unmeasured | rejected | invalid | no-code | duplicate
    headline: str
    feedback: str
    code: str | None = None
    summary: str = ""  # the model's own account of what it changed
    trial: str | None = None
    speedup: float | None = None
    failed_gate: str | None = None
    show_code: bool = field(default=False, compare=False)

    @property
    def rank(self) -> tuple:
        return (STATUS_RANK.get(self.status, 0), GATE_RANK.get(self.failed_gate or "", 0), self.speedup or 0.0,
                self.round)

    @property
    def score(self) -> float:
        """The attempt's status as a score in [0, 1] (1: accepted), the CoVeR module's measure of a round."""
        return STATUS_RANK.get(self.status, 0) / max(STATUS_RANK.values())

    @property
    def label(self) -> str:
        return f"attempt {self.round}" + (f" (candidate {self.chain})" if self.chain > 1 else "")


def _fmt_ms(stats: Any) -> str:
    if not isinstance(stats, dict) or stats.get("median_ms") is None:
        return "?"
    return f"{stats['median_ms']:.4f} ms (IQR {stats.get('iqr_ms', 0.0):.4f})"


def _perf_text(gate: Any) -> str:
    d = gate.details or {}
    if "speedup" not in d:
        return gate.summary
    margin = d.get("margin") or 0.0
    lines = [f"median speedup {d['speedup']:.3f}x over the current kernel; needed more than {1 + margin:.3f}x "
             f"(the A/A noise margin is {margin:.1%})",
             f"current kernel {_fmt_ms(d.get('incumbent'))}, this candidate {_fmt_ms(d.get('candidate'))}"
             + (f", timed on variant {d['variant']}" if d.get("variant") else "")]
    if d.get("floor_ms") is not None:
        lines.append(f"roofline floor {d['floor_ms']:.4f} ms")
    if gate.status == "fail" and d.get("speedup", 0) > 1 + margin:
        lines.append(gate.summary)  # implausible (below the roofline floor) rather than slow
    return "\n".join(lines)


def _gate_text(gate: Any) -> str:
    d = gate.details or {}
    if gate.gate == "1-static" and d.get("findings"):
        return "\n".join(f"- line {f.get('line')}: [{f.get('rule')}] {f.get('message')} (fix: {f.get('fix')})"
                         for f in d["findings"])
    text = gate.summary
    if gate.gate == "2-correctness":
        variant = str(d.get("variant", ""))
        if "ragged" in variant:
            text += ("\nThis failure is on a ragged shape (sizes that are not multiples of your block sizes): mask "
                     "every load and store against the real sizes.")
        if d.get("reason") == "constant":
            text += "\nThe output does not depend on the inputs: the kernel is not computing the function."
    if gate.gate == "0-isolation" and d.get("kind") == "timeout":
        text += "\nThe candidate did not finish in time: look for an unbounded loop or a grid far larger than needed."
    return text


#: characters of compiler facts and findings a verdict's feedback may carry
DIAGNOSIS_CHARS = 1600


def compiler_lines(diagnosis: Any, budget: int = DIAGNOSIS_CHARS) -> list[str]:
    """A candidate's compiler facts and the knowledge base's findings, as lines within ``budget`` characters
    (the findings first: they say what to change); [] where none were collected."""
    lines = describe(diagnosis)
    if not lines or not (diagnosis or {}).get("available"):
        return lines
    lines = [x for x in lines if x.startswith("diagnosis:")] + [x for x in lines if not x.startswith("diagnosis:")]
    out, used = [], 0
    for line in lines:
        if used + len(line) > budget:
            out.append(f"({len(lines) - len(out)} more line(s) of compiler facts left out)")
            break
        out.append(line)
        used += len(line) + 1
    return out


def verdict_feedback(verdict: Any, can_time: bool) -> tuple[str, str, str]:
    """(status, headline, text) for a verdict. ``can_time``: the device runs gate 3 at all. A correct verdict's
    text ends with its compiler facts and findings (what the compiler made of it; why it may not be faster)."""
    status, headline, text = _verdict_feedback(verdict, can_time)
    diagnosis = getattr(verdict, "diagnosis", None)
    available = getattr(verdict, "correct", False) and (diagnosis or {}).get("available")
    extra = compiler_lines(diagnosis) if available else []
    if extra:
        text = text.rstrip() + "\n" + "\n".join(extra)
    return status, headline, text


def _verdict_feedback(verdict: Any, can_time: bool) -> tuple[str, str, str]:
    failed = verdict.failed_gate
    if failed is not None:
        if failed.gate == "3-performance" and verdict.correct:
            return ("slower", "REJECTED: correct on every variant, but not faster than the current kernel beyond "
                    "the noise margin", _perf_text(failed))
        return "rejected", f"REJECTED at gate {failed.gate}", _gate_text(failed)
    perf = next((g for g in verdict.gates if g.gate == "3-performance"), None)
    if verdict.accepted:
        return ("accepted", "ACCEPTED: correct, and faster than the current kernel beyond the noise margin",
                _perf_text(perf) if perf is not None else "")
    if verdict.correct:
        passed = next((g for g in verdict.gates if g.gate == "2-correctness"), None)
        why = perf.summary if perf is not None else (
            "this device times nothing (correctness only)" if not can_time else "it was not timed")
        return ("correct-unmeasured", "CORRECT; speed not measured",
                (passed.summary + "\n" if passed is not None else "") + f"Speed not measured: {why}.")
    return "rejected", "NOT VERIFIED", verdict.note or "the verifier gave no verdict for this candidate"


def best_attempt(attempts: list[Attempt]) -> Attempt | None:
    return max(attempts, key=lambda a: a.rank) if attempts else None


def trim_attempts(attempts: list[Attempt], fits: Callable[[list[Attempt]], bool]) -> tuple[list[Attempt], list[str]]:
    """The attempts to show so that ``fits(shown)`` holds: the latest and the best show their code; the oldest
    others are dropped first; then the best one's code; the best and the latest attempts are always kept.
    Returns (shown, notes on what was trimmed)."""
    if not attempts:
        return [], []
    best = best_attempt(attempts)
    latest = attempts[-1]
    shown = [replace(a, show_code=(a is latest or a is best) and a.code is not None) for a in attempts]
    best_at = next(i for i, a in enumerate(attempts) if a is best)
    keep = {id(shown[best_at]), id(shown[-1])}
    notes: list[str] = []
    while not fits(shown):
        droppable = [a for a in shown if id(a) not in keep]
        if droppable:
            shown.remove(droppable[0])
            notes.append(f"dropped {droppable[0].label} ({droppable[0].headline})")
            continue
        coded = [a for a in shown if a.show_code and a is not shown[-1]]
        if coded:
            coded[0].show_code = False
            notes.append(f"dropped the code of {coded[0].label}")
            continue
        notes.append("the prompt is still larger than the context budget with only the best and latest attempts")
        break
    return shown, notes
