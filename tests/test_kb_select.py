"""Selection (everything that applies, nothing cut), device entries and recognition, explain."""

from __future__ import annotations

import pytest

from xeforge.errors import KnowledgeBaseError
from xeforge.kb import STAGES, DeviceEntry, Selection, TritonInfo, load_kb
from xeforge.kb.entries import gate_applies

XPU36 = TritonInfo.parse("3.6.0", is_xpu=True)
XPU35 = TritonInfo.parse("3.5.0", is_xpu=True)
UP38 = TritonInfo.parse("3.8.0")


def _triton_for(device: DeviceEntry) -> TritonInfo:
    return XPU36 if device.backend == "xpu" else UP38


def test_stages_in_pipeline_order() -> None:
    assert STAGES == (
        "algorithmic", "dtype", "fusion", "memory_access", "block_io", "persistent", "device_tuning",
        "autotuning", "discovery",
    )


def test_every_stage_has_patterns() -> None:
    kb = load_kb()
    for stage in STAGES:
        assert any(stage in p.spec.stages for p in kb.patterns), stage
        assert kb.select(stage, "arc-b580", XPU36).patterns, stage


@pytest.mark.parametrize("stage", STAGES)
def test_selection_holds_everything_that_applies(stage: str) -> None:
    kb = load_kb()
    for device in kb.devices.values():
        triton = _triton_for(device)
        sel = kb.select(stage, device.id, triton)
        want_patterns = [p.id for p in kb.patterns if stage in p.spec.stages and gate_applies(p.spec, device, triton)]
        want_constraints = [c.id for c in kb.constraints if gate_applies(c.spec, device, triton) and c.for_stage(stage)]
        assert [p.id for p in sel.patterns] == want_patterns
        assert [c.id for c in sel.constraints] == want_constraints
        assert sel.left_out == []
        text = sel.render_text()
        for entry_id in sel.ids():  # nothing is cut from the rendered text either
            assert f"[{entry_id}]" in text
        for name in device.facts():
            assert f"- {name}:" in text


def test_selection_excludes_other_devices_entries() -> None:
    kb = load_kb()
    nvidia = kb.select("block_io", "h200", UP38)
    assert "bio-no-set-allocator-on-xpu" not in nvidia.ids()
    assert "bio-tma-on-hopper" in nvidia.ids()
    dg2 = kb.select("block_io", "arc-a770", XPU36)
    assert "bio-keep-pointers-on-dg2" in dg2.ids() and "bio-block-limits" not in dg2.ids()
    assert "xpu-no-fp64" in {c.id for c in kb.select("dtype", "arc-a770", XPU36).constraints}
    assert "xpu-no-fp64" not in {c.id for c in kb.select("dtype", "max-1550", XPU36).constraints}


def test_spaces_reach_tuning_stages_only() -> None:
    kb = load_kb()
    assert {s.family for s in kb.select("device_tuning", "arc-b580", XPU36).spaces} == {
        "gemm", "gemv", "reduction", "elementwise", "attention"
    }
    assert kb.select("autotuning", "arc-b580", XPU36).spaces
    assert kb.select("fusion", "arc-b580", XPU36).spaces == []


