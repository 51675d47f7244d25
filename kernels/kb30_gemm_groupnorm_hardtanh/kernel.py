"""Naive port of KernelBench L2 #30: Linear -> GroupNorm -> Hardtanh.
Triton GEMM writes the full [M, N] fp32 product, GroupNorm and Hardtanh run as torch ops."""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def matmul_bias_kernel(a_ptr, w_ptr, bias_ptr, c_ptr, M, N, K,
                       stride_am, stride_ak, stride_wn, stride_wk, stride_cm, stride_cn,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C = A @ W^T + bias, W in nn.Linear layout [N, K]. Straight CUDA-style port: one C tile per
    program on a 2D grid, both operands up-cast to fp32 before the dot."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0).to(tl.float32)
        b = tl.load(w_ptr + k[:, None] * stride_wk + offs_n[None, :] * stride_wn,
                    mask=(k[:, None] < K) & (offs_n[None, :] < N), other=0.0).to(tl.float32)
        acc += tl.dot(a, b)
    bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    acc = acc + bias[None, :]
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
             acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features, num_groups, hardtanh_min, hardtanh_max):
        super().__init__()
        self.gemm = torch.nn.Linear(in_features, out_features)
        self.group_norm = torch.nn.GroupNorm(num_groups, out_features)
        self.hardtanh_min = hardtanh_min
        self.hardtanh_max = hardtanh_max
        with torch.no_grad():  # non-trivial, deterministic affine
            self.group_norm.weight.copy_(torch.linspace(0.5, 1.5, out_features))
            self.group_norm.bias.copy_(torch.linspace(-0.25, 0.25, out_features))

    def forward(self, x):
        M, K = x.shape
        N = self.gemm.weight.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=torch.float32)
        grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
        matmul_bias_kernel[grid](
            x, self.gemm.weight, self.gemm.bias, y, M, N, K,
            x.stride(0), x.stride(1), self.gemm.weight.stride(0), self.gemm.weight.stride(1),
            y.stride(0), y.stride(1),
            BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, num_warps=4)
        y = F.group_norm(y, self.group_norm.num_groups, self.group_norm.weight.float(),
                         self.group_norm.bias.float(), self.group_norm.eps)
        y = F.hardtanh(y, self.hardtanh_min, self.hardtanh_max)
        return y.to(x.dtype)
