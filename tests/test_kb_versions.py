"""Version gating: the installed Triton, version ranges, and which entries apply under fake versions."""

from __future__ import annotations

import pytest
from packaging.version import Version

from xeforge.errors import UsageError
from xeforge.kb import TritonInfo, installed_triton, load_kb
from xeforge.kb.versions import VersionRange, VersionRangeError, version_applies


def test_triton_info_parse() -> None:
    info = TritonInfo.parse("3.6.0", is_xpu=True)
    assert info.version == Version("3.6.0") and info.is_xpu and info.text == "3.6.0"
    assert str(info) == "triton-xpu 3.6.0"
    assert str(TritonInfo.parse("3.8.0")) == "triton 3.8.0"
    # pre-release, dev and local parts are ignored for gating
    assert TritonInfo.parse("3.9.0rc1+git1234").version == Version("3.9.0")
    assert TritonInfo.parse("3.5.0+gitabc", is_xpu=True).version == Version("3.5.0")
    with pytest.raises(UsageError):
        TritonInfo.parse("three")


def test_installed_triton_reads_package_metadata() -> None:
    import importlib.util
    from pathlib import Path

    info = installed_triton()
    assert isinstance(info, TritonInfo)
    assert info.version >= Version("3.0")
    spec = importlib.util.find_spec("triton")
    intel = any((Path(p) / "backends" / "intel").is_dir() for p in spec.submodule_search_locations or [])
    assert info.is_xpu is intel  # upstream triton here: no Intel backend folder


def test_importing_the_package_does_not_import_torch() -> None:
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, xeforge.kb, xeforge.kb.cli; xeforge.kb.load_kb(); print('torch' in sys.modules)"
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "text, inside, outside",
    [
        (">=3.6", ["3.6.0", "3.7.2", "4.0"], ["3.5.0", "3.5.9"]),
        ("<3.6", ["3.5.0", "3.0"], ["3.6.0", "3.7"]),
        (">=3.7,<3.8", ["3.7.0", "3.7.2"], ["3.6.0", "3.8.0"]),
        ("==3.7.*", ["3.7.0", "3.7.2"], ["3.8.0"]),
    ],
)
def test_version_range_membership(text: str, inside: list[str], outside: list[str]) -> None:
    rng = VersionRange(text)
    assert all(rng.contains(Version(v)) for v in inside)
    assert not any(rng.contains(Version(v)) for v in outside)


@pytest.mark.parametrize("text", ["", ">=3.6,<", "3.6", "~~3", ">=3.9,<3.6", ">3.6,<=3.6", "==3.6,<3.5"])
def test_bad_version_ranges_are_rejected(text: str) -> None:
    with pytest.raises(VersionRangeError):
        VersionRange(text)


def test_none_range_contains_nothing() -> None:
    assert not VersionRange("none").contains(Version("3.6.0"))


def test_gating_rule() -> None:
    up = TritonInfo.parse("3.9.0")
    xpu = TritonInfo.parse("3.9.0", is_xpu=True)
    ge39, ge38, none = VersionRange(">=3.9"), VersionRange(">=3.8"), VersionRange("none")
    assert version_applies(None, None, up) and version_applies(None, None, xpu)
    assert version_applies(ge39, None, up) and version_applies(ge39, None, xpu)  # the fork inherits upstream
    assert not version_applies(None, ge38, up)  # only triton_xpu: about the fork
    assert version_applies(None, ge38, xpu)
    assert version_applies(ge39, none, up) and not version_applies(ge39, none, xpu)
    assert not version_applies(none, ge38, up) and version_applies(none, ge38, xpu)


def _ids(kb, device: str, triton: TritonInfo) -> set[str]:
    return {c.id for c in kb.applicable_constraints(device, triton)}


@pytest.mark.parametrize(
    "version, xpu, present, absent",
    [
        ("3.5.0", True, {"xpu-grf-mode-values-pre-3.6", "xpu-threads-per-warp-name", "xpu-grf-large-max-warps"},
         {"xpu-grf-mode-values", "xpu-warp-size-name", "block-pointers-removed-xpu", "xpu-block-ptr-lowering"}),
        ("3.6.0", True, {"xpu-grf-mode-values", "xpu-warp-size-name", "xpu-grf-256-max-warps"},
         {"xpu-grf-mode-values-pre-3.6", "xpu-threads-per-warp-name", "block-pointers-removed-xpu"}),
        ("3.7.2", True, {"xpu-grf-mode-values", "xpu-block-ptr-lowering"},
         {"block-pointers-removed-xpu", "block-pointers-removed", "block-pointers-deprecated"}),
        ("3.8.0", True, {"block-pointers-removed-xpu"}, {"xpu-block-ptr-lowering", "block-pointers-deprecated"}),
        ("3.9.0", True, {"block-pointers-removed-xpu"}, {"block-pointers-removed"}),
    ],
)
def test_xpu_constraints_by_version(version: str, xpu: bool, present: set[str], absent: set[str]) -> None:
    ids = _ids(load_kb(), "arc-b580", TritonInfo.parse(version, is_xpu=xpu))
    assert present <= ids
    assert not (absent & ids)


@pytest.mark.parametrize(
    "version, present, absent",
    [
        ("3.3.0", {"tensor-descriptor-name"}, {"block-pointers-deprecated", "block-pointers-removed"}),
        ("3.7.0", set(), {"tensor-descriptor-name", "block-pointers-deprecated", "block-pointers-removed"}),
        ("3.8.0", {"block-pointers-deprecated"}, {"block-pointers-removed"}),
        ("3.9.0", {"block-pointers-removed"}, {"block-pointers-deprecated"}),
    ],
)
def test_upstream_constraints_by_version(version: str, present: set[str], absent: set[str]) -> None:
    ids = _ids(load_kb(), "h200", TritonInfo.parse(version))
    assert present <= ids
    assert not (absent & ids)
    assert not any(i.startswith("xpu-") for i in ids)


def test_patterns_are_version_gated_too() -> None:
    kb = load_kb()
    p35 = {p.id for p in kb.select("device_tuning", "max-1550", TritonInfo.parse("3.5.0", is_xpu=True)).patterns}
    p36 = {p.id for p in kb.select("device_tuning", "max-1550", TritonInfo.parse("3.6.0", is_xpu=True)).patterns}
    assert "tune-xpu-gemm-large-grf-pre-3.6" in p35 and "tune-xpu-gemm-large-grf-pre-3.6" not in p36
    assert "tune-xpu-gemm-256-grf" in p36 and "tune-xpu-gemm-256-grf" not in p35


def test_option_spelling_follows_the_version() -> None:
    kb = load_kb()
    assert kb.option_spelling("warp_size", "arc-b580", TritonInfo.parse("3.5.0", is_xpu=True)) == "threads_per_warp"
    assert kb.option_spelling("warp_size", "arc-b580", TritonInfo.parse("3.6.0", is_xpu=True)) == "warp_size"
    assert kb.option_spelling("num_warps", "arc-b580", TritonInfo.parse("3.5.0", is_xpu=True)) == "num_warps"
