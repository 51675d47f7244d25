#!/usr/bin/env python3
"""The split row reduction's read-back (issue 33's ``centred`` case) with the combine kernel's rows a program as
generated before and after 2026-12-06: a quick probe, not gate 3's method.

Usage (repo root):
    python scripts/combine_probe.py write DIR   # where xeforge is set up (CPU): the three files below
    python scripts/combine_probe.py bench DIR   # on the GPU (torch and Triton only): DIR/combine.json, a line a shape

Files, all with the GEMM tile the H100 port of 2026-12-06 settled on (128 x 128 x 64, 4 warps, 4 stages):
``unfused`` (the start's GEMM, then torch's mean and subtraction), ``fused16`` (the fusion stage's candidate with the
combine kernel's old sizing: 16 rows a program at N = 4096, 256 programs at M = 4096) and ``fused`` (the current
sizing: at least 1024 programs where M allows). Each figure is the median of ``triton.testing.do_bench`` over the whole
``Model.forward`` in bf16 (no L2 flush, host time included).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TILE = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 4}
SHAPES = [(4096, 4096, 4096), (16, 4096, 4096)]  # (M, K, N)


def write(out: Path) -> None:
    from stages.fusion import STAGE
    from tests.conftest import tactic_context
    from tests.test_fusion_graph import SPLIT_READ_BACK, _problem  # the case: the test's
    from xeforge.rewrite.tiling.configs import apply_config

    out.mkdir(parents=True, exist_ok=True)
    d = out / "centred"
    d.mkdir(exist_ok=True)
    p = _problem(d, SPLIT_READ_BACK["centred"][0], "wrapper")
    tactic = next(t for t in STAGE.tactics if t.name == "fuse-split-row-reduction")
    cand = tactic.propose(tactic_context(p))[0].source
    (out / "unfused.py").write_text(apply_config(p.kernel_source, "_mm_bias", TILE))
    fused = apply_config(cand, "_mm_bias", TILE)
    (out / "fused.py").write_text(fused)
    line = next(ln for ln in fused.splitlines() if "combine_rows = " in ln)
    old = line.split("=")[0] + "= max(1, 4096 // combine_slots)"
    (out / "fused16.py").write_text(fused.replace(line, old))
    print(f"wrote unfused.py, fused16.py, fused.py to {out}", file=sys.stderr)


def bench(folder: Path) -> None:
    import torch
    import triton

    dev = torch.device("cuda")
    rows = []
    for m, k, n in SHAPES:
        row = {"shape": [m, k, n]}
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        ref = None
        for name in ("unfused", "fused16", "fused"):
            spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            torch.manual_seed(0)
            model = mod.Model(k, n).to(dev, torch.bfloat16)
            with torch.no_grad():
                y = model(x).float()
                ref = y if ref is None else ref
                ms = triton.testing.do_bench(lambda: model(x), warmup=25, rep=200, return_mode="median")
            row[name] = {"ms": round(ms, 4), "maxdiff": (y - ref).abs().max().item()}
        print((m, k, n), {f: row[f]["ms"] for f in ("unfused", "fused16", "fused")}, flush=True)
        rows.append(row)
    meta = {"torch": torch.__version__, "triton": triton.__version__, "device": torch.cuda.get_device_name()}
    (folder / "combine.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(meta)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("write", "bench"):
        sys.exit(__doc__)
    (write if sys.argv[1] == "write" else bench)(Path(sys.argv[2]))
