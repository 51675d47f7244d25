"""LMConfig: model string, endpoint and key from flags and the environment, strict parsing, honest description."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from cover_agent.config import ENV_VARS, PLACEHOLDER_KEY, LMConfig
from tests.conftest import ROOT
from xeforge.errors import EngineError, UsageError


def ns(**kw) -> argparse.Namespace:
    return argparse.Namespace(**kw)


def test_nothing_configured():
    cfg = LMConfig.from_args(ns(), env={})
    assert not cfg.configured and "no model configured" in cfg.describe() and "XEFORGE_MODEL" in cfg.describe()


def test_args_without_llm_attributes_use_defaults():
    cfg = LMConfig.from_args(argparse.Namespace(device="cpu"), env={"XEFORGE_MODEL": "openai/gpt-4o"})
    assert cfg.model == "openai/gpt-4o" and cfg.max_iters == 3 and cfg.best_k == 2


def test_hosted_model_key_from_provider_variable_never_printed():
    secret = "sk-test-0123456789abcdef"
    cfg = LMConfig.from_args(ns(model="openai/gpt-4o", api_base=None, max_iters=None, best_k=None),
                             env={"OPENAI_API_KEY": secret})
    assert cfg.configured and cfg.api_key == secret and cfg.key_source == "OPENAI_API_KEY"
    text = cfg.describe()
    assert secret not in text and secret not in repr(cfg) and "key from OPENAI_API_KEY" in text
    assert secret not in json.dumps(cfg.public_dict()) and cfg.public_dict()["has_key"] is True


def test_flags_win_over_environment():
    env = {"XEFORGE_MODEL": "openai/gpt-4o", "XEFORGE_LLM_MAX_ITERS": "5", "XEFORGE_LLM_BEST_K": "4",
           "OPENAI_API_BASE": "https://gateway.example/v1", "OPENAI_API_KEY": "k"}
    cfg = LMConfig.from_args(ns(model="anthropic/claude-sonnet-4-5", api_base="http://localhost:8000/v1", max_iters=2,
                                best_k=1), env=env)
    assert (cfg.model, cfg.api_base, cfg.base_source, cfg.max_iters, cfg.best_k) == (
        "anthropic/claude-sonnet-4-5", "http://localhost:8000/v1", "--api-base", 2, 1)
    assert cfg.api_key is None  # OPENAI_API_KEY is not Anthropic's key


def test_provider_base_url_variable():
    cfg = LMConfig.from_args(ns(), env={"XEFORGE_MODEL": "openai/local-model", "OPENAI_API_BASE": "http://127.0.0.1:8080/v1"})
    assert cfg.api_base == "http://127.0.0.1:8080/v1" and cfg.base_source == "OPENAI_API_BASE"
    assert cfg.missing_key() is None and cfg.key_for_client() == PLACEHOLDER_KEY and cfg.is_local


@pytest.mark.parametrize("model", ["hosted_vllm/Qwen/Qwen2.5-Coder-32B-Instruct", "ollama_chat/qwen2.5-coder:32b"])
def test_local_servers_need_no_key(model):
    cfg = LMConfig.from_args(ns(model=model), env={})
    assert cfg.missing_key() is None and "no key (local server)" in cfg.describe()


def test_hosted_model_without_key_is_reported():
    cfg = LMConfig.from_args(ns(model="anthropic/claude-sonnet-4-5"), env={})
    assert cfg.missing_key() == "ANTHROPIC_API_KEY" and "NO API KEY: set ANTHROPIC_API_KEY" in cfg.describe()
    from cover_agent import make_llm_engine

    with pytest.raises(EngineError) as err:
        make_llm_engine(argparse.Namespace(llm=cfg))
    assert "ANTHROPIC_API_KEY is not set" in err.value.render() and "--api-base" in err.value.render()


def test_engine_refuses_without_a_model():
    from cover_agent import make_llm_engine

    with pytest.raises(EngineError, match="no LLM is configured"):
        make_llm_engine(argparse.Namespace(llm=LMConfig()))


def test_every_setting_parses_from_the_environment():
    env = {"XEFORGE_MODEL": "openai/gpt-4o", "XEFORGE_LLM_API_KEY": "x", "XEFORGE_LLM_API_BASE": "https://h/v1",
           "XEFORGE_LLM_TEMPERATURE": "0.2", "XEFORGE_LLM_MAX_TOKENS": "4096", "XEFORGE_LLM_CONTEXT_TOKENS": "65536",
           "XEFORGE_LLM_TIMEOUT": "60", "XEFORGE_LLM_RETRIES": "5",
           "XEFORGE_LLM_MAX_CALLS": "10", "XEFORGE_LLM_MAX_TOTAL_TOKENS": "50000",
           "XEFORGE_LLM_MAX_COST": "2.5", "XEFORGE_LLM_MAX_ITERS": "4", "XEFORGE_LLM_BEST_K": "3",
           "XEFORGE_LLM_ANALYZE": "0", "XEFORGE_LLM_ROUTE": "litellm"}
    assert set(ENV_VARS) <= set(env)
    cfg = LMConfig.from_args(ns(), env=env)
    assert (cfg.temperature, cfg.max_tokens, cfg.context_tokens, cfg.timeout_s, cfg.retries,
            cfg.max_calls, cfg.max_total_tokens, cfg.max_cost_usd, cfg.max_iters, cfg.best_k,
            cfg.analyze) == (0.2, 4096, 65536, 60.0, 5, 10, 50000, 2.5, 4, 3, False)
    assert cfg.key_source == "XEFORGE_LLM_API_KEY" and cfg.base_source == "XEFORGE_LLM_API_BASE"
    assert "$2.5" in cfg.describe() and "no analysis call" in cfg.describe()
    assert cfg.client_route == "litellm" and "via LiteLLM (XEFORGE_LLM_ROUTE)" in cfg.describe()


@pytest.mark.parametrize("env,where", [
    ({"XEFORGE_LLM_TEMPERATURE": "hot"}, "XEFORGE_LLM_TEMPERATURE"),
    ({"XEFORGE_LLM_MAX_CALLS": "1.5"}, "XEFORGE_LLM_MAX_CALLS"),
    ({"XEFORGE_LLM_ANALYZE": "maybe"}, "XEFORGE_LLM_ANALYZE"),
    ({"XEFORGE_LLM_TEMPERATURE": "3"}, "XEFORGE_LLM_TEMPERATURE"),
    ({"XEFORGE_LLM_MAX_TOKENS": "100000", "XEFORGE_LLM_CONTEXT_TOKENS": "8192"}, "XEFORGE_LLM_CONTEXT_TOKENS"),
    ({"XEFORGE_MODEL": "gpt-4o"}, "XEFORGE_MODEL"),
    ({"XEFORGE_LLM_ROUTE": "curl"}, "XEFORGE_LLM_ROUTE"),
])
def test_bad_settings_name_the_variable_and_the_fix(env, where):
    with pytest.raises(UsageError) as err:
        LMConfig.from_args(ns(), env=env)
    assert where in err.value.where and err.value.fix


def test_bad_flags():
    with pytest.raises(UsageError, match="at least 1"):
        LMConfig.from_args(ns(max_iters=0), env={})
    with pytest.raises(UsageError) as err:
        LMConfig.from_args(ns(model="gpt-4o"), env={})
    assert err.value.where == "--model" and "openai/gpt-4o" in err.value.fix


def test_config_and_prompts_do_not_import_dspy():
    code = ("import sys, cover_agent, cover_agent.config, cover_agent.prompts, cover_agent.feedback, "
            "cover_agent.extract; import xeforge.cli; assert 'dspy' not in sys.modules, 'dspy imported'; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_xeforge_env_shows_the_model_without_the_key(tmp_path):
    import os

    env = {**os.environ, "XEFORGE_MODEL": "openai/gpt-4o", "OPENAI_API_KEY": "sk-secret-value-42"}
    proc = subprocess.run([sys.executable, "-m", "xeforge", "env", "--device", "cpu"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "llm: model openai/gpt-4o" in proc.stdout and "key from OPENAI_API_KEY" in proc.stdout
    assert "via DSPy's own client (auto)" in proc.stdout
    assert "sk-secret-value-42" not in proc.stdout + proc.stderr


def test_every_setting_is_documented_with_its_default():
    doc = (ROOT / "docs" / "llm.md").read_text()
    defaults = LMConfig()
    for var, (name, typ, _) in ENV_VARS.items():
        assert f"`{var}`" in doc, f"{var} is not documented in docs/llm.md"
        value = getattr(defaults, name)
        if value is None or name in ("api_base", "api_key"):
            continue
        shown = {True: "1", False: "0"}.get(value, None) if typ is bool else (
            f"{value:g}" if isinstance(value, float) else str(value))
        row = next(line for line in doc.splitlines() if line.startswith(f"| `{var}`"))
        assert f"| {shown}" in row, f"docs/llm.md gives a different default for {var}: {row}"


def test_providers_with_cloud_credentials_are_not_blocked_up_front():
    cfg = LMConfig.from_args(ns(model="bedrock/anthropic.claude-3-sonnet"), env={})
    assert cfg.missing_key() is None and cfg.configured


def test_readme_recipe_for_vllm_reads_openai_api_base():
    """XEFORGE_MODEL=hosted_vllm/<model> OPENAI_API_BASE=http://host:port/v1 (README) reaches host:port, not
    vLLM's default localhost:8000, and takes the same route as --model/--api-base."""
    env_cfg = LMConfig.from_args(ns(), env={"XEFORGE_MODEL": "hosted_vllm/coder", "OPENAI_API_BASE": "http://gpu1:9000/v1"})
    flag_cfg = LMConfig.from_args(ns(model="hosted_vllm/coder", api_base="http://gpu1:9000/v1"), env={})
    assert env_cfg.api_base == flag_cfg.api_base == "http://gpu1:9000/v1" and env_cfg.base_source == "OPENAI_API_BASE"
    assert env_cfg.client_route == flag_cfg.client_route == "dspy"
    own = LMConfig.from_args(ns(), env={"XEFORGE_MODEL": "hosted_vllm/coder", "HOSTED_VLLM_API_BASE": "http://a:1/v1",
                                        "OPENAI_API_BASE": "http://b:2/v1"})
    assert own.api_base == "http://a:1/v1"  # the provider's own variable first


