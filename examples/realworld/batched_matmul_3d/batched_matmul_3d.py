"""Batched GEMM C[b] = A[b] @ B[b] for [B, M, K] x [B, K, N] on a 3-D grid (M tiles, N tiles, batch)
with per-batch strides, so strided / transposed views need no copy; the bmm form of serving
projects (e.g. per-head absorbed projections). Original code for the xeforge corpus."""
from typing import Optional

import torch
import triton
import triton.language as tl


def _bmm_blocks(M: int, N: int, K: int, dtype: torch.dtype):
    if dtype == torch.float32:
        return 32, 32, 32, 4, 3
    block_m = 128 if M >= 128 else max(16, triton.next_power_of_2(M))
    block_n = 128 if N >= 128 else max(16, triton.next_power_of_2(N))
    block_k = 64 if K >= 64 else max(16, triton.next_power_of_2(K))
    num_warps = 8 if block_m * block_n >= 128 * 128 else 4
    return block_m, block_n, block_k, num_warps, 3


@triton.jit
def _bmm_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    bid = tl.program_id(2).to(tl.int64)

    a_base = a_ptr + bid * stride_ab
    b_base = b_ptr + bid * stride_bb
    c_base = c_ptr + bid * stride_cb

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    in_m = offs_m < M
    in_n = offs_n < N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        in_k = kk < K
        a = tl.load(a_base + offs_m[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=in_m[:, None] & in_k[None, :], other=0.0)
        b = tl.load(b_base + kk[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=in_k[:, None] & in_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc)

    tl.store(c_base + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
             acc.to(c_ptr.dtype.element_ty), mask=in_m[:, None] & in_n[None, :])


def bmm(a: torch.Tensor, b: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    assert a.dim() == 3 and b.dim() == 3, "bmm expects [B, M, K] and [B, K, N]"
    assert a.shape[0] == b.shape[0], "batch sizes differ"
    assert a.shape[2] == b.shape[1], "inner dimensions differ"
    assert a.dtype == b.dtype
    Bt, M, K = a.shape
    N = b.shape[2]
    if out is None:
        out = torch.empty((Bt, M, N), device=a.device, dtype=a.dtype)
    else:
        assert out.shape == (Bt, M, N) and out.dtype == a.dtype
    if out.numel() == 0:
        return out
    block_m, block_n, block_k, warps, stages = _bmm_blocks(M, N, K, a.dtype)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n), Bt)
    _bmm_kernel[grid](
        a, b, out,
        M, N, K,
        a.stride(0), a.stride(1), a.stride(2),
        b.stride(0), b.stride(1), b.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps, num_stages=stages,
    )
    return out


def bmm_ref(a: torch.Tensor, b: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    return torch.bmm(a, b)
