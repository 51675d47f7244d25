"""What before a timed call makes the port's gelu_residual kernel slower, as ``order3.py``'s 256 MB read did? (GPU
machine, repository root, ``PYTHONPATH=.``.)

Each entry repeated alone 30 times (rotated input sets, the flush repeated to cover the host time as gate 3 does):
the port's gelu_residual final of call 4 and torch.compile of the reference. Flushes: ``zero_()`` of 120 MB (gate
3's, 2x L2), of 512 MiB and of 2 GiB (call 6: ``cold_check-zero.jsonl``); an increment (``add_(1)``) of 512 MiB,
and order3's condition, the 120 MB ``zero_()`` then a 256 MB ``sum()`` (call 7: ``cold_check-increment.jsonl``).
"""
import json
import statistics

import torch

from probe_models import HERE, STYLES, build, delay_for, dev, load, rotated_inputs, timed_call, warm_up

entries = {"final": build(load(f"{HERE}/gelu_final_call4.py", "final")),
           "compile": build(load(f"{STYLES}/reference.py", "ref"), compile_=True)}
base, sets = rotated_inputs(60)
MB = 2**20
bufs = {n: torch.zeros(n * MB // 4, dtype=torch.int32, device=dev) for n in (120, 256, 512, 2048)}
flushes = {
    "zero_ 120 MB": lambda: bufs[120].zero_(),
    "zero_ 512 MB": lambda: bufs[512].zero_(),
    "zero_ 2048 MB": lambda: bufs[2048].zero_(),
    "add_(1) 512 MB": lambda: bufs[512].add_(1),
    "zero_ 120 MB + sum 256 MB": lambda: (bufs[120].zero_(), bufs[256].sum()),
}

with torch.no_grad():
    warm_up(entries, base)
    k = 0
    for label, flush in flushes.items():
        delay = delay_for(flush, 0.15)
        row = {"flush": label, "delay_flushes": delay}
        for name, m in entries.items():
            got = [timed_call(m, sets[(k + i) % len(sets)], flush, delay) for i in range(30)]
            k += 30
            row[name] = round(statistics.median(got), 5)
        print(json.dumps(row), flush=True)
