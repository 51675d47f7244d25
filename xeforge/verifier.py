"""The verification cascade: gate 0 (isolation), 1 (static), 2 (correctness), 3 (performance), and the final gate.

Owns: running one candidate through the gates in order, stopping at the first failure, and producing a
:class:`Verdict` with the evidence and the feedback an engine can learn from. Specification:
``verification.md``. Siblings: :mod:`xeforge.isolation` (worker processes), :mod:`xeforge.static_checks`
(gate 1), :mod:`xeforge.compare` (gate 2 comparisons), :mod:`xeforge.integrity` (checks decided from the
buffers a worker returns), :mod:`xeforge.timing` (gate 3 statistics), :mod:`xeforge.wire` (the data that
crosses). Two workers per verifier: the oracle worker runs the reference (float64, same weights) and nothing
else; the candidate worker runs candidates and never sees the expected outputs, and builds each Model from the
oracle's seed (what ``__init__`` makes outside the weights matches too: a start that is its own oracle matches
itself). This process imports none of them: code goes to the workers as text (the candidate as read once for its verdict, the problem's files as
loaded), and what comes back is JSON and safetensors, compared here.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import secrets
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xeforge import integrity, wire
from xeforge.analysis.account import account_problems
from xeforge.analysis.observe import trace_at
from xeforge.analysis.trace import Trace, TraceError
from xeforge.compare import compare_outputs
from xeforge.diagnosis import deep
from xeforge.diagnosis.profile import breakdown
from xeforge.diagnosis.rules import Diagnoser, by_shape
from xeforge.devices import DeviceInfo
from xeforge.errors import KernelSourceError, ProblemError
from xeforge.isolation import Worker, WorkerFailure
from xeforge.inputs import DISTRIBUTIONS, generate_inputs
from xeforge.problem import Code, Problem, Variant, default_tolerance, plan_inputs, source_hash
from xeforge.settings import Settings
from xeforge.static_checks import ConstraintHook, StaticChecker
from xeforge.timing import ShapeVerdict, decide, decide_shapes, noise_margin, paired_ratios, roofline_floor
from xeforge.kernel_model import loops_over_programs, parse_kernel, stored_params, tf32_dots

GATES = ("0-isolation", "1-static", "2-correctness", "3-performance")
#: an A/A margin above this is measured once more, and the second stands: the incumbent against itself that far
#: apart is a disturbed run (on an H100, 2026-12-07, six lanes at once: 94% at 16 x 4096 x 4096, where the same
#: kernel's IQR was 1%), and every candidate of the port would have to beat it
AA_SUSPECT = 0.25

_DEVICE_NAMES = {"xpu": "an Intel GPU (XPU)", "cuda": "a CUDA GPU", "cpu": "the CPU interpreter"}


def _device_fix(detail: str, line: str, kind: str) -> str:
    """The fix for a kernel that stopped because it hard-codes a device this run does not have ('' otherwise), from
    the exception's text and the source line it was raised at.

    Published starting kernels check ``torch.xpu.is_available()``, assert ``x.device.type == "xpu"`` and allocate
    with ``device="xpu"``; on the CPU interpreter (or a CUDA GPU) that raises before any kernel runs, and the
    message alone (often an empty AssertionError) does not say why.
    """

    m = re.search(r"\b(xpu|cuda)\b", f"{detail} {line}", re.IGNORECASE)
    if m is None or m.group(1).lower() == kind:
        return ""
    said = re.search(r"not (?:available|compiled|enabled|found)|unavailable|no (?:xpu|cuda)|must be on|"
                     r"expected .*device", detail, re.IGNORECASE)
    checked = re.search(r"is_available\(\)|device\.type|device\s*=|\.(?:xpu|cuda)\(", line)
    if not (said or checked):
        return ""
    need = m.group(1).lower()
    return (f"the kernel requires {_DEVICE_NAMES[need]} and this run is on {_DEVICE_NAMES.get(kind, kind)}: it "
            f"hard-codes its device (device=\"{need}\", torch.{need}.is_available() checks or asserts, "
            f"torch.{need}.synchronize()); allocate on the input's device (device=x.device) and drop those checks "
            f"and syncs, or verify it on {_DEVICE_NAMES[need]} (--device {need})")


@dataclass
class GateResult:
    gate: str
    status: str  # pass | fail | skipped
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "pass"


@dataclass
class Verdict:
    source_hash: str
    gates: list[GateResult] = field(default_factory=list)
    correct: bool = False
    accepted: bool = False  # correct and (faster beyond the margin, or adopted unmeasured on the interpreter)
    timed: bool = False
    speedup: float | None = None
    margin: float | None = None
    note: str = ""
    diagnosis: dict[str, Any] | None = None  # compiler facts and the KB's findings (xeforge.diagnosis); advisory

    @property
    def failed_gate(self) -> GateResult | None:
        return next((g for g in self.gates if g.status == "fail"), None)

    def feedback(self) -> str:
        """What an engine (or a user) should read: the gate that failed and why, or the timing result."""
        failed = self.failed_gate
        if failed is not None:
            return f"rejected at gate {failed.gate}: {failed.summary}"
        if not self.gates:
            return f"not verified: {self.note}" if self.note else "not verified"
        perf = next((g for g in self.gates if g.gate == "3-performance"), None)
        if perf is not None and perf.status == "pass":
            return f"accepted: {perf.summary}"
        if perf is not None and perf.status == "skipped":
            return f"correct on every variant; {perf.summary}"
        return "correct on every variant"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Verdict":
        gates = [GateResult(**g) for g in d.get("gates", [])]
        return cls(**{**d, "gates": gates})


class Verifier:
    """Verifies candidates of one problem on one device. Use as a context manager (owns a worker)."""

    def __init__(self, problem: Problem, device: DeviceInfo, settings: Settings, workdir: Path,
                 constraint_hooks: list[ConstraintHook] | None = None, device_entry: Any = None,
                 diagnoser: Diagnoser | None = None, *, cache: Path | None = None, hide: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        """``cache``: the candidates' Triton cache (default: in ``workdir``); ``hide``: the folder the sandbox hides
        around the workers (default: ``workdir``); ``env``: added to both workers' environment (the GPU they see).
        A check lane (:mod:`xeforge.check_lanes`) passes all three: the port's cache and run folder, its GPU."""
        self.problem = problem
        self.diagnoser = diagnoser  # None: no compiler facts are collected
        self.device = device
        self.settings = settings
        self.workdir = Path(workdir).resolve()  # the worker runs in it: every path it is given must be absolute
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.device_entry = device_entry
        self.static_checker = StaticChecker(parse_kernel(problem.kernel_source, str(problem.kernel_path)),
                                            constraint_hooks)
        # each worker has a folder of its own: the candidate's is its working directory and where its tensor
        # files go; the oracle's holds the weights every candidate is loaded with
        # the candidates' compiled kernels are cached in the run (prewarm fills it for the cascade); the oracle
        # keeps a cache of its own, which no candidate can write
        self._cache = Path(cache).resolve() if cache else self.workdir / "triton-cache"
        self._hide = Path(hide).resolve() if hide else self.workdir
        self._env = dict(env or {})
        self.worker = self._candidate_worker(self.workdir / "worker", self.workdir / "worker.log")
        self.oracle_worker = Worker(device.kind, self.workdir / "oracle", self.workdir / "oracle.log", settings=settings,
                                    writable=(self.workdir / "oracle-triton-cache",), hidden=(self._hide,),
                                    env={**self._env, "TRITON_CACHE_DIR": str(self.workdir / "oracle-triton-cache")})
        self.weight_seed = secrets.randbits(31)
        self._slots: dict[tuple, int] = {}  # (source hash, variant, mode[, alias]) -> worker generation
        self._slot_names: dict[tuple, str] = {}  # the same keys -> the slot name the source was loaded under
        self._first: set[tuple] = set()  # slots whose first call (which compiles) has not run yet
        self._refs: dict[str, tuple[int, Path | None, list[str] | None]] = {}  # variant -> (generation, weights, dtypes)
        self._margins: dict[tuple[str, str], tuple[float, dict]] = {}  # (incumbent, shape) -> A/A margin
        self._weight_order: dict[str, list[str]] = {}  # variant -> the reference's parameter names, in order
        self._start_traces: dict[str, Any] = {}  # variant -> the starting kernel's traced call (run-time checks)
        self._start_accounts: dict[str, dict | None] = {}  # variant -> its run-time account (a real call's)
        self._start_model = self.static_checker.starting
        self.runtime_notes: list[str] = []  # where the run-time checks could not be made
        self._diagnoses: dict[str, dict] = {}  # source hash -> its diagnosis (compiler facts, findings)
        # (source hash, variant) -> the trace of the call that wrote its kernels at that shape
        self._facts_traces: dict[tuple[str, str], Any] = {}
        self.weights_by_position: dict[str, dict[str, str]] = {}  # source hash -> reference name -> kernel name
        self._nonfinite: dict[str, list[str]] = {}  # source hash -> weights holding NaN / Inf once loaded
        self.last_timing: dict = {}  # launch-overhead delay of the latest timing request (see timing.delay_flushes)
        # the float64 reference runs where fp64 is native; on an Intel part without it, on the host
        self._oracle_device = device.kind if (device.kind != "xpu" or device.has_fp64) else "cpu"

    def _candidate_worker(self, folder: Path, log: Path, prefix: tuple[str, ...] = ()) -> Worker:
        """A worker for candidates: it writes its own folder and the cache, and reads the oracle's weights;
        ``prefix``: a profiler it runs under, inside the same sandbox (``--profile deep``)."""
        weights = self.workdir / "oracle" / "weights"
        weights.mkdir(parents=True, exist_ok=True)
        return Worker(self.device.kind, folder, log, settings=self.settings, writable=(self._cache,),
                      readable=(weights,), hidden=(self._hide,),
                      env={**self._env, "TRITON_CACHE_DIR": str(self._cache)}, prefix=prefix)

    def __enter__(self) -> "Verifier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.worker.close()
        self.oracle_worker.close()

    # ------------------------------------------------------------------------------------------ gates
    def verify(self, cand_path: Path, incumbent_path: Path | None = None, *, time_it: bool = True,
               source_hash: str = "", all_shapes: bool = False, checked: Verdict | None = None) -> Verdict:
        """Run the cascade. ``incumbent_path`` is what gate 3 times against (None: no gate 3); ``all_shapes``: gate 3
        times every timed shape even when the primary does not improve (see :meth:`performance`); ``checked``:
        this source's verdict from :meth:`check` on another verifier of the problem (a check lane), which gate 3
        continues instead of checking it again here."""
        cand = self.code(cand_path)  # read once: what gate 1 checks is what the worker runs
        if checked is not None and checked.source_hash != source_hash:
            raise ValueError(f"a checked verdict of {checked.source_hash} given for {source_hash}")
        verdict = checked if checked is not None else self.check(cand, str(cand_path), source_hash)
        if not verdict.correct or incumbent_path is None or not time_it:
            return verdict
        t0 = time.monotonic()
        g3 = self.performance(self.code(incumbent_path), cand, all_shapes=all_shapes)
        g3.details["seconds"] = round(time.monotonic() - t0, 3)
        verdict.gates.append(g3)
        if g3.status == "fail" and g3.details.get("phase") == "isolation":
            verdict.gates[0] = GateResult(GATES[0], "fail", g3.summary, g3.details)
        verdict.timed = g3.status != "skipped"
        verdict.speedup = g3.details.get("speedup")
        verdict.margin = g3.details.get("margin")
        verdict.accepted = g3.status == "pass"
        return verdict

    def check(self, cand: Code, where: str = "candidate.py", source_hash: str = "") -> Verdict:
        """Gates 1, 0 and 2 and the diagnosis: the verdict before any timing (``where``: the name gate 1's findings
        give the file)."""
        verdict = Verdict(source_hash=source_hash)
        t0 = time.monotonic()
        g1 = self.static(cand.text, where)
        g1.details["seconds"] = round(time.monotonic() - t0, 3)  # where a port's time goes, per gate
        # gate 0 runs around everything below; gate 1 is purely static and reported first in order
        if not g1.passed:
            verdict.gates += [GateResult(GATES[0], "skipped", "not run: static checks failed"), g1]
            return verdict
        t0 = time.monotonic()
        g0, g2 = self.correctness(cand)
        if g2 is not None:
            g2.details["seconds"] = round(time.monotonic() - t0, 3)  # load and compile (gate 0) included
        verdict.gates += [g0, g1]
        if g2 is not None:
            verdict.gates.append(g2)
        if not (g0.passed and g2 is not None and g2.passed):
            return verdict
        verdict.correct = True
        verdict.diagnosis = self.diagnose(cand)
        return verdict

    def code(self, path: Path | Code) -> Code:
        """What the workers get for ``path``: the problem's own files as loaded, any other file as read now."""
        if isinstance(path, Code):
            return path
        snapshot = self.problem.code_for(Path(path))
        if snapshot is not None:
            return snapshot
        try:
            return Code(Path(path).read_text(), Path(path).name)
        except (OSError, UnicodeDecodeError) as exc:
            raise ProblemError(str(path), f"cannot read the kernel: {exc}", "pass a readable UTF-8 kernel file") from None

    def static(self, source: str, path: str = "candidate.py") -> GateResult:
        _, findings = self.static_checker.check(source, path)
        if findings:
            return GateResult(GATES[1], "fail", "; ".join(f.render() for f in findings),
                              {"findings": [asdict(f) for f in findings]})
        notes = list(self.static_checker.notes)
        return GateResult(GATES[1], "pass", "static checks and knowledge-base constraints passed"
                          + (f"; note: {'; '.join(notes)}" if notes else ""), {"notes": notes} if notes else {})

    # ------------------------------------------------------------------------------------------ gate 2
    def correctness_variants(self) -> list[tuple[Variant, int]]:
        """(variant, rounds) for every variant small enough for the device, then the ragged shapes (two rounds each,
        fewer only where fewer rounds were asked for)."""
        return [(v, min(2, self.settings.correctness_rounds) if v.ragged else self.settings.correctness_rounds)
                for v in self.problem.correctness_variants(self.device.kind, self.settings.ragged_shapes)]

    def correctness(self, cand: Code) -> tuple[GateResult, GateResult | None]:
        rounds_done = 0
        notes: dict[str, None] = {}  # what the calls did that the verdict should say (ordered, each once)
        # where the gate's seconds go (a port's wall time is mostly here at large shapes): the candidate's first call
        # per variant (load and compile), its other calls, the oracle, and the comparisons and runtime checks
        spent = dict.fromkeys(("first_calls", "calls", "oracle", "checks"), 0.0)
        clock = time.monotonic()
        # and, inside those, the seconds the two workers spent starting and waiting for the device (other lanes' timing)
        workers = (self.worker, self.oracle_worker)
        before = [(w.start_s, w.wait_s) for w in workers]

        def seconds_in() -> dict[str, float]:
            out = {k: round(v, 3) for k, v in spent.items()}
            out["starting"] = round(sum(w.start_s - b[0] for w, b in zip(workers, before)), 3)
            out["waiting"] = round(sum(w.wait_s - b[1] for w, b in zip(workers, before)), 3)
            return out

        def lap(key: str) -> None:
            nonlocal clock
            now = time.monotonic()
            spent[key] += now - clock
            clock = now

        def fail(summary: str, details: dict) -> tuple[GateResult, GateResult]:
            shown = f"{summary}; note: {'; '.join(notes)}" if notes else summary
            details = {**details, "seconds_in": seconds_in()}
            return self._ok0(), GateResult(GATES[2], "fail", shown, {**details, "notes": list(notes)} if notes else details)

        for variant, rounds in self.correctness_variants():
            rtol, atol = self._tolerances(variant)
            for r in range(rounds):
                seed = secrets.randbits(62)
                dist = DISTRIBUTIONS[r % len(DISTRIBUTIONS)]
                try:
                    outs, facts = self._run(cand, variant, seed, dist, rerun=(r == 0))
                except WorkerFailure as exc:
                    return self._isolation_failure(exc, variant, cand), None
                lap("first_calls" if r == 0 else "calls")
                where = {"variant": variant.name, "seed": seed, "distribution": dist}
                notes.update(dict.fromkeys(self._call_notes(facts, variant)))
                problem = self._worker_facts(facts, variant) or self._integrity(outs, variant, seed, dist)
                if problem:
                    return fail(problem, where)
                lap("checks")
                refs, dtypes = self.oracle(variant, seed, dist)
                lap("oracle")
                # compared where the oracle lives: on a GPU the float64 arithmetic over bench-sized outputs takes
                # milliseconds there and seconds on the host
                got = [outs.get(f"out.{i}") for i in range(facts["n_outputs"])]
                got = [o.to(self._oracle_device) if o is not None else None for o in got]
                mm = compare_outputs(got, refs, dtypes, rtol, atol)
                if mm is not None:
                    cause = self._cause(cand, variant, seed, dist, outs, facts, unstable=False) + \
                        self._own_rounding(variant, seed, dist, got, refs, rtol, atol)
                    return fail(f"variant {variant.describe()}, {dist} inputs: {mm.message}{cause}",
                                {**where, "dims": variant.dims, "reason": mm.reason, **mm.details})
                del got, refs
                # right values; now how they were made: launches, torch compute, who wrote the outputs
                cheat = self._runtime(cand, facts, variant)
                if cheat:
                    return fail(cheat, {**where, "reason": "runtime"})
                unstable = self._stability(outs, facts, variant)
                if unstable:
                    unstable += self._cause(cand, variant, seed, dist, outs, facts, unstable=True)
                    return fail(unstable, {**where, "reason": "unstable"})
                rounds_done += 1
                lap("checks")
        names = [v.name for v, _ in self.correctness_variants()]
        details = {"rounds": rounds_done, "variants": names, "oracle": self._oracle_name(),
                   "seconds_in": seconds_in()}
        note = ""
        if cand.hash in self.weights_by_position:
            details["weights_by_position"] = self.weights_by_position[cand.hash]
            note = "; the reference's weights were given to the kernel's parameters by position (names differ)"
        if notes:
            details["notes"] = list(notes)
            note += "; " + "; ".join(notes)
        return self._ok0(), GateResult(GATES[2], "pass", f"matches the {self._oracle_name()} on {rounds_done} rounds over "
                                       f"{', '.join(names)}{note}", details)

    def _call_notes(self, facts: dict, variant: Variant) -> list[str]:
        """What a correct call did that the verdict says in words: an ``@triton.autotune`` kernel run at its first
        config (the interpreter has no timer to tune with; the worker pins it), parameters its first call moved or
        cast. Read from the call's trace and the worker's reply: data from the candidate's process, so only notes."""

        out = []
        if self.device.interpreter:
            try:
                trace = Trace.from_json(variant.name, facts.get("trace"))
            except TraceError:
                trace = None  # the run-time checks report a malformed trace
            pinned: dict[str, int] = {}
            for la in trace.launches if trace is not None else []:
                configs = la.autotune.get("configs") if isinstance(la.autotune, dict) else None
                if isinstance(configs, list) and len(configs) > 1:
                    pinned.setdefault(la.kernel[:80], len(configs))
            out += [f"@triton.autotune of {k} pinned to its first config on the CPU interpreter ({n} configs)"
                    for k, n in pinned.items()]
        conv = facts.get("weights_converted")
        if isinstance(conv, dict) and conv:
            shown = ", ".join(f"{str(k)[:80]} ({str(v)[:60]})" for k, v in list(conv.items())[:8])
            out.append(f"the first call converted parameters {shown}, values kept")
        return out

    def _ok0(self) -> GateResult:
        sb = self.worker.sandbox
        how = f"sandboxed by {sb.tool}" if sb.isolated else "NOT sandboxed: " + "; ".join(sb.missing[:1])
        return GateResult(GATES[0], "pass", f"ran in a worker process on {self.device.kind}, {how}",
                          {"worker_restarts": self.worker.restarts, "sandbox": sb.as_dict()})

    def _isolation_failure(self, exc: WorkerFailure, variant: Variant, cand: Code | None = None) -> GateResult:
        what = {"crash": "crashed the worker", "timeout": "timed out", "exception": "raised",
                "start": "could not start the worker",
                "protocol": "forged or broke the worker protocol (a reply or tensor file that is not valid data)"}[exc.kind]
        line = self._source_line(cand, exc.where) if exc.where else ""
        at = f" (at {exc.where}: `{line}`)" if line else (f" (at {exc.where})" if exc.where else "")
        fix = _device_fix(exc.detail, line, self.device.kind) if exc.kind == "exception" else ""
        return GateResult(GATES[0], "fail", f"variant {variant.name}: {what}: {exc.detail}{at}"
                          + (f"; fix: {fix}" if fix else ""),
                          {"kind": exc.kind, "detail": exc.detail, "where": exc.where, "variant": variant.name,
                           "sandbox": self.worker.sandbox.as_dict(), **({"fix": fix} if fix else {})})

    @staticmethod
    def _source_line(cand: Code | None, where: str) -> str:
        """The source line ``where`` (file:line, as the worker names it) points at, if it is the candidate's file."""
        name, _, line = where.rpartition(":")
        if cand is None or name != cand.filename or not line.isdigit():
            return ""
        lines = cand.text.splitlines()
        n = int(line)
        return lines[n - 1].strip()[:120] if 0 < n <= len(lines) else ""

    def _worker_facts(self, facts: dict, variant: Variant) -> str | None:
        """What only the worker's process could see (types, pointers), as it reported them."""
        if not all(facts.get("exact_tensor", [True])):
            return f"returned {facts.get('types')} — outputs must be plain torch.Tensor"
        if facts.get("weights_mutated"):
            return (f"changed model weights {', '.join(map(str, facts['weights_mutated'][:5]))} during forward (their "
                    "values; moving or casting them on the first call is allowed, never on a later one)")
        if any(facts.get("aliases_input", [])):
            return "an output aliases an input's memory (return a fresh tensor)"
        return None

    def _integrity(self, outs: dict, variant: Variant, seed: int, dist: str) -> str | None:
        """Decided here from the buffers the worker returned: inputs changed, writes outside an input's bounds."""
        plan = plan_inputs(self.problem, variant)
        originals = generate_inputs(plan, seed, dist, self.device.kind)
        buffers = [outs.get(f"input.{j}") for j in range(len(plan))]
        if any(b is None for b in buffers):
            return "the worker did not return every input buffer after the call (its reply was tampered with)"
        names = [tp.name for tp in plan]
        mutated, overwritten = integrity.input_problems(names, originals, [b.to(self.device.kind) for b in buffers])
        if overwritten:
            return f"wrote outside the bounds of input(s) {', '.join(overwritten)}"
        if mutated:
            return f"mutated its input(s) {', '.join(mutated)} (variant {variant.name})"
        return None

    def _runtime(self, cand: Code, facts: dict, variant: Variant) -> str | None:
        """What the call did against what the starting kernel's call did, from the two calls' traces (launches,
        torch compute, who wrote the outputs, the work each launch did) and their run-time accounts (aten operators
        and device kernels below Python); the start's are taken once per variant."""

        try:
            mine = Trace.from_json(variant.name, facts.get("trace"))
        except TraceError as exc:
            return f"the worker's record of the call was malformed ({exc})"
        if cand.hash == self.problem.kernel_code.hash:
            self._start_traces.setdefault(variant.name, mine)
            self._start_accounts.setdefault(variant.name, facts.get("account"))
            return None
        if variant.name not in self._start_traces:

            # the start's call on the meta device (cached for the process); a real call where that cannot run
            meta = trace_at(self.problem, variant)
            try:
                self._start_traces[variant.name] = meta if isinstance(meta, Trace) else \
                    self.trace(self.problem.kernel_code, variant)
            except WorkerFailure as exc:  # the start was verified; if its call cannot be traced, say so, judge on
                self._start_traces[variant.name] = None
                self.runtime_notes.append(f"{variant.name}: the starting kernel's call could not be traced "
                                          f"({exc.kind}: {exc.detail[:200]}); run-time checks skipped there")
        model = parse_kernel(cand.text, cand.filename)  # gate 1 parsed the same text
        start = self._start_traces[variant.name]
        if start is not None:
            problem = integrity.runtime_problems(mine, start) or \
                integrity.dummy_launches(mine, start, _work_facts(model), _work_facts(self._start_model))
            if problem:
                return f"{problem} (variant {variant.name})"
        theirs = self._start_account(variant) if self.settings.runtime_account else None
        if theirs is None:
            return None
        kernels = set(self._start_model.functions) | set(model.functions)
        problem = account_problems(facts.get("account"), theirs, kernels, len(mine.launches))
        return f"{problem} (variant {variant.name})" if problem else None

    def _start_account(self, variant: Variant) -> dict | None:
        """The starting kernel's run-time account at ``variant``: from its own verification in this verifier, or
        from one real call of it (the meta-device trace runs nothing)."""
        if variant.name not in self._start_accounts:
            try:
                reply = self._trace_reply(self.problem.kernel_code, variant)
                got = reply.get("account")
                self._start_accounts[variant.name] = got if isinstance(got, dict) and "error" not in got else None
            except WorkerFailure as exc:
                self._start_accounts[variant.name] = None
                self.runtime_notes.append(f"{variant.name}: the starting kernel's call could not be accounted "
                                          f"({exc.kind}: {exc.detail[:200]}); the account checks were skipped there")
        return self._start_accounts[variant.name]

    def _stability(self, outs: dict, facts: dict, variant: Variant) -> str | None:
        if "n_rerun_outputs" not in facts or self.problem.spec.nondeterministic:
            return None
        n = facts["n_outputs"]
        first = [outs.get(f"out.{i}") for i in range(n)]
        second = [outs.get(f"rerun.{i}") for i in range(facts["n_rerun_outputs"])]
        same = len(first) == len(second) and all(
            a is not None and b is not None and integrity.same_bits(a, b) for a, b in zip(first, second))
        if not same:
            return (f"two runs on the same inputs gave different bits (variant {variant.name}); mark the spec "
                    "'nondeterministic: true' only if that is intended")
        return None

    def _cause(self, cand: Code, variant: Variant, seed: int, dist: str, outs: dict, facts: dict,
               unstable: bool) -> str:
        """Why a call's outputs are wrong or differ between two runs on the same inputs, and the fix: output
        elements the call never writes (a rerun with every uninitialized allocation poisoned leaves them NaN / the
        sentinel), or, for two runs that differ with every element written both times, a race, atomics or state
        kept between calls. Empty when neither shows."""
        import torch  # lazy: torch, for the tensors the worker returned

        first = [outs.get(f"out.{i}") for i in range(facts["n_outputs"])]
        try:
            poisoned, _ = self._run(cand, variant, seed, dist, rerun=True, poisoned=True)
        except WorkerFailure:
            return ""
        parts = []
        for i, a in enumerate(first):
            b = poisoned.get(f"rerun.{i}")
            if a is None or b is None or a.shape != b.shape or a.numel() == 0:
                continue
            differ = (a.view(-1) != b.view(-1)) & ~(a.view(-1).isnan() & b.view(-1).isnan()) \
                if a.dtype.is_floating_point else a.view(-1) != b.view(-1)
            filler = integrity.canary_value(torch, b.dtype)
            never = (b.view(-1).isnan() & ~a.view(-1).isnan()) if b.dtype.is_floating_point else \
                (b.view(-1) == filler) & (a.view(-1) != filler)
            n_never, n_diff = int(never.sum()), int(differ.sum())
            if n_never:
                first_idx = int(never.nonzero()[0])
                fix = ("fix the kernel, or, if it is meant for aligned shapes only, name those dims in the spec's "
                       "'fixed:' (or 'ragged: false')") if variant.ragged else "fix the kernel"
                parts.append(f"output {i}: {n_never} of {a.numel()} elements are never written by the call (a rerun "
                             f"with its allocations poisoned leaves them unset, the first at flat index {first_idx}): "
                             f"the grid or the masks miss them, or the output is only partly written; {fix}")
            elif n_diff and unstable:
                parts.append(f"output {i}: {n_diff} of {a.numel()} elements differ although every element is written "
                             "in both runs: atomics or a race between programs (mark the spec 'nondeterministic: "
                             "true' if that is intended), or state the Model keeps between calls")
        if not unstable and not self.device.interpreter and self.problem.spec.precision != "tf32" \
                and self._tolerances(variant)[0] <= self.settings.fp32_tol and tf32_dots(cand.text):
            parts.append("a tl.dot on float32 operands runs as TF32 on this GPU (Triton's default), about 1e-3 "
                         "relative error: set `precision: tf32` in spec.yaml if the kernel means it, or pass "
                         "input_precision=\"ieee\" to tl.dot to hold fp32")
        if cand.hash in self._nonfinite:
            parts.append(f"the weights {', '.join(self._nonfinite[cand.hash])} hold NaN or Inf once loaded: never "
                         "initialized (nn.Parameter(torch.empty(...)) that nothing fills)? initialize them in __init__")
        return "; cause: " + "; ".join(parts) if parts else ""

    def _own_rounding(self, variant: Variant, seed: int, dist: str, got: list, refs: list, rtol: float,
                      atol: float) -> str:
        """Where the reference itself, run as built (in the variant's dtype) on the same inputs, misses the float64
        oracle too: the atol it would need at this rtol; and, where the call's outputs ``got`` miss by no more than
        twice that, the mismatch is the problem's own rounding (a bf16 intermediate that nearly cancels, say), not the
        kernel's, and that atol is the fix. Empty otherwise, or when the oracle is the start itself."""
        import torch  # lazy: torch, for the oracle's tensors

        if not self.problem.has_reference:
            return ""
        out_file = self._io_file(self.oracle_worker, "as-built")
        try:
            self._oracle_request("oracle", False, slot=f"ref@{variant.name}",
                                 plan=[tp.wire() for tp in plan_inputs(self.problem, variant)], seed=seed,
                                 distribution=dist, out_file=str(out_file), float64=False,
                                 compute_device=self._oracle_device)
            outs = wire.load_tensors(out_file, self._max_file_bytes())
        except (ProblemError, wire.TensorFileError):
            return ""
        finally:
            out_file.unlink(missing_ok=True)
        low = [outs.get(f"out.{i}") for i in range(len(refs))]
        if any(o is None for o in low):
            return ""
        low = [o.to(self._oracle_device) for o in low]
        mm = compare_outputs(low, refs, [None] * len(refs), rtol, atol)
        if mm is None or mm.reason != "tolerance":
            return ""

        def needed(outs: list) -> float:  # the atol that would pass ``outs`` at this rtol (floating outputs)
            return max((float(torch.nan_to_num((o.to(torch.float64) - r).abs() - rtol * r.abs(), nan=0.0,
                                               posinf=float("inf")).max())
                        for o, r in zip(outs, refs) if o is not None and r.dtype.is_floating_point and r.numel()),
                       default=0.0)

        need, mine = needed(low), needed(got)
        if need <= 0.0:  # an integer output that differs: no tolerance to suggest
            return ""
        dtype = str(low[0].dtype).removeprefix("torch.")
        said = (f"; the reference itself, run as built ({dtype}) on the same inputs, misses the float64 oracle too "
                f"({mm.message.split('; ')[0]}; it needs atol {need:.3g} at rtol {rtol:g})")
        if mine > 2 * need:
            return said + f", by less than this call (atol {mine:.3g}): the kernel's own error is larger"
        # the atol to give: the reference's, unless this kernel is far closer to the oracle than the reference as
        # built (outlier inputs through a bf16 softmax, say): then its own, so the check stays tight
        tight = mine < need / 2
        give = float(f"{(mine if tight else need) * 1.5:.2g}")
        return (said + f": this is the problem's own {dtype} rounding, not the kernel's; fix: give variant "
                f"{variant.name} `atol: {give}` in spec.yaml"
                + (f" (this call needs atol {mine:.3g}, well under the reference's)" if tight else "")
                + ", or compute the reference's intermediates in higher precision")

    def _tolerances(self, variant: Variant) -> tuple[float, float]:
        dt = self.problem.tolerance_dtype(variant)
        tf32 = self.problem.spec.precision == "tf32" and not self.device.interpreter
        default = default_tolerance(dt, self.settings, tf32)
        return (variant.rtol if variant.rtol is not None else default,
                variant.atol if variant.atol is not None else default)

    # ------------------------------------------------------------------------------------------ worker
    def _ensure_loaded(self, code: Code, variant: Variant, compile_mode: str | None = None, alias: int = 0) -> str:
        """The candidate worker's slot holding ``code`` built for ``variant`` (loaded now if it is not there).

        Slots are keyed by the source's hash: two trials' ``candidate.py`` are two slots. ``alias`` asks for an
        independent second load of the same source (an A/A run times two slots, never one against itself).
        """
        key = (code.hash, variant.name, compile_mode, alias)
        slot = f"{Path(code.filename).stem}@{variant.name}#{code.hash[:8]}" + (f"+{compile_mode}" if compile_mode else "") \
            + (f"~{alias}" if alias else "")
        if self._slots.get(key) == self.worker.generation and self.worker.alive():
            return self._slot_names[key]  # the name it was loaded under (the same text from another file name)
        reply = self.worker.request("load", self.settings.compile_timeout_s,
                                    **self._load_payload(code, variant, slot, compile_mode))
        if reply.get("weights_by_position"):
            self.weights_by_position[code.hash] = {str(k): str(v) for k, v in reply["weights_by_position"].items()}
        if isinstance(reply.get("nonfinite_weights"), list) and reply["nonfinite_weights"]:
            self._nonfinite[code.hash] = [str(k)[:80] for k in reply["nonfinite_weights"][:8]]
        self._slots[key] = self.worker.generation
        self._slot_names[key] = slot
        self._first.add(key)
        return slot

    def _load_payload(self, code: Code, variant: Variant, slot: str, compile_mode: str | None = None) -> dict:
        weights = self._weights_file(variant)
        # built from the oracle's seed: what __init__ draws outside the state_dict is then the oracle's too
        return dict(slot=slot, source=code.text, filename=code.filename, init_args=self.problem.init_args(variant),
                    weights_file=str(weights) if weights else None, dtype=variant.dtype, compile_mode=compile_mode,
                    weight_order=self._weight_order.get(variant.name), seed=self.weight_seed)

    def _slot_and_timeout(self, code: Code, variant: Variant) -> tuple[str, float]:
        """The slot for one call of ``code``, and its timeout: the compile timeout for the first call (it compiles)."""
        slot, timeout, _ = self._slot_call(code, variant)
        return slot, timeout

    def _slot_call(self, code: Code, variant: Variant) -> tuple[str, float, bool]:
        """:meth:`_slot_and_timeout`, and whether this is the slot's first call."""
        slot = self._ensure_loaded(code, variant)
        key = (code.hash, variant.name, None, 0)
        first = key in self._first
        self._first.discard(key)
        return slot, self.settings.compile_timeout_s if first else self.settings.run_timeout_s, first

    def _io_file(self, worker: Worker, what: str) -> Path:
        path = worker.workdir / "io" / f"{what}-{secrets.token_hex(6)}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _max_file_bytes(self) -> int:
        return int(self.settings.max_tensor_file_gib * (1 << 30))

    # ------------------------------------------------------------------------------------------ diagnosis
    def _facts_variants(self) -> list[str]:
        """The variants whose first call writes its compiled kernels, the primary first: every timed shape gate 2
        runs (each compiles its own specialization: a decode shape's tile, an odd shape's lost alignment), else the
        first variant gate 2 runs."""
        names = [v.name for v, _ in self.correctness_variants()]
        timed = [v.name for v in self.problem.timed_variants(self.device.kind) if v.name in names]
        primary = self.problem.timing_variant(self.device.kind).name
        timed.sort(key=lambda n: n != primary)
        return timed or names[:1]

    def _compiled_dir(self, code: Code, variant: str) -> Path:
        return self.worker.workdir / "compiled" / code.hash[:16] / variant

    def diagnose(self, code: Code) -> dict[str, Any] | None:
        """What the compiler made of ``code``, and the KB's findings, read from the files its first call at each
        facts variant wrote (removed once read): the primary shape's as the diagnosis itself, every other timed
        shape's under ``by_shape`` (its kernels' facts and findings, each finding naming the shape). None without a
        diagnoser."""
        if self.diagnoser is None:
            return None
        if code.hash in self._diagnoses:
            return self._diagnoses[code.hash]
        try:
            model = parse_kernel(code.text, code.filename)
        except KernelSourceError:
            model = None
        shapes: list[tuple[str, dict[str, Any]]] = []
        for name in self._facts_variants():
            folder = self._compiled_dir(code, name)
            trace = None
            raw = self._facts_traces.pop((code.hash, name), None)
            if raw is not None:
                try:
                    trace = Trace.from_json(name, raw)
                except TraceError:
                    trace = None
            got = self.diagnoser.read(folder, trace, model)
            if self.settings.keep_compiled and folder.is_dir():
                got["kept"] = str(folder)
            shapes.append((name, got))
        # gate 2 ran no variant: nothing was captured, and the diagnosis says why
        out = by_shape(shapes) if shapes else self.diagnoser.read(self._compiled_dir(code, "none"), None, model)
        if not self.settings.keep_compiled:  # every shape's files, read
            shutil.rmtree(self.worker.workdir / "compiled" / code.hash[:16], ignore_errors=True)
        if out.get("available") or self.device.interpreter:
            self._diagnoses[code.hash] = out
        return out

    def profile(self, path: Path | Code, variant: Variant, iters: int = 10) -> dict[str, Any]:
        """Where ``path``'s device time goes at ``variant`` (:mod:`xeforge.diagnosis.profile`), from the profiler
        in the candidate worker; on the interpreter, why there is none. Advisory, like the compiler facts."""
        if self.device.interpreter:
            return {"available": False, "why": "the CPU interpreter has no device timeline"}
        code = self.code(path)
        slot, timeout = self._slot_and_timeout(code, variant)
        try:
            reply = self.worker.request("profile", max(timeout, self.settings.run_timeout_s), slot=slot,
                                        plan=[tp.wire() for tp in plan_inputs(self.problem, variant)], seed=0,
                                        iters=iters)
        except WorkerFailure as exc:
            return {"available": False, "why": f"the profile failed: {exc.detail[:300]}"}
        if reply.get("why"):
            return {"available": False, "why": str(reply["why"])[:300]}
        try:
            names = set(parse_kernel(code.text, code.filename).functions)
        except KernelSourceError:
            names = set()
        events = reply.get("events") or []
        return {**breakdown(events, names), "events": events}

    def deep_profile(self, path: Path | Code, variant: Variant) -> dict[str, Any]:
        """``--profile deep``: the vendor profiler's counters of one call of ``path`` at ``variant``
        (:mod:`xeforge.diagnosis.deep`), from a worker of its own started under the profiler inside the same
        sandbox (the candidate worker is never run under it: gate 3's times stay free of its overhead)."""
        if self.device.interpreter:
            return {"available": False, "why": "no hardware counters on the CPU interpreter"}
        tool, why = deep.tool_for(self.device.kind)
        if tool is None:
            return {"available": False, "why": why}
        code = self.code(path)
        folder = self.workdir / "deep" / code.hash[:16]
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        report = folder / "ncu.csv"
        worker = self._candidate_worker(folder, folder / "worker.log", prefix=tuple(deep.ncu_prefix(tool, report)))
        limit = self.settings.compile_timeout_s + self.settings.run_timeout_s
        try:
            worker.start(timeout=limit)
            worker.request("load", self.settings.compile_timeout_s, **self._load_payload(code, variant, "deep"))
            reply = worker.request("deep", limit, slot="deep",
                                   plan=[tp.wire() for tp in plan_inputs(self.problem, variant)], seed=0)
        except WorkerFailure as exc:
            worker.kill()
            return {"available": False, "why": f"the deep profile failed: {exc.detail[:300]}"}
        worker.close(wait=120.0)  # the profiler writes its report once the worker has exited
        if reply.get("why"):
            return {"available": False, "why": str(reply["why"])[:300]}
        return deep.read_ncu_csv(report)

    def _run(self, code: Code, variant: Variant, seed: int, dist: str, rerun: bool,
             poisoned: bool = False) -> tuple[dict, dict]:
        """Run ``code`` once in the candidate worker: (the tensors it wrote, the facts it replied); ``poisoned``: the
        rerun's uninitialized allocations start as NaN / the sentinel (see :meth:`_unstable_cause`)."""
        slot, timeout, first = self._slot_call(code, variant)
        out_file = self._io_file(self.worker, "out")
        compiled = None
        if (self.diagnoser is not None and not self.device.interpreter and first and code.hash not in self._diagnoses
                and variant.name in self._facts_variants()):
            compiled = self._compiled_dir(code, variant.name)
            shutil.rmtree(compiled, ignore_errors=True)
        try:
            facts = self.worker.request("run", timeout, slot=slot, plan=[tp.wire() for tp in plan_inputs(self.problem, variant)],
                                        seed=seed, distribution=dist, out_file=str(out_file), rerun=rerun,
                                        compiled_dir=str(compiled) if compiled else None,
                                        compiled_irs=None if compiled is None or self.settings.keep_compiled
                                        else sorted(self.diagnoser.irs),
                                        account_call=self.settings.runtime_account, poisoned=poisoned)
            if compiled is not None:
                self._facts_traces[(code.hash, variant.name)] = facts.get("trace")
            n = facts.get("n_outputs")
            if not isinstance(n, int) or not 0 <= n <= 4096 or not isinstance(facts.get("n_rerun_outputs", 0), int):
                raise WorkerFailure("protocol", f"the worker's reply gave {n!r} outputs")
            outs = wire.load_tensors(out_file, self._max_file_bytes())
        except wire.TensorFileError as exc:
            raise WorkerFailure("protocol", f"the outputs file: {exc}") from None
        finally:
            out_file.unlink(missing_ok=True)
        return outs, facts

    def trace(self, path: Path | Code, variant: Variant) -> "Trace":
        """One call of ``path``'s Model on ``variant``, every launch and torch op recorded, in the candidate worker."""
        reply = self._trace_reply(self.code(path), variant)
        try:
            return Trace.from_json(variant.name, reply.get("trace"))
        except TraceError as exc:
            raise WorkerFailure("protocol", str(exc)) from None

    def _trace_reply(self, code: Code, variant: Variant) -> dict:
        slot, timeout = self._slot_and_timeout(code, variant)
        return self.worker.request("trace", timeout, slot=slot,
                                   plan=[tp.wire() for tp in plan_inputs(self.problem, variant)], seed=0,
                                   distribution="normal")

    # ------------------------------------------------------------------------------------------ oracle
    def _oracle_name(self) -> str:
        return "float64 PyTorch reference" if self.problem.has_reference else "starting kernel (no reference.py)"

    def _oracle_where(self) -> str:
        return str(self.problem.reference_path or self.problem.kernel_path)

    def _oracle_request(self, op: str, first: bool, **payload: Any) -> dict:
        """A request to the oracle worker; a failure there is the problem's (its reference), never the candidate's."""
        timeout = self.settings.compile_timeout_s if first else self.settings.run_timeout_s
        try:
            return self.oracle_worker.request(op, timeout, **payload)
        except WorkerFailure as exc:
            what = {"timeout": f"did not finish within {timeout:g} s (XEFORGE_COMPILE_TIMEOUT / XEFORGE_RUN_TIMEOUT)",
                    "crash": f"crashed its worker: {exc.detail}", "exception": f"raised {exc.detail}",
                    "start": f"could not start its worker: {exc.detail}",
                    "protocol": f"gave a malformed reply: {exc.detail}"}[exc.kind]
            step = "building Model(*inits)" if op == "reference" else "running forward"
            raise ProblemError(self._oracle_where() + (f" ({exc.where})" if exc.where else ""),
                               f"the oracle ({self._oracle_name()}), {step}, {what}",
                               "make the reference run on the spec's inputs (and 'inits' match Model.__init__)") from None

    def _reference(self, variant: Variant) -> tuple[Path | None, list[str] | None]:
        """Build the oracle's Model for ``variant`` in the oracle worker: (its weights file, the output dtypes)."""
        got = self._refs.get(variant.name)
        if got is not None and got[0] == self.oracle_worker.generation and self.oracle_worker.alive():
            return got[1], got[2]
        self.worker.spawn()  # the candidate worker starts while the oracle builds the reference
        weights = self.oracle_worker.workdir / "weights" / f"{variant.name}-{self.weight_seed}.safetensors"
        weights.parent.mkdir(parents=True, exist_ok=True)
        code = self.problem.oracle_code
        reply = self._oracle_request("reference", True, slot=f"ref@{variant.name}", source=code.text,
                                     filename=code.filename, init_args=self.problem.init_args(variant),
                                     seed=self.weight_seed, dtype=variant.dtype, weights_out=str(weights))
        path = weights if reply.get("weights") else None
        self._refs[variant.name] = (self.oracle_worker.generation, path, None)
        self._weight_order[variant.name] = [str(k) for k in reply.get("params", {})]
        return path, None

    def _weights_file(self, variant: Variant) -> Path | None:
        return self._reference(variant)[0]

    def oracle(self, variant: Variant, seed: int, dist: str) -> tuple[list, list]:
        """Expected outputs (float64, on the oracle device) and the dtypes the kernel must return, for these inputs."""
        import torch  # lazy: torch, only for a GPU slot

        self._reference(variant)
        gen, weights, dtypes = self._refs[variant.name]
        out_file = self._io_file(self.oracle_worker, "oracle")
        try:
            reply = self._oracle_request("oracle", dtypes is None, slot=f"ref@{variant.name}",
                                         plan=[tp.wire() for tp in plan_inputs(self.problem, variant)], seed=seed,
                                         distribution=dist, out_file=str(out_file),
                                         float64=self.problem.has_reference, compute_device=self._oracle_device)
            outs = wire.load_tensors(out_file, self._max_file_bytes())
        except wire.TensorFileError as exc:
            raise ProblemError(self._oracle_where(), f"the oracle's outputs could not be read: {exc}",
                               "make the reference's forward return tensors") from None
        finally:
            out_file.unlink(missing_ok=True)
        names = [str(d) for d in reply.get("dtypes", [])]
        self._refs[variant.name] = (gen, weights, names)
        refs = [outs[f"out.{i}"] for i in range(len(names)) if f"out.{i}" in outs]
        if len(refs) != len(names):
            raise ProblemError(self._oracle_where(), "the oracle's forward returned something other than tensors",
                               "return a tensor (or a tuple of tensors) from the reference's forward")
        dev = self._oracle_device
        refs = [r.to(dev, torch.float64) if r.dtype.is_floating_point else r.to(dev) for r in refs]
        return refs, [getattr(torch, n) for n in names]

    # ------------------------------------------------------------------------------------------ gate 3
    def performance(self, inc: Path | Code, cand: Path | Code, all_shapes: bool = False) -> GateResult:
        """Gate 3 over every timed shape: the primary first, the others only when the candidate beat the incumbent
        there (one port stays bounded); each shape with its own A/A margin (:func:`xeforge.timing.decide_shapes`).

        ``all_shapes``: time every shape whatever the primary shows, for a candidate that asks for it because it is
        the incumbent at the primary by construction or within the noise (a per-shape dispatch, an autotuned list
        holding the incumbent's configuration: ``Candidate.time_all_shapes``): the primary-first cut would reject
        it unseen. The decision is the same rule over every shape (the weighted
        objective beyond the weighted margin, no shape slower than its own margin), never the primary's alone; with
        one timed shape the flag changes nothing."""
        if not self.device.can_time:
            return GateResult(GATES[3], "skipped", "not timed: the CPU interpreter measures nothing about GPU speed "
                              "(correctness only)", {"reason": "interpreter"})
        inc, cand = self.code(inc), self.code(cand)
        variants = self.problem.timed_variants(self.device.kind)
        shapes: list[ShapeVerdict] = []
        extra: dict[str, Any] = {}
        untimed: list[str] = []
        for i, variant in enumerate(variants):
            try:
                margin, aa = self.margin_for(inc, variant)
                inc_t, cand_t = self._time([inc, cand], variant)
            except WorkerFailure as exc:
                return GateResult(GATES[3], "fail", f"timing failed at {variant.name}: {exc}",
                                  {"phase": "isolation", "kind": exc.kind, "variant": variant.name})
            floor = self._floor(variant)
            d = decide(inc_t, cand_t, margin, floor, self.settings.speedup_flag)
            shapes.append(ShapeVerdict(variant.name, variant.weight, d))
            if i == 0:
                extra = {"aa": aa, "floor_ms": None if floor is None else floor * 1e3, "flagged_over_10x": d.flagged,
                         "launch_delay": dict(self.last_timing)}
                if not d.accepted and not all_shapes:
                    untimed = [v.name for v in variants[1:]]
                    break
        sd = decide_shapes(shapes, untimed)
        first = shapes[0].decision
        details = {"variant": shapes[0].variant, "speedup": sd.objective if len(shapes) > 1 else first.speedup,
                   "margin": sd.margin, "incumbent": first.incumbent.as_dict(), "candidate": first.candidate.as_dict(),
                   **extra, "method": self._method(), "shapes": [s.as_dict() for s in shapes],
                   "objective": sd.objective, "blocked_by": sd.blocked_by, "untimed": sd.untimed,
                   "improved": sd.improved, "all_shapes": all_shapes}
        if sd.implausible:
            return GateResult(GATES[3], "fail", sd.implausible, details)
        why = ("timed at every shape (the candidate asked: it chooses per shape, so the primary alone does not judge "
               "it): "
               if all_shapes and len(shapes) > 1 else "")
        return GateResult(GATES[3], "pass" if sd.accepted else "fail", why + sd.summary(), details)

    def _method(self) -> str:
        return (f"{self.device.kind} events, full sync, L2 flush (2x L2) repeated to cover the host's launch overhead, "
                f"rotated inputs, interleaved A/B, {self.settings.timed_pairs} pairs after "
                f"{self.settings.warmup_calls} warm-ups; median and IQR")

    def margin_for(self, inc: Path | Code, variant: Variant) -> tuple[float, dict]:
        """The A/A noise margin of the incumbent against itself at ``variant`` (cached per incumbent and shape;
        measured again once where it exceeds :data:`AA_SUSPECT`)."""
        inc = self.code(inc)
        key = (inc.hash, variant.name)
        if key not in self._margins:
            a, b = self._time([inc, inc], variant)
            margin = noise_margin(a, b, self.settings.min_noise_margin)
            remeasured = margin > AA_SUSPECT
            if remeasured:  # one code against itself that far apart: a disturbed run, not the kernel's noise
                a, b = self._time([inc, inc], variant)
                margin = noise_margin(a, b, self.settings.min_noise_margin)
            ratios = paired_ratios(a, b)
            d = decide(a, b, 0.0, None, self.settings.speedup_flag)
            self._margins[key] = (margin, {"aa_speedup": d.speedup,
                                           "aa_ratios_median": sorted(ratios)[len(ratios) // 2], "margin": margin,
                                           **({"remeasured": True} if remeasured else {})})
        return self._margins[key]

    def aa_test(self, path: Path | Code) -> dict:
        """Time a kernel against itself; the result must never count as a win."""
        variant = self.problem.timing_variant(self.device.kind)
        code = self.code(path)
        a, b = self._time([code, code], variant)
        margin = noise_margin(a, b, self.settings.min_noise_margin)
        d = decide(a, b, margin, None, self.settings.speedup_flag)
        return {"speedup": d.speedup, "margin": margin, "accepted": d.accepted, "a": d.incumbent.as_dict(),
                "b": d.candidate.as_dict(), "a_ms": a, "b_ms": b}

    def _time(self, codes: list[Code], variant: Variant) -> list[list[float]]:
        return self.time_entries([(c, None) for c in codes], variant)

    def time_entries(self, entries: list[tuple[Path | Code, str | None]], variant: Variant,
                     pairs: int | None = None) -> list[list[float]]:
        """Time several Models interleaved in one worker with the gate-3 method (events, L2 flush, rotation).

        Each entry is (a file defining ``Model`` — a kernel file or a plain-PyTorch reference — or its Code, a
        ``torch.compile`` mode or None). The same source twice is loaded twice (independent slots: an A/A run).
        Used by ``xeforge bench`` for start / final / eager / torch.compile.
        """
        slots, seen = [], {}
        for path, mode in entries:
            code = self.code(path)
            alias = seen.get((code.hash, mode), 0)
            seen[(code.hash, mode)] = alias + 1
            slots.append(self._ensure_loaded(code, variant, mode, alias))
            self._first.discard((code.hash, variant.name, mode, alias))
        reply = self.worker.request("time", self.settings.compile_timeout_s + self.settings.run_timeout_s, slots=slots,
                                    plan=[tp.wire() for tp in plan_inputs(self.problem, variant)],
                                    seed=secrets.randbits(62), pairs=pairs or self.settings.timed_pairs,
                                    warmup=self.settings.warmup_calls, l2_bytes=self.device.l2_bytes,
                                    budget_bytes=self._rotation_budget())
        self.last_timing = {k: reply.get(k) for k in ("host_ms_max", "flush_ms", "delay_flushes", "late_starts")}
        times = reply.get("times_ms")
        try:
            out = [[float(t) for t in times[s]] for s in slots]
        except (TypeError, KeyError, ValueError):
            raise WorkerFailure("protocol", "the timing reply did not hold a list of times for every slot") from None
        return out

    def _rotation_budget(self) -> int | None:
        if self.device.total_memory_bytes:
            return int(self.device.total_memory_bytes * self.settings.rotation_budget_fraction)
        return None

    def _floor(self, variant: Variant) -> float | None:
        entry = self.device_entry
        if entry is None:
            return None
        # the variant's own dtype, else its inputs': a spec that gives dtypes per input only (``xeforge new`` writes
        # such) computes in bf16 at its bf16 shapes, and the fp32 peak's floor would reject every fast candidate
        dtype = self.problem.compute_dtype(variant) or "float32"
        short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}.get(dtype, dtype)
        try:
            peak = entry.peak_flops(short)
            bw = entry.bandwidth_bytes_per_s
        except AttributeError:
            return None
        return roofline_floor(variant.flop, variant.bytes, peak, bw)

    # ------------------------------------------------------------------------------------------ prewarm
    def prewarm(self, sources: list[str], jobs: int | None = None) -> int:
        """Compile candidates in parallel on the host before the cascade runs them one by one.

        Each source runs once on every timed variant and once on every correctness variant (each shape is its own
        specialization, so its own compile) in a throw-away worker; Triton's on-disk cache then makes the
        verifier's own first calls fast. Failures are ignored here: the cascade reports them. Interpreter: no-op.
        """

        if self.device.interpreter or not sources:
            return 0
        timed = self.problem.timed_variants(self.device.kind)
        variants = timed + [v for v, _ in self.correctness_variants() if v.name not in {t.name for t in timed}]
        jobs = jobs or max(1, min(len(sources), (os.cpu_count() or 2) // 2, 8))
        setups = [(v, self._weights_file(v), [tp.wire() for tp in plan_inputs(self.problem, v)]) for v in variants]

        def one(i_src: tuple[int, str]) -> bool:
            i, src = i_src
            w = self._candidate_worker(self.workdir / "prewarm" / f"w{i}", self.workdir / "prewarm.log")
            try:
                for k, (variant, weights, plan) in enumerate(setups):
                    w.request("load", self.settings.compile_timeout_s, slot=f"p{k}", source=src,
                              filename=f"c{source_hash(src)}.py", init_args=self.problem.init_args(variant),
                              weights_file=str(weights) if weights else None, dtype=variant.dtype,
                              seed=self.weight_seed)
                    out = w.workdir / f"prewarm-{k}.safetensors"
                    w.request("run", self.settings.compile_timeout_s, slot=f"p{k}", plan=plan, seed=0,
                              distribution="normal", out_file=str(out), rerun=False)
                    out.unlink(missing_ok=True)
                return True
            except WorkerFailure:
                return False
            finally:
                w.close()

        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            return sum(pool.map(one, enumerate(sources)))

    # ------------------------------------------------------------------------------------------ final
    def restart_worker(self) -> None:
        """Start from scratch: a fresh candidate worker and no cached slots (used by the final gate)."""
        self.worker.close()
        self._slots.clear()
        self._first.clear()


def _work_facts(model: Any) -> dict[str, tuple[set[str], bool]]:
    """Per kernel of a file: the parameters it stores into and whether it loops over program ids (the work
    accounting's static half, :func:`xeforge.integrity.dummy_launches`)."""
    return {name: (stored_params(fn), loops_over_programs(fn)) for name, fn in model.functions.items()}
