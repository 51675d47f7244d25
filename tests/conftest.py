"""Shared fixtures: paths, CPU-interpreter settings, and run-time skips for hardware tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def gpu_kind() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    if torch.cuda.is_available():
        return "cuda"
    return None


def skip_without_gpu():
    """Skip at run time, with the reason, when no CUDA/XPU device is present."""
    kind = gpu_kind()
    if kind is None:
        pytest.skip("needs a CUDA or XPU GPU: timing on the CPU interpreter measures nothing (run on the H200)")
    return kind


@pytest.fixture
def fast_settings():
    from xeforge.settings import Settings

    return Settings(compile_timeout_s=60.0, run_timeout_s=30.0, correctness_rounds=5)


@pytest.fixture(autouse=True)
def _no_llm_env(monkeypatch):
    for var in ("XEFORGE_MODEL", "OPENAI_API_KEY", "OPENAI_API_BASE", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    yield


@pytest.fixture
def repo_root() -> Path:
    return ROOT


os.environ.setdefault("XEFORGE_TEST", "1")
