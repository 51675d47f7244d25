"""RMSNorm over the last dim in the style of serving-library norm ops: a host wrapper that flattens
leading dims, sizes BLOCK_N from the element size and picks num_warps from it, and an EVEN_N
heuristic that drops the column masks when the tile divides the row."""
import torch
import triton
import triton.language as tl

# one program keeps at most 64 KiB of a row live per tile
_MAX_FUSED_BYTES = 65536


def _warps_for(block_n: int) -> int:
    return min(max(block_n // 256, 1), 8)


@triton.heuristics({"EVEN_N": lambda args: args["N"] % args["BLOCK_N"] == 0})
@triton.jit
def _rms_norm_fwd_kernel(
    X, W, Y,
    stride_x_row, stride_y_row,
    N, eps,
    BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    X += row * stride_x_row
    Y += row * stride_y_row

    # pass 1: sum of squares in fp32, tile by tile
    sq = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        if EVEN_N:
            xv = tl.load(X + cols).to(tl.float32)
        else:
            xv = tl.load(X + cols, mask=cols < N, other=0.0).to(tl.float32)
        sq += xv * xv
    rrms = tl.rsqrt(tl.sum(sq, axis=0) / N + eps)

    # pass 2: scale and store (the row is still hot in cache when it fits one tile)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        if EVEN_N:
            xv = tl.load(X + cols).to(tl.float32)
            wv = tl.load(W + cols).to(tl.float32)
            tl.store(Y + cols, (xv * rrms * wv).to(Y.dtype.element_ty))
        else:
            m = cols < N
            xv = tl.load(X + cols, mask=m, other=0.0).to(tl.float32)
            wv = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
            tl.store(Y + cols, (xv * rrms * wv).to(Y.dtype.element_ty), mask=m)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    assert x.shape[-1] == weight.shape[0], (
        f"hidden size mismatch: x has {x.shape[-1]}, weight has {weight.shape[0]}")
    orig_shape = x.shape
    x2d = x.reshape(-1, orig_shape[-1])
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    weight = weight.contiguous()
    out = torch.empty(x2d.shape, device=x.device, dtype=x.dtype)
    if x2d.numel() == 0:
        return out.reshape(orig_shape)

    M, N = x2d.shape
    BLOCK_N = min(triton.next_power_of_2(N), _MAX_FUSED_BYTES // x.element_size())
    num_warps = _warps_for(BLOCK_N)
    _rms_norm_fwd_kernel[(M,)](
        x2d, weight, out,
        x2d.stride(0), out.stride(0),
        N, eps,
        BLOCK_N=BLOCK_N,
        num_warps=num_warps,
    )
    return out.reshape(orig_shape)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(cdt)
    rrms = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * rrms * weight.to(cdt)).to(x.dtype)
