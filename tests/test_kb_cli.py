"""``xeforge kb lint | show | explain | check`` through a small argparse parser built like the main CLI."""

from __future__ import annotations

import argparse
import difflib
import json
from pathlib import Path

import pytest

from xeforge.kb.cli import register

FIXTURES = Path(__file__).parent / "fixtures" / "kb"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="xeforge")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_lint_shipped_base(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "kb", "lint")
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kb lint: OK")


def test_lint_broken_file_prints_file_line_and_fix(capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURES / "broken" / "unknown_stage.yaml"
    code, out, err = run(capsys, "kb", "lint", str(path))
    assert code == 1
    assert "unknown_stage.yaml:6 patterns[0].stage: unknown stage 'tuning'" in out
    assert "fix: use one of:" in out
    assert "1 error" in err


def test_lint_all_broken_fixtures_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "kb", "lint", str(FIXTURES / "broken"))
    assert code == 1
    for path in (FIXTURES / "broken").glob("*.yaml"):
        assert path.name in out


def test_show_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "kb", "show", "--device", "arc-b580", "--stage", "device_tuning", "--triton", "3.6.0")
    assert code == 0
    assert out.startswith("# Knowledge base for stage device_tuning · device arc-b580")
    assert "triton-xpu 3.6.0" in out.splitlines()[0]  # --triton on an Intel device means triton-xpu
    assert "[xpu-grf-mode-values]" in out and "[xpu-dpas-gemm]" in out
    code, out, _ = run(capsys, "kb", "show", "--device", "arc-b580", "--stage", "device_tuning", "--triton", "3.6.0",
                       "--json")
    data = json.loads(out)
    assert data["triton"] == {"version": "3.6.0", "is_xpu": True, "text": "3.6.0"}
    assert data["device"]["facts"]["cores"]["value"] == 20


def test_show_without_version_uses_installed_triton(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "kb", "show", "--device", "h200", "--stage", "dtype")
    assert code == 0 and "gating on the installed triton" in err
    assert "[dtype-fp32-accumulator]" in out


def test_show_no_xpu_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "kb", "show", "--device", "arc-b580", "--stage", "block_io", "--triton", "3.9.0",
                       "--no-xpu")
    assert code == 0 and "· triton 3.9.0" in out.splitlines()[0]
    assert "[block-pointers-removed]" in out and "[block-pointers-removed-xpu]" not in out


def test_show_3_5_vs_3_6_diff_is_only_the_renamed_options(capsys: pytest.CaptureFixture[str]) -> None:
    base = ("kb", "show", "--device", "arc-b580", "--stage", "device_tuning", "--triton")
    _, a, _ = run(capsys, *base, "3.5.0")
    _, b, _ = run(capsys, *base, "3.6.0")
    changed = [
        line[1:] for line in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert changed
    changed = [c.lower() for c in changed]
    header = [c for c in changed if c.startswith("# knowledge base")]
    assert len(header) == 2  # the version in the title
    naming = ("grf", "large", "'256'", "warp_size", "threads_per_warp", "register", "ixb-issue-7363")
    for line in changed:
        if line in header or line.strip().startswith(("(", "fix:", "applies to:", "effect:", "applies when:")):
            continue  # provenance / prose lines of the same version-gated entries
        assert any(word in line for word in naming), line


def test_show_unknown_device_fails_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "kb", "show", "--device", "arc-b590", "--stage", "dtype", "--triton", "3.6.0")
    assert code == 1 and out == ""
    assert err.startswith("Error: device: unknown device id 'arc-b590'") and "arc-b580" in err


def test_show_unknown_stage_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run(capsys, "kb", "show", "--device", "arc-b580", "--stage", "tuning")
    assert info.value.code == 2


def test_explain(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "kb", "explain", "xpu-grf-256-max-warps")
    assert code == 0 and out.startswith("xpu-grf-256-max-warps — constraint (error)")
    code, _, err = run(capsys, "kb", "explain", "no-such-rule")
    assert code == 1 and "Error:" in err


def test_check_kernel_file(capsys: pytest.CaptureFixture[str]) -> None:
    fail = FIXTURES / "kernels" / "xpu-grf-256-max-warps" / "fail.py"
    code, out, err = run(capsys, "kb", "check", str(fail), "--device", "arc-b580", "--triton", "3.6.0")
    assert code == 1 and "[xpu-grf-256-max-warps]" in out and "fix:" in out and "1 error(s)" in err
    ok = FIXTURES / "kernels" / "xpu-grf-256-max-warps" / "pass.py"
    code, out, _ = run(capsys, "kb", "check", str(ok), "--device", "arc-b580", "--triton", "3.6.0", "--json")
    assert code == 0 and json.loads(out) == []


def test_kb_without_subcommand_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "kb")
    assert code == 2 and "lint" in err
