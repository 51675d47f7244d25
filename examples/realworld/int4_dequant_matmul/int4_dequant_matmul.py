"""Weight-only int4 GEMM: float activations times int32-packed 4-bit weights (8 nibbles along K), group-wise scales.

GPTQ-style layout; the nibbles are unpacked and scaled inside the K loop; @triton.autotune with pruning by group size.
"""
import os
from typing import Optional

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_PACK = 8  # 4-bit values per int32 word
_DEFAULT_ZERO = 8  # symmetric quantization: unsigned nibble 8 stands for 0


def _int4_configs():
    rows = [
        # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages
        (16, 64, 128, 4, 3),
        (32, 64, 64, 4, 3),
        (32, 128, 32, 4, 4),
        (64, 64, 32, 4, 4),
        (64, 128, 64, 8, 3),
        (128, 128, 32, 8, 3),
    ]
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s in rows
    ]


def _prune_int4_configs(configs, named_args, **kwargs):
    group = kwargs["GROUP_SIZE"]
    m = named_args["M"]
    m_cap = max(16, triton.next_power_of_2(m))
    # a K tile must sit inside one quantization group so it needs a single row of scales
    kept = [c for c in configs if group % c.kwargs["BLOCK_K"] == 0 and c.kwargs["BLOCK_M"] <= m_cap]
    if not kept:
        kept = [c for c in configs if group % c.kwargs["BLOCK_K"] == 0]
    return kept


@triton.autotune(
    configs=_int4_configs(),
    key=["M", "N", "K"],
    prune_configs_by={"early_config_prune": _prune_int4_configs},
)
@triton.jit
def _int4_dequant_mm_kernel(
    X, QW, Scales, QZeros, Out,
    M, N, K,
    stride_xm, stride_xk,
    stride_qk, stride_qn,
    stride_sg, stride_sn,
    stride_zg, stride_zn,
    stride_om, stride_on,
    GROUP_SIZE: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    DEFAULT_ZERO: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_kk = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N

    # nibble position of each K row inside its packed word
    nib_shift = (offs_kk % 8) * 4
    if HAS_ZEROS:
        zero_shift = (offs_n % 8) * 4

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + offs_kk
        x = tl.load(X + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=m_mask[:, None], other=0.0)
        packed = tl.load(QW + (offs_k // 8)[:, None] * stride_qk + offs_n[None, :] * stride_qn,
                         mask=n_mask[None, :], other=0)
        w_int = (packed >> nib_shift[:, None]) & 0xF

        g = k0 // GROUP_SIZE
        scale = tl.load(Scales + g * stride_sg + offs_n * stride_sn, mask=n_mask, other=0.0)
        if HAS_ZEROS:
            zp = tl.load(QZeros + g * stride_zg + (offs_n // 8) * stride_zn, mask=n_mask, other=0)
            zero = (zp >> zero_shift) & 0xF
            w = (w_int - zero[None, :]).to(tl.float32) * scale.to(tl.float32)[None, :]
        else:
            w = (w_int - DEFAULT_ZERO).to(tl.float32) * scale.to(tl.float32)[None, :]
        acc = tl.dot(x, w.to(x.dtype), acc)

    out_ptrs = Out + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def _unpack_int4_rows(packed: torch.Tensor) -> torch.Tensor:
    """[R, C] int32 -> [R * 8, C] values in [0, 16), nibble i of word r being row r * 8 + i."""
    shifts = torch.arange(0, 32, 4, device=packed.device, dtype=torch.int32)
    vals = (packed.unsqueeze(1) >> shifts.view(1, -1, 1)) & 0xF
    return vals.reshape(-1, packed.shape[-1])


def _unpack_int4_cols(packed: torch.Tensor) -> torch.Tensor:
    """[R, C] int32 -> [R, C * 8], nibble i of word c being column c * 8 + i."""
    shifts = torch.arange(0, 32, 4, device=packed.device, dtype=torch.int32)
    vals = (packed.unsqueeze(-1) >> shifts.view(1, 1, -1)) & 0xF
    return vals.reshape(packed.shape[0], -1)


def int4_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    qzeros: Optional[torch.Tensor] = None,
    group_size: int = 128,
) -> torch.Tensor:
    """x [M, K] @ dequant(qweight [K // 8, N] int32, scales [K // group_size, N], qzeros [K // group_size, N // 8])."""
    assert x.dim() == 2 and qweight.dim() == 2 and qweight.dtype == torch.int32
    M, K = x.shape
    N = qweight.shape[1]
    assert qweight.shape[0] * _PACK == K, "qweight must hold K // 8 packed rows"
    assert K % group_size == 0 and scales.shape == (K // group_size, N), "scales must be [K // group_size, N]"
    assert group_size % 32 == 0, "group_size must be a multiple of 32"
    if qzeros is not None:
        assert qzeros.dtype == torch.int32 and qzeros.shape == (K // group_size, triton.cdiv(N, _PACK))
    out = torch.empty((M, N), device=x.device, dtype=x.dtype)
    if M == 0 or N == 0:
        return out

    if not (x.is_cuda or x.device.type == "xpu" or _INTERPRET):
        return int4_matmul_ref(x, qweight, scales, qzeros, group_size)

    x = x.contiguous()

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))

    zeros_arg = qzeros if qzeros is not None else qweight
    _int4_dequant_mm_kernel[grid](
        x, qweight, scales, zeros_arg, out,
        M, N, K,
        x.stride(0), x.stride(1),
        qweight.stride(0), qweight.stride(1),
        scales.stride(0), scales.stride(1),
        zeros_arg.stride(0), zeros_arg.stride(1),
        out.stride(0), out.stride(1),
        GROUP_SIZE=group_size,
        HAS_ZEROS=qzeros is not None,
        DEFAULT_ZERO=_DEFAULT_ZERO,
    )
    return out


def int4_matmul_ref(x, qweight, scales, qzeros=None, group_size=128):
    cdt = x.dtype
    K, N = x.shape[1], qweight.shape[1]
    w_int = _unpack_int4_rows(qweight)  # [K, N]
    if qzeros is not None:
        zeros = _unpack_int4_cols(qzeros)[:, :N]
    else:
        zeros = torch.full((K // group_size, N), _DEFAULT_ZERO, device=x.device, dtype=torch.int32)
    zeros = zeros.repeat_interleave(group_size, dim=0)
    w = (w_int - zeros).to(cdt) * scales.to(cdt).repeat_interleave(group_size, dim=0)
    return torch.matmul(x, w)
