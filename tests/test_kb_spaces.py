"""Tuning spaces: the tuner draws only configurations the constraints allow, for every device and family."""

from __future__ import annotations

from pathlib import Path

import pytest

from xeforge.errors import KnowledgeBaseError
from xeforge.kb import FAMILIES, TritonInfo, TuningSpace, load_kb
from xeforge.kb.loader import load_paths
from xeforge.kb.render import space_lines
from xeforge.kernel_model import parse_kernel

KERNELS = Path(__file__).parent / "fixtures" / "kb" / "kernels"

NAMES = {
    "gemm": ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_SIZE_M"],
    "gemv": ["BLOCK_N", "BLOCK_K"],
    "attention": ["BLOCK_M", "BLOCK_N", "HEAD_DIM"],
    "reduction": ["BLOCK_SIZE"],
    "elementwise": ["BLOCK_SIZE"],
}
FIXED = {"attention": {"HEAD_DIM": 64}}


def _versions(backend: str) -> list[TritonInfo]:
    if backend == "xpu":
        return [TritonInfo.parse(v, is_xpu=True) for v in ("3.5.0", "3.6.0", "3.7.2", "3.8.0")]
    return [TritonInfo.parse(v) for v in ("3.7.0", "3.8.0", "3.9.0")]


def _cases() -> list[tuple[str, str, TritonInfo]]:
    kb = load_kb()
    return [(d.id, fam, t) for d in kb.devices.values() for fam in FAMILIES for t in _versions(d.backend)]


@pytest.mark.parametrize("device, family, triton", _cases(), ids=lambda x: str(x).replace(" ", "-"))
def test_every_generated_configuration_passes_check_config(device: str, family: str, triton: TritonInfo) -> None:
    kb = load_kb()
    space = kb.space(device, family, triton)
    assert isinstance(space, TuningSpace) and space.family == family and space.device_id == device
    configs = list(space.configs(NAMES[family], fixed=FIXED.get(family)))
    assert configs, f"{space.id} yields nothing for {device} under {triton}"
    assert len({tuple(sorted(c.items())) for c in configs}) == len(configs)  # no duplicates
    for cfg in configs:
        probe = {**FIXED.get(family, {}), **cfg}
        bad = [v for v in kb.check_config(probe, device, triton, family=family) if v.is_error]
        assert not bad, (cfg, [v.message for v in bad])
        assert set(cfg) <= set(NAMES[family]) | {"num_warps", "num_stages", "grf_mode", "warp_size",
                                                   "threads_per_warp"}


@pytest.mark.parametrize("device", ["arc-b580", "max-1550", "arc-a770", "h200", "cpu-interpreter"])
def test_gemm_configs_pass_gate_1_against_a_real_kernel(device: str) -> None:
    kb = load_kb()
    source = (KERNELS / "xpu-grf-mode-values" / "pass.py").read_text()
    model = parse_kernel(source)
    kernel = model.functions["matmul_kernel"]
    triton = _versions(kb.devices[device].backend)[1]
    space = kb.space(device, "gemm", triton)
    configs = list(space.configs(kernel.constexpr_params, kernel=kernel, functions=model.functions))
    assert configs
    for cfg in configs:
        assert not [v for v in kb.check_config(cfg, device, triton, kernel, functions=model.functions) if v.is_error]


def test_space_filters_forbidden_combinations() -> None:
    kb = load_kb()
    triton = TritonInfo.parse("3.6.0", is_xpu=True)
    space = kb.space("arc-b580", "gemm", triton)
    assert 64 in space.num_warps and "256" in space.grf_mode  # listed values ...
    configs = list(space.configs(NAMES["gemm"]))
    assert not [c for c in configs if c.get("num_warps") == 64 and c.get("grf_mode") == "256"]  # ... never combined
    assert [c for c in configs if c.get("num_warps") == 64 and c.get("grf_mode") == "128"]
    nvidia = list(kb.space("h200", "gemm", TritonInfo.parse("3.8.0")).configs(NAMES["gemm"]))
    assert not [c for c in nvidia if c["BLOCK_N"] == 256 and c["BLOCK_K"] == 128 and c.get("num_stages") == 4]


def test_seeds_come_first_and_follow_the_version() -> None:
    kb = load_kb()
    first36 = next(kb.space("arc-b580", "gemm", TritonInfo.parse("3.6.0", is_xpu=True)).configs(NAMES["gemm"]))
    assert first36 == {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_SIZE_M": 4, "num_warps": 32,
                       "num_stages": 2, "grf_mode": "256"}
    first35 = next(kb.space("arc-b580", "gemm", TritonInfo.parse("3.5.0", is_xpu=True)).configs(NAMES["gemm"]))
    assert first35["grf_mode"] == "large"


