"""Probe: gemm_tall_k's split-K port at 1000 x 65536 x 1000 with 128 x 256 tiles (as ported) and 256 x 128 (half of
B's share of each tile's loads), B's rows 2000 and 2048 bytes apart; do_bench medians, two repeats."""
import importlib.util, json, os
import torch
from triton.testing import do_bench
mods = {}
for k in ("tallk_port", "tallk_port_256"):
    spec = importlib.util.spec_from_file_location(k, f".gpucall/tallk/{k}.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); mods[k] = m.Model().cuda()
out = []
for pitch in (1000, 1024):
    a = torch.randn(1000, 65536, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(65536, pitch, device="cuda", dtype=torch.bfloat16)[:, :1000]
    ref = a.float() @ b.float()
    row = {"b_pitch": pitch, "cublas": do_bench(lambda: a @ b, warmup=25, rep=100, return_mode="median")}
    for k, m in mods.items():
        c = m(a, b)
        row[k] = {"err": float((c.float() - ref).abs().max() / ref.abs().max()),
                  "ms": sorted(do_bench(lambda: m(a, b), warmup=25, rep=100, return_mode="median") for _ in range(2))}
    print(json.dumps(row), flush=True)
    out.append(row)
json.dump(out, open(os.environ.get("OUT", ".") + "/tallk_aspect.json", "w"), indent=1)
