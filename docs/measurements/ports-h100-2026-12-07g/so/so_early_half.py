import torch
import torch.nn.functional as F
import triton
import triton.language as tl


def _device_core_count(device):
    """Programs for a persistent launch: one per SM (NVIDIA) or Xe-core (Intel); a few on the CPU interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    if device.type == "xpu":
        index = device.index if device.index is not None else torch.xpu.current_device()
        return triton.runtime.driver.active.utils.get_device_properties(index)["multiprocessor_count"]
    return 2


@triton.jit
def _mm_bias(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, sxm, sxk, swk, swn, sym, syn,
             y_out_ptr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_BLOCK_IO: tl.constexpr):
    num_pid_0 = tl.cdiv(M, BLOCK_M)
    num_pid_1 = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_0 * num_pid_1
    rk = tl.arange(0, BLOCK_K)
    # tensor descriptors (2D block I/O, TMA) when the operands qualify, else the original code
    if USE_BLOCK_IO:
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[sxm, 1], block_shape=[BLOCK_M, BLOCK_K])
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[swn, 1], block_shape=[BLOCK_N, BLOCK_K])
        y_out_desc = tl.make_tensor_descriptor(y_out_ptr, shape=[M, N], strides=[sym, 1], block_shape=[BLOCK_M, BLOCK_N // 2])
        y_desc = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[sym, 1], block_shape=[BLOCK_M, BLOCK_N // 2])
    # persistent: program p handles tiles p, p + num_programs, p + 2 * num_programs, ...
    for tile_id in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        pid_0 = tile_id % num_pid_0
        pid_1 = tile_id // num_pid_0
        rm = pid_0 * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_1 * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if USE_BLOCK_IO:
            for k in range(0, K, BLOCK_K):
                a = x_desc.load([pid_0 * BLOCK_M, k])
                b = w_desc.load([pid_1 * BLOCK_N, k]).T
                acc += tl.dot(a, b)
        else:
            for k in range(0, K, BLOCK_K):
                a = tl.load(x_ptr + rm[:, None] * sxm + (k + rk)[None, :] * sxk,
                            mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
                b = tl.load(w_ptr + (k + rk)[:, None] * swk + rn[None, :] * swn,
                            mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
                acc += tl.dot(a, b)
        # the epilogue on two [BLOCK_M, BLOCK_N // 2] column halves of acc: half the live registers after the K loop
        acc_halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        acc_lo, acc_hi = tl.split(acc_halves)
        rn_lo = pid_1 * BLOCK_N + tl.arange(0, BLOCK_N // 2)
        rn_hi = pid_1 * BLOCK_N + (BLOCK_N // 2 + tl.arange(0, BLOCK_N // 2))
        acc_lo = acc_lo + tl.load(b_ptr + rn_lo, mask=rn_lo < N, other=0.0)[None, :]
        # fused from Model.forward: gelu
        y = acc_lo
        if USE_BLOCK_IO:
            y_out_desc.store([pid_0 * BLOCK_M, pid_1 * BLOCK_N], y.to(y_out_ptr.dtype.element_ty))
        else:
            tl.store(y_out_ptr + rm[:, None] * sym + rn_lo[None, :] * syn, y.to(y_out_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn_lo[None, :] < N))
        acc_lo = 0.5 * acc_lo * (1.0 + tl.erf(acc_lo * 0.7071067811865476))
        if USE_BLOCK_IO:
            y_desc.store([pid_0 * BLOCK_M, pid_1 * BLOCK_N], acc_lo.to(y_ptr.dtype.element_ty))
        else:
            tl.store(y_ptr + rm[:, None] * sym + rn_lo[None, :] * syn, acc_lo.to(y_ptr.dtype.element_ty),
                     mask=(rm[:, None] < M) & (rn_lo[None, :] < N))
        acc_hi = acc_hi + tl.load(b_ptr + rn_hi, mask=rn_hi < N, other=0.0)[None, :]
        # fused from Model.forward: gelu
        y = acc_hi
        if USE_BLOCK_IO:
            y_out_desc.store([pid_0 * BLOCK_M, pid_1 * BLOCK_N + BLOCK_N // 2], y.to(y_out_ptr.dtype.element_ty))
        else:
            tl.store(y_out_ptr + rm[:, None] * sym + rn_hi[None, :] * syn, y.to(y_out_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn_hi[None, :] < N))
        acc_hi = 0.5 * acc_hi * (1.0 + tl.erf(acc_hi * 0.7071067811865476))
        if USE_BLOCK_IO:
            y_desc.store([pid_0 * BLOCK_M, pid_1 * BLOCK_N + BLOCK_N // 2], acc_hi.to(y_ptr.dtype.element_ty))
        else:
            tl.store(y_ptr + rm[:, None] * sym + rn_hi[None, :] * syn, acc_hi.to(y_ptr.dtype.element_ty),
                     mask=(rm[:, None] < M) & (rn_hi[None, :] < N))



class Model(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(out_features, in_features) * 0.05)
        self.bias = torch.nn.Parameter(torch.randn(out_features) * 0.05)
        self.bias2 = torch.nn.Parameter(torch.randn(out_features) * 0.1)  # its shape is the trace's to tell
        self.slope = 0.2  # a Python scalar: the kernel receives it at run time

    def forward(self, x):
        # linear(...), inlined (xeforge, fusion)
        M, K = x.shape
        N = self.weight.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        y_out = torch.empty_like(y)
        grid = lambda META: (min(num_programs, triton.cdiv(M, META['BLOCK_M']) * triton.cdiv(N, META['BLOCK_N'])),)
        use_block_io = all((
            x.data_ptr() % 16 == 0,
            x.stride(1) == 1,
            (x.stride(0) * x.element_size()) % 16 == 0,
            self.weight.data_ptr() % 16 == 0,
            self.weight.stride(1) == 1,
            (self.weight.stride(0) * self.weight.element_size()) % 16 == 0,
            y_out.data_ptr() % 16 == 0,
            y.stride(1) == 1,
            (y.stride(0) * y_out.element_size()) % 16 == 0,
            y.data_ptr() % 16 == 0,
            (y.stride(0) * y.element_size()) % 16 == 0,
        ))
        if use_block_io and x.device.type == "cuda":
            # device-side tensor descriptors (TMA) need a scratch allocation on NVIDIA GPUs
            triton.set_allocator(lambda size, align, stream, dev=x.device: torch.empty(size, dtype=torch.int8, device=dev))
        num_programs = _device_core_count(self.bias.device)
        _mm_bias[grid](x, self.weight, self.bias, y, M, N, K, x.stride(0), x.stride(1), self.weight.stride(1), self.weight.stride(0),
                       y.stride(0), y.stride(1), y_out_ptr=y_out, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, USE_BLOCK_IO=use_block_io, num_warps=8, num_stages=3)
        return y_out, y
