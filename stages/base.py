"""What a stage is: a goal, issue detectors, knowledge-base topics, deterministic tactics, a prompt template.

Owns: the :class:`Stage` and :class:`Tactic` interfaces and the data passed between a stage, an engine and
the pipeline (:class:`StageContext`, :class:`Issue`, :class:`Candidate`, :class:`Applicability`, and what an
engine returns for a stage: :class:`TacticRecord` with its :class:`TrialOutcome` list, both engines — the rules
engine in :mod:`xeforge.engines` and the llm engine in :mod:`cover_agent` — filling the same records), what the
incumbent's compile said of a kernel (:func:`compiled_facts`, :func:`incumbent_spills`), and :func:`guarded`,
which turns a detector's unexpected failure into one issue instead of an exception. A stage is one module in
``stages/`` plus its ``<name>.md.j2`` prompt template; adding one touches that module, its template, its KB
patterns and its tests.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from xeforge.analysis.observe import traces
from xeforge.kernel_model import KernelModel, parse_kernel
from xeforge.rewrite import NotApplicable

TEMPLATE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Issue:
    stage: str
    code: str
    message: str
    line: int | None = None

    def render(self) -> str:
        at = f" (line {self.line})" if self.line else ""
        return f"[{self.stage}/{self.code}] {self.message}{at}"


@dataclass(frozen=True)
class Applicability:
    applies: bool
    reason: str


@dataclass
class Candidate:
    source: str
    tactic: str
    description: str
    kind: str = "rewrite"  # rewrite: a transformation adopted when correct (and faster on a GPU); search: one point of a parameter search
    params: dict[str, Any] = field(default_factory=dict)
    # gate 3 times every timed shape, even when the primary does not improve: for a candidate meant for shapes other
    # than the primary (a per-shape dispatch, the incumbent at the primary by construction; an autotuned list that
    # holds the incumbent's configuration; divisibility hints or descriptors, for an odd shape), which the
    # primary-first cut would reject unseen; judged by the same rule over every shape
    time_all_shapes: bool = False


@dataclass
class TrialOutcome:
    trial: str  # trial folder name
    candidate: Candidate
    verdict: Any  # xeforge.verifier.Verdict
    adopted: bool = False  # became the incumbent (set by the pipeline)
    replayed: bool = False  # verdict replayed from the trial store (--resume)


#: what an engine calls to judge a candidate (may also have .prepare(list[Candidate]): parallel compile)
Evaluate = Callable[[Candidate], TrialOutcome]


@dataclass
class TacticRecord:
    name: str
    applies: bool
    reason: str
    engine: str = "rules"
    outcomes: list[TrialOutcome] = field(default_factory=list)
    best: TrialOutcome | None = None
    note: str = ""
    # the llm engine: what became of its answers and calls (e.g. {"no-code": 2, "rejected: 2-correctness": 1,
    # "timeout": 1, "stopped: budget": 1}); the pipeline's summary says from it why nothing was adopted
    tally: dict[str, int] = field(default_factory=dict)


@dataclass
class StageContext:
    """Everything a stage's detectors and tactics may read. Tactics never touch a device."""

    problem: Any  # xeforge.problem.Problem
    source: str  # the incumbent kernel source
    original_source: str
    device: Any  # xeforge.devices.DeviceInfo
    device_id: str | None  # knowledge-base device entry id
    kb: Any = None  # xeforge.kb.KnowledgeBase or None
    triton: Any = None  # xeforge.kb.TritonInfo or None
    settings: Any = None
    issues: list[Issue] = field(default_factory=list)
    run_dir: Path | None = None  # the run folder (engines may write per-trial artefacts under trials/<name>/)
    diagnosis: dict | None = None  # the incumbent's compiler facts and the KB's findings (xeforge.diagnosis)
    lost_at: tuple[str, ...] = ()  # timed shapes at which this source (a carried trial) was slower than the incumbent
    _model: KernelModel | None = field(default=None, repr=False)

    @property
    def model(self) -> KernelModel:
        if self._model is None or self._model.source != self.source:
            self._model = parse_kernel(self.source, str(getattr(self.problem, "kernel_path", "kernel.py")))
            self.observe()
        return self._model

    def observe(self) -> None:
        """Trace the source at every variant (in the facts worker, on the meta device), so what each launch
        really passes and which kernels really run is known to every detector and tactic reading it
        (:mod:`xeforge.analysis.launches`). A source that cannot be traced keeps the static reading."""
        if getattr(getattr(self.problem, "spec", None), "variants", None) is None:
            return
        try:
            traces(self.problem, self.source)
        except Exception:  # noqa: BLE001 — no trace: the tactics read the code alone and say so
            pass

    def with_source(self, source: str) -> "StageContext":
        return StageContext(self.problem, source, self.original_source, self.device, self.device_id, self.kb,
                            self.triton, self.settings, list(self.issues), self.run_dir,
                            diagnosis=self.diagnosis if source == self.source else None,
                            lost_at=self.lost_at if source == self.source else ())


