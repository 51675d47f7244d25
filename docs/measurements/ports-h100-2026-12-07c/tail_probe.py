"""Probe: gemm_square's port (H100, 2026-12-07) against its tail split and its split-K sized per call, do_bench."""
import importlib.util, json, sys, os
import torch, triton
from triton.testing import do_bench
def load(path):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m.Model().cuda()
mods = {k: load(f".gpucall/tail/square_{k}.py") for k in ("port", "tail", "splitk")}
out = []
for (M, K, N) in [(3000, 4096, 3000), (16, 4096, 4096), (4096, 4096, 4096), (2000, 4096, 2000), (1000, 4096, 1000)]:
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16); b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    ref = (a.float() @ b.float())
    row = {"shape": [M, K, N]}
    row["cublas"] = do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    for k, m in mods.items():
        c = m(a, b)
        err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
        ms = [do_bench(lambda: m(a, b), warmup=50, rep=300, return_mode="median") for _ in range(3)]
        row[k] = {"ms": sorted(ms), "err": err}
    print(json.dumps(row), flush=True)
    out.append(row)
json.dump(out, open(os.environ.get("OUT", ".") + "/tail_probe.json", "w"), indent=1)
