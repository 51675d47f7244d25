import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def linear_bias_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K,
                       stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
                       residual_ptr, stride_residual_m, stride_residual_n,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_BLOCK_IO: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # tensor descriptors (2D block I/O, TMA) when the operands qualify, else the original code
    if USE_BLOCK_IO:
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[stride_xm, 1], block_shape=[BLOCK_M, BLOCK_K])
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[stride_wn, 1], block_shape=[BLOCK_N, BLOCK_K])
        out_desc = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[stride_om, 1], block_shape=[BLOCK_M, BLOCK_N])
    if USE_BLOCK_IO:
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            x = x_desc.load([pid_m * BLOCK_M, k0])
            w = w_desc.load([pid_n * BLOCK_N, k0]).T
            acc = tl.dot(x, w, acc)
    else:
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + kk[None, :] * stride_xk,
                        mask=(offs_m[:, None] < M) & (kk[None, :] < K), other=0.0)
            w = tl.load(w_ptr + kk[:, None] * stride_wk + offs_n[None, :] * stride_wn,
                        mask=(kk[:, None] < K) & (offs_n[None, :] < N), other=0.0)
            acc = tl.dot(x, w, acc)
    bias = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    acc = acc + bias[None, :]
    # fused from Model.forward: gelu, add
    acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    residual = tl.load(residual_ptr + offs_m[:, None] * stride_residual_m + offs_n[None, :] * stride_residual_n, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N), other=0.0).to(tl.float32)
    acc = acc + residual
    if USE_BLOCK_IO:
        out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(out_ptr.dtype.element_ty))
    else:
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on, acc.to(out_ptr.dtype.element_ty),
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.proj = torch.nn.Linear(in_features, out_features)

    def forward(self, x, residual):
        M, K = x.shape
        N = self.proj.weight.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        use_block_io = all((
            x.data_ptr() % 16 == 0,
            x.stride(1) == 1,
            (x.stride(0) * x.element_size()) % 16 == 0,
            self.proj.weight.data_ptr() % 16 == 0,
            self.proj.weight.stride(1) == 1,
            (self.proj.weight.stride(0) * self.proj.weight.element_size()) % 16 == 0,
            y.data_ptr() % 16 == 0,
            y.stride(1) == 1,
            (y.stride(0) * y.element_size()) % 16 == 0,
        ))
        if use_block_io and x.device.type == "cuda":
            # device-side tensor descriptors (TMA) need a scratch allocation on NVIDIA GPUs
            triton.set_allocator(lambda size, align, stream, dev=x.device: torch.empty(size, dtype=torch.int8, device=dev))
        linear_bias_kernel[(triton.cdiv(M, 128), triton.cdiv(N, 256))](
            x, self.proj.weight, self.proj.bias, y, M, N, K,
            x.stride(0), x.stride(1), self.proj.weight.stride(0), self.proj.weight.stride(1),
            y.stride(0), y.stride(1),
            residual_ptr=residual, stride_residual_m=residual.stride(0),
            stride_residual_n=residual.stride(1),
            BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3, USE_BLOCK_IO=use_block_io)
        return y
