"""NVIDIA-tuned port: C = A @ B with a long reduction dim (M=N=1024, K=65536). Block pointers
(tl.make_block_ptr / tl.advance with boundary_check), 128x128x32 tiles on a 2D grid, num_warps=8,
num_stages=3. Only (M/128)*(N/128)=64 programs, each walking all of K: no split-K."""
import torch
import triton
import triton.language as tl


def _xeforge_pow2(x):
    """The largest power of two, up to 16, that divides the integer x (1 for 0 or a negative x): a
    divisibility hint that holds at this call (xeforge, memory_access)."""
    x = int(x)
    return min(16, x & -x) if x > 0 else 1


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HINT_M: tl.constexpr, HINT_N: tl.constexpr, HINT_stride_bk: tl.constexpr, HINT_stride_cm: tl.constexpr, USE_BLOCK_IO: tl.constexpr):
    if HINT_M > 1:
        M = (M // HINT_M) * HINT_M
    if HINT_N > 1:
        N = (N // HINT_N) * HINT_N
    if HINT_stride_bk > 1:
        stride_bk = (stride_bk // HINT_stride_bk) * HINT_stride_bk
    if HINT_stride_cm > 1:
        stride_cm = (stride_cm // HINT_stride_cm) * HINT_stride_cm
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    a_block = tl.make_block_ptr(base=a_ptr, shape=(M, K), strides=(stride_am, stride_ak),
                                offsets=(pid_m * BLOCK_M, 0), block_shape=(BLOCK_M, BLOCK_K), order=(1, 0))
    b_block = tl.make_block_ptr(base=b_ptr, shape=(K, N), strides=(stride_bk, stride_bn),
                                offsets=(0, pid_n * BLOCK_N), block_shape=(BLOCK_K, BLOCK_N), order=(1, 0))
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # tensor descriptors (2D block I/O, TMA) when the operands qualify, else the original code
    if USE_BLOCK_IO:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1], block_shape=[BLOCK_K, BLOCK_N])
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N // 2])
    if USE_BLOCK_IO:
        for _ in range(0, tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([pid_m * BLOCK_M, _ * BLOCK_K])
            b = b_desc.load([_ * BLOCK_K, pid_n * BLOCK_N])
            acc = tl.dot(a, b, acc)
    else:
        for _ in range(0, tl.cdiv(K, BLOCK_K)):
            a = tl.load(a_block, boundary_check=(0, 1), padding_option="zero")
            b = tl.load(b_block, boundary_check=(0, 1), padding_option="zero")
            acc = tl.dot(a, b, acc)
            a_block = tl.advance(a_block, (0, BLOCK_K))
            b_block = tl.advance(b_block, (BLOCK_K, 0))
    c_block = tl.make_block_ptr(base=c_ptr, shape=(M, N), strides=(stride_cm, stride_cn),
                                offsets=(pid_m * BLOCK_M, pid_n * BLOCK_N), block_shape=(BLOCK_M, BLOCK_N),
                                order=(1, 0))
    if USE_BLOCK_IO:
        # C in two [BLOCK_M, BLOCK_N // 2] halves: the descriptor's shared-memory staging tile halves too
        c_desc_halves = tl.permute(tl.reshape(acc.to(c_ptr.dtype.element_ty), (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        c_desc_lo, c_desc_hi = tl.split(c_desc_halves)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], c_desc_lo)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2], c_desc_hi)
    else:
        tl.store(c_block, acc.to(c_ptr.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def matmul_kernel_splitk(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  stride_ck,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HINT_M: tl.constexpr, HINT_N: tl.constexpr, HINT_stride_bk: tl.constexpr, HINT_stride_cm: tl.constexpr, USE_BLOCK_IO: tl.constexpr, SPLIT_K: tl.constexpr):
    if HINT_M > 1:
        M = (M // HINT_M) * HINT_M
    if HINT_N > 1:
        N = (N // HINT_N) * HINT_N
    if HINT_stride_bk > 1:
        stride_bk = (stride_bk // HINT_stride_bk) * HINT_stride_bk
    if HINT_stride_cm > 1:
        stride_cm = (stride_cm // HINT_stride_cm) * HINT_stride_cm
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    # split-K: program pid_k sums K steps [k_lo, k_hi) of its tile into slice pid_k of an fp32 workspace
    c_ptr = c_ptr + pid_k * stride_ck
    a_block = tl.make_block_ptr(base=a_ptr, shape=(M, K), strides=(stride_am, stride_ak),
                                offsets=(pid_m * BLOCK_M, 0), block_shape=(BLOCK_M, BLOCK_K), order=(1, 0))
    b_block = tl.make_block_ptr(base=b_ptr, shape=(K, N), strides=(stride_bk, stride_bn),
                                offsets=(0, pid_n * BLOCK_N), block_shape=(BLOCK_K, BLOCK_N), order=(1, 0))
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # tensor descriptors (2D block I/O, TMA) when the operands qualify, else the original code
    if USE_BLOCK_IO:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1], block_shape=[BLOCK_K, BLOCK_N])
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N // 2])
    num_k = tl.cdiv(K, BLOCK_K)
    k_per = tl.cdiv(num_k, SPLIT_K)
    k_lo = pid_k * k_per
    k_hi = min(num_k, k_lo + k_per)
    if USE_BLOCK_IO:
        for _ in range(k_lo, k_hi):
            a = a_desc.load([pid_m * BLOCK_M, _ * BLOCK_K])
            b = b_desc.load([_ * BLOCK_K, pid_n * BLOCK_N])
            acc = tl.dot(a, b, acc)
    else:
        a_block = tl.advance(a_block, (0, k_lo * BLOCK_K))
        b_block = tl.advance(b_block, (k_lo * BLOCK_K, 0))
        for _ in range(k_lo, k_hi):
            a = tl.load(a_block, boundary_check=(0, 1), padding_option="zero")
            b = tl.load(b_block, boundary_check=(0, 1), padding_option="zero")
            acc = tl.dot(a, b, acc)
            a_block = tl.advance(a_block, (0, BLOCK_K))
            b_block = tl.advance(b_block, (BLOCK_K, 0))
    c_block = tl.make_block_ptr(base=c_ptr, shape=(M, N), strides=(stride_cm, stride_cn),
                                offsets=(pid_m * BLOCK_M, pid_n * BLOCK_N), block_shape=(BLOCK_M, BLOCK_N),
                                order=(1, 0))
    if USE_BLOCK_IO:
        # C in two [BLOCK_M, BLOCK_N // 2] halves: the descriptor's shared-memory staging tile halves too
        c_desc_halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        c_desc_lo, c_desc_hi = tl.split(c_desc_halves)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], c_desc_lo)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2], c_desc_hi)
    else:
        tl.store(c_block, acc, boundary_check=(0, 1))


@triton.jit
def splitk_sum_kernel(
    part_ptr, out_ptr, M, N, stride_pk, stride_pm, stride_pn, stride_om, stride_on,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, VEC: tl.constexpr,
):
    """out = the sum of SPLIT_K fp32 partial tiles, added in slice order (the same bits every run). VEC divides N
    and the strides (the host passes the largest power of two up to 16 that does): it tells the compiler that
    VEC-wide accesses along a row stay aligned where Triton's own specialization (multiples of 16) does not."""
    if VEC > 1:
        N = N // VEC * VEC
        stride_pk = stride_pk // VEC * VEC
        stride_pm = stride_pm // VEC * VEC
        stride_om = stride_om // VEC * VEC
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    parts = part_ptr + offs_m[:, None] * stride_pm + offs_n[None, :] * stride_pn
    acc = tl.load(parts, mask=mask, other=0.0)
    for k in tl.static_range(1, SPLIT_K):
        acc += tl.load(parts + k * stride_pk, mask=mask, other=0.0)
    out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


def splitk_sum_config(rows, cols, *strides, programs=128, block=64):
    """(BLOCK_M, BLOCK_N, VEC) for splitk_sum_kernel: tiles of up to ``block`` rows (as few as 16 for fewer rows), their
    columns halved (down to 16) until the grid has ``programs`` programs, so that a decode-sized sum is spread over
    the device; VEC, the largest power of two up to 16 that divides the columns and every stride."""
    bm = min(block, max(16, 1 << (max(rows, 1) - 1).bit_length()))
    bn = block
    while bn > 16 and -(-rows // bm) * -(-cols // bn) < programs:
        bn //= 2
    vec = 16
    for v in (cols, *strides):
        while vec > 1 and v % vec:
            vec //= 2
    return bm, bn, vec


def splitk_size(grid, steps, programs, most=32, min_steps=4):
    """SPLIT_K for one launch: the largest power of two up to ``most`` that keeps the programs (the grid's output
    tiles times SPLIT_K) within ``programs`` and ``min_steps`` K steps or more in each slice (``steps``: the K loop's
    length; None where the host cannot tell); 1 where the tiles alone reach ``programs``."""
    tiles = 1
    for g in grid:
        tiles *= g
    split = 1
    while split * 2 <= most and tiles * split * 2 <= programs and (steps is None or steps // (split * 2) >= min_steps):
        split *= 2
    return split


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), device=a.device, dtype=a.dtype)
        grid = (triton.cdiv(M, 256), triton.cdiv(N, 128))
        use_block_io = all((
            a.data_ptr() % 16 == 0,
            a.stride(1) == 1,
            (a.stride(0) * a.element_size()) % 16 == 0,
            b.data_ptr() % 16 == 0,
            b.stride(1) == 1,
            (b.stride(0) * b.element_size()) % 16 == 0,
            c.data_ptr() % 16 == 0,
            c.stride(1) == 1,
            (c.stride(0) * c.element_size()) % 16 == 0,
        ))
        if use_block_io and a.device.type == "cuda":
            # device-side tensor descriptors (TMA) need a scratch allocation on NVIDIA GPUs
            triton.set_allocator(lambda size, align, stream, dev=a.device: torch.empty(size, dtype=torch.int8, device=dev))
        # split-K sized per call: split_k slices of K per output tile, so that the tiles counted here come to about 128
        # programs (4 a tile at the bench shape); at 1 the kernel runs as written
        split_k = splitk_size((triton.cdiv(M, 256), triton.cdiv(N, 128)), triton.cdiv(K, 64), 128)
        if split_k > 1:
            # split-K: split_k programs per output tile, each over one slice of K, write float32 partial tiles to c_partials;
            # splitk_sum_kernel adds them in slice order into c
            c_partials = torch.empty((split_k, *c.shape), device=c.device, dtype=torch.float32)
            matmul_kernel_splitk[(triton.cdiv(M, 256), triton.cdiv(N, 128), split_k)](a, b, c_partials[0], M, N, K,
                                a.stride(0), a.stride(1), b.stride(0), b.stride(1), c_partials[0].stride(0), c_partials[0].stride(1),
                                stride_ck=c_partials.stride(0), SPLIT_K=split_k,
                                BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3, HINT_M=_xeforge_pow2(M), HINT_N=_xeforge_pow2(N), HINT_stride_bk=_xeforge_pow2(b.stride(0)), HINT_stride_cm=_xeforge_pow2(c_partials[0].stride(0)), USE_BLOCK_IO=use_block_io)
            sum_block_m, sum_block_n, sum_vec = splitk_sum_config(c.shape[0], c.shape[1], c_partials.stride(0), c_partials.stride(1), c.stride(0))
            splitk_sum_kernel[(triton.cdiv(c.shape[0], sum_block_m), triton.cdiv(c.shape[1], sum_block_n))](
                c_partials, c, c.shape[0], c.shape[1], c_partials.stride(0), c_partials.stride(1), c_partials.stride(2),
                c.stride(0), c.stride(1), SPLIT_K=split_k, BLOCK_M=sum_block_m, BLOCK_N=sum_block_n, VEC=sum_vec, num_warps=4)
        else:
            matmul_kernel[grid](a, b, c, M, N, K,
                                a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                                BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4, HINT_M=_xeforge_pow2(M), HINT_N=_xeforge_pow2(N), HINT_stride_bk=_xeforge_pow2(b.stride(0)), HINT_stride_cm=_xeforge_pow2(c.stride(0)), USE_BLOCK_IO=use_block_io)
        return c
