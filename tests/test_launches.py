"""What a launch passes, read the same way in every style (xeforge/analysis/launches.py).

Small sources, no worker: the static reading (literal, module constant, a literal assigned in the launching
function, tuple unpacking), values observed in traces (one value at every shape, or one per shape), autotuned
constexprs, and which constexprs are block sizes although not named like one.
"""

from __future__ import annotations

from xeforge.analysis import launches
from xeforge.analysis.trace import Trace
from xeforge.kernel_model import parse_kernel
from xeforge.rewrite.tiling.configs import apply_config, tunable_names

KERNEL = '''import triton
import triton.language as tl

BLOCK = 32


@triton.jit
def k(x_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr, EPS: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.arange(0, BN)
    tl.store(x_ptr + rm[:, None] * N + rn[None, :], EPS, mask=(rm[:, None] < M) & (rn[None, :] < N))
'''


def _model(host: str):
    return parse_kernel(KERNEL + "\n\n" + host)


def _trace(variant: str, values: dict, line: int) -> Trace:
    args = {name: {"kind": "scalar", "value": v} for name, v in values.items()}
    event = {"event": "launch", "kernel": "k", "stack": [{"function": "f", "line": line, "kind": "function"}],
             "args": args, "constexprs": list(values), "options": {}, "grid": [1]}
    return Trace.from_json(variant, {"events": [event], "returns": [], "params": {}, "inputs": []})


def test_block_sizes_are_found_by_use_not_by_name():
    m = _model("def f(x, M, N):\n    k[(triton.cdiv(M, 16),)](x, M, N, BM=16, BN=64, EPS=1e-5)\n")
    assert launches.block_params(m.functions["k"]) == {"BM", "BN"}  # EPS is a constexpr, not a tile extent


def test_static_values_literal_module_constant_local_and_unpacking():
    m = _model("def f(x, M, N):\n    bm, bn = 16, 64\n    k[(triton.cdiv(M, bm),)](x, M, N, BM=bm, BN=BLOCK, EPS=1e-5)\n")
    b = launches.bindings(m, m.launches[0])
    assert (b["BM"].value, b["BM"].how, b["BM"].expr) == (16, "expression", "bm")
    assert (b["BN"].value, b["BN"].how) == (32, "expression")
    assert (b["EPS"].value, b["EPS"].how) == (1e-5, "literal")
    assert tunable_names(m, m.launches[0])[0] == ["BM", "BN"]


def test_a_constexpr_passed_positionally_is_named_as_such_not_as_missing():
    m = _model("def f(x, M, N):\n    bm, bn = 64, 32\n    k[(triton.cdiv(M, bm),)](x, M, N, bm, bn, 1e-5)\n")
    b = launches.bindings(m, m.launches[0])
    assert b["BM"].how == "positional" and b["BM"].expr == "bm"
    assert f"passed positionally at line {m.launches[0].line} (argument 4: bm)" in b["BM"].why and "pass it as BM=bm" in b["BM"].why
    assert "not passed" not in b["BN"].why


def test_a_value_only_a_trace_knows_is_constant_when_every_variant_agrees():
    host = "def f(x, M, N, cfg):\n    k[(triton.cdiv(M, cfg.bm),)](x, M, N, BM=cfg.bm, BN=cfg.bn, EPS=1e-5)\n"
    m = _model(host)
    site = m.launches[0]
    assert launches.bindings(m, site)["BM"].value is None  # not known before a trace
    launches.forget(m.source)
    try:
        for variant, bn in (("ci", 64), ("bench-gpu", 256)):
            launches.remember(m.source, _trace(variant, {"BM": 16, "BN": bn, "EPS": 1e-5}, site.line))
        b = launches.bindings(m, site)
        assert b["BM"].constant and b["BM"].value == 16 and "every traced variant" in b["BM"].why
        assert not b["BN"].constant and "changes with the shape" in b["BN"].why and "256 at bench-gpu" in b["BN"].why
        names, why = tunable_names(m, site)
        assert names == ["BM"] and "changes with the shape" in why["BN"]
        out = apply_config(m.source, "k", {"BM": 64})
        assert "triton.cdiv(M, 64)" in out and "BM=64" in out and "BN=cfg.bn" in out
        assert launches.live_kernels(m) == {"k"}
    finally:
        launches.forget(m.source)


def test_autotuned_constexprs_say_so():
    src = KERNEL.replace("@triton.jit", "@triton.autotune(configs=[triton.Config({'BM': 16})], key=['M'])\n@triton.jit")
    m = parse_kernel(src + "\n\ndef f(x, M, N):\n    k[lambda META: (triton.cdiv(M, META['BM']),)](x, M, N, BN=64, EPS=0.0)\n")
    b = launches.bindings(m, m.launches[0])
    assert b["BM"].how == "autotune" and not b["BM"].constant
    assert launches.autotune_configs(m, "k") == [{"BM": 16}]


def test_an_expression_read_elsewhere_is_not_replaced():
    m = _model("def f(x, M, N):\n    bm = 16\n    y = x.new_empty(bm)\n"
               "    k[(triton.cdiv(M, bm),)](x, M, N, BM=bm, BN=64, EPS=0.0)\n")
    names, why = tunable_names(m, m.launches[0])
    assert "BM" not in names and "also read at line" in why["BM"]
