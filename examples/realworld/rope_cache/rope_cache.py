"""Rotary position embedding applied in place to q and k of a flattened token batch, the way
serving engines do it: cos/sin caches [max_pos, rot_dim // 2] gathered by a positions tensor,
neox (rotate-half) layout, one launch covering the q heads and the k heads in blocks of heads."""
import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_head_block(
    base, stride_h, n_heads, head0, cos, sin,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    h = head0 + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < n_heads) & (d[None, :] < HALF)
    p1 = base + h[:, None] * stride_h + d[None, :]
    p2 = p1 + HALF
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
    c = cos[None, :]
    s = sin[None, :]
    o1 = x1 * c - x2 * s
    o2 = x2 * c + x1 * s
    tl.store(p1, o1.to(base.dtype.element_ty), mask=mask)
    tl.store(p2, o2.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _rope_neox_kernel(
    Q, K, Pos, Cos, Sin,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cos,
    n_q_heads, n_k_heads, n_q_blocks,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    pos = tl.load(Pos + tok)
    d = tl.arange(0, BLOCK_D)
    dmask = d < HALF
    cos = tl.load(Cos + pos * stride_cos + d, mask=dmask, other=0.0).to(tl.float32)
    sin = tl.load(Sin + pos * stride_cos + d, mask=dmask, other=0.0).to(tl.float32)
    if hb < n_q_blocks:
        _rotate_head_block(Q + tok * stride_qt, stride_qh, n_q_heads, hb * BLOCK_H, cos, sin,
                           HALF, BLOCK_H, BLOCK_D)
    else:
        _rotate_head_block(K + tok * stride_kt, stride_kh, n_k_heads, (hb - n_q_blocks) * BLOCK_H,
                           cos, sin, HALF, BLOCK_H, BLOCK_D)


def rotary_embedding_(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                      cos_cache: torch.Tensor, sin_cache: torch.Tensor):
    """Rotates query [T, Hq, D] and key [T, Hk, D] in place; returns them for convenience."""
    assert query.dim() == 3 and key.dim() == 3 and query.shape[0] == key.shape[0]
    assert query.shape[-1] == key.shape[-1]
    head_dim = query.shape[-1]
    assert head_dim % 2 == 0, "rotate-half needs an even head size"
    assert cos_cache.shape == sin_cache.shape and cos_cache.shape[-1] * 2 == head_dim
    assert query.stride(-1) == 1 and key.stride(-1) == 1
    assert positions.numel() == query.shape[0]
    num_tokens, n_q, _ = query.shape
    n_k = key.shape[1]
    if num_tokens == 0:
        return query, key
    positions = positions.reshape(-1).contiguous()
    cos_cache = cos_cache.contiguous()
    sin_cache = sin_cache.contiguous()

    half = head_dim // 2
    BLOCK_D = triton.next_power_of_2(half)
    BLOCK_H = max(1, min(triton.next_power_of_2(max(n_q, n_k)), 4096 // BLOCK_D, 16))
    n_q_blocks = triton.cdiv(n_q, BLOCK_H)
    grid = (num_tokens, n_q_blocks + triton.cdiv(n_k, BLOCK_H))
    _rope_neox_kernel[grid](
        query, key, positions, cos_cache, sin_cache,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), cos_cache.stride(0),
        n_q, n_k, n_q_blocks,
        HALF=half, BLOCK_H=BLOCK_H, BLOCK_D=BLOCK_D,
        num_warps=4 if BLOCK_H * BLOCK_D <= 1024 else 8,
    )
    return query, key


def rotary_embedding_ref(positions, query, key, cos_cache, sin_cache):
    cdt = torch.float64 if query.dtype == torch.float64 else torch.float32
    cos = cos_cache[positions].to(cdt)[:, None, :]
    sin = sin_cache[positions].to(cdt)[:, None, :]
    for t in (query, key):
        half = t.shape[-1] // 2
        x1 = t[..., :half].to(cdt)
        x2 = t[..., half:].to(cdt)
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        t.copy_(rotated.to(t.dtype))
    return query, key
