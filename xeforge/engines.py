"""Engines propose candidates for a stage; only the verifier accepts them.

Owns: the engine registry (``rules``, ``llm``; ``auto`` and ``both`` are resolved by the pipeline; the llm
engine's configuration from the command line, :func:`llm_config`, and its dry-run prompt, :func:`llm_prompt`)
and the rules engine, which walks a stage's deterministic tactics. What an engine returns
(:class:`~stages.base.TacticRecord`, :class:`~stages.base.TrialOutcome`) lives in :mod:`stages.base`. An engine
receives an ``evaluate`` callback that runs a candidate through the verification cascade and the trial store and
returns the verdict, so an engine that learns from feedback (the llm engine's CoVeR loop) can refine. ``dspy`` is imported only by
``cover_agent``, and only when the llm engine is used.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

# The registry is the one module of xeforge that imports the llm engine: engines are chosen by name here
# (make_engine), so the pipeline and the command line reach cover_agent only through this module (its
# configuration from the command line, its prompt for the dry run, its construction). These three imports are
# dspy-free; dspy (the [llm] extra) is imported only when make_llm_engine builds the engine. The layering
# contract in pyproject.toml ([tool.importlinter]) allows this module, and no other under xeforge/, to import
# cover_agent.
from cover_agent import make_llm_engine
from cover_agent.config import LMConfig
from cover_agent.prompts import render_stage_prompt
from stages.base import Candidate, Evaluate, Stage, StageContext, TacticRecord, TrialOutcome, propose_safely
from xeforge.diagnosis.rules import tactic_order
from xeforge.errors import EngineError
from xeforge.kb._base import DTYPE_BYTES, dtype_key
from xeforge.rewrite.tiling.subtile import subtile_stores
from xeforge.rewrite.tiling.configs import fit_stages, staged_smem


class RulesEngine:
    """Deterministic tactics from each stage. Offline, reproducible."""

    name = "rules"

    def run_stage(self, stage: Stage, ctx: StageContext, evaluate: Evaluate, choose: Callable,
                  basis: str | None = None) -> list[TacticRecord]:
        """Each tactic of ``stage`` on ``ctx``'s source; candidates are judged by ``evaluate`` against the incumbent.

        ``basis`` says what ``ctx``'s source is when it is not the incumbent ("trial 0007-...": a correct rewrite
        whose gain was below the noise margin, carried into this stage; or an earlier stage's rewrite of the
        incumbent that a KB pattern names as this stage's basis); its candidates say so.
        """
        records = []
        tactics, first = tactic_order(list(stage.tactics), stage.name, ctx.diagnosis, ctx.lost_at)
        checked = {t.name: t.check(ctx) for t in tactics}  # as the stage starts: how many tactics share its time
        start = ctx.source
        spent = getattr(evaluate, "spent", None)
        left = getattr(evaluate, "left", None)
        port_spent = getattr(evaluate, "port_spent", None)
        for i, tactic in enumerate(tactics):
            app = checked[tactic.name] if ctx.source == start else tactic.check(ctx)  # again after an adoption
            rec = TacticRecord(tactic.name, app.applies, app.reason)
            if tactic.name in first:
                rec.note = f"tried first: {first[tactic.name]}"
            records.append(rec)
            if not app.applies:
                continue
            why = spent() if spent is not None else None
            if why and basis and port_spent is not None and not any(r.outcomes for r in records):
                why = port_spent()  # on top of a carried trial, one candidate is judged while the port has time
            if why:  # the port's --time-budget ran out inside this stage: the tactics left are not run, and say so
                rec.note = "; ".join(filter(None, [rec.note, f"not run: {why}"]))
                continue
            part = _tactic_part(stage.name, left() if left is not None else None,
                                1 + sum(checked[t.name].applies for t in tactics[i + 1:]))
            candidates, failed = propose_safely(tactic, ctx)
            candidates = [prefit(ctx, c) for c in candidates]
            if failed:
                rec.note = "; ".join(filter(None, [rec.note, failed]))
                continue
            if basis:
                basis_note = f"proposed on top of {basis}, not on the incumbent"
                rec.note = "; ".join(filter(None, [rec.note, basis_note]))
                for c in candidates:
                    c.description = f"{c.description} [on top of {basis}]"
            if not candidates:
                rec.note = "; ".join(filter(None, [rec.note, "the tactic applied but produced no candidate"]))
                continue
            prepare = getattr(evaluate, "prepare", None)
            if prepare is not None and len(candidates) > 1:
                prepare(candidates)  # e.g. compile them in parallel on the host before the one-by-one cascade
            rec.outcomes = []
            for k, c in enumerate(candidates):
                # after the first: the port's budget, the stage's share, then this tactic's part of it
                why = None
                if k:
                    why = (spent() if spent is not None else None) or (part() if part is not None else None)
                if why:  # the budget ran out inside this tactic: its first candidates were judged, the rest not
                    rec.note = "; ".join(filter(None, [rec.note, f"{len(candidates) - k} of its {len(candidates)} "
                                                                 f"candidates not run: {why}"]))
                    candidates = candidates[:k]
                    break
                rec.outcomes.append(evaluate(c))
            seen = {c.source for c in candidates}

            over = _bound_after_a_correct_trial(rec, spent, part)
            skipped = 0
            for o in list(rec.outcomes):
                # a failed candidate's refits in order until one is correct: on an H100 (2026-12-07) the halved C
                # store ran 1.4-1.5x faster than fewer stages for each of gemm_tall_k's three split candidates, and
                # judging both spent device_tuning's share of the port's time budget
                for c in refit_candidates(ctx, o):
                    if c.source in seen:
                        continue
                    seen.add(c.source)
                    if over():
                        skipped += 1
                        break
                    rec.outcomes.append(evaluate(c))
                    if rec.outcomes[-1].verdict is not None and rec.outcomes[-1].verdict.correct:
                        break
            more = list({c.source: c for c in tactic.follow_up(ctx, rec.outcomes) if c.source not in seen}.values())
            for c in more:
                if over():
                    skipped += len(more) - more.index(c)
                    break
                rec.outcomes.append(evaluate(c))
            why = over() if skipped else None
            if why:
                rec.note = "; ".join(filter(None, [rec.note, f"{skipped} refit(s) or follow-up(s) not run: {why}"]))
            rec.best = choose(rec.outcomes)
            if rec.best is not None:
                ctx = ctx.with_source(rec.best.candidate.source)
                ctx.diagnosis = rec.best.verdict.diagnosis if rec.best.verdict is not None else None
        return records


def _bound_after_a_correct_trial(rec: TacticRecord, spent: Callable[[], str | None] | None,
                                 part: Callable[[], str | None] | None) -> Callable[[], str | None]:
    """Why no more of ``rec``'s tactic's trials run: once one of them is correct, the port's budget, the stage's
    share and the tactic's part bound its refits and follow-ups as they bound its candidates (on an H100, 2026-12-07,
    gemm_tall_k's three splits and their refits spent device_tuning's share, and per-shape-config, its one tactic
    for M = 16, never ran). None while none is correct: a failed first candidate's refit may be the only way in."""
    def over() -> str | None:
        if not any(o.verdict is not None and o.verdict.correct for o in rec.outcomes or []):
            return None
        return (spent() if spent is not None else None) or (part() if part is not None else None)
    return over


