"""Split-K GEMM C = A @ B: SPLIT_K programs per output tile each reduce an interleaved share of the
K tiles and tl.atomic_add their partial sums into a zeroed float32 buffer, cast at the end; the
split-K form used for long-K / few-tile shapes. Original code for the xeforge corpus."""
import torch
import triton
import triton.language as tl

_MAX_SPLIT_K = 16
_MIN_K_TILES_PER_SPLIT = 2


def _split_k_for(K: int, block_k: int) -> int:
    """Largest power of two <= _MAX_SPLIT_K that still leaves each split a few K tiles."""
    k_tiles = triton.cdiv(K, block_k)
    split = 1
    while split * 2 <= _MAX_SPLIT_K and k_tiles // (split * 2) >= _MIN_K_TILES_PER_SPLIT:
        split *= 2
    return split


@triton.jit
def _splitk_matmul_kernel(
    a_ptr, b_ptr, acc_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    n_tiles_m = tl.cdiv(M, BLOCK_M)
    n_tiles_n = tl.cdiv(N, BLOCK_N)
    span = GROUP_SIZE_M * n_tiles_n
    base_m = (pid // span) * GROUP_SIZE_M
    height = min(n_tiles_m - base_m, GROUP_SIZE_M)
    pid_m = base_m + (pid % span) % height
    pid_n = (pid % span) // height

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # program pid_k starts at K tile pid_k and jumps SPLIT_K tiles each step
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    m_ok = rm < M
    n_ok = rn < N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_base in range(0, K, BLOCK_K * SPLIT_K):
        k_ok = (k_base + rk) < K
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * SPLIT_K * stride_ak
        b_ptrs += BLOCK_K * SPLIT_K * stride_bk

    c_ptrs = acc_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    c_mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc, mask=c_mask)
    else:
        tl.atomic_add(c_ptrs, acc, mask=c_mask)


def splitk_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    assert a.dim() == 2 and b.dim() == 2, "2-D operands only"
    assert a.shape[1] == b.shape[0], f"K mismatch: {a.shape[1]} vs {b.shape[0]}"
    assert a.dtype == b.dtype
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return torch.empty((M, N), device=a.device, dtype=a.dtype)
    block_m = min(128, max(16, triton.next_power_of_2(M)))
    block_n = min(128, max(16, triton.next_power_of_2(N)))
    block_k = 32 if a.dtype == torch.float32 else 64
    num_warps = 8 if block_m * block_n >= 128 * 128 else 4
    split_k = _split_k_for(K, block_k)
    # partial sums from every split land in fp32; it must start at zero
    acc = torch.zeros((M, N), device=a.device, dtype=torch.float32)
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n), split_k)
    _splitk_matmul_kernel[grid](
        a, b, acc,
        M, N, K,
        a.stride(0), a.stride(1),
        b.stride(0), b.stride(1),
        acc.stride(0), acc.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        SPLIT_K=split_k, GROUP_SIZE_M=8,
        num_warps=num_warps, num_stages=3,
    )
    return acc.to(a.dtype)


def splitk_matmul_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b
