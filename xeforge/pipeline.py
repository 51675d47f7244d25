"""The port loop. One problem, one device, the nine stages in order, every candidate verified.

The flow, and which module owns each step:

1. Load the problem (:mod:`xeforge.problem`) and pick the device (:mod:`xeforge.devices`) and its knowledge-base
   entry (:mod:`xeforge.kb`).
2. Open the run folder (:mod:`xeforge.store`): a new one, or the latest one with ``--resume``.
3. Baseline: verify the starting kernel (gates 0-2, :mod:`xeforge.verifier`); a broken start stops the run.
4. Analysis: every stage's detectors read the source (:mod:`stages`) and report issues.
5. Plan: the stages that have issues or applicable tactics, in order; ``--stages`` names stages that always run.
6. For each planned stage, the engine (:mod:`xeforge.engines`, :mod:`cover_agent`) proposes candidates; each one
   goes through the cascade and into the trial store before the next starts. On a GPU, the best candidate
   faster than the incumbent beyond the A/A noise margin becomes the incumbent; on the CPU interpreter, a
   correct rewrite is adopted *unmeasured* and search candidates are checked for correctness only.
7. Final gate: the result is re-verified from scratch on every variant and ragged shape and timed against the
   starting kernel; if it fails or is not faster, an earlier passing kernel (at worst the start) is returned.
8. Write the final kernel, ``report.json`` and ``report.md`` (:mod:`xeforge.report`). The input is never modified.
"""

from __future__ import annotations

import difflib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple

import stages as stage_registry
from stages.base import Candidate, Stage, StageContext, TacticRecord, TrialOutcome, propose_safely
from xeforge import device_lock, devices
from xeforge.analysis.alignment import describe as describe_alignment
from xeforge.analysis.observe import traces
from xeforge.analysis.trace import Trace
from xeforge.check_lanes import CheckLanes
from xeforge.diagnosis.rules import Diagnoser, findings_of
from xeforge.diagnosis.rules import describe as describe_diagnosis
from xeforge.engines import llm_prompt, make_engine
from xeforge.errors import EngineError, RunError, UsageError
from xeforge.kb import TritonInfo, installed_triton, load_kb
from xeforge.outcome import EXIT_CODES, outcome, why_nothing_adopted
from xeforge.isolation import facts_worker
from xeforge.problem import Problem, source_hash
from xeforge.report import write_reports
from xeforge.rewrite import align_hints
from xeforge.settings import Settings
from xeforge.static_checks import Finding
from xeforge.store import RunStore, atomic_write, make_run_folder, read_json, write_json
from xeforge.upstream import UPSTREAM_FILE, write_patch
from xeforge.verifier import GATES, Verdict, Verifier


@dataclass
class PortOptions:
    device: str = "auto"
    stages: list[str] | None = None
    engine: str = "auto"
    dry_run: bool = False
    resume: bool = False
    run_dir: Path | None = None
    runs_dir: Path = Path("runs")
    target: str | None = None  # KB device id to plan for (default: the entry matching the device)
    triton: str | None = None  # Triton version to gate the KB on (default: installed)
    settings: Settings = field(default_factory=Settings)
    llm: Any = None  # cover_agent LM configuration, when the llm engine is used
    argv: list[str] = field(default_factory=list)
    patch: bool = False  # write final/upstream.patch (always, for a problem made by `xeforge new`)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ knowledge base
@dataclass
class KBContext:
    kb: Any
    triton: Any
    device_id: str | None
    entry: Any
    note: str = ""


def kb_context(device: devices.DeviceInfo, target: str | None = None, triton: str | None = None) -> KBContext:
    """The knowledge base, the Triton it is gated on, and the device entry that applies."""
    kb = load_kb()
    if target:
        if target not in kb.devices:
            raise UsageError("--target", f"unknown device id {target!r}", f"use one of {', '.join(sorted(kb.devices))}")
        entry = kb.devices[target]
    else:
        entry = kb.match_device(device.props_for_kb())
    is_xpu = (entry.backend == "xpu") if entry is not None else device.kind == "xpu"
    tinfo = TritonInfo.parse(triton, is_xpu=is_xpu) if triton else installed_triton()
    return KBContext(kb, tinfo, entry.id if entry else None, entry,
                     "" if entry else f"no knowledge-base device entry matches {device.name!r}")


def diagnoser(kbc: KBContext, device: devices.DeviceInfo) -> Diagnoser | None:
    """The knowledge base's recognizers and diagnoses for ``device``: what every verdict's compiler facts are read
    with (None without a knowledge base)."""
    return None if kbc.kb is None else Diagnoser(kbc.kb, kbc.entry, kbc.triton, device)


def constraint_hook(kbc: KBContext):
    if kbc.kb is None or kbc.device_id is None:
        return None

    def hook(model):
        # errors reject the candidate; warnings (e.g. deprecated APIs) are not gate failures
        return [Finding(v.rule_id, v.line or 0, v.message, v.fix)
                for v in kbc.kb.check(model, kbc.device_id, kbc.triton) if v.is_error]

    return hook


# ------------------------------------------------------------------------------------------------ records
@dataclass
class StageRecord:
    name: str
    order: int
    goal: str
    status: str = "planned"  # ran | skipped | no-tactic | not-planned
    reason: str = ""
    issues: list[str] = field(default_factory=list)
    tactics: list[TacticRecord] = field(default_factory=list)
    incumbent_before: str = ""
    incumbent_after: str = ""
    speedup: float | None = None  # measured speedup of this stage's adopted candidates (product)
    adopted_unmeasured: bool = False
    kb_entries: int | None = None
    diagnosis: dict[str, Any] | None = None  # the incumbent's compiler facts and findings as the stage began


