"""The style corpus: naive problems, each written the ways people write Triton code (issue 14).

tests/fixtures/styles/<problem>/ holds one problem (reference.py, spec.yaml) and one kernel file per style:

- ``direct``: the launch in ``Model.forward`` with literal block sizes;
- ``wrapper``: a module-level wrapper function forward calls, a tuple grid;
- ``meta_grid``: a wrapper with ``grid = lambda META: (...)`` and the block sizes at the launch;
- ``autotune``: ``@triton.autotune`` over NVIDIA-typical configs, a META grid, no block sizes at the launch;
- ``autograd``: a ``torch.autograd.Function`` (Liger-Kernel style) whose forward launches, with a backward;
- ``param_cast``: the Model's own ``nn.Parameter`` weights, cast with ``.to(x.dtype).contiguous()`` in forward;
- ``constants``: block sizes from module-level constants and local variables;
- ``launcher``: a class whose launch method takes its block sizes from instance attributes;
- ``library_op``: a ``torch.library.custom_op`` (or ``define`` + ``impl``) op around the launch;
- ``backward_kernels``: the direct style plus backward kernels forward never launches.

The math and the default block sizes of one problem are the same in every style. Three checks per problem and
style: the starting file verifies on the interpreter; every tactic that applies to ``direct.py`` applies to the
style too (:data:`KNOWN_GAPS` lists the exceptions as data); and a port that chains the tactics stage by stage
(the first candidate of the first tactic that applies at each stage) ends in a candidate that verifies
(:data:`KNOWN_CHAIN_FAILURES`). A listed gap or failure that goes away fails its test too: take it off the list.

Cost: a port's chain re-checks every stage on each new source and verifies the result (5-35 s a style on the
interpreter), so that test is marked ``slow``, and so is the start of a style verified as its own start (see
:func:`own_start`; its verifier costs 5-10 s to start); the rest is a few seconds a style. Half the problems are in
tests/test_style_corpus_reductions.py: the suite runs one file per xdist worker, so the halves run side by side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import FIXTURES

STYLES_DIR = FIXTURES / "styles"
STYLES = ("direct", "wrapper", "meta_grid", "autotune", "autograd", "param_cast", "constants", "launcher",
          "library_op", "backward_kernels")
# the tactic context of the coverage check and of the port's chain: a CUDA H200 (what the kernels were written for)
TARGET = dict(kind="cuda", target="h200", cores=132)


def styles_of(problem: str) -> list[str]:
    return [s for s in STYLES if (STYLES_DIR / problem / f"{s}.py").exists()]


@dataclass
class Step:
    stage: str
    tactic: str | None  # the first tactic that applied (None: none did)
    problem: str | None = None  # what went wrong with its candidate: propose raised, or proposed nothing

    def render(self) -> str:
        if self.tactic is None:
            return f"{self.stage}: -"
        return f"{self.stage}: {self.tactic}" + (f" FAILED ({self.problem})" if self.problem else "")


@dataclass
class Chain:
    steps: list[Step]
    verdict: object  # xeforge.verifier.Verdict of the final source

    def failure(self) -> str | None:
        """Why this port fails (the broken steps, the final verdict), or None when it verifies."""
        why = [s.render() for s in self.steps if s.problem]
        if not self.verdict.correct:
            why.append(f"the final candidate ({' -> '.join(s.tactic for s in self.steps if s.tactic and not s.problem)})"
                       f" {self.verdict.feedback()}")
        return "; ".join(why) or None


def own_start(direct_source: str, source: str) -> bool:
    """Whether a style must be verified as a start of its own: gate 1 judges a file against its start (kernels the
    start already leaves unlaunched, torch compute beyond the start's), so a style whose file allows other things
    than direct.py's would be judged as a candidate of direct.py through the folder's verifier."""
    from xeforge.kernel_model import parse_kernel
    from xeforge.static_checks import StaticChecker, torch_compute_calls

    a, b = parse_kernel(direct_source), parse_kernel(source)
    return StaticChecker(a).dead_at_start != StaticChecker(b).dead_at_start or torch_compute_calls(a) != torch_compute_calls(b)


@dataclass
class Corpus:
    """One problem folder: the verifier of its direct.py (every style whose start allows what direct.py's does
    is verified through it: one worker pair for them all), a verifier of their own for the others (one open at a
    time), and the per-style results, each computed once on first use."""

    name: str
    tmp: Path
    _verifiers: dict = field(default_factory=dict)
    _problems: dict = field(default_factory=dict)
    _starts: dict = field(default_factory=dict)
    _applicable: dict = field(default_factory=dict)
    _chains: dict = field(default_factory=dict)
    _files: dict = field(default_factory=dict)  # source -> the file it was first verified from

    def path(self, style: str) -> Path:
        return STYLES_DIR / self.name / f"{style}.py"

    def problem(self, style: str):
        from xeforge.problem import load_problem

        if style not in self._problems:
            self._problems[style] = load_problem(self.path(style))
        return self._problems[style]

    def start_of(self, style: str) -> str:
        """The style whose file is the start ``style`` is verified against: direct, or itself."""
        if style == "direct" or not own_start(self.problem("direct").kernel_source, self.problem(style).kernel_source):
            return "direct"
        return style

    def verifier(self, style: str):
        from xeforge.devices import describe
        from xeforge.settings import Settings
        from xeforge.verifier import Verifier

        start = self.start_of(style)
        if start not in self._verifiers:
            for other in [s for s in self._verifiers if s != "direct"]:
                self._verifiers.pop(other).close()
            self._verifiers[start] = Verifier(self.problem(start), describe("cpu"), Settings(correctness_rounds=1),
                                              self.tmp / f"verifier-{start}")
        return self._verifiers[start]

    def close(self) -> None:
        while self._verifiers:
            self._verifiers.popitem()[1].close()

    def start(self, style: str):
        if style not in self._starts:
            self._files.setdefault(self.problem(style).kernel_source, self.path(style))
            self._starts[style] = self.verifier(style).verify(self.path(style))
        return self._starts[style]

    def applicable(self, style: str, only=None) -> dict[str, tuple[bool, str]]:
        """tactic -> (applies, reason) on the starting file of ``style`` (the tactics named in ``only``)."""
        import stages
        from tests.conftest import tactic_context

        known = self._applicable.setdefault(style, {})
        todo = [t for st in stages.ALL for t in st.tactics if t.name not in known and (only is None or t.name in only)]
        if todo:
            ctx = tactic_context(self.problem(style), **TARGET)
            for t in todo:
                a = t.check(ctx)
                known[t.name] = (a.applies, a.reason)
        return {n: r for n, r in known.items() if only is None or n in only}

    def chain(self, style: str) -> Chain:
        """Port ``style`` as the rules engine would without a device: at each stage, in order, the first
        candidate of the first tactic that applies becomes the source the next stage sees."""
        if style not in self._chains:
            import stages
            from tests.conftest import tactic_context

            p = self.problem(style)
            source, steps = p.kernel_source, []
            for stage in stages.ALL:
                ctx = tactic_context(p, source=source, **TARGET)
                tactic = next((t for t in stage.tactics if t.check(ctx).applies), None)
                step = Step(stage.name, tactic.name if tactic else None)
                steps.append(step)
                if tactic is None:
                    continue
                try:
                    cands = tactic.propose(ctx)
                except Exception as exc:  # noqa: BLE001 — recorded: a propose that raises is a bug to report
                    step.problem = f"propose raised {type(exc).__name__}: {str(exc)[:300]}"
                    continue
                if not cands:
                    step.problem = "check said it applies, propose returned nothing"
                    continue
                source = cands[0].source
            # a source verified before is verified from the same file again: the verifier reuses a loaded slot by
            # the source's hash but names it after the file, so the same source from another file name runs a
            # slot the worker never loaded (KeyError at gate 0: a port that changes nothing, two equal ports)
            if source == p.kernel_source:  # nothing applied: the port is its start
                self._chains[style] = Chain(steps, self.start(style))
                return self._chains[style]
            path = self._files.get(source)
            if path is None:
                path = self.tmp / "ports" / style / "port.py"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(source)
                self._files[source] = path
            self._chains[style] = Chain(steps, self.verifier(style).verify(path))
        return self._chains[style]


# ------------------------------------------------------------------------------------------------ the checks
def pytest_generate_tests(metafunc):
    """``style`` ranges over the styles of the class's problem (the coverage test leaves out direct itself).

    A style verified as its own start needs a verifier of its own (two workers: 5-10 s to start), so its start
    is checked in the slow run, next to its port, which needs that verifier anyway."""
    if "style" in metafunc.fixturenames and metafunc.cls is not None:
        name = metafunc.function.__name__
        styles = styles_of(metafunc.cls.problem)
        if name == "test_every_tactic_that_applies_to_direct_applies_to_the_style":
            styles = [s for s in styles if s != "direct"]
        if name == "test_the_starting_file_verifies":
            direct = (STYLES_DIR / metafunc.cls.problem / "direct.py").read_text()
            styles = [pytest.param(s, marks=pytest.mark.slow)
                      if s != "direct" and own_start(direct, (STYLES_DIR / metafunc.cls.problem / f"{s}.py").read_text())
                      else s for s in styles]
        metafunc.parametrize("style", styles, scope="class")  # style by style: a style's own verifier once


@pytest.fixture(scope="class")
def corpus(request, tmp_path_factory):
    """The problem of the test class (``problem``): its verifiers, closed after the class's tests."""
    c = Corpus(request.cls.problem, tmp_path_factory.mktemp(request.cls.problem))
    yield c
    c.close()


class CorpusChecks:
    """The three checks over one problem's styles; a subclass per problem sets ``problem`` and the lists
    (subclasses run one after the other, so one problem's verifier is open at a time)."""

    problem = ""
    known_start: dict[tuple[str, str], str] = {}
    known_gaps: dict[tuple[str, str, str], str] = {}
    known_chain: dict[tuple[str, str], str] = {}

    def test_the_starting_file_verifies(self, corpus, style):
        verdict = corpus.start(style)
        if (corpus.name, style) in self.known_start:
            assert not verdict.correct, f"{corpus.name}/{style}.py verifies now: take it off the list"
            assert self.known_start[corpus.name, style] in verdict.feedback(), verdict.feedback()
        else:
            assert verdict.correct, verdict.feedback()

    def test_every_tactic_that_applies_to_direct_applies_to_the_style(self, corpus, style):
        direct = {name for name, (ok, _) in corpus.applicable("direct").items() if ok}
        got = corpus.applicable(style, only=direct)
        missing = {name: got[name][1] for name in sorted(direct) if not got[name][0]}
        expected = {t: why for (p, s, t), why in self.known_gaps.items() if (p, s) == (corpus.name, style)}
        new = {t: why for t, why in missing.items() if t not in expected}
        gone = sorted(set(expected) - set(missing))
        assert not new and not gone, (f"{corpus.name}/{style}: new gaps (not in KNOWN_GAPS) {new}; "
                                      f"listed gaps that apply now (take them off the list) {gone}")
        for name, why in expected.items():
            assert why in missing[name], (name, missing[name])  # the reason names the construct

    @pytest.mark.slow
    def test_the_port_passes_the_verifier(self, corpus, style):
        chain = corpus.chain(style)
        failure = chain.failure()
        trail = " | ".join(s.render() for s in chain.steps)
        if (corpus.name, style) in self.known_chain:
            assert failure is not None, f"{corpus.name}/{style}: the port verifies now: take it off the list [{trail}]"
            assert self.known_chain[corpus.name, style] in failure, f"{failure} [{trail}]"
        else:
            assert failure is None, f"{failure} [{trail}]"


def check_lists(problems, known_gaps: dict, known_chain: dict, known_start: dict) -> None:
    """Every listed cell names a problem, style and tactic that exist, with a reason."""
    import stages

    tactics = {t.name for st in stages.ALL for t in st.tactics}
    for (p, s, t), why in known_gaps.items():
        assert p in problems and s in styles_of(p) and s != "direct" and t in tactics and why, (p, s, t)
    for (p, s), why in [*known_chain.items(), *known_start.items()]:
        assert p in problems and s in styles_of(p) and why, (p, s)


# ------------------------------------------------------------------------------------------------ the problems
# here: a GEMM with its epilogue in the kernel, a GEMM with torch ops after it, and two row kernels without a
# GEMM; the GEMMs followed by a row reduction or a GroupNorm: tests/test_style_corpus_reductions.py
PROBLEMS = ("linear_relu", "linear_gelu_residual", "softmax", "layernorm")


# starting files that do not verify: (problem, style) -> a fragment of the verdict's feedback
KNOWN_START_FAILURES: dict[tuple[str, str], str] = {}

# tactics that apply to direct.py but not to a style: (problem, style, tactic) -> a fragment of the reason
KNOWN_GAPS: dict[tuple[str, str, str], str] = {}

# ports whose chain breaks or whose final candidate does not verify: (problem, style) -> a fragment of why
KNOWN_CHAIN_FAILURES: dict[tuple[str, str], str] = {}


class Listed(CorpusChecks):
    known_start, known_gaps, known_chain = KNOWN_START_FAILURES, KNOWN_GAPS, KNOWN_CHAIN_FAILURES


class TestLinearRelu(Listed):
    problem = "linear_relu"


class TestLinearGeluResidual(Listed):
    problem = "linear_gelu_residual"


class TestSoftmax(Listed):
    problem = "softmax"


class TestLayernorm(Listed):
    problem = "layernorm"


def test_the_lists_name_real_cells():
    check_lists(PROBLEMS, KNOWN_GAPS, KNOWN_CHAIN_FAILURES, KNOWN_START_FAILURES)
