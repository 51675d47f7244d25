"""Is the port's kernel slower after other models because its weights' address translations went cold, and which
schedule tolerates that? (Follow-up of ``order2.py``; GPU machine, repository root, ``PYTHONPATH=.``.)

Pairs [predecessor, target] in the bench's gate-3 loop (L2 flush repeated, rotated input sets). Predecessors: a tiny
kernel, a read of S bytes of other memory (S = 256 MB, 1 GB, 4 GB: pages the target does not use), and the bench's
own company (start, eager, torch.compile, in a cycle with the target). Targets: the port's final of call 4, the
probe's kernel of that schedule at several pipeline depths and K steps (device-side descriptors; ``host`` =
host-side TensorDescriptor arguments), torch.compile of the reference.
"""
import json
import statistics

import torch

from probe_models import STYLES, HERE, ProbeModel, build, delay_for, dev, load, rotated_inputs, timed_call, warm_up

ref = load(f"{STYLES}/reference.py", "ref")
fin = load(f"{HERE}/gelu_final_call4.py", "final")
targets = {"final": build(fin), "compile": build(ref, compile_=True),
           "dev bk64 s3": ProbeModel(0, False), "dev bk64 s4": ProbeModel(0, False, 64, 4),
           "dev bk32 s5": ProbeModel(0, False, 32, 5), "dev bk32 s6": ProbeModel(0, False, 32, 6),
           "dev bk128 s2": ProbeModel(0, False, 128, 2),
           "host bk64 s3": ProbeModel(0, True), "host bk64 s4": ProbeModel(0, True, 64, 4),
           "host bk32 s6": ProbeModel(0, True, 32, 6)}
company = {"start": build(load(f"{STYLES}/direct.py", "start")), "eager": build(ref),
           "compile#": build(ref, compile_=True)}
tiny_buf = torch.empty(1024, device=dev)
far = torch.empty(4 * 2**30, dtype=torch.int8, device=dev)
preds = {"tiny": lambda x, r: tiny_buf.zero_()}
for mb in (256, 1024, 4096):
    preds[f"read {mb} MB"] = (lambda n: (lambda x, r: far[:n].view(torch.int32).sum()))(mb * 2**20)
base, sets = rotated_inputs(60)
flush_buf = torch.empty(2 * 60 * 2**20, dtype=torch.int8, device=dev)
flush = flush_buf.zero_

with torch.no_grad():
    outs, host_ms = warm_up({**targets, **company, **preds}, base)
    want = outs["eager"].float()
    for name in targets:  # the probe models have weights of their own: far off by design
        print(json.dumps({"entry": name, "max_err_vs_eager": round((outs[name].float() - want).abs().max().item(), 4)}))
    delay = delay_for(flush, host_ms)
    k = 0
    for target, tm in targets.items():
        row = {"target": target}
        for pred in (*preds, "bench company"):
            cycle = [company["start"], tm, company["eager"], company["compile#"]] if pred == "bench company" \
                else [preds[pred], tm]
            got = []
            for _ in range(30):
                for m in cycle:
                    t = timed_call(m, sets[k % len(sets)], flush, delay)
                    if m is tm:
                        got.append(t)
                    k += 1
            row[pred] = round(statistics.median(got), 5)
        print(json.dumps(row), flush=True)
