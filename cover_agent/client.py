"""One call to the model: build the ``dspy.LM``, run one predictor, count, record.

Owns: :func:`build_lm` (a ``dspy.LM`` from an :class:`~cover_agent.config.LMConfig`: LiteLLM model string,
base URL, key, temperature, output tokens, timeout, retries, and the one route every call takes —
``engine="lm15"``, DSPy's own HTTP client, or ``engine="litellm"``, chosen by ``LMConfig.client_route`` and
shown by ``xeforge env``; DSPy's cache off, because every answer must be fresh), :class:`LMClient` (the client
started before its first call — LiteLLM's import is seconds —, the per-run budget in calls, tokens and dollars,
and a :class:`CallRecord` per call with the messages sent, the answer, token counts and cost), :func:`classify`
(one meaning per failure on either route: a read timeout is a timeout however the route spells it; a
context-length 400 is an overflow in vLLM's, OpenAI's or llama.cpp's words), and the failures the engine reacts
to: :class:`ModelUnavailable`, :class:`BudgetExhausted`, :class:`ContextOverflow`.

What the libraries do (none of it is written here):

- **Retries and backoff**: ``dspy.LM(num_retries=XEFORGE_LLM_RETRIES)``. DSPy owns the retry loop on both
  routes (its engines, LiteLLM's included, make one attempt each): rate limits, timeouts, server and network
  errors are retried, after the server's ``Retry-After`` when it sends one, else 1, 2, 4 ... 60 s.
- **Timeout**: the HTTP client's own (``dspy.LM(timeout=XEFORGE_LLM_TIMEOUT)``): a call that overruns it is
  closed, so the server sees the request cancelled.
- **Usage**: ``dspy.track_usage()`` totals each call's tokens (answered, unparseable or failed); the call's
  messages, answer, finish reason and cost are read from the LM's own ``history`` entry.

What stays here, and why: DSPy reports neither its attempts nor the errors it retried, so a record is one per
call (its final outcome) and the call budget counts calls, each of which may send up to
``1 + XEFORGE_LLM_RETRIES`` requests; DSPy's own client reports a read timeout as a transport error and keeps
a vLLM context-length message only in the error text, so :func:`classify` reads the exception chain and the
message to give each failure one meaning on both routes; and an answer that does not follow the signature's
field format is not a failure here: it comes back with ``parse_error`` set and its raw text, for lenient
extraction.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

# LiteLLM fetches a model price list from the network when first imported; use its bundled copy instead.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
from dspy.utils.exceptions import (AdapterParseError, ContextWindowExceededError, LMAuthError,  # noqa: E402
                                   LMBillingError, LMError, LMRateLimitError, LMServerError, LMTimeoutError,
                                   LMTransportError, LMUnexpectedError, LMUnsupportedModelError)

from cover_agent.config import LMConfig  # noqa: E402
from cover_agent.prompts import CHARS_PER_TOKEN  # noqa: E402
from cover_agent.signatures import SIGNATURES  # noqa: E402



class ModelUnavailable(Exception):
    """The model did not answer (after retries): unreachable, refused, timed out, or failed."""

    def __init__(self, kind: str, message: str) -> None:
        # transport | timeout | rate-limit | server | auth | billing | model | not-found | request | unexpected
        self.kind = kind
        self.message = message
        super().__init__(f"{kind}: {message}")


class BudgetExhausted(Exception):
    """The run's budget of calls, tokens or dollars is spent."""


class ContextOverflow(Exception):
    """The provider says the prompt does not fit the model's context window."""


@dataclass
class CallRecord:
    """One call (with DSPy's retries inside it), as written to the run folder (never the key)."""

    purpose: str
    signature: str
    started: str
    elapsed_s: float
    messages: list[dict[str, Any]] = field(default_factory=list)
    response: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    tokens_estimated: bool = False
    cost_usd: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    error_kind: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CallResult:
    fields: dict[str, Any] | None  # the signature's output fields; None when the answer could not be parsed
    raw: str  # the answer's text
    parse_error: str | None
    records: list[CallRecord]

    @property
    def truncated(self) -> bool:
        return any(r.finish_reason in ("length", "max_tokens") for r in self.records)


@dataclass
class Usage:
    calls: int = 0
    answered: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    tokens_estimated: bool = False
    cost_usd: float = 0.0
    cost_known: bool = False

    def add(self, rec: CallRecord) -> None:
        self.prompt_tokens += rec.prompt_tokens
        self.completion_tokens += rec.completion_tokens
        self.total_tokens += rec.total_tokens
        self.tokens_estimated |= rec.tokens_estimated
        if rec.cost_usd is not None:
            self.cost_usd += rec.cost_usd
            self.cost_known = True

    def describe(self) -> str:
        tokens = f"{self.total_tokens:,} tokens" + (" (some estimated)" if self.tokens_estimated else "")
        cost = f", ${self.cost_usd:.4f}" if self.cost_known else ""
        return f"{self.calls} call(s) ({self.answered} answered, {self.failed} failed), {tokens}{cost}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_lm(config: LMConfig) -> Any:
    """The ``dspy.LM`` for a configuration (or the injected one). Raises ValueError/TypeError from DSPy for
    settings it refuses (the engine turns them into an EngineError)."""
    if config.lm is not None:
        # an injected dspy.LM (a scripted engine) retries as configured too; another BaseLM is taken as it is
        return config.lm.copy(num_retries=config.retries) if isinstance(config.lm, dspy.LM) else config.lm
    kwargs: dict[str, Any] = {"temperature": config.temperature, "max_tokens": config.max_tokens, "cache": False,
                              "num_retries": config.retries, "timeout": config.timeout_s}
    if config.api_base:
        kwargs["api_base"] = config.api_base
    key = config.key_for_client()
    if key:
        kwargs["api_key"] = key
    engine = {"dspy": "lm15", "litellm": "litellm"}[config.client_route]
    return dspy.LM(config.model, engine=engine, **kwargs)


