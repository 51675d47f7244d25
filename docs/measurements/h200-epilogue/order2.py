"""Which predecessor slows the port's gelu_residual kernel, and why (follow-up of ``order.py``; GPU machine,
repository root, ``PYTHONPATH=.``).

Pairs [predecessor, target] timed in the bench's gate-3 loop (L2 flush repeated, rotated input sets, events around
the target only). Targets: the port's final of call 4 (device-side tensor descriptors), the probe's kernel of the
same schedule with device-side descriptors (``probe_dev``) and with host-side ``TensorDescriptor`` arguments
(``probe_host``), torch.compile of the reference. Predecessors: the target itself, the start, eager, torch.compile,
a tiny unrelated kernel (no weights), and a second instance of the target's own Model (same kernel, other weights).
"""
import importlib.util, json, statistics, sys, time

import torch, triton, triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, "scripts")
import gemm_epilogue_probe as probe  # noqa: E402
from xeforge.timing import delay_flushes  # noqa: E402

dev = torch.device("cuda")
triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
here = "docs/measurements/h200-epilogue"
S = "tests/fixtures/styles/linear_gelu_residual"
M, N, K = 2048, 4096, 4096
BM, BN, BK = 128, 256, 64
sms = torch.cuda.get_device_properties(dev).multi_processor_count


@triton.jit
def _gemm_hd(a_desc, b_desc, bias_ptr, r_desc, c_desc, M, N, K,
             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    in_group = GROUP_M * num_pid_n
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0)):
        group = tile // in_group
        first_m = group * GROUP_M
        size_m = min(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + ((tile % in_group) % size_m)
        pid_n = (tile % in_group) // size_m
        offs_m = pid_m * BM + tl.arange(0, BM)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BK)):
            acc = tl.dot(a_desc.load([pid_m * BM, k * BK]), b_desc.load([pid_n * BN, k * BK]).T, acc)
        acc0, acc1 = acc.reshape(BM, 2, BN // 2).permute(0, 2, 1).split()
        col0 = pid_n * BN
        out0 = probe._epilogue(acc0, bias_ptr, bias_ptr, r_desc, bias_ptr, offs_m, col0 + tl.arange(0, BN // 2),
                               pid_m * BM, col0, 0, M, N, 1, 3, 0.0, False, 0)
        c_desc.store([pid_m * BM, col0], out0.to(tl.bfloat16))
        col1 = pid_n * BN + BN // 2
        out1 = probe._epilogue(acc1, bias_ptr, bias_ptr, r_desc, bias_ptr, offs_m, col1 + tl.arange(0, BN // 2),
                               pid_m * BM, col1, 0, M, N, 1, 3, 0.0, False, 0)
        c_desc.store([pid_m * BM, col1], out1.to(tl.bfloat16))


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build(mod, seed=0, compile_=False):
    torch.manual_seed(seed)
    m = mod.Model(K, N).to(dev, torch.bfloat16).eval()
    return torch.compile(m) if compile_ else m


class ProbeModel:
    def __init__(self, seed, host):
        g = torch.Generator(device=dev).manual_seed(seed)
        self.w = torch.randn(N, K, device=dev, dtype=torch.bfloat16, generator=g) / 64
        self.b = torch.randn(N, device=dev, dtype=torch.bfloat16, generator=g)
        self.host = host

    def __call__(self, x, r):
        c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        grid = (min(sms, triton.cdiv(M, BM) * triton.cdiv(N, BN)),)
        if self.host:
            _gemm_hd[grid](TensorDescriptor.from_tensor(x, [BM, BK]), TensorDescriptor.from_tensor(self.w, [BN, BK]),
                           self.b, TensorDescriptor.from_tensor(r, [BM, BN // 2]),
                           TensorDescriptor.from_tensor(c, [BM, BN // 2]), M, N, K, BM=BM, BN=BN, BK=BK, GROUP_M=8,
                           num_warps=8, num_stages=3)
        else:
            part = c  # unused by EPI 3
            probe._gemm[grid](x, self.w, self.b, r, c, part, M, N, K, BM=BM, BN=BN, BK=BK, GROUP_M=8, EPI=3,
                              FLATTEN=False, WS=False, PREFETCH=False, SUBTILE=True, PTR_STORE=False,
                              num_warps=8, num_stages=3)
        return c


ref = load(f"{S}/reference.py", "ref")
fin = load(f"{here}/gelu_final_call4.py", "final")
models = {"start": build(load(f"{S}/direct.py", "start")), "eager": build(ref), "compile": build(ref, compile_=True),
          "final": build(fin), "final#2": build(fin, seed=1), "compile#2": build(ref, seed=1, compile_=True),
          "probe_dev": ProbeModel(0, False), "probe_dev#2": ProbeModel(1, False),
          "probe_host": ProbeModel(0, True), "probe_host#2": ProbeModel(1, True)}
tiny_buf = torch.empty(1024, device=dev)
models["tiny"] = lambda x, r: tiny_buf.zero_()

torch.manual_seed(1)
base = [torch.randn(M, K, device=dev, dtype=torch.bfloat16), torch.randn(M, N, device=dev, dtype=torch.bfloat16)]
sets = [[t.clone() for t in base] for _ in range(60)]
flush = torch.empty(2 * 60 * 2**20, dtype=torch.int8, device=dev)

with torch.no_grad():
    want = models["eager"](*base).float()
    host = []
    for name, m in models.items():
        for w in range(3):
            torch.cuda.synchronize(); t0 = time.perf_counter(); y = m(*base); torch.cuda.synchronize()
            if w:
                host.append((time.perf_counter() - t0) * 1e3)
        if name.startswith(("final", "compile", "start")):
            print(json.dumps({"entry": name, "max_err_vs_eager": round((y.float() - want).abs().max().item(), 4)}))
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); flush.zero_(); e.record(); torch.cuda.synchronize()
    delay = delay_flushes(max(host), s.elapsed_time(e))

    def timed(m, args, record):
        torch.cuda.synchronize()
        for _ in range(delay):
            flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); m(*args); e.record(); torch.cuda.synchronize()
        if record is not None:
            record.append(s.elapsed_time(e))

    k = 0
    for target in ("final", "probe_dev", "probe_host", "compile"):
        for pred in ("self", "start", "eager", "compile", "tiny", "other weights"):
            if pred == "compile" and target == "compile":
                continue
            p = {"self": target, "other weights": target + "#2"}.get(pred, pred)
            got = []
            for _ in range(30):
                for name, rec in ((p, None), (target, got)):
                    timed(models[name], sets[k % len(sets)], rec)
                    k += 1
            got.sort()
            print(json.dumps({"target": target, "after": pred, "median_ms": round(statistics.median(got), 5),
                              "q1": round(got[len(got) // 4], 5), "q3": round(got[3 * len(got) // 4], 5)}), flush=True)