def test_show_for_3_5_and_3_6_differs_exactly_where_the_naming_changed() -> None:
    kb = load_kb()
    a = kb.select("device_tuning", "arc-b580", XPU35).to_dict()
    b = kb.select("device_tuning", "arc-b580", XPU36).to_dict()
    assert a["device"] == b["device"]  # device facts do not depend on the version
    only_35 = {c["id"] for c in a["constraints"]} - {c["id"] for c in b["constraints"]}
    only_36 = {c["id"] for c in b["constraints"]} - {c["id"] for c in a["constraints"]}
    assert only_35 == {"xpu-grf-mode-values-pre-3.6", "xpu-grf-large-max-warps", "xpu-threads-per-warp-name"}
    assert only_36 == {"xpu-grf-mode-values", "xpu-grf-256-max-warps", "xpu-warp-size-name"}
    pat_35 = {p["id"] for p in a["patterns"]} ^ {p["id"] for p in b["patterns"]}
    assert pat_35 == {"tune-xpu-gemm-large-grf-pre-3.6", "tune-xpu-gemm-256-grf",
                      "tune-xpu-attention-large-grf-pre-3.6", "tune-xpu-attention-256-grf"}
    for entry in a["patterns"] + b["patterns"]:
        if entry["id"] in pat_35:
            assert "grf_mode" in entry["tags"]
    # the spaces differ only in the grf_mode values and in how warp_size is spelled
    for sa, sb in zip(a["spaces"], b["spaces"]):
        assert sa["id"] == sb["id"]
        va, vb = dict(sa["values"]), dict(sb["values"])
        if "grf_mode" in vb:
            assert vb.pop("grf_mode") in (["256", "128"], ["256"])
            assert va.pop("grf_mode") in (["large", "small"], ["large"])
        assert va.pop("threads_per_warp") == vb.pop("warp_size")
        assert va == vb
    # the constraints common to both are identical
    common = {c["id"] for c in a["constraints"]} & {c["id"] for c in b["constraints"]}
    assert [c for c in a["constraints"] if c["id"] in common] == [c for c in b["constraints"] if c["id"] in common]


def test_fit_keeps_constraints_and_reports_what_was_left_out() -> None:
    kb = load_kb()
    sel = kb.select("block_io", "arc-b580", XPU36)
    relevant = [p for p in sel.patterns if "descriptor" in p.spec.tags]
    assert relevant and len(relevant) < len(sel.patterns)
    only_relevant = Selection(sel.stage, sel.device, sel.triton, sel.constraints, relevant, sel.spaces, sel.sources,
                              [p.id for p in sel.patterns if p not in relevant])
    budget = len(only_relevant.render_text()) + 40
    fitted = sel.fit(budget, relevant=["descriptor"])
    assert len(fitted.render_text()) <= budget
    assert [c.id for c in fitted.constraints] == [c.id for c in sel.constraints]  # never cut
    assert {p.id for p in relevant} <= {p.id for p in fitted.patterns}  # relevant ones first
    assert fitted.left_out and {p.id for p in fitted.patterns} | set(fitted.left_out) == {p.id for p in sel.patterns}
    assert "left out for the prompt budget: " + ", ".join(fitted.left_out) in fitted.render_text()
    assert sel.fit(10**6).left_out == []


def test_select_rejects_unknown_stage_and_device() -> None:
    kb = load_kb()
    with pytest.raises(KnowledgeBaseError) as info:
        kb.select("tuning", "arc-b580", XPU36)
    assert "device_tuning" in info.value.fix
    with pytest.raises(KnowledgeBaseError) as info:
        kb.select("dtype", "arc-b590", XPU36)
    assert "arc-b580" in info.value.fix


# -- device entries ----------------------------------------------------------------------------------
def test_device_entry_accessors() -> None:
    b580 = load_kb().devices["arc-b580"]
    assert (b580.id, b580.name, b580.backend) == ("arc-b580", "Intel Arc B580", "xpu")
    assert b580.cores == 20
    assert b580.peak_tflops["bf16"] == pytest.approx(116.74)
    assert b580.peak_flops("bfloat16") == pytest.approx(116.74e12)
    assert b580.peak_flops("torch.float16") == pytest.approx(116.74e12)
    assert b580.peak_flops("fp64") is None
    assert b580.bandwidth_bytes_per_s == pytest.approx(456e9)
    assert b580.l2_bytes == 18 * 1024 * 1024
    assert b580.subgroup_sizes == [16, 32]
    assert b580.grf_modes == [128, 256]
    assert b580.max_num_warps == 64
    assert b580.dpas.n == 16 and b580.dpas.k["bf16"] == 16
    assert b580.block_io.supported and b580.block_io.max_load_height == 32
    assert b580.min_dot.n == 16
    fact = b580.fact("peak_tflops.fp16")
    assert fact.sources == ("ixb-gpu-info",) and fact.confidence == "verified"
    assert b580.fact("has_fp64").confidence == "unverified"
    assert b580.default_option("num_stages") == 2 and b580.default_option("threads_per_warp") == 32