#: how providers say "the prompt does not fit": vLLM and OpenAI ("maximum context length"), llama.cpp ("exceeds
#: the available context size", exceed_context_size_error), Anthropic ("prompt is too long"), others
_OVERFLOW = re.compile(r"maximum context length|context[ _-]length|context window|exceeds? the available context"
                       r"|exceed_context_size|prompt is too long|input is too long|too many input tokens"
                       r"|reduce the length of the (?:messages|prompt|input)", re.IGNORECASE)


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in out:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _timed_out(exc: BaseException) -> bool:
    """A read or write timeout anywhere below ``exc`` (DSPy's own client reports one as a transport error);
    a connection that could not be opened in time is a transport failure, not this."""
    chain = _chain(exc)
    if any(type(e).__name__ in ("ConnectError", "ConnectTimeout") for e in chain):
        return False
    return isinstance(exc, LMTimeoutError) or any(isinstance(e, TimeoutError) for e in chain[1:])


def _overflowed(exc: BaseException) -> bool:
    if isinstance(exc, ContextWindowExceededError):
        return True
    status = getattr(exc, "status", None)
    return (isinstance(exc, LMError) and not isinstance(exc, (LMServerError, LMTransportError, LMRateLimitError))
            and status in (None, 400, 413, 422) and bool(_OVERFLOW.search(str(exc))))


def classify(exc: BaseException) -> str:
    """The failure's meaning, the same on every route."""
    if _timed_out(exc):
        return "timeout"
    if _overflowed(exc):
        return "context"
    for cls, kind in ((LMRateLimitError, "rate-limit"), (LMServerError, "server"), (LMTransportError, "transport"),
                      (LMAuthError, "auth"), (LMBillingError, "billing"), (LMUnsupportedModelError, "model")):
        if isinstance(exc, cls):
            return kind
    if isinstance(exc, LMError) and getattr(exc, "status", None) == 404:
        return "not-found"
    if isinstance(exc, LMUnexpectedError) or not isinstance(exc, LMError):
        return "unexpected"
    return "request"


def _message(exc: BaseException, config: LMConfig) -> str:
    """The failure in words a user can act on: a timeout names its setting; an error without a message says
    the HTTP status and the URL."""
    kind = classify(exc)
    if kind == "timeout":
        return (f"{type(exc).__name__}: no answer within {config.timeout_s:g} s (the per-call timeout, "
                "XEFORGE_LLM_TIMEOUT); the request was cancelled")
    text = str(exc).strip().split("\n\n  To fix:")[0]
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)  # DSPy's "[model]" prefix: the model is named by the caller
    status = getattr(exc, "status", None)
    if not text and status:
        text = f"HTTP {status} with no error message"
    if status == 404:
        where = config.api_base or "the provider's endpoint"
        text = f"{text} (HTTP 404 from {where}: no such path or model)" if "404" not in text else f"{text} (at {where})"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, dict):
        return str(output.get("text") or output.get("content") or "")
    return str(output)


def _finish_reason(response: Any) -> str | None:
    reason = getattr(response, "finish_reason", None)
    if reason is None:
        choices = getattr(response, "choices", None)
        if choices:
            reason = getattr(choices[0], "finish_reason", None)
    return str(reason) if reason is not None else None


def _tokens(rec: CallRecord, tracker: Any) -> None:
    """The call's tokens, from DSPy's usage tracker (:func:`dspy.track_usage`, every model the call used)."""
    for usage in tracker.get_total_tokens().values():
        rec.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        rec.completion_tokens += int(usage.get("completion_tokens") or 0)
        rec.total_tokens += int(usage.get("total_tokens") or 0)
    rec.total_tokens = rec.total_tokens or rec.prompt_tokens + rec.completion_tokens