@pytest.mark.parametrize("base,expected", [("http://box:11434", "http://box:11434/v1"),
                                           ("http://box:11434/", "http://box:11434/v1"),
                                           ("http://box:11434/v1", "http://box:11434/v1")])
def test_ollama_base_gets_the_openai_path(base, expected):
    cfg = LMConfig.from_args(ns(), env={"XEFORGE_MODEL": "ollama_chat/qwen2.5-coder:32b", "OLLAMA_API_BASE": base})
    assert cfg.api_base == expected and ("/v1 added" in cfg.describe()) == (base.rstrip("/") != expected)


@pytest.mark.parametrize("model,route", [("openai/gpt-4o", "dspy"), ("hosted_vllm/m", "dspy"), ("ollama_chat/m", "dspy"),
                                         ("anthropic/claude-sonnet-4-5", "dspy"), ("bedrock/anthropic.claude", "litellm"),
                                         ("azure/deploy", "litellm"), ("mistral/codestral", "litellm")])
def test_one_route_per_provider_shown_by_describe(model, route):
    cfg = LMConfig.from_args(ns(model=model), env={})
    assert cfg.client_route == route
    assert ("via DSPy's own client (auto)" if route == "dspy" else "via LiteLLM (auto)") in cfg.describe()
    forced = LMConfig.from_args(ns(model=model), env={"XEFORGE_LLM_ROUTE": "litellm"})
    assert forced.client_route == "litellm"


@pytest.mark.parametrize("var", ["XEFORGE_LLM_BACKOFF", "XEFORGE_LLM_BACKOFF_MAX"])
def test_the_removed_backoff_variables_are_refused_not_ignored(var):
    """DSPy's retry loop sets the delays; a variable that no longer does anything says so instead of being ignored."""
    with pytest.raises(UsageError) as err:
        LMConfig.from_args(ns(), env={"XEFORGE_MODEL": "openai/gpt-4o", var: "2"})
    text = err.value.render()
    assert var in text and "no longer read" in text and "Retry-After" in text and f"unset {var}" in text
