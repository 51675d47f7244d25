"""FlashAttention-2 style forward for [B, H, S, D] tensors, autotuned over tile configs keyed on (S, D).

Written in the tutorial form: block pointers, a @triton.jit inner-loop helper, a causal constexpr, config pruning.
"""
import math
from typing import Optional

import torch
import triton
import triton.language as tl

_SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)


def _fwd_configs():
    # (BLOCK_M, BLOCK_N, num_warps, num_stages), biggest tiles first
    shapes = [
        (128, 64, 8, 3),
        (128, 32, 4, 3),
        (64, 64, 4, 3),
        (64, 32, 4, 2),
        (32, 32, 4, 2),
        (16, 16, 2, 1),
    ]
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bm, bn, w, s in shapes
    ]


def _prune_configs(configs, named_args, **kwargs):
    """Drop configs whose query tile is longer than the sequence; keep the smallest if none is left."""
    n_ctx = named_args["N_CTX"]
    head_dim = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
    kept = [c for c in configs if c.kwargs["BLOCK_M"] <= n_ctx]
    if head_dim is not None and head_dim >= 256:
        # very large rows: keep the register footprint bounded
        kept = [c for c in kept if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 64 * 64] or kept
    return kept or configs[-1:]


@triton.jit
def _attn_fwd_inner(
    acc, l_i, m_i, q,
    K_block_ptr, V_block_ptr,
    start_m, qk_scale, N_CTX,
    offs_m, offs_n,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
):
    if IS_CAUSAL:
        hi = tl.minimum((start_m + 1) * BLOCK_M, N_CTX)
    else:
        hi = N_CTX
    for start_n in range(0, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = tl.load(K_block_ptr, boundary_check=(1,), padding_option="zero")
        qk = tl.dot(q, k) * qk_scale
        cols = start_n + offs_n
        valid = cols[None, :] < N_CTX
        if IS_CAUSAL:
            valid = valid & (offs_m[:, None] >= cols[None, :])
        qk = tl.where(valid, qk, -float("inf"))

        m_ij = tl.maximum(m_i, tl.max(qk, axis=1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, axis=1)

        v = tl.load(V_block_ptr, boundary_check=(0,), padding_option="zero")
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij

        K_block_ptr = tl.advance(K_block_ptr, (0, BLOCK_N))
        V_block_ptr = tl.advance(V_block_ptr, (BLOCK_N, 0))
    return acc, l_i, m_i


@triton.autotune(
    configs=_fwd_configs(),
    key=["N_CTX", "HEAD_DIM"],
    prune_configs_by={"early_config_prune": _prune_configs},
)
@triton.jit
def _attn_fwd_kernel(
    Q, K, V, Out, sm_scale,
    stride_qz, stride_qh, stride_qm, stride_qk,
    stride_kz, stride_kh, stride_kn, stride_kk,
    stride_vz, stride_vh, stride_vn, stride_vk,
    stride_oz, stride_oh, stride_om, stride_ok,
    H, N_CTX,
    HEAD_DIM: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H

    q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    k_base = K + off_z.to(tl.int64) * stride_kz + off_h.to(tl.int64) * stride_kh
    v_base = V + off_z.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh
    o_base = Out + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh

    Q_block_ptr = tl.make_block_ptr(base=q_base, shape=(N_CTX, HEAD_DIM), strides=(stride_qm, stride_qk),
                                    offsets=(start_m * BLOCK_M, 0), block_shape=(BLOCK_M, HEAD_DIM), order=(1, 0))
    K_block_ptr = tl.make_block_ptr(base=k_base, shape=(HEAD_DIM, N_CTX), strides=(stride_kk, stride_kn),
                                    offsets=(0, 0), block_shape=(HEAD_DIM, BLOCK_N), order=(0, 1))
    V_block_ptr = tl.make_block_ptr(base=v_base, shape=(N_CTX, HEAD_DIM), strides=(stride_vn, stride_vk),
                                    offsets=(0, 0), block_shape=(BLOCK_N, HEAD_DIM), order=(1, 0))
    O_block_ptr = tl.make_block_ptr(base=o_base, shape=(N_CTX, HEAD_DIM), strides=(stride_om, stride_ok),
                                    offsets=(start_m * BLOCK_M, 0), block_shape=(BLOCK_M, HEAD_DIM), order=(1, 0))

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    qk_scale = sm_scale * 1.44269504  # log2(e): the loop works in base 2
    q = tl.load(Q_block_ptr, boundary_check=(0,), padding_option="zero")
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_block_ptr, V_block_ptr,
                                    start_m, qk_scale, N_CTX, offs_m, offs_n,
                                    BLOCK_M, BLOCK_N, IS_CAUSAL)
    # rows past N_CTX saw only -inf scores; give them a harmless denominator (they are not stored)
    l_i = tl.where(offs_m < N_CTX, l_i, 1.0)
    acc = acc / l_i[:, None]
    tl.store(O_block_ptr, acc.to(Out.type.element_ty), boundary_check=(0,))


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: Optional[float] = None,
) -> torch.Tensor:
    """Scaled dot-product attention, q/k/v [batch, heads, seq, head_dim] (same seq for q and k)."""
    assert q.dim() == 4 and q.shape == k.shape == v.shape, "q, k, v must share one [B, H, S, D] shape"
    assert q.dtype == k.dtype == v.dtype
    batch, heads, seq, head_dim = q.shape
    assert head_dim in _SUPPORTED_HEAD_DIMS, f"head_dim {head_dim} not in {_SUPPORTED_HEAD_DIMS}"
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    out = torch.empty_like(q)
    if q.numel() == 0:
        return out

    def grid(meta):
        return (triton.cdiv(seq, meta["BLOCK_M"]), batch * heads, 1)

    _attn_fwd_kernel[grid](
        q, k, v, out, sm_scale,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3),
        k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        v.stride(0), v.stride(1), v.stride(2), v.stride(3),
        out.stride(0), out.stride(1), out.stride(2), out.stride(3),
        heads, seq,
        HEAD_DIM=head_dim,
        IS_CAUSAL=causal,
    )
    return out


def flash_attention_ref(q, k, v, causal=False, sm_scale=None):
    head_dim = q.shape[-1]
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    cdt = q.dtype  # as a bf16 model computes (the oracle runs this in float64)
    scores = torch.matmul(q.to(cdt), k.to(cdt).transpose(-2, -1)) * sm_scale
    if causal:
        seq = q.shape[-2]
        mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v.to(cdt)).to(q.dtype)
