"""Probe: gemm_tall_k's port (call D, 2026-12-07) at 1000 x 65536 x 1000 with B as given (rows 2000 B apart) and the
same B in rows 2048 B apart, against 1024 x 65536 x 1024 and cuBLAS; do_bench medians of three repeats."""
import importlib.util, json, os
import torch
from triton.testing import do_bench
spec = importlib.util.spec_from_file_location("tk", os.path.join(os.path.dirname(os.path.abspath(__file__)), "tallk_port.py"))
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); m = mod.Model().cuda()
out = []
for (M, K, N, pitch) in [(1000, 65536, 1000, 1000), (1000, 65536, 1000, 1024), (1024, 65536, 1024, 1024)]:
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, pitch, device="cuda", dtype=torch.bfloat16)[:, :N]
    ref = a.float() @ b.float()
    c = m(a, b)
    row = {"shape": [M, K, N], "b_pitch": pitch, "err": float(((c.float() - ref).abs().max() / ref.abs().max())),
           "cublas": do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median"),
           "port": sorted(do_bench(lambda: m(a, b), warmup=25, rep=200, return_mode="median") for _ in range(3))}
    print(json.dumps(row), flush=True)
    out.append(row)
json.dump(out, open(os.environ.get("OUT", ".") + "/tallk_probe.json", "w"), indent=1)
