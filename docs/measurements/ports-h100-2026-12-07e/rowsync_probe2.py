"""Probe (second): the row sync, reading only its row's used slots and spinning on plain loads, not flattened, with and without the cooperative launch (the split row reduction finished in the persistent GEMM, tiles of a row waiting for each
other under a cooperative launch) against the same port's two passes, centred (call T's final kernel) and
softmax-numerator (call G's), at 4096^3 and M = 16 (K = N = 4096), bf16; against torch.compile of the reference and
cuBLAS's GEMM; max abs error against the fp32 reference; do_bench medians, three repeats."""
import importlib.util, json, os, sys, traceback
import torch
from triton.testing import do_bench

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m

out = []
for case, files, ref in [("centred", ["centred_T", "centred_T_sync2", "centred_T_sync2_nocoop"], "centred_ref"),
                         ("softmax-numerator", ["softmax_G", "softmax_G_sync2", "softmax_G_sync2_nocoop"], "softmax_ref")]:
    R = load(f".gpucall/rowsync/{ref}.py", ref)
    for M in (4096, 16):
        torch.manual_seed(0)
        ref_m = R.Model(4096, 4096).cuda()
        x = torch.randn(M, 4096, device="cuda", dtype=torch.bfloat16)
        row = {"case": case, "M": M}
        with torch.no_grad():
            want = ref_m.float()(x.float())
            refb = R.Model(4096, 4096).cuda().to(torch.bfloat16); refb.load_state_dict(ref_m.state_dict())
            comp = torch.compile(refb)
            comp(x)
            row["torch.compile"] = sorted(do_bench(lambda: comp(x), warmup=25, rep=200, return_mode="median") for _ in range(3))
            w = refb.weight
            row["cublas"] = sorted(do_bench(lambda: x @ w.t(), warmup=25, rep=200, return_mode="median") for _ in range(3))
            for f in files:
                try:
                    path = f".gpucall/rowsync/{f}.py"
                    if f.endswith("_nocoop"):  # the synchronised kernel launched without the cooperative flag
                        text = open(path.replace("_nocoop", "")).read()
                        path = f"/tmp/{f}.py"
                        open(path, "w").write(text.replace('launch_cooperative_grid=y.device.type == "cuda"',
                                                           "launch_cooperative_grid=False"))
                    K = load(path, f)
                    km = K.Model(4096, 4096).cuda().to(torch.bfloat16); km.load_state_dict(refb.state_dict())
                    got = km(x); torch.cuda.synchronize()
                    got2 = km(x); torch.cuda.synchronize()
                    row[f] = {"err": float((got.float() - want).abs().max()), "rerun_equal": bool(torch.equal(got, got2)),
                              "ms": sorted(do_bench(lambda: km(x), warmup=25, rep=200, return_mode="median") for _ in range(3))}
                except Exception as exc:
                    row[f] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
                    traceback.print_exc()
        print(json.dumps(row), flush=True)
        out.append(row)
json.dump(out, open(os.environ.get("OUT", ".") + "/rowsync_probe2.json", "w"), indent=1)
