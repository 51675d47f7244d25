"""Naive port of KernelBench L2 #41: Linear -> BatchNorm1d (inference form) -> GELU -> ReLU.
Triton GEMM writes the full [M, N] fp32 product, the tail runs as torch ops."""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def matmul_bias_kernel(a_ptr, w_ptr, bias_ptr, c_ptr, M, N, K,
                       stride_am, stride_ak, stride_wn, stride_wk, stride_cm, stride_cn,
                       batch_norm_eps, batch_norm_running_var_ptr, batch_norm_weight_ptr,
                       batch_norm_running_mean_ptr, batch_norm_bias_ptr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_BLOCK_IO: tl.constexpr):
    """C = A @ W^T + bias, W in nn.Linear layout [N, K]. Straight CUDA-style port: one C tile per
    program on a 2D grid, both operands up-cast to fp32 before the dot."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # tensor descriptors (2D block I/O, TMA) when the operands qualify, else the original code
    if USE_BLOCK_IO:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[stride_wn, 1], block_shape=[BLOCK_N, BLOCK_K])
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N])
    if USE_BLOCK_IO:
        for k0 in range(0, K, BLOCK_K):
            k = k0 + offs_k
            a = a_desc.load([pid_m * BLOCK_M, k0])
            b = w_desc.load([pid_n * BLOCK_N, k0]).T
            acc += tl.dot(a, b)
    else:
        for k0 in range(0, K, BLOCK_K):
            k = k0 + offs_k
            a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                        mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0)
            b = tl.load(w_ptr + k[:, None] * stride_wk + offs_n[None, :] * stride_wn,
                        mask=(k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
            acc += tl.dot(a, b)
    bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    acc = acc + bias[None, :]
    # fused from Model.forward: batch_norm, gelu, relu
    batch_norm_running_var = tl.load(batch_norm_running_var_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    batch_norm_weight = tl.load(batch_norm_weight_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    bn_scale = batch_norm_weight / tl.sqrt(batch_norm_running_var + batch_norm_eps)
    batch_norm_running_mean = tl.load(batch_norm_running_mean_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    batch_norm_bias = tl.load(batch_norm_bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    bn_shift = batch_norm_bias - batch_norm_running_mean * bn_scale
    acc = acc * bn_scale + bn_shift
    acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    acc = tl.maximum(acc, 0.0)
    if USE_BLOCK_IO:
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))
    else:
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
                 acc.to(c_ptr.dtype.element_ty),
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.gemm = torch.nn.Linear(in_features, out_features)
        self.batch_norm = torch.nn.BatchNorm1d(out_features)
        with torch.no_grad():  # inference-form BatchNorm with non-trivial running stats
            self.batch_norm.running_mean.copy_(torch.linspace(-0.5, 0.5, out_features))
            self.batch_norm.running_var.copy_(torch.linspace(0.5, 2.0, out_features))
            self.batch_norm.weight.copy_(torch.linspace(0.75, 1.25, out_features))
            self.batch_norm.bias.copy_(torch.linspace(-0.1, 0.1, out_features))

    def forward(self, x):
        M, K = x.shape
        N = self.gemm.weight.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        grid = (triton.cdiv(M, 128), triton.cdiv(N, 256))
        use_block_io = all((
            x.data_ptr() % 16 == 0,
            x.stride(1) == 1,
            (x.stride(0) * x.element_size()) % 16 == 0,
            self.gemm.weight.data_ptr() % 16 == 0,
            self.gemm.weight.stride(1) == 1,
            (self.gemm.weight.stride(0) * self.gemm.weight.element_size()) % 16 == 0,
            y.data_ptr() % 16 == 0,
            y.stride(1) == 1,
            (y.stride(0) * y.element_size()) % 16 == 0,
        ))
        if use_block_io and x.device.type == "cuda":
            # device-side tensor descriptors (TMA) need a scratch allocation on NVIDIA GPUs
            triton.set_allocator(lambda size, align, stream, dev=x.device: torch.empty(size, dtype=torch.int8, device=dev))
        matmul_bias_kernel[grid](
            x, self.gemm.weight, self.gemm.bias, y, M, N, K,
            x.stride(0), x.stride(1), self.gemm.weight.stride(0), self.gemm.weight.stride(1),
            y.stride(0), y.stride(1),
            batch_norm_eps=self.batch_norm.eps,
            batch_norm_running_var_ptr=self.batch_norm.running_var,
            batch_norm_weight_ptr=self.batch_norm.weight,
            batch_norm_running_mean_ptr=self.batch_norm.running_mean,
            batch_norm_bias_ptr=self.batch_norm.bias,
            BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, USE_BLOCK_IO=use_block_io, num_stages=3)
        return y
