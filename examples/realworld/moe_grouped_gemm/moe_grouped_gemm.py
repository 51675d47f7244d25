"""MoE grouped GEMM: tokens already sorted by expert, out[t] = x[t] @ w[e(t)]^T with w [E, N, K];
the host pads every expert's rows to BLOCK_M and builds a block -> expert map, then a 2-D grid
(token blocks, N tiles) runs, in the fused_moe style of serving projects. Original code."""
from typing import Tuple

import torch
import triton
import triton.language as tl


def _moe_block_config(tokens: int, num_experts: int, dtype: torch.dtype) -> dict:
    per_expert = max(1, tokens // max(1, num_experts))
    if per_expert <= 16:
        cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4)
    elif per_expert <= 128:
        cfg = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=4)
    else:
        cfg = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)
    if dtype == torch.float32:
        cfg["BLOCK_K"] = min(cfg["BLOCK_K"], 32)
        cfg["BLOCK_N"] = min(cfg["BLOCK_N"], 32)
    return cfg


def _align_rows_to_blocks(expert_offsets: torch.Tensor, block_m: int,
                          num_tokens: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Row ids padded per expert to a multiple of block_m (padding = num_tokens) and the expert of each block."""
    bounds = expert_offsets.tolist()
    device = expert_offsets.device
    row_chunks, expert_chunks = [], []
    for e in range(len(bounds) - 1):
        start, end = bounds[e], bounds[e + 1]
        count = end - start
        if count <= 0:
            continue
        n_blocks = triton.cdiv(count, block_m)
        rows = torch.full((n_blocks * block_m,), num_tokens, dtype=torch.int32, device=device)
        rows[:count] = torch.arange(start, end, dtype=torch.int32, device=device)
        row_chunks.append(rows)
        expert_chunks.append(torch.full((n_blocks,), e, dtype=torch.int32, device=device))
    if not row_chunks:
        empty = torch.empty((0,), dtype=torch.int32, device=device)
        return empty, empty
    return torch.cat(row_chunks), torch.cat(expert_chunks)


@triton.jit
def _moe_grouped_gemm_kernel(
    x_ptr, w_ptr, out_ptr,
    row_ids_ptr, block_expert_ptr,
    N, K, num_tokens,
    stride_xm, stride_xk,
    stride_we, stride_wn, stride_wk,
    stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)

    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rows = tl.load(row_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    row_ok = rows < num_tokens

    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)

    x_ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_xm + ks[None, :] * stride_xk
    # w[e] is [N, K]; read it transposed as a [BLOCK_K, BLOCK_N] tile
    w_ptrs = w_ptr + expert * stride_we + cols[None, :] * stride_wn + ks[:, None] * stride_wk

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + ks) < K
        xt = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        wt = tl.load(w_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(xt, wt, acc)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    o_ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :] * stride_on
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def moe_grouped_gemm(x: torch.Tensor, w: torch.Tensor, expert_offsets: torch.Tensor) -> torch.Tensor:
    """x [T, K] sorted by expert, w [E, N, K], expert_offsets [E + 1] (rows of expert e: offsets[e]:offsets[e+1])."""
    assert x.dim() == 2 and w.dim() == 3, "x must be [tokens, K] and w [experts, N, K]"
    assert x.shape[1] == w.shape[2], "hidden size of x and w differ"
    assert expert_offsets.numel() == w.shape[0] + 1, "need E + 1 expert offsets"
    assert x.dtype == w.dtype
    x = x.contiguous()
    w = w.contiguous()
    T, K = x.shape
    E, N, _ = w.shape
    out = torch.zeros((T, N), device=x.device, dtype=x.dtype)
    if T == 0:
        return out
    cfg = _moe_block_config(T, E, x.dtype)
    row_ids, block_expert = _align_rows_to_blocks(expert_offsets, cfg["BLOCK_M"], T)
    n_blocks = block_expert.numel()
    if n_blocks == 0:
        return out
    grid = (n_blocks, triton.cdiv(N, cfg["BLOCK_N"]))
    _moe_grouped_gemm_kernel[grid](
        x, w, out,
        row_ids, block_expert,
        N, K, T,
        x.stride(0), x.stride(1),
        w.stride(0), w.stride(1), w.stride(2),
        out.stride(0), out.stride(1),
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return out


def moe_grouped_gemm_ref(x: torch.Tensor, w: torch.Tensor, expert_offsets: torch.Tensor) -> torch.Tensor:
    out = torch.zeros((x.shape[0], w.shape[1]), device=x.device, dtype=x.dtype)
    bounds = expert_offsets.tolist()
    for e in range(w.shape[0]):
        s, t = bounds[e], bounds[e + 1]
        if t > s:
            out[s:t] = x[s:t] @ w[e].t()
    return out
