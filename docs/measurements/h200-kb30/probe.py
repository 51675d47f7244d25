"""kb30 on the H200: the fusion stage's GroupNorm kernel after the dtype stage's GEMM (128 x 256 x 64, 8 warps,
3 stages), with the GEMM's output buffer in fp32 ('wide', adopted in the fifth session) and in bf16 ('narrow',
rejected there at 1.424x against 1.733x). Whole forward under do_bench and each kernel under torch.profiler.
Run from the repository root on the GPU machine: python3 docs/measurements/h200-kb30/probe.py > OUT.jsonl"""
import importlib.util, json, pathlib, sys
import torch
from triton.testing import do_bench

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parents[2]


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ref = load(ROOT / "kernels/kb30_gemm_groupnorm_hardtanh/reference.py", "ref")
variants = {v: load(HERE / f"kb30_gn_{v}.py", f"kb30_{v}") for v in ("wide", "narrow")}
extra = [a for a in sys.argv[1:]]
for a in extra:
    variants[pathlib.Path(a).stem] = load(a, pathlib.Path(a).stem)
for M in (1024, 16, 1000):
    K = N = 8192
    G = 16
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    r = ref.Model(K, N, G, -2.0, 2.0).cuda().to(torch.bfloat16)
    models = {"torch.compile": torch.compile(r)}
    for v, mod in variants.items():
        m = mod.Model(K, N, G, -2.0, 2.0).cuda().to(torch.bfloat16)
        m.load_state_dict(r.state_dict())
        models[v] = m
    with torch.no_grad():
        want = r(x).float()
        for name, m in models.items():
            got = m(x).float()
            err = (got - want).abs().max().item()
            ms = [do_bench(lambda: m(x), warmup=50, rep=300) for _ in range(3)]
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    m(x)
                torch.cuda.synchronize()
            kern = {}
            for e in prof.key_averages():
                if e.device_type == torch.autograd.DeviceType.CUDA and e.count:
                    kern[e.key[:60]] = round(e.device_time_total / e.count / 1000, 4)
            print(json.dumps({"M": M, "model": name, "ms": [round(t, 4) for t in ms], "max_err": err,
                              "kernels_ms": kern}), flush=True)
