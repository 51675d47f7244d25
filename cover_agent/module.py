"""The CoVeR loop as a ``dspy.Module``: generate -> verify -> refine, with one predictor per signature.

Owns: :class:`CoVeR` — the stage's predictors (``analyze``, ``optimize``, ``rewrite``, ``discover``: one
``dspy.Predict`` per signature in :mod:`cover_agent.signatures`, so ``named_predictors()`` lists them and DSPy's
optimizers can give them demos or new instructions) and :meth:`CoVeR.forward`, the loop itself: ask the
stage's predictor for a kernel, hand the answer to the ``verify`` callable (the verifier; it returns a
:class:`Check`: the feedback text and a score), and refine with the feedback until ``verify`` says done or the
rounds are spent; :class:`Round` (one round as the loop saw it).

The module knows nothing of run folders, budgets or the trial store: :class:`~cover_agent.engine.LLMEngine`
passes ``ask`` (the predictor call through :class:`~cover_agent.client.LMClient`: budget, records, errors, the
context-overflow trim) and ``revise`` (the next round's brief, rendered from the stage template with the
attempts so far); without them, the predictor is called directly and the feedback is appended to the brief —
the form :mod:`cover_agent.optimize` compiles. Under an optimizer, only the best round's predictor call stays
in DSPy's trace, so a demo is the answer the verifier scored best, never a rejected one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import dspy

from cover_agent.signatures import SIGNATURES
from xeforge.errors import EngineError

#: signature kind (``SIGNATURES``) -> the CoVeR predictor's attribute name
PREDICTORS = {"analysis": "analyze", "optimization": "optimize", "algorithmic": "rewrite", "discovery": "discover"}


@dataclass
class Check:
    """What ``verify`` says of one answer: the words the next round reads, a score (higher is better; the
    verifier's verdict, e.g. 1.0 correct, 0.0 rejected) and whether to stop refining (accepted)."""

    feedback: str
    score: float
    done: bool = False


@dataclass
class Round:
    number: int  # 1-based
    brief: str
    answer: Any  # what ``ask`` returned: a dspy.Prediction, or the engine's CallResult
    check: Check


def default_revise(brief: str, rounds: list[Round]) -> str:
    """The next brief when the caller renders none: the first brief, then each earlier attempt's feedback."""
    shown = "\n\n".join(f"Attempt {r.number} (score {r.check.score:g}):\n{r.check.feedback}" for r in rounds)
    return f"{brief}\n\nEarlier attempts and the verifier's verdicts:\n\n{shown}\n"


class CoVeR(dspy.Module):
    """generate -> verify -> refine for one stage; ``named_predictors()`` lists the four predictors."""

    def __init__(self, verify: Callable[[Any, Any], Check] | None = None, rounds: int = 3) -> None:
        super().__init__()
        self.analyze = dspy.Predict(SIGNATURES["analysis"][0])
        self.optimize = dspy.Predict(SIGNATURES["optimization"][0])
        self.rewrite = dspy.Predict(SIGNATURES["algorithmic"][0])
        self.discover = dspy.Predict(SIGNATURES["discovery"][0])
        self.verify = verify
        self.rounds = rounds

    def predictor(self, kind: str) -> dspy.Predict:
        """The predictor for signature ``kind`` (``analysis``, ``optimization``, ``algorithmic``, ``discovery``)."""
        if kind not in PREDICTORS:
            raise EngineError("llm engine", f"no predictor for the signature kind {kind!r}",
                              f"a stage template's signature must be one of {', '.join(PREDICTORS)}")
        return getattr(self, PREDICTORS[kind])

    def forward(self, brief: str, kind: str = "optimization", problem: Any = None,
                verify: Callable[[Any, Any], Check] | None = None, rounds: int | None = None,
                ask: Callable[[dspy.Predict, str], Any] | None = None,
                revise: Callable[[str, list[Round]], str] | None = None) -> dspy.Prediction:
        """Up to ``rounds`` rounds on ``brief``; ``verify(answer, problem)`` checks each answer (``problem``: what
        the caller passed, e.g. a trainset example's problem folder). Returns the best round's answer
        (``answer``), its ``score`` and ``feedback``, and every round (``rounds``). Exceptions from ``ask`` or
        ``verify`` end the loop."""
        verify = verify or self.verify
        if verify is None:
            raise EngineError("CoVeR module", "no verifier to check the answers against",
                              "pass verify= (a callable: (answer, problem) -> Check) to CoVeR(...) or to the call")
        predictor = self.predictor(kind)
        ask = ask or (lambda pred, text: pred(brief=text))
        revise = revise or default_revise
        history: list[Round] = []
        trace = dspy.settings.trace  # the optimizer's record of predictor calls (None outside a compile)
        spans: list[tuple[int, int]] = []
        for number in range(1, (rounds or self.rounds) + 1):
            text = brief if not history else revise(brief, history)
            start = len(trace) if trace is not None else 0
            answer = ask(predictor, text)
            spans.append((start, len(trace) if trace is not None else 0))
            check = verify(answer, problem)
            history.append(Round(number, text, answer, check))
            if check.done:
                break
        best = max(history, key=lambda r: r.check.score) if history else None
        if trace is not None and best is not None:
            # an optimizer makes demos of the traced calls: keep only the best round's, not the rejected ones
            kept = trace[spans[best.number - 1][0]:spans[best.number - 1][1]]
            del trace[spans[0][0]:]
            trace.extend(kept)
        return dspy.Prediction(answer=best.answer if best else None, score=best.check.score if best else 0.0,
                               feedback=best.check.feedback if best else "", rounds=history)
