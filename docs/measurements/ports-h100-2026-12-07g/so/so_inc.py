import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _mm_bias(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, sxm, sxk, swk, swn, sym, syn,
             y_out_ptr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_BLOCK_IO: tl.constexpr):
    pid_0 = tl.program_id(0)
    pid_1 = tl.program_id(1)
    rm = pid_0 * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_1 * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # tensor descriptors (2D block I/O, TMA) when the operands qualify, else the original code
    if USE_BLOCK_IO:
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[sxm, 1], block_shape=[BLOCK_M, BLOCK_K])
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[swn, 1], block_shape=[BLOCK_N, BLOCK_K])
        y_out_desc = tl.make_tensor_descriptor(y_out_ptr, shape=[M, N], strides=[sym, 1], block_shape=[BLOCK_M, BLOCK_N])
        y_desc = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[sym, 1], block_shape=[BLOCK_M, BLOCK_N])
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
    acc = acc + tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    # fused from Model.forward: gelu
    y = acc
    acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    if USE_BLOCK_IO:
        y_out_desc.store([pid_0 * BLOCK_M, pid_1 * BLOCK_N], y.to(y_out_ptr.dtype.element_ty))
    else:
        tl.store(y_out_ptr + rm[:, None] * sym + rn[None, :] * syn, y.to(y_out_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))
    if USE_BLOCK_IO:
        y_desc.store([pid_0 * BLOCK_M, pid_1 * BLOCK_N], acc.to(y_ptr.dtype.element_ty))
    else:
        tl.store(y_ptr + rm[:, None] * sym + rn[None, :] * syn, acc.to(y_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))



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
        grid = (triton.cdiv(M, 128), triton.cdiv(N, 256))
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
        _mm_bias[grid](x, self.weight, self.bias, y, M, N, K, x.stride(0), x.stride(1), self.weight.stride(1), self.weight.stride(0),
                       y.stride(0), y.stride(1), y_out_ptr=y_out, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, USE_BLOCK_IO=use_block_io, num_warps=8, num_stages=3)
        return y_out, y
