"""The llm engine: a CoVeR loop (generate -> verify -> refine) per stage, behind ``run_stage``.

Owns: :class:`LLMEngine` — the same contract as :class:`xeforge.engines.RulesEngine`:
``run_stage(stage, ctx, evaluate, choose) -> [TacticRecord]``. For one stage:

1. Detect the stage's issues; render the brief (:mod:`cover_agent.prompts`).
2. Analysis (unless ``XEFORGE_LLM_ANALYZE=0``): one call plans the stage; when the model finds nothing worth
   trying and the stage's detectors found nothing either, the stage is skipped with the model's reason.
3. ``--best-k`` independent candidates, each one run of the :class:`~cover_agent.module.CoVeR` module
   (a ``dspy.Module``; its predictors make every call, the analysis too), refined for up to ``--max-iters`` rounds:
   propose (:mod:`cover_agent.client`) -> extract leniently, validate strictly (:mod:`cover_agent.extract`;
   a failed validation is feedback, never a silent repair) -> ``evaluate`` (the real verifier and trial store)
   -> feedback (:mod:`cover_agent.feedback`) -> the next round's brief, with the oldest attempts trimmed
   first when the context is short (the best is kept). A candidate stops once accepted (or, on a device that
   times nothing, once correct).
4. ``choose`` adopts the best verified outcome; nothing else does.

Every call's messages, answer, token counts and cost go to ``<run>/trials/<trial>/llm.json`` (answers that
reached the verifier) or ``<run>/llm/<NN-stage>/`` (analysis, and answers that produced no candidate);
``<run>/llm/usage.json`` holds the run's totals. Honest failure: a server that does not answer the probe
(:mod:`cover_agent.probe`, when the engine is built, before the baseline) or a model that fails its first call
raises :class:`~xeforge.errors.EngineError`; a later failure or a spent budget stops the stage with a note in the
:class:`~stages.base.TacticRecord`, whose ``tally`` counts what became of every answer and call (no code,
invalid, duplicate, rejected at gate N, timed out, stopped by the budget) for the run's summary. The model reads
"ACCEPTED" only when the verifier accepted.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cover_agent.client import BudgetExhausted, CallResult, ContextOverflow, LMClient, ModelUnavailable, Usage
from cover_agent.config import LMConfig
from cover_agent.extract import extract_code, normalise_code, validate_code
from cover_agent.feedback import Attempt, verdict_feedback
from cover_agent.module import Check, CoVeR
from cover_agent.prompts import RenderedPrompt, budget_chars_for, render_stage
from cover_agent.probe import ProbeFailure, probe
from cover_agent.signatures import SIGNATURES
from stages.base import Candidate, TacticRecord
from xeforge.errors import EngineError
from xeforge.store import write_json

TACTIC = "llm"


@dataclass
class KBView:
    """What the prompts need of the knowledge base, rebuilt from a StageContext."""

    kb: Any
    device_id: str | None
    triton: Any
    entry: Any
    note: str = ""


def kb_view(ctx: Any) -> KBView:
    kb, device_id = ctx.kb, ctx.device_id
    entry = None
    if kb is not None and device_id:
        entry = getattr(kb, "devices", {}).get(device_id)
    note = "" if kb is not None else "no knowledge base was loaded for this run"
    if kb is not None and not device_id:
        note = f"no knowledge-base device entry matches {ctx.device.name!r}"
    return KBView(kb, device_id, ctx.triton, entry, note)


class _StopStage(Exception):
    """Ends the stage's loop; ``note`` says why (budget, model failure), ``cause`` in one word for the tally."""

    def __init__(self, note: str, cause: str = "error") -> None:
        self.note = note
        self.cause = cause
        super().__init__(note)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class LLMEngine:
    """Proposes with a model, learns from the verifier's verdicts; only ``choose`` adopts."""

    name = "llm"

    def __init__(self, config: LMConfig, client: LMClient, progress: Callable[[str], None] = _say) -> None:
        self.config = config
        self.client = client
        self.say = progress
        self.module = CoVeR(rounds=config.max_iters)  # its predictors make every call (cover_agent.module)

    @classmethod
    def from_options(cls, options: Any, progress: Callable[[str], None] = _say) -> "LLMEngine":
        cfg = getattr(options, "llm", None)
        if cfg is None or not getattr(cfg, "configured", False):
            raise EngineError("--engine llm", "no LLM is configured",
                              "set XEFORGE_MODEL (a LiteLLM model string) or pass --model; see docs/llm.md")
        missing = cfg.missing_key()
        if missing:
            raise EngineError(f"model {cfg.model}", f"no API key: {missing} is not set",
                              f"export {missing}=<key>, or point --api-base at a local OpenAI-compatible server "
                              "(see docs/llm.md)")
        try:
            client = LMClient(cfg, progress=progress)
        except (ValueError, TypeError) as exc:
            raise EngineError(f"model {cfg.model}", f"DSPy refused these model settings: {exc}",
                              "check the model string and the XEFORGE_LLM_* settings (docs/llm.md)") from None
        engine = cls(cfg, client, progress)
        engine.check_server()
        return engine

    def check_server(self) -> None:
        """The probe (:mod:`cover_agent.probe`): a setup error is an EngineError naming the URL and the fix."""
        cfg = self.config
        try:
            found = probe(cfg)
        except ProbeFailure as exc:
            raise EngineError(f"llm engine (model {cfg.model}, {exc.url})", exc.what, exc.fix) from None
        if found is None:
            return
        served = f"; it serves {len(found.models)} model(s)" if found.models else ""
        self.say(f"  llm: the server at {cfg.api_base} answers {cfg.route_text()}{served}")
        if found.note:
            self.say(f"  llm: note: {found.note}")

    # ------------------------------------------------------------------------------------------------ stage
    def run_stage(self, stage: Any, ctx: Any, evaluate: Callable, choose: Callable) -> list[TacticRecord]:
        cfg = self.config
        kbc = kb_view(ctx)
        issues = stage.detect(ctx)
        budget = budget_chars_for(cfg.context_tokens, cfg.max_tokens)
        kind = render_stage(stage, ctx, issues, kbc, []).signature
        rec = TacticRecord(TACTIC, True, f"{cfg.model}: {kind} signature, up to {cfg.best_k} candidate(s) x "
                           f"{cfg.max_iters} round(s)", engine="llm")
        before = Usage(**self.client.usage.as_dict())
        log_dir = Path(ctx.run_dir) / "llm" / f"{stage.order:02d}-{stage.name}" if ctx.run_dir else None
        notes: list[str] = []
        outcomes: list[Any] = []
        self._tally = rec.tally
        try:
            plan = self._analysis(stage, ctx, issues, kbc, budget, log_dir, rec)
            if not rec.applies:
                return [rec]
            self._candidates(stage, ctx, issues, kbc, budget, log_dir, plan, evaluate, outcomes, notes)
        except _StopStage as stop:
            notes.append(stop.note)
            _count(rec.tally, f"stopped: {stop.cause}")
            self.say(f"  llm: {stop.note}")
        finally:
            rec.outcomes = outcomes
            spent = _delta(before, self.client.usage)
            notes.append(f"model use in this stage: {spent}")
            rec.note = "; ".join(notes)
            self._write_usage(ctx)
        rec.best = choose(outcomes) if outcomes else None
        return [rec]

    # ------------------------------------------------------------------------------------------------ analysis
    def _analysis(self, stage, ctx, issues, kbc, budget, log_dir, rec) -> str | None:
        if not self.config.analyze:
            return None
        rendered = render_stage(stage, ctx, issues, kbc, [], purpose="analysis", budget_chars=budget)
        self.say(f"  llm: analysing {stage.name} with {self.config.model} (~{rendered.approx_tokens:,} tokens)")
        try:
            result = self._call("analysis", rendered, f"{stage.name} analysis", log_dir, "analysis")
        except ContextOverflow as exc:
            self.say(f"  llm: the analysis brief does not fit the model's context ({exc}); proposing without a plan")
            return None
        fields = result.fields
        record = {"stage": stage.name, "purpose": "analysis", "model": self.config.model,
                  "prompt": _prompt_meta(rendered), "calls": [r.as_dict() for r in result.records],
                  "parse_error": result.parse_error, "fields": fields}
        _write(log_dir, "analysis.json", record)
        if fields is None:
            self.say("  llm: the analysis answer did not follow the format; proposing without a plan")
            return None
        worth = fields.get("worth_trying")
        worth = worth if isinstance(worth, bool) else str(worth).strip().lower() not in {"false", "no", "0"}
        reason = str(fields.get("reason") or "").strip()
        bottlenecks = fields.get("bottlenecks") or []
        if isinstance(bottlenecks, str):
            bottlenecks = [bottlenecks]
        plan = ""
        if bottlenecks:
            plan += "Bottlenecks:\n" + "\n".join(f"- {b}" for b in bottlenecks) + "\n"
        if fields.get("plan"):
            plan += "Plan:\n" + str(fields["plan"]).strip() + "\n"
        if not worth and not issues:
            rec.applies = False
            rec.reason = f"the model's analysis found nothing this stage can improve: {reason or 'no reason given'}"
            self.say(f"  llm: {rec.reason}")
        return plan or None

    # ------------------------------------------------------------------------------------------------ CoVeR
    def _candidates(self, stage, ctx, issues, kbc, budget, log_dir, plan, evaluate, outcomes, notes) -> None:
        """``--best-k`` chains, each one run of the :class:`~cover_agent.module.CoVeR` module: its predictor asks
        through the client (``ask``), each answer is verified here (``verify``), the next brief is the stage
        template rendered with the attempts so far (``revise``)."""
        cfg = self.config
        seen: dict[str, Attempt] = {}
        for chain in range(1, cfg.best_k + 1):
            attempts: list[Attempt] = []

            def render(shrink: int = 1, attempts=attempts) -> RenderedPrompt:
                return render_stage(stage, ctx, issues, kbc, attempts, plan=plan, budget_chars=budget // shrink)

            state = {"rendered": render()}

            def revise(_brief: str, _rounds: list, state=state, render=render) -> str:
                state["rendered"] = render()
                return state["rendered"].text

            def ask(predictor, _text: str, chain=chain, attempts=attempts, state=state, render=render):
                rnd = len(attempts) + 1
                state["label"] = f"candidate {chain} round {rnd}"
                state["rendered"], result = self._ask(stage, state["rendered"], render, predictor, state["label"],
                                                      log_dir, f"c{chain}-r{rnd}")
                return result

            def verify(result, _problem=None, chain=chain, attempts=attempts, state=state) -> Check:
                attempt, outcome = self._attempt(stage, ctx, state["rendered"], result, chain, len(attempts) + 1,
                                                 seen, evaluate, log_dir)
                attempts.append(attempt)
                _count(self._tally, f"rejected: {attempt.failed_gate}" if attempt.status == "rejected"
                       and attempt.failed_gate else attempt.status)
                self.say(f"  llm: {state['label']}: {attempt.headline}")
                if outcome is not None:
                    outcomes.append(outcome)
                return Check(attempt.feedback, attempt.score, done=attempt.status in ("accepted", "correct-unmeasured"))

            self.module(brief=state["rendered"].text, kind=state["rendered"].signature, verify=verify,
                        rounds=cfg.max_iters, ask=ask, revise=revise)
            if not ctx.device.can_time and any(a.status == "correct-unmeasured" for a in seen.values()):
                if chain < cfg.best_k:
                    notes.append(f"stopped after candidate {chain}: a correct candidate was found and further ones "
                                 "cannot be ranked on a device that times nothing")
                break
        if not outcomes:
            notes.append("no answer produced a kernel that reached the verifier")

    def _ask(self, stage, first: RenderedPrompt, render: Callable[[int], RenderedPrompt], predictor, label, log_dir,
             tag):
        """Call with the brief ``first``; on a context overflow, trim harder (twice) before giving up on the stage."""
        rendered, previous = first, None
        for shrink in (1, 2, 4):
            if shrink > 1:
                rendered = render(shrink)
            if previous is not None and rendered.text == previous:
                break
            previous = rendered.text
            self.say(f"  llm: {label}: asking {self.config.model} (~{rendered.approx_tokens:,} tokens"
                     + (f"; trimmed: {'; '.join(rendered.trimmed)}" if rendered.trimmed else "") + ")")
            try:
                return rendered, self._call(rendered.signature, rendered, f"{stage.name} {label}", log_dir, tag,
                                            predictor)
            except ContextOverflow as exc:
                self.say(f"  llm: {label}: the prompt does not fit the model's context ({exc}); trimming")
        raise _StopStage(f"stopped: the brief (~{rendered.approx_tokens:,} tokens) does not fit the model's context "
                         "window even with earlier attempts trimmed: set XEFORGE_LLM_CONTEXT_TOKENS to the model's real "
                         "window, or use a model with a larger one", "context")

    def _call(self, kind: str, rendered: RenderedPrompt, purpose: str, log_dir: Path | None, tag: str,
              predictor: Any = None) -> CallResult:
        try:
            result = self.client.call(kind, rendered.text, purpose, predictor or self.module.predictor(kind))
            self._count_failed_calls(result.records)
            return result
        except BudgetExhausted as exc:
            self._count_failed_calls(getattr(exc, "records", []))
            _write(log_dir, f"{tag}-budget.json", {"purpose": purpose, "stopped": str(exc),
                                                    "calls": [r.as_dict() for r in getattr(exc, "records", [])]})
            raise _StopStage(f"stopped: {exc}", "budget") from None
        except ContextOverflow as exc:
            self._count_failed_calls(getattr(exc, "records", []))
            _write(log_dir, f"{tag}-overflow.json", {"purpose": purpose, "error": str(exc), "prompt": _prompt_meta(rendered),
                                                      "calls": [r.as_dict() for r in getattr(exc, "records", [])]})
            raise
        except ModelUnavailable as exc:
            self._count_failed_calls(getattr(exc, "records", []))
            _write(log_dir, f"{tag}-failed.json", {"purpose": purpose, "error": str(exc), "model": self.config.model,
                                                    "calls": [r.as_dict() for r in getattr(exc, "records", [])]})
            if not self.client.answered:
                raise EngineError(f"llm engine (model {self.config.model})",
                                  f"the model did not answer its first call ({exc.kind}): {exc.message}",
                                  self._fix_for(exc.kind)) from None
            raise _StopStage(f"stopped: the model stopped answering ({exc.kind}): {exc.message}", exc.kind) from None

    def _count_failed_calls(self, records: list[Any]) -> None:
        for r in records:
            if r.error_kind:
                _count(getattr(self, "_tally", {}), f"call {r.error_kind}")

    def _fix_for(self, kind: str) -> str:
        cfg = self.config
        where = cfg.api_base or "the provider's endpoint"
        return {
            "transport": f"check that the server at {where} is running and reachable (for an OpenAI-compatible "
                         "server: curl <base>/models); see docs/llm.md",
            "timeout": f"the model gave no answer within {cfg.timeout_s:g} s (XEFORGE_LLM_TIMEOUT, per call; the "
                       "client's start-up is not counted): check the server, or raise XEFORGE_LLM_TIMEOUT for a slow "
                       "local model",
            "auth": f"check the API key ({'from ' + cfg.key_source if cfg.key_source else 'none was found'})",
            "billing": "check the provider account's credit and quota",
            "rate-limit": "the provider kept rate-limiting through DSPy's retries: wait, or raise XEFORGE_LLM_RETRIES",
            "model": "check the model name (--model / XEFORGE_MODEL) against what the server serves",
            "not-found": f"check that the base URL ends with /v1 ({where}) and that the model name is one the server "
                         "serves (curl <base>/models); see docs/llm.md",
            "request": "check the model string and XEFORGE_LLM_* settings against the provider (docs/llm.md)",
        }.get(kind, "see the message; docs/llm.md lists the settings; --engine rules runs without a model")

    def _attempt(self, stage, ctx, rendered, result, chain, rnd, seen, evaluate, log_dir):
        """One answer -> an Attempt (and the verifier's outcome when it got that far)."""
        desc_field = SIGNATURES[rendered.signature][1]
        fields = result.fields or {}
        summary = str(fields.get(desc_field) or "").strip()
        ext = extract_code(fields.get("kernel_code") if result.fields else None, result.raw)
        record: dict[str, Any] = {"engine": "llm", "model": self.config.model, "stage": stage.name,
                                  "signature": rendered.signature, "candidate": chain, "round": rnd,
                                  "prompt": _prompt_meta(rendered), "calls": [r.as_dict() for r in result.records],
                                  "parse_error": result.parse_error, "extraction": ext.how, "summary": summary}
        tag = f"c{chain}-r{rnd}.json"
        if ext.code is None:
            text = ext.problem
            if result.parse_error:
                text = f"{result.parse_error}; {text}"
            if result.truncated:
                text += (f" The answer was cut off at the output token limit ({self.config.max_tokens} tokens, "
                         "XEFORGE_LLM_MAX_TOKENS): return a shorter file.")
            attempt = Attempt(chain, rnd, "no-code", "NO KERNEL in the answer (not verified)", text, summary=summary)
            _write(log_dir, tag, {**record, "status": attempt.status, "feedback": text})
            return attempt, None
        problems = validate_code(ext.code, ctx.source)
        if problems:
            text = "The code was not sent to the verifier:\n" + "\n".join(f"- {p}" for p in problems)
            attempt = Attempt(chain, rnd, "invalid", "INVALID kernel file (not verified)", text, code=ext.code,
                              summary=summary)
            _write(log_dir, tag, {**record, "status": attempt.status, "validation": problems, "feedback": text,
                                  "code": ext.code})
            return attempt, None
        key = normalise_code(ext.code)
        if key in seen:
            prev = seen[key]
            text = f"Identical to {prev.label}, which was verified already: {prev.headline}\n{prev.feedback}"
            attempt = Attempt(chain, rnd, "duplicate", f"DUPLICATE of {prev.label} (not verified again)", text,
                              summary=summary)
            _write(log_dir, tag, {**record, "status": attempt.status, "feedback": text, "duplicate_of": prev.trial})
            return attempt, None
        first_line = summary.splitlines()[0][:160] if summary else "no description given"
        cand = Candidate(ext.code, TACTIC, f"llm {rendered.signature} (candidate {chain}, round {rnd}): {first_line}",
                         kind="rewrite", params={"candidate": chain, "round": rnd, "signature": rendered.signature,
                                                 "model": self.config.model})
        outcome = evaluate(cand)
        verdict = outcome.verdict
        status, headline, text = verdict_feedback(verdict, ctx.device.can_time)
        failed = verdict.failed_gate
        attempt = Attempt(chain, rnd, status, headline, text, code=ext.code, summary=summary, trial=outcome.trial,
                          speedup=verdict.speedup, failed_gate=failed.gate if failed is not None else None)
        seen[key] = attempt
        if ctx.run_dir:
            write_json(Path(ctx.run_dir) / "trials" / outcome.trial / "llm.json",
                       {**record, "trial": outcome.trial, "status": status, "headline": headline, "feedback": text,
                        "replayed": outcome.replayed})
        return attempt, outcome

    def _write_usage(self, ctx: Any) -> None:
        if ctx.run_dir:
            write_json(Path(ctx.run_dir) / "llm" / "usage.json",
                       {"usage": self.client.usage.as_dict(), "summary": self.client.usage.describe(),
                        "config": self.config.public_dict()})


def _count(tally: dict[str, int], key: str) -> None:
    tally[key] = tally.get(key, 0) + 1


def _prompt_meta(rendered: RenderedPrompt) -> dict[str, Any]:
    return {"chars": len(rendered.text), "approx_tokens": rendered.approx_tokens, "trimmed": rendered.trimmed,
            "attempts_shown": rendered.shown_attempts, "kb_entries": rendered.kb_ids}


def _write(folder: Path | None, name: str, data: dict[str, Any]) -> None:
    if folder is not None:
        write_json(folder / name, data)


def _delta(before: Usage, after: Usage) -> str:
    d = Usage(calls=after.calls - before.calls, answered=after.answered - before.answered,
              failed=after.failed - before.failed,
              total_tokens=after.total_tokens - before.total_tokens, tokens_estimated=after.tokens_estimated,
              cost_usd=after.cost_usd - before.cost_usd, cost_known=after.cost_known)
    return d.describe()
