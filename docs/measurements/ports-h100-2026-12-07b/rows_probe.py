"""Probe (not gate 3): gemv_decode's rows copies at B = 8, K = N = 8192 bf16 on this card, against torch.mm (cuBLAS),
by triton.testing.do_bench (L2 cleared between calls, median)."""
import importlib.util
import json
import os
import sys
import tempfile

import torch
import triton

sys.path.insert(0, os.getcwd())
from xeforge.rewrite.device_tuning.shared_rows import rows_branch  # noqa: E402
from xeforge.rewrite.tiling.dispatch import Branch, dispatch  # noqa: E402

src = open("kernels/gemv_decode/kernel.py").read()
rows_out = []
x = torch.randn(8, 8192, device="cuda", dtype=torch.bfloat16)
w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) / 90
ref = x @ w.T
t_mm = triton.testing.do_bench(lambda: x @ w.T, warmup=50, rep=300, return_mode="median")
rows_out.append({"kind": "torch.mm", "ms": t_mm})
print("torch.mm", round(t_mm, 4), file=sys.stderr)
for R in (8, 4):
    for bn, bk in ((16, 256), (8, 512), (32, 128), (32, 256), (64, 128)):
        for nw in (4, 8):
            for ns in (2,):
                cfg = {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": nw, "num_stages": ns}
                try:
                    text = rows_branch(dispatch(src, "gemv_kernel", [Branch("B > 2", cfg)]), src, "gemv_kernel",
                                       "B > 2", 1, R)
                    fd, path = tempfile.mkstemp(suffix=".py")
                    os.write(fd, text.encode()); os.close(fd)
                    spec = importlib.util.spec_from_file_location(f"m{R}{bn}{bk}{nw}{ns}", path)
                    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
                    model = m.Model(8192, 8192).cuda().to(torch.bfloat16)
                    model.proj.weight.data.copy_(w)
                    y = model(x)
                    err = (y.float() - ref.float()).abs().max().item()
                    t = triton.testing.do_bench(lambda: model(x), warmup=50, rep=300, return_mode="median")
                    rows_out.append({"rows": R, **cfg, "ms": t, "vs_mm": t_mm / t, "err": err})
                    print(R, bn, bk, nw, ns, round(t, 4), round(t_mm / t, 3), round(err, 4), file=sys.stderr)
                except Exception as exc:  # noqa: BLE001
                    rows_out.append({"rows": R, **cfg, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
                    print(R, bn, bk, nw, ns, "ERROR", type(exc).__name__, str(exc)[:100], file=sys.stderr)
with open(os.path.join(os.environ.get("OUT", "."), "rows_probe.json"), "w") as fh:
    json.dump(rows_out, fh, indent=1)
