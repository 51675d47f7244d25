"""Before the first model call: does a server answer at the configured base URL, and does it serve the model?

Owns: :func:`probe` — one ``GET <base>/models`` (the model list every OpenAI-compatible server serves: vLLM,
llama.cpp, Ollama, LM Studio, gateways; no tokens, no cost), bounded by the per-call timeout and at most
:data:`PROBE_TIMEOUT_S`, run when the engine is built, so a setup error stops the run before the baseline
spends device time — and :class:`ProbeFailure`, the setup error it found, with the URL and the fix: nothing
listening, a base URL without ``/v1``, a refused key, a model the server does not serve (with the ones it does),
no answer in time. A provider at its default endpoint (no base URL), or one that is not OpenAI-compatible
(:data:`PROBED`), is not probed: its first call says what is wrong. Imports no dspy (the standard library's
HTTP client); the key goes only into the request's header.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from cover_agent.config import LMConfig, url_path

#: the longest the probe waits for the model list (a server that is up answers it at once)
PROBE_TIMEOUT_S = 10.0
#: providers whose servers refuse a model name they do not serve (llama.cpp and gateways behind openai/ may not)
STRICT_NAMES = {"hosted_vllm", "ollama", "ollama_chat", "lm_studio"}
#: providers whose base URL is an OpenAI-compatible server (others authenticate and list models their own way)
PROBED = {"openai", "text-completion-openai", "hosted_vllm", "ollama", "ollama_chat", "lm_studio"}


class ProbeFailure(Exception):
    """A setup error found by the probe: ``what`` happened at ``url``, and the ``fix``."""

    def __init__(self, kind: str, url: str, what: str, fix: str) -> None:
        self.kind, self.url, self.what, self.fix = kind, url, what, fix
        super().__init__(f"{kind}: {what}")


@dataclass
class ProbeResult:
    url: str
    models: list[str] = field(default_factory=list)
    note: str = ""  # said on stderr: a model name the server does not list, or no model list at all


def _get(url: str, key: str | None, timeout: float) -> tuple[int, Any]:
    req = urllib.request.Request(url, headers={"Accept": "application/json",
                                               **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (the user's own base URL)
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return status, None


def _ids(body: Any) -> list[str]:
    items = body.get("data") or body.get("models") or [] if isinstance(body, dict) else []
    out = []
    for item in items if isinstance(items, list) else []:
        name = item.get("id") or item.get("name") or item.get("model") if isinstance(item, dict) else item
        if isinstance(name, str) and name not in out:
            out.append(name)
    return out


def probe(config: LMConfig) -> ProbeResult | None:
    """Check the server at ``config.api_base``; None when there is no base URL to check. Raises
    :class:`ProbeFailure` for a setup error."""
    base = (config.api_base or "").rstrip("/")
    if not base or config.lm is not None or config.provider not in PROBED:
        return None
    url = f"{base}/models"
    timeout = min(config.timeout_s, PROBE_TIMEOUT_S)
    key = config.key_for_client()
    try:
        status, body = _get(url, key, timeout)
    except (socket.timeout, TimeoutError):
        raise ProbeFailure("timeout", url, f"no answer from {url} within {timeout:g} s",
                           f"check that the server at {base} is up and not overloaded (curl {url}); the wait is "
                           f"the per-call timeout XEFORGE_LLM_TIMEOUT, at most {PROBE_TIMEOUT_S:g} s") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ProbeFailure("transport", url, f"nothing answers at {base} ({reason})",
                           f"start the model server, or point --api-base / {config.base_source or 'the base URL'} "
                           "at the host and port it listens on (docs/llm.md)") from None
    if status in (401, 403):
        held = f"the key from {config.key_source}" if config.key_source else "no key (none is set)"
        raise ProbeFailure("auth", url, f"{url} refused {held} (HTTP {status})",
                           "set the server's key in the provider's variable or XEFORGE_LLM_API_KEY (docs/llm.md)")
    if status == 404 or (status == 200 and not isinstance(body, dict)):
        if not url_path(base).endswith("/v1"):
            try:
                v1_status, v1_body = _get(f"{base}/v1/models", key, timeout)
            except (urllib.error.URLError, OSError, ValueError):
                v1_status, v1_body = 0, None
            if v1_status == 200 and isinstance(v1_body, dict):
                raise ProbeFailure("not-found", url, f"{url} does not exist (HTTP {status}), but {base}/v1/models "
                                   "does: the base URL lacks /v1",
                                   f"pass --api-base {base}/v1 (or set {config.base_source or 'the base URL'} to it)")
        return ProbeResult(url, note=f"{url} answered HTTP {status} without a model list; the first call will tell "
                                     "whether the server serves the model")
    if status != 200:
        return ProbeResult(url, note=f"{url} answered HTTP {status}; the first call will tell more")
    models = _ids(body)
    wire = (config.model or "").split("/", 1)[-1]
    if not models or wire in models or f"{wire}:latest" in models:
        return ProbeResult(url, models)
    listed = ", ".join(models[:12]) + (f" (and {len(models) - 12} more)" if len(models) > 12 else "")
    if config.provider in STRICT_NAMES:
        raise ProbeFailure("model", url, f"the server at {base} does not serve {wire!r}; it serves: {listed}",
                           f"pass --model {config.provider}/{models[0]} (the name after the provider prefix is the "
                           "server's own name for the model)")
    return ProbeResult(url, models, note=f"the server at {base} does not list {wire!r} (it lists: {listed}); a server "
                                         "that serves one model whatever the name (llama.cpp) answers anyway")
