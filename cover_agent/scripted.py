"""A scripted model for tests and demos without a network: a DSPy engine that answers from a list.

Owns: :class:`ScriptedModel` (implements DSPy 3.4's engine contract, ``complete(Request) -> Response``, so it
runs behind a real ``dspy.LM`` and the real adapter), :func:`answer` (an answer in the field format DSPy's
chat adapter reads), :class:`Sleep` (answer late; a timeout is the HTTP client's, so timeouts are tested
against a real server: tests/test_cover_loop.py) and the record of every request it received
(``requests``: the system and user text), so a test can assert what reached the model.

Script items: a ``str`` (returned verbatim), a ``dict`` (fields, formatted by :func:`answer`), an exception
instance (raised — use ``dspy.lm15`` errors such as ``TransportError`` or ``RateLimitError`` for provider
failures), a :class:`Sleep`, or a callable taking the user text and returning one of these.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import dspy
from dspy import lm15

#: the analysis answer used when a script gives none: go ahead
GO_AHEAD = {"bottlenecks": ["(scripted)"], "plan": "follow the stage's checklist", "worth_trying": True,
            "reason": "scripted analysis"}


def answer(**values: Any) -> str:
    """``answer(changes="...", kernel_code="```python ...```")`` -> the text DSPy's ChatAdapter parses."""
    parts = []
    for name, value in values.items():
        text = value if isinstance(value, str) else json.dumps(value)
        parts.append(f"[[ ## {name} ## ]]\n{text}")
    return "\n\n".join(parts) + "\n\n[[ ## completed ## ]]"


def kernel_answer(code: str, changes: str = "scripted change", field_name: str = "changes") -> str:
    """An optimization answer carrying ``code`` in a fenced block."""
    return answer(**{field_name: changes, "kernel_code": f"```python\n{code.rstrip()}\n```"})


@dataclass
class Sleep:
    seconds: float
    then: Any = "late answer"


@dataclass
class ScriptedRequest:
    kind: str  # analysis | proposal
    system: str
    user: str


@dataclass
class ScriptedModel:
    proposals: list[Any]
    analysis: Any = field(default_factory=lambda: dict(GO_AHEAD))
    requests: list[ScriptedRequest] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -------------------------------------------------------------------------------------------- dspy engine
    def complete(self, request: Any) -> Any:
        system = request.system if isinstance(request.system, str) else "".join(
            getattr(p, "text", "") for p in (request.system or ()))
        user = "\n".join(m.text or "" for m in request.messages)
        kind = "analysis" if "`worth_trying`" in (system or "") else "proposal"
        with self._lock:
            self.requests.append(ScriptedRequest(kind, system or "", user))
            if kind == "analysis":
                item = self.analysis.pop(0) if isinstance(self.analysis, list) else self.analysis
            elif self.proposals:
                item = self.proposals.pop(0)
            else:
                item = "(the script has no more answers)"
        text = self._resolve(item, user)
        usage = lm15.Usage(input_tokens=len(system or "") // 4 + len(user) // 4, output_tokens=len(text) // 4,
                           total_tokens=(len(system or "") + len(user) + len(text)) // 4)
        return lm15.Response(id=None, model="scripted", message=lm15.Message.assistant([lm15.TextPart(text)]),
                             finish_reason="stop", usage=usage)

    def stream(self, request: Any) -> Any:
        return lm15.response_to_events(self.complete(request))

    def close(self) -> None:
        pass

    def _resolve(self, item: Any, user: str) -> str:
        while True:
            if isinstance(item, Sleep):
                time.sleep(item.seconds)
                item = item.then
            elif isinstance(item, BaseException):
                raise item
            elif isinstance(item, dict):
                return answer(**item)
            elif isinstance(item, str):
                return item
            elif callable(item):
                item = item(user)
            else:
                raise TypeError(f"unknown script item {item!r}")

    # -------------------------------------------------------------------------------------------- helpers
    def lm(self, model: str = "scripted/xeforge") -> Any:
        """A real ``dspy.LM`` backed by this script."""
        return dspy.LM(model, engine=self, cache=False, num_retries=0)

    def prompts(self, kind: str = "proposal") -> list[str]:
        return [r.user for r in self.requests if r.kind == kind]

    @property
    def remaining(self) -> int:
        return len(self.proposals)


def scripted(proposals: list[Any], analysis: Any = None) -> ScriptedModel:
    return ScriptedModel(list(proposals), dict(GO_AHEAD) if analysis is None else analysis)


Script = Callable[[str], Any]
