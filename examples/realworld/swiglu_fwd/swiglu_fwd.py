"""SwiGLU forward on a fused gate/up projection [tokens, 2*hidden] (gate in the first half, up in
the second), in the style of training-kernel libraries: 2D launch over rows and column blocks,
the block width chosen by a @triton.heuristics rule on hidden and read back by a grid lambda."""
import torch
import triton
import triton.language as tl


def _block_for_hidden(args):
    return min(triton.next_power_of_2(args["hidden"]), 1024)


@triton.heuristics({
    "BLOCK_N": _block_for_hidden,
    "num_warps": lambda args: 8 if _block_for_hidden(args) >= 1024 else 4,
})
@triton.jit
def _swiglu_fwd_kernel(
    X, Y,
    stride_x_row, stride_y_row,
    hidden,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    col_block = tl.program_id(1)
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < hidden
    gate = tl.load(X + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x_row + hidden + cols, mask=mask, other=0.0).to(tl.float32)
    act = gate * tl.sigmoid(gate)
    tl.store(Y + row * stride_y_row + cols, (act * up).to(Y.dtype.element_ty), mask=mask)


def swiglu(x: torch.Tensor) -> torch.Tensor:
    two_h = x.shape[-1]
    assert two_h % 2 == 0, f"last dim must be even (gate|up), got {two_h}"
    hidden = two_h // 2
    lead = x.shape[:-1]
    x2d = x.reshape(-1, two_h)
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    rows = x2d.shape[0]
    y = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y.reshape(*lead, hidden)

    def grid(meta):
        return (rows, triton.cdiv(hidden, meta["BLOCK_N"]))

    _swiglu_fwd_kernel[grid](x2d, y, x2d.stride(0), y.stride(0), hidden)
    return y.reshape(*lead, hidden)


def swiglu_ref(x: torch.Tensor) -> torch.Tensor:
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    gate, up = x.to(cdt).chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)
