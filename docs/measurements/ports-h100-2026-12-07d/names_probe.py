"""Probe: which kernels cuBLAS (torch's a @ b) launches at the suite's GEMM shapes (the names encode tile, cluster
and split choices)."""
import torch
from torch.profiler import profile, ProfilerActivity
for (M, K, N) in [(3000, 4096, 3000), (3072, 4096, 3072), (4096, 4096, 4096), (1000, 65536, 1000), (1024, 65536, 1024), (16, 65536, 1024), (16, 4096, 4096)]:
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16); b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    for _ in range(3): a @ b
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        a @ b; torch.cuda.synchronize()
    names = sorted({e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    print([M, K, N], names, flush=True)