def test_unknown_and_unverified_facts_are_visible() -> None:
    kb = load_kb()
    assert kb.devices["arc-pro-b70"].l2_bytes is None  # not known yet: absent, never invented
    assert kb.devices["arc-pro-b70"].fact("peak_tflops.fp16").confidence == "derived"
    assert kb.devices["cpu-interpreter"].peak_flops("fp32") is None
    assert kb.devices["arc-a770"].has_fp64 is False
    assert kb.devices["h200"].peak_flops("bf16") == pytest.approx(989e12)
    assert kb.devices["h200"].bandwidth_bytes_per_s == pytest.approx(4.8e12)


@pytest.mark.parametrize(
    "props, expected",
    [
        ({"backend": "xpu", "name": "Intel(R) Arc(TM) B580 Graphics"}, "arc-b580"),
        ({"backend": "xpu", "name": "Intel(R) Arc(TM) B570 Graphics", "cores": 18}, "arc-b570"),
        ({"backend": "xpu", "name": "Intel(R) Arc(TM) Pro B70 Graphics"}, "arc-pro-b70"),
        ({"backend": "xpu", "name": "Intel(R) Data Center GPU Max 1550", "device_id": "0xBD5"}, "max-1550"),
        ({"backend": "xpu", "name": "Intel(R) Arc(TM) A770 Graphics"}, "arc-a770"),
        ({"backend": "xpu", "name": "Intel(R) Graphics [0xe20b]", "device_id": 0xE20B, "cores": 20}, "arc-b580"),
        ({"backend": "cuda", "name": "NVIDIA H200", "architecture": "9.0", "cores": 132}, "h200"),
        ({"backend": "cuda", "name": "NVIDIA H100 80GB HBM3", "cores": 132}, "h100"),
        ({"backend": "cpu", "name": "cpu"}, "cpu-interpreter"),
        ({"backend": "cpu", "name": "x86_64"}, "cpu-interpreter"),
    ],
)
def test_match_device(props: dict, expected: str) -> None:
    found = load_kb().match_device(props)
    assert found is not None and found.id == expected


@pytest.mark.parametrize(
    "props",
    [
        {"backend": "cuda", "name": "NVIDIA A100-SXM4-80GB"},  # not in the base
        {"backend": "cuda", "name": "NVIDIA H100 PCIe", "cores": 114},  # name matches, core count contradicts
        {"backend": "xpu", "name": "Intel(R) Graphics", "architecture": "bmg_g21"},  # B580 or B570: ambiguous
        {"backend": "cuda", "name": "Intel(R) Arc(TM) B580 Graphics"},  # wrong backend
    ],
)
def test_match_device_refuses_unknown_or_ambiguous(props: dict) -> None:
    assert load_kb().match_device(props) is None


# -- explain -----------------------------------------------------------------------------------------
def test_explain_every_entry() -> None:
    kb = load_kb()
    for entry_id in kb.all_ids():
        text = kb.explain(entry_id)
        assert entry_id in text.splitlines()[0]


def test_explain_constraint_names_rule_fix_sources_and_location() -> None:
    text = load_kb().explain("xpu-grf-mode-values")
    assert "constraints/xpu.yaml:" in text
    assert "'default', '128', '256', 'auto'" in text
    assert "fix:" in text and "ixb-pr-5430" in text and "github.com" in text


def test_explain_unknown_id_suggests() -> None:
    with pytest.raises(KnowledgeBaseError) as info:
        load_kb().explain("xpu-grf-mode-value")
    assert "xpu-grf-mode-values" in info.value.fix
