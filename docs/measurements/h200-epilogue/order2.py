"""Which predecessor slows the port's gelu_residual kernel, and why (follow-up of ``order.py``; GPU machine,
repository root, ``PYTHONPATH=.``).

Pairs [predecessor, target] timed in the bench's gate-3 loop (L2 flush repeated, rotated input sets, events around
the target only). Targets: the port's final of call 4 (device-side tensor descriptors), the probe's kernel of the
same schedule with device-side descriptors (``probe_dev``) and with host-side ``TensorDescriptor`` arguments
(``probe_host``), torch.compile of the reference. Predecessors: the target itself, the start, eager, torch.compile,
a tiny unrelated kernel (no weights), and a second instance of the target's own Model (same kernel, other weights).
"""
import json
import statistics

import torch

from probe_models import STYLES, HERE, ProbeModel, build, delay_for, dev, load, rotated_inputs, timed_call, warm_up

ref = load(f"{STYLES}/reference.py", "ref")
fin = load(f"{HERE}/gelu_final_call4.py", "final")
models = {"start": build(load(f"{STYLES}/direct.py", "start")), "eager": build(ref), "compile": build(ref, compile_=True),
          "final": build(fin), "final#2": build(fin, seed=1), "compile#2": build(ref, seed=1, compile_=True),
          "probe_dev": ProbeModel(0, False), "probe_dev#2": ProbeModel(1, False),
          "probe_host": ProbeModel(0, True), "probe_host#2": ProbeModel(1, True)}
tiny_buf = torch.empty(1024, device=dev)
models["tiny"] = lambda x, r: tiny_buf.zero_()
base, sets = rotated_inputs(60)
flush_buf = torch.empty(2 * 60 * 2**20, dtype=torch.int8, device=dev)
flush = flush_buf.zero_

with torch.no_grad():
    outs, host_ms = warm_up(models, base)
    want = outs["eager"].float()
    for name in ("start", "compile", "final", "final#2", "compile#2"):  # #2: other weights, so far off by design
        print(json.dumps({"entry": name, "max_err_vs_eager": round((outs[name].float() - want).abs().max().item(), 4)}))
    delay = delay_for(flush, host_ms)
    k = 0
    for target in ("final", "probe_dev", "probe_host", "compile"):
        for pred in ("self", "start", "eager", "compile", "tiny", "other weights"):
            if pred == "compile" and target == "compile":
                continue
            p = {"self": target, "other weights": target + "#2"}.get(pred, pred)
            got = []
            for _ in range(30):
                timed_call(models[p], sets[k % len(sets)], flush, delay)
                got.append(timed_call(models[target], sets[(k + 1) % len(sets)], flush, delay))
                k += 2
            got.sort()
            print(json.dumps({"target": target, "after": pred, "median_ms": round(statistics.median(got), 5),
                              "q1": round(got[len(got) // 4], 5), "q3": round(got[3 * len(got) // 4], 5)}), flush=True)
