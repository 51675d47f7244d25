"""Gate 1: every constraint has a passing and a failing example kernel, and check() flags exactly the marked lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from xeforge.kb import TritonInfo, Violation, load_kb
from xeforge.kb.kernel_facts import autotune_config_lines, launch_configs, uses_dot
from xeforge.kernel_model import parse_kernel

KERNELS = Path(__file__).parent / "fixtures" / "kb" / "kernels"
CASES = sorted(KERNELS.glob("*/*.py"))
MARK = re.compile(r"# kb-expect: ([a-z0-9][a-z0-9._-]*)\s*$")


def _case(path: Path) -> tuple[dict[str, str], str]:
    source = path.read_text()
    header = dict(kv.split("=", 1) for kv in source.splitlines()[0].split(":", 1)[1].split())
    return header, source


def _check(path: Path) -> tuple[list[Violation], set[tuple[str, int]], dict[str, str]]:
    header, source = _case(path)
    triton = TritonInfo.parse(header["triton"], is_xpu=header["xpu"] == "true")
    violations = load_kb().check(parse_kernel(source, str(path)), header["device"], triton)
    expected = {
        (m.group(1), number) for number, line in enumerate(source.splitlines(), 1) if (m := MARK.search(line))
    }
    return violations, expected, header


def test_every_constraint_has_a_passing_and_a_failing_kernel() -> None:
    kb = load_kb()
    for c in kb.constraints:
        assert (KERNELS / c.id / "pass.py").is_file(), f"no passing example for {c.id}"
        assert (KERNELS / c.id / "fail.py").is_file(), f"no failing example for {c.id}"
    assert {p.name for p in KERNELS.iterdir()} == {c.id for c in kb.constraints}


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_example_kernel(path: Path) -> None:
    violations, expected, header = _check(path)
    rule = path.parent.name
    assert header["rule"] == rule
    got = {(v.rule_id, v.line) for v in violations}
    shown = "\n".join(v.render(str(path)) for v in violations)
    if path.stem == "pass":
        assert violations == [], shown
        assert not expected
    else:
        assert expected, "a failing example marks its lines"
        assert {r for r, _ in expected} == {rule}
        assert got == expected, shown  # exactly the marked lines, and no other rule fires
        for v in violations:
            assert v.message and v.fix and "{" not in v.message and "{" not in v.fix


def _violations(name: str) -> list[Violation]:
    return _check(KERNELS / name / "fail.py")[0]


def test_done_when_grf_large_under_xpu_3_6_is_rejected_with_rule_and_fix() -> None:
    [v] = _violations("xpu-grf-mode-values")
    assert v.rule_id == "xpu-grf-mode-values" and v.is_error
    assert "'large'" in v.message and "Unknown grf_mode" in v.message
    assert "grf_mode='256'" in v.fix


def test_done_when_64_warps_with_grf_256_is_rejected_with_rule_and_fix() -> None:
    [v] = _violations("xpu-grf-256-max-warps")
    assert v.rule_id == "xpu-grf-256-max-warps" and v.is_error
    assert "num_warps=64" in v.message and "num_warps <= 32" in v.fix


def test_done_when_block_ptr_under_triton_3_9_is_rejected_with_rule_and_fix() -> None:
    violations = _violations("block-pointers-removed")
    assert {v.rule_id for v in violations} == {"block-pointers-removed"}
    calls = {v.message.split()[0] for v in violations}
    assert calls == {"tl.make_block_ptr", "tl.advance", "b_bp.advance"}
    assert all(v.is_error and "tl.make_tensor_descriptor" in v.fix for v in violations)


def test_the_same_block_ptr_kernel_is_fine_under_older_triton() -> None:
    _, source = _case(KERNELS / "block-pointers-removed" / "fail.py")
    model = parse_kernel(source)
    kb = load_kb()
    assert kb.check(model, "h200", TritonInfo.parse("3.7.0")) == []
    assert [v.severity for v in kb.check(model, "h200", TritonInfo.parse("3.8.0"))] == ["warning"] * 3
    assert {v.rule_id for v in kb.check(model, "h200", TritonInfo.parse("3.9.0"))} == {"block-pointers-removed"}
    # and on the CPU interpreter as well (upstream 3.9)
    assert {v.rule_id for v in kb.check(model, "cpu-interpreter", TritonInfo.parse("3.9.0"))} == {
        "block-pointers-removed"
    }


def test_grf_large_is_fine_under_3_5_and_rejected_under_3_6() -> None:
    _, source = _case(KERNELS / "xpu-grf-mode-values" / "fail.py")
    model = parse_kernel(source)
    kb = load_kb()
    assert kb.check(model, "arc-b580", TritonInfo.parse("3.5.0", is_xpu=True)) == []
    assert [v.rule_id for v in kb.check(model, "arc-b580", TritonInfo.parse("3.6.0", is_xpu=True))] == [
        "xpu-grf-mode-values"
    ]
    # on NVIDIA the option itself is unknown
    assert [v.rule_id for v in kb.check(model, "h200", TritonInfo.parse("3.8.0"))] == ["cuda-no-xpu-options"]


def test_dtype_sharpens_the_shared_memory_estimate() -> None:
    _, source = _case(KERNELS / "cuda-smem-estimate" / "pass.py")  # 3 x (128x64 + 64x256) x 2 B = 144 KB
    model = parse_kernel(source)
    kb = load_kb()
    assert kb.check(model, "h200", TritonInfo.parse("3.8.0"), dtype="bfloat16") == []
    [v] = kb.check(model, "h200", TritonInfo.parse("3.8.0"), dtype="float32")  # 288 KB
    assert v.rule_id == "cuda-smem-estimate" and "288 KB" in v.message


# -- check_config ------------------------------------------------------------------------------------
XPU36 = TritonInfo.parse("3.6.0", is_xpu=True)
XPU35 = TritonInfo.parse("3.5.0", is_xpu=True)


def _rules(config: dict, device: str = "arc-b580", triton: TritonInfo = XPU36, **kw) -> set[str]:
    return {v.rule_id for v in load_kb().check_config(config, device, triton, **kw)}


def test_check_config_enforces_launch_rules() -> None:
    good = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_SIZE_M": 4, "num_warps": 32, "num_stages": 2,
            "grf_mode": "256"}
    gemm = {"family": "gemm"}
    assert _rules(good, **gemm) == set()
    assert _rules({**good, "grf_mode": "large"}, **gemm) == {"xpu-grf-mode-values"}
    assert _rules({**good, "num_warps": 64}, **gemm) == {"xpu-grf-256-max-warps"}
    assert _rules({**good, "num_warps": 48}, **gemm) == {"num-warps-power-of-two", "xpu-grf-256-max-warps"}
    assert _rules({**good, "num_warps": 128, "grf_mode": "128"}, **gemm) == {
        "num-warps-device-limit", "xpu-work-group-size"  # 128 x 16 lanes = 2048 work-items as well
    }
    assert _rules({**good, "BLOCK_M": 96}, **gemm) == {"block-sizes-power-of-two"}
    assert _rules({**good, "grf_mode": "large"}, triton=XPU35, **gemm) == set()
    assert _rules({**good, "warp_size": 16}, triton=XPU35, **gemm) == {
        "xpu-grf-mode-values-pre-3.6", "xpu-threads-per-warp-name"
    }
    # without knowing whether the kernel uses tl.dot, the default 32-lane warp is assumed
    assert _rules({**good, "num_warps": 64, "grf_mode": "128"}) == {"xpu-work-group-size"}


def test_check_config_dot_rules_need_to_know_about_tl_dot() -> None:
    small = {"BLOCK_M": 64, "BLOCK_N": 8, "BLOCK_K": 32}
    assert _rules(small) == set()  # unknown whether it uses tl.dot: skipped
    assert _rules(small, family="elementwise") == set()
    assert _rules(small, family="gemm") == {"xpu-dot-min-shape"}
    _, source = _case(KERNELS / "xpu-dot-min-shape" / "pass.py")
    model = parse_kernel(source)
    kernel = model.functions["matmul_kernel"]
    assert _rules(small, kernel=kernel) == {"xpu-dot-min-shape"}


def test_dpas_kernels_run_16_lanes_so_their_work_group_is_smaller() -> None:
    cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 64, "warp_size": 32, "grf_mode": "128"}
    assert _rules(cfg, family="gemm") == set()  # forced to 16 lanes: 1024 work-items
    assert _rules({"BLOCK_SIZE": 1024, "num_warps": 64, "warp_size": 32}, family="elementwise") == {
        "xpu-work-group-size"
    }
    # on the A770 Triton does not use DPAS, so the 32 lanes count
    assert _rules(cfg, device="arc-a770", family="gemm") >= {"xpu-work-group-size"}


def test_attention_head_dim_is_a_dot_extent() -> None:
    cfg = {"BLOCK_M": 128, "BLOCK_N": 64, "HEAD_DIM": 8}
    assert _rules(cfg, family="attention") == {"xpu-dot-min-shape"}
    assert _rules({**cfg, "HEAD_DIM": 64}, family="attention") == set()


def test_violation_render_and_dict() -> None:
    v = Violation("rule-x", 12, "bad thing", "do this", "error", "k")
    assert v.render("kernel.py") == "kernel.py:12: error [rule-x] bad thing\n  fix: do this"
    assert v.to_dict()["line"] == 12 and v.is_error


# -- what the checks read from a kernel ----------------------------------------------------------------
def test_launch_configs_of_autotuned_kernels_carry_config_lines() -> None:
    path = KERNELS / "cuda-no-xpu-options" / "fail.py"
    model = parse_kernel(path.read_text())
    fn = model.functions["matmul_kernel"]
    lines = autotune_config_lines(fn)
    source_lines = path.read_text().splitlines()
    assert all("triton.Config(" in source_lines[n - 1] for n in lines) and len(lines) == 2
    configs = launch_configs(model)
    assert [c.origin for c in configs] == ["autotune", "autotune"]
    assert configs[1].values["grf_mode"] == "256" and configs[1].line == lines[1]
    assert all(c.uses_dot for c in configs)


def test_uses_dot_follows_jit_helpers() -> None:
    source = '''
import triton
import triton.language as tl

@triton.jit
def _inner(acc, q, k):
    return tl.dot(q, k, acc)

@triton.jit
def outer(q_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = _inner(acc, q, k)

@triton.jit
def plain(x_ptr, BLOCK_SIZE: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, BLOCK_SIZE), 1.0)
'''
    model = parse_kernel(source)
    assert uses_dot(model.functions["outer"], model.functions)
    assert not uses_dot(model.functions["outer"])  # without the module's functions it cannot see the helper
    assert not uses_dot(model.functions["plain"], model.functions)


def test_arange_bounds_are_checked_whatever_their_name() -> None:
    source = '''
import torch
import triton
import triton.language as tl

@triton.jit
def k(x_ptr, n, TILE: tl.constexpr):
    offs = tl.program_id(0) * TILE + tl.arange(0, TILE)
    tl.store(x_ptr + offs, 0.0, mask=offs < n)

class Model(torch.nn.Module):
    def forward(self, x):
        k[(1,)](x, x.numel(), TILE=100)
        return x
'''
    violations = load_kb().check(parse_kernel(source), "cpu-interpreter", TritonInfo.parse("3.8.0"))
    assert [(v.rule_id, v.line) for v in violations] == [("block-sizes-power-of-two", 13)]
    assert "64 or 128" in violations[0].fix


def test_clusters_are_refused_on_triton_3_6_cuda_only() -> None:
    """num_ctas=2 failed to compile on the H100 under Triton 3.6 (KB cuda-no-clusters-triton-3-6): refused there,
    not under 3.8 (not measured), and num_ctas=1 is fine everywhere."""
    source = (Path(__file__).parent.parent / "kernels" / "gemm_square" / "kernel.py").read_text().replace(
        "num_stages=3)", "num_stages=3, num_ctas=2)")
    assert "num_ctas=2" in source
    kb = load_kb()
    model = parse_kernel(source)
    assert [v.rule_id for v in kb.check(model, "h100", TritonInfo.parse("3.6.0"))] == ["cuda-no-clusters-triton-3-6"]
    assert kb.check(model, "h100", TritonInfo.parse("3.8.0")) == []
    one = parse_kernel(source.replace("num_ctas=2", "num_ctas=1"))
    assert kb.check(one, "h100", TritonInfo.parse("3.6.0")) == []
