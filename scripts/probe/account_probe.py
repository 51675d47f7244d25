"""Probe (H200): what torch.profiler's device activity shows of one call, for the run-time account (issue 31).

Prints, per case, every event with its device type, thread, CPU parent chain and linked correlation, so that the
account's classification (Triton kernel, a kernel an allocation made, the autotuner's own, anything else) is read off
the real profiler rather than assumed. Not part of the tool; its output is recorded in docs/measurements.
"""
import threading
import time

import torch
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile, record_function

try:
    from torch.profiler import _ExperimentalConfig
    CFG = dict(experimental_config=_ExperimentalConfig(profile_all_threads=True))
except (ImportError, TypeError):
    CFG = {}


@triton.jit
def add_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1, mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 1024})], key=["n"])
@triton.jit
def tuned_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2, mask=m)


def show(prof, title):
    print(f"== {title}")
    for e in prof.events():
        chain = []
        p = e.cpu_parent
        while p is not None:
            chain.append(p.name)
            p = p.cpu_parent
        print(f"  {str(e.device_type):18} t={e.thread:<4} {e.name[:90]:90} parents={chain[:4]} "
              f"kernels={[k.name[:40] for k in getattr(e, 'kernels', [])][:3]}")
    kr = prof.profiler.kineto_results
    for k in kr.events():
        print(f"    kineto {str(k.device_type()):18} corr={k.correlation_id():<6} linked={k.linked_correlation_id():<6} "
              f"tid={k.start_thread_id():<6} {k.name()[:80]}")


x = torch.randn(1 << 20, device="cuda")
y = torch.empty_like(x)
a = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
torch.cuda.synchronize()

def case(title, fn):
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], **CFG) as prof:
        with record_function("xf.call"):
            fn()
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    show(prof, title)
    print(f"  profile wall {t1 - t0:.4f} s")

def triton_launch():
    with record_function("xf.launch"):
        add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)

def tuned_launch():
    with record_function("xf.launch"):
        tuned_kernel[lambda META: (triton.cdiv(x.numel(), META["BLOCK"]),)](x, y, x.numel())

def hidden_mm():
    n = torch._C._len_torch_function_stack()
    c = torch.zeros(512, 512, device="cuda", dtype=torch.bfloat16)
    r = torch.mm(a, a)
    c.copy_(r)
    d = r.relu()

def thread_mm():
    out = []
    t = threading.Thread(target=lambda: out.append(torch.mm(a, a)))
    t.start(); t.join()

case("triton", triton_launch)
case("autotuned first call", tuned_launch)
case("hidden mm + zeros + copy + relu", hidden_mm)
case("mm on a thread", thread_mm)
case("triton again", triton_launch)
print(torch.__version__, triton.__version__, torch.cuda.get_device_name())
