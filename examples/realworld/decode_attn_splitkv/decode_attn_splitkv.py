"""Split-KV ("flash decoding") attention for one query token per sequence over a contiguous KV cache.

Two launches in the style of serving-engine decode kernels: per-split partial softmax state, then a log-sum-exp merge.
"""
import math
from typing import Optional

import torch
import triton
import triton.language as tl


# how many programs stage 1 should roughly launch before splitting the sequence further stops paying off
_TARGET_PROGRAMS = 1024
_MAX_SPLITS = 64
_MIN_BLOCK_SEQ = 16


@triton.jit
def _splitkv_stage1_kernel(
    Q, K, V, sm_scale,
    Mid_O, Mid_Lse,
    kv_len,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_mob, stride_moh, stride_mos,
    stride_mlb, stride_mlh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SEQ: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    bid = tl.program_id(0)
    hid = tl.program_id(1)
    split = tl.program_id(2)

    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    seq_begin = split * BLOCK_SEQ
    seq_end = tl.minimum(seq_begin + BLOCK_SEQ, kv_len)

    q = tl.load(Q + bid * stride_qb + hid * stride_qh + offs_d, mask=d_mask, other=0.0).to(tl.float32)

    m_run = -float("inf")
    l_run = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)

    k_base = K + bid * stride_kb + hid * stride_kh
    v_base = V + bid * stride_vb + hid * stride_vh
    for start in range(seq_begin, seq_end, BLOCK_N):
        offs_t = start + tl.arange(0, BLOCK_N)
        t_mask = offs_t < seq_end
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + offs_t[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.sum(q[None, :] * k.to(tl.float32), axis=1) * sm_scale
        s = tl.where(t_mask, s, -float("inf"))

        m_new = tl.maximum(m_run, tl.max(s, axis=0))
        alpha = tl.exp(m_run - m_new)
        p = tl.exp(s - m_new)
        v = tl.load(v_base + offs_t[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        l_run = l_run * alpha + tl.sum(p, axis=0)
        m_run = m_new

    mo_ptr = Mid_O + bid * stride_mob + hid * stride_moh + split * stride_mos + offs_d
    tl.store(mo_ptr, acc / l_run, mask=d_mask)
    tl.store(Mid_Lse + bid * stride_mlb + hid * stride_mlh + split, m_run + tl.log(l_run))


@triton.jit
def _splitkv_stage2_kernel(
    Mid_O, Mid_Lse, Out,
    num_splits,
    stride_mob, stride_moh, stride_mos,
    stride_mlb, stride_mlh,
    stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    bid = tl.program_id(0)
    hid = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM

    lse_max = -float("inf")
    denom = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    mo_base = Mid_O + bid * stride_mob + hid * stride_moh
    ml_base = Mid_Lse + bid * stride_mlb + hid * stride_mlh
    for sp in range(0, num_splits):
        part = tl.load(mo_base + sp * stride_mos + offs_d, mask=d_mask, other=0.0)
        lse = tl.load(ml_base + sp)
        new_max = tl.maximum(lse_max, lse)
        rescale = tl.exp(lse_max - new_max)
        w = tl.exp(lse - new_max)
        acc = acc * rescale + w * part
        denom = denom * rescale + w
        lse_max = new_max

    out = acc / denom
    tl.store(Out + bid * stride_ob + hid * stride_oh + offs_d, out.to(Out.dtype.element_ty), mask=d_mask)


def _pick_block_seq(batch: int, heads: int, kv_len: int) -> int:
    """Split the sequence so that batch * heads * splits lands near _TARGET_PROGRAMS."""
    want_splits = min(_MAX_SPLITS, max(1, triton.cdiv(_TARGET_PROGRAMS, batch * heads)))
    block_seq = triton.next_power_of_2(triton.cdiv(kv_len, want_splits))
    return max(_MIN_BLOCK_SEQ, block_seq)


def decode_attention_splitkv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: Optional[float] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """q: [batch, heads, head_dim]; k, v: [batch, kv_len, heads, head_dim]. Returns [batch, heads, head_dim]."""
    assert q.dim() == 3 and k.dim() == 4 and v.shape == k.shape, "expected q [B, H, D] and k/v [B, T, H, D]"
    batch, heads, head_dim = q.shape
    assert k.shape[0] == batch and k.shape[2] == heads and k.shape[3] == head_dim
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    if out is None:
        out = torch.empty_like(q)
    kv_len = k.shape[1]
    if q.numel() == 0:
        return out
    if kv_len == 0:
        return out.zero_()

    q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()

    block_d = triton.next_power_of_2(head_dim)
    block_seq = _pick_block_seq(batch, heads, kv_len)
    block_n = min(64, block_seq)
    num_splits = triton.cdiv(kv_len, block_seq)
    num_warps = 4 if block_d <= 64 else 8

    mid_o = torch.empty((batch, heads, num_splits, head_dim), device=q.device, dtype=torch.float32)
    mid_lse = torch.empty((batch, heads, num_splits), device=q.device, dtype=torch.float32)

    _splitkv_stage1_kernel[(batch, heads, num_splits)](
        q, k, v, sm_scale,
        mid_o, mid_lse,
        kv_len,
        q.stride(0), q.stride(1),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_SEQ=block_seq, BLOCK_N=block_n,
        num_warps=num_warps, num_stages=2,
    )
    _splitkv_stage2_kernel[(batch, heads)](
        mid_o, mid_lse, out,
        num_splits,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=block_d,
        num_warps=4, num_stages=2,
    )
    return out


def decode_attention_splitkv_ref(q, k, v, sm_scale=None, out=None):
    head_dim = q.shape[-1]
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    cdt = q.dtype  # as a bf16 model computes (the oracle runs this in float64)
    scores = torch.einsum("bhd,bthd->bht", q.to(cdt), k.to(cdt)) * sm_scale
    probs = torch.softmax(scores, dim=-1)
    res = torch.einsum("bht,bthd->bhd", probs, v.to(cdt)).to(q.dtype)
    if out is not None:
        out.copy_(res)
        return out
    return res
