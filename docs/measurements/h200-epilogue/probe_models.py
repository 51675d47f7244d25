"""What the measurement scripts of this folder share (``order*.py``, ``cold_check.py``, ``timers.py``): the shapes,
loading a Model file, the probe's GEMM as a callable model with device- or host-side descriptors, and one call timed
the way gate 3 times it. Imported from the scripts' own folder; the probe kernels are ``scripts/gemm_epilogue_probe.py``.
"""
import importlib.util
import sys
import time

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, "scripts")
import gemm_epilogue_probe as probe  # noqa: E402
from xeforge.timing import delay_flushes  # noqa: E402

dev = torch.device("cuda")
HERE = "docs/measurements/h200-epilogue"
STYLES = "tests/fixtures/styles/linear_gelu_residual"
M, N, K = 2048, 4096, 4096
BM, BN = 128, 256
triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build(mod, seed=0, compile_=False):
    """``mod.Model(K, N)`` in bf16 on the GPU, its weights drawn with ``seed``; torch.compile'd if asked."""
    torch.manual_seed(seed)
    m = mod.Model(K, N).to(dev, torch.bfloat16).eval()
    return torch.compile(m) if compile_ else m


@triton.jit
def gemm_host_desc(a_desc, b_desc, bias_ptr, r_desc, c_desc, M, N, K,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    """The probe's tile loop with the gelu + residual epilogue in column halves (``EPI=3, SUBTILE=True``), its
    descriptors passed in from the host."""
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


class ProbeModel:
    """The probe's gelu + residual GEMM (128 x 256 tiles, 8 warps, halves) as ``model(x, residual)``, with its own
    weights (drawn with ``seed``): descriptors made in the kernel (``host=False``, the probe's ``_gemm``) or passed
    from the host (``gemm_host_desc``)."""

    def __init__(self, seed, host, bk=64, stages=3):
        g = torch.Generator(device=dev).manual_seed(seed)
        self.w = torch.randn(N, K, device=dev, dtype=torch.bfloat16, generator=g) / 64
        self.b = torch.randn(N, device=dev, dtype=torch.bfloat16, generator=g)
        self.host, self.bk, self.stages = host, bk, stages
        self.grid = (min(torch.cuda.get_device_properties(dev).multi_processor_count,
                         triton.cdiv(M, BM) * triton.cdiv(N, BN)),)

    def __call__(self, x, r):
        c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        if self.host:
            gemm_host_desc[self.grid](
                TensorDescriptor.from_tensor(x, [BM, self.bk]), TensorDescriptor.from_tensor(self.w, [BN, self.bk]),
                self.b, TensorDescriptor.from_tensor(r, [BM, BN // 2]), TensorDescriptor.from_tensor(c, [BM, BN // 2]),
                M, N, K, BM=BM, BN=BN, BK=self.bk, GROUP_M=8, num_warps=8, num_stages=self.stages)
        else:
            probe._gemm[self.grid](x, self.w, self.b, r, c, c, M, N, K, BM=BM, BN=BN, BK=self.bk, GROUP_M=8, EPI=3,
                                   FLATTEN=False, WS=False, PREFETCH=False, SUBTILE=True, PTR_STORE=False,
                                   num_warps=8, num_stages=self.stages)  # c twice: EPI 3 writes no partials
        return c


def event():
    return torch.cuda.Event(enable_timing=True)


def timed_call(model, args, flush, delay):
    """One call timed as gate 3 times it: a full sync, ``flush()`` queued ``delay`` times (so the device is still
    busy while the host issues the call), events around the call; its device time in ms."""
    torch.cuda.synchronize()
    for _ in range(delay):
        flush()
    s, e = event(), event()
    s.record()
    model(*args)
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e)


def rotated_inputs(n_sets):
    """``(x, residual)`` drawn once (seed 1) and ``n_sets`` copies of it at other addresses, rotated call by call."""
    torch.manual_seed(1)
    base = [torch.randn(M, K, device=dev, dtype=torch.bfloat16), torch.randn(M, N, device=dev, dtype=torch.bfloat16)]
    return base, [[t.clone() for t in base] for _ in range(n_sets)]


def warm_up(models, args):
    """Three calls of each model (the first compiles); returns each model's last output and the longest host time
    of the later calls in ms (what gate 3 sizes its delay by)."""
    outs, host = {}, []
    for name, m in models.items():
        for w in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            outs[name] = m(*args)
            torch.cuda.synchronize()
            if w:
                host.append((time.perf_counter() - t0) * 1e3)
    return outs, max(host)


def delay_for(flush, host_ms):
    """How many times gate 3 would queue ``flush()`` to cover ``host_ms`` (:func:`xeforge.timing.delay_flushes`)."""
    flush()
    s, e = event(), event()
    s.record()
    flush()
    e.record()
    torch.cuda.synchronize()
    return delay_flushes(host_ms, s.elapsed_time(e))
