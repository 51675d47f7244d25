"""Autotuned C = act(A @ B) with grouped (GROUP_SIZE_M) tile ordering and an optional fused
activation picked by a constexpr string, in the style of the Triton matmul tutorial and the
projects that grew from it. Written from scratch for the xeforge corpus."""
import torch
import triton
import triton.language as tl

_SUPPORTED_ACTIVATIONS = ("", "leaky_relu", "silu")
_LEAKY_SLOPE = 0.01


def _tile_configs():
    # (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_SIZE_M, num_stages, num_warps)
    shapes = [
        (128, 256, 64, 8, 3, 8),
        (128, 128, 64, 8, 4, 4),
        (64, 256, 32, 8, 4, 4),
        (128, 64, 32, 8, 4, 4),
        (64, 128, 32, 8, 4, 4),
        (64, 64, 64, 8, 4, 4),
        (32, 64, 32, 8, 5, 2),
    ]
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_SIZE_M": g},
                      num_stages=s, num_warps=w)
        for bm, bn, bk, g, s, w in shapes
    ]


@triton.jit
def _leaky_relu(x):
    return tl.where(x >= 0, x, x * 0.01)


@triton.jit
def _silu(x):
    return x * tl.sigmoid(x)


@triton.autotune(configs=_tile_configs(), key=["M", "N", "K"])
@triton.jit
def _matmul_act_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
):
    pid = tl.program_id(axis=0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    # walk GROUP_SIZE_M rows of tiles column by column so that B tiles stay hot in L2
    tiles_per_group = GROUP_SIZE_M * tiles_n
    group = pid // tiles_per_group
    row0 = group * GROUP_SIZE_M
    rows_in_group = min(tiles_m - row0, GROUP_SIZE_M)
    local = pid % tiles_per_group
    pid_m = row0 + (local % rows_in_group)
    pid_n = local // rows_in_group

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_tile = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_tile = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        a = tl.load(a_tile, mask=(rm[:, None] < M) & k_ok[None, :], other=0.0)
        b = tl.load(b_tile, mask=k_ok[:, None] & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_tile += BLOCK_K * stride_ak
        b_tile += BLOCK_K * stride_bk

    if ACTIVATION == "leaky_relu":
        acc = _leaky_relu(acc)
    elif ACTIVATION == "silu":
        acc = _silu(acc)

    out = acc.to(c_ptr.dtype.element_ty)
    c_tile = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_tile, out, mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """act(a @ b) for a [M, K] and b [K, N]; activation is "", "leaky_relu" or "silu"."""
    assert a.dim() == 2 and b.dim() == 2, "matmul expects 2-D operands"
    assert a.shape[1] == b.shape[0], f"incompatible shapes {tuple(a.shape)} x {tuple(b.shape)}"
    assert a.is_contiguous(), "matrix A must be contiguous"
    assert a.dtype == b.dtype, "A and B must share a dtype"
    activation = activation or ""
    assert activation in _SUPPORTED_ACTIVATIONS, f"unknown activation {activation!r}"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    if M == 0 or N == 0:
        return c

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    _matmul_act_kernel[grid](
        a, b, c,
        M, N, K,
        a.stride(0), a.stride(1),
        b.stride(0), b.stride(1),
        c.stride(0), c.stride(1),
        ACTIVATION=activation,
    )
    return c


def matmul_ref(a: torch.Tensor, b: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    y = a @ b
    if activation == "leaky_relu":
        y = torch.nn.functional.leaky_relu(y, _LEAKY_SLOPE)
    elif activation == "silu":
        y = torch.nn.functional.silu(y)
    return y
