"""Naive port of KernelBench L2 #37: Linear -> Swish -> + bias -> GroupNorm.
Triton GEMM writes fp32 y, a separate Triton elementwise kernel does swish + bias,
GroupNorm runs as a torch op."""
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


@triton.jit
def swish_bias_kernel(y_ptr, bias_ptr, out_ptr, n_elements, N, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    col = offs % N
    y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(bias_ptr + col, mask=mask, other=0.0).to(tl.float32)
    y = y * tl.sigmoid(y) + b
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features, num_groups):
        super().__init__()
        self.matmul = torch.nn.Linear(in_features, out_features)
        self.bias = torch.nn.Parameter(torch.randn(out_features))
        self.group_norm = torch.nn.GroupNorm(num_groups, out_features)
        with torch.no_grad():  # non-trivial, deterministic affine
            self.group_norm.weight.copy_(torch.linspace(0.5, 1.5, out_features))
            self.group_norm.bias.copy_(torch.linspace(-0.25, 0.25, out_features))

    def forward(self, x):
        M, K = x.shape
        N = self.matmul.weight.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=torch.float32)
        grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
        matmul_bias_kernel[grid](
            x, self.matmul.weight, self.matmul.bias, y, M, N, K,
            x.stride(0), x.stride(1), self.matmul.weight.stride(0), self.matmul.weight.stride(1),
            y.stride(0), y.stride(1),
            BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, num_warps=4)
        z = torch.empty_like(y)
        n = y.numel()
        swish_bias_kernel[(triton.cdiv(n, 1024),)](y, self.bias, z, n, N, BLOCK_SIZE=1024, num_warps=4)
        z = F.group_norm(z, self.group_norm.num_groups, self.group_norm.weight.float(),
                         self.group_norm.bias.float(), self.group_norm.eps)
        return z.to(x.dtype)