class Tactic:
    """A deterministic transformation or search. Subclasses set ``name``/``summary`` and implement both methods."""

    name = "tactic"
    summary = ""

    def check(self, ctx: StageContext) -> Applicability:  # pragma: no cover - interface
        raise NotImplementedError

    def propose(self, ctx: StageContext) -> list[Candidate]:  # pragma: no cover - interface
        raise NotImplementedError

    def follow_up(self, ctx: StageContext, outcomes: list[TrialOutcome]) -> list[Candidate]:
        """Candidates built from the verdicts of this tactic's own candidates (``outcomes``), judged against the same
        incumbent before the stage chooses (e.g. the per-shape winners combined into one dispatch); none by default."""
        return []


def propose_safely(tactic: Tactic, ctx: StageContext) -> tuple[list[Candidate], str | None]:
    """``tactic.propose(ctx)``, or no candidates and what went wrong: a bug in one tactic is reported in the stage's
    record and the port goes on with the next tactic (as :class:`xeforge.rewrite.tiling.tactics.RewriteMemo` does
    for a failing rewrite inside ``check``)."""
    try:
        return tactic.propose(ctx), None
    except Exception as exc:  # noqa: BLE001 — any failure of the tactic's code, never the port's
        return [], f"the tactic failed while proposing ({type(exc).__name__}: {str(exc)[:300]}); nothing was proposed"


@dataclass
class Stage:
    name: str
    order: int
    goal: str
    kb_topics: tuple[str, ...]
    tactics: list[Tactic] = field(default_factory=list)
    detectors: list[Callable[[StageContext], list[Issue]]] = field(default_factory=list)
    llm_only_reason: str | None = None  # set for stages with no deterministic tactic by design

    @property
    def template(self) -> Path:
        return TEMPLATE_DIR / f"{self.name}.md.j2"

    def detect(self, ctx: StageContext) -> list[Issue]:
        out: list[Issue] = []
        for det in self.detectors:
            out.extend(det(ctx))
        return out

    def no_tactic_message(self) -> str:
        if self.llm_only_reason:
            return f"no deterministic tactic for {self.name}: {self.llm_only_reason} (the llm engine covers it)"
        return f"no tactic implemented for {self.name}"


def compiled_facts(diagnosis: dict[str, Any] | None, kernel: str) -> dict[str, Any]:
    """The incumbent's compiler facts for ``kernel`` at the primary shape (registers, spills, num_warps, ...);
    empty where none were read (the interpreter)."""
    if not diagnosis or not diagnosis.get("available"):
        return {}
    for k in diagnosis.get("kernels", []):
        if k.get("kernel") == kernel:
            return dict(k.get("facts") or {})
    return {}


def incumbent_spills(diagnosis: dict[str, Any] | None, kernel: str) -> int:
    """Registers ``kernel`` spilled in the incumbent at the primary shape; 0 where it spilled none or no facts
    were read."""
    return int(compiled_facts(diagnosis, kernel).get("spills") or 0)


def guarded(stage: str) -> Callable:
    """Decorate a detector so that an unexpected failure is reported as one issue instead of raised."""
    def wrap(detector: Callable) -> Callable:
        @functools.wraps(detector)
        def run(ctx: Any) -> list:
            try:
                return detector(ctx)
            except NotApplicable:
                return []
            except Exception as exc:  # a detector bug must not stop the analysis of the other stages
                return [Issue(stage, "analysis-failed", f"{detector.__name__} failed on this kernel "
                              f"({type(exc).__name__}: {exc})")]
        return run
    return wrap
