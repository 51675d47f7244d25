import importlib.util, json, sys, torch, triton
from triton.testing import do_bench
dev = torch.device("cuda")
def load(p):
    spec = importlib.util.spec_from_file_location(p.replace("/", "_").replace(".", "_"), p)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m
for p in sys.argv[1:]:
    mod = load(p)
    torch.manual_seed(0)
    M = 1024 if "relu" in p else 2048
    model = mod.Model(4096, 4096).to(dev, torch.bfloat16)
    x = torch.randn(M, 4096, device=dev, dtype=torch.bfloat16)
    args = (x,) if "relu" in p else (x, torch.randn(M, 4096, device=dev, dtype=torch.bfloat16))
    try:
        out = model(*args); torch.cuda.synchronize()
        ms = do_bench(lambda: model(*args))
        print(json.dumps({"file": p, "M": M, "ms": round(ms, 5), "tflops": round(2*M*4096*4096/ms/1e9, 1)}), flush=True)
    except Exception as e:
        print(json.dumps({"file": p, "error": f"{type(e).__name__}: {str(e)[:200]}"}), flush=True)
w = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
for M in (1024, 2048):
    x = torch.randn(M, 4096, device=dev, dtype=torch.bfloat16)
    print(json.dumps({"file": "torch.mm", "M": M, "ms": round(do_bench(lambda: x @ w.t()), 5)}))
sys.path.insert(0, "../scripts")
import gemm_layout_probe as g
triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
for M in (1024,):
    a = torch.randn(M, 4096, device=dev, dtype=torch.bfloat16); c = torch.empty(M, 4096, device=dev, dtype=torch.bfloat16)
    run = lambda: g._gemm[(triton.cdiv(M, 128) * 16,)](a, w, c, M, 4096, 4096, BM=128, BN=256, BK=64, GROUP_M=8, B_NK=True,
        PERSISTENT=False, FLATTEN=False, WS=False, RELU=False, num_warps=8, num_stages=3)
    run(); print(json.dumps({"file": "probe _gemm NK nonpersistent", "M": M, "ms": round(do_bench(run), 5)}))
# compiler facts of every kernel compiled above
import gc
for obj in gc.get_objects():
    if isinstance(obj, triton.runtime.jit.JITFunction):
        for dev_cache in getattr(obj, "device_caches", {}).values():
            for key, k in dev_cache[0].items():
                ptx = k.asm.get("ptx", "")
                print(json.dumps({"kernel": obj.fn.__module__ + "." + obj.fn.__name__, "regs": k.n_regs, "spills": k.n_spills,
                                  "shared": k.metadata.shared, "tma_loads": ptx.count("cp.async.bulk.tensor"),
                                  "wgmma": ptx.count("wgmma.mma_async"), "wgmma_wait": ptx.count("wgmma.wait_group"),
                                  "mbarrier_wait": ptx.count("mbarrier.try_wait")}))
