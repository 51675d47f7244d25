"""Does the bench's order and input rotation explain why the port's gelu_residual kernel reads 0.120 ms in
``xeforge bench`` and 0.114 alone? (Run from the repository root on the GPU machine, ``PYTHONPATH=.``.)

The gate-3 loop of ``xeforge/worker.py`` (L2 flush repeated to cover the host time, events around the call) over
the start, the port's final of call 4, eager and torch.compile of the reference, and the final with its GELU's erf
through Abramowitz & Stegun 7.1.26 (``final_phi``), in four schedules: the bench's cyclic order with rotated input
sets, the cyclic order on one input set, each entry alone with rotated sets, each alone on one set.
2048 x 4096 x 4096 bf16, weights of each entry its own (seeded alike). One JSON line per (schedule, entry).
"""
import importlib.util, json, re, statistics, sys, tempfile, time

import torch, triton

from xeforge.timing import delay_flushes

dev = torch.device("cuda")
here = "docs/measurements/h200-epilogue"
S = "tests/fixtures/styles/linear_gelu_residual"


def load(path, name, source=None):
    if source is not None:
        tmp = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
        tmp.write(source); tmp.close(); path = tmp.name
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


PHI = '''
@triton.jit
def _phi(x):
    z = tl.abs(x) * 0.7071067811865476
    t = tl.fdiv(1.0, 1.0 + 0.3275911 * z, ieee_rounding=False)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    half_erfc = 0.5 * poly * tl.exp2(z * z * -1.4426950408889634)
    return tl.where(x >= 0, 1.0 - half_erfc, half_erfc)

'''
final_src = open(f"{here}/gelu_final_call4.py").read()
phi_src = re.sub(r"0\.5 \* (\w+) \* \(1\.0 \+ tl\.erf\(\1 \* 0\.7071067811865476\)\)", r"\1 * _phi(\1)", final_src)
assert phi_src != final_src
phi_src = phi_src.replace("@triton.jit\ndef linear_bias_kernel", PHI + "@triton.jit\ndef linear_bias_kernel", 1)

M, N, K = 2048, 4096, 4096


def build(mod, compile_=False):
    torch.manual_seed(0)
    m = mod.Model(K, N).to(dev, torch.bfloat16).eval()
    return torch.compile(m) if compile_ else m


ref = load(f"{S}/reference.py", "ref")
entries = {"start": build(load(f"{S}/direct.py", "start")), "final": build(load(None, "final", final_src)),
           "eager": build(ref), "compile": build(ref, True), "final_phi": build(load(None, "final_phi", phi_src))}
torch.manual_seed(1)
base = [torch.randn(M, K, device=dev, dtype=torch.bfloat16), torch.randn(M, N, device=dev, dtype=torch.bfloat16)]
sets = [[t.clone() for t in base] for _ in range(100)]
flush = torch.empty(2 * 60 * 2**20, dtype=torch.int8, device=dev)

with torch.no_grad():
    out_ref = entries["eager"](*base).float()
    host = []
    for name, m in entries.items():
        for w in range(3):
            torch.cuda.synchronize(); t0 = time.perf_counter(); y = m(*base); torch.cuda.synchronize()
            if w:
                host.append((time.perf_counter() - t0) * 1e3)
        print(json.dumps({"entry": name, "max_err_vs_eager": round((y.float() - out_ref).abs().max().item(), 4)}),
              flush=True)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); flush.zero_(); e.record(); torch.cuda.synchronize()
    delay = delay_flushes(max(host), s.elapsed_time(e))

    def timed(m, args):
        torch.cuda.synchronize()
        for _ in range(delay):
            flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); m(*args); e.record(); torch.cuda.synchronize()
        return s.elapsed_time(e)

    names = list(entries)
    for sched in ("cyclic rotated", "cyclic one set", "alone rotated", "alone one set"):
        times = {n: [] for n in names}
        k = 0
        if sched.startswith("cyclic"):
            for _ in range(20):
                for n in names:
                    args = sets[k % len(sets)] if "rotated" in sched else base
                    k += 1
                    times[n].append(timed(entries[n], args))
        else:
            for n in names:
                for _ in range(20):
                    args = sets[k % len(sets)] if "rotated" in sched else base
                    k += 1
                    times[n].append(timed(entries[n], args))
        for n in names:
            t = sorted(times[n])
            print(json.dumps({"schedule": sched, "entry": n, "median_ms": round(statistics.median(t), 5),
                              "q1": round(t[len(t) // 4], 5), "q3": round(t[3 * len(t) // 4], 5), "delay": delay}),
                  flush=True)
