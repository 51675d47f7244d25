"""Compiling the CoVeR module's prompts with a DSPy optimizer, the verifier as the metric (optional; never run
by ``xeforge port``).

Owns: :func:`make_trainset` (one ``dspy.Example`` per problem: its stage brief, the signature kind, and the
problem it came from), :func:`check_answer` (a verifier's verdict on one answer -> :class:`~cover_agent.module.Check`,
in the words and ranking the engine uses), :func:`verdict_metric` (the metric DSPy's optimizers call: the
verifier's score of the module's best answer), and :func:`compile_cover` (``dspy.BootstrapFewShot`` over
:class:`~cover_agent.module.CoVeR`: the answers the verifier passed become demos of the predictor that gave them).

The verifier itself is passed in (``verify_code(problem, code) -> Verdict``): this package sits below the
pipeline and the verification cascade, so ``scripts/compile_prompts.py`` builds the briefs and verifiers from
problem folders and calls this module (docs/llm.md, "Compiling the prompts with a DSPy optimizer"). Nothing
here claims the compiled prompts are better: only a run against the suite with a real model can say.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import dspy

from cover_agent.extract import extract_code, validate_code
from cover_agent.feedback import Attempt, verdict_feedback
from cover_agent.module import Check, CoVeR


@dataclass
class Problem:
    """What the verifier needs to know of a trainset example: its name, current kernel and device."""

    name: str
    source: str  # the kernel the answer must replace (what validation compares against)
    can_time: bool = False


@dataclass
class MetricLog:
    """Every verdict the metric read (for a report of the compile, and for tests)."""

    scores: list[tuple[str, float]] = field(default_factory=list)


def make_trainset(items: Iterable[tuple[Problem, str, str]]) -> list[dspy.Example]:
    """``(problem, brief, kind)`` -> examples whose inputs are ``brief``, ``kind`` and ``problem``."""
    return [dspy.Example(brief=brief, kind=kind, problem=problem).with_inputs("brief", "kind", "problem")
            for problem, brief, kind in items]


def check_answer(answer: Any, problem: Problem, verify_code: Callable[[Problem, str], Any]) -> Check:
    """One answer (a ``dspy.Prediction`` with ``kernel_code``) -> its Check: no code or invalid code never
    reaches the verifier (score 0); otherwise the verifier's verdict in the engine's words and ranking."""
    ext = extract_code(getattr(answer, "kernel_code", None), None)
    if ext.code is None:
        return Check(ext.problem, 0.0)
    problems = validate_code(ext.code, problem.source)
    if problems:
        return Check("The code was not sent to the verifier:\n" + "\n".join(f"- {p}" for p in problems), 0.0)
    verdict = verify_code(problem, ext.code)
    status, headline, text = verdict_feedback(verdict, problem.can_time)
    score = Attempt(1, 1, status, headline, text).score
    return Check(f"{headline}\n{text}", score, done=status in ("accepted", "correct-unmeasured"))


def verdict_metric(threshold: float = 5 / 6, log: MetricLog | None = None) -> Callable[..., bool]:
    """The metric: the verifier's score of the module's best answer (``prediction.score``, which ``verify``
    computed in :meth:`CoVeR.forward`) reaches ``threshold`` (default: correct; 1.0: accepted as faster)."""

    def metric(example: Any, prediction: Any, trace: Any = None) -> bool:
        score = float(getattr(prediction, "score", 0.0) or 0.0)
        if log is not None:
            log.scores.append((getattr(example.problem, "name", "?"), score))
        return score >= threshold

    return metric


def compile_cover(trainset: list[dspy.Example], verify_code: Callable[[Problem, str], Any], lm: Any, *,
                  rounds: int = 2, max_demos: int = 2, threshold: float = 5 / 6,
                  log: MetricLog | None = None) -> CoVeR:
    """BootstrapFewShot over the CoVeR module with ``lm``: each example runs the loop (up to ``rounds`` rounds,
    the verifier checking every answer); the predictor calls of the examples the metric passes become demos.
    Returns the compiled module (``.save(path)`` writes its demos and instructions as JSON)."""

    def verify(answer: Any, problem: Problem) -> Check:
        return check_answer(answer, problem, verify_code)

    student = CoVeR(verify=verify, rounds=rounds)
    optimizer = dspy.BootstrapFewShot(metric=verdict_metric(threshold, log), max_bootstrapped_demos=max_demos,
                                      max_labeled_demos=0, max_rounds=1)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter(use_json_adapter_fallback=False)):
        return optimizer.compile(student, trainset=trainset)
