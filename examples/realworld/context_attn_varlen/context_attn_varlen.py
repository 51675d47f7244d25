"""Causal prefill attention over packed variable-length sequences ([total_tokens, heads, head_dim] + cu_seqlens).

Imitates the "no-padding" context-attention form of LLM serving engines: one program per (query block, batch*head).
"""
import math
from typing import Optional

import torch
import triton
import triton.language as tl

# head_dim -> (BLOCK_M, BLOCK_N, num_warps)
_BLOCK_CONFIGS = {
    16: (16, 16, 4),
    32: (32, 32, 4),
    64: (64, 64, 4),
    80: (64, 32, 4),
    96: (64, 32, 4),
    128: (128, 64, 8),
    256: (64, 32, 8),
}


@triton.jit
def _varlen_causal_fwd_kernel(
    Q, K, V, Out, Cu_seqlens,
    sm_scale,
    num_heads,
    stride_qt, stride_qh,
    stride_kt, stride_kh,
    stride_vt, stride_vh,
    stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    seq_id = bh // num_heads
    head = bh % num_heads

    seq_start = tl.load(Cu_seqlens + seq_id)
    seq_len = tl.load(Cu_seqlens + seq_id + 1) - seq_start
    block_start = start_m * BLOCK_M
    if block_start >= seq_len:
        return

    offs_m = block_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < seq_len
    d_valid = offs_d < HEAD_DIM

    q_ptrs = Q + (seq_start + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_valid[:, None] & d_valid[None, :], other=0.0)
    # fold the softmax scale and log2(e) into q once, then use exp2
    qk_scale = sm_scale * 1.4426950408889634

    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    k_base = K + seq_start * stride_kt + head * stride_kh
    v_base = V + seq_start * stride_vt + head * stride_vh
    # causal: keys past the last query row of this block are never needed
    hi = tl.minimum(block_start + BLOCK_M, seq_len)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        n_valid = cols < seq_len
        k = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None],
                    mask=n_valid[None, :] & d_valid[:, None], other=0.0)
        qk = tl.dot(q, k) * qk_scale
        keep = (offs_m[:, None] >= cols[None, :]) & n_valid[None, :]
        qk = tl.where(keep, qk, -float("inf"))

        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)

        v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :],
                    mask=n_valid[:, None] & d_valid[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    acc = acc / l_i[:, None]
    o_ptrs = Out + (seq_start + offs_m)[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])


def context_attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    sm_scale: Optional[float] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Causal attention of each packed sequence with itself. q, k, v: [total_tokens, heads, head_dim]."""
    assert q.dim() == 3 and q.shape == k.shape == v.shape, "q, k, v must all be [total_tokens, heads, head_dim]"
    assert cu_seqlens.dim() == 1 and cu_seqlens.numel() >= 2
    total_tokens, num_heads, head_dim = q.shape
    assert head_dim in _BLOCK_CONFIGS, f"unsupported head_dim {head_dim}"
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    if out is None:
        out = torch.empty_like(q)
    if total_tokens == 0:
        return out
    for t in (q, k, v):
        assert t.stride(-1) == 1, "last dim must be contiguous"

    batch = cu_seqlens.numel() - 1
    block_m, block_n, num_warps = _BLOCK_CONFIGS[head_dim]
    grid = (triton.cdiv(max_seqlen, block_m), batch * num_heads)
    _varlen_causal_fwd_kernel[grid](
        q, k, v, out, cu_seqlens,
        sm_scale,
        num_heads,
        q.stride(0), q.stride(1),
        k.stride(0), k.stride(1),
        v.stride(0), v.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=num_warps,
        num_stages=1,
    )
    return out


def context_attention_fwd_ref(q, k, v, cu_seqlens, max_seqlen, sm_scale=None, out=None):
    head_dim = q.shape[-1]
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    cdt = q.dtype  # as a bf16 model computes (the oracle runs this in float64)
    res = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for s, e in zip(bounds[:-1], bounds[1:]):
        if e == s:
            continue
        qs = q[s:e].to(cdt).transpose(0, 1)  # [H, L, D]
        ks = k[s:e].to(cdt).transpose(0, 1)
        vs = v[s:e].to(cdt).transpose(0, 1)
        scores = torch.matmul(qs, ks.transpose(1, 2)) * sm_scale
        n = e - s
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        res[s:e] = torch.matmul(torch.softmax(scores, dim=-1), vs).transpose(0, 1).to(q.dtype)
    if out is not None:
        out.copy_(res)
        return out
    return res
