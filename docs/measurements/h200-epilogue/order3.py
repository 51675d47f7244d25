"""Is the port's kernel slower after other models because its weights' address translations went cold, and which
schedule tolerates that? (Follow-up of ``order2.py``; GPU machine, repository root, ``PYTHONPATH=.``.)

Pairs [predecessor, target] in the bench's gate-3 loop (L2 flush repeated, rotated input sets). Predecessors: a tiny
kernel, a read of S bytes of other memory (S = 256 MB, 1 GB, 4 GB: pages the target does not use), and the bench's
own company (start, eager, torch.compile, in a cycle with the target). Targets: the port's final of call 4, the
probe's kernel of that schedule at several pipeline depths and K steps (device-side descriptors; ``host`` =
host-side TensorDescriptor arguments), torch.compile of the reference.
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
    def __init__(self, seed, host, bk=64, stages=3):
        self.bk, self.stages = bk, stages
        g = torch.Generator(device=dev).manual_seed(seed)
        self.w = torch.randn(N, K, device=dev, dtype=torch.bfloat16, generator=g) / 64
        self.b = torch.randn(N, device=dev, dtype=torch.bfloat16, generator=g)
        self.host = host

    def __call__(self, x, r):
        c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        grid = (min(sms, triton.cdiv(M, BM) * triton.cdiv(N, BN)),)
        if self.host:
            _gemm_hd[grid](TensorDescriptor.from_tensor(x, [BM, self.bk]), TensorDescriptor.from_tensor(self.w, [BN, self.bk]),
                           self.b, TensorDescriptor.from_tensor(r, [BM, BN // 2]),
                           TensorDescriptor.from_tensor(c, [BM, BN // 2]), M, N, K, BM=BM, BN=BN, BK=self.bk, GROUP_M=8,
                           num_warps=8, num_stages=self.stages)
        else:
            part = c  # unused by EPI 3
            probe._gemm[grid](x, self.w, self.b, r, c, part, M, N, K, BM=BM, BN=BN, BK=self.bk, GROUP_M=8, EPI=3,
                              FLATTEN=False, WS=False, PREFETCH=False, SUBTILE=True, PTR_STORE=False,
                              num_warps=8, num_stages=self.stages)
        return c


ref = load(f"{S}/reference.py", "ref")
fin = load(f"{here}/gelu_final_call4.py", "final")
targets = {"final": build(fin), "compile": build(ref, compile_=True),
           "dev bk64 s3": ProbeModel(0, False), "dev bk64 s4": ProbeModel(0, False, 64, 4),
           "dev bk32 s5": ProbeModel(0, False, 32, 5), "dev bk32 s6": ProbeModel(0, False, 32, 6),
           "dev bk128 s2": ProbeModel(0, False, 128, 2),
           "host bk64 s3": ProbeModel(0, True), "host bk64 s4": ProbeModel(0, True, 64, 4),
           "host bk32 s6": ProbeModel(0, True, 32, 6)}
company = {"start": build(load(f"{S}/direct.py", "start")), "eager": build(ref), "compile#": build(ref, compile_=True)}
tiny_buf = torch.empty(1024, device=dev)
far = torch.empty(4 * 2**30, dtype=torch.int8, device=dev)
preds = {"tiny": lambda x, r: tiny_buf.zero_()}
for mb in (256, 1024, 4096):
    preds[f"read {mb} MB"] = (lambda n: (lambda x, r: far[:n].view(torch.int32).sum()))(mb * 2**20)

torch.manual_seed(1)
base = [torch.randn(M, K, device=dev, dtype=torch.bfloat16), torch.randn(M, N, device=dev, dtype=torch.bfloat16)]
sets = [[t.clone() for t in base] for _ in range(60)]
flush = torch.empty(2 * 60 * 2**20, dtype=torch.int8, device=dev)

with torch.no_grad():
    want = company["eager"](*base).float()
    host = []
    for name, m in {**targets, **company, **preds}.items():
        for w in range(3):
            torch.cuda.synchronize(); t0 = time.perf_counter(); y = m(*base); torch.cuda.synchronize()
            if w:
                host.append((time.perf_counter() - t0) * 1e3)
        if name in targets:
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
    for target, tm in targets.items():
        row = {"target": target}
        for pred in (*preds, "bench company"):
            cycle = [company["start"], tm, company["eager"], company["compile#"]] if pred == "bench company" \
                else [preds[pred], tm]
            got = []
            for _ in range(30):
                for m in cycle:
                    timed(m, sets[k % len(sets)], got if m is tm else None)
                    k += 1
            row[pred] = round(statistics.median(got), 5)
        print(json.dumps(row), flush=True)