def test_configs_use_the_kernels_names_and_the_versions_option_spelling() -> None:
    kb = load_kb()
    names = ["BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "ACTIVATION"]
    cfg = next(kb.space("max-1550", "gemm", TritonInfo.parse("3.6.0", is_xpu=True)).configs(names, limit=1))
    assert {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M"} <= set(cfg)
    assert "ACTIVATION" not in cfg
    r35 = list(kb.space("arc-b580", "reduction", TritonInfo.parse("3.5.0", is_xpu=True)).configs(["BLOCK_SIZE"]))
    assert all("threads_per_warp" in c and "warp_size" not in c for c in r35)
    r36 = list(kb.space("arc-b580", "reduction", TritonInfo.parse("3.6.0", is_xpu=True)).configs(["BLOCK_SIZE"]))
    assert all("warp_size" in c and "threads_per_warp" not in c for c in r36)


def test_limit_and_unknown_family() -> None:
    kb = load_kb()
    triton = TritonInfo.parse("3.8.0")
    assert len(list(kb.space("h200", "gemm", triton).configs(NAMES["gemm"], limit=3))) == 3
    with pytest.raises(KnowledgeBaseError):
        kb.space("h200", "conv", triton)


def test_space_to_dict_names_its_source() -> None:
    d = load_kb().space("arc-b580", "gemm", TritonInfo.parse("3.6.0", is_xpu=True)).to_dict()
    assert d["id"] == "xpu-dpas-gemm" and d["source"] == ["ixb-gemm-benchmark"]
    assert d["values"]["grf_mode"] == ["256", "128"] and "spaces/xpu-dpas.yaml:" in d["where"]


def test_a_gemm_whose_tile_names_follow_no_convention_gets_its_roles_from_use() -> None:
    """``TM``, ``TN``, ``TK`` match no role pattern, so the space's seeds never reached them (the search only tried
    neighbours of the launch's tile). Their roles come from use: the accumulator ``tl.zeros((TM, TN))`` a
    ``tl.dot`` adds into, and the step of the loop around it. The KB's checks see them too: a tile the device's
    shared memory cannot hold is refused by name."""
    from xeforge.kb.kernel_facts import roles_by_use

    source = (Path(__file__).parent / "fixtures" / "tactics" / "block_io" / "inline_program_ids" /
              "kernel.py").read_text()
    kernel = parse_kernel(source).functions["gemm_bias"]
    assert roles_by_use(kernel) == {"TM": "block_m", "TN": "block_n", "TK": "block_k"}
    kb = load_kb()
    triton = TritonInfo.parse("3.8.0")
    first = next(kb.space("h200", "gemm", triton).configs(kernel.constexpr_params, kernel=kernel, dtype="bfloat16"))
    assert first == {"TM": 128, "TN": 256, "TK": 64, "num_warps": 8, "num_stages": 3}  # the hopper-gemm seed
    by_name = list(kb.space("h200", "gemm", triton).configs(kernel.constexpr_params))
    assert by_name and not [c for c in by_name if "TM" in c]  # by name alone: launch options, never a tile
    huge = {"TM": 256, "TN": 256, "TK": 128, "num_stages": 4, "num_warps": 8}
    assert [v for v in kb.check_config(huge, "h200", triton, kernel, dtype="bfloat16") if v.is_error]
    assert not [v for v in kb.check_config(first, "h200", triton, kernel, dtype="bfloat16") if v.is_error]


def test_a_class_of_few_rows_gets_the_space_for_few_rows_and_other_lookups_never_do() -> None:
    kb = load_kb()
    triton = TritonInfo.parse("3.8.0")
    general = kb.space("h200", "gemm", triton)
    assert general.max_rows is None
    few = kb.space("h200", "gemm", triton, rows=16)
    assert few.max_rows is not None and few.max_rows >= 16 and few.id != general.id
    # the tightest bound that holds the class: a class of 17-64 rows gets the space for up to 64
    wider = kb.space("h200", "gemm", triton, rows=few.max_rows + 1)
    assert wider.max_rows is not None and wider.max_rows > few.max_rows and wider.id not in (few.id, general.id)
    assert kb.space("h200", "gemm", triton, rows=1).id == few.id
    # `xeforge kb show` says which class a space is for
    assert f"(a class of at most {few.max_rows} rows)" in space_lines(few)[0]
    assert "rows)" not in space_lines(general)[0]
    # more rows than any space for few rows allows: the family's general space
    assert kb.space("h200", "gemm", triton, rows=wider.max_rows + 1).id == general.id
    # a device with no space for few rows: its general space
    xpu = TritonInfo.parse("3.6.0", is_xpu=True)
    assert kb.space("arc-a770", "gemm", xpu, rows=16).id == kb.space("arc-a770", "gemm", xpu).id


@pytest.mark.parametrize("device, triton", [("h200", TritonInfo.parse("3.8.0")), ("h100", TritonInfo.parse("3.6.0")),
                                            ("arc-b580", TritonInfo.parse("3.6.0", is_xpu=True)),
                                            ("max-1550", TritonInfo.parse("3.5.0", is_xpu=True))])
def test_every_configuration_for_few_rows_passes_check_config(device: str, triton: TritonInfo) -> None:
    kb = load_kb()
    for rows in (8, 64):
        few = kb.space(device, "gemm", triton, rows=rows)
        assert few.max_rows is not None and few.max_rows >= rows, f"{device} has no space for {rows} rows"
        configs = list(few.configs(NAMES["gemm"], dtype="bfloat16"))
        assert configs and configs[0]["BLOCK_M"] <= few.max_rows
        for cfg in configs:
            assert not [v for v in kb.check_config(cfg, device, triton, family="gemm") if v.is_error], cfg


def test_two_spaces_for_the_same_few_rows_are_an_overlap_but_one_beside_the_general_space_is_not(tmp_path) -> None:
    root = Path(__file__).parent.parent / "knowledge_base"
    paths = sorted(root.rglob("*.yaml"))
    kb, errors = load_paths(paths, root)
    assert not errors, [str(e) for e in errors]
    nvidia = (root / "spaces" / "nvidia.yaml").read_text()
    start = nvidia.index("  - id: hopper-gemm-few-rows")
    entry = nvidia[start:nvidia.index("\n\n", start)]
    extra = tmp_path / "more.yaml"
    extra.write_text("spaces:\n" + entry.replace("hopper-gemm-few-rows", "hopper-gemm-few-rows-again") + "\n")
    _, errors = load_paths([*paths, extra], root)
    assert any("hopper-gemm-few-rows-again" in str(e) and "both apply to gemm kernels" in str(e) for e in errors), \
        [str(e) for e in errors]
