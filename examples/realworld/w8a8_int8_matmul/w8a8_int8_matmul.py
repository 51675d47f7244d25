"""W8A8 int8 GEMM: int8 activations x int8 weights, int32 accumulation, per-token and per-channel float32 scales.

Follows the quantized-linear form of serving engines: a tile config picked from an M bucket, grouped tile order, torch fallback.
"""
import functools
import os
from typing import Optional

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=64)
def _tile_config(M: int, N: int, K: int) -> dict:
    """Tile sizes by token-count bucket: skinny decode batches get short M tiles and deeper K tiles."""
    if M <= 16:
        cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4)
    elif M <= 64:
        cfg = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_warps=4, num_stages=4)
    elif M <= 256:
        cfg = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4)
    else:
        cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    # never tile wider than the (padded) problem
    cfg["BLOCK_N"] = min(cfg["BLOCK_N"], max(16, triton.next_power_of_2(N)))
    cfg["BLOCK_K"] = min(cfg["BLOCK_K"], max(32, triton.next_power_of_2(K)))
    return cfg


@triton.jit
def _w8a8_mm_kernel(
    A, B, C, Scale_a, Scale_b, Bias,
    M, N, K,
    stride_am, stride_ak,
    stride_bn, stride_bk,
    stride_cm, stride_cn,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    # grouped ordering: GROUP_M row-tiles share each column tile of B while it is hot in L2
    tiles_per_group = GROUP_M * grid_n
    group = pid // tiles_per_group
    first_m = group * GROUP_M
    rows_in_group = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % tiles_per_group) % rows_in_group
    pid_n = (pid % tiles_per_group) // rows_in_group

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N

    a_ptrs = A + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = B + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=m_mask[:, None] & (offs_k[None, :] < k_left), other=0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & n_mask[None, :], other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    sa = tl.load(Scale_a + offs_m, mask=m_mask, other=0.0)
    sb = tl.load(Scale_b + offs_n, mask=n_mask, other=0.0)
    c = acc.to(tl.float32) * sa[:, None] * sb[None, :]
    if HAS_BIAS:
        bias = tl.load(Bias + offs_n, mask=n_mask, other=0.0)
        c += bias.to(tl.float32)[None, :]
    c_ptrs = C + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, c.to(C.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def _torch_scaled_mm(a, b, scale_a, scale_b, bias, out_dtype):
    acc = torch.matmul(a.to(torch.float32), b.to(torch.float32).t())
    res = acc * scale_a.reshape(-1, 1).to(torch.float32) * scale_b.reshape(1, -1).to(torch.float32)
    if bias is not None:
        res = res + bias.to(torch.float32)
    return res.to(out_dtype)


def int8_scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """C[M, N] = (A[M, K] @ B[N, K]^T) * scale_a[M] * scale_b[N] (+ bias[N]); A and B int8.

    The output dtype is ``out_dtype``, else the bias dtype, else the scale dtype.
    """
    assert a.dtype == torch.int8 and b.dtype == torch.int8, "a and b must be int8"
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[1], "expected a [M, K] and b [N, K]"
    M, K = a.shape
    N = b.shape[0]
    assert scale_a.numel() in (1, M) and scale_b.numel() in (1, N), "per-token / per-channel scales"
    if out_dtype is None:
        out_dtype = bias.dtype if bias is not None else scale_a.dtype
    if out is None:
        out = torch.empty((M, N), device=a.device, dtype=out_dtype)
    assert out.shape == (M, N)
    if M == 0 or N == 0:
        return out

    scale_a = scale_a.reshape(-1).to(torch.float32)
    scale_b = scale_b.reshape(-1).to(torch.float32)
    if scale_a.numel() == 1:
        scale_a = scale_a.expand(M).contiguous()
    if scale_b.numel() == 1:
        scale_b = scale_b.expand(N).contiguous()

    if not (a.is_cuda or a.device.type == "xpu" or _INTERPRET):
        out.copy_(_torch_scaled_mm(a, b, scale_a, scale_b, bias, out.dtype))
        return out

    cfg = dict(_tile_config(M, N, K))
    num_warps = cfg.pop("num_warps")
    num_stages = cfg.pop("num_stages")
    grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)
    _w8a8_mm_kernel[grid](
        a, b, out, scale_a, scale_b, bias if bias is not None else scale_b,
        M, N, K,
        a.stride(0), a.stride(1),
        b.stride(0), b.stride(1),
        out.stride(0), out.stride(1),
        HAS_BIAS=bias is not None,
        num_warps=num_warps,
        num_stages=num_stages,
        **cfg,
    )
    return out


def int8_scaled_mm_ref(a, b, scale_a, scale_b, bias=None, out_dtype=None, out=None):
    if out_dtype is None:
        out_dtype = bias.dtype if bias is not None else scale_a.dtype
    # float64 holds every int8 x int8 dot product of any practical K exactly
    acc = torch.matmul(a.to(torch.float64), b.to(torch.float64).t())
    res = acc * scale_a.reshape(-1, 1).to(torch.float64) * scale_b.reshape(1, -1).to(torch.float64)
    if bias is not None:
        res = res + bias.to(torch.float64)
    res = res.to(out_dtype)
    if out is not None:
        out.copy_(res)
        return out
    return res