def _tactic_part(stage: str, seconds: float | None, tactics: int) -> Callable[[], str | None] | None:
    """Under a time budget: why this tactic stops between its candidates once it has had its part of what is left
    of the stage's share (``seconds`` over the ``tactics`` that apply from this one on, itself included), so that a
    tactic proposing many candidates (a swizzle with every seed tile) does not leave the ones after it (the
    per-shape configurations a decode-sized shape needs) no time. A tactic that ends early leaves its part to the
    ones after it. None without a budget."""
    if seconds is None:
        return None
    t0, part = time.monotonic(), seconds / max(1, tactics)

    def why() -> str | None:
        took = time.monotonic() - t0
        if took < part:
            return None
        return (f"its part of the {stage} stage's share ({part:.0f} s of the {seconds:.0f} s left for {tactics} "
                f"tactic(s)) was spent after {took:.0f} s; the tactics after it get the rest")
    return why


def prefit(ctx: StageContext, c: Candidate) -> Candidate:
    """``c``, or on CUDA, where its GEMM would not fit shared memory with its C tile staged whole
    (:func:`~xeforge.rewrite.tiling.configs.staged_smem` against the device's per-block limit), the first candidate
    :func:`refit_candidates` would make from the compiler's failure: C stored in two halves, fewer stages only if
    that is still too much. Made before the compile, so the failed one costs no time: in an H100 port (2026-12-07,
    call V of docs/measurements/ports-h100-2026-12-07e) each of three 4-stage tile loops failed gate 0 and its
    halved refit, judged after it, was adopted."""
    limit = getattr(ctx.device, "shared_mem_bytes", None)
    if getattr(ctx.device, "kind", "") != "cuda" or not limit:
        return c
    elem = _elem_bytes(ctx)
    need = staged_smem(c.source, elem)
    if need is None or need[1] <= limit:
        return c
    failure = f"out of resource: shared memory, Required: {need[1]}, Hardware limit: {limit}"
    refits = _refits(c, failure, elem, why=f"by the estimate it needs {need[1]} B,")
    return refits[0] if refits and refits[0].params.get("c_halves") else c


