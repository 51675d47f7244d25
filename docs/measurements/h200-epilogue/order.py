"""Does the bench's order and input rotation explain why the port's gelu_residual kernel reads 0.120 ms in
``xeforge bench`` and 0.114 alone? (Run from the repository root on the GPU machine, ``PYTHONPATH=.``.)

The gate-3 loop of ``xeforge/worker.py`` (L2 flush repeated to cover the host time, events around the call) over
the start, the port's final of call 4, eager and torch.compile of the reference, and the final with its GELU's erf
through Abramowitz & Stegun 7.1.26 (``final_phi``), in four schedules: the bench's cyclic order with rotated input
sets, the cyclic order on one input set, each entry alone with rotated sets, each alone on one set.
2048 x 4096 x 4096 bf16, weights of each entry its own (seeded alike). One JSON line per (schedule, entry).
"""
import json
import re
import statistics
import tempfile

import torch

from probe_models import HERE, STYLES, build, delay_for, dev, load, probe, rotated_inputs, timed_call, warm_up


def load_source(name, source):
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as tmp:
        tmp.write(source)
    return load(tmp.name, name)


final_src = open(f"{HERE}/gelu_final_call4.py").read()
phi_src = re.sub(r"0\.5 \* (\w+) \* \(1\.0 \+ tl\.erf\(\1 \* 0\.7071067811865476\)\)", r"\1 * _phi(\1)", final_src)
assert phi_src != final_src
phi = "@triton.jit\n" + probe._phi.src + "\n\n"  # the probe's Abramowitz & Stegun 7.1.26 normal CDF
phi_src = phi_src.replace("@triton.jit\ndef linear_bias_kernel", phi + "@triton.jit\ndef linear_bias_kernel", 1)

ref = load(f"{STYLES}/reference.py", "ref")
entries = {"start": build(load(f"{STYLES}/direct.py", "start")), "final": build(load_source("final", final_src)),
           "eager": build(ref), "compile": build(ref, compile_=True), "final_phi": build(load_source("final_phi", phi_src))}
base, sets = rotated_inputs(100)
flush_buf = torch.empty(2 * 60 * 2**20, dtype=torch.int8, device=dev)
flush = flush_buf.zero_

with torch.no_grad():
    outs, host_ms = warm_up(entries, base)
    want = outs["eager"].float()
    for name, y in outs.items():
        print(json.dumps({"entry": name, "max_err_vs_eager": round((y.float() - want).abs().max().item(), 4)}),
              flush=True)
    delay = delay_for(flush, host_ms)
    names = list(entries)
    for sched in ("cyclic rotated", "cyclic one set", "alone rotated", "alone one set"):
        order = names * 20 if sched.startswith("cyclic") else [n for n in names for _ in range(20)]
        times = {n: [] for n in names}
        for k, n in enumerate(order):
            times[n].append(timed_call(entries[n], sets[k % len(sets)] if "rotated" in sched else base, flush, delay))
        for n in names:
            t = sorted(times[n])
            print(json.dumps({"schedule": sched, "entry": n, "median_ms": round(statistics.median(t), 5),
                              "q1": round(t[len(t) // 4], 5), "q3": round(t[3 * len(t) // 4], 5), "delay": delay}),
                  flush=True)
