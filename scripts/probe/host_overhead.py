"""Host overhead of a ported forward on a GPU: wall time per call back to back, vs the kernels' device time.

Usage: python scripts/probe/host_overhead.py KERNEL.py [M K N]. Prints, per variant of the file's host code,
the wall time per call (host-bound when it exceeds the device time) and the device time from torch.profiler.
Variants: as written; triton.set_allocator called once up front instead of in forward.
"""
import importlib.util, sys, time, re, pathlib, tempfile
import torch, triton

path = pathlib.Path(sys.argv[1])
M, K, N = (int(a) for a in sys.argv[2:5]) if len(sys.argv) >= 5 else (1024, 4096, 4096)


def load(src, tag):
    f = pathlib.Path(tempfile.mkdtemp()) / f"{tag}.py"
    f.write_text(src)
    spec = importlib.util.spec_from_file_location(tag, f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measure(mod, label):
    torch.manual_seed(0)
    model = mod.Model(K, N).cuda().to(torch.bfloat16)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):
        model(x)
    torch.cuda.synchronize()
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        model(x)
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / n * 1e3
    t0 = time.perf_counter()
    for _ in range(n):
        model(x)
    host = (time.perf_counter() - t0) / n * 1e3  # enqueue only (no sync): the host's own time per call
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(50):
            model(x)
        torch.cuda.synchronize()
    dev = sum(e.device_time_total for e in prof.key_averages()) / 50 / 1e3
    print(f"{label:40s} wall {wall:.4f} ms/call  host enqueue {host:.4f} ms/call  device {dev:.4f} ms/call")


src = path.read_text()
measure(load(src, "as_written"), f"{path.name} as written")
once = re.sub(r"\n\s*if use_block_io and x.device.type == \"cuda\":\n(\s*#.*\n)?\s*triton.set_allocator\(.*\)\n", "\n", src)
if once != src:
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    measure(load(once, "allocator_once"), f"{path.name} set_allocator once")