class LMClient:
    """Calls the model for the llm engine; one per run, so the budget is per run."""

    def __init__(self, config: LMConfig, *, progress: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.lm = build_lm(config)
        self.adapter = dspy.ChatAdapter(use_json_adapter_fallback=False)
        self.usage = Usage()
        self.say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.startup_s = self._start()

    def _start(self) -> float:
        """Start the client now, so no call's time (or timeout) includes it: LiteLLM's import takes seconds."""
        t0 = time.monotonic()
        if self.config.client_route == "litellm":
            # lazy: litellm (seconds to import) only on its own route, now rather than inside the first timed call
            import litellm  # noqa: F401
        return time.monotonic() - t0

    @property
    def answered(self) -> bool:
        """The model has answered at least once in this run."""
        return self.usage.answered > 0

    def budget_problem(self) -> str | None:
        """Why no further call may be made, or None."""
        c, u = self.config, self.usage
        if u.calls >= c.max_calls:
            return f"the budget of {c.max_calls} model calls per run is spent (XEFORGE_LLM_MAX_CALLS)"
        if c.max_total_tokens and u.total_tokens >= c.max_total_tokens:
            return (f"the budget of {c.max_total_tokens:,} tokens per run is spent ({u.total_tokens:,} used; "
                    "XEFORGE_LLM_MAX_TOTAL_TOKENS)")
        if c.max_cost_usd and u.cost_known and u.cost_usd >= c.max_cost_usd:
            return f"the budget of ${c.max_cost_usd:g} per run is spent (${u.cost_usd:.4f} used; XEFORGE_LLM_MAX_COST)"
        return None

    def call(self, kind: str, brief: str, purpose: str, predictor: Any = None) -> CallResult:
        """Run signature ``kind`` on ``brief`` through ``predictor`` (one of :class:`cover_agent.module.CoVeR`'s;
        a plain ``dspy.Predict`` of the signature when None). DSPy retries transient failures
        (``XEFORGE_LLM_RETRIES``). Raises :class:`BudgetExhausted`, :class:`ContextOverflow` or
        :class:`ModelUnavailable`; the call's record is in the result (or the exception's ``records``)."""
        signature = SIGNATURES[kind][0]
        predictor = predictor if predictor is not None else dspy.Predict(signature)
        problem = self.budget_problem()
        if problem:
            exc = BudgetExhausted(problem)
            exc.records = []  # type: ignore[attr-defined]
            raise exc
        lm = self.lm.copy()  # its own history: the entry read below is this call's
        self.usage.calls += 1
        started = time.strftime("%Y-%m-%dT%H:%M:%S")
        t0 = time.monotonic()
        with dspy.track_usage() as tracker:
            try:
                with dspy.context(lm=lm, adapter=self.adapter):
                    pred = predictor(brief=brief)
            except AdapterParseError as exc:
                rec = self._record(lm, tracker, purpose, kind, started, time.monotonic() - t0, brief,
                                   fallback_response=exc.lm_response)
                self.usage.answered += 1
                expected = ", ".join(signature.output_fields)
                return CallResult(None, _text(exc.lm_response), f"the answer did not follow the field format "
                                  f"(expected [[ ## field ## ]] sections for: {expected})", [rec])
            except Exception as exc:  # DSPy retried what was worth retrying; classified: overflow, or the reason
                kind_of = classify(exc)
                rec = CallRecord(purpose, kind, started, round(time.monotonic() - t0, 3),
                                 messages=[{"role": "user", "content": brief}], error=_message(exc, self.config),
                                 error_kind=kind_of)
                _tokens(rec, tracker)
                self.usage.add(rec)
                self.usage.failed += 1
                err: Exception = ContextOverflow(rec.error) if kind_of == "context" else ModelUnavailable(
                    kind_of, rec.error or kind_of)
                err.records = [rec]  # type: ignore[attr-defined]
                raise err from None
        rec = self._record(lm, tracker, purpose, kind, started, time.monotonic() - t0, brief)
        self.usage.answered += 1
        return CallResult({k: pred.get(k) for k in signature.output_fields}, rec.response or "", None, [rec])

    def _record(self, lm: Any, tracker: Any, purpose: str, kind: str, started: str, elapsed: float, brief: str,
                fallback_response: Any = None) -> CallRecord:
        history = list(getattr(lm, "history", []) or [])
        rec = CallRecord(purpose, kind, started, round(elapsed, 3))
        if history:
            entry = history[-1]
            rec.messages = [dict(m) for m in (entry.get("messages") or [])]
            outputs = entry.get("outputs") or []
            rec.response = _text(outputs[0]) if outputs else None
            cost = entry.get("cost")
            rec.cost_usd = float(cost) if isinstance(cost, (int, float)) else None
            rec.finish_reason = _finish_reason(entry.get("response"))
        if rec.response is None and fallback_response is not None:
            rec.response = _text(fallback_response)
        if not rec.messages:
            rec.messages = [{"role": "user", "content": brief}]
        _tokens(rec, tracker)
        if rec.total_tokens == 0:  # the server reported no usage (some local servers): estimate, and say so
            sent = sum(len(str(m.get("content", ""))) for m in rec.messages)
            rec.prompt_tokens = int(sent / CHARS_PER_TOKEN) + 1
            rec.completion_tokens = int(len(rec.response or "") / CHARS_PER_TOKEN) + 1
            rec.total_tokens = rec.prompt_tokens + rec.completion_tokens
            rec.tokens_estimated = True
        self.usage.add(rec)
        return rec
