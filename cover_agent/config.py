"""The LLM engine's configuration: which model, where it is served, and what one run may spend.

Owns: :class:`LMConfig` — the LiteLLM model string (``--model`` or ``XEFORGE_MODEL``), the base URL and key
(``--api-base`` / ``XEFORGE_LLM_API_BASE`` / the provider's own variables such as ``OPENAI_API_BASE``,
``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``), sampling and transport settings (temperature, output tokens,
per-call timeout, retries — DSPy's, with its backoff —), the per-run budget (calls, tokens, dollars), and the CoVeR loop's
bounds (``--max-iters``, ``--best-k``). Every ``XEFORGE_LLM_*`` variable is listed in :data:`ENV_VARS` and
documented in ``docs/llm.md``; parsing is strict and names the variable, what it expects and the fix.

This module must stay importable without dspy: the CLI imports it for every command (``xeforge env`` shows
:meth:`LMConfig.describe`). The key is never printed, logged or written to the run folder.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from xeforge.errors import UsageError

#: XEFORGE_LLM_* variable -> (LMConfig field, type, what it means). Shown by docs/llm.md.
ENV_VARS: dict[str, tuple[str, type, str]] = {
    "XEFORGE_LLM_API_BASE": ("api_base", str, "base URL of the server (same as --api-base)"),
    "XEFORGE_LLM_API_KEY": ("api_key", str, "API key; overrides the provider's own variable"),
    "XEFORGE_LLM_TEMPERATURE": ("temperature", float, "sampling temperature, 0 to 2"),
    "XEFORGE_LLM_MAX_TOKENS": ("max_tokens", int, "output tokens per call (a whole kernel file must fit)"),
    "XEFORGE_LLM_CONTEXT_TOKENS": ("context_tokens", int,
                                   "the model's context window; older attempts are trimmed to fit"),
    "XEFORGE_LLM_TIMEOUT": ("timeout_s", float, "seconds one call may take before it counts as failed"),
    "XEFORGE_LLM_RETRIES": ("retries", int, "DSPy's retries of a call after a rate limit, timeout or server/network "
                            "error (dspy.LM num_retries)"),
    "XEFORGE_LLM_MAX_CALLS": ("max_calls", int, "budget: model calls per run (DSPy's retries of a call are not "
                              "counted apart)"),
    "XEFORGE_LLM_MAX_TOTAL_TOKENS": ("max_total_tokens", int, "budget: prompt + completion tokens per run"),
    "XEFORGE_LLM_MAX_COST": ("max_cost_usd", float,
                             "budget: US dollars per run, where the provider reports a cost (0: no limit)"),
    "XEFORGE_LLM_MAX_ITERS": ("max_iters", int, "CoVeR rounds per candidate (same as --max-iters)"),
    "XEFORGE_LLM_BEST_K": ("best_k", int, "independent candidates per stage (same as --best-k)"),
    "XEFORGE_LLM_ANALYZE": ("analyze", bool, "1: one analysis call per stage before proposing; 0: propose directly"),
    "XEFORGE_LLM_ROUTE": ("route", str, "auto, dspy or litellm: the client DSPy calls the model through"),
}

#: variables earlier versions read, -> why they are gone (setting one is an error, so it is not silently ignored)
REMOVED_VARS: dict[str, str] = {
    var: "DSPy's retry loop sets the delays now: the server's Retry-After when it sends one, else 1, 2, 4 ... 60 s"
    for var in ("XEFORGE_LLM_BACKOFF", "XEFORGE_LLM_BACKOFF_MAX")
}

#: XEFORGE_LLM_ROUTE values. ``dspy``: DSPy's own HTTP client (``dspy.LM(engine="lm15")``); ``litellm``: LiteLLM
#: (``engine="litellm"``); ``auto``: dspy for the providers DSPy's client serves (:data:`DSPY_PROVIDERS`), else litellm.
ROUTES = ("auto", "dspy", "litellm")
#: LiteLLM provider prefixes DSPy's own client has a door for (dspy._vendor.lm15.router.LITELLM_PROVIDER_PREFIXES,
#: less azure, whose base URL DSPy sends to LiteLLM anyway); every other provider goes through LiteLLM
DSPY_PROVIDERS = {"openai", "anthropic", "gemini", "groq", "openrouter", "deepseek", "xai", "ollama", "ollama_chat",
                  "hosted_vllm", "moonshot"}

#: provider prefix -> (key variable, base URL variable); LiteLLM reads the same variables itself
PROVIDER_VARS: dict[str, tuple[str | None, str | None]] = {
    "openai": ("OPENAI_API_KEY", "OPENAI_API_BASE"),
    "text-completion-openai": ("OPENAI_API_KEY", "OPENAI_API_BASE"),
    "anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_API_BASE"),
    "azure": ("AZURE_API_KEY", "AZURE_API_BASE"),
    "gemini": ("GEMINI_API_KEY", None),
    "mistral": ("MISTRAL_API_KEY", None),
    "groq": ("GROQ_API_KEY", None),
    "deepseek": ("DEEPSEEK_API_KEY", None),
    "openrouter": ("OPENROUTER_API_KEY", "OPENROUTER_API_BASE"),
    "together_ai": ("TOGETHERAI_API_KEY", None),
    "xai": ("XAI_API_KEY", None),
    "hosted_vllm": ("HOSTED_VLLM_API_KEY", "HOSTED_VLLM_API_BASE"),  # OPENAI_API_BASE too: see BASE_FALLBACKS
    "ollama": (None, "OLLAMA_API_BASE"),
    "ollama_chat": (None, "OLLAMA_API_BASE"),
    "lm_studio": ("LM_STUDIO_API_KEY", "LM_STUDIO_API_BASE"),
}
#: base URL variables read after the provider's own (the README's recipe for vLLM sets OPENAI_API_BASE)
BASE_FALLBACKS: dict[str, tuple[str, ...]] = {"hosted_vllm": ("OPENAI_API_BASE",), "lm_studio": ("OPENAI_API_BASE",)}
#: providers whose OpenAI-compatible API lives under /v1 of a base URL usually given without it (OLLAMA_API_BASE)
V1_APPENDED = {"ollama", "ollama_chat"}
#: providers that are normally local servers: no key is needed
LOCAL_PROVIDERS = {"hosted_vllm", "ollama", "ollama_chat", "lm_studio"}
#: sent as the key to a server at an explicit base URL when no key is set (OpenAI-compatible clients insist on one)
PLACEHOLDER_KEY = "no-key-needed"


@dataclass
class LMConfig:
    model: str | None = None  # LiteLLM model string: openai/..., anthropic/..., hosted_vllm/..., ollama_chat/...
    api_base: str | None = None
    api_key: str | None = field(default=None, repr=False)
    key_source: str | None = None  # the variable the key came from (shown; the key never is)
    base_source: str | None = None
    temperature: float = 0.6
    max_tokens: int = 8192
    context_tokens: int = 32768
    timeout_s: float = 300.0
    retries: int = 3
    max_calls: int = 200
    max_total_tokens: int = 3_000_000
    max_cost_usd: float = 0.0
    max_iters: int = 3
    best_k: int = 2
    analyze: bool = True
    route: str = "auto"  # auto | dspy | litellm (XEFORGE_LLM_ROUTE); see :attr:`client_route`
    lm: Any = field(default=None, repr=False, compare=False)  # a ready dspy.BaseLM (tests inject a scripted one)

    # ---------------------------------------------------------------------------------------------- build
    @classmethod
    def from_args(cls, args: Any = None, env: Mapping[str, str] | None = None) -> "LMConfig":
        """From an argparse Namespace (``model``, ``api_base``, ``max_iters``, ``best_k``; any may be missing)
        and the environment. Raises :class:`UsageError` for a malformed value."""
        env = os.environ if env is None else env
        for var, why in REMOVED_VARS.items():
            if (env.get(var) or "").strip():
                raise UsageError(f"environment variable {var}", f"{var} is no longer read: {why}",
                                 f"unset {var}; XEFORGE_LLM_RETRIES sets how many retries (docs/llm.md)")
        values: dict[str, Any] = {}
        for var, (name, typ, meaning) in ENV_VARS.items():
            raw = env.get(var)
            if raw is not None and raw.strip() != "":
                values[name] = _parse(var, raw, typ, meaning)
        model = getattr(args, "model", None) or env.get("XEFORGE_MODEL") or None
        if model is not None:
            model = model.strip()
            if "/" not in model or not model.split("/", 1)[1]:
                where = "--model" if getattr(args, "model", None) else "XEFORGE_MODEL"
                raise UsageError(where, f"{model!r} is not a LiteLLM model string (provider/model)",
                                 "write e.g. openai/gpt-4o, anthropic/claude-sonnet-4-5, hosted_vllm/<served name> "
                                 "or ollama_chat/<model>; see docs/llm.md")
        values["model"] = model
        for flag, name in (("max_iters", "max_iters"), ("best_k", "best_k")):
            v = getattr(args, flag, None)
            if v is not None:
                values[name] = v
        cfg = cls(**values)
        if getattr(args, "api_base", None):
            cfg.api_base, cfg.base_source = args.api_base, "--api-base"
        elif cfg.api_base:
            cfg.base_source = "XEFORGE_LLM_API_BASE"
        if cfg.api_key:
            cfg.key_source = "XEFORGE_LLM_API_KEY"
        prefix = cfg.provider
        key_var, base_var = PROVIDER_VARS.get(prefix, (f"{prefix.upper()}_API_KEY" if prefix else None, None))
        if cfg.api_key is None and key_var and env.get(key_var):
            cfg.api_key, cfg.key_source = env[key_var], key_var
        if cfg.api_base is None and base_var:
            for var in (base_var, base_var.replace("_API_BASE", "_BASE_URL"), *BASE_FALLBACKS.get(prefix, ())):
                if env.get(var):
                    cfg.api_base, cfg.base_source = env[var], var
                    break
        if cfg.api_base and prefix in V1_APPENDED and url_path(cfg.api_base) == "":
            # Ollama serves the OpenAI chat API under /v1; OLLAMA_API_BASE is conventionally the bare host
            cfg.api_base, cfg.base_source = cfg.api_base.rstrip("/") + "/v1", f"{cfg.base_source}, /v1 added"
        cfg.validate()
        return cfg

    def with_lm(self, lm: Any, model: str | None = None) -> "LMConfig":
        """A copy that uses a ready ``dspy.BaseLM`` (e.g. a scripted one) instead of building ``dspy.LM``."""
        return dataclasses.replace(self, lm=lm, model=model or self.model or getattr(lm, "model", None) or "custom/lm")

    def validate(self) -> None:
        checks = [
            ("--max-iters", self.max_iters >= 1, f"--max-iters must be at least 1 (got {self.max_iters})", "pass --max-iters 3"),
            ("--best-k", self.best_k >= 1, f"--best-k must be at least 1 (got {self.best_k})", "pass --best-k 2"),
            ("XEFORGE_LLM_TEMPERATURE", 0.0 <= self.temperature <= 2.0,
             f"temperature {self.temperature} is outside [0, 2]", "set XEFORGE_LLM_TEMPERATURE to e.g. 0.6"),
            ("XEFORGE_LLM_MAX_TOKENS", self.max_tokens >= 256, f"max tokens {self.max_tokens} is too small for a kernel file",
             "set XEFORGE_LLM_MAX_TOKENS to at least 4096"),
            ("XEFORGE_LLM_CONTEXT_TOKENS", self.context_tokens > self.max_tokens,
             f"context window {self.context_tokens} is not larger than the output tokens {self.max_tokens}",
             "set XEFORGE_LLM_CONTEXT_TOKENS to the model's context window (e.g. 32768)"),
            ("XEFORGE_LLM_TIMEOUT", self.timeout_s > 0, f"timeout {self.timeout_s} s is not positive", "set e.g. 300"),
            ("XEFORGE_LLM_RETRIES", self.retries >= 0, f"retries {self.retries} is negative", "set e.g. 3"),
            ("XEFORGE_LLM_MAX_CALLS", self.max_calls >= 0, f"max calls {self.max_calls} is negative", "set e.g. 200"),
            ("XEFORGE_LLM_MAX_TOTAL_TOKENS", self.max_total_tokens >= 0, "the token budget is negative", "set e.g. 3000000"),
            ("XEFORGE_LLM_MAX_COST", self.max_cost_usd >= 0, "the cost budget is negative", "set e.g. 5 (dollars) or 0 for no limit"),
            ("XEFORGE_LLM_ROUTE", self.route in ROUTES, f"route {self.route!r} is not one of {', '.join(ROUTES)}",
             "set XEFORGE_LLM_ROUTE=auto (or unset it)"),
        ]
        for where, ok, what, fix in checks:
            if not ok:
                raise UsageError(where, what, fix)

    # ---------------------------------------------------------------------------------------------- queries
    @property
    def configured(self) -> bool:
        """A model is named (or a ready LM was injected)."""
        return bool(self.model) or self.lm is not None

    @property
    def provider(self) -> str:
        return self.model.split("/", 1)[0].lower() if self.model and "/" in self.model else ""

    @property
    def client_route(self) -> str:
        """``dspy`` (DSPy's own HTTP client) or ``litellm``: the one route every call of this run takes."""
        if self.lm is not None:
            return "injected"
        if self.route != "auto":
            return self.route
        return "dspy" if self.provider in DSPY_PROVIDERS else "litellm"

    def route_text(self) -> str:
        how = {"dspy": "DSPy's own client", "litellm": "LiteLLM", "injected": "the injected LM"}[self.client_route]
        why = "XEFORGE_LLM_ROUTE" if self.route != "auto" else "auto"
        return f"via {how} ({why})"

    @property
    def is_local(self) -> bool:
        return self.provider in LOCAL_PROVIDERS or _is_loopback(self.api_base)

    def missing_key(self) -> str | None:
        """The variable to set when a hosted provider needs a key and none was found; None when fine."""
        if self.lm is not None or not self.model or self.api_key or self.is_local or self.api_base:
            return None
        # only providers known to need a key are checked here; others (cloud credentials, custom routes) are
        # left to the first call, whose failure names the cause
        return PROVIDER_VARS.get(self.provider, (None, None))[0]

    def key_for_client(self) -> str | None:
        """The key to hand to the client: the configured one, or a placeholder for a keyless server at a base URL."""
        if self.api_key:
            return self.api_key
        if self.api_base:
            return PLACEHOLDER_KEY
        return None

    def describe(self) -> str:
        """One line for ``xeforge env``. Never contains the key."""
        if not self.configured:
            return "no model configured (set XEFORGE_MODEL or pass --model, e.g. openai/gpt-4o; see docs/llm.md)"
        if self.lm is not None:
            where = f"(an injected {self.lm.__class__.__name__})"
        elif self.api_base:
            where = f"at {self.api_base} (from {self.base_source})"
        else:
            where = "at the provider's default endpoint"
        if self.lm is not None:
            key = "key handled by the injected LM"
        elif self.api_key:
            key = f"key from {self.key_source}"
        elif self.missing_key():
            key = f"NO API KEY: set {self.missing_key()}"
        elif self.is_local or self.api_base:
            key = "no key (local server)"
        else:
            key = "no key variable found (the provider's own credentials apply)"
        budget = f"{self.max_calls} calls, {self.max_total_tokens:,} tokens" + (
            f", ${self.max_cost_usd:g}" if self.max_cost_usd else "")
        return (f"model {self.model} {where} {self.route_text()}; {key}; temperature {self.temperature:g}, "
                f"max tokens {self.max_tokens}, "
                f"context {self.context_tokens}, timeout {self.timeout_s:g} s, {self.retries} retries; "
                f"budget per run {budget}; {self.max_iters} rounds x {self.best_k} candidates per stage"
                + ("" if self.analyze else "; no analysis call"))

    def public_dict(self) -> dict[str, Any]:
        """The configuration without the key, for the run folder."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("api_key", "lm")}
        out["has_key"] = bool(self.api_key)
        return out


def url_path(url: str) -> str:
    """The path of a URL without its trailing slash ("" for ``http://host:11434/``)."""
    rest = url.split("://", 1)[-1]
    return ("/" + rest.split("/", 1)[1]).rstrip("/") if "/" in rest else ""


def _is_loopback(url: str | None) -> bool:
    if not url:
        return False
    host = url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]").lower()
    return host in {"localhost", "127.0.0.1", "::1", "0.0.0.0"}


def _parse(var: str, raw: str, typ: type, meaning: str) -> Any:
    text = raw.strip()
    try:
        if typ is bool:
            low = text.lower()
            if low in {"1", "true", "yes", "on"}:
                return True
            if low in {"0", "false", "no", "off"}:
                return False
            raise ValueError(text)
        return typ(text)
    except ValueError:
        expected = {bool: "1 or 0", int: "an integer", float: "a number", str: "text"}[typ]
        raise UsageError(f"environment variable {var}", f"{raw!r} is not {expected} ({meaning})",
                         f"set {var} to {expected}, or unset it for the default") from None