def _elem_bytes(ctx: StageContext) -> int:
    variant = ctx.problem.timing_variant(ctx.device.kind) if ctx.problem is not None else None
    dtype = getattr(variant, "dtype", None)
    return DTYPE_BYTES.get(dtype_key(dtype) if dtype else None, 2)


def refit_candidates(ctx: StageContext, outcome: TrialOutcome) -> list[Candidate]:
    """Candidates for one that failed to compile for shared memory; [] for any other failure.

    The compiler's figure is exact where the knowledge base's estimate is not (a 128x256 tile whose fp32
    epilogue is staged through shared memory needs 128 KB more than its operand stages), so a tile that the
    search rightly wanted is not lost: first with its C tile stored in two halves (``subtile``: the staging tile
    halves; fewer stages only if that is still too much), then with the ``num_stages`` that fits as it is. The engine
    judges them in that order and stops at the first that is correct.
    """
    failed = outcome.verdict.failed_gate if outcome.verdict is not None else None
    if failed is None or failed.gate != "0-isolation":
        return []
    return _refits(outcome.candidate, f"{failed.summary} {failed.details.get('detail', '')}", _elem_bytes(ctx))


def _refits(c: Candidate, failure: str, elem: int, why: str = "the compiler needed") -> list[Candidate]:
    """The refits of ``c`` for a shared-memory ``failure`` (see :func:`refit_candidates`), in the order to judge;
    ``why`` says whose figure it is."""
    out = []
    halved = subtile_stores(c.source)
    if halved is not None and (fitted := fit_stages(halved[0], failure, elem, fixed_scale=0.5, failed_source=c.source)) is not None:
        source, how = fitted
        fewer = (f"; num_stages {how['was']} -> {how['num_stages']}" if how["num_stages"] != how["was"] else "")
        out.append(Candidate(source, c.tactic, f"{c.description}; C stored in two halves ({why} more than the "
                             f"{how['limit']} B of shared memory; the staging tile halves){fewer}", kind=c.kind,
                             params={**c.params, "num_stages": how["num_stages"], "c_halves": True},
                             time_all_shapes=c.time_all_shapes))
    fitted = fit_stages(c.source, failure, elem)
    if fitted is not None:
        source, how = fitted
        out.append(Candidate(source, c.tactic, f"{c.description}; num_stages {how['was']} -> {how['num_stages']} "
                             f"({why} more than the {how['limit']} B of shared memory)", kind=c.kind,
                             params={**c.params, "num_stages": how["num_stages"]}, time_all_shapes=c.time_all_shapes))
    return out


def make_engine(name: str, options: Any) -> Any:
    if name == "rules":
        return RulesEngine()
    if name == "llm":
        return make_llm_engine(options)  # EngineError when no model is configured or dspy is not installed
    raise EngineError("--engine", f"unknown engine {name!r}", "use rules, llm, auto or both")


def llm_config(args: argparse.Namespace) -> LMConfig:
    """The llm engine's configuration from the command line (``--model``, ``--api-base``, ``--max-iters``,
    ``--best-k``) and the ``XEFORGE_*`` variables; ``.configured`` says whether a model is set."""
    return LMConfig.from_args(args)


def llm_prompt(stage: Stage, ctx: StageContext, issues: list, kbc: Any) -> str:
    """The first brief the llm engine would send for ``stage`` (what the dry run prints); no model is called."""
    return render_stage_prompt(stage, ctx, issues, kbc, feedback=[])
