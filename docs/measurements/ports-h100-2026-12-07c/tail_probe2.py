"""Probe: is gemm_square's port at 3000 x 4096 x 3000 slow for its partial last wave (tail split) or for its row
pitch (6000 B, not a multiple of 128)? do_bench medians, three repeats each."""
import importlib.util, json, os
import torch
from triton.testing import do_bench
def load(path):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m.Model().cuda()
mods = {k: load(f".gpucall/tail/square_{k}.py") for k in ("port", "tail", "port_padc", "tail_padc")}
out = []
for (M, K, N) in [(3000, 4096, 3000), (3072, 4096, 3072), (4096, 4096, 4096), (16, 4096, 4096)]:
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    for padb in (False, True):
        if padb and N % 128 == 0:
            continue
        pitch = (N + 127) // 128 * 128 if padb else N
        b = torch.randn(K, pitch, device="cuda", dtype=torch.bfloat16)[:, :N]
        ref = a.float() @ b.float()
        row = {"shape": [M, K, N], "b_pitch": pitch, "cublas": do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median")}
        for k, m in mods.items():
            try:
                c = m(a, b)
                err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
                row[k] = {"ms": sorted(do_bench(lambda: m(a, b), warmup=25, rep=200, return_mode="median") for _ in range(3)), "err": round(err, 5)}
            except Exception as exc:
                row[k] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
        print(json.dumps(row), flush=True)
        out.append(row)
json.dump(out, open(os.environ.get("OUT", ".") + "/tail_probe2.json", "w"), indent=1)
