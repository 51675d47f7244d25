"""Naive port of KernelBench L2 #64: Linear -> logsumexp(dim=1) -> LeakyReLU x2 -> GELU x2.
Triton GEMM writes the full [M, N] fp32 product, the tail runs as torch ops."""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def matmul_bias_kernel(a_ptr, w_ptr, bias_ptr, c_ptr, M, N, K,
                       stride_am, stride_ak, stride_wn, stride_wk, stride_cm, stride_cn,
                       part_ptr, stride_part,
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
    # fused from Model.forward: logsumexp; one partial per row for this column tile, reduced in forward
    col_mask = offs_n[None, :] < N
    row_max = tl.max(tl.where(col_mask, acc, float("-inf")), axis=1)
    row = row_max + tl.log(tl.sum(tl.where(col_mask, tl.exp(acc - row_max[:, None]), 0.0), axis=1))
    tl.store(part_ptr + offs_m * stride_part + pid_n, row.to(part_ptr.dtype.element_ty), mask=offs_m < M)


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)

    def forward(self, x):
        M, K = x.shape
        N = self.linear.weight.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=torch.float32)
        grid = (triton.cdiv(M, 128), triton.cdiv(N, 256))
        row_part = torch.full((y.shape[0], triton.cdiv(y.shape[-1], 16)), float("-inf"), device=y.device, dtype=y.dtype)
        use_block_io = all((
            x.data_ptr() % 16 == 0,
            x.stride(1) == 1,
            (x.stride(0) * x.element_size()) % 16 == 0,
            self.linear.weight.data_ptr() % 16 == 0,
            self.linear.weight.stride(1) == 1,
            (self.linear.weight.stride(0) * self.linear.weight.element_size()) % 16 == 0,
        ))
        if use_block_io and x.device.type == "cuda":
            # device-side tensor descriptors (TMA) need a scratch allocation on NVIDIA GPUs
            triton.set_allocator(lambda size, align, stream, dev=x.device: torch.empty(size, dtype=torch.int8, device=dev))
        matmul_bias_kernel[grid](
            x, self.linear.weight, self.linear.bias, y, M, N, K,
            x.stride(0), x.stride(1), self.linear.weight.stride(0), self.linear.weight.stride(1),
            y.stride(0), y.stride(1),
            part_ptr=row_part, stride_part=row_part.stride(0),
            BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, USE_BLOCK_IO=use_block_io, num_stages=3)
        y = torch.logsumexp(row_part, dim=1, keepdim=True)
        y = F.leaky_relu(y, negative_slope=0.01)
        y = F.leaky_relu(y, negative_slope=0.01)
        y = F.gelu(y)
        y = F.gelu(y)
        return y.to(x.dtype)
