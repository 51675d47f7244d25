"""The same three gelu_residual computations under two timers (run from the repository root on the GPU machine,
``PYTHONPATH=.``).

``do_bench`` (L2 cleared with one write, events around the call) against the bench's gate-3 timer (the L2-flush write
repeated until the device is still busy when the host has issued the call, so host time is not timed): the port's
final kernel of call 4 (``gelu_final_call4.py``, the epilogue halves in a tile loop), torch.compile of the
reference, and the probe's kernel with the same schedule (``scripts/gemm_epilogue_probe.py``). 2048 x 4096 x 4096
bf16; one JSON line per (computation, timer).
"""
import json

import torch
import triton
from triton.testing import do_bench

from probe_models import HERE, STYLES, K, M, N, dev, load, probe

gate3 = probe.gate3
torch.manual_seed(0)
x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
r = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
final = load(f"{HERE}/gelu_final_call4.py", "final").Model(K, N).to(dev, torch.bfloat16)
ref = load(f"{STYLES}/reference.py", "ref").Model(K, N).to(dev, torch.bfloat16)
compiled = torch.compile(ref)
wt = final.proj.weight.detach()
bias = final.proj.bias.detach()
c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
part = torch.empty(1, device=dev)
sms = torch.cuda.get_device_properties(dev).multi_processor_count
grid = (min(sms, triton.cdiv(M, 128) * triton.cdiv(N, 256)),)


def probe_kernel():
    probe._gemm[grid](x, wt, bias, r, c, part, M, N, K, BM=128, BN=256, BK=64, GROUP_M=8, EPI=probe.GELU_RES,
                      FLATTEN=False, WS=False, PREFETCH=False, SUBTILE=True, PTR_STORE=False, num_warps=8,
                      num_stages=3)


with torch.no_grad():
    for name, fn in (("port final (call 4)", lambda: final(x, r)), ("torch.compile", lambda: compiled(x, r)),
                     ("probe kernel", probe_kernel), ("port final again", lambda: final(x, r))):
        fn(); torch.cuda.synchronize()
        g3, host = gate3(fn)
        print(json.dumps({"case": name, "do_bench_ms": round(do_bench(fn), 5), "gate3_ms": round(g3, 5),
                          "host_ms": round(host, 4)}), flush=True)
