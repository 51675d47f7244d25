"""The LLM engine: a DSPy CoVeR agent (generate -> verify -> refine) per stage.

Map of the package, and what each module owns:

1. :mod:`cover_agent.config`     :class:`LMConfig` — model string, endpoint, key source, sampling, timeout,
                                 retries, budget, loop bounds; ``XEFORGE_LLM_*`` variables. No dspy import.
2. :mod:`cover_agent.prompts`    the brief for one stage, rendered from ``stages/<stage>.md.j2`` (what the
                                 dry run prints). No dspy import.
3. :mod:`cover_agent.feedback`   verdict -> the words the model reads; attempts, ranking, trimming.
4. :mod:`cover_agent.extract`    lenient extraction of the kernel file from an answer, strict validation.
5. :mod:`cover_agent.signatures` the DSPy signatures: analysis, optimization, algorithmic, discovery.
6. :mod:`cover_agent.client`     one model call: dspy.LM on one route (DSPy's own client or LiteLLM) with DSPy's
                                 retries and usage tracking; budget, records; one meaning per failure on every route.
7. :mod:`cover_agent.probe`      before the first call: the server's model list (URL, missing /v1, unknown model).
                                 No dspy import.
8. :mod:`cover_agent.module`     :class:`~cover_agent.module.CoVeR`, the loop as a ``dspy.Module`` (one predictor per
                                 signature; generate -> verify -> refine); :mod:`cover_agent.optimize` compiles it.
9. :mod:`cover_agent.engine`     :class:`~cover_agent.engine.LLMEngine` — the CoVeR loop behind
                                 ``run_stage(stage, ctx, evaluate, choose)``, and its records in the run folder.
10. :mod:`cover_agent.scripted`   a scripted model (a dspy engine) for tests and demos without a network.

Only the verifier accepts: the engine proposes, ``evaluate`` verifies, ``choose`` adopts.
"""

from __future__ import annotations

from typing import Any

from xeforge.errors import EngineError


def make_llm_engine(options: Any) -> Any:
    """The llm engine for one run. ``options``: :class:`xeforge.pipeline.PortOptions` (``.llm`` is the
    :class:`~cover_agent.config.LMConfig`). Raises :class:`xeforge.errors.EngineError` when no model is
    configured, a hosted model has no key, the server at the base URL fails the probe, or dspy is missing."""
    try:
        # lazy: cover_agent.engine imports dspy and litellm (the optional [llm] extra, seconds to import); the
        # package itself stays dspy-free so the engine registry can import it at module level
        from cover_agent.engine import LLMEngine
    except ImportError as exc:
        raise EngineError("--engine llm", f"the llm engine is not available ({exc})",
                          "pip install -e '.[llm]' (installs dspy and litellm)") from None
    return LLMEngine.from_options(options)


__all__ = ["make_llm_engine"]