#: runners-up of an adoption the final gate may try in its place
FINAL_ALTERNATES = 2
#: a stage's weight in sharing a --time-budget (1 where not named): re-tuning the launch is most of a port to a new
#: GPU, and on the H100 three minutes over nine stages ran out before device_tuning's per-shape configurations
STAGE_WEIGHTS = {"device_tuning": 3.0, "autotuning": 1.5}
#: kernels the final gate verifies at most before it returns the start (each is a full cascade: bounded port time)
FINAL_TRIES = 4


class Pipeline:
    def __init__(self, problem: Problem, options: PortOptions, progress: Callable[[str], None] = log) -> None:
        self.problem = problem
        self.opt = options
        self.say = progress
        self.settings = options.settings
        self.fallback: str | None = None
        self.lanes: CheckLanes | None = None  # --check-lanes K > 1: the lanes of the running port
        self._checked: dict[str, Verdict] = {}  # source hash -> its verdict from a check lane, until gate 3 takes it

    # ------------------------------------------------------------------------------------------------ plan
    def resolve_engine(self) -> tuple[str, str]:
        """(engine, why). ``auto``: llm when a model is configured, rules otherwise."""
        eng = self.opt.engine
        if eng not in {"rules", "llm", "auto", "both"}:
            raise UsageError("--engine", f"unknown engine {eng!r}", "use rules, llm, auto or both")
        configured = self.opt.llm is not None and getattr(self.opt.llm, "configured", False)
        if eng == "auto":
            if configured:
                return "llm", "a model is configured"
            return "rules", "no LLM configured (set XEFORGE_MODEL or --model to use the llm engine)"
        if eng in {"llm", "both"} and not configured:
            raise EngineError("--engine " + eng, "no LLM is configured",
                              "set XEFORGE_MODEL (a LiteLLM model string) or pass --model; or use --engine rules")
        return eng, f"--engine {eng}"

    def selected_stages(self) -> list[Stage]:
        if self.opt.stages:
            unknown = [s for s in self.opt.stages if s not in stage_registry.BY_NAME]
            if unknown:
                raise UsageError("--stages", f"unknown stage(s) {', '.join(unknown)}",
                                 f"use names from: {', '.join(stage_registry.NAMES)}")
            return [s for s in stage_registry.ALL if s.name in self.opt.stages]
        return list(stage_registry.ALL)

    def context(self, device: devices.DeviceInfo, kbc: KBContext, source: str, run_dir: Path | None = None) -> StageContext:
        return StageContext(self.problem, source, self.problem.kernel_source, device, kbc.device_id, kbc.kb,
                            kbc.triton, self.settings, run_dir=run_dir)

    # ------------------------------------------------------------------------------------------------ dry run
    def dry_run(self) -> dict[str, Any]:
        """The plan: issues, stages, KB entries per stage, tactics with their diffs — nothing executed."""
        kind = self.opt.device if self.opt.device != "auto" else _dry_device_kind()
        device = devices.describe(kind) if devices.available(kind) else devices.DeviceInfo(kind, f"{kind} (not present)")
        kbc = kb_context(device, self.opt.target, self.opt.triton)
        engine, why = self.resolve_engine_for_dry_run()
        ctx = self.context(device, kbc, self.problem.kernel_source)
        plan = {"problem": self.problem.name, "device": device.as_dict(), "kb_device": kbc.device_id,
                "triton": getattr(kbc.triton, "text", None), "engine": engine, "engine_reason": why,
                "trace": trace_summary(self.problem),
                "alignment": self._alignment(), "stages": []}
        folder = self._dry_run_folder()
        upstream = self.opt.patch or (self.problem.root / UPSTREAM_FILE).is_file()
        for stage in self.selected_stages():
            issues = stage.detect(ctx)
            entry: dict[str, Any] = {"name": stage.name, "order": stage.order, "goal": stage.goal,
                                     "issues": [i.render() for i in issues], "tactics": []}
            if kbc.kb is not None and kbc.device_id:
                sel = kbc.kb.select(stage.name, kbc.device_id, kbc.triton)
                entry["kb"] = sel.render_text()
            if not stage.tactics:
                entry["tactics"].append({"name": None, "applies": False, "reason": stage.no_tactic_message()})
            for tactic in stage.tactics:
                app = tactic.check(ctx)
                t: dict[str, Any] = {"name": tactic.name, "applies": app.applies, "reason": app.reason}
                if app.applies:
                    cands, failed = propose_safely(tactic, ctx)
                    t["candidates"] = len(cands)
                    if failed:
                        t["failed"] = failed
                    if cands:
                        t["description"] = cands[0].description
                        t["diff"] = unified_diff(ctx.source, cands[0].source, "incumbent", cands[0].tactic)
                        if upstream:  # what this tactic alone would change in the user's file (docs/new.md)
                            t["patch"] = write_patch(self.problem.root, self.problem.kernel_source, cands[0].source,
                                                     folder / "patches" / f"{stage.order}-{tactic.name}",
                                                     self.problem.kernel_path.name)
                entry["tactics"].append(t)
            if engine in {"llm", "both"} or self.opt.engine == "llm":
                entry["prompt"] = self._render_prompt(stage, ctx, issues, kbc)
            plan["stages"].append(entry)
        write_json(folder / "plan.json", plan)
        for st in plan["stages"]:
            if "prompt" in st:
                atomic_write(folder / "prompts" / f"{st['order']}-{st['name']}.md", st["prompt"])
        plan["run_dir"] = str(folder)
        return plan

    def _dry_run_folder(self) -> Path:
        if self.opt.run_dir is not None:
            return Path(self.opt.run_dir)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        folder = Path(self.opt.runs_dir) / self.problem.name / f"{stamp}-dry-run"
        n = 1
        while folder.exists():
            n += 1
            folder = Path(self.opt.runs_dir) / self.problem.name / f"{stamp}-dry-run-{n}"
        return folder

    def resolve_engine_for_dry_run(self) -> tuple[str, str]:
        if self.opt.engine in {"llm", "both"}:
            return self.opt.engine, "dry run: prompts are rendered, no model is called"
        return self.resolve_engine()

    def _render_prompt(self, stage: Stage, ctx: StageContext, issues, kbc: KBContext) -> str:
        return llm_prompt(stage, ctx, issues, kbc)

    # ------------------------------------------------------------------------------------------------ run
    def run(self) -> dict[str, Any]:
        opt = self.opt
        engine_name, engine_why = self.resolve_engine()
        kind = devices.resolve(opt.device)
        facts_worker().spawn()  # its start-up (torch) overlaps the baseline's; the stages' traces run in it
        device = devices.describe(kind)
        kbc = kb_context(device, opt.target, opt.triton)
        store = self._open_store()
        self.say(f"xeforge port {self.problem.name} on {device.kind} ({device.name}); run folder {store.root}")
        if device.interpreter:
            self.say("note: the CPU interpreter checks correctness only; no timing here means anything")
        if kbc.note:
            self.say(f"note: {kbc.note}")
        self.say(f"engine: {engine_name} ({engine_why})")
        run_meta = {"problem": self.problem.name, "problem_path": str(self.problem.root), "argv": opt.argv,
                    "device": device.as_dict(), "kb_device": kbc.device_id,
                    "triton_gate": getattr(kbc.triton, "text", None), "engine": engine_name,
                    "engine_reason": engine_why, "stages": [s.name for s in self.selected_stages()],
                    "settings": self.settings.__dict__, "status": "running",
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "start_hash": self.problem.source_hash}
        if store.resumed:
            prev = store.read_run()
            if prev.get("start_hash") != self.problem.source_hash:
                raise RunError(str(store.root), "the starting kernel changed since this run began",
                               "start a new run (drop --resume)")
            self.say(f"resuming: {len(store._memo)} recorded trial(s) will be replayed")
            run_meta["started"] = prev.get("started", run_meta["started"])
            run_meta["resumed_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        store.write_run(run_meta)
        hooks = [h for h in [constraint_hook(kbc)] if h]

        def lane_verifier(folder: Path, env: dict[str, str]) -> Verifier:
            return Verifier(self.problem, device, self.settings, folder, hooks, kbc.entry, diagnoser(kbc, device),
                            cache=store.root / "triton-cache", hide=store.root, env=env)

        with Verifier(self.problem, device, self.settings, store.root, hooks, kbc.entry,
                      diagnoser(kbc, device)) as verifier, \
                CheckLanes(self.settings.check_lanes, store.root / "lanes", device.kind, verifier, lane_verifier,
                           self.say) as lanes:
            self.lanes = lanes if lanes.n > 1 else None
            try:
                report = self._run(store, verifier, device, kbc, engine_name)
            except BaseException as exc:
                store.update_run(status="interrupted" if isinstance(exc, KeyboardInterrupt) else "failed",
                                 error=str(exc))
                raise
        store.update_run(status="done", finished=time.strftime("%Y-%m-%dT%H:%M:%S"))
        return report

    def _open_store(self) -> RunStore:
        opt = self.opt
        if opt.run_dir is not None:
            rd = Path(opt.run_dir)
            if (rd / "run.json").exists():
                if not opt.resume:
                    raise RunError(str(rd), "this run folder already holds a run",
                                   "pass --resume to continue it, or choose another --run-dir")
                return RunStore.open(rd)
            return _new_at(rd)
        if opt.resume:
            return RunStore.latest(opt.runs_dir, self.problem.name)
        return RunStore.create(opt.runs_dir, self.problem.name)

    def _run(self, store: RunStore, verifier: Verifier, device, kbc: KBContext, engine_name: str) -> dict[str, Any]:
        start_path = store.root / "baseline" / self.problem.kernel_path.name
        if not start_path.exists():
            atomic_write(start_path, self.problem.kernel_source)
        # engines first: a missing key or a dead server (the llm engine probes it) is reported before any device
        # time is spent; --engine auto falls back to the rules engine and says so in the report
        try:
            engine = make_engine(engine_name if engine_name != "both" else "rules", self.opt)
        except EngineError as exc:
            if self.opt.engine != "auto" or engine_name != "llm":
                raise
            self.say(f"the llm engine cannot start ({exc.what}); --engine auto falls back to the rules engine")
            self.fallback = f"the llm engine could not start: {exc.what}; rules engine used"
            engine_name, engine = "rules", make_engine("rules", self.opt)
        llm_engine = make_engine("llm", self.opt) if engine_name == "both" else None
        if self.lanes is not None:
            self.lanes.start()  # their workers load while the start is verified
        baseline = self._baseline(store, verifier, start_path)
        incumbent_path, incumbent_src = start_path, self.problem.kernel_source
        incumbent_diagnosis = baseline.get("diagnosis")
        history: list[Path] = [start_path]
        # kernel adopted -> the runners-up of its choice (accepted at gate 3 too), fastest first: the final gate
        # tries them when its own timing refuses the kernel (a shape within the noise at gate 3, beyond it now)
        alternates: dict[Path, list[Path]] = {}
        per_shape = False  # a per-shape candidate was adopted: the final gate times every shape too
        records: list[StageRecord] = []
        named = set(self.opt.stages or [])
        # a correct rewrite whose gain was below the noise margin, or that lost at one shape: tried again as the
        # basis of the next stage's candidates, where the incumbent is faster and the same gain is a larger fraction
        carried: Carried | None = None
        t0 = time.monotonic()
        stages = self.selected_stages()
        for i, stage in enumerate(stages):
            rec = StageRecord(stage.name, stage.order, stage.goal, incumbent_before=source_hash(incumbent_src))
            records.append(rec)
            share = self._stage_share(t0, stages[i:])
            spent = self._time_spent(t0)
            if spent:
                rec.status, rec.reason = "skipped", spent
                rec.incumbent_after = rec.incumbent_before
                self.say(f"[stage {stage.order}/9 {stage.name}] skipped: {spent}")
                continue
            ctx = self.context(device, kbc, incumbent_src, store.root)
            ctx.diagnosis = rec.diagnosis = incumbent_diagnosis
            issues = stage.detect(ctx)
            rec.issues = [i.render() for i in issues]
            if kbc.kb is not None and kbc.device_id:
                rec.kb_entries = len(kbc.kb.select(stage.name, kbc.device_id, kbc.triton).ids())
            checks = {t.name: t.check(ctx) for t in stage.tactics}
            applicable = [name for name, app in checks.items() if app.applies]
            self.say(f"[stage {stage.order}/9 {stage.name}] {len(issues)} issue(s)")
            for f in findings_of(incumbent_diagnosis):
                if f.stage == stage.name:
                    self.say(f"  diagnosis of the incumbent: {f.render()}")
            if engine_name == "rules" and not stage.tactics:
                rec.status, rec.reason = "no-tactic", stage.no_tactic_message()
                self.say(f"  {rec.reason}")
                rec.incumbent_after = rec.incumbent_before
                continue
            if stage.name not in named and not issues and not applicable and engine_name == "rules":
                rec.status, rec.reason = "skipped", "analysis found nothing for this stage and no tactic applies"
                for t in stage.tactics:
                    rec.tactics.append(TacticRecord(t.name, False, checks[t.name].reason))
                self.say(f"  skipped: {rec.reason}")
                rec.incumbent_after = rec.incumbent_before
                continue
            rec.status = "ran"
            inc_holder = {"path": incumbent_path, "src": incumbent_src}

            def evaluate(cand: Candidate, stage=stage) -> TrialOutcome:
                return self._evaluate(store, verifier, stage, cand, inc_holder["path"], inc_holder["src"])

            def prepare(cands: list[Candidate]) -> None:
                todo = [c.source for c in cands if c.source != inc_holder["src"] and store.recorded(store.key(
                    stage.name, c.tactic, source_hash(inc_holder["src"]), source_hash(c.source))) is None]
                if self.lanes is not None and len(todo) > 1:
                    checked = self.lanes.check(todo)
                    self._checked.update(checked)
                    self.say(f"  checked {len(checked)} candidate(s) in {self.lanes.n} check lanes: "
                             f"{sum(v.correct for v in checked.values())} correct")
                    todo = [src for src in todo if (v := checked.get(source_hash(src))) is None or v.correct]
                n = verifier.prewarm(todo)
                if n:
                    self.say(f"  compiled {n} candidate(s) in parallel on the host")

            evaluate.prepare = prepare  # type: ignore[attr-defined]
            # checked before each tactic and each candidate after a tactic's first: the port's budget, or the part
            # of this stage's share the run at hand may take (the whole, or half while a carried trial waits)
            window: dict[str, Any] = {"share": share, "rest_for": None}
            evaluate.spent = (  # type: ignore[attr-defined]
                lambda: self._time_spent(t0) or self._share_spent(window["share"], window["rest_for"]))
            # the seconds left of it, which the rules engine splits between the tactics still to run
            evaluate.left = lambda: self._share_left(window["share"])  # type: ignore[attr-defined]
            # the port's budget alone: a run on top of a carried trial judges one candidate even when the stage's
            # share is spent (the first half overran it), for the carried trial is why the share was halved
            evaluate.port_spent = lambda: self._time_spent(t0)  # type: ignore[attr-defined]

            def choose(outcomes: list[TrialOutcome]) -> TrialOutcome | None:
                best = self._choose(outcomes, device)
                if best is not None:
                    best.adopted = True
                    path = store.root / "trials" / best.trial / "candidate.py"
                    inc_holder["path"], inc_holder["src"] = path, best.candidate.source
                    others = sorted((o for o in outcomes if o is not best and o.verdict.correct and o.verdict.timed
                                     and o.verdict.accepted), key=lambda o: -(o.verdict.speedup or 0.0))
                    alternates[path] = [store.root / "trials" / o.trial / "candidate.py"
                                        for o in others[:FINAL_ALTERNATES]]
                return best

            if carried is not None and engine.name == "rules" and share is not None:
                # the candidates on top of the carried trial get the second half (a 4x faster tile that was 3%
                # slower at M = 16 is what device_tuning's per-shape branch on top of it turns into a gain)
                window.update(share=(share[0], share[1] / 2, share[2]),
                              rest_for=f"the candidates on top of trial {carried.trial}")
            try:
                rec.tactics = engine.run_stage(stage, ctx, evaluate, choose)
            except EngineError as exc:
                if self.opt.engine != "auto" or engine.name != "llm":
                    raise
                self.say(f"  the llm engine failed ({exc.what}); --engine auto falls back to the rules engine")
                engine_name, engine = "rules", make_engine("rules", self.opt)
                self.fallback = f"llm engine failed at stage {stage.name}: {exc.what}; rules engine used from there"
                rec.tactics = engine.run_stage(stage, ctx, evaluate, choose)
            window.update(share=share, rest_for=None)
            if carried is not None and engine.name == "rules":
                self.say(f"  again on top of trial {carried.trial} (correct; not adopted: its gain was below the noise "
                         "margin, or it was slower at one of the shapes)")
                on_top = ctx.with_source(carried.source)
                # its own compiler facts and the shapes it lost at order the tactics, as the incumbent's do
                on_top.diagnosis, on_top.lost_at = carried.diagnosis, carried.lost_at
                more = engine.run_stage(stage, on_top, evaluate, choose, basis=f"trial {carried.trial}")
                if any(t.outcomes for t in more):
                    rec.tactics += [t for t in more if t.outcomes]
                    carried = None
            if engine.name == "rules" and device.can_time:
                skipped: list[str] = []
                bases = _kb_bases(stage, ctx, kbc, {s.name for s in self.selected_stages()},
                                  _incorrect_tactics(records), skipped)
                for note in skipped:
                    self.say(f"  not again on top of {note}")
                for source, what in bases:
                    self.say(f"  again on top of {what}")
                    more = engine.run_stage(stage, ctx.with_source(source), evaluate, choose, basis=what)
                    rec.tactics += [t for t in more if t.outcomes]
            if llm_engine is not None:
                rec.tactics += llm_engine.run_stage(stage, ctx.with_source(inc_holder["src"]), evaluate, choose)
            for t in rec.tactics:
                if not t.applies:
                    self.say(f"  tactic {t.name}: does not apply: {t.reason}")
            adopted = [t.best for t in rec.tactics if t.best is not None]
            if adopted:
                incumbent_path, incumbent_src = inc_holder["path"], inc_holder["src"]
                incumbent_diagnosis = adopted[-1].verdict.diagnosis if adopted[-1].verdict else None
                history.append(incumbent_path)
                speedups = [o.verdict.speedup for o in adopted if o.verdict.timed and o.verdict.speedup]
                rec.speedup = _product(speedups) if speedups else None
                rec.adopted_unmeasured = any(not o.verdict.timed for o in adopted)
                per_shape = per_shape or any(o.candidate.time_all_shapes for o in adopted)
            elif device.can_time:
                carried = _hidden_gain(rec.tactics) or carried
            rec.incumbent_after = source_hash(incumbent_src)
        final = self._final(store, verifier, device, history, start_path, records,
                            **({"all_shapes": True} if per_shape else {}), alternates=alternates)
        report = self._report(store, device, kbc, engine_name, baseline, records, final)
        report["shared_device"] = self._shared_device(verifier, device, t0)
        write_reports(store.root, report)
        return report

    @staticmethod
    def _shared_device(verifier: Verifier, device, started: float) -> dict[str, float] | None:
        """On a GPU shared with other lanes (``XEFORGE_GPU_LOCK``, set by ``bench --lanes-per-gpu``): the seconds
        the port's own workers waited for the device while another lane timed on it, and the wall time from the first
        stage to the final gate's end (the time budget counts both); None on a GPU of its own and on the
        interpreter."""
        if device.interpreter or not device_lock.lock_path():
            return None
        waited = sum(w.wait_s for w in (verifier.worker, verifier.oracle_worker))
        return {"waited_s": round(waited, 1), "wall_s": round(time.monotonic() - started, 1)}

    def _stage_share(self, t0: float, left: list) -> tuple[float, float, str] | None:
        """(when the stage starts, the seconds it may take, its name) under a time budget: the stage's weight's part
        of what is left (:data:`STAGE_WEIGHTS`; a stage that ends early leaves its time to the ones after it), so
        the first stages' searches do not spend the minutes the launch's re-tuning needs. None without a budget."""
        budget = self.settings.port_minutes
        if not budget or not left:
            return None
        now = time.monotonic()
        remaining = 60 * budget - (now - t0)
        weights = [STAGE_WEIGHTS.get(st.name, 1.0) for st in left]
        return now, max(0.0, remaining) * weights[0] / sum(weights), left[0].name

    @staticmethod
    def _share_left(share: tuple[float, float, str] | None) -> float | None:
        """Seconds left of a stage's share of the time budget (None without a budget)."""
        if share is None:
            return None
        start, seconds, _ = share
        return max(0.0, seconds - (time.monotonic() - start))

    @staticmethod
    def _share_spent(share: tuple[float, float, str] | None, rest_for: str | None = None) -> str | None:
        """Why a stage's share (or, with ``rest_for``, its first half: the other is for that) is spent, or None."""
        if share is None:
            return None
        start, seconds, name = share
        took = time.monotonic() - start
        if took < seconds:
            return None
        if rest_for:
            return (f"the {name} stage's first half (the other is for {rest_for}) of the port's time budget "
                    f"({seconds:.0f} s) was spent after {took:.0f} s")
        return (f"the {name} stage's share of the port's time budget ({seconds:.0f} s) was spent after {took:.0f} s; "
                "the stages after it get the rest (continue with --resume and a larger --time-budget)")

    def _time_spent(self, t0: float) -> str | None:
        """Why the next stage (or, inside a stage, the next tactic of the rules engine) is skipped when the port's
        time budget (``--time-budget``, minutes) is spent."""
        budget = self.settings.port_minutes
        elapsed = time.monotonic() - t0
        if not budget or elapsed < 60 * budget:
            return None
        took = f"{elapsed:.1f} s" if elapsed < 120 else f"{elapsed / 60:.1f} min"
        return (f"the port's time budget ({budget:g} min) was spent after {took} of stages; "
                "the final gate takes the best kernel so far (continue with --resume and a larger --time-budget)")

    # ------------------------------------------------------------------------------------------------ steps
    def _baseline(self, store: RunStore, verifier: Verifier, start_path: Path) -> dict[str, Any]:
        vpath = store.root / "baseline" / "verdict.json"
        if vpath.exists():
            v = Verdict.from_dict(read_json(vpath))
            self.say("baseline: replayed from the run folder")
        else:
            self.say("baseline: verifying the starting kernel")
            v = verifier.verify(start_path, None, source_hash=self.problem.source_hash)
            write_json(vpath, v.as_dict())
        for g in v.gates:
            self.say(f"  gate {g.gate}: {g.status} — {g.summary}")
        for line in describe_diagnosis(v.diagnosis):
            self.say(f"  {line}")
        if not v.correct:
            raise RunError(str(self.problem.kernel_path), "the starting kernel does not pass verification: "
                           + v.feedback(), "fix the starting kernel (or its reference/spec) before porting it")
        return v.as_dict()

    def _evaluate(self, store: RunStore, verifier: Verifier, stage: Stage, cand: Candidate, inc_path: Path,
                  inc_src: str) -> TrialOutcome:
        h = source_hash(cand.source)
        key = store.key(stage.name, cand.tactic, source_hash(inc_src), h)
        rec = store.recorded(key)
        if rec is not None:
            folder, vd = rec
            verdict = Verdict.from_dict(vd)
            self.say(f"  trial {folder.name} (replayed): {verdict.feedback()}")
            return TrialOutcome(folder.name, cand, verdict, replayed=True)
        folder = store.new_trial(key, stage.name, cand.tactic, cand.source,
                                 {"description": cand.description, "kind": cand.kind, "params": cand.params,
                                  **({"time_all_shapes": True} if cand.time_all_shapes else {}),
                                  "incumbent": source_hash(inc_src), "candidate": h})
        self.say(f"  trial {folder.name}: {cand.description}")
        if cand.source == inc_src:
            verdict = Verdict(h, note="identical to the incumbent")
        else:
            checked = self._checked.pop(h, None)  # a check lane's verdict: gate 3 continues it
            verdict = verifier.verify(folder / "candidate.py", inc_path, source_hash=h,
                                      **({"all_shapes": True} if cand.time_all_shapes else {}),
                                      **({"checked": checked} if checked is not None else {}))
        store.finish_trial(folder, key, verdict.as_dict())
        self.say(f"    {verdict.feedback()[:400]}")
        return TrialOutcome(folder.name, cand, verdict)

    def _choose(self, outcomes: list[TrialOutcome], device) -> TrialOutcome | None:
        correct = [o for o in outcomes if o.verdict.correct]
        if device.can_time:
            faster = [o for o in correct if o.verdict.accepted]
            if not faster:
                return None
            # the fastest, or where others are as fast within its noise margin, the one of them with the fewest lines,
            # the form later tactics read best: on an H100 (2026-12-07) gemm_tall_k's descriptors with their C tile
            # stored in two halves won by 1.327x against 1.326x, and the halves kept split-K, which its 32 tiles on
            # 132 cores needed, from applying (split-K now also undoes them: device_tuning_splitk.stored_whole)
            best = max(faster, key=lambda o: o.verdict.speedup or 0.0)
            margin = best.verdict.margin or 0.0
            ties = [o for o in faster if (o.verdict.speedup or 0.0) * (1.0 + margin) >= (best.verdict.speedup or 0.0)]
            return min(ties, key=lambda o: (o.candidate.source.count("\n"), -(o.verdict.speedup or 0.0)))
        rewrites = [o for o in correct if o.candidate.kind == "rewrite"]
        return rewrites[0] if rewrites else None

    def _final(self, store: RunStore, verifier: Verifier, device, history: list[Path], start_path: Path,
               records: list[StageRecord] = (), all_shapes: bool = False,
               alternates: dict[Path, list[Path]] | None = None) -> dict:
        """Re-verify the result from scratch; fall back to earlier passing kernels; never return something worse.

        Refused by the final gate (wrong, or not faster than the start now), a kernel gives way to the runners-up
        of its own choice (``alternates``: accepted at gate 3 too), then to the kernel before it in ``history``;
        after ``FINAL_TRIES`` refusals the start is returned.
        ``all_shapes``: a per-shape candidate was adopted (it gains at shapes other than the primary), so the final
        kernel is timed against the start at every shape, by the same rule as gate 3."""
        verifier.restart_worker()
        chain = [p for h in reversed(history) for p in (h, *(alternates or {}).get(h, []))]
        slower = None  # the first verdict that was correct but not faster than the start
        refused: list[dict[str, str]] = []  # the kernels the final gate turned down before the one it returns, and why
        for tried, path in enumerate(chain):
            if path == start_path and len(chain) > 1:
                break
            if tried >= FINAL_TRIES:
                self.say(f"  {FINAL_TRIES} kernels refused at the final gate: the starting kernel is returned")
                break
            self.say(f"final gate: re-verifying {path.relative_to(store.root)} from scratch on every variant")
            v = verifier.verify(path, start_path if path != start_path else None, source_hash=source_hash(path.read_text()),
                                **({"all_shapes": True} if all_shapes else {}))
            for g in v.gates:
                self.say(f"  gate {g.gate}: {g.status} — {g.summary[:300]}")
            if not v.correct:
                self.say("  the final gate rejected it; falling back to the previous kernel")
                refused.append({"from": str(path.relative_to(store.root)), "why": v.feedback()})
                continue
            if v.timed and not v.accepted:
                self.say("  not faster than the starting kernel beyond the noise margin now; trying the next one")
                refused.append({"from": str(path.relative_to(store.root)), "why": v.feedback()})
                slower = slower or v
                continue
            if path == start_path:
                why = why_nothing_adopted([_stage_dict(r) for r in records], device.can_time)
                return self._write_final(store, start_path, v, why, improved=False, refused=refused)
            claim = (f"verified speedup {v.speedup:.3f}x over the starting kernel" if v.timed else
                     "correct on every variant; speed not measured on the CPU interpreter")
            return self._write_final(store, path, v, claim, improved=v.timed, refused=refused)
        if slower is not None:
            self.say("  no candidate is faster than the starting kernel at the final gate; the starting kernel is returned")
            return self._write_final(store, start_path, slower, "no verified improvement over the starting kernel",
                                     improved=False, refused=refused)
        v = Verdict(self.problem.source_hash, correct=True, note="the starting kernel (verified at baseline)")
        return self._write_final(store, start_path, v, "no candidate passed the final gate; the starting kernel is returned",
                                 improved=False, refused=refused)

    def _write_final(self, store: RunStore, path: Path, verdict: Verdict, claim: str, improved: bool,
                     refused: list[dict[str, str]] | None = None) -> dict:
        dest = store.root / "final" / self.problem.kernel_path.name
        atomic_write(dest, path.read_text())
        write_json(store.root / "final" / "verdict.json", verdict.as_dict())
        out = {"path": str(dest), "from": str(path.relative_to(store.root)), "claim": claim, "improved": improved,
               "verdict": verdict.as_dict(), "source_hash": source_hash(path.read_text()),
               "is_start": path.parent.name == "baseline", "refused": list(refused or [])}
        if self.opt.patch or (self.problem.root / UPSTREAM_FILE).is_file():
            # the way back: the final kernel as a diff of the user's file (docs/new.md)
            out["patch"] = write_patch(self.problem.root, self.problem.kernel_source, path.read_text(),
                                       store.root / "final", self.problem.kernel_path.name)
        return out

    def _alignment(self) -> list[str]:
        """The report's alignment lines; a failure to read them is said, never the end of a finished port."""
        try:
            return [describe_alignment(f) for f in align_hints.findings(self.problem)]
        except Exception as exc:  # noqa: BLE001 — advisory, like the compiler facts
            self.say(f"alignment by shape: not read ({type(exc).__name__}: {exc})")
            return []

    def _report(self, store, device, kbc, engine_name, baseline, records, final) -> dict[str, Any]:
        stages = [_stage_dict(r) for r in records]
        result = outcome(stages, final, self.fallback)
        fell_back = f" (the llm engine fell back to the rules engine: {self.fallback})" if self.fallback else ""
        return {
            "schema": 1,
            "problem": self.problem.name,
            "problem_path": str(self.problem.root),
            "description": self.problem.spec.description,
            "run_dir": str(store.root),
            "device": device.as_dict(),
            "kb_device": kbc.device_id,
            "triton_gate": getattr(kbc.triton, "text", None),
            "versions": devices.versions(),
            "engine": engine_name,
            "engine_fallback": self.fallback,
            "engine_requested": self.opt.engine,
            "outcome": result,
            "exit_code": EXIT_CODES[result],
            "timing_method": None if device.interpreter else
            "device events, full sync, L2 flush (repeated to hide host launch overhead), rotated inputs, interleaved A/B, median + IQR, A/A margin",
            "oracle": "float64 PyTorch reference" if self.problem.has_reference else "starting kernel (no reference.py)",
            "check_lanes": self.lanes.describe() if self.lanes is not None else None,
            "alignment": self._alignment(),
            "notes": self.problem.notes,
            "baseline": baseline, "baseline_compiler": describe_diagnosis(baseline.get("diagnosis")),
            "stages": stages,
            "final": final,
            "summary": f"{self.problem.name} on {device.kind}: {final['claim']}{fell_back}",
        }


def _new_at(path: Path) -> RunStore:
    make_run_folder(Path(path))
    return RunStore(Path(path))


class Carried(NamedTuple):
    """A correct rewrite carried into the next stage (:func:`_hidden_gain`): its source and trial, its compiler facts
    and findings, and the timed shapes that kept it from adoption (slower there than their margin allows)."""

    source: str
    trial: str
    diagnosis: dict[str, Any] | None = None
    lost_at: tuple[str, ...] = ()


def _hidden_gain(tactics: list[TacticRecord]) -> Carried | None:
    """The best rewrite that passed gates 0-2 and was timed not slower than the incumbent (its objective over the
    shapes), but not adopted: faster, but not beyond the margin (e.g. fusing a 2% epilogue into a GEMM still running
    at a fifth of its final speed), or slower at one shape (tensor descriptors with a 128 x 256 tile: 4.3x at
    4096^3 and 0.97x at M = 16, on the H100)."""
    near = [o for t in tactics for o in t.outcomes
            if o.verdict.correct and o.verdict.timed and not o.verdict.accepted and o.candidate.kind == "rewrite"
            and (o.verdict.speedup or 0.0) >= 1.0]
    best = max(near, key=lambda o: o.verdict.speedup, default=None)
    if best is None:
        return None
    perf = next((g for g in best.verdict.gates if g.gate == GATES[3]), None)
    blocked = perf.details.get("blocked_by") if perf is not None else None  # the worst shape beyond its margin
    return Carried(best.candidate.source, best.trial, best.verdict.diagnosis, (blocked,) if blocked else ())


def _kb_bases(stage: Stage, ctx: StageContext, kbc: KBContext, selected: set[str] | None = None,
              incorrect: dict[str, str] | None = None, skipped: list[str] | None = None) -> list[tuple[str, str]]:
    """(source, what it is) for each knowledge-base pattern of an earlier stage (one of ``selected``, the stages
    this port runs; all when None) whose ``basis_for`` names ``stage``:
    that pattern's tactic's rewrite of the incumbent, where the tactic still applies (its stage did not adopt it:
    it was slower alone), so ``stage``'s candidates are also proposed on top of it. E.g. on the H200 an elementwise
    chain fused into a GEMM's epilogue was 0.83x of the two kernels with one tile per program, while the
    persistent kernel with the chain fused was the faster end point (KB
    ``fusion-chain-pays-in-persistent-kernels-on-hopper``). Candidates on top of it are timed against the
    incumbent like every other; on the CPU interpreter, where every correct rewrite is adopted, there is none.
    A tactic in ``incorrect`` (tactic -> the trial of this port that failed the correctness gate with it) is no
    basis: what is built on it fails the same way (kb94's bf16 GEMM output before a GroupNorm was outside the
    tolerance at its own trial and under all six persistent candidates on top of it); ``skipped`` gets why."""
    if kbc.kb is None or not kbc.device_id:
        return []
    out = []
    for earlier in stage_registry.ALL:
        if earlier.order >= stage.order:
            break
        if selected is not None and earlier.name not in selected:
            continue  # --stages left that stage out: its rewrites are not this port's to make
        tactics = {t.name: t for t in earlier.tactics}
        for pattern in kbc.kb.select(earlier.name, kbc.device_id, kbc.triton).patterns:
            tactic = tactics.get(pattern.spec.tactic or "")
            if stage.name not in pattern.spec.basis_for or tactic is None:
                continue
            if tactic.name in (incorrect or {}):
                if skipped is not None:
                    skipped.append(f"{earlier.name}'s {tactic.name} rewrite (KB {pattern.id}): its trial "
                                   f"{incorrect[tactic.name]} failed the correctness gate")
                continue
            if not tactic.check(ctx).applies:
                continue
            candidates, _ = propose_safely(tactic, ctx)
            if candidates:
                out.append((candidates[0].source, f"{earlier.name}'s {tactic.name} rewrite of the incumbent "
                                                  f"(KB {pattern.id})"))
    return out


def _incorrect_tactics(records: list[StageRecord]) -> dict[str, str]:
    """Tactic -> the first trial of this port in which one of its candidates failed gate 2 (correctness)."""
    out: dict[str, str] = {}
    for rec in records:
        for t in rec.tactics:
            for o in t.outcomes:
                gates = getattr(o.verdict, "gates", None) or []
                if any(str(g.gate).startswith("2") and g.status == "fail" for g in gates):
                    out.setdefault(t.name, o.trial)
    return out


def _product(xs: list[float]) -> float:
    out = 1.0
    for x in xs:
        out *= x
    return out


def _dry_device_kind() -> str:
    try:
        return devices.resolve("auto")
    except Exception:  # no torch: plan for the CPU interpreter
        return "cpu"


def unified_diff(a: str, b: str, a_name: str, b_name: str) -> str:
    return "".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True), a_name, b_name, n=2))


