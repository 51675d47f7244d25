"""Linear layer y = gelu(x @ W^T + b) with the exact (erf) GELU fused into the epilogue and an
@triton.heuristics EVEN_K flag that drops the K masks when BLOCK_K divides K, in the style of
fused-MLP kernels of training libraries. Original code for the xeforge corpus."""
import math

import torch
import triton
import triton.language as tl

_INV_SQRT2 = 1.0 / math.sqrt(2.0)


@triton.jit
def _gelu_erf(x):
    return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))


@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit
def _linear_bias_gelu_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr,
    M, N, K,
    stride_xm, stride_xk,
    stride_wn, stride_wk,
    stride_ym, stride_yn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, EVEN_K: tl.constexpr,
):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_SIZE_M * grid_n
    gid = pid // width
    gsize = min(grid_m - gid * GROUP_SIZE_M, GROUP_SIZE_M)
    pid_m = gid * GROUP_SIZE_M + (pid % width) % gsize
    pid_n = (pid % width) // gsize

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    # W is [N, K] (nn.Linear layout): the B operand is its transpose
    w_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            xt = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
            wt = tl.load(w_ptrs, mask=n_mask[None, :], other=0.0)
        else:
            k_left = K - k * BLOCK_K
            xt = tl.load(x_ptrs, mask=m_mask[:, None] & (offs_k[None, :] < k_left), other=0.0)
            wt = tl.load(w_ptrs, mask=(offs_k[:, None] < k_left) & n_mask[None, :], other=0.0)
        acc += tl.dot(xt, wt)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    bias = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    acc = _gelu_erf(acc + bias[None, :])
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def linear_bias_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(x @ weight.T + bias) for x [..., K], weight [N, K], bias [N]."""
    assert weight.dim() == 2 and bias.dim() == 1
    assert x.shape[-1] == weight.shape[1], "x and weight disagree on K"
    assert bias.shape[0] == weight.shape[0], "bias must have N entries"
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    M, K = x2.shape
    N = weight.shape[0]
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    if M == 0:
        return y.reshape(*lead, N)
    if x.dtype == torch.float32:
        block_m, block_n, block_k, warps, stages = 32, 32, 32, 4, 3
    else:
        block_m, block_n, block_k = 128, 128, 64
        warps, stages = (8, 3) if M >= 128 else (4, 4)
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    _linear_bias_gelu_kernel[grid](
        x2, weight, bias, y,
        M, N, K,
        x2.stride(0), x2.stride(1),
        weight.stride(0), weight.stride(1),
        y.stride(0), y.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_SIZE_M=8,
        num_warps=warps, num_stages=stages,
    )
    return y.reshape(*lead, N)


def linear_bias_gelu_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    z = x @ weight.t() + bias
    return 0.5 * z * (1.0 + torch.erf(z * _INV_SQRT2))
