"""Row log-softmax, one program per row with the whole row in one block (next_power_of_2), in the
style of sampler/logprob ops: num_warps looked up from a table keyed on BLOCK, and a PyTorch
fallback for rows too long to hold in registers (N > 131072)."""
import torch
import triton
import triton.language as tl

MAX_ROW = 131072
# (largest BLOCK, num_warps), first match wins
_WARPS_TABLE = ((1024, 4), (4096, 8), (16384, 16), (MAX_ROW, 32))


def _warps_for_block(block: int) -> int:
    for limit, warps in _WARPS_TABLE:
        if block <= limit:
            return warps
    return 32


@triton.jit
def _log_softmax_row_kernel(X, Y, stride_x, stride_y, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(X + row * stride_x + offs, mask=mask, other=float("-inf")).to(tl.float32)
    z = x - tl.max(x, axis=0)
    lse = tl.log(tl.sum(tl.exp(z), axis=0))
    tl.store(Y + row * stride_y + offs, (z - lse).to(Y.dtype.element_ty), mask=mask)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    N = x.shape[-1]
    if N > MAX_ROW:
        return torch.log_softmax(x.float(), dim=-1).to(x.dtype)
    shape = x.shape
    x2d = x.reshape(-1, N)
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    y = torch.empty(x2d.shape, dtype=x.dtype, device=x.device)
    if x2d.numel() == 0:
        return y.reshape(shape)
    BLOCK = triton.next_power_of_2(N)
    _log_softmax_row_kernel[(x2d.shape[0],)](
        x2d, y, x2d.stride(0), y.stride(0), N,
        BLOCK=BLOCK, num_warps=_warps_for_block(BLOCK),
    )
    return y.reshape(shape)


def log_softmax_ref(x: torch.Tensor) -> torch.Tensor:
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    return torch.log_softmax(x.to(cdt), dim=-1).to(x.dtype)