def _stage_dict(r: StageRecord) -> dict[str, Any]:
    return {
        "name": r.name, "order": r.order, "goal": r.goal, "status": r.status, "reason": r.reason,
        "issues": r.issues, "kb_entries": r.kb_entries, "speedup": r.speedup,
        "adopted_unmeasured": r.adopted_unmeasured, "incumbent_before": r.incumbent_before,
        "incumbent_after": r.incumbent_after,
        "diagnosis": describe_diagnosis(r.diagnosis, quiet=True),
        "tactics": [{
            "name": t.name, "engine": t.engine, "applies": t.applies, "reason": t.reason, "note": t.note,
            "best": t.best.trial if t.best else None, "tally": dict(getattr(t, "tally", {}) or {}),
            "candidates": [{
                "trial": o.trial, "description": o.candidate.description, "kind": o.candidate.kind,
                "replayed": o.replayed, "adopted": o.adopted, "correct": o.verdict.correct,
                "accepted": o.verdict.accepted, "timed": o.verdict.timed, "speedup": o.verdict.speedup,
                "margin": o.verdict.margin, "feedback": o.verdict.feedback(),
                "gates": [{"gate": g.gate, "status": g.status} for g in o.verdict.gates],
                "timing": next((g.details for g in o.verdict.gates if g.gate == "3-performance"), None),
                "compiler": describe_diagnosis(o.verdict.diagnosis, quiet=True) if o.adopted else [],
            } for o in t.outcomes],
        } for t in r.tactics],
    }


def trace_summary(problem) -> dict[str, list[str]]:
    """Per variant, what one traced call of the starting kernel's forward did (on the meta device, in a worker:
    launches recorded, not run), or why it could not be traced."""
    return {v: (t.summary() if isinstance(t, Trace) else [t]) for v, t in traces(problem).items()}
