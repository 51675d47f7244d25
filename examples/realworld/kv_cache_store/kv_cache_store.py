"""Paged KV-cache write as serving engines do it after the QKV projection: each new token's
key/value [kv_heads, head_dim] is scattered into [num_blocks, block_size, kv_heads, head_dim]
caches at its slot (slot_mapping), in place; a negative slot marks a padding token."""
import os

import torch
import triton
import triton.language as tl

_DEBUG_SYNC = os.environ.get("KV_CACHE_DEBUG_SYNC", "0") == "1"


@triton.jit
def _store_kv_cache_kernel(
    Key, Value, KCache, VCache, SlotMapping,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    block_size,
    HEAD_DIM: tl.constexpr,
    BLOCK_HD: tl.constexpr,
    N_HD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    slot = tl.load(SlotMapping + tok).to(tl.int64)
    if slot >= 0:
        blk = slot // block_size
        off = slot % block_size
        idx = chunk * BLOCK_HD + tl.arange(0, BLOCK_HD)
        mask = idx < N_HD
        h = idx // HEAD_DIM
        d = idx % HEAD_DIM
        k = tl.load(Key + tok * stride_kt + h * stride_kh + d, mask=mask)
        v = tl.load(Value + tok * stride_vt + h * stride_vh + d, mask=mask)
        dst = blk * stride_cb + off * stride_cs + h * stride_ch + d
        tl.store(KCache + dst, k.to(KCache.dtype.element_ty), mask=mask)
        tl.store(VCache + dst, v.to(VCache.dtype.element_ty), mask=mask)


def store_kv_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                   value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    assert key.shape == value.shape and key.dim() == 3, "key/value must be [tokens, kv_heads, head_dim]"
    assert key_cache.shape == value_cache.shape and key_cache.dim() == 4
    assert key_cache.shape[2:] == key.shape[1:], "cache [blocks, block_size, kv_heads, head_dim] mismatch"
    assert key_cache.stride() == value_cache.stride()
    assert key_cache.stride(-1) == 1 and key.stride(-1) == 1 and value.stride(-1) == 1
    num_tokens, kv_heads, head_dim = key.shape
    assert slot_mapping.numel() == num_tokens
    if num_tokens == 0:
        return
    slot_mapping = slot_mapping.reshape(-1).contiguous()
    block_size = key_cache.shape[1]
    n_hd = kv_heads * head_dim
    BLOCK_HD = min(triton.next_power_of_2(n_hd), 2048)
    grid = (num_tokens, triton.cdiv(n_hd, BLOCK_HD))
    _store_kv_cache_kernel[grid](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        block_size,
        HEAD_DIM=head_dim, BLOCK_HD=BLOCK_HD, N_HD=n_hd,
        num_warps=4 if BLOCK_HD <= 1024 else 8,
    )
    if _DEBUG_SYNC and key.is_cuda:
        torch.cuda.synchronize()


def store_kv_cache_ref(key, value, key_cache, value_cache, slot_mapping):
    nb, bs = key_cache.shape[:2]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    kc = key_cache.view(nb * bs, *key_cache.shape[2:])
    vc = value_cache.view(nb * bs, *value_cache.shape[2:])
    kc[slots] = key[valid].to(kc.dtype)
    vc[slots] = value[valid].to(vc.dtype)
