"""Persistent GEMM C = A @ B: one program per SM (grid = min(NUM_SMS, tiles)) that strides over output
tiles in grouped order, the persistent-kernel form of the Triton tutorials and serving projects.
Original code for the xeforge corpus."""
import functools

import torch
import triton
import triton.language as tl

# programs to launch when there is no CUDA device to ask (CPU interpreter, other backends)
_FALLBACK_NUM_SMS = 2

# per input dtype: BLOCK_M, BLOCK_N, BLOCK_K, GROUP_SIZE_M, num_warps, num_stages
_CONFIGS = {
    torch.float16: (128, 256, 64, 8, 8, 3),
    torch.bfloat16: (128, 256, 64, 8, 8, 3),
    torch.float32: (32, 32, 32, 8, 4, 3),
}


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _FALLBACK_NUM_SMS


@triton.jit
def _tile_coords(tile_id, tiles_m, tiles_n, GROUP_SIZE_M: tl.constexpr):
    per_group = GROUP_SIZE_M * tiles_n
    group = tile_id // per_group
    first_m = group * GROUP_SIZE_M
    rows = min(tiles_m - first_m, GROUP_SIZE_M)
    pid_m = first_m + (tile_id % per_group) % rows
    pid_n = (tile_id % per_group) // rows
    return pid_m, pid_n


@triton.jit
def _persistent_matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, NUM_SMS: tl.constexpr,
):
    first_tile = tl.program_id(axis=0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tiles_m * tiles_n
    k_steps = tl.cdiv(K, BLOCK_K)
    offs_k = tl.arange(0, BLOCK_K)

    for tile_id in range(first_tile, num_tiles, NUM_SMS):
        pid_m, pid_n = _tile_coords(tile_id, tiles_m, tiles_n, GROUP_SIZE_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = offs_m < M
        col_ok = offs_n < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ks in range(0, k_steps):
            kk = ks * BLOCK_K + offs_k
            a = tl.load(a_ptr + offs_m[:, None] * stride_am + kk[None, :] * stride_ak,
                        mask=row_ok[:, None] & (kk[None, :] < K), other=0.0)
            b = tl.load(b_ptr + kk[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                        mask=(kk[:, None] < K) & col_ok[None, :], other=0.0)
            acc = tl.dot(a, b, acc)
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def matmul_persistent(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    assert a.dim() == 2 and b.dim() == 2
    assert a.shape[1] == b.shape[0], "inner dimensions differ"
    assert a.dtype == b.dtype, "mixed dtypes are not supported"
    assert a.dtype in _CONFIGS, f"unsupported dtype {a.dtype}"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    if c.numel() == 0:
        return c
    block_m, block_n, block_k, group_m, warps, stages = _CONFIGS[a.dtype]
    num_sms = _num_sms(a.device)
    num_tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
    grid = (min(num_sms, num_tiles),)
    _persistent_matmul_kernel[grid](
        a, b, c,
        M, N, K,
        a.stride(0), a.stride(1),
        b.stride(0), b.stride(1),
        c.stride(0), c.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        GROUP_SIZE_M=group_m, NUM_SMS=num_sms,
        num_warps=warps, num_stages=stages,
    )
    return c


def matmul_persistent_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b
