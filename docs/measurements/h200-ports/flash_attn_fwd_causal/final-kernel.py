"""FlashAttention-2 style forward (causal), a straightforward Triton port: one program per
(BLOCK_M query rows, batch*head), online softmax in fp32 (exp2 with log2(e) folded into the scale),
K^T and V tiles of BLOCK_N keys, P cast to V's dtype before the second dot. Tuned for NVIDIA:
BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3. Masks handle any sequence length."""
import math

import torch
import triton
import triton.language as tl


@triton.jit
def attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, sm_scale, H, S,
                    stride_qb, stride_qh, stride_qs, stride_qd,
                    stride_kb, stride_kh, stride_ks, stride_kd,
                    stride_vb, stride_vh, stride_vs, stride_vd,
                    stride_ob, stride_oh, stride_os, stride_od,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // H
    off_h = off_bh % H
    q_base = q_ptr + off_b * stride_qb + off_h * stride_qh
    k_base = k_ptr + off_b * stride_kb + off_h * stride_kh
    v_base = v_ptr + off_b * stride_vb + off_h * stride_vh
    o_base = o_ptr + off_b * stride_ob + off_h * stride_oh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :] * stride_qd,
                mask=offs_m[:, None] < S, other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e)
    # causal: keys beyond the last query row of this block are never needed
    hi = tl.minimum(S, (start_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt = tl.load(k_base + offs_n[None, :] * stride_ks + offs_d[:, None] * stride_kd,
                     mask=offs_n[None, :] < S, other=0.0)
        qk = tl.dot(q, kt) * qk_scale
        valid = offs_n[None, :] < S
        valid = valid & (offs_m[:, None] >= offs_n[None, :])
        qk = tl.where(valid, qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, axis=1))
        p = tl.exp2(qk - m_ij[:, None])
        alpha = tl.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        v = tl.load(v_base + offs_n[:, None] * stride_vs + offs_d[None, :] * stride_vd,
                    mask=offs_n[:, None] < S, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    acc = acc / l_i[:, None]
    tl.store(o_base + offs_m[:, None] * stride_os + offs_d[None, :] * stride_od,
             acc.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < S)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        B, H, S, D = q.shape
        o = torch.empty((B, H, S, D), device=q.device, dtype=q.dtype)
        sm_scale = 1.0 / math.sqrt(D)
        grid = (triton.cdiv(S, 64), B * H)
        attn_fwd_kernel[grid](q, k, v, o, sm_scale, H, S,
                              q.stride(0), q.stride(1), q.stride(2), q.stride(3),
                              k.stride(0), k.stride(1), k.stride(2), k.stride(3),
                              v.stride(0), v.stride(1), v.stride(2), v.stride(3),
                              o.stride(0), o.stride(1), o.stride(2), o.stride(3),
                              HEAD_DIM=D, BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
        return o
