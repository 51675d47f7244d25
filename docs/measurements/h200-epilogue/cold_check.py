"""What before a timed call makes the port's gelu_residual kernel slower, as ``order3.py``'s 256 MB read did? (GPU
machine, repository root, ``PYTHONPATH=.``.)

Each entry repeated alone 30 times (rotated input sets, the flush repeated to cover the host time as gate 3 does):
the port's gelu_residual final of call 4 and torch.compile of the reference. Flushes: ``zero_()`` of 120 MB (gate
3's, 2x L2), of 512 MiB and of 2 GiB (call 6: ``cold_check-zero.jsonl``); an increment (``add_(1)``) of 512 MiB,
and order3's condition, the 120 MB ``zero_()`` then a 256 MB ``sum()`` (call 7: ``cold_check-increment.jsonl``).
"""
import importlib.util, json, statistics

import torch

from xeforge.timing import delay_flushes

dev = torch.device("cuda")
here = "docs/measurements/h200-epilogue"
S = "tests/fixtures/styles/linear_gelu_residual"
M, N, K = 2048, 4096, 4096


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build(mod, compile_=False):
    torch.manual_seed(0)
    m = mod.Model(K, N).to(dev, torch.bfloat16).eval()
    return torch.compile(m) if compile_ else m


entries = {"final": build(load(f"{here}/gelu_final_call4.py", "final")),
           "compile": build(load(f"{S}/reference.py", "ref"), True)}
torch.manual_seed(1)
base = [torch.randn(M, K, device=dev, dtype=torch.bfloat16), torch.randn(M, N, device=dev, dtype=torch.bfloat16)]
sets = [[t.clone() for t in base] for _ in range(60)]
MB = 2**20
bufs = {n: torch.zeros(n * MB // 4, dtype=torch.int32, device=dev) for n in (120, 256, 512, 2048)}
flushes = {
    "zero_ 120 MB": lambda: bufs[120].zero_(),
    "zero_ 512 MB": lambda: bufs[512].zero_(),
    "zero_ 2048 MB": lambda: bufs[2048].zero_(),
    "add_(1) 512 MB": lambda: bufs[512].add_(1),
    "zero_ 120 MB + sum 256 MB": lambda: (bufs[120].zero_(), bufs[256].sum()),
}


def event():
    return torch.cuda.Event(enable_timing=True)


with torch.no_grad():
    for m in entries.values():
        for _ in range(3):
            m(*base)
    torch.cuda.synchronize()
    k = 0
    for label, flush in flushes.items():
        s, e = event(), event()
        flush(); s.record(); flush(); e.record(); torch.cuda.synchronize()
        delay = delay_flushes(0.15, s.elapsed_time(e))
        row = {"flush": label, "flush_ms": round(s.elapsed_time(e), 4), "delay_flushes": delay}
        for name, m in entries.items():
            got = []
            for _ in range(30):
                torch.cuda.synchronize()
                for _ in range(delay):
                    flush()
                s, e = event(), event()
                s.record(); m(*sets[k % len(sets)]); e.record(); torch.cuda.synchronize()
                k += 1
                got.append(s.elapsed_time(e))
            row[name] = round(statistics.median(got), 5)
        print(json.dumps(row), flush=True)
