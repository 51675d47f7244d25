"""Decode attention over a paged KV cache ([num_blocks, block_size, kv_heads, head_dim] + block_tables), with GQA.

Imitates the Triton paged-attention form of LLM serving engines: one program per (sequence, query head), page walk.
"""
import math
from typing import Optional

import torch
import triton
import triton.language as tl


@triton.jit
def _load_page(Cache, block_id, offs_tok, offs_d, kv_head, tok_mask, d_mask,
               stride_cb, stride_ct, stride_ch):
    """One page of one kv head as a [PAGE, BLOCK_D] tile (tokens past the context read as zero)."""
    ptrs = (Cache + block_id.to(tl.int64) * stride_cb + kv_head * stride_ch
            + offs_tok[:, None] * stride_ct + offs_d[None, :])
    return tl.load(ptrs, mask=tok_mask[:, None] & d_mask[None, :], other=0.0)


@triton.jit
def _paged_decode_kernel(
    Q, K_cache, V_cache, Block_tables, Context_lens, Out,
    sm_scale,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_btb,
    stride_ob, stride_oh,
    QUERY_GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // QUERY_GROUP

    ctx_len = tl.load(Context_lens + seq)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    offs_tok = tl.arange(0, PAGE_SIZE)

    q = tl.load(Q + seq * stride_qb + head * stride_qh + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    q = q * sm_scale

    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    num_pages = tl.cdiv(ctx_len, PAGE_SIZE)
    for page in range(0, num_pages):
        block_id = tl.load(Block_tables + seq * stride_btb + page)
        tok_pos = page * PAGE_SIZE + offs_tok
        tok_mask = tok_pos < ctx_len

        k = _load_page(K_cache, block_id, offs_tok, offs_d, kv_head, tok_mask, d_mask,
                       stride_kb, stride_kt, stride_kh)
        s = tl.sum(k.to(tl.float32) * q[None, :], axis=1)
        s = tl.where(tok_mask, s, -float("inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        scale_old = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        v = _load_page(V_cache, block_id, offs_tok, offs_d, kv_head, tok_mask, d_mask,
                       stride_vb, stride_vt, stride_vh)
        acc = acc * scale_old + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        l_i = l_i * scale_old + tl.sum(p, axis=0)
        m_i = m_new

    out = acc / l_i
    tl.store(Out + seq * stride_ob + head * stride_oh + offs_d, out.to(Out.dtype.element_ty), mask=d_mask)


@triton.jit
def _paged_decode_kernel_split(
    Q, K_cache, V_cache, Block_tables, Context_lens, Out,
    sm_scale,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_btb,
    stride_ob, stride_oh,
    m_i_part, acc_part, l_i_part,
    QUERY_GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    SPLIT: tl.constexpr,
):
    sp = tl.program_id(0) % SPLIT
    seq = (tl.program_id(0) // SPLIT)
    head = tl.program_id(1)
    kv_head = head // QUERY_GROUP

    ctx_len = tl.load(Context_lens + seq)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    offs_tok = tl.arange(0, PAGE_SIZE)

    q = tl.load(Q + seq * stride_qb + head * stride_qh + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    q = q * sm_scale

    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    num_pages = tl.cdiv(ctx_len, PAGE_SIZE)
    # split reduction: slice sp of SPLIT runs steps [it_lo, it_hi) of the loop
    n_it = num_pages
    it_per = tl.cdiv(n_it, SPLIT)
    it_lo = sp * it_per
    it_hi = tl.minimum(n_it, it_lo + it_per)
    for page in range(it_lo, it_hi):
        block_id = tl.load(Block_tables + seq * stride_btb + page)
        tok_pos = page * PAGE_SIZE + offs_tok
        tok_mask = tok_pos < ctx_len

        k = _load_page(K_cache, block_id, offs_tok, offs_d, kv_head, tok_mask, d_mask,
                       stride_kb, stride_kt, stride_kh)
        s = tl.sum(k.to(tl.float32) * q[None, :], axis=1)
        s = tl.where(tok_mask, s, -float("inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        scale_old = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        v = _load_page(V_cache, block_id, offs_tok, offs_d, kv_head, tok_mask, d_mask,
                       stride_vb, stride_vt, stride_vh)
        acc = acc * scale_old + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        l_i = l_i * scale_old + tl.sum(p, axis=0)
        m_i = m_new

    # split reduction: this slice's states, as float32 partials for _paged_decode_kernel_combine
    part_idx = (((tl.program_id(0) // SPLIT).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) + tl.program_id(2)) * SPLIT + sp
    tl.store(m_i_part + part_idx, m_i)
    tl.store(acc_part + part_idx * (BLOCK_D) + tl.arange(0, BLOCK_D), acc)
    tl.store(l_i_part + part_idx, l_i)


@triton.jit
def _paged_decode_kernel_combine(
    Q, K_cache, V_cache, Block_tables, Context_lens, Out,
    sm_scale,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_btb,
    stride_ob, stride_oh,
    m_i_part, acc_part, l_i_part,
    QUERY_GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    SPLIT: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // QUERY_GROUP

    ctx_len = tl.load(Context_lens + seq)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    offs_tok = tl.arange(0, PAGE_SIZE)

    q = tl.load(Q + seq * stride_qb + head * stride_qh + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    q = q * sm_scale

    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    num_pages = tl.cdiv(ctx_len, PAGE_SIZE)
    # split reduction: the SPLIT slices' partial states of this program, combined in slice order
    part_idx = ((tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) + tl.program_id(2)) * SPLIT
    for sj in tl.static_range(SPLIT):
        m_i = tl.maximum(m_i, tl.load(m_i_part + part_idx + sj))
    for sj in tl.static_range(SPLIT):
        m_j = tl.load(m_i_part + part_idx + sj)
        w_acc = tl.exp(m_j - m_i)
        acc = acc + tl.where(w_acc > 0, tl.load(acc_part + (part_idx + sj) * (BLOCK_D) + tl.arange(0, BLOCK_D)) * w_acc, 0.0)
        w_l_i = tl.exp(m_j - m_i)
        l_i = l_i + tl.where(w_l_i > 0, tl.load(l_i_part + part_idx + sj) * w_l_i, 0.0)

    out = acc / l_i
    tl.store(Out + seq * stride_ob + head * stride_oh + offs_d, out.to(Out.dtype.element_ty), mask=d_mask)


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    sm_scale: Optional[float] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """q: [batch, heads, head_dim]; caches: [num_blocks, block_size, kv_heads, head_dim];
    block_tables: [batch, max_blocks_per_seq] int; context_lens: [batch] int (every length >= 1)."""
    assert q.dim() == 3 and k_cache.dim() == 4 and k_cache.shape == v_cache.shape
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    assert cache_head_dim == head_dim, "q and cache head_dim differ"
    assert num_heads % num_kv_heads == 0, "query heads must be a multiple of kv heads"
    assert block_size & (block_size - 1) == 0, "block_size must be a power of two"
    assert block_tables.dim() == 2 and block_tables.shape[0] == batch
    assert context_lens.numel() == batch
    for t in (k_cache, v_cache):
        assert t.stride(-1) == 1, "cache head_dim must be contiguous"
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    if out is None:
        out = torch.empty_like(q)
    if q.numel() == 0:
        return out

    q = q.contiguous()
    block_tables = block_tables.contiguous()
    context_lens = context_lens.contiguous()
    block_d = triton.next_power_of_2(head_dim)
    num_warps = 4 if block_d * block_size <= 2048 else 8

    if batch <= 4:
        # split reduction: split_r programs per program of _paged_decode_kernel, each over a slice of its loop; their partial m_i, acc, l_i
        # go to _paged_decode_kernel_combine, which combines them and runs the rest
        split_r = 8
        grid_r = (batch, num_heads)
        m_i_partials = torch.empty(grid_r[0] * grid_r[1] * split_r, device=q.device, dtype=torch.float32)
        acc_partials = torch.empty(grid_r[0] * grid_r[1] * split_r * block_d, device=q.device, dtype=torch.float32)
        l_i_partials = torch.empty(grid_r[0] * grid_r[1] * split_r, device=q.device, dtype=torch.float32)
        _paged_decode_kernel_split[(grid_r[0] * split_r, grid_r[1])](
            q, k_cache, v_cache, block_tables, context_lens, out,
            sm_scale,
            q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            block_tables.stride(0),
            out.stride(0), out.stride(1),
            m_i_part=m_i_partials, acc_part=acc_partials, l_i_part=l_i_partials, SPLIT=split_r,
            QUERY_GROUP=num_heads // num_kv_heads,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            PAGE_SIZE=block_size,
            num_warps=num_warps,
        )
        _paged_decode_kernel_combine[grid_r](
            q, k_cache, v_cache, block_tables, context_lens, out,
            sm_scale,
            q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            block_tables.stride(0),
            out.stride(0), out.stride(1),
            m_i_part=m_i_partials, acc_part=acc_partials, l_i_part=l_i_partials, SPLIT=split_r,
            QUERY_GROUP=num_heads // num_kv_heads,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            PAGE_SIZE=block_size,
            num_warps=num_warps,
        )
    else:
        _paged_decode_kernel[(batch, num_heads)](
            q, k_cache, v_cache, block_tables, context_lens, out,
            sm_scale,
            q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            block_tables.stride(0),
            out.stride(0), out.stride(1),
            QUERY_GROUP=num_heads // num_kv_heads,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            PAGE_SIZE=block_size,
            num_warps=num_warps,
        )
    return out


def paged_attention_decode_ref(q, k_cache, v_cache, block_tables, context_lens, sm_scale=None, out=None):
    batch, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    cdt = q.dtype  # as a bf16 model computes (the oracle runs this in float64)
    res = torch.empty_like(q)
    lens = context_lens.tolist()
    for b in range(batch):
        n = int(lens[b])
        pages = block_tables[b, : (n + block_size - 1) // block_size].long()
        keys = k_cache[pages].reshape(-1, num_kv_heads, head_dim)[:n].to(cdt)  # [n, KVH, D]
        vals = v_cache[pages].reshape(-1, num_kv_heads, head_dim)[:n].to(cdt)
        keys = keys.repeat_interleave(group, dim=1)  # [n, H, D]
        vals = vals.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].to(cdt), keys) * sm_scale
        res[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), vals).to(q.dtype)
    if out is not None:
        out.copy_(res)
        return out
    return res


# ---- xeforge new: everything below is generated (docs/new.md) and is not part of examples/realworld/paged_decode_attn/paged_decode_attn.py ----
import torch


class Model(torch.nn.Module):
    """Calls paged_attention_decode(...) as examples/realworld/paged_decode_attn/paged_decode_attn.py's users do (generated by `xeforge new`: docs/new.md)."""

    def __init__(self, num_blocks, blocks_per_seq, batch, block_size):
        super().__init__()
        self.num_blocks = num_blocks
        self.blocks_per_seq = blocks_per_seq
        self.batch = batch
        self.block_size = block_size

    def forward(self, q, k_cache, v_cache):
        num_blocks, blocks_per_seq, batch, block_size = self.num_blocks, self.blocks_per_seq, self.batch, self.block_size
        block_tables = ((num_blocks - 1 - torch.arange(batch * blocks_per_seq, device=q.device, dtype=torch.int32).view(blocks_per_seq, batch).t()) % num_blocks).contiguous()
        context_lens = blocks_per_seq * block_size - (torch.arange(batch, device=q.device, dtype=torch.int32) * 5) % (blocks_per_seq * block_size)
        result = paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens)
        return result
