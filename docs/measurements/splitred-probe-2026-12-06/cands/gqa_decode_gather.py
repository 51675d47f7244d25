"""Grouped-query decode attention: one program serves all query heads that share a kv head (BLOCK_H rows).

Serving-engine "grouped decode" form over a contiguous [B, T, KVH, D] cache: the shared K/V tile is read once per group.
"""
import math
import os
from typing import Optional

import torch
import triton
import triton.language as tl

_SYNC_AFTER_LAUNCH = os.environ.get("GQA_DECODE_SYNC", "0") == "1"  # debugging aid: surface async faults here
_MIN_BLOCK_H = 16  # tl.dot wants at least 16 rows
_MAX_BLOCK_H = 64


@triton.jit
def _gqa_decode_kernel(
    Q, K, V, Out,
    sm_scale,
    kv_len,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_ob, stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    bid = tl.program_id(0)
    kv_head = tl.program_id(1)
    hblk = tl.program_id(2)

    offs_g = hblk * BLOCK_H + tl.arange(0, BLOCK_H)  # position inside the group
    h_mask = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    offs_n = tl.arange(0, BLOCK_N)

    q = tl.load(Q + bid * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=h_mask[:, None] & d_mask[None, :], other=0.0)

    m_i = tl.full([BLOCK_H], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    k_base = K + bid * stride_kb + kv_head * stride_kh
    v_base = V + bid * stride_vb + kv_head * stride_vh
    for start_n in range(0, kv_len, BLOCK_N):
        cols = start_n + offs_n
        n_mask = cols < kv_len
        kt = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None],
                     mask=d_mask[:, None] & n_mask[None, :], other=0.0)  # [BLOCK_D, BLOCK_N]
        s = tl.dot(q, kt) * sm_scale
        s = tl.where(n_mask[None, :], s, -float("inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :],
                    mask=n_mask[:, None] & d_mask[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    acc = acc / l_i[:, None]
    tl.store(Out + bid * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             acc.to(Out.dtype.element_ty), mask=h_mask[:, None] & d_mask[None, :])


@triton.jit
def _gqa_decode_kernel_split(
    Q, K, V, Out,
    sm_scale,
    kv_len,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_ob, stride_oh,
    m_i_part, l_i_part, acc_part,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
):
    sp = tl.program_id(0) % SPLIT
    bid = (tl.program_id(0) // SPLIT)
    kv_head = tl.program_id(1)
    hblk = tl.program_id(2)

    offs_g = hblk * BLOCK_H + tl.arange(0, BLOCK_H)  # position inside the group
    h_mask = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    offs_n = tl.arange(0, BLOCK_N)

    q = tl.load(Q + bid * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=h_mask[:, None] & d_mask[None, :], other=0.0)

    m_i = tl.full([BLOCK_H], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    k_base = K + bid * stride_kb + kv_head * stride_kh
    v_base = V + bid * stride_vb + kv_head * stride_vh
    # split reduction: slice sp of SPLIT runs steps [it_lo, it_hi) of the loop
    n_it = tl.cdiv(kv_len, BLOCK_N)
    it_per = tl.cdiv(n_it, SPLIT)
    it_lo = sp * it_per
    it_hi = tl.minimum(n_it, it_lo + it_per)
    for start_n in range(it_lo * BLOCK_N, it_hi * BLOCK_N, BLOCK_N):
        cols = start_n + offs_n
        n_mask = cols < kv_len
        kt = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None],
                     mask=d_mask[:, None] & n_mask[None, :], other=0.0)  # [BLOCK_D, BLOCK_N]
        s = tl.dot(q, kt) * sm_scale
        s = tl.where(n_mask[None, :], s, -float("inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :],
                    mask=n_mask[:, None] & d_mask[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    # split reduction: this slice's states, as float32 partials for _gqa_decode_kernel_combine
    part_idx = (((tl.program_id(0) // SPLIT).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) + tl.program_id(2)) * SPLIT + sp
    tl.store(m_i_part + part_idx * (BLOCK_H) + tl.arange(0, BLOCK_H), m_i)
    tl.store(l_i_part + part_idx * (BLOCK_H) + tl.arange(0, BLOCK_H), l_i)
    tl.store(acc_part + part_idx * (BLOCK_H * BLOCK_D) + tl.arange(0, BLOCK_H)[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :], acc)


@triton.jit
def _gqa_decode_kernel_combine(
    Q, K, V, Out,
    sm_scale,
    kv_len,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_ob, stride_oh,
    m_i_part, l_i_part, acc_part,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
):
    bid = tl.program_id(0)
    kv_head = tl.program_id(1)
    hblk = tl.program_id(2)

    offs_g = hblk * BLOCK_H + tl.arange(0, BLOCK_H)  # position inside the group
    h_mask = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    offs_n = tl.arange(0, BLOCK_N)

    q = tl.load(Q + bid * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=h_mask[:, None] & d_mask[None, :], other=0.0)

    m_i = tl.full([BLOCK_H], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    k_base = K + bid * stride_kb + kv_head * stride_kh
    v_base = V + bid * stride_vb + kv_head * stride_vh
    # split reduction: the SPLIT slices' partial states of this program, combined in slice order
    part_idx = ((tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) + tl.program_id(2)) * SPLIT
    for sj in tl.static_range(SPLIT):
        m_i = tl.maximum(m_i, tl.load(m_i_part + (part_idx + sj) * (BLOCK_H) + tl.arange(0, BLOCK_H)))
    for sj in tl.static_range(SPLIT):
        m_j = tl.load(m_i_part + (part_idx + sj) * (BLOCK_H) + tl.arange(0, BLOCK_H))
        w_l_i = tl.exp(m_j - m_i)
        l_i = l_i + tl.where(w_l_i > 0, tl.load(l_i_part + (part_idx + sj) * (BLOCK_H) + tl.arange(0, BLOCK_H)) * w_l_i, 0.0)
        w_acc = tl.exp(m_j - m_i)[:, None]
        acc = acc + tl.where(w_acc > 0, tl.load(acc_part + (part_idx + sj) * (BLOCK_H * BLOCK_D) + tl.arange(0, BLOCK_H)[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]) * w_acc, 0.0)

    acc = acc / l_i[:, None]
    tl.store(Out + bid * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             acc.to(Out.dtype.element_ty), mask=h_mask[:, None] & d_mask[None, :])


def gqa_decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: Optional[float] = None,
) -> torch.Tensor:
    """q: [batch, heads, head_dim]; k, v: [batch, kv_len, kv_heads, head_dim] with heads % kv_heads == 0."""
    assert q.dim() == 3, "q must be [batch, heads, head_dim]"
    assert k.dim() == 4 and k.shape == v.shape, "k and v must be [batch, kv_len, kv_heads, head_dim]"
    batch, num_heads, head_dim = q.shape
    kv_len, num_kv_heads = k.shape[1], k.shape[2]
    assert k.shape[0] == batch and k.shape[3] == head_dim
    assert num_heads % num_kv_heads == 0, f"{num_heads} query heads cannot share {num_kv_heads} kv heads"
    assert k.is_contiguous() and v.is_contiguous(), "cache must be contiguous"
    assert kv_len > 0, "empty cache"
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    q = q.contiguous()
    out = torch.empty_like(q)

    group = num_heads // num_kv_heads
    block_h = min(_MAX_BLOCK_H, max(_MIN_BLOCK_H, triton.next_power_of_2(group)))
    block_d = triton.next_power_of_2(head_dim)
    block_n = 64 if block_d <= 128 else 32
    num_warps = 4 if block_d <= 64 else 8
    grid = (batch, num_kv_heads, triton.cdiv(group, block_h))
    if batch <= 4:
        # split reduction: split_r programs per program of _gqa_decode_kernel, each over a slice of its loop; their partial m_i, l_i, acc
        # go to _gqa_decode_kernel_combine, which combines them and runs the rest
        split_r = 32
        grid_r = grid
        m_i_partials = torch.empty(grid_r[0] * grid_r[1] * grid_r[2] * split_r * block_h, device=q.device, dtype=torch.float32)
        l_i_partials = torch.empty(grid_r[0] * grid_r[1] * grid_r[2] * split_r * block_h, device=q.device, dtype=torch.float32)
        acc_partials = torch.empty(grid_r[0] * grid_r[1] * grid_r[2] * split_r * block_h * block_d, device=q.device, dtype=torch.float32)
        _gqa_decode_kernel_split[(grid_r[0] * split_r, grid_r[1], grid_r[2])](
            q, k, v, out,
            sm_scale,
            kv_len,
            q.stride(0), q.stride(1),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            out.stride(0), out.stride(1),
            m_i_part=m_i_partials, l_i_part=l_i_partials, acc_part=acc_partials, SPLIT=split_r,
            GROUP=group,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            BLOCK_H=block_h,
            BLOCK_N=block_n,
            num_warps=num_warps,
            num_stages=2,
        )
        _gqa_decode_kernel_combine[grid_r](
            q, k, v, out,
            sm_scale,
            kv_len,
            q.stride(0), q.stride(1),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            out.stride(0), out.stride(1),
            m_i_part=m_i_partials, l_i_part=l_i_partials, acc_part=acc_partials, SPLIT=split_r,
            GROUP=group,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            BLOCK_H=block_h,
            BLOCK_N=block_n,
            num_warps=num_warps,
            num_stages=2,
        )
    else:
        _gqa_decode_kernel[grid](
            q, k, v, out,
            sm_scale,
            kv_len,
            q.stride(0), q.stride(1),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            out.stride(0), out.stride(1),
            GROUP=group,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            BLOCK_H=block_h,
            BLOCK_N=block_n,
            num_warps=num_warps,
            num_stages=2,
        )
    if _SYNC_AFTER_LAUNCH and q.is_cuda:
        torch.cuda.synchronize()
    return out


def gqa_decode_attention_ref(q, k, v, sm_scale=None):
    batch, num_heads, head_dim = q.shape
    group = num_heads // k.shape[2]
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    cdt = q.dtype  # as a bf16 model computes (the oracle runs this in float64)
    kk = k.to(cdt).repeat_interleave(group, dim=2)  # [B, T, H, D]
    vv = v.to(cdt).repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,bthd->bht", q.to(cdt), kk) * sm_scale
    return torch.einsum("bht,bthd->bhd", torch.softmax(scores, dim=-1), vv).to(q.dtype)


# ---- xeforge new: everything below is generated (docs/new.md) and is not part of examples/realworld/gqa_decode_gather/gqa_decode_gather.py ----
import torch


class Model(torch.nn.Module):
    """Calls gqa_decode_attention(...) as examples/realworld/gqa_decode_gather/gqa_decode_gather.py's users do (generated by `xeforge new`: docs/new.md)."""

    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        result = gqa_decode_attention(q, k, v)
        return result
