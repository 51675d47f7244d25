"""Projection y = x @ W^T whose wrapper looks its tile config up in a table keyed on M buckets
(decode M<=16, <=64, <=256, prefill), with a torch fallback for K not a multiple of 8, the way
decode-aware serving projects write their linear kernels. Original code for the xeforge corpus."""
import torch
import triton
import triton.language as tl

# M upper bound -> launch config; None = everything larger (prefill)
_CONFIG_BY_M = {
    16: dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4),
    64: dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4),
    256: dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3),
    None: dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3),
}
_K_ALIGN = 8


def _config_for(M: int) -> dict:
    for bound, cfg in _CONFIG_BY_M.items():
        if bound is not None and M <= bound:
            return cfg
    return _CONFIG_BY_M[None]


@triton.jit
def _linear_kernel(
    x_ptr, w_ptr, y_ptr,
    M, N, K,
    stride_xm, stride_xk,
    stride_wn, stride_wk,
    stride_ym, stride_yn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # N tiles on axis 0: for decode (one M tile) the grid is still wide
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + ks[None, :] * stride_xk
    w_ptrs = w_ptr + cols[None, :] * stride_wn + ks[:, None] * stride_wk

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_rem = K - k * BLOCK_K
        xt = tl.load(x_ptrs, mask=(rows[:, None] < M) & (ks[None, :] < k_rem), other=0.0)
        wt = tl.load(w_ptrs, mask=(ks[:, None] < k_rem) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(xt, wt, acc)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    y_ptrs = y_ptr + rows[:, None] * stride_ym + cols[None, :] * stride_yn
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T -> [..., N]."""
    assert x.shape[-1] == weight.shape[-1], "x and weight disagree on K"
    assert weight.dim() == 2
    K = x.shape[-1]
    N = weight.shape[0]
    if K % _K_ALIGN != 0:
        # unaligned K: not worth a kernel variant, let torch handle it
        return torch.matmul(x, weight.t())
    x2 = x.reshape(-1, K).contiguous()
    M = x2.shape[0]
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    if M == 0:
        return y.reshape(*x.shape[:-1], N)
    cfg = _config_for(M)
    grid = (triton.cdiv(N, cfg["BLOCK_N"]), triton.cdiv(M, cfg["BLOCK_M"]))
    _linear_kernel[grid](
        x2, weight, y,
        M, N, K,
        x2.stride(0), x2.stride(1),
        weight.stride(0), weight.stride(1),
        y.stride(0), y.stride(1),
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return y.reshape(*x.shape[:-1], N)


def linear_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x @ weight.t()
